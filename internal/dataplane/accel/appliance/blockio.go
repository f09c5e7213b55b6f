package appliance

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/accel"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/dataplane/block/stripe"
)

// The block data mover: a slot fills its memory from a range of a block
// lease (LOAD), or stores a range of its memory to one (STORE), dialling
// the block lenders itself — devices reading devices, as the Device Lending
// paper (Markussen et al.) has a GPU read an NVMe drive of another host
// without the borrower relaying. The borrower passes the block lease's part
// URIs (their export names are the parts' credentials) with each LOAD or
// STORE; the slot uses them for that request only: it dials the parts,
// moves exactly [offset, offset+len) of the lease's volume, and closes the
// connections. The URIs never reach slot memory (a role cannot see them),
// a log line or an error message. docs/accelerators.md, "Devices reading
// devices", has the security model.

// Block mover tuning: each request moves blockWindow bytes, blockWindows
// of them in flight, under blockTimeout each.
const (
	blockWindow  = 4 << 20
	blockWindows = 4
	blockTimeout = 30 * time.Second
)

// blockTiming is where a block move's time went: opening the volume (dial
// and NBD negotiation), the first window's arrival, and the whole move.
type blockTiming struct{ open, first, total time.Duration }

// errBlockRefused is a part the appliance will not dial.
var errBlockRefused = errors.New("part refused")

// LoadBlock implements accel.BlockMover.
func (t *slotTarget) LoadBlock(ctx context.Context, addr uint64, n uint32, r accel.BlockRange) error {
	s := (*slot)(t)
	if err := s.expired(); err != nil {
		return err
	}
	if err := s.bounds(addr, uint64(n)); err != nil {
		return err
	}
	var tm blockTiming
	sp := s.startStream(n)
	s.memMu.Lock()
	g0 := s.memGen
	s.memMu.Unlock()
	err := s.a.moveBlock(ctx, r, uint64(n), false, &tm, func(vol *stripe.Volume, off uint64, buf []byte) error {
		k, err := vol.ReadAt(buf, int64(r.Offset+off))
		if err != nil || k != len(buf) {
			return fmt.Errorf("read %d bytes at %d: %d read: %w", len(buf), r.Offset+off, k, err)
		}
		s.memMu.Lock()
		copy(s.mem[addr+off:], buf)
		s.memGen++
		s.memMu.Unlock()
		sp.landed(off, buf)
		return nil
	})
	res, hashed := sp.finish(err == nil)
	if err != nil {
		return err
	}
	s.bytesIn.Add(uint64(n))
	s.blockIn.Add(uint64(n))
	if res != nil {
		s.busyNs.Add(uint64(hashed))
		s.memMu.Lock()
		// Valid only if no other write landed meanwhile: the LOAD's own
		// windows are all the writes since g0.
		if s.memGen == g0+uint64(len(sp.ready)) {
			s.memo = &memo{l: sp.l, entry: sp.entry, addr: addr, n: n, gen: s.memGen, out: res}
		}
		s.memMu.Unlock()
	}
	s.a.log.Debug("appliance: loaded from a block lease", "slot", s.id, "bytes", n, "range", r,
		"open_s", tm.open.Seconds(), "first_window_s", tm.first.Seconds(), "seconds", tm.total.Seconds(),
		"streamed", res != nil, "stream_compute_s", hashed.Seconds())
	return nil
}

// memo is the output of entry on [addr, addr+n) of a slot's memory, which
// a LOAD computed while the bytes landed, valid while the slot's memGen is
// gen and its role l.
type memo struct {
	l     *loaded
	entry string
	addr  uint64
	n     uint32
	gen   uint64
	out   []byte
}

// stream feeds a LOAD's windows, in order, to the slot's role as they land
// (roles.Streamer), so that the task which follows the LOAD finds its
// output computed: the compute overlaps the transfer instead of following
// it, and the input is not copied out of slot memory again. The zero
// stream (a role that does not stream) does nothing. One goroutine, owned
// by LoadBlock (finish waits for it), consumes the windows.
type stream struct {
	l     *loaded
	entry string
	ready []chan []byte // window i's bytes once they are in slot memory
	stop  chan struct{}
	done  chan time.Duration
	st    roles.Stream
}

