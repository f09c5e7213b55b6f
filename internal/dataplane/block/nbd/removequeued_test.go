package nbd

import (
	"bytes"
	"io"
	"net"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestRemoveExportDropsQueuedSendfile removes an export while a large read
// reply is being sent (with sendfile from a file on disk, with writev from
// the mapping of a file on tmpfs) to a client that does not read, then
// writes other bytes over the range, as the next lease (or a wipe writing
// zeroes) may once RemoveExport has returned. sendfile queues references
// to the page cache, not copies: what the socket still held would be read
// from the file when it left, carrying the new bytes to the old client.
// Nothing may leave the server after RemoveExport returns: the client
// gets what its socket had received by then (bytes that, on this host,
// still reference the pages: out of the server's reach), then the end.
func TestRemoveExportDropsQueuedSendfile(t *testing.T) {
	for _, tc := range []struct {
		name   string
		dir    func(*testing.T) string
		mapped bool
	}{{"sendfile", (*testing.T).TempDir, false}, {"mapping", fastDir, true}} {
		t.Run(tc.name, func(t *testing.T) { testRemoveExportDropsQueuedRead(t, tc.dir(t), tc.mapped) })
	}
}

func testRemoveExportDropsQueuedRead(t *testing.T, dir string, mapped bool) {
	const size = 32 << 20
	p, data := patternFileIn(t, dir, size)
	b, err := OpenFile(p, FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if mapped && !memoryBacked(t, p) {
		t.Skip("no tmpfs at /dev/shm")
	}
	if !mapped {
		needZeroCopy(t, b)
	}
	s, addr := startServer(t, Export{Name: testName, Backend: b})
	rc := rawDial(t, addr, clientFlagFixedNewstyle|clientFlagNoZeroes)
	m0 := mappedReads.Load()
	rc.startLargeRead(size)
	if mapped && mappedReads.Load() == m0 {
		t.Fatal("the read was not answered from the mapping")
	}
	if err := s.RemoveExport(testName); err != nil {
		t.Fatal(err)
	}
	// The client has not read since the header: the server could send
	// no more than its receive window, so what has arrived is all the
	// server sent before the removal.
	arrived := rc.r.Buffered()
	sc, err := rc.c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	sc.Control(func(fd uintptr) {
		n, err := unix.IoctlGetInt(int(fd), unix.SIOCINQ)
		if err != nil {
			t.Fatal(err)
		}
		arrived += n
	})

	// The next lease writes the range.
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(bytes.Repeat(leakMark, size/len(leakMark)), 0); err != nil {
		t.Fatal(err)
	}
	f.Close()

	got, err := io.ReadAll(rc.r)
	t.Logf("%d bytes had arrived at the removal, %d read in all (%v)", arrived, len(got), err)
	if len(got) > arrived {
		rest := got[arrived:]
		t.Errorf("%d bytes of the reply left the server after RemoveExport returned", len(rest))
		if i := bytes.Index(rest, leakMark); i >= 0 {
			t.Errorf("and carry the bytes written afterwards (at %d)", arrived+i)
		} else if !bytes.Equal(rest, data[arrived:][:len(rest)]) {
			t.Errorf("and differ from the export's contents")
		}
	}
}
