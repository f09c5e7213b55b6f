package ui

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/rialto-project/rialto/api"
)

const (
	sessionCookie = "rialto_session"
	loginCookie   = "rialto_login" // the login form's CSRF token, before a session exists
	maxCodes      = 1024
	maxSessions   = 10000
	// maxPerToken bounds one token's login codes and its sessions: a
	// token's next one replaces its oldest, so that one tenant signing in
	// again and again ends only its own sessions, not others'.
	maxPerToken = 64
	maxForm     = 64 << 10 // bytes of a posted form
)

// session is a signed-in browser. token is the API token it acts with: a
// secret that stays in this process.
type session struct {
	key     string // hash of the cookie value
	owner   string // hash of token
	token   string
	who     api.Whoami
	csrf    string
	created time.Time
	seen    time.Time
}

// Who names the session's principal for the page header.
func (s *session) Who() string {
	if s.who.Admin {
		return "tenant " + s.who.Tenant + " (admin)"
	}
	return "tenant " + s.who.Tenant
}

// Admin reports whether the session sees every tenant.
func (s *session) Admin() bool { return s.who.Admin }

// Tenant is the session's tenant.
func (s *session) Tenant() string { return s.who.Tenant }

type loginCode struct {
	token string
	owner string // hash of token
	exp   time.Time
}

// authState holds login codes and sessions, in memory. The zero value is
// ready; it is safe for concurrent use.
type authState struct {
	mu       sync.Mutex
	codes    map[string]loginCode // by hash of the code
	sessions map[string]*session  // by hash of the cookie value
}

func newSecret() string {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("ui: crypto/rand: " + err.Error())
	}
	return base64.RawURLEncoding.EncodeToString(b[:])
}

func hashOf(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// NewLoginCode returns a single-use code that signs a browser in as token
// until it expires (GET /ui/login?code=CODE). The caller has checked that
// token is a tenant token.
func (u *UI) NewLoginCode(token string) (code string, expires time.Time) {
	now := u.cfg.Now()
	code = newSecret()
	expires = now.Add(u.cfg.CodeTTL)
	a := &u.auth
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.codes == nil {
		a.codes = map[string]loginCode{}
	}
	owner := hashOf(token)
	own, oldestOwn := 0, ""
	for k, c := range a.codes {
		if c.owner == owner && !now.After(c.exp) {
			own++
			if oldestOwn == "" || c.exp.Before(a.codes[oldestOwn].exp) {
				oldestOwn = k
			}
		}
	}
	if own >= maxPerToken {
		delete(a.codes, oldestOwn)
	}
	if len(a.codes) >= maxCodes {
		for k, c := range a.codes {
			if now.After(c.exp) {
				delete(a.codes, k)
			}
		}
	}
	if len(a.codes) >= maxCodes { // still full: the oldest goes
		var oldest string
		for k, c := range a.codes {
			if oldest == "" || c.exp.Before(a.codes[oldest].exp) {
				oldest = k
			}
		}
		delete(a.codes, oldest)
	}
	a.codes[hashOf(code)] = loginCode{token: token, owner: owner, exp: expires}
	return code, expires
}

// takeCode redeems a code once.
func (a *authState) takeCode(code string, now time.Time) (string, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	k := hashOf(code)
	c, ok := a.codes[k]
	delete(a.codes, k)
	if !ok || now.After(c.exp) {
		return "", false
	}
	return c.token, true
}

// newSession signs token in and returns the cookie value.
func (a *authState) newSession(token string, who api.Whoami, now time.Time, sessionTTL, idleTTL time.Duration) string {
	cookie := newSecret()
	s := &session{key: hashOf(cookie), owner: hashOf(token), token: token, who: who, csrf: newSecret(), created: now, seen: now}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.sessions == nil {
		a.sessions = map[string]*session{}
	}
	var own []*session
	for _, o := range a.sessions {
		if o.owner == s.owner {
			own = append(own, o)
		}
	}
	if len(own) >= maxPerToken {
		oldest := own[0]
		for _, o := range own[1:] {
			if o.seen.Before(oldest.seen) {
				oldest = o
			}
		}
		delete(a.sessions, oldest.key)
	}
	if len(a.sessions) >= maxSessions {
		var oldest *session
		for k, o := range a.sessions {
			if now.Sub(o.created) > sessionTTL || now.Sub(o.seen) > idleTTL {
				delete(a.sessions, k)
			} else if oldest == nil || o.seen.Before(oldest.seen) {
				oldest = o
			}
		}
		if len(a.sessions) >= maxSessions && oldest != nil {
			delete(a.sessions, oldest.key)
		}
	}
	a.sessions[s.key] = s
	return cookie
}

// lookup finds the live session of a cookie value and marks it used.
func (a *authState) lookup(cookie string, now time.Time, sessionTTL, idleTTL time.Duration) *session {
	a.mu.Lock()
	defer a.mu.Unlock()
	k := hashOf(cookie)
	s := a.sessions[k]
	if s == nil {
		return nil
	}
	if now.Sub(s.created) > sessionTTL || now.Sub(s.seen) > idleTTL {
		delete(a.sessions, k)
		return nil
	}
	s.seen = now
	return s
}

func (a *authState) drop(s *session) {
	if s == nil {
		return
	}
	a.mu.Lock()
	delete(a.sessions, s.key)
	a.mu.Unlock()
}

// setCookie sets an HttpOnly, SameSite=Strict cookie on /ui/ (Secure over
// TLS); an empty value with maxAge < 0 deletes it.
func setCookie(w http.ResponseWriter, r *http.Request, name, value string, maxAge int) {
	http.SetCookie(w, &http.Cookie{Name: name, Value: value, Path: "/ui/", HttpOnly: true, SameSite: http.SameSiteStrictMode,
		Secure: r.TLS != nil, MaxAge: maxAge})
}

// sameOrigin refuses a state-changing request made from another site:
// by Sec-Fetch-Site where the browser sends it, else by Origin.
func sameOrigin(r *http.Request) bool {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" {
		return site == "same-origin" || site == "none"
	}
	if o := r.Header.Get("Origin"); o != "" && o != "null" {
		ou, err := url.Parse(o)
		return err == nil && strings.EqualFold(ou.Host, r.Host)
	}
	return true // not a browser's cross-site request: the CSRF token decides
}

