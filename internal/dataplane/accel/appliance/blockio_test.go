package appliance

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"github.com/rialto-project/rialto/internal/logtest"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/accel"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd/nbdtest"
)

func randomBackend(size int, seed uint64) *nbd.MemBackend {
	be := nbd.NewMemBackend(int64(size))
	rng := rand.New(rand.NewPCG(seed, 7))
	for i := range be.Bytes() {
		be.Bytes()[i] = byte(rng.Uint32())
	}
	return be
}

// striped is the composed volume's layout written out independently of the
// stripe package: volume byte x lives on part (x/U) mod N at offset
// ((x/U) div N)·U + x mod U.
type striped struct {
	parts []*nbd.MemBackend
	unit  int
}

func (s striped) read(t *testing.T, off, n int) []byte {
	t.Helper()
	out := make([]byte, 0, n)
	for n > 0 {
		u, k := off/s.unit, len(s.parts)
		piece := min(n, s.unit-off%s.unit)
		b := make([]byte, piece)
		if _, err := s.parts[u%k].ReadAt(b, int64((u/k)*s.unit+off%s.unit)); err != nil {
			t.Fatal(err)
		}
		out = append(out, b...)
		off, n = off+piece, n-piece
	}
	return out
}

// A slot loads a range of a composed block lease straight from its three
// lenders (each stripe from its own part), hashes it, and stores bytes of
// its memory to another range; what lands on the lenders follows the
// stripe layout, and the slot's counters say what it moved.
func TestLoadStoreComposed(t *testing.T) {
	const unit, partSize = 64 << 10, 1 << 20
	secrets := []string{"rlc_part0_secret", "rlc_part1_secret", "rlc_part2_secret"}
	var layout striped
	layout.unit = unit
	var uris []string
	for i, name := range secrets {
		be := randomBackend(partSize, uint64(i))
		layout.parts = append(layout.parts, be)
		uris = append(uris, nbdtest.Lender(t, name, be))
	}
	var logs logtest.Buffer
	a := start(t, Config{Slots: 1, SlotMemory: 4 << 20, Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	c := leaseSlot(t, a, 0, "sha256")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	src := accel.BlockRange{Parts: uris, StripeUnit: unit, Offset: 12345}
	const n = 3<<19 + 777 // 1.5 MiB and a bit: crosses many stripes and parts
	want := layout.read(t, 12345, n)

	if err := c.Load(ctx, 4096, n, src); err != nil {
		t.Fatal(err)
	}
	got, err := c.ReadMem(ctx, 4096, n)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("slot memory after LOAD differs from the lease's bytes (%v)", err)
	}

	sum := sha256.Sum256(want)
	k, out, err := c.RunBlockTask(ctx, accel.BlockTask{Entry: "sum", Input: src, InLen: n})
	if err != nil || k != 32 || !bytes.Equal(out, sum[:]) {
		t.Fatalf("sha256 of the range: %x (%d bytes, %v), want %x", out, k, err, sum)
	}

	// STORE: a pattern from slot memory to a range that starts mid-stripe.
	pattern := bytes.Repeat([]byte("devices reading devices "), 5000)[:100<<10]
	if err := c.WriteMem(ctx, 0, pattern); err != nil {
		t.Fatal(err)
	}
	dst := accel.BlockRange{Parts: uris, StripeUnit: unit, Offset: 3*unit - 1000}
	if err := c.Store(ctx, 0, uint32(len(pattern)), dst); err != nil {
		t.Fatal(err)
	}
	if got := layout.read(t, 3*unit-1000, len(pattern)); !bytes.Equal(got, pattern) {
		t.Fatal("the lenders do not hold the stored bytes at the striped offsets")
	}
	// The output of a task goes to a block range too (the input range
	// now holds part of the pattern).
	sum = sha256.Sum256(layout.read(t, 12345, n))
	outRange := accel.BlockRange{Parts: uris, StripeUnit: unit, Offset: 2 << 20}
	if k, _, err := c.RunBlockTask(ctx, accel.BlockTask{Entry: "sum", Input: src, InLen: n, Output: &outRange}); err != nil || k != 32 {
		t.Fatalf("task to a block range: %d bytes, %v", k, err)
	}
	if got := layout.read(t, 2<<20, 32); !bytes.Equal(got, sum[:]) {
		t.Fatalf("the output range holds %x, want %x", got, sum)
	}
	st, _ := a.Slot(0)
	if st.BlockIn != 3*n || st.BlockOut != uint64(len(pattern))+32 {
		t.Errorf("block counters in %d out %d, want %d and %d", st.BlockIn, st.BlockOut, 3*n, len(pattern)+32)
	}
	for _, s := range secrets {
		if strings.Contains(logs.String(), s) {
			t.Fatalf("the appliance logged a part's export name:\n%s", logs.String())
		}
	}
	if !strings.Contains(logs.String(), "loaded from a block lease") {
		t.Errorf("no debug line for the loads:\n%s", logs.String())
	}
}

// Requests outside what the borrower gave, or that cannot be served, fail
// with the wire code that says why, leave slot memory as it was, and never
// quote a credential.
func TestBlockIOLimits(t *testing.T) {
	const secret = "rlc_the_only_export"
	uri := nbdtest.Lender(t, secret, randomBackend(1<<20, 9))
	a := start(t, Config{Slots: 1, SlotMemory: 1 << 20})
	c := leaseSlot(t, a, 0, "sha256")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	marker := bytes.Repeat([]byte{0x5a}, 4096)
	if err := c.WriteMem(ctx, 0, marker); err != nil {
		t.Fatal(err)
	}
	host := strings.SplitN(uri, "/", 4)[2] // HOST:PORT
	for _, tc := range []struct {
		name string
		do   func() error
		want error
	}{
		{"range past the volume's end", func() error {
			return c.Load(ctx, 0, 4096, accel.BlockRange{Parts: []string{uri}, Offset: 1<<20 - 4095})
		}, accel.ErrOutOfRange},
		{"range offset beyond the volume", func() error {
			return c.Load(ctx, 0, 1, accel.BlockRange{Parts: []string{uri}, Offset: 1 << 40})
		}, accel.ErrOutOfRange},
		{"slot memory past its end", func() error {
			return c.Load(ctx, 1<<20-10, 4096, accel.BlockRange{Parts: []string{uri}})
		}, accel.ErrOutOfRange},
		{"store past the volume's end", func() error {
			return c.Store(ctx, 0, 4096, accel.BlockRange{Parts: []string{uri}, Offset: 1<<20 - 1})
		}, accel.ErrOutOfRange},
		{"wrong export name", func() error {
			return c.Load(ctx, 0, 16, accel.BlockRange{Parts: []string{"nbd://" + host + "/rlc_guessed"}})
		}, accel.ErrBlockIO},
		{"a Unix socket", func() error {
			return c.Load(ctx, 0, 16, accel.BlockRange{Parts: []string{"nbd+unix:///" + secret + "?socket=/run/x.sock"}})
		}, accel.ErrBlockIO},
		{"not an NBD URI", func() error {
			return c.Load(ctx, 0, 16, accel.BlockRange{Parts: []string{"http://" + host + "/" + secret}})
		}, accel.ErrBlockIO},
		{"composed without a valid stripe unit", func() error {
			return c.Load(ctx, 0, 16, accel.BlockRange{Parts: []string{uri, uri}, StripeUnit: 1000})
		}, accel.ErrBlockIO},
		{"no parts", func() error { return c.Load(ctx, 0, 16, accel.BlockRange{}) }, accel.ErrFrame},
	} {
		err := tc.do()
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), secret) {
			t.Errorf("%s: the error quotes the export name: %v", tc.name, err)
		}
	}
	if got, err := c.ReadMem(ctx, 0, 4096); err != nil || !bytes.Equal(got, marker) {
		t.Fatalf("a refused request changed slot memory (%v)", err)
	}
	if err := c.Ping(ctx); err != nil {
		t.Fatalf("the connection did not survive the refusals: %v", err)
	}
}

