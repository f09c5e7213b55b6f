package ui_test

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/uptest"
)

var screenshots = flag.Bool("screenshots", false, "save a PNG of each dashboard page under docs/ui/ (go test -run Browser -screenshots)")

func TestMain(m *testing.M) { uptest.Main(m) }

// chromium finds Debian's chromium (installed by .ci/run).
func chromium(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("no chromium on PATH (Debian: apt-get install chromium; .ci/run installs it)")
	return ""
}

// browser starts a headless chromium of its own (a fresh profile) for
// the test and returns a context for its first tab. The cluster's API is
// HTTPS with a certificate from its own CA, which chromium does not know:
// it is told to accept exactly that server's key (spkiPin).
func browser(t *testing.T, spkiPin string) context.Context {
	exe := chromium(t)
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-component-update", true), chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 900),
		chromedp.Flag("ignore-certificate-errors-spki-list", spkiPin))
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelB := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancelB()
		cancelA()
	})
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		t.Fatalf("chromium: %v", err)
	}
	return ctx
}

// do runs actions with a deadline and fails the test, naming what, if
// they fail.
func do(t *testing.T, ctx context.Context, what string, d time.Duration, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	get(t, ctx, what, d, chromedp.Steps(actions...))
}

// get runs an action that returns a value, as do.
func get[T any](t *testing.T, ctx context.Context, what string, d time.Duration, a chromedp.Action[T]) T {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	v, err := chromedp.Run(sctx, a)
	// Chromium aborts a page load when the host's network interfaces
	// change, which tests of other packages do as they add and remove
	// veth pairs. chromedp.Navigate reports that as a page load error
	// (a click's navigation is not awaited), and every action that
	// navigates here starts with it, so nothing after the aborted load
	// ran: load again.
	for i := 0; i < 3 && err != nil && strings.Contains(err.Error(), "page load error net::ERR_NETWORK_CHANGED"); i++ {
		v, err = chromedp.Run(sctx, a)
	}
	if err != nil {
		hctx, hcancel := context.WithTimeout(ctx, 5*time.Second)
		html, herr := chromedp.Run(hctx, chromedp.Evaluate[string](`document.querySelector("main") ? document.querySelector("main").outerHTML : document.documentElement.outerHTML`))
		hcancel()
		t.Fatalf("%s: %v\nthe page (%v):\n%.4000s", what, err, herr, html)
	}
	return v
}

// submit runs a form's actions (the submission's navigation is not
// awaited) and waits for sel on the page it leads to. Chromium aborts a
// page load when the host's network interfaces change (other packages'
// tests add and remove veth pairs) and shows its error page instead: then
// the form is loaded again from again (if not "") and, unless that page
// already shows sel (the submission went through), submitted again.
func submit(t *testing.T, ctx context.Context, what string, d time.Duration, again, sel string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	for try := 0; ; try++ {
		do(t, ctx, what, d, actions...)
		do(t, ctx, what, d, chromedp.WaitVisible(chromedp.CSS(sel+", body.neterror")))
		aborted := get(t, ctx, what, d, chromedp.Evaluate[bool](`location.href.startsWith("chrome-error:")`))
		if !aborted {
			do(t, ctx, what, d, chromedp.WaitVisible(chromedp.CSS(sel)))
			return
		}
		if again == "" || try == 2 {
			code := get(t, ctx, what, d, chromedp.Evaluate[string](`(document.querySelector(".error-code") || {}).textContent || ""`))
			t.Fatalf("%s: Chromium could not load the page that follows (%s)", what, code)
		}
		do(t, ctx, what+": load the form again", d, chromedp.Navigate(again), chromedp.WaitReady("body"))
		if get(t, ctx, what, d, chromedp.Evaluate[bool](fmt.Sprintf(`document.querySelector(%q) !== null`, sel))) {
			return
		}
	}
}

