package lifecycle

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the golden files under testdata/")

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// lease is a two-part lease (on n1 and n2) in state st, reserved at t0
// for an hour, last changed at t0.
func lease(st api.LeaseState) api.Lease {
	l := api.Lease{ID: "lease-1", State: st, Kind: api.KindBlock, Mode: api.ModeComposed, Tenant: "alice", Count: 2,
		TTLSeconds: 3600, ExpiresAt: t0.Add(time.Hour), CreatedAt: t0, UpdatedAt: t0,
		Parts: []api.Part{{NodeID: "n1", DeviceID: "d1", Offset: 0, Length: 1 << 20}, {NodeID: "n2", DeviceID: "d2", Offset: 0, Length: 1 << 20}},
		Plan:  &api.Plan{ID: "lease-1", Mode: api.ModeComposed, State: "feasible"}}
	if st == api.LeaseActive || st == api.LeaseReleasing {
		l.Parts[0].URI, l.Parts[1].URI = "nbd://10.0.0.1:10809/rlc_x.0", "nbd://10.0.0.2:10809/rlc_x.1"
	}
	if st == api.LeaseFailed || st == api.LeaseLost || st == api.LeaseExpired {
		l.Reason = "some reason"
	}
	return l
}

// events are one of each event, with the time Step is called at (t0 +
// 1 min unless the event needs another).
var events = []struct {
	name string
	ev   Event
	at   time.Time
	mod  func(api.Lease) api.Lease // the lease the event meets, if not lease()'s
}{
	{"reserve", Reserve{Size: "1 MiB"}, t0, nil},
	{"confirm", Confirm{URIs: []string{"nbd://10.0.0.1:10809/rlc_x.0", "nbd://10.0.0.2:10809/rlc_x.1"}}, t0.Add(time.Minute), nil},
	{"prepare-failed round 0", PrepareFailed{Failed: map[string]string{"n2": "lender n2 refused the part: busy"}, Round: 0}, t0.Add(time.Minute), nil},
	{"prepare-failed last round", PrepareFailed{Failed: map[string]string{"n2": "lender n2 refused the part: busy"}, Round: MaxPrepareRounds - 1}, t0.Add(time.Minute), nil},
	{"placed", Placed{Plan: api.Plan{Mode: api.ModeComposed, Parts: []api.Part{{NodeID: "n1", DeviceID: "d1", Length: 1 << 20}, {NodeID: "n3", DeviceID: "d3", Length: 1 << 20}}}, Skipped: 1}, t0.Add(time.Minute), nil},
	{"unplaceable", Unplaceable{Failed: map[string]string{"n2": "lender n2 refused the part: busy"}, Err: errors.New("placement: infeasible")}, t0.Add(time.Minute), nil},
	{"renew", Renew{TTLSeconds: 60}, t0.Add(time.Minute), nil},
	{"renew (own TTL)", Renew{}, t0.Add(time.Minute), nil},
	{"release", Release{By: "alice", Tenant: "alice"}, t0.Add(time.Minute), nil},
	{"torn down", TornDown{}, t0.Add(time.Minute), nil},
	{"expire (before expiry)", Expire{}, t0.Add(time.Minute), nil},
	{"expire", Expire{}, t0.Add(2 * time.Hour), nil},
	{"node n2 down", NodeDown{NodeID: "n2", Name: "rack1-2"}, t0.Add(time.Minute), nil},
	{"node n9 down", NodeDown{NodeID: "n9", Name: "rack9-9"}, t0.Add(time.Minute), nil},
	{"node n2 removed", NodeDown{NodeID: "n2", Name: "rack1-2", Removed: true}, t0.Add(time.Minute), nil},
	{"parts lost n2", PartsLost{NodeID: "n2", Parts: []api.PartRef{{DeviceID: "d2"}}, Why: "its memory region did not survive the agent's restart"}, t0.Add(time.Minute), nil},
	{"parts lost n2 (other part)", PartsLost{NodeID: "n2", Parts: []api.PartRef{{DeviceID: "d2", Offset: 4096}}, Why: "gone"}, t0.Add(time.Minute), nil},
	{"parts lost n1 (a nic bond)", PartsLost{NodeID: "n1", Parts: []api.PartRef{{DeviceID: "d1"}}, Why: "gone"}, t0.Add(time.Minute), nicBond},
	{"parts lost n2 (a nic bond, part 1 lost)", PartsLost{NodeID: "n2", Parts: []api.PartRef{{DeviceID: "d2"}}, Why: "gone"}, t0.Add(time.Minute), lostPart1},
	{"interrupted (recent)", Interrupted{Before: t0}, t0.Add(time.Minute), nil},
	{"interrupted", Interrupted{Before: t0.Add(time.Second)}, t0.Add(time.Minute), nil},
	{"reconcile n1", Reconcile{NodeID: "n1"}, t0.Add(time.Minute), nil},
	{"reconcile n9", Reconcile{NodeID: "n9"}, t0.Add(time.Minute), nil},
	{"moved n2", Moved{NodeID: "n2", Exports: []api.MovedExport{{LeaseID: "lease-1", DeviceID: "d2", URI: "nbd://10.0.0.9:10809/rlc_x.1"}}}, t0.Add(time.Minute), nil},
	{"moved n2 (same address)", Moved{NodeID: "n2", Exports: []api.MovedExport{{LeaseID: "lease-1", DeviceID: "d2", URI: "nbd://10.0.0.2:10809/rlc_x.1"}}}, t0.Add(time.Minute), nil},
	{"moved n2 (other export)", Moved{NodeID: "n2", Exports: []api.MovedExport{{LeaseID: "lease-1", DeviceID: "d2", URI: "nbd://10.0.0.9:10809/rlc_y.1"}}}, t0.Add(time.Minute), nil},
	{"reconcile n3 (incoming)", Reconcile{NodeID: "n3", Incoming: []api.PartRef{{DeviceID: "d3", Offset: 4096, Length: 1 << 20}}}, t0.Add(time.Minute), nil},
	{"node n2 down (a nic bond)", NodeDown{NodeID: "n2", Name: "rack1-2"}, t0.Add(time.Minute), nicBond},
	{"node n1 down (a nic bond, part 1 lost)", NodeDown{NodeID: "n1", Name: "rack1-1"}, t0.Add(time.Minute), lostPart1},
	{"node n2 down (a nic bond, part 1 lost)", NodeDown{NodeID: "n2", Name: "rack1-2"}, t0.Add(time.Minute), lostPart1},
	{"reconcile n1 (a nic bond, part 1 lost)", Reconcile{NodeID: "n1"}, t0.Add(time.Minute), lostPart1},
	{"reconcile n2 (a nic bond, part 1 lost)", Reconcile{NodeID: "n2"}, t0.Add(time.Minute), lostPart1},
	{"move started part 1 (lost)", MoveStarted{Move: move1}, t0.Add(time.Minute), lostPart1},
	{"moved n2 (part 1 lost)", Moved{NodeID: "n2", Exports: []api.MovedExport{{LeaseID: "lease-1", DeviceID: "d2", URI: "nbd://10.0.0.9:10809/rlc_x.1"}}}, t0.Add(time.Minute), lostPart1},
	{"move started part 1", MoveStarted{Move: move1}, t0.Add(time.Minute), nil},
	{"move started (stale part)", MoveStarted{Move: func() api.Move { m := move1; m.From.DeviceID = "d9"; return m }()}, t0.Add(time.Minute), nil},
	{"move started (no part 5)", MoveStarted{Move: func() api.Move { m := move1; m.Part = 5; return m }()}, t0.Add(time.Minute), nil},
	{"move started (onto itself)", MoveStarted{Move: func() api.Move { m := move1; m.To = m.From; return m }()}, t0.Add(time.Minute), nil},
	{"move done part 1", MoveDone{Move: move1, URI: "nbd://10.0.0.3:10809/rlm_z"}, t0.Add(time.Minute), nil},
	{"move failed part 1", MoveFailed{Move: move1, Why: "the destination did not answer"}, t0.Add(time.Minute), nil},
	{"reconcile n3 (doubt)", Reconcile{NodeID: "n3", Doubt: []api.PartRef{{DeviceID: "d3", Offset: 4096, Length: 1 << 20}}}, t0.Add(time.Minute), nil},
	{"reconcile n1 (doubt)", Reconcile{NodeID: "n1", Doubt: []api.PartRef{{DeviceID: "d1", Offset: 1 << 20, Length: 1 << 20}}}, t0.Add(time.Minute), nil},
	{"part adopted part 1", PartAdopted{Move: adopt1, URI: "nbd://10.0.0.3:10809/rlm_z"}, t0.Add(time.Minute), nil},
	{"part adopted (stale part)", PartAdopted{Move: func() api.Move { m := adopt1; m.From.NodeID = "n9"; return m }(), URI: "nbd://10.0.0.3:10809/rlm_z"}, t0.Add(time.Minute), nil},
	{"part adopted (other length)", PartAdopted{Move: func() api.Move { m := adopt1; m.To.Length = 4096; return m }(), URI: "nbd://10.0.0.3:10809/rlm_z"}, t0.Add(time.Minute), nil},
	{"part adopted (another protocol)", PartAdopted{Move: adopt1, URI: "http://10.0.0.3:8080/rlm_z"}, t0.Add(time.Minute), nil},
	{"part adopted (user information)", PartAdopted{Move: adopt1, URI: "nbd://u:p@10.0.0.3:10809/rlm_z"}, t0.Add(time.Minute), nil},
	{"part adopted part 1 (lost)", PartAdopted{Move: adopt1, URI: "nbd://10.0.0.3:10809/rlm_z"}, t0.Add(time.Minute), lostPart1},
}

