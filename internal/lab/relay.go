package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Hop is what a relay does to the bytes it forwards in each direction: it
// delays every byte by Delay (a delay line: bytes read at t are written at
// t+Delay, in order) and, with Rate > 0, paces them at Rate bytes/s (a link
// of that speed, whose queue is the relay's buffer). It stands in for a
// fabric hop — an NTB, a slow link — on a kernel without netem.
type Hop struct {
	Delay time.Duration
	Rate  float64
}

// RelayConfig describes a relay: connections accepted on loopback are
// forwarded to Target through Hop; Classify, when set, may pick another hop
// for a connection from the first Peek bytes the client sends (which are
// forwarded unchanged).
type RelayConfig struct {
	Target   string
	Hop      Hop
	Peek     int
	Classify func(first []byte) Hop
}

// Relay is a running relay. Close stops it and waits for its goroutines.
type Relay struct {
	cfg    RelayConfig
	ln     net.Listener
	cancel context.CancelFunc // ends the forwarding goroutines' context
	wg     sync.WaitGroup
	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]struct{}
}

// StartRelay listens on 127.0.0.1 and forwards to cfg.Target.
func StartRelay(ctx context.Context, cfg RelayConfig) (*Relay, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("lab: relay: %w", err)
	}
	r := &Relay{cfg: cfg, ln: ln, conns: map[net.Conn]struct{}{}}
	rctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	r.wg.Add(1)
	go r.accept(rctx)
	return r, nil
}

// Addr is the relay's address.
func (r *Relay) Addr() string { return r.ln.Addr().String() }

// Close stops accepting, closes every forwarded connection and waits.
func (r *Relay) Close() error {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.cancel()
	err := r.ln.Close()
	r.mu.Lock()
	for c := range r.conns {
		_ = c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
	return err
}

func (r *Relay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *Relay) accept(ctx context.Context) {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		if !r.track(c) {
			_ = c.Close()
			return
		}
		r.wg.Add(1)
		go r.serve(ctx, c)
	}
}

func (r *Relay) serve(ctx context.Context, c net.Conn) {
	defer r.wg.Done()
	defer c.Close()
	var d net.Dialer
	up, err := d.DialContext(ctx, "tcp", r.cfg.Target)
	if err != nil {
		return
	}
	defer up.Close()
	if !r.track(up) {
		return
	}
	hop := r.cfg.Hop
	var first []byte
	if r.cfg.Classify != nil && r.cfg.Peek > 0 {
		first = make([]byte, r.cfg.Peek)
		if _, err := io.ReadFull(c, first); err != nil {
			return
		}
		hop = r.cfg.Classify(first)
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); delayLine(ctx, up, c, hop, first); closeWrite(up) }()
	go func() { defer wg.Done(); delayLine(ctx, c, up, hop, nil); closeWrite(c) }()
	wg.Wait()
}

func closeWrite(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
}

type chunk struct {
	at time.Time
	b  []byte
}

// delayLine copies src to dst through hop, first writing prefix (already
// read from src). It returns when src ends or dst fails.
func delayLine(ctx context.Context, dst io.Writer, src io.Reader, hop Hop, prefix []byte) {
	size := 64 << 10
	if hop.Rate > 0 {
		// Pace in pieces of at most 1 ms of the link's time, so that the
		// link's speed shows at the time scale of a request.
		size = max(1500, min(size, int(hop.Rate/1000)))
	}
	q := make(chan chunk, 4096)
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Whatever ends the writer, the reader must not block on q: drain
		// it until the reader closes it (its source ends or is closed).
		defer func() {
			for range q {
			}
		}()
		var next time.Time // the paced link is busy until next
		timer := time.NewTimer(time.Hour)
		defer timer.Stop()
		wait := func(t time.Time) bool {
			d := time.Until(t)
			if d <= 0 {
				return true
			}
			timer.Reset(d)
			select {
			case <-timer.C:
				return true
			case <-ctx.Done():
				return false
			}
		}
		for c := range q {
			if hop.Rate > 0 {
				if now := time.Now(); next.Before(c.at) {
					next = c.at
				} else if next.Before(now.Add(-time.Second)) {
					next = now
				}
				next = next.Add(time.Duration(float64(len(c.b)) / hop.Rate * float64(time.Second)))
				// The bytes leave the link when it has sent them and
				// arrive Delay later.
				if !wait(next.Add(hop.Delay)) {
					return
				}
			} else if !wait(c.at.Add(hop.Delay)) {
				return
			}
			if _, err := dst.Write(c.b); err != nil {
				return
			}
		}
	}()
	send := func(b []byte) {
		for len(b) > 0 {
			n := min(len(b), size)
			q <- chunk{at: time.Now(), b: b[:n:n]}
			b = b[n:]
		}
	}
	if len(prefix) > 0 {
		send(prefix)
	}
	for {
		b := make([]byte, size)
		n, err := src.Read(b)
		if n > 0 {
			send(b[:n])
		}
		if err != nil {
			break
		}
	}
	close(q)
	<-done
}

// errRelay is returned when a relay chain cannot be built.
var errRelay = errors.New("lab: relay chain")

// Chain starts n relays in series in front of target, each applying hop,
// and returns the address of the first (target itself when n is 0) and a
// function that closes them all.
func Chain(ctx context.Context, target string, n int, hop Hop) (string, func(), error) {
	var relays []*Relay
	closeAll := func() {
		for i := len(relays) - 1; i >= 0; i-- {
			_ = relays[i].Close()
		}
	}
	addr := target
	for i := 0; i < n; i++ {
		r, err := StartRelay(ctx, RelayConfig{Target: addr, Hop: hop})
		if err != nil {
			closeAll()
			return "", nil, fmt.Errorf("%w: %w", errRelay, err)
		}
		relays = append(relays, r)
		addr = r.Addr()
	}
	return addr, closeAll, nil
}
