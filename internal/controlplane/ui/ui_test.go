package ui_test

import (
	"bufio"
	"context"
	"encoding/json"
	"html"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/testcluster"
)

// visitor is a browser stand-in: a cookie jar that does not follow
// redirects, so that tests see each answer.
type visitor struct {
	t    *testing.T
	base string
	hc   *http.Client
	csrf string // the last page's form token
}

func newVisitor(t *testing.T, base string) *visitor {
	jar, _ := cookiejar.New(nil)
	return &visitor{t: t, base: base, hc: &http.Client{Jar: jar, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func (v *visitor) do(req *http.Request) (*http.Response, string) {
	v.t.Helper()
	resp, err := v.hc.Do(req)
	if err != nil {
		v.t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if m := csrfField.FindSubmatch(b); m != nil {
		v.csrf = string(m[1])
	}
	return resp, string(b)
}

func (v *visitor) get(path string) (*http.Response, string) {
	v.t.Helper()
	req, _ := http.NewRequest("GET", v.base+path, nil)
	return v.do(req)
}

// post sends a form as the page would (same-origin fetch metadata); csrf
// is added unless the form has one.
func (v *visitor) post(path string, form url.Values, hdr ...string) (*http.Response, string) {
	v.t.Helper()
	if !form.Has("csrf") {
		form.Set("csrf", v.csrf)
	}
	req, _ := http.NewRequest("POST", v.base+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return v.do(req)
}

// signIn uses a login link minted for token.
func (v *visitor) signIn(c *api.Client) {
	v.t.Helper()
	link, err := c.LoginLink(context.Background())
	if err != nil {
		v.t.Fatal(err)
	}
	resp, body := v.get(link.Path)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "signed in") {
		v.t.Fatalf("login link: %d\n%s", resp.StatusCode, body)
	}
}

func start(t *testing.T) *testcluster.Cluster {
	return testcluster.Start(t, testcluster.Options{Nodes: 2, Tenants: []string{"alice", "bob"}})
}

func TestLoginLink(t *testing.T) {
	c := start(t)
	alice := c.ClientWithToken(testcluster.TenantToken("alice"))
	link, err := alice.LoginLink(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(link.Path, "/ui/login?code=") || strings.Contains(link.Path, testcluster.TenantToken("alice")) || !link.ExpiresAt.Equal(c.Clock.Now().Add(10*time.Minute).UTC()) {
		t.Fatalf("link %+v", link)
	}
	v := newVisitor(t, c.URL)
	resp, body := v.get(link.Path)
	if resp.StatusCode != http.StatusOK || strings.Contains(body, testcluster.TenantToken("alice")) {
		t.Fatalf("redeem: %d\n%s", resp.StatusCode, body)
	}
	var session *http.Cookie
	for _, ck := range resp.Cookies() {
		if ck.Name == "rialto_session" {
			session = ck
		}
	}
	if session == nil || !session.HttpOnly || session.SameSite != http.SameSiteStrictMode || session.Path != "/ui/" || strings.Contains(session.Value, "alice") {
		t.Fatalf("session cookie %+v", session)
	}
	if resp, body := v.get("/ui/"); resp.StatusCode != http.StatusOK || !strings.Contains(body, "Signed in as tenant alice") {
		t.Fatalf("cluster page: %d\n%.500s", resp.StatusCode, body)
	}
	// Once only.
	if resp, _ := newVisitor(t, c.URL).get(link.Path); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("second use: %d", resp.StatusCode)
	}
	// Not after it expires.
	late, err := alice.LoginLink(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	c.Advance(10*time.Minute + time.Second)
	if resp, _ := newVisitor(t, c.URL).get(late.Path); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("expired link: %d", resp.StatusCode)
	}
	// Only tenant tokens get links.
	if _, err := c.ClientWithToken(testcluster.BootstrapToken).LoginLink(context.Background()); !api.IsCode(err, api.CodeForbidden) {
		t.Errorf("bootstrap token: %v", err)
	}
	// A made-up code.
	if resp, _ := newVisitor(t, c.URL).get("/ui/login?code=made-up"); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("made-up code: %d", resp.StatusCode)
	}
}

func TestLoginForm(t *testing.T) {
	c := start(t)
	v := newVisitor(t, c.URL)
	// Pages send a visitor without a session to the login form.
	resp, _ := v.get("/ui/leases?state=all")
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/ui/login?next=%2Fui%2Fleases%3Fstate%3Dall" {
		t.Fatalf("no session: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	v.get("/ui/login?next=%2Fui%2Fleases%3Fstate%3Dall")
	// The form's CSRF token must match its cookie.
	if resp, _ := v.post("/ui/login", url.Values{"token": {testcluster.TenantToken("bob")}, "csrf": {"forged"}}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("forged login form: %d", resp.StatusCode)
	}
	for _, bad := range []string{"", "rat_unknown", testcluster.BootstrapToken} {
		if resp, _ := v.post("/ui/login", url.Values{"token": {bad}}); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("token %q: %d", bad, resp.StatusCode)
		}
	}
	resp, _ = v.post("/ui/login", url.Values{"token": {testcluster.TenantToken("bob")}, "next": {"/ui/leases?state=all"}})
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/ui/leases?state=all" {
		t.Fatalf("sign in: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	if resp, body := v.get("/ui/leases?state=all"); resp.StatusCode != http.StatusOK || !strings.Contains(body, "tenant bob") {
		t.Fatalf("after sign-in: %d", resp.StatusCode)
	}
	// next stays on the dashboard.
	v2 := newVisitor(t, c.URL)
	v2.get("/ui/login")
	if resp, _ := v2.post("/ui/login", url.Values{"token": {testcluster.TenantToken("bob")}, "next": {"//evil.example/"}}); resp.Header.Get("Location") != "/ui/" {
		t.Errorf("next=//evil.example/: %s", resp.Header.Get("Location"))
	}
	// Signing out ends the session.
	v.get("/ui/")
	if resp, _ := v.post("/ui/logout", url.Values{}); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("sign out: %d", resp.StatusCode)
	}
	if resp, _ := v.get("/ui/"); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("after sign-out: %d", resp.StatusCode)
	}
	// An idle session ends.
	v3 := newVisitor(t, c.URL)
	v3.signIn(c.ClientWithToken(testcluster.TenantToken("bob")))
	c.Advance(2*time.Hour + time.Second)
	if resp, _ := v3.get("/ui/"); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("idle session: %d", resp.StatusCode)
	}
}