// adopt1 adopts part 1 of lease() at n3, which holds it.
var adopt1 = func() api.Move {
	m := move1
	m.ID, m.State, m.Reason = "move-2", api.MoveDone, "its lender does not serve it"
	return m
}()

// nicBond is l as a bond of two lent NICs (parts on n1 and n2).
func nicBond(l api.Lease) api.Lease {
	l.Kind = api.KindNIC
	l.Parts = slices.Clone(l.Parts)
	return l
}

// lostPart1 is nicBond(l) whose part 1 (on n2) was lost.
func lostPart1(l api.Lease) api.Lease {
	l = nicBond(l)
	l.Parts[1].State = api.PartLost
	return l
}

// move1 moves part 1 of lease() from n2 to n3.
var move1 = api.Move{ID: "move-1", LeaseID: "lease-1", Part: 1, Kind: api.KindBlock,
	From: api.Part{NodeID: "n2", DeviceID: "d2", Offset: 0, Length: 1 << 20}, To: api.Part{NodeID: "n3", DeviceID: "d3", Offset: 4096, Length: 1 << 20},
	Reason: "drain of node n2"}

// TestStep runs every event on a lease in every state (and one not read,
// state "") and compares what Step does with testdata/step.golden
// (go test -rewrite regenerates it). It also checks the rules that hold
// for every answer.
func TestStep(t *testing.T) {
	var b strings.Builder
	b.WriteString("# lifecycle.Step: every event in every lease state (state \"\": a lease not read).\n")
	b.WriteString("# Generated by TestStep; go test ./internal/controlplane/lifecycle -rewrite updates it.\n")
	for _, st := range append([]api.LeaseState{""}, States...) {
		fmt.Fprintf(&b, "\n## %s\n", stateName(st))
		for _, e := range events {
			l := lease(st)
			if e.mod != nil {
				l = e.mod(l)
			}
			next, acts, err := Step(l, e.ev, e.at)
			fmt.Fprintf(&b, "%s: %s\n", e.name, outcome(l, next, acts, err))
			checkRules(t, st, e.name, l, next, acts, err)
		}
	}
	path := filepath.Join("testdata", "step.golden")
	if *rewrite {
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -rewrite to create it)", err)
	}
	if got := b.String(); got != string(want) {
		gl, wl := strings.Split(got, "\n"), strings.Split(string(want), "\n")
		for i := range max(len(gl), len(wl)) {
			g, w := "", ""
			if i < len(gl) {
				g = gl[i]
			}
			if i < len(wl) {
				w = wl[i]
			}
			if g != w {
				t.Fatalf("%s:%d differs (go test -rewrite to accept):\n got: %s\nwant: %s", path, i+1, g, w)
			}
		}
	}
}

