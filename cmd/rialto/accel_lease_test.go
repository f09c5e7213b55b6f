package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/borrower"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/testcluster"
)

func TestParseLeaseRange(t *testing.T) {
	for _, tc := range []struct {
		s       string
		withLen bool
		id      string
		off, n  int64
		err     string
	}{
		{"lease-a:0:64MiB", true, "lease-a", 0, 64 << 20, ""},
		{"lease-a:4KiB:1", true, "lease-a", 4096, 1, ""},
		{"lease-b:1MiB", false, "lease-b", 1 << 20, 0, ""},
		{"lease-a:0", true, "", 0, 0, "want LEASE:OFF:LEN"},
		{"lease-a:0:0", true, "", 0, 0, `bad length "0"`},
		{"lease-a:-1:5", true, "", 0, 0, `bad offset "-1"`},
		{":0:5", true, "", 0, 0, "want LEASE:OFF:LEN"},
		{"lease-b:1:2", false, "", 0, 0, "want LEASE:OFF"},
		{"lease-b:x", false, "", 0, 0, `bad offset "x"`},
	} {
		id, off, n, err := parseLeaseRange(tc.s, tc.withLen)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: %v, want %q", tc.s, err, tc.err)
			}
			continue
		}
		if err != nil || id != tc.id || off != tc.off || n != tc.n {
			t.Errorf("%q: %s %d %d %v", tc.s, id, off, n, err)
		}
	}
}

// accel run with block leases as input and output, in process: the slot
// reads and writes them itself (path "direct"), or the borrower relays;
// mistakes are refused before anything moves.
func TestAccelRunLeaseIO(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Nodes: 2, Devices: []agent.DeviceConfig{
		{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 8 << 20},
		{Name: "accel0", Kind: api.KindAccel, Size: 2, Attributes: map[string]string{"slot_memory": "2MiB"}},
	}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl := c.Client()
	blk, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeComposed, Count: 2, Size: 4 << 20, StripeUnit: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	out, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	sha, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindAccel, Role: "sha256"})
	if err != nil {
		t.Fatal(err)
	}
	shared, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindAccel, Mode: api.ModeShared, Role: "sha256"})
	if err != nil {
		t.Fatal(err)
	}
	runtime := t.TempDir()
	// Fill the composed lease through `rialto attach`.
	uri, done := attached(t, c, runtime, blk.ID)
	data := make([]byte, 4<<20)
	for i := range data {
		data[i] = byte(i*7 + i>>12)
	}
	nc, err := nbd.DialURI(ctx, uri)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nc.WriteAtContext(ctx, data, 0, true); err != nil {
		t.Fatal(err)
	}
	nc.Close()
	if _, errs, code := runIn(t, c, runtime, "detach", blk.ID); code != 0 {
		t.Fatalf("detach: %s", errs)
	}
	<-done

	const off, n = 65536 + 100, 1<<20 + 5
	want := sha256.Sum256(data[off : off+n])
	rng := blk.ID + ":" + "65636:1048581"
	for _, extra := range [][]string{nil, {"--relay"}, {"--relay", "--relay-chunk", "2MiB"}} {
		o, errs, code := runIn(t, c, runtime, append([]string{"accel", "run", sha.ID, "sha256", "--input-lease", rng, "--hex"}, extra...)...)
		if code != 0 || strings.TrimSpace(o) != hex.EncodeToString(want[:]) {
			t.Fatalf("%v: exit %d, %q, %s; want %x", extra, code, o, errs, want)
		}
	}
	for i, extra := range [][]string{nil, {"--relay"}} {
		at := int64(4096 * (i + 1))
		o, errs, code := runIn(t, c, runtime, append([]string{"accel", "run", sha.ID, "sha256", "--input-lease", rng,
			"--output-lease", out.ID + ":" + itoa(at), "-o", "json"}, extra...)...)
		var res accelRunOut
		if code != 0 || json.Unmarshal([]byte(o), &res) != nil {
			t.Fatalf("%v: exit %d, %s %s", extra, code, o, errs)
		}
		wantPath := "direct"
		if extra != nil {
			wantPath = "relay"
		}
		if res.Path != wantPath || res.InputLease != blk.ID || res.InputOffset != off || res.Input != n ||
			res.OutputLease != out.ID || res.OutputOffset != at || res.Bytes != 32 || len(res.Output) != 0 {
			t.Errorf("%v: %+v", extra, res)
		}
		// The phases add up to the data path's time.
		if res.InputSeconds <= 0 || res.TaskSeconds <= 0 || res.InputSeconds+res.TaskSeconds > res.Seconds+1e-9 {
			t.Errorf("%v: input %v s + task %v s, want positive and within %v s", extra, res.InputSeconds, res.TaskSeconds, res.Seconds)
		}
		got := make([]byte, 32)
		nc, err := nbd.DialURI(ctx, out.URI)
		if err != nil {
			t.Fatal(err)
		}
		_, err = nc.ReadAtContext(ctx, got, at)
		nc.Close()
		if err != nil || !bytes.Equal(got, want[:]) {
			t.Fatalf("%v: the output lease holds %x (%v), want %x", extra, got, err, want)
		}
	}
	// INPUT bytes in, output to a lease.
	if o, errs, code := runIn(t, c, runtime, "accel", "run", sha.ID, "sha256", "--data", "abc", "--output-lease", out.ID+":0"); code != 0 ||
		!strings.Contains(o, "32 bytes of sha256:sum output stored in lease "+out.ID+" at offset 0 (direct path") {
		t.Fatalf("literal in, lease out: %d %q %s", code, o, errs)
	}

	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{sha.ID, "sha256", "--data", "x", "--input-lease", rng}, 2, "give one of INPUT, --data and --input-lease"},
		{[]string{sha.ID, "sha256", "--input-lease", blk.ID + ":0"}, 1, "want LEASE:OFF:LEN"},
		{[]string{sha.ID, "sha256", "--input-lease", blk.ID + ":4MiB:1"}, 1, "outside lease " + blk.ID},
		{[]string{sha.ID, "sha256", "--input-lease", sha.ID + ":0:1"}, 1, "--input-lease needs a block lease"},
		{[]string{sha.ID, "sha256", "--input-lease", blk.ID + ":0:3MiB"}, 1, "leaves no room for the output in the slot's 2MiB of memory"},
		{[]string{sha.ID, "sha256", "--input-lease", rng, "--output-lease", out.ID + ":1MiB"}, 1, "is the end of lease"},
		{[]string{sha.ID, "sha256", "--input-lease", rng, "--output-lease", out.ID + ":0", "--hex"}, 2, "--out and --hex do not apply"},
		{[]string{sha.ID, "sha256", "--input-lease", rng, "--relay-chunk", "1MiB"}, 2, "--relay-chunk needs --relay"},
		{[]string{shared.ID, "sha256", "--input-lease", rng}, 1, "is shared: --input-lease and --output-lease need a dedicated lease's slot"},
		// The output buffer ends where the output lease does.
		{[]string{sha.ID, "sha256", "--input-lease", rng, "--output-lease", out.ID + ":" + itoa(1<<20-16)}, 1, "output buffer too small"},
	} {
		_, errs, code := runIn(t, c, runtime, append([]string{"accel", "run"}, tc.args...)...)
		if code != tc.code || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, %q; want %d and %q", tc.args, code, errs, tc.code, tc.want)
		}
		for _, p := range blk.Parts {
			if strings.Contains(errs, p.URI[strings.LastIndex(p.URI, "/")+1:]) {
				t.Errorf("%v: the error shows a part's export name", tc.args)
			}
		}
	}
}

