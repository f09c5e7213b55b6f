package testcluster

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
)

// cutLink is a TCP relay in front of a destination's export that forwards
// the first limit bytes its clients send and then cuts every connection
// (and refuses new ones): the network between the source of a move and
// its destination failing in the middle of the copy. With hold, it stops
// forwarding there instead (closes reached) and cuts only once the
// destination closes its side: the destination killed in the middle of
// the copy. It listens on the destination's host, which the
// destination's node certificate names: the source's TLS handshake
// through it verifies that certificate.
type cutLink struct {
	ln      net.Listener
	target  string
	limit   int64
	hold    bool
	reached chan struct{}

	mu        sync.Mutex
	sent      int64
	conns     []net.Conn
	cut       chan struct{} // closed once cut
	once      sync.Once
	reachOnce sync.Once
	wg        sync.WaitGroup
}

func newCutLink(t *testing.T, target string, limit int64, hold bool) *cutLink {
	host, _, err := net.SplitHostPort(target)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	l := &cutLink{ln: ln, target: target, limit: limit, hold: hold, reached: make(chan struct{}), cut: make(chan struct{})}
	l.wg.Go(l.accept)
	t.Cleanup(func() { l.doCut(); l.wg.Wait() })
	return l
}

func (l *cutLink) accept() {
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", l.target)
		if err != nil {
			c.Close()
			continue
		}
		l.mu.Lock()
		l.conns = append(l.conns, c, s)
		l.mu.Unlock()
		l.wg.Go(func() {
			io.Copy(c, s)
			l.doCut() // the destination closed its side
		})
		l.wg.Go(func() { l.forward(s, c) })
	}
}