// A tenant's dashboard shows what the API shows the tenant: its own
// leases, never their credentials or export names; the admin sees every
// tenant's, filtered by tenant.
func TestTenantsSeeTheirOwn(t *testing.T) {
	c := start(t)
	ctx := context.Background()
	alice, bob := c.ClientWithToken(testcluster.TenantToken("alice")), c.ClientWithToken(testcluster.TenantToken("bob"))
	la, err := alice.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	lb, err := bob.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	secrets := []string{la.Credential, lb.Credential, la.URI[strings.LastIndex(la.URI, "/")+1:], lb.URI[strings.LastIndex(lb.URI, "/")+1:],
		testcluster.TenantToken("alice"), testcluster.AdminToken}
	noSecrets := func(page, body string) {
		t.Helper()
		for _, s := range secrets {
			if strings.Contains(body, s) {
				t.Errorf("%s shows a secret", page)
			}
		}
	}
	v := newVisitor(t, c.URL)
	v.signIn(alice)
	_, body := v.get("/ui/leases")
	if !strings.Contains(body, la.ID) || strings.Contains(body, lb.ID) {
		t.Errorf("alice's lease list: has hers %v, has bob's %v", strings.Contains(body, la.ID), strings.Contains(body, lb.ID))
	}
	noSecrets("alice's lease list", body)
	resp, body := v.get("/ui/leases/" + la.ID)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `id="lease-state">active`) || !strings.Contains(body, "nbd://") {
		t.Errorf("alice's lease: %d", resp.StatusCode)
	}
	noSecrets("alice's lease page", body)
	if resp, _ := v.get("/ui/leases/" + lb.ID); resp.StatusCode != http.StatusNotFound {
		t.Errorf("bob's lease for alice: %d", resp.StatusCode)
	}
	_, body = v.get("/ui/events")
	if !strings.Contains(body, la.ID) || strings.Contains(body, lb.ID) {
		t.Errorf("alice's events show bob's lease or miss hers")
	}

	admin := newVisitor(t, c.URL)
	admin.signIn(c.Client())
	_, body = admin.get("/ui/leases")
	if !strings.Contains(body, la.ID) || !strings.Contains(body, lb.ID) {
		t.Errorf("the admin's lease list lacks a lease")
	}
	noSecrets("the admin's lease list", body)
	_, body = admin.get("/ui/leases?tenant=bob&kind=block&state=active")
	if strings.Contains(body, la.ID) || !strings.Contains(body, lb.ID) {
		t.Errorf("the admin's list filtered to bob")
	}
	_, body = admin.get("/ui/leases?kind=memory")
	if strings.Contains(body, la.ID) || strings.Contains(body, lb.ID) {
		t.Errorf("memory leases list block leases")
	}
	for _, page := range []string{"/ui/", "/ui/devices", "/ui/topology", "/ui/events", "/ui/leases/" + lb.ID, "/ui/leases/new"} {
		resp, body := admin.get(page)
		if resp.StatusCode != http.StatusOK || !strings.Contains(body, `<main id="main"`) {
			t.Errorf("%s: %d", page, resp.StatusCode)
		}
		noSecrets(page, body)
	}
}