// shot saves a full-page PNG as docs/ui/NAME.png when -screenshots is set.
func shot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	if !*screenshots {
		return
	}
	png := get(t, ctx, "screenshot "+name, 30*time.Second, chromedp.FullScreenshot(100))
	dir := filepath.Join(uptest.ModuleRoot(t), "docs", "ui")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestBrowser drives the dashboard in headless chromium against a real
// `rialto up`: sign in with the printed one-time link, see the 3 nodes,
// explain and create a block lease from the form and see it with its
// explanation, watch it arrive in the live event stream (open in a second
// tab), see traffic through it in the bandwidth plot, release it, sign out
// and back in with the token form. No page shows a lease's credential or
// export name.
func TestBrowser(t *testing.T) {
	chromium(t)
	up := uptest.StartUp(t, uptest.Binary(t), t.TempDir())
	if up.LoginURL == "" {
		t.Fatalf("rialto up printed no dashboard link:\n%s", up.Output())
	}
	ctx := browser(t, up.ServerSPKIHash(t))
	base := strings.TrimSuffix(up.Addr, "/")
	admin := up.Client(t)
	const wait = 30 * time.Second

	// Sign in with the one-time link: it lands on the cluster page.
	do(t, ctx, "sign in with the login link", wait, chromedp.Navigate(up.LoginURL), chromedp.WaitVisible(chromedp.ID("node-count")))
	count := get(t, ctx, "node count", wait, chromedp.Text(chromedp.ID("node-count")))
	rows := get(t, ctx, "node rows", wait, chromedp.Nodes(chromedp.CSSAll("#nodes tbody tr")))
	if count != "3" || len(rows) != 3 {
		t.Fatalf("cluster page: %q nodes, %d rows; want 3", count, len(rows))
	}
	if title := get(t, ctx, "title", wait, chromedp.Title()); !strings.HasPrefix(title, "Cluster") {
		t.Errorf("title %q", title)
	}
	// The first Tab reaches the skip link, which leads to the main content.
	do(t, ctx, "Tab", wait, chromedp.KeyEvent("\t"))
	focused := get(t, ctx, "focus", wait, chromedp.Evaluate[string](`document.activeElement.className + "|" + document.activeElement.getAttribute("href")`))
	if focused != "skip|#main" {
		t.Errorf("the first Tab focuses %q, want the skip link", focused)
	}

	// The link works once.
	do(t, ctx, "the login link again", wait, chromedp.Navigate(up.LoginURL), chromedp.WaitVisible(chromedp.CSS(".error")))
	if again := get(t, ctx, "error", wait, chromedp.Text(chromedp.CSS(".error"))); !strings.Contains(again, "expired or was used") {
		t.Errorf("the second use of the login link: %q", again)
	}

	// A second tab follows the event stream.
	events, cancelEvents := chromedp.NewContext(ctx)
	defer cancelEvents()
	if err := chromedp.Do(events); err != nil { // opens the tab, for as long as events lives
		t.Fatal(err)
	}
	do(t, events, "open the events page", wait, chromedp.Navigate(base+"/ui/events"), chromedp.WaitVisible(chromedp.CSS("#events[data-live]")))

	// Explain, then create a block lease from the form.
	do(t, ctx, "explain a block lease", wait,
		chromedp.Navigate(base+"/ui/leases/new"),
		chromedp.WaitVisible(chromedp.ID("kind")),
		chromedp.SetValue(chromedp.ID("kind"), "block"),
		chromedp.SetValue(chromedp.ID("size"), "128MiB"),
		chromedp.SetValue(chromedp.ID("work"), "1GiB"),
		chromedp.SetValue(chromedp.ID("bandwidth"), "50"),
		chromedp.Click(chromedp.ID("explain")),
		chromedp.WaitVisible(chromedp.CSS("#plan .explanation li")))
	planState := get(t, ctx, "plan state", wait, chromedp.Text(chromedp.CSS("#plan .st")))
	explained := get(t, ctx, "explanation", wait, chromedp.Nodes(chromedp.CSSAll("#plan .explanation li")))
	if planState != "feasible" || len(explained) == 0 {
		t.Fatalf("explain: state %q, %d explanation lines", planState, len(explained))
	}
	shot(t, ctx, "new-lease")
	do(t, ctx, "create the lease", wait, chromedp.Click(chromedp.ID("create")), chromedp.WaitVisible(chromedp.CSS(".flash")))
	flash := get(t, ctx, "flash", wait, chromedp.Text(chromedp.CSS(".flash")))
	state := get(t, ctx, "lease state", wait, chromedp.Text(chromedp.ID("lease-state")))
	why := get(t, ctx, "explanation", wait, chromedp.Nodes(chromedp.CSSAll("#plan .explanation li")))
	loc := get(t, ctx, "location", wait, chromedp.Location())
	id, _, _ := strings.Cut(loc[strings.LastIndex(loc, "/")+1:], "?")
	if !strings.Contains(flash, "created") || state != "active" || len(why) == 0 || !strings.HasPrefix(id, "lease-") {
		t.Fatalf("after create: flash %q, state %q, %d explanation lines, at %s", flash, state, len(why), loc)
	}
	lease, err := admin.Lease(context.Background(), id)
	if err != nil || lease.Credential == "" || lease.URI == "" {
		t.Fatalf("the lease through the API: %v %+v", err, lease)
	}
	noSecrets := func(page string) {
		t.Helper()
		html := get(t, ctx, "the HTML of "+page, wait, chromedp.OuterHTML(chromedp.CSS("html")))
		export := lease.URI[strings.LastIndex(lease.URI, "/")+1:]
		if strings.Contains(html, lease.Credential) || strings.Contains(html, export) || strings.Contains(html, up.Token) {
			t.Errorf("%s shows a secret (the credential, export name or token)", page)
		}
	}
	noSecrets("the lease page")
	shot(t, ctx, "lease")

	// The events tab sees the lease become active, live (rows the
	// stream adds have the class "new").
	do(t, events, "the lease's events arrive in the stream", wait, chromedp.WaitVisible(chromedp.Search(fmt.Sprintf(
		`//table[@id="events"]/tbody/tr[contains(@class,"new")][td[3][text()="lease.active"]][td[4]/a[text()=%q]]`, id))))

	// Traffic through the lease shows in the bandwidth plot.
	nc, err := nbd.DialURI(context.Background(), lease.URI, nbd.WithTLS(up.DataTLS(t)))
	if err != nil {
		t.Fatalf("nbd: %v", err)
	}
	buf := make([]byte, 1<<20)
	for i := range 48 {
		if _, err := nc.WriteAt(buf, int64(i%32)<<20); err != nil {
			t.Fatalf("nbd write: %v", err)
		}
		if *screenshots {
			time.Sleep(150 * time.Millisecond) // paces the writes over a few heartbeats, for a plot with a shape
		}
	}
	nc.Close()
	for deadline := time.Now().Add(wait); ; {
		us, err := admin.Usage(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		seen := false
		for _, u := range us {
			for _, s := range u.Samples {
				seen = seen || (u.DeviceID == lease.DeviceID && s.WriteBps > 0)
			}
		}
		if seen {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no write bandwidth reported for %s: %+v", lease.DeviceID, us)
		}
		time.Sleep(100 * time.Millisecond) // polling the API, under a deadline
	}
	const plot = `svg[aria-labelledby="bw-block-t bw-block-d"]`
	do(t, ctx, "the devices page", wait, chromedp.Navigate(base+"/ui/devices"), chromedp.WaitVisible(chromedp.CSS(plot)))
	if lines := get(t, ctx, "plot lines", wait, chromedp.Nodes(chromedp.CSSAll(plot+" polyline"))); len(lines) == 0 {
		t.Errorf("the bandwidth plot draws no line")
	}
	shot(t, ctx, "devices")

	// The topology graph has the control plane and the 3 nodes.
	do(t, ctx, "the topology", wait, chromedp.Navigate(base+"/ui/topology"), chromedp.WaitVisible(chromedp.CSS("svg.graph")))
	if n := get(t, ctx, "graph labels", wait, chromedp.Evaluate[int](
		`[...document.querySelectorAll("svg.graph text")].filter(e => /^node\d$/.test(e.textContent)).length`)); n != 3 {
		t.Errorf("the topology graph labels %d nodes, want 3", n)
	}
	shot(t, ctx, "topology")

	// The simulator's results: a plot and the figures, tagged.
	do(t, ctx, "a simulator experiment", wait, chromedp.Navigate(base+"/ui/sim/smufin-sharing"), chromedp.WaitVisible(chromedp.CSS("table#figures")))
	if n := get(t, ctx, "simulator plot and tags", wait, chromedp.Evaluate[int](
		`document.querySelectorAll("figure svg").length * [...document.querySelectorAll("#figures td")].filter(e => e.textContent === "prediction").length`)); n == 0 {
		t.Errorf("the simulator page shows no plot or no prediction")
	}
	shot(t, ctx, "simulator")
	do(t, ctx, "the cluster page", wait, chromedp.Navigate(base+"/ui/"), chromedp.WaitVisible(chromedp.ID("node-count")))
	shot(t, ctx, "cluster")

	// The lease list, filtered.
	do(t, ctx, "the lease list", wait, chromedp.Navigate(base+"/ui/leases?kind=block&state=active"), chromedp.WaitVisible(chromedp.ID("leases")))
	if n := get(t, ctx, "lease rows", wait, chromedp.Evaluate[int](fmt.Sprintf(
		`[...document.querySelectorAll("#leases a")].filter(a => a.textContent === %q).length`, id))); n != 1 {
		t.Errorf("the lease list shows %s %d times", id, n)
	}
	noSecrets("the lease list")
	shot(t, ctx, "leases")

	// Release it from its page; the stream sees that too.
	do(t, ctx, "release the lease", wait,
		chromedp.Navigate(base+"/ui/leases/"+id),
		chromedp.WaitVisible(chromedp.ID("release")),
		chromedp.Click(chromedp.ID("release")),
		chromedp.WaitVisible(chromedp.CSS(".flash")))
	flash = get(t, ctx, "flash", wait, chromedp.Text(chromedp.CSS(".flash")))
	state = get(t, ctx, "lease state", wait, chromedp.Text(chromedp.ID("lease-state")))
	if !strings.Contains(flash, "released") || (state != "released" && state != "releasing") {
		t.Errorf("after release: flash %q, state %q", flash, state)
	}
	do(t, events, "the release arrives in the stream", wait, chromedp.WaitVisible(chromedp.Search(fmt.Sprintf(
		`//table[@id="events"]/tbody/tr[contains(@class,"new")][td[3][text()="lease.released"]][td[4]/a[text()=%q]]`, id))))
	shot(t, events, "events")
	if l, err := admin.Lease(context.Background(), id); err != nil || l.State != api.LeaseReleased {
		t.Errorf("the lease after release: %v %s", err, l.State)
	}

	// Sign out; sign in with the token form.
	submit(t, ctx, "sign out", wait, base+"/ui/", "#token", chromedp.Click(chromedp.CSS("form.who button")))
	shot(t, ctx, "login")
	submit(t, ctx, "a wrong token", wait, base+"/ui/", ".error",
		chromedp.SendKeys(chromedp.ID("token"), "rat_not-a-token"),
		chromedp.Submit(chromedp.ID("token")))
	submit(t, ctx, "sign in with the token form", wait, base+"/ui/", "#node-count",
		chromedp.SendKeys(chromedp.ID("token"), up.Token),
		chromedp.Submit(chromedp.ID("token")))
	noSecrets("the cluster page after a token sign-in")

	// Without the session cookie the pages are closed.
	hc := up.HTTPClient(t)
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := hc.Get(base + "/ui/leases")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/ui/login") {
		t.Errorf("/ui/leases without a session: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
}