// forward copies the client's bytes to the server until limit bytes in
// all were sent, then cuts.
func (l *cutLink) forward(dst, src net.Conn) {
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			l.mu.Lock()
			room := l.limit - l.sent
			k := min(int64(n), max(room, 0))
			l.sent += k
			l.mu.Unlock()
			if k > 0 {
				if _, werr := dst.Write(buf[:k]); werr != nil {
					return
				}
			}
			if k < int64(n) {
				if l.hold {
					l.reachOnce.Do(func() { close(l.reached) })
					io.Copy(io.Discard, src) // until cut
				} else {
					l.doCut()
				}
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (l *cutLink) doCut() {
	l.once.Do(func() {
		l.ln.Close()
		l.mu.Lock()
		for _, c := range l.conns {
			c.Close()
		}
		l.mu.Unlock()
		close(l.cut)
	})
}

// cuttingDriver is the block driver whose received transfers are reached
// through a cutLink (one per transfer, made by link): the URI the source
// is given names the relay's address instead of the export's.
type cuttingDriver struct {
	*agent.BlockDriver
	link func(target string) *cutLink
}

func (d cuttingDriver) ReceiveMove(ctx context.Context, e agent.Export, token string) (string, error) {
	uri, err := d.BlockDriver.ReceiveMove(ctx, e, token)
	if err != nil {
		return "", err
	}
	return relayed(uri, d.link)
}

// cuttingMemoryDriver is cuttingDriver's memory driver.
type cuttingMemoryDriver struct {
	*agent.MemoryDriver
	link func(target string) *cutLink
}

func (d cuttingMemoryDriver) ReceiveMove(ctx context.Context, e agent.Export, token string) (string, error) {
	uri, err := d.MemoryDriver.ReceiveMove(ctx, e, token)
	if err != nil {
		return "", err
	}
	return relayed(uri, d.link)
}

// relayed is a received transfer's uri with the address of the cutLink
// link makes in front of the one it names.
func relayed(uri string, link func(target string) *cutLink) (string, error) {
	u, err := url.Parse(uri)
	if err != nil {
		return "", err
	}
	u.Host = link(u.Host).ln.Addr().String()
	return u.String(), nil
}

// TestMoveCutMidCopy: the connection from a block part's source to the
// destination of its move is cut after 4 MiB of a 16 MiB copy. The move
// fails cleanly and says so in plain words, naming both lenders and no
// URI or token; the part stays on its source, where the borrower, writing
// through the move, lost no write and finds every block as last written;
// the destination wiped what it received: the next lease of its range
// reads zeroes.
func TestMoveCutMidCopy(t *testing.T) {
	t.Parallel()
	moveBrokenMidCopy(t, false)
}

// TestMoveDestinationKilledMidCopy: the destination of a block part's
// move is killed after 4 MiB of a 16 MiB copy reached it. The move fails
// cleanly, naming both lenders and no URI; the part stays on its source,
// no acknowledged write lost; restarted, the destination wipes what it
// received before its range is lent again.
func TestMoveDestinationKilledMidCopy(t *testing.T) {
	t.Parallel()
	moveBrokenMidCopy(t, true)
}

// moveBrokenMidCopy is TestMoveCutMidCopy, or with kill
// TestMoveDestinationKilledMidCopy.
func moveBrokenMidCopy(t *testing.T, kill bool) {
	const size = 16 << 20
	var mu sync.Mutex
	var links []*cutLink
	c := Start(t, Options{Nodes: 2, Devices: []agent.DeviceConfig{{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: size}},
		Configure: func(i int, cfg *agent.Config) {
			cfg.Drivers = map[api.Kind]agent.Driver{api.KindBlock: cuttingDriver{BlockDriver: agent.NewBlockDriver(slog.New(slog.DiscardHandler)),
				link: func(target string) *cutLink {
					l := newCutLink(t, target, 4<<20, kill)
					mu.Lock()
					links = append(links, l)
					mu.Unlock()
					return l
				}}}
		}})
	ctx := ctxT(t)
	cl := c.Client()
	l, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeDedicated, Size: size})
	if err != nil {
		t.Fatal(err)
	}
	src := c.NodeByID(l.Parts[0].NodeID)
	var dst *Node
	for _, n := range c.Nodes {
		if n != src {
			dst = n
		}
	}
	// Every block written once (the copy has 16 MiB to send), then the
	// borrower goes on writing through the move.
	fill, err := nbd.DialURI(ctx, l.Parts[0].URI)
	if err != nil {
		t.Fatal(err)
	}
	batch := make([]byte, 0, 1<<20)
	for b := int64(0); b < size/4096; b++ {
		batch = append(batch, stampBlock(b, 0)...)
		if len(batch) == cap(batch) {
			if _, err := fill.WriteAt(batch, (b+1)*4096-int64(len(batch))); err != nil {
				t.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	fill.Close()
	w := attachWriter(ctx, t, cl, l, size, nil)
	w.mu.Lock()
	for b := range int64(size / 4096) {
		if _, ok := w.model[b]; !ok { // no write of its own completed yet
			w.model[b] = 0
		}
	}
	w.mu.Unlock()

	ms, err := cl.MoveLease(ctx, l.ID, api.MoveRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 1 || ms[0].To.NodeID != dst.ID() {
		t.Fatalf("moves %+v, want one to %s", ms, dst.Name)
	}
	if kill {
		var link *cutLink
		Eventually(t, 60*time.Second, "the transfer to reach its destination", func() bool {
			mu.Lock()
			defer mu.Unlock()
			if len(links) > 0 {
				link = links[0]
			}
			return link != nil
		})
		<-link.reached
		dst.Kill()
	}
	m := waitMoves(t, c, l.ID, 1)[0]
	mu.Lock()
	if len(links) != 1 {
		t.Fatalf("%d transfers received", len(links))
	}
	link := links[0]
	mu.Unlock()
	select {
	case <-link.cut:
	default:
		t.Fatal("the move ended before its connection was cut")
	}
	if m.State != api.MoveFailed {
		t.Fatalf("move %s is %s (%q), want failed", m.ID, m.State, m.Error)
	}
	t.Logf("the failed move says: %q", m.Error)
	if !strings.Contains(m.Error, dst.Name) || !strings.Contains(m.Error, src.Name) {
		t.Errorf("the move's error %q does not name both lenders (%s, %s)", m.Error, src.Name, dst.Name)
	}
	// It says what happened (it read "the destination n2 did not take
	// the copy (n1's agent log says why)" for a killed destination).
	for _, bad := range []string{"nbd://", "nbds://", "127.0.0.1", "rmt", l.Credential, "x_", "did not take the copy", "log says why"} {
		if bad != "" && strings.Contains(m.Error, bad) {
			t.Errorf("the move's error %q names %q", m.Error, bad)
		}
	}

	// The part stays on its source, served, every acknowledged write in.
	w.finish(t)
	got := c.Lease(l.ID)
	if got.State != api.LeaseActive || got.Parts[0].NodeID != src.ID() || got.Parts[0].URI != l.Parts[0].URI {
		t.Fatalf("after the failed move the lease is %s on %s (%v)", got.State, got.Parts[0].NodeID, got.Parts[0].URI == l.Parts[0].URI)
	}

	// The destination's range, partly written by the copy, is wiped
	// before it is lent again (killed, once it is back).
	if kill {
		dst.Launch()
		dst.WaitReady()
	}
	var next api.Lease
	Eventually(t, 60*time.Second, "a lease of the destination's range", func() bool {
		c.Heartbeat()
		next, err = cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeDedicated, Size: size})
		return err == nil
	})
	if next.Parts[0].NodeID != dst.ID() {
		t.Fatalf("the next lease is on %s, want the destination %s", next.Parts[0].NodeID, dst.Name)
	}
	if k := leakedBlocks(ctx, t, next); k != 0 {
		t.Fatalf("the next tenant reads %d 4 KiB blocks the cut copy brought", k)
	}
}