// A lease's page and the lease list show what the lease holds (the API's
// held), with the size asked for beside it where they differ: a dedicated
// lease of 8MiB holds its 64MiB device.
func TestLeasePagesShowHeld(t *testing.T) {
	c := start(t)
	ctx := context.Background()
	alice := c.ClientWithToken(testcluster.TenantToken("alice"))
	l, err := alice.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeDedicated, Size: 8 << 20})
	if err != nil || l.Held != 64<<20 {
		t.Fatalf("%v %+v", err, l)
	}
	v := newVisitor(t, c.URL)
	v.signIn(alice)
	for _, page := range []string{"/ui/leases/" + l.ID, "/ui/leases"} {
		if _, body := v.get(page); !strings.Contains(body, "64MiB (asked for 8MiB)") {
			t.Errorf("%s does not show what the lease holds:\n%.3000s", page, body)
		}
	}
}

// Forms: CSRF-protected, same-origin only; create, explain and release
// work; bad input shows a clear error and creates nothing.
func TestLeaseForms(t *testing.T) {
	c := start(t)
	ctx := context.Background()
	alice := c.ClientWithToken(testcluster.TenantToken("alice"))
	v := newVisitor(t, c.URL)
	v.signIn(alice)
	v.get("/ui/leases/new")
	form := func(kv ...string) url.Values {
		f := url.Values{"kind": {"block"}, "ttl": {"30m"}, "key": {"k-" + kv[len(kv)-1]}}
		for i := 0; i+1 < len(kv); i += 2 {
			f.Set(kv[i], kv[i+1])
		}
		return f
	}
	// Refused: no CSRF token, a wrong one, another site.
	if resp, _ := v.post("/ui/leases", form("size", "8MiB", "csrf", "", "a")); resp.StatusCode != http.StatusForbidden {
		t.Errorf("no CSRF token: %d", resp.StatusCode)
	}
	f := form("size", "8MiB", "b")
	f.Set("csrf", "forged")
	if resp, _ := v.post("/ui/leases", f); resp.StatusCode != http.StatusForbidden {
		t.Errorf("forged CSRF token: %d", resp.StatusCode)
	}
	if resp, _ := v.post("/ui/leases", form("size", "8MiB", "c"), "Sec-Fetch-Site", "cross-site"); resp.StatusCode != http.StatusForbidden {
		t.Errorf("cross-site post: %d", resp.StatusCode)
	}
	if resp, _ := v.post("/ui/leases", form("size", "8MiB", "d"), "Sec-Fetch-Site", "", "Origin", "http://evil.example"); resp.StatusCode != http.StatusForbidden {
		t.Errorf("post from another origin: %d", resp.StatusCode)
	}
	if resp, _ := v.post("/ui/leases", form("size", "8MiB", "borrower", strings.Repeat("x", 100<<10), "d2")); resp.StatusCode == http.StatusSeeOther {
		t.Errorf("an oversized form was taken")
	}
	// Bad input.
	if resp, body := v.post("/ui/leases", form("size", "lots", "e")); resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "size:") {
		t.Errorf("bad size: %d", resp.StatusCode)
	}
	resp, body := v.post("/ui/leases", form("size", "1TiB", "f"))
	if resp.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(body, `role="alert"`) || !strings.Contains(body, "infeasible") {
		t.Errorf("an infeasible lease: %d\n%.2000s", resp.StatusCode, body)
	}
	if ls, err := alice.AllLeases(ctx); err != nil || len(ls) != 0 {
		t.Fatalf("refused posts made leases: %v %+v", err, ls)
	}
	// Explain reserves nothing.
	resp, body = v.post("/ui/explain", form("size", "8MiB", "work", "1GiB", "g"))
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "feasible") || !strings.Contains(body, `class="explanation"`) {
		t.Errorf("explain: %d", resp.StatusCode)
	}
	// Bandwidth: a rate as the CLI's --bandwidth takes it and the pages
	// print it, or a bare number of MB/s; the plan shows the rates as
	// every rate prints (resource.FormatRate).
	for _, bw := range []string{"100MB/s", "800Mbit/s", "100"} {
		resp, body = v.post("/ui/explain", form("size", "8MiB", "bandwidth", bw, "bw"))
		if resp.StatusCode != http.StatusOK || !strings.Contains(body, "<dd>100MB/s</dd>") || !strings.Contains(body, "wants 100MB/s without slowdown") {
			t.Errorf("explain with bandwidth %s: %d\n%.4000s", bw, resp.StatusCode, body)
		}
	}
	if resp, body := v.post("/ui/explain", form("size", "8MiB", "bandwidth", "fast", "bw")); resp.StatusCode != http.StatusBadRequest ||
		!strings.Contains(body, "bandwidth: a rate such as 500MB/s or 1Gbit/s, or a number of MB/s") {
		t.Errorf("bad bandwidth: %d", resp.StatusCode)
	}
	if ls, _ := alice.AllLeases(ctx); len(ls) != 0 {
		t.Fatalf("explain made a lease")
	}
	// Create; the same form posted again makes no second lease.
	resp, _ = v.post("/ui/leases", form("size", "8MiB", "h"))
	loc := resp.Header.Get("Location")
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(loc, "/ui/leases/lease-") {
		t.Fatalf("create: %d %s", resp.StatusCode, loc)
	}
	v.post("/ui/leases", form("size", "8MiB", "h"))
	ls, err := alice.AllLeases(ctx)
	if err != nil || len(ls) != 1 || ls[0].TTLSeconds != 1800 || ls[0].Size != 8<<20 {
		t.Fatalf("leases after create: %v %+v", err, ls)
	}
	_, body = v.get(loc)
	if !strings.Contains(body, "created") || !strings.Contains(body, `class="explanation"`) {
		t.Errorf("the new lease's page lacks the notice or the explanation")
	}
	resp, _ = v.post("/ui/leases/"+ls[0].ID+"/release", url.Values{})
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("release: %d", resp.StatusCode)
	}
	testcluster.Eventually(t, 20*time.Second, "released", func() bool {
		l, err := alice.Lease(ctx, ls[0].ID)
		return err == nil && l.State == api.LeaseReleased
	})
}