func equalSecret(a, b string) bool {
	return a != "" && subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

// signedIn runs h for a request with a live session; others go to the
// login page. A POST must come from this site and carry the session's
// CSRF token.
func (u *UI) signedIn(h func(http.ResponseWriter, *http.Request, *session)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var s *session
		if c, err := r.Cookie(sessionCookie); err == nil && c.Value != "" {
			s = u.auth.lookup(c.Value, u.cfg.Now(), u.cfg.SessionTTL, u.cfg.IdleTTL)
		}
		if s == nil {
			if r.Method == http.MethodGet && r.URL.Path != "/ui/events/stream" {
				http.Redirect(w, r, "/ui/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
				return
			}
			u.renderError(w, r, nil, http.StatusUnauthorized, "You are not signed in (or your session ended). Sign in again.")
			return
		}
		if r.Method == http.MethodPost {
			r.Body = http.MaxBytesReader(w, r.Body, maxForm)
			if !sameOrigin(r) || !equalSecret(r.PostFormValue("csrf"), s.csrf) {
				u.renderError(w, r, s, http.StatusForbidden, "This form is stale or was sent from another site; reload the page and try again.")
				return
			}
		}
		h(w, r, s)
	}
}

// safeNext keeps a post-login redirect on the dashboard.
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/ui/") || strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\\r\n") {
		return "/ui/"
	}
	return next
}

type loginData struct {
	Next    string
	Expired bool
	Code    bool // the page answers a login link
}

// getLogin redeems a login code (?code=), or shows the login form.
func (u *UI) getLogin(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if code := q.Get("code"); code != "" {
		token, ok := u.auth.takeCode(code, u.cfg.Now())
		if !ok {
			u.showLogin(w, r, http.StatusUnauthorized, "This login link has expired or was used already. Ask for a new one with `rialto ui`, or sign in with your token.", loginData{Code: true})
			return
		}
		if !u.signIn(w, r, token) {
			u.showLogin(w, r, http.StatusUnauthorized, "The token behind this login link is no longer valid.", loginData{Code: true})
			return
		}
		// A page, not a redirect: a SameSite=Strict cookie set on a
		// navigation that came from another site (a link in a chat)
		// would not be sent with a redirect that follows it; the
		// page's own navigation is same-site.
		u.render(w, http.StatusOK, "signedin", page{Title: "Signed in"})
		return
	}
	u.showLogin(w, r, http.StatusOK, "", loginData{Next: safeNext(q.Get("next")), Expired: q.Get("expired") != ""})
}

func (u *UI) showLogin(w http.ResponseWriter, r *http.Request, status int, msg string, d loginData) {
	csrf := newSecret()
	setCookie(w, r, loginCookie, csrf, 3600)
	u.render(w, status, "login", page{Title: "Sign in", Error: msg, CSRF: csrf, Data: d})
}

// postLogin signs in with a token typed into the form.
func (u *UI) postLogin(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxForm)
	c, err := r.Cookie(loginCookie)
	if !sameOrigin(r) || err != nil || !equalSecret(r.PostFormValue("csrf"), c.Value) {
		u.showLogin(w, r, http.StatusForbidden, "The login form is stale or was sent from another site; try again.", loginData{})
		return
	}
	next := safeNext(r.PostFormValue("next"))
	token := strings.TrimSpace(r.PostFormValue("token"))
	if token == "" || !u.signIn(w, r, token) {
		u.showLogin(w, r, http.StatusUnauthorized, "That token is not a valid tenant token.", loginData{Next: next})
		return
	}
	setCookie(w, r, loginCookie, "", -1)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

// signIn checks token with the API and starts a session for it.
func (u *UI) signIn(w http.ResponseWriter, r *http.Request, token string) bool {
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	who, err := u.client(token).Whoami(ctx)
	if err != nil || who.Role != "tenant" {
		return false
	}
	cookie := u.auth.newSession(token, who, u.cfg.Now(), u.cfg.SessionTTL, u.cfg.IdleTTL)
	setCookie(w, r, sessionCookie, cookie, 0)
	u.log.Info("ui: signed in", "tenant", who.Tenant, "admin", who.Admin)
	return true
}

func (u *UI) postLogout(w http.ResponseWriter, r *http.Request, s *session) {
	u.auth.drop(s)
	setCookie(w, r, sessionCookie, "", -1)
	http.Redirect(w, r, "/ui/login", http.StatusSeeOther)
}
