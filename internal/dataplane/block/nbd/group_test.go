package nbd

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"
)

// pattern is block i's content in the group tests.
func pattern(i, bs int) []byte { return bytes.Repeat([]byte{byte(i + 1)}, bs) }

// TestGroupsOnTmpfs pipelines writes and reads (one segment) to a file on
// tmpfs, whose reads the reader hands to workers in groups and whose writes
// it serves itself from its buffer: every reply comes once with its own
// data, the writes land, reads were grouped and writes served by the
// reader. On a backend that may wait for a device (MemBackend stands in for
// one here) every request goes to a worker of its own.
func TestGroupsOnTmpfs(t *testing.T) {
	const n, bs = 12, 4096
	p := shmFile(t, 2*n*bs)
	// Blocks n..2n-1 hold data before the server opens the file.
	init := make([]byte, 0, n*bs)
	for i := n; i < 2*n; i++ {
		init = append(init, pattern(i, bs)...)
	}
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(init, n*bs); err != nil {
		t.Fatal(err)
	}
	f.Close()
	be, err := OpenFile(p, FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	if !be.memorySpeed() {
		t.Skip("the file is not seen as memory (no tmpfs)")
	}
	mem := NewMemBackend(2 * n * bs)
	for _, tc := range []struct {
		name    string
		be      Backend
		grouped bool
	}{{"tmpfs", be, true}, {"memory backend", mem, false}} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.be == Backend(mem) {
				copy(mem.Bytes()[n*bs:], init)
			}
			_, addr := startServer(t, Export{Name: "g", Backend: tc.be})
			rc := rawDial(t, addr, clientFlagFixedNewstyle|clientFlagNoZeroes)
			rc.goTransmission("g", false, false)
			before, beforeW := grouped.Load(), readerWrites.Load()
			// Writes to blocks 0..n-1, reads of blocks n..2n-1, interleaved,
			// in one write so that the server finds them queued together.
			var batch []byte
			for i := 0; i < n; i++ {
				h := make([]byte, requestHeaderLen)
				putRequest(h, Request{Type: CmdWrite, Handle: uint64(i), Offset: uint64(i * bs), Length: bs})
				batch = append(append(batch, h...), pattern(i, bs)...)
				putRequest(h, Request{Type: CmdRead, Handle: uint64(n + i), Offset: uint64((n + i) * bs), Length: bs})
				batch = append(batch, h...)
			}
			rc.write(batch)
			seen := map[uint64]bool{}
			for k := 0; k < 2*n; k++ {
				// Simple replies carry no length: read data follows only
				// read replies, whose handles are n and up.
				r, err := rc.replyAny(n, bs)
				if err != nil {
					t.Fatal(err)
				}
				if r.errno != 0 || r.handle >= 2*n || seen[r.handle] {
					t.Fatalf("reply %d: handle %d errno %d", k, r.handle, r.errno)
				}
				seen[r.handle] = true
				if r.handle >= n && !bytes.Equal(r.data, pattern(int(r.handle), bs)) {
					t.Fatalf("read of block %d returned the wrong data", r.handle)
				}
			}
			got := make([]byte, bs)
			for i := 0; i < n; i++ {
				if _, err := tc.be.ReadAt(got, int64(i*bs)); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, pattern(i, bs)) {
					t.Fatalf("block %d: the write did not land", i)
				}
			}
			if g := grouped.Load() - before; (g > 0) != tc.grouped {
				t.Fatalf("%d requests served in groups, want grouping %v", g, tc.grouped)
			}
			// On tmpfs the reader writes payloads from its buffer.
			if w := readerWrites.Load() - beforeW; (w > 0) != tc.grouped {
				t.Fatalf("%d writes served by the reader, want some: %v", w, tc.grouped)
			}
		})
	}
}

