package lab

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"time"
)

// echoServer answers every byte it reads with the same byte.
type echoServer struct {
	ln net.Listener
	wg sync.WaitGroup
}

func startEcho(ctx context.Context) (*echoServer, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("lab: echo: %w", err)
	}
	e := &echoServer{ln: ln}
	var mu sync.Mutex
	var conns []net.Conn
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		defer func() {
			mu.Lock()
			for _, c := range conns {
				c.Close()
			}
			mu.Unlock()
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			e.wg.Add(1)
			go func() { defer e.wg.Done(); defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return e, nil
}

func (e *echoServer) Addr() string { return e.ln.Addr().String() }

func (e *echoServer) Close() {
	e.ln.Close()
	e.wg.Wait()
}

// oneWayThrough is the time a message of size bytes takes through n
// relays in series applying hop (n = 0: straight to the receiver), from
// its first byte written to the sender's notice that the receiver has its
// last one, which comes back over a connection of its own, straight: one
// direction of the path, crossed as a write of size bytes crosses it (on a
// paced hop, in as many pieces, each on a timer of its own). What the path
// itself adds, characterized apart from the data plane under test: the
// undisturbed time of count messages sent one after the other.
func oneWayThrough(ctx context.Context, n int, hop Hop, count, size int) (time.Duration, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("lab: ping: %w", err)
	}
	defer ln.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = ln.(*net.TCPListener).SetDeadline(dl)
	}
	var d net.Dialer
	// The notice's connection first, straight; then the message's,
	// through the relays (each dials its next as it accepts).
	back, err := d.DialContext(ctx, "tcp", ln.Addr().String())
	if err != nil {
		return 0, fmt.Errorf("lab: ping: %w", err)
	}
	defer back.Close()
	notify, err := ln.Accept()
	if err != nil {
		return 0, fmt.Errorf("lab: ping: %w", err)
	}
	defer notify.Close()
	addr, closeChain, err := Chain(ctx, ln.Addr().String(), n, hop)
	if err != nil {
		return 0, err
	}
	defer closeChain()
	fwd, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, fmt.Errorf("lab: ping: %w", err)
	}
	defer fwd.Close()
	recv, err := ln.Accept()
	if err != nil {
		return 0, fmt.Errorf("lab: ping: %w", err)
	}
	received := make(chan struct{})
	go func() {
		defer close(received)
		defer recv.Close()
		msg := make([]byte, size)
		note := make([]byte, 1)
		for {
			if _, err := io.ReadFull(recv, msg); err != nil {
				return
			}
			if _, err := notify.Write(note); err != nil {
				return
			}
		}
	}()
	// The receiver is stopped and waited for first (defers run last
	// first).
	defer func() { fwd.Close(); recv.Close(); <-received }()
	if dl, ok := ctx.Deadline(); ok {
		_ = fwd.SetDeadline(dl)
		_ = back.SetDeadline(dl)
	}
	msg := make([]byte, size)
	note := make([]byte, 1)
	var times []float64
	for i := 0; i < count+3; i++ {
		t0 := time.Now()
		if _, err := fwd.Write(msg); err != nil {
			return 0, fmt.Errorf("lab: ping: %w", err)
		}
		if _, err := io.ReadFull(back, note); err != nil {
			return 0, fmt.Errorf("lab: ping: %w", err)
		}
		if i >= 3 {
			times = append(times, time.Since(t0).Seconds())
		}
	}
	return seconds(undisturbed(times)), nil
}

// undisturbed is the 10th percentile of xs, durations of the same thing
// measured over and over: what it takes when the machine adds nothing to
// it, or next to nothing. A loaded machine only ever adds to a message's
// way through a relay, a hand-off between threads or a write's credit
// loop, by a scheduler's or a timer's delay, to many of them while other
// work runs: a median moves with that load, and a characterization made
// in a quiet second then misses a run made in a busy one, or the other way
// round, by 20% or more. The lowest tenth of each measures the path and
// the protocol, whatever else the machine does.
func undisturbed(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[(len(s)-1)/10]
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// hopOneWay is what one relay applying hop adds to a message of size bytes
// one way, as oneWayThrough measures it: the hop's latency (and, paced,
// its serialisation of the message) as this machine's timers deliver it
// to a message of that size, undisturbed.
func hopOneWay(ctx context.Context, hop Hop, count, size int) (time.Duration, error) {
	base, err := oneWayThrough(ctx, 0, hop, count, size)
	if err != nil {
		return 0, err
	}
	one, err := oneWayThrough(ctx, 1, hop, count, size)
	if err != nil {
		return 0, err
	}
	return one - base, nil
}