func TestHeadersAndStatic(t *testing.T) {
	c := start(t)
	v := newVisitor(t, c.URL)
	resp, _ := v.get("/ui/login")
	h := resp.Header
	if !strings.Contains(h.Get("Content-Security-Policy"), "script-src 'self'") || h.Get("X-Frame-Options") != "DENY" ||
		h.Get("Cache-Control") != "no-store" || h.Get("Referrer-Policy") != "no-referrer" || !strings.HasPrefix(h.Get("Content-Type"), "text/html") {
		t.Errorf("page headers %v", h)
	}
	for _, p := range []string{"/ui/static/app.css", "/ui/static/app.js"} {
		resp, body := v.get(p)
		if resp.StatusCode != http.StatusOK || len(body) < 100 || !strings.Contains(resp.Header.Get("Cache-Control"), "max-age") {
			t.Errorf("%s: %d %v", p, resp.StatusCode, resp.Header)
		}
	}
	if resp, _ := v.get("/ui/static/"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("a directory listing: %d", resp.StatusCode)
	}
	v.signIn(c.Client())
	if resp, body := v.get("/ui/nowhere"); resp.StatusCode != http.StatusNotFound || !strings.Contains(body, `role="alert"`) {
		t.Errorf("an unknown page: %d", resp.StatusCode)
	}
	if resp, _ := v.get("/ui"); resp.StatusCode != http.StatusMovedPermanently {
		t.Errorf("/ui: %d", resp.StatusCode)
	}
}

