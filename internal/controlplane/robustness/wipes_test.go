package robustness

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/controlplane/store/postgres"
	"github.com/rialto-project/rialto/internal/pgserver/pgtest"
)

// wipingLender is a lender agent that wipes a block range when it tears
// a lease down and cannot finish until the test says so (its teardown
// answers are late: 503, as a teardown call that timed out), and refuses
// to prepare a range it is still wiping, as a real lender does. It counts
// the prepares that came for a range being wiped: a control plane that
// knows the range is being wiped places around it instead.
type wipingLender struct {
	mu       sync.Mutex
	ranges   map[string][2]int64 // lease ID → its range, once prepared
	wiping   map[string][2]int64 // lease ID → its range being wiped
	refused  int                 // prepares of a range being wiped
	prepared map[string]bool     // lease IDs prepared
}

func (l *wipingLender) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch r.URL.Path {
	case "/agent/v1/prepare":
		var req api.PrepareRequest
		json.NewDecoder(r.Body).Decode(&req)
		for _, rg := range l.wiping {
			if req.Offset < rg[0]+rg[1] && req.Offset+req.Length > rg[0] {
				l.refused++
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusConflict)
				json.NewEncoder(w).Encode(api.ErrorBody{Error: api.ErrorInfo{Code: "conflict", Message: "the range of device disk0 " + api.RangeBeingWiped}})
				return
			}
		}
		l.ranges[req.LeaseID] = [2]int64{req.Offset, req.Length}
		l.prepared[req.LeaseID] = true
		json.NewEncoder(w).Encode(api.PrepareResponse{URI: "nbd://127.0.0.1:10809/" + req.Export})
	case "/agent/v1/teardown":
		var req api.TeardownRequest
		json.NewDecoder(r.Body).Decode(&req)
		if rg, ok := l.ranges[req.LeaseID]; ok {
			delete(l.ranges, req.LeaseID)
			l.wiping[req.LeaseID] = rg
		}
		if _, ok := l.wiping[req.LeaseID]; ok {
			w.WriteHeader(http.StatusServiceUnavailable) // still wiping
			return
		}
		w.Write([]byte("{}"))
	default:
		w.Write([]byte("{}"))
	}
}

// state is what the lender wipes and how many prepares it refused.
func (l *wipingLender) state() (wiping []string, refused int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for id := range l.wiping {
		wiping = append(wiping, id)
	}
	return wiping, l.refused
}

// finish completes every wipe.
func (l *wipingLender) finish() {
	l.mu.Lock()
	defer l.mu.Unlock()
	clear(l.wiping)
}

// TestReplicasSeeEachOthersWipes: a block range being wiped after a lease
// released through one replica is kept out of another replica's
// placement. Two replicas on one PostgreSQL, one lender with one device
// that fits one lease: replica A releases the lease (the lender starts
// wiping, its teardown answer is late) and receives the lender's
// heartbeats, which list the wipe; a lease asked of replica B must wait
// for the wipe rather than be prepared on the range being wiped, and is
// placed there once the lender has finished (its heartbeats, still to A,
// no longer list the wipe).
func TestReplicasSeeEachOthersWipes(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	url := pgtest.DB(t)
	addrs := strings.Split(inProcessOn(t, ctx, url, func(s *postgres.Store) store.Store { return s }), ",")
	a, b := addrs[0], addrs[1]

	lender := &wipingLender{ranges: map[string][2]int64{}, wiping: map[string][2]int64{}, prepared: map[string]bool{}}
	agent := httptest.NewServer(lender)
	t.Cleanup(agent.Close)
	jr, err := api.NewClient(a, bootTok, nil).Join(ctx, api.JoinRequest{Name: "wiper", Address: "127.0.0.1", AgentURL: agent.URL,
		Fingerprint: api.Fingerprint{MachineID: "wp-wiper", Hostname: "wiper", Cores: 2, MemoryBytes: 1 << 30},
		Devices:     []api.DeviceSpec{{Name: "disk0", Kind: api.KindBlock, Capacity: leaseSz, Sharing: "partitionable"}}})
	if err != nil {
		t.Fatal(err)
	}
	node := api.NewClient(a, jr.Credential, nil) // the lender beats to replica A only
	beat := func() {
		t.Helper()
		wiping, _ := lender.state()
		if _, err := node.Heartbeat(ctx, jr.NodeID, api.Heartbeat{Health: "ok", Wiping: wiping}); err != nil {
			t.Fatal(err)
		}
	}

	// A lease through A, released through A: the lender starts wiping.
	ca := api.NewClient(a, tokens["tenant-a"], nil)
	first, err := ca.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: leaseSz})
	if err != nil {
		t.Fatal(err)
	}
	if first.State != api.LeaseActive {
		t.Fatalf("first lease %s", first.State)
	}
	if _, err := ca.ReleaseLease(ctx, first.ID); err != nil {
		t.Fatal(err)
	}
	if w, _ := lender.state(); len(w) != 1 || w[0] != first.ID {
		t.Fatalf("the lender wipes %v, want the released lease %s", w, first.ID)
	}
	beat()

	// A lease through B: it finds the only range being wiped.
	type result struct {
		l   api.Lease
		err error
	}
	done := make(chan result, 1)
	go func() {
		l, err := api.NewClient(b, tokens["tenant-b"], nil).CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: leaseSz})
		done <- result{l, err}
	}()
	deadline := time.Now().Add(20 * time.Second)
	for waiting := false; ; {
		if _, refused := lender.state(); refused > 0 {
			t.Fatalf("replica B prepared a lease on a range the lender is still wiping (after a lease released through replica A)")
		}
		if waiting {
			break
		}
		select {
		case r := <-done:
			t.Fatalf("the lease asked of replica B did not wait for the wipe: %+v %v", r.l, r.err)
		case <-time.After(50 * time.Millisecond): // polling B's metrics, with a deadline
		}
		waiting = metric(b, "rialto_placement_wipe_waits") == 1
		if time.Now().After(deadline) {
			t.Fatal("replica B neither waits for the wipe nor prepares")
		}
	}

	// The lender finishes; its heartbeats (to A) no longer list the wipe.
	lender.finish()
	tick := time.NewTicker(200 * time.Millisecond) // the lender's heartbeats
	defer tick.Stop()
	for {
		beat()
		select {
		case r := <-done:
			if r.err != nil {
				t.Fatalf("the lease asked of replica B once the wipe was done: %v", r.err)
			}
			if r.l.State != api.LeaseActive || len(r.l.Parts) != 1 || r.l.Parts[0].Offset != 0 {
				t.Fatalf("the lease asked of replica B: %+v", r.l)
			}
			if _, refused := lender.state(); refused > 0 {
				t.Fatalf("%d prepares came for a range being wiped", refused)
			}
			return
		case <-tick.C:
		}
	}
}
