package lab

import (
	"context"
	"fmt"
	"io"
	"net"
	"sort"
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

// pingThrough is the median round trip of a 32-byte message through n
// relays in series applying hop (n = 0: straight to an echo server): what
// the path itself adds, characterized apart from the data plane under test.
func pingThrough(ctx context.Context, n int, hop Hop, count int) (time.Duration, error) {
	e, err := startEcho(ctx)
	if err != nil {
		return 0, err
	}
	defer e.Close()
	addr, closeChain, err := Chain(ctx, e.Addr(), n, hop)
	if err != nil {
		return 0, err
	}
	defer closeChain()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, fmt.Errorf("lab: ping: %w", err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	msg := make([]byte, 32)
	back := make([]byte, 32)
	var rtts []time.Duration
	for i := 0; i < count+3; i++ {
		t0 := time.Now()
		if _, err := c.Write(msg); err != nil {
			return 0, fmt.Errorf("lab: ping: %w", err)
		}
		if _, err := io.ReadFull(c, back); err != nil {
			return 0, fmt.Errorf("lab: ping: %w", err)
		}
		if i >= 3 {
			rtts = append(rtts, time.Since(t0))
		}
	}
	sort.Slice(rtts, func(i, j int) bool { return rtts[i] < rtts[j] })
	return rtts[len(rtts)/2], nil
}

// hopRoundTrip is what one relay applying hop adds to a round trip, as a
// ping measures it: the hop's latency both ways as this machine's timers
// and scheduler deliver it.
func hopRoundTrip(ctx context.Context, hop Hop, count int) (time.Duration, error) {
	base, err := pingThrough(ctx, 0, hop, count)
	if err != nil {
		return 0, err
	}
	one, err := pingThrough(ctx, 1, hop, count)
	if err != nil {
		return 0, err
	}
	return one - base, nil
}
