package mapping

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/memory/client"
	"github.com/rialto-project/rialto/internal/dataplane/memory/memorytest"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

// The mapping's bytes are touched with plain loops below, not copy or
// bytes.Equal: a goroutine blocked on a fault inside runtime code cannot
// be preempted, and these donors run in this process (Move needs them).

// stamp writes page p of b with gen, word by word.
func stamp(b []byte, p int, gen uint64) {
	for i := p * 4096; i < (p+1)*4096; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], uint64(p)<<32|gen)
	}
}

// stamped returns the generation page p of b holds (every word checked:
// -1 if they differ).
func stamped(b []byte, p int) int64 {
	first := binary.LittleEndian.Uint64(b[p*4096:])
	for i := p * 4096; i < (p+1)*4096; i += 8 {
		if binary.LittleEndian.Uint64(b[i:]) != first || first>>32 != uint64(p) {
			return -1
		}
	}
	return int64(first & 0xffffffff)
}

// relocation is the control plane's record of where the region is.
type relocation struct {
	mu         sync.Mutex
	addr, cred string
}

func (r *relocation) set(addr, cred string) {
	r.mu.Lock()
	r.addr, r.cred = addr, cred
	r.mu.Unlock()
}

func (r *relocation) relocate(context.Context) (string, string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.addr, r.cred, nil
}

// TestMappingFollowsMove: a mapping on a following session stays open
// across a move of its region: a program writing it while the region
// moves (its write-backs held, then answered GONE) sees no fault fail,
// every page reads what was last written, the dirty pages cached at the
// switch are written back at the new place, and the handler took a new
// connection without the mapping being opened again.
func TestMappingFollowsMove(t *testing.T) { testMappingFollowsMove(t, false) }

// TestMappingFollowsMoveOverTLS is TestMappingFollowsMove with donors
// that require TLS, each with a key of its own: the program's session
// verifies the new donor's certificate against the CA, and the fault
// handler runs its new TLS session from a handoff pinning that donor's
// key (not the old one's).
func TestMappingFollowsMoveOverTLS(t *testing.T) { testMappingFollowsMove(t, true) }

