package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// rxqSampler watches the bytes a local TCP server has received and not yet
// read: the rx_queue of its established sockets (those whose local port is
// port) in /proc/net/tcp and /proc/net/tcp6. For `rialto attach` this is
// the data nbdcopy has sent that the attach's NBD server has not taken: a
// server that serves one request at a time keeps a backlog there while the
// lenders' links have room.
type rxqSampler struct {
	port   int
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	n      int
	sum    float64 // bytes, over samples
	peak   int64
}

// attachPort returns the TCP port of an nbd:// URI, or 0 (a Unix socket).
func attachPort(uri string) int {
	u, err := url.Parse(uri)
	if err != nil || u.Port() == "" {
		return 0
	}
	p, _ := strconv.Atoi(u.Port())
	return p
}

// startRxq samples every interval until stop; port 0 samples nothing.
func startRxq(ctx context.Context, port int, interval time.Duration) *rxqSampler {
	s := &rxqSampler{port: port}
	if port == 0 {
		return s
	}
	ctx, s.cancel = context.WithCancel(ctx)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			var q int64
			for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
				n, err := readRxq(f, s.port)
				if err == nil {
					q += n
				}
			}
			s.mu.Lock()
			s.n++
			s.sum += float64(q)
			s.peak = max(s.peak, q)
			s.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// stop ends sampling and returns the mean and peak bytes waiting, in MiB
// (NaN for a Unix socket).
func (s *rxqSampler) stop() (mean, peak float64) {
	if s.cancel == nil {
		return math.NaN(), math.NaN()
	}
	s.cancel()
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n == 0 {
		return math.NaN(), math.NaN()
	}
	return s.sum / float64(s.n) / (1 << 20), float64(s.peak) / (1 << 20)
}

func readRxq(path string, port int) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return parseRxq(f, port)
}

// parseRxq sums rx_queue over the established sockets (st 01) with local
// port port in a /proc/net/tcp{,6} listing.
func parseRxq(r io.Reader, port int) (int64, error) {
	sc := bufio.NewScanner(r)
	var sum int64
	first := true
	for sc.Scan() {
		if first { // the header
			first = false
			continue
		}
		fs := strings.Fields(sc.Text())
		if len(fs) < 5 {
			return 0, fmt.Errorf("short line %q", sc.Text())
		}
		_, lport, ok := strings.Cut(fs[1], ":")
		if !ok {
			return 0, fmt.Errorf("bad local address %q", fs[1])
		}
		p, err := strconv.ParseUint(lport, 16, 16)
		if err != nil {
			return 0, fmt.Errorf("bad local port %q: %w", lport, err)
		}
		if int(p) != port || fs[3] != "01" {
			continue
		}
		_, rx, ok := strings.Cut(fs[4], ":")
		if !ok {
			return 0, fmt.Errorf("bad queues %q", fs[4])
		}
		n, err := strconv.ParseInt(rx, 16, 64)
		if err != nil {
			return 0, fmt.Errorf("bad rx_queue %q: %w", rx, err)
		}
		sum += n
	}
	return sum, sc.Err()
}