// TestGroupsHeldWriteOnTmpfs: while writes are paused for a move, a write
// held at the gate does not hold the reads pipelined behind it (the reader
// stops grouping while the export has a gate).
func TestGroupsHeldWriteOnTmpfs(t *testing.T) {
	const bs = 4096
	p := shmFile(t, 16*bs)
	be, err := OpenFile(p, FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	s, addr := startServer(t, Export{Name: "h", Backend: be})
	rc := rawDial(t, addr, clientFlagFixedNewstyle|clientFlagNoZeroes)
	rc.goTransmission("h", false, false)
	ctx := context.Background()
	if err := s.PauseWrites(ctx, "h"); err != nil {
		t.Fatal(err)
	}
	var batch []byte
	h := make([]byte, requestHeaderLen)
	putRequest(h, Request{Type: CmdWrite, Handle: 0, Offset: 0, Length: bs})
	batch = append(append(batch, h...), pattern(0, bs)...)
	for i := 1; i <= 4; i++ {
		putRequest(h, Request{Type: CmdRead, Handle: uint64(i), Offset: uint64(i * bs), Length: bs})
		batch = append(batch, h...)
	}
	rc.write(batch)
	// A bound for a server that holds the reads behind the write (the
	// test then fails rather than hangs).
	rc.c.SetReadDeadline(time.Now().Add(20 * time.Second))
	for k := 0; k < 4; k++ {
		r, err := rc.replyAny(1, bs)
		if err != nil {
			t.Fatal(err)
		}
		if r.handle == 0 || r.errno != 0 {
			t.Fatalf("reply %d while the write is held: handle %d errno %d", k, r.handle, r.errno)
		}
	}
	waitFor(t, "the write to be held", func() bool { return heldWrites(s, "h") == 1 })
	if err := s.ResumeWrites("h"); err != nil {
		t.Fatal(err)
	}
	r, err := rc.replyAny(1, bs)
	if err != nil || r.handle != 0 || r.errno != 0 {
		t.Fatalf("the resumed write: handle %d errno %d, %v", r.handle, r.errno, err)
	}
	got := make([]byte, bs)
	if _, err := be.ReadAt(got, 0); err != nil || !bytes.Equal(got, pattern(0, bs)) {
		t.Fatalf("the resumed write did not land: %v", err)
	}
}

// replyAny reads one simple reply whose request may be a write or a read:
// handles from readFrom on are reads of bs bytes.
func (rc *rawConn) replyAny(readFrom uint64, bs int) (rawReply, error) {
	var h [simpleReplyLen]byte
	if _, err := io.ReadFull(rc.r, h[:]); err != nil {
		return rawReply{}, err
	}
	if m := binary.BigEndian.Uint32(h[:]); m != simpleReplyMagic {
		return rawReply{}, fmt.Errorf("reply magic %#x", m)
	}
	rr := rawReply{errno: binary.BigEndian.Uint32(h[4:]), handle: binary.BigEndian.Uint64(h[8:])}
	if rr.errno == 0 && rr.handle >= readFrom {
		rr.data = make([]byte, bs)
		if _, err := io.ReadFull(rc.r, rr.data); err != nil {
			return rr, err
		}
	}
	return rr, nil
}

// countingFlushes is a MemBackend that counts its flushes.
type countingFlushes struct {
	*MemBackend
	n atomic.Int64
}

func (c *countingFlushes) Flush() error { c.n.Add(1); return nil }

// TestRepliesNotTakenStopReading: a client that sends requests without
// payload (which hold no budget) and never takes the replies makes the
// server stop reading once replies back up, rather than execute them all
// and queue their replies without bound.
func TestRepliesNotTakenStopReading(t *testing.T) {
	const n = 1 << 20 // 28 MiB of FLUSH requests, 16 MiB of replies
	be := &countingFlushes{MemBackend: NewMemBackend(1 << 20)}
	_, addr := startServer(t, Export{Name: "f", Backend: be})
	rc := rawDial(t, addr, clientFlagFixedNewstyle|clientFlagNoZeroes)
	rc.goTransmission("f", false, false)
	rc.c.(*net.TCPConn).SetReadBuffer(64 << 10)
	rc.c.SetDeadline(time.Time{})
	reqs := make([]byte, n*requestHeaderLen)
	for i := 0; i < n; i++ {
		putRequest(reqs[i*requestHeaderLen:], Request{Type: CmdFlush, Handle: uint64(i)})
	}
	go rc.c.Write(reqs) // ends with an error when the test closes the connection
	// Wait until the server has stopped executing requests: the count
	// stays the same for a second (or all were executed).
	last, since := int64(-1), time.Now()
	deadline := time.Now().Add(60 * time.Second)
	for {
		got := be.n.Load()
		if got == n {
			t.Fatalf("the server executed all %d requests while their replies were not taken", n)
		}
		if got != last {
			last, since = got, time.Now()
		} else if time.Since(since) > time.Second {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server still executes requests after 60 s (%d of %d)", got, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("the server stopped after %d of %d requests", last, n)
}