// checkRules checks what every answer of Step must satisfy.
func checkRules(t *testing.T, st api.LeaseState, name string, l, next api.Lease, acts []Action, err error) {
	t.Helper()
	at := stateName(st) + " + " + name
	writes := 0
	for i, a := range acts {
		switch a := a.(type) {
		case FinishMove:
			writes++
			if l.State != api.LeaseActive || next.State != api.LeaseActive || a.Event.Subject != l.ID {
				t.Errorf("%s: FinishMove of a %s lease", at, l.State)
			}
		case BeginMove:
			if l.State != api.LeaseActive {
				t.Errorf("%s: BeginMove of a %s lease", at, l.State)
			}
		case Create:
			writes++
			if l.State != api.LeaseRequested || next.State != api.LeaseReserved {
				t.Errorf("%s: Create from %s to %s", at, l.State, next.State)
			}
		case Replace:
			writes++
			if next.State != api.LeaseReserved || !Allowed(api.LeaseReserved, api.LeaseReserved) {
				t.Errorf("%s: Replace to %s", at, next.State)
			}
		case Persist:
			writes++
			ch := a.Change
			if ch.To != next.State || a.Event.State != string(ch.To) || a.Event.Subject != l.ID || !ch.At.Equal(next.UpdatedAt) {
				t.Errorf("%s: Persist %+v does not write the lease Step returns (%s)", at, a, next.State)
			}
			if len(ch.From) == 0 || (st != "" && !slices.Contains(ch.From, st)) {
				t.Errorf("%s: Persist from %v does not include the lease's state", at, ch.From)
			}
			for _, from := range ch.From {
				if !Allowed(from, ch.To) {
					t.Errorf("%s: Persist %s → %s is not a transition of the lifecycle", at, from, ch.To)
				}
			}
			if ch.To.Terminal() != slices.ContainsFunc(acts[i:], func(a Action) bool { _, ok := a.(Free); return ok }) {
				t.Errorf("%s: a write to %s must be followed by Free exactly when it ends the lease", at, ch.To)
			}
		case Free:
			if !next.State.Terminal() {
				t.Errorf("%s: Free of a %s lease", at, next.State)
			}
		case FreeParts:
			w, ok := acts[max(i-1, 0)].(Persist)
			if !ok || !slices.Equal(w.Change.LostParts, a.Parts) || next.State != api.LeaseActive {
				t.Errorf("%s: FreeParts %v not after the write that loses them", at, a.Parts)
			}
			for _, k := range a.Parts {
				if !next.Parts[k].Lost() {
					t.Errorf("%s: part %d freed but not lost", at, k)
				}
			}
		}
	}
	if writes > 1 {
		t.Errorf("%s: %d writes in one step", at, writes)
	}
	if err != nil {
		if writes > 0 || !equalLease(l, next) {
			t.Errorf("%s: refused (%v) but changes the lease or writes", at, err)
		}
		if !errors.Is(err, ErrRefused) && !errors.Is(err, ErrBadReport) {
			t.Errorf("%s: error %v is neither a refusal nor a bad report", at, err)
		}
		if _, ok := err.(*Refusal); errors.Is(err, ErrRefused) && !ok {
			t.Errorf("%s: refusal %v is not a *Refusal", at, err)
		}
	}
	if st.Terminal() && writes > 0 {
		t.Errorf("%s: a %s lease was written", at, st)
	}
	if writes == 0 && next.State != l.State {
		t.Errorf("%s: state %s → %s without a write", at, l.State, next.State)
	}
}