// The dialling policy: TCP parts only, loopback only for an appliance on
// loopback, the address dialled is the one checked.
func TestPartPolicy(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		host string
		uri  nbd.URI
		ok   bool
		want string
	}{
		{"127.0.0.1", nbd.URI{Network: "tcp", Address: "127.0.0.1:10809", Export: "x"}, true, "127.0.0.1:10809"},
		{"localhost", nbd.URI{Network: "tcp", Address: "localhost:10809", Export: "x"}, true, ""},
		{"10.0.0.2", nbd.URI{Network: "tcp", Address: "10.0.0.3:10809", Export: "x"}, true, "10.0.0.3:10809"},
		{"10.0.0.2", nbd.URI{Network: "tcp", Address: "[::ffff:10.0.0.3]:10809", Export: "x"}, true, "10.0.0.3:10809"},
		{"10.0.0.2", nbd.URI{Network: "tcp", Address: "127.0.0.1:10809", Export: "x"}, false, ""},
		{"10.0.0.2", nbd.URI{Network: "tcp", Address: "[::1]:10809", Export: "x"}, false, ""},
		{"10.0.0.2", nbd.URI{Network: "tcp", Address: "0.0.0.0:10809", Export: "x"}, false, ""},
		{"10.0.0.2", nbd.URI{Network: "tcp", Address: "localhost:10809", Export: "x"}, false, ""},
		{"127.0.0.1", nbd.URI{Network: "unix", Address: "/run/s.sock", Export: "x"}, false, ""},
		{"10.0.0.2", nbd.URI{Network: "tcp", Address: "no-port", Export: "x"}, false, ""},
	} {
		u, err := partPolicy(tc.host)(ctx, 0, tc.uri)
		if (err == nil) != tc.ok {
			t.Errorf("appliance on %s, part %s %s: %v, want ok=%v", tc.host, tc.uri.Network, tc.uri.Address, err, tc.ok)
			continue
		}
		if err != nil && !errors.Is(err, errBlockRefused) {
			t.Errorf("%s: %v is not a refusal", tc.uri.Address, err)
		}
		if tc.ok && tc.want != "" && u.Address != tc.want {
			t.Errorf("%s dialled at %s, want %s", tc.uri.Address, u.Address, tc.want)
		}
		if tc.ok && u.Export != tc.uri.Export {
			t.Errorf("the export changed")
		}
	}
}