// The page's event stream carries the session's events, live, and only
// those its tenant may see.
func TestEventStream(t *testing.T) {
	c := start(t)
	ctx := context.Background()
	alice, bob := c.ClientWithToken(testcluster.TenantToken("alice")), c.ClientWithToken(testcluster.TenantToken("bob"))
	v := newVisitor(t, c.URL)
	if resp, _ := v.get("/ui/events/stream"); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("stream without a session: %d", resp.StatusCode)
	}
	v.signIn(alice)
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(sctx, "GET", c.URL+"/ui/events/stream?since=0", nil)
	resp, err := v.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("stream: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	// Bob's lease first, then alice's: alice's stream must skip bob's.
	lb, err := bob.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	la, err := alice.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev api.Event
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatal(err)
		}
		if ev.Subject == lb.ID {
			t.Fatalf("alice's stream carries bob's lease: %+v", ev)
		}
		if ev.Subject == la.ID && ev.Type == "lease.active" {
			return
		}
	}
	t.Fatalf("the stream ended before alice's lease was active: %v", sc.Err())
}

// The lease list pages as GET /v1/leases does: a full page links to the
// next with the API's cursor, and the next page has the rest.
func TestLeaseListPages(t *testing.T) {
	c := start(t)
	ctx := context.Background()
	alice := c.ClientWithToken(testcluster.TenantToken("alice"))
	var ids []string
	for range 3 {
		l, err := alice.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, l.ID)
	}
	v := newVisitor(t, c.URL)
	v.signIn(alice)
	shown := func(body string) []string {
		var out []string
		for _, id := range ids {
			if strings.Contains(body, `href="/ui/leases/`+id+`"`) {
				out = append(out, id)
			}
		}
		return out
	}
	next := regexp.MustCompile(`<a id="leases-next" rel="next" href="([^"]+)"`)
	resp, body := v.get("/ui/leases?state=all&limit=2")
	m := next.FindStringSubmatch(body)
	if resp.StatusCode != http.StatusOK || len(shown(body)) != 2 || m == nil {
		t.Fatalf("first page: %d, shows %v, next link %v:\n%.4000s", resp.StatusCode, shown(body), m, body)
	}
	first := shown(body)
	var page []api.Lease
	if err := alice.Do(ctx, "GET", "/v1/leases?limit=2", nil, &page); err != nil || len(page) != 2 {
		t.Fatalf("%v %d", err, len(page))
	}
	u, err := url.Parse(html.UnescapeString(m[1]))
	if err != nil || u.Path != "/ui/leases" || u.Query().Get("after") != api.LeaseCursor(page[1]).String() ||
		u.Query().Get("limit") != "2" || u.Query().Get("state") != "all" {
		t.Fatalf("next link %q (%v), want the API's cursor %s and the filter", m[1], err, api.LeaseCursor(page[1]))
	}
	resp, body = v.get(u.String())
	rest := shown(body)
	if resp.StatusCode != http.StatusOK || len(rest) != 1 || slices.Contains(first, rest[0]) || next.MatchString(body) ||
		!strings.Contains(body, `href="/ui/leases?limit=2&amp;state=all">First page`) {
		t.Fatalf("second page: %d, shows %v after %v:\n%.4000s", resp.StatusCode, rest, first, body)
	}
	if resp, _ := v.get("/ui/leases?after=nonsense"); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("a bad cursor: %d", resp.StatusCode)
	}
}