func equalLease(a, b api.Lease) bool { return fmt.Sprintf("%+v", a) == fmt.Sprintf("%+v", b) }

func stateName(st api.LeaseState) string {
	if st == "" {
		return `"" (not read)`
	}
	return string(st)
}

// outcome is one line of the golden file.
func outcome(l, next api.Lease, acts []Action, err error) string {
	var b strings.Builder
	switch {
	case err != nil:
		b.WriteString("refused: " + err.Error())
	case next.State != l.State:
		b.WriteString("→ " + string(next.State))
	default:
		b.WriteString("stays " + stateName(next.State))
	}
	for _, a := range acts {
		b.WriteString("\n    " + action(a))
	}
	return b.String()
}

func action(a Action) string {
	switch a := a.(type) {
	case Create:
		return fmt.Sprintf("Create %s %q", a.Event.Type, a.Event.Message)
	case Replace:
		var ps []string
		for _, p := range a.Plan.Parts {
			ps = append(ps, p.NodeID+"/"+p.DeviceID)
		}
		return fmt.Sprintf("Replace parts [%s] %s %q", strings.Join(ps, " "), a.Event.Type, a.Event.Message)
	case Persist:
		return fmt.Sprintf("Persist %v → %s%s %s %q%s", a.Change.From, a.Change.To, change(a.Change), a.Event.Type, a.Event.Message, undo(a.Undo))
	case Prepare:
		return "Prepare"
	case Place:
		return "Place skip " + joinReasons(a.Skip)
	case Teardown:
		s := "Teardown"
		if a.Except != "" {
			s += " except " + a.Except
		}
		if a.Removed {
			s += " (removed)"
		}
		if a.Placement != 0 {
			s += fmt.Sprintf(" placement ≤ %d", a.Placement)
		}
		return s
	case TeardownOn:
		return "TeardownOn " + a.NodeID
	case KeepOn:
		var ps []string
		for _, p := range a.Parts {
			ps = append(ps, fmt.Sprintf("%s[%d+%d]", p.DeviceID, p.Offset, p.Length))
		}
		s := "KeepOn " + a.NodeID + " until " + a.ExpiresAt.Format(time.RFC3339) + " parts " + strings.Join(ps, " ")
		if len(a.Doubt) > 0 {
			var ds []string
			for _, p := range a.Doubt {
				ds = append(ds, fmt.Sprintf("%s[%d+%d]", p.DeviceID, p.Offset, p.Length))
			}
			s += " doubt " + strings.Join(ds, " ")
		}
		return s
	case Free:
		return "Free"
	case FreeParts:
		return fmt.Sprintf("FreeParts %v", a.Parts)
	case BeginMove:
		return fmt.Sprintf("BeginMove %s part %d → %s/%s %s %q", a.Move.ID, a.Move.Part, a.Move.To.NodeID, a.Move.To.DeviceID, a.Event.Type, a.Event.Message)
	case FinishMove:
		return fmt.Sprintf("FinishMove %s uri=%s %s %q%s", a.Move.ID, a.URI, a.Event.Type, a.Event.Message, undo(a.Undo))
	case EndMove:
		s := fmt.Sprintf("EndMove %s %s", a.Move.ID, a.State)
		if a.Error != "" {
			s += fmt.Sprintf(" (%s)", a.Error)
		}
		return s + fmt.Sprintf(" %s %q", a.Event.Type, a.Event.Message)
	case AbortMove:
		return "AbortMove " + a.Move.ID
	case AdoptPart:
		return fmt.Sprintf("AdoptPart %s part %d → %s/%s[%d+%d] uri=%s %s %q", a.Move.ID, a.Move.Part, a.Move.To.NodeID, a.Move.To.DeviceID, a.Move.To.Offset, a.Move.To.Length, a.URI, a.Event.Type, a.Event.Message)
	}
	return fmt.Sprintf("%T", a)
}