// startStream starts streaming a LOAD of n bytes into the slot's role when
// the role streams its default (first) entry, the one a task names when it
// names none; a task naming another entry runs the ordinary way.
func (s *slot) startStream(n uint32) *stream {
	l := s.role.Load()
	if l == nil {
		return &stream{}
	}
	sr, ok := l.role.(roles.Streamer)
	es := l.role.Entries()
	if !ok || len(es) == 0 || n == 0 || !l.acquire() {
		return &stream{}
	}
	st := sr.NewStream(es[0])
	if st == nil {
		l.release()
		return &stream{}
	}
	sp := &stream{l: l, entry: es[0], st: st, stop: make(chan struct{}), done: make(chan time.Duration, 1),
		ready: make([]chan []byte, (uint64(n)+blockWindow-1)/blockWindow)}
	for i := range sp.ready {
		sp.ready[i] = make(chan []byte, 1)
	}
	go func() {
		var busy time.Duration
		defer func() { sp.done <- busy }()
		for _, ch := range sp.ready {
			select {
			case b := <-ch:
				t0 := time.Now()
				_, _ = st.Write(b)
				busy += time.Since(t0)
			case <-sp.stop:
				return
			}
		}
	}()
	return sp
}

// landed hands the window at off to the stream.
func (sp *stream) landed(off uint64, buf []byte) {
	if sp.st != nil {
		sp.ready[off/blockWindow] <- buf
	}
}

// finish waits for the stream's goroutine; after a LOAD that moved every
// window (ok) it returns the output and the time spent computing it.
func (sp *stream) finish(ok bool) ([]byte, time.Duration) {
	if sp.st == nil {
		return nil, 0
	}
	defer sp.l.release()
	if !ok {
		close(sp.stop)
		<-sp.done
		return nil, 0
	}
	busy := <-sp.done
	t0 := time.Now()
	out := sp.st.Sum()
	return out, busy + time.Since(t0)
}

// Result implements accel.ResultTarget: a task on exactly the range a LOAD
// just streamed into the role, with the role and every byte of the slot's
// memory unchanged since, gets the output the LOAD computed.
func (t *slotTarget) Result(entry string, addr uint64, n uint32) ([]byte, bool) {
	s := (*slot)(t)
	if s.expired() != nil {
		return nil, false // run the ordinary way: refused there
	}
	s.memMu.RLock()
	m := s.memo
	ok := m != nil && m.entry == entry && m.addr == addr && m.n == n && m.gen == s.memGen && m.l == s.role.Load()
	s.memMu.RUnlock()
	if !ok {
		return nil, false
	}
	s.tasks.Add(1)
	s.items.Add(1)
	if s.a.mTasks != nil {
		s.a.mTasks.WithLabelValues(strconv.Itoa(s.id), "ok").Inc()
	}
	s.a.log.Debug("appliance: ran a task", "slot", s.id, "entry", entry, "items", 1, "seconds", 0.0, "streamed", true)
	return append([]byte(nil), m.out...), true
}