// A filtered lease list fills its pages: the filter went to the API's
// page and was applied to it afterwards, so an admin's list of alice's
// leases, two a page, showed one lease on a page (the other was bob's)
// and the list ended early. The API now filters by tenant and kind.
func TestLeaseListFilterFillsPages(t *testing.T) {
	c := start(t)
	ctx := context.Background()
	alice := c.ClientWithToken(testcluster.TenantToken("alice"))
	bob := c.ClientWithToken(testcluster.TenantToken("bob"))
	var mine []string
	for range 3 { // alice, bob, alice, bob, …
		for _, cl := range []*api.Client{alice, bob} {
			l, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20})
			if err != nil {
				t.Fatal(err)
			}
			if cl == alice {
				mine = append(mine, l.ID)
			}
		}
	}
	v := newVisitor(t, c.URL)
	v.signIn(c.Client())
	rows := regexp.MustCompile(`href="/ui/leases/(lease-[^"]+)"`)
	next := regexp.MustCompile(`<a id="leases-next" rel="next" href="([^"]+)"`)
	var seen []string
	for path, pages := "/ui/leases?tenant=alice&limit=2", 0; path != ""; pages++ {
		if pages > 3 {
			t.Fatalf("more than 3 pages of alice's 3 leases, two a page: %v", seen)
		}
		resp, body := v.get(path)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d", path, resp.StatusCode)
		}
		var page []string
		for _, m := range rows.FindAllStringSubmatch(body, -1) {
			page = append(page, m[1])
		}
		path = ""
		if m := next.FindStringSubmatch(body); m != nil {
			path = html.UnescapeString(m[1])
			if len(page) != 2 {
				t.Errorf("a page with a next link shows %v; want 2 of alice's leases", page)
			}
		}
		seen = append(seen, page...)
	}
	slices.Sort(seen)
	slices.Sort(mine)
	if !slices.Equal(seen, mine) {
		t.Errorf("the pages of alice's leases show %v; want %v", seen, mine)
	}
	// The API's filters: a tenant names only its own tenant; kinds are
	// checked.
	var ls []api.Lease
	if err := alice.Do(ctx, "GET", "/v1/leases?tenant=bob", nil, &ls); !api.IsCode(err, api.CodeForbidden) {
		t.Errorf("alice listing bob's leases: %v", err)
	}
	if err := alice.Do(ctx, "GET", "/v1/leases?kind=gpu", nil, &ls); !api.IsCode(err, api.CodeInvalid) {
		t.Errorf("an unknown kind: %v", err)
	}
	if err := alice.Do(ctx, "GET", "/v1/leases?kind=memory&tenant=alice", nil, &ls); err != nil || len(ls) != 0 {
		t.Errorf("alice's memory leases: %v, %v", ls, err)
	}
	if err := alice.Do(ctx, "GET", "/v1/leases?kind=block", nil, &ls); err != nil || len(ls) != 3 {
		t.Errorf("alice's block leases: %d, %v", len(ls), err)
	}
}