func change(ch store.LeaseChange) string {
	var s []string
	if ch.Reason != "" {
		s = append(s, fmt.Sprintf("reason=%q", ch.Reason))
	}
	if len(ch.URIs) > 0 {
		s = append(s, fmt.Sprintf("uris=%v", ch.URIs))
	}
	if ch.URI != "" {
		s = append(s, "uri="+ch.URI)
	}
	if !ch.ExpiresAt.IsZero() {
		s = append(s, "expires="+ch.ExpiresAt.Format(time.RFC3339))
	}
	if ch.TTL != 0 {
		s = append(s, fmt.Sprintf("ttl=%d", ch.TTL))
	}
	if ch.Plan != nil {
		s = append(s, "plan")
	}
	if ch.Tenant != "" {
		s = append(s, "if tenant="+ch.Tenant)
	}
	if len(ch.LostParts) > 0 {
		s = append(s, fmt.Sprintf("lost parts %v", ch.LostParts))
	}
	if len(s) == 0 {
		return ""
	}
	return " (" + strings.Join(s, ", ") + ")"
}

func undo(acts []Action) string {
	if len(acts) == 0 {
		return ""
	}
	var s []string
	for _, a := range acts {
		s = append(s, action(a))
	}
	return "; if refused: " + strings.Join(s, ", ")
}