// TestAttachAccelLease: `rialto attach` of an accelerator lease names the
// kinds attach serves and the verb that uses the lease; it named block and
// memory only (attach serves nic leases too) and no way forward.
func TestAttachAccelLease(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Nodes: 1, Devices: []agent.DeviceConfig{
		{Name: "accel0", Kind: api.KindAccel, Size: 1},
	}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sha, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindAccel, Role: "sha256"})
	if err != nil {
		t.Fatal(err)
	}
	_, errs, code := runIn(t, c, t.TempDir(), "attach", sha.ID)
	if want := "lease " + sha.ID + " is an accel lease; attach serves block, memory and nic leases: run an accelerator lease's role with `rialto accel run " + sha.ID + " ROLE INPUT`"; code != 1 || !strings.Contains(errs, want) {
		t.Errorf("attach of an accel lease: exit %d, %q; want 1 and %q", code, errs, want)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestAccelRunLostLeaseSaysWhy: a task whose connection breaks because
// its lease ended (its lender node removed with --force, which tears the
// lease down) fails saying the lease is lost and why, before the
// connection's own error; it said only "sha256:sum: accel: connection
// closed: EOF". The connection is the one accel run holds (dialled as it
// dials, borrower.DialAccel), its call made once the removal tore the
// lease down: no role of a test cluster holds a task open long enough
// for the removal to come while `rialto accel run` waits.
func TestAccelRunLostLeaseSaysWhy(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Nodes: 1, Devices: []agent.DeviceConfig{
		{Name: "accel0", Kind: api.KindAccel, Size: 1},
	}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl := c.Client()
	l, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindAccel, Role: "sha256"})
	if err != nil {
		t.Fatal(err)
	}
	slots, err := borrower.AccelSlots(l)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := borrower.DialAccel(ctx, slots[0], nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// A lease still active: the error as it is.
	if in := errors.New("some failure"); leaseEndedErr(ctx, cl, l.ID, in) != in {
		t.Errorf("the error of a task on an active lease became %q", leaseEndedErr(ctx, cl, l.ID, in))
	}
	if _, err := cl.RemoveNode(ctx, c.Nodes[0].ID(), true); err != nil {
		t.Fatal(err)
	}
	testcluster.Eventually(t, 30*time.Second, "the lender tears the lease down", func() bool {
		return !c.Nodes[0].Serves(l.ID)
	})
	_, cerr := conn.Call(ctx, "sum", []byte("hello"))
	if cerr == nil {
		t.Fatal("a call on a lost lease's connection succeeded")
	}
	err = leaseEndedErr(ctx, cl, l.ID, fmt.Errorf("sha256:sum: %w", cerr))
	if want := "lease " + l.ID + " is lost (lender node "; !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), "was removed") ||
		!strings.HasSuffix(err.Error(), cerr.Error()) {
		t.Errorf("accel run's error is %q, want it to begin with %q, say the lender was removed and end with the call's %q", err, want, cerr)
	}
}