// stallBackend blocks reads until its channel is closed.
type stallBackend struct {
	*nbd.MemBackend
	entered chan struct{}
	once    sync.Once
	release chan struct{}
}

func (b *stallBackend) ReadAt(p []byte, off int64) (int, error) {
	b.once.Do(func() { close(b.entered) })
	<-b.release
	return b.MemBackend.ReadAt(p, off)
}

// Ending the lease interrupts a LOAD waiting on a lender: SetCredential
// returns, the borrower's call fails, nothing is left running.
func TestLeaseEndInterruptsLoad(t *testing.T) {
	be := &stallBackend{MemBackend: nbd.NewMemBackend(1 << 20), entered: make(chan struct{}), release: make(chan struct{})}
	uri := nbdtest.Lender(t, "rlc_stalled", be)
	t.Cleanup(func() { close(be.release) })
	a := start(t, Config{Slots: 1, SlotMemory: 1 << 20})
	c := leaseSlot(t, a, 0, "sha256")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- c.Load(ctx, 0, 1<<20, accel.BlockRange{Parts: []string{uri}}) }()
	select {
	case <-be.entered:
	case err := <-errc:
		t.Fatalf("load ended before reaching the lender: %v", err)
	}
	ended := make(chan error, 1)
	go func() { ended <- a.SetCredential(0, nil) }()
	select {
	case err := <-ended:
		if err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("SetCredential waited for the stalled lender")
	}
	if err := <-errc; err == nil {
		t.Fatal("the interrupted load succeeded")
	}
}

// A LOAD into a streaming role (sha256) hashes the windows as they land;
// the task that follows on exactly that range gets that output, and any
// write to slot memory, another range or another role's entry in between
// makes the task compute from memory again. Every case checks the output
// against Go's sha256 of what slot memory holds, so a stale streamed
// output fails.
func TestStreamedLoad(t *testing.T) {
	const n = 2*blockWindow + 12345 // three windows, in flight together
	be := randomBackend(9<<20, 11)
	uri := nbdtest.Lender(t, "rlc_stream_secret", be)
	cases := []struct {
		name     string
		between  func(ctx context.Context, c *accel.Conn) error // after the LOAD, before the task
		in       uint64
		inLen    uint32
		streamed bool
	}{
		{name: "same range", in: 64, inLen: n, streamed: true},
		{name: "write inside the range", in: 64, inLen: n, between: func(ctx context.Context, c *accel.Conn) error {
			return c.WriteMem(ctx, 64+blockWindow+5, []byte("changed"))
		}},
		{name: "write elsewhere", in: 64, inLen: n, between: func(ctx context.Context, c *accel.Conn) error {
			return c.WriteMem(ctx, 0, []byte("x"))
		}},
		{name: "sub-range", in: 64 + 100, inLen: n - 200},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var logs logtest.Buffer
			a := start(t, Config{Slots: 1, SlotMemory: 16 << 20, Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
			c := leaseSlot(t, a, 0, "sha256")
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := c.Load(ctx, 64, n, accel.BlockRange{Parts: []string{uri}, Offset: 4096}); err != nil {
				t.Fatal(err)
			}
			if tc.between != nil {
				if err := tc.between(ctx, c); err != nil {
					t.Fatal(err)
				}
			}
			mem, err := c.ReadMem(ctx, tc.in, tc.inLen)
			if err != nil {
				t.Fatal(err)
			}
			if tc.between == nil && !bytes.Equal(mem, be.Bytes()[4096+tc.in-64:][:tc.inLen]) {
				t.Fatal("slot memory after the LOAD differs from the lease's bytes")
			}
			want := sha256.Sum256(mem)
			task, err := c.Start(ctx, accel.TaskSpec{Entry: "sum", In: tc.in, InLen: tc.inLen, Out: 15 << 20, OutCap: 32})
			if err != nil {
				t.Fatal(err)
			}
			if k, err := task.Wait(ctx); err != nil || k != 32 {
				t.Fatalf("task: %d bytes, %v", k, err)
			}
			got, err := c.ReadMem(ctx, 15<<20, 32)
			if err != nil || !bytes.Equal(got, want[:]) {
				t.Fatalf("output %x (%v), want sha256 of slot memory %x", got, err, want)
			}
			if s := logs.String(); strings.Contains(s, "streamed=true\n") != tc.streamed || !strings.Contains(s, "ran a task") {
				t.Errorf("streamed task: want %v:\n%s", tc.streamed, s)
			}
			if st, _ := a.Slot(0); st.Tasks != 1 {
				t.Errorf("slot counts %d tasks, want 1", st.Tasks)
			}
		})
	}
}