// TestTransitionTable pins the lifecycle's transitions (docs/ARCHITECTURE.md §2).
func TestTransitionTable(t *testing.T) {
	allowed := map[[2]api.LeaseState]bool{}
	for _, tr := range [][2]api.LeaseState{
		{api.LeaseRequested, api.LeaseReserved}, {api.LeaseRequested, api.LeaseFailed},
		{api.LeaseReserved, api.LeaseReserved}, {api.LeaseReserved, api.LeaseActive}, {api.LeaseReserved, api.LeaseReleasing},
		{api.LeaseReserved, api.LeaseFailed}, {api.LeaseReserved, api.LeaseLost}, {api.LeaseReserved, api.LeaseExpired},
		{api.LeaseActive, api.LeaseActive}, {api.LeaseActive, api.LeaseReleasing}, {api.LeaseActive, api.LeaseLost}, {api.LeaseActive, api.LeaseExpired},
		{api.LeaseReleasing, api.LeaseReleased}, {api.LeaseReleasing, api.LeaseLost},
	} {
		allowed[tr] = true
	}
	for _, from := range States {
		for _, to := range States {
			want := allowed[[2]api.LeaseState{from, to}]
			if got := Allowed(from, to); got != want {
				t.Errorf("%s → %s: got %v, want %v", from, to, got, want)
			}
			if from.Terminal() && Allowed(from, to) {
				t.Errorf("terminal %s has a way out to %s", from, to)
			}
			if slices.Contains(Sources(to), from) != want {
				t.Errorf("Sources(%s) = %v", to, Sources(to))
			}
		}
	}
}