func testMappingFollowsMove(t *testing.T, overTLS bool) {
	const size, pages = 2 << 20, (2 << 20) / 4096
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var from, to *memorytest.Donor
	opts := client.Options{Timeout: 10 * time.Second}
	if overTLS {
		ca := memorytest.NewCA(t)
		fromTLS, toTLS := memorytest.ServerTLS(t, ca), memorytest.ServerTLS(t, ca)
		if bytes.Equal(publicKey(t, fromTLS), publicKey(t, toTLS)) {
			t.Fatal("the two donors share a key: the test could not tell a pinned old key from the new one")
		}
		from = memorytest.StartTLS(t, fromTLS, size, 0)
		to = memorytest.StartTLS(t, toTLS, 4096, 0)
		opts.TLS = memorytest.ClientTLS(t, ca)
		to.ClientTLS = opts.TLS
	} else {
		from = memorytest.Start(t, size, 0)
		to = memorytest.Start(t, 4096, 0)
	}
	r := &relocation{addr: from.Addr, cred: memorytest.Credential}
	f, err := client.DialFollowing(ctx, from.Addr, memorytest.Credential, opts,
		client.FollowConfig{Relocate: r.relocate})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := Map(ctx, f, Options{CacheBytes: 64 * 4096})
	if err != nil {
		if errorsIsUffd(err) {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	b := m.Bytes()
	model := make([]uint64, pages)
	for p := range pages {
		stamp(b, p, 1)
		model[p] = 1
	}
	// A writer goes on stamping pages while the region moves.
	var stop atomic.Bool
	var written atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for gen := uint64(2); !stop.Load(); gen++ {
			for p := 0; p < pages && !stop.Load(); p += 7 {
				stamp(b, p, gen)
				model[p] = gen
				written.Add(1)
			}
		}
	}()
	for written.Load() < 200 {
		select {
		case <-ctx.Done():
			t.Fatal("the writer does not write")
		case <-time.After(time.Millisecond):
		}
	}
	if err := memorytest.Move(ctx, from, to, "moved-cred", func() { r.set(to.Addr, "moved-cred") }); err != nil {
		t.Fatal(err)
	}
	for base := written.Load(); written.Load() < base+400; {
		select {
		case <-ctx.Done():
			t.Fatalf("the writer stalled after the move: %v", m.Err())
		case <-time.After(time.Millisecond):
		}
	}
	stop.Store(true)
	<-done
	for p := range pages {
		if got := stamped(b, p); got != int64(model[p]) {
			t.Fatalf("page %d holds generation %d, want %d (%v)", p, got, model[p], m.Err())
		}
	}
	if err := m.Flush(); err != nil {
		t.Fatalf("flush after the move: %v", err)
	}
	st := m.Stats()
	if st.Follows == 0 || f.Moves() != 1 || m.Err() != nil {
		t.Fatalf("follows %d, session moves %d, err %v", st.Follows, f.Moves(), m.Err())
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	// The new place has every page, as the mapping left it.
	got := make([]byte, size)
	if err := f.Read(ctx, client.ChannelBulk, got, 0); err != nil {
		t.Fatal(err)
	}
	for p := range pages {
		if g := stamped(got, p); g != int64(model[p]) {
			t.Fatalf("the new place's page %d holds generation %d, want %d", p, g, model[p])
		}
	}
	t.Logf("%d pages written across the move; %d new connection(s), %d write-backs", written.Load(), st.Follows, st.WriteBacks)
}

// TestMappingNewConnectionEndsGivenUpOne: a write-back whose answer does
// not come in time (the rest of its payload late on its way: a relay
// holds it) makes the fault handler take a new connection of the
// session (the region did not move) and send the page again there. A
// newer write-back of the page is acknowledged on the new connection;
// then the late rest of the first one reaches the donor. The donor must
// keep the newer bytes: the new connection named the one it replaces,
// which the donor ended before it answered. The new connection named
// none, and the late rest landed over the newer write-back (the page
// read back after its eviction would have been stale).
func TestMappingNewConnectionEndsGivenUpOne(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	td := memorytest.Start(t, 1<<20, 0)
	relay := memorytest.StartRelay(t, td.Addr)
	r := &relocation{addr: td.Addr, cred: memorytest.Credential}
	f, err := client.DialFollowing(ctx, td.Addr, memorytest.Credential,
		client.Options{Dialer: relay.Dial, Timeout: time.Second}, client.FollowConfig{Relocate: r.relocate})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := Map(ctx, f, Options{CacheBytes: 64 * 4096})
	if err != nil {
		if errorsIsUffd(err) {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	defer m.Close()
	b := m.Bytes()
	stamp(b, 0, 1) // cached, dirty
	faults := relay.Dials()[protocol.KindFault]
	stalled, release, landed := relay.ArmHeld(protocol.KindFault)
	// The write-back stalls, times out, and goes again on a new
	// connection.
	if err := m.Flush(); err != nil {
		t.Fatalf("flush: %v", err)
	}
	<-stalled
	if st := m.Stats(); st.Follows != 1 || relay.Dials()[protocol.KindFault] != faults+1 {
		t.Fatalf("follows %d, fault connections %d, then %d", st.Follows, faults, relay.Dials()[protocol.KindFault])
	}
	stamp(b, 0, 2)
	if err := m.Flush(); err != nil {
		t.Fatalf("flush: %v", err)
	}
	// The rest of the first write-back arrives late.
	close(release)
	select {
	case <-landed:
	case <-ctx.Done():
		t.Fatal("the given-up connection did not end")
	}
	got := make([]byte, 4096)
	if _, err := td.D.ReadRegion(memorytest.Credential, got, 0); err != nil {
		t.Fatal(err)
	}
	if g := stamped(got, 0); g != 2 {
		t.Fatalf("the donor's page holds generation %d (-1: mixed), want 2: the given-up write-back landed over the newer one", g)
	}
	if err := m.Err(); err != nil {
		t.Fatal(err)
	}
}

// TestMappingOverTLSRefusesUntrustedNewPlace: over TLS, the region's new
// place must present a certificate of the cluster CA. A move to a donor
// whose certificate another CA issued is not followed: the program's
// session refuses the donor's certificate, the handler gets no connection,
// the write-back that found the region gone fails (Flush and Err say
// why) and the mapping ends.
func TestMappingOverTLSRefusesUntrustedNewPlace(t *testing.T) {
	const size = 1 << 20
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ca, other := memorytest.NewCA(t), memorytest.NewCA(t)
	from := memorytest.StartTLS(t, memorytest.ServerTLS(t, ca), size, 0)
	to := memorytest.StartTLS(t, memorytest.ServerTLS(t, other), 4096, 0)
	to.ClientTLS = memorytest.ClientTLS(t, other) // the move itself trusts it
	opts := client.Options{Timeout: 5 * time.Second, TLS: memorytest.ClientTLS(t, ca)}
	r := &relocation{addr: from.Addr, cred: memorytest.Credential}
	f, err := client.DialFollowing(ctx, from.Addr, memorytest.Credential, opts,
		client.FollowConfig{Relocate: r.relocate, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := Map(ctx, f, Options{CacheBytes: 64 * 4096})
	if err != nil {
		if errorsIsUffd(err) {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	defer m.Close()
	b := m.Bytes()
	for p := range 8 {
		stamp(b, p, 1) // dirty pages in the cache, not written back yet
	}
	if err := memorytest.Move(ctx, from, to, "moved-cred", func() { r.set(to.Addr, "moved-cred") }); err != nil {
		t.Fatal(err)
	}
	err = m.Flush()
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("flush after a move to an untrusted donor: %v, want a refused certificate", err)
	}
	if merr := m.Err(); !errors.Is(merr, ErrMappingFailed) {
		t.Fatalf("the mapping after the refused follow: %v", merr)
	}
	if st := m.Stats(); st.Follows != 0 {
		t.Fatalf("the handler took %d connection(s) to the untrusted donor", st.Follows)
	}
}

// publicKey is the public key (SubjectPublicKeyInfo) of cfg's certificate.
func publicKey(t *testing.T, cfg *tls.Config) []byte {
	t.Helper()
	cert, err := cfg.GetCertificate(&tls.ClientHelloInfo{})
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return leaf.RawSubjectPublicKeyInfo
}

func errorsIsUffd(err error) bool { return errors.Is(err, ErrUffdUnavailable) }