// StoreBlock implements accel.BlockMover.
func (t *slotTarget) StoreBlock(ctx context.Context, addr uint64, n uint32, r accel.BlockRange) error {
	s := (*slot)(t)
	if err := s.expired(); err != nil {
		return err
	}
	if err := s.bounds(addr, uint64(n)); err != nil {
		return err
	}
	var tm blockTiming
	err := s.a.moveBlock(ctx, r, uint64(n), true, &tm, func(vol *stripe.Volume, off uint64, buf []byte) error {
		s.memMu.RLock()
		copy(buf, s.mem[addr+off:])
		s.memMu.RUnlock()
		if _, err := vol.WriteAt(buf, int64(r.Offset+off)); err != nil {
			return fmt.Errorf("write %d bytes at %d: %w", len(buf), r.Offset+off, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	s.bytesOut.Add(uint64(n))
	s.blockOut.Add(uint64(n))
	s.a.log.Debug("appliance: stored to a block lease", "slot", s.id, "bytes", n, "range", r,
		"open_s", tm.open.Seconds(), "first_window_s", tm.first.Seconds(), "seconds", tm.total.Seconds())
	return nil
}

// moveBlock opens the range's volume and runs move on every window of
// [0, n) (relative to r.Offset), blockWindows at a time; a store then
// flushes. Lease end (ctx) closes the volume, which interrupts the moves.
func (a *Appliance) moveBlock(ctx context.Context, r accel.BlockRange, n uint64, store bool, tm *blockTiming,
	move func(vol *stripe.Volume, off uint64, buf []byte) error) error {
	t0 := time.Now()
	defer func() { tm.total = time.Since(t0) }()
	var tc *tls.Config
	if a.cfg.BlockTLS != nil {
		tc = a.cfg.BlockTLS()
	}
	vol, err := stripe.Open(ctx, stripe.OpenConfig{URIs: r.Parts, StripeUnit: int64(r.StripeUnit),
		RequestTimeout: blockTimeout, Check: partPolicy(a.cfg.Host), TLS: tc, Track: a.cfg.BlockTrack})
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("%w: interrupted: %w", accel.ErrBlockIO, ctx.Err())
		}
		return fmt.Errorf("%w: %w", accel.ErrBlockIO, err)
	}
	tm.open = time.Since(t0)
	stop := context.AfterFunc(ctx, func() { _ = vol.Close() })
	defer func() {
		if stop() {
			_ = vol.Close()
		}
	}()
	if size := uint64(vol.Size()); r.Offset > size || n > size-r.Offset {
		return fmt.Errorf("%w: %w: [%d, +%d) outside the block lease's %d-byte volume", accel.ErrBlockIO, accel.ErrOutOfRange, r.Offset, n, size)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		sem   = make(chan struct{}, blockWindows)
	)
	fail := func(err error) {
		mu.Lock()
		if first == nil {
			first = err
		}
		mu.Unlock()
	}
	failed := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return first != nil
	}
	for off := uint64(0); off < n && !failed(); off += blockWindow {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			buf := make([]byte, min(blockWindow, n-off))
			if err := move(vol, off, buf); err != nil {
				fail(err)
			}
			if off == 0 {
				tm.first = time.Since(t0)
			}
		})
	}
	wg.Wait()
	if first == nil && store {
		if err := vol.Flush(); err != nil {
			first = fmt.Errorf("flush: %w", err)
		}
	}
	if first != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("%w: interrupted: %w", accel.ErrBlockIO, ctx.Err())
		}
		return fmt.Errorf("%w: %w", accel.ErrBlockIO, first)
	}
	return nil
}

// partPolicy is the appliance's dialling policy for block parts, for an
// appliance serving on host: TCP only (a Unix socket would reach files of
// the appliance's host), and loopback or unspecified addresses only when
// the appliance itself serves on loopback (a one-machine cluster, `rialto
// up`), so that a borrower cannot use the appliance to reach services bound
// to its host's loopback. The part is dialled at the address checked (no
// second name lookup); over TLS the certificate must still name the host
// the URI gave.
func partPolicy(host string) func(ctx context.Context, i int, u nbd.URI) (nbd.URI, error) {
	local := host == "localhost"
	if ip, err := netip.ParseAddr(host); err == nil && ip.Unmap().IsLoopback() {
		local = true
	}
	return func(ctx context.Context, i int, u nbd.URI) (nbd.URI, error) {
		if u.Network != "tcp" {
			return u, fmt.Errorf("%w: part %d: only nbd:// parts (TCP) are reachable from an appliance", errBlockRefused, i)
		}
		h, port, err := net.SplitHostPort(u.Address)
		if err != nil {
			return u, fmt.Errorf("%w: part %d: bad address", errBlockRefused, i)
		}
		ip, err := netip.ParseAddr(h)
		if err != nil {
			ips, lerr := net.DefaultResolver.LookupNetIP(ctx, "ip", h)
			if lerr != nil || len(ips) == 0 {
				return u, fmt.Errorf("%w: part %d: cannot resolve %s", errBlockRefused, i, h)
			}
			ip = ips[0]
		}
		ip = ip.Unmap()
		if (ip.IsLoopback() || ip.IsUnspecified()) && !local {
			return u, fmt.Errorf("%w: part %d: %s is a loopback address of the appliance's host", errBlockRefused, i, ip)
		}
		if u.ServerName == "" {
			u.ServerName = h
		}
		u.Address = net.JoinHostPort(ip.String(), port)
		return u, nil
	}
}