// TestReservationWalk drives one reservation the way the control plane
// does, feeding each action's outcome back: reserve, a lender refuses,
// placed again, confirmed, released, torn down.
func TestReservationWalk(t *testing.T) {
	l := lease(api.LeaseRequested)
	l.Parts[0].URI, l.Parts[1].URI = "", ""
	var acts []Action
	var err error
	step := func(ev Event, want ...string) {
		t.Helper()
		if l, acts, err = Step(l, ev, t0); err != nil {
			t.Fatalf("%T: %v", ev, err)
		}
		var got []string
		for _, a := range acts {
			got = append(got, strings.Fields(action(a))[0])
		}
		if !slices.Equal(got, want) {
			t.Fatalf("%T: actions %v, want %v", ev, got, want)
		}
	}
	step(Reserve{Size: "1 MiB"}, "Create", "Prepare")
	step(PrepareFailed{Failed: map[string]string{"n2": "lender n2 gave no confirmation within 2s"}}, "Teardown", "Place")
	if p := acts[1].(Place); p.Skip["n2"] == "" {
		t.Fatalf("place skips %v", p.Skip)
	}
	step(Placed{Plan: api.Plan{Mode: api.ModeComposed, Parts: []api.Part{{NodeID: "n1", DeviceID: "d1", Length: 1 << 20}, {NodeID: "n3", DeviceID: "d3", Length: 1 << 20}}}, Skipped: 1},
		"Replace", "Prepare")
	if l.State != api.LeaseReserved || l.Parts[1].NodeID != "n3" || l.NodeID != "n1" || l.Plan.ID != l.ID {
		t.Fatalf("after Placed: %+v", l)
	}
	step(Confirm{URIs: []string{"nbd://a/x.0", "nbd://b/x.1"}}, "Persist")
	if l.State != api.LeaseActive || l.Parts[1].URI != "nbd://b/x.1" || l.URI != "" {
		t.Fatalf("after Confirm: %+v", l)
	}
	step(Release{By: "alice"}, "Persist", "Teardown")
	step(TornDown{}, "Persist", "Free")
	if l.State != api.LeaseReleased {
		t.Fatalf("after TornDown: %s", l.State)
	}
	if _, _, err := Step(l, Release{By: "alice"}, t0); err != nil {
		t.Fatalf("releasing a released lease: %v", err)
	}
}

func TestSameExport(t *testing.T) {
	for _, c := range []struct {
		prev, next string
		want       bool
	}{
		{"nbd://10.0.0.1:10809/rlc_x.0", "nbd://10.0.0.9:10810/rlc_x.0", true},
		{"nbd://10.0.0.1:10809/rlc_x.0", "nbd://10.0.0.9:10810/rlc_y.0", false},
		{"nbd://10.0.0.1:10809/rlc_x.0", "rialto-mem://10.0.0.9:1/rlc_x.0", false},
		{"nbd://10.0.0.1:10809/rlc_x.0", "nbds://10.0.0.9:10810/rlc_x.0", true},
		{"nbds://10.0.0.1:10809/rlc_x.0", "nbd://10.0.0.1:10809/rlc_x.0", true},
		{"rialto-mems://10.0.0.1:1/rlc_x.0", "rialto-mem://10.0.0.1:1/rlc_x.0", true},
		{"rialto-nic://10.0.0.1:1/rlc_x.0", "rialto-nics://10.0.0.1:1/rlc_x.0", true},
		{"rialto-nics://10.0.0.1:1/rlc_x.0", "rialto-mems://10.0.0.1:1/rlc_x.0", false},
		{"nbds://10.0.0.1:10809/rlc_x.0", "rialto-mems://10.0.0.9:1/rlc_x.0", false},
		{"rialto-accel://h:1/rlc_x.0?gateway=sha256", "rialto-accels://h:2/rlc_x.0?gateway=sha256", true},
		{"nbd://10.0.0.1:10809/rlc_x.0", "nbd://user@10.0.0.9/rlc_x.0", false},
		{"nbd://10.0.0.1:10809/rlc_x.0", "nbd:///rlc_x.0", false},
		{"rialto-accel://h:1/rlc_x.0?gateway=sha256", "rialto-accel://h:2/rlc_x.0?gateway=sha256", true},
		{"rialto-accel://h:1/rlc_x.0?gateway=sha256", "rialto-accel://h:2/rlc_x.0?gateway=fft", false},
		{"rialto-accel://h:1/rlc_x.0?gateway=sha256", "rialto-accel://h:2/rlc_x.0", false},
		{"", "nbd://h/x", false},
		{"nbd://h/x", "nbd://h/x#frag", false},
		{"nbd://h/x", "nbd://g/" + strings.Repeat("x", maxURI), false},
	} {
		if got := sameExport(c.prev, c.next); got != c.want {
			t.Errorf("sameExport(%q, %q) = %v, want %v", c.prev, c.next, got, c.want)
		}
	}
}
