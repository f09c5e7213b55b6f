package ui

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/rialto-project/rialto/api"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Config configures a UI. API is required.
type Config struct {
	// API serves the control plane's /v1 routes; the UI calls it in
	// process with the session's token.
	API    http.Handler
	Logger *slog.Logger // nil: discard
	// Now tells the time (default time.Now).
	Now func() time.Time
	// CodeTTL is how long a login code works (default 10 minutes).
	CodeTTL time.Duration
	// SessionTTL ends a session this long after sign-in (default 12 hours);
	// IdleTTL ends one unused for this long (default 2 hours).
	SessionTTL, IdleTTL time.Duration
}

// UI is the dashboard: an http.Handler for /ui and everything under it.
type UI struct {
	cfg   Config
	log   *slog.Logger
	pages map[string]*template.Template
	mux   *http.ServeMux
	auth  authState
	sim   simResults
}

// New returns a UI over cfg.API.
func New(cfg Config) (*UI, error) {
	if cfg.API == nil {
		return nil, errors.New("ui: Config.API is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.CodeTTL <= 0 {
		cfg.CodeTTL = 10 * time.Minute
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = 12 * time.Hour
	}
	if cfg.IdleTTL <= 0 {
		cfg.IdleTTL = 2 * time.Hour
	}
	u := &UI{cfg: cfg, log: cfg.Logger, pages: map[string]*template.Template{}}
	names, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		base := strings.TrimSuffix(strings.TrimPrefix(n, "templates/"), ".html")
		if base == "layout" || base == "partials" {
			continue
		}
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/partials.html", n)
		if err != nil {
			return nil, fmt.Errorf("ui: template %s: %w", n, err)
		}
		u.pages[base] = t
	}
	static, err := fs.Sub(staticFS, "static")
	if err != nil {
		return nil, err
	}
	m := http.NewServeMux()
	m.Handle("GET /ui/static/", http.StripPrefix("/ui/static/", staticHandler(static)))
	m.HandleFunc("GET /ui", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/ui/", http.StatusMovedPermanently) })
	m.HandleFunc("GET /ui/login", u.getLogin)
	m.HandleFunc("POST /ui/login", u.postLogin)
	m.HandleFunc("POST /ui/logout", u.signedIn(u.postLogout))
	m.HandleFunc("GET /ui/{$}", u.signedIn(u.overview))
	m.HandleFunc("GET /ui/devices", u.signedIn(u.devicesPage))
	m.HandleFunc("GET /ui/leases", u.signedIn(u.leasesPage))
	m.HandleFunc("GET /ui/leases/new", u.signedIn(u.newLeasePage))
	m.HandleFunc("POST /ui/leases", u.signedIn(u.createLease))
	m.HandleFunc("POST /ui/explain", u.signedIn(u.explain))
	m.HandleFunc("GET /ui/leases/{id}", u.signedIn(u.leasePage))
	m.HandleFunc("POST /ui/leases/{id}/release", u.signedIn(u.releaseLease))
	m.HandleFunc("GET /ui/topology", u.signedIn(u.topologyPage))
	m.HandleFunc("GET /ui/events", u.signedIn(u.eventsPage))
	m.HandleFunc("GET /ui/sim", u.signedIn(u.simList))
	m.HandleFunc("GET /ui/sim/{name}", u.signedIn(u.simExperiment))
	m.HandleFunc("GET /ui/events/stream", u.signedIn(u.eventStream))
	m.HandleFunc("/ui/", func(w http.ResponseWriter, r *http.Request) {
		u.renderError(w, r, nil, http.StatusNotFound, "No such page: "+r.URL.Path)
	})
	u.mux = m
	return u, nil
}

// ServeHTTP serves /ui and the pages under it, with security headers on
// every answer.
func (u *UI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "+
		"form-action 'self'; frame-ancestors 'none'; base-uri 'none'; object-src 'none'")
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	if !strings.HasPrefix(r.URL.Path, "/ui/static/") {
		h.Set("Cache-Control", "no-store")
	}
	u.mux.ServeHTTP(w, r)
}

// staticHandler serves the embedded assets; they change only with the
// binary, so browsers may keep them an hour.
func staticHandler(fsys fs.FS) http.Handler {
	fsrv := http.FileServerFS(fsys)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "" || strings.HasSuffix(r.URL.Path, "/") {
			http.NotFound(w, r) // no directory listings
			return
		}
		w.Header().Set("Cache-Control", "public, max-age=3600")
		fsrv.ServeHTTP(w, r)
	})
}

// client is an API client that calls the API handler in process with
// token.
func (u *UI) client(token string) *api.Client {
	return api.NewClient("http://rialto.internal", token, &http.Client{Transport: inproc{u.cfg.API}})
}

// inproc is an http.RoundTripper that answers with a handler in this
// process, buffering the answer (the UI's API calls are small; the event
// stream is passed through by eventStream, not by this).
type inproc struct{ h http.Handler }

func (t inproc) RoundTrip(req *http.Request) (resp *http.Response, err error) {
	sreq := req.Clone(req.Context())
	sreq.RequestURI = req.URL.RequestURI()
	sreq.RemoteAddr = "127.0.0.1:0" // the dashboard itself
	if sreq.Body == nil {
		sreq.Body = http.NoBody
	}
	rec := &recorder{header: http.Header{}}
	defer func() {
		if v := recover(); v != nil { // as net/http would: the request fails, the process lives
			resp, err = nil, fmt.Errorf("ui: API handler panicked: %v", v)
		}
	}()
	t.h.ServeHTTP(rec, sreq)
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	return &http.Response{
		Status: http.StatusText(rec.status), StatusCode: rec.status, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: rec.header, Body: io.NopCloser(&rec.body), ContentLength: int64(rec.body.Len()), Request: req,
	}, nil
}

type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.body.Write(b)
}

// page is what every template gets.
type page struct {
	Title   string
	Nav     string // the current section, for aria-current
	Session *session
	CSRF    string
	Flash   string // a status message (role=status)
	Error   string // an error message (role=alert)
	Data    any
}

// render writes a page with status.
func (u *UI) render(w http.ResponseWriter, status int, name string, p page) {
	t := u.pages[name]
	if t == nil {
		http.Error(w, "ui: no template "+name, http.StatusInternalServerError)
		return
	}
	if p.Session != nil {
		p.CSRF = p.Session.csrf
	}
	var buf bytes.Buffer
	if err := t.Execute(&buf, p); err != nil {
		u.log.Error("ui: render", "page", name, "err", err)
		http.Error(w, "ui: could not render the page; see the control plane log", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	w.Write(buf.Bytes())
}

// renderError shows an error page.
func (u *UI) renderError(w http.ResponseWriter, r *http.Request, s *session, status int, msg string) {
	u.render(w, status, "error", page{Title: http.StatusText(status), Session: s, Error: msg})
}

// apiFailed answers an API error the page cannot recover from: a revoked
// token signs the session out, anything else is shown.
func (u *UI) apiFailed(w http.ResponseWriter, r *http.Request, s *session, err error) {
	var ae *api.Error
	if errors.As(err, &ae) {
		if ae.Status == http.StatusUnauthorized {
			u.auth.drop(s)
			http.Redirect(w, r, "/ui/login?expired=1", http.StatusSeeOther)
			return
		}
		u.renderError(w, r, s, ae.Status, ae.Message)
		return
	}
	if errors.Is(err, context.Canceled) {
		return
	}
	u.log.Error("ui: API call", "path", r.URL.Path, "err", err)
	u.renderError(w, r, s, http.StatusInternalServerError, "The control plane did not answer; see its log.")
}
