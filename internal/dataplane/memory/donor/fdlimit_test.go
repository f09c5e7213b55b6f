package donor_test

import (
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/accept/accepttest"
	"github.com/rialto-project/rialto/internal/dataplane/memory/donor"
	"github.com/rialto-project/rialto/internal/dataplane/memory/memorytest"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

// goroutineState waits until the goroutine whose stack holds frame, and
// no frame of this package's tests (a hook holding it), is blocked, and
// returns its state ("syscall": its thread is blocked in poll(2);
// "sleep", "IO wait", …: it holds none) and stack. A goroutine in
// poll(2) counts as blocked once every look for 100 ms (and 10 looks)
// found it there: a poll(2) that does not block is over sooner.
func goroutineState(t *testing.T, frame string) (string, string) {
	t.Helper()
	buf := make([]byte, 1<<20)
	var polling time.Time // since when every look found it in poll(2)
	looks := 0
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); runtime.Gosched() {
		n := runtime.Stack(buf, true)
		found := false
		for _, g := range strings.Split(string(buf[:n]), "\n\n") {
			if !strings.Contains(g, frame) || strings.Contains(g, "donor_test.") {
				continue
			}
			head, _, _ := strings.Cut(g, "\n")
			_, state, _ := strings.Cut(head, "[")
			state, _, _ = strings.Cut(state, "]")
			state, _, _ = strings.Cut(state, ",")
			switch state {
			case "running", "runnable":
			case "syscall":
				// In poll(2), or another system call (the duplicate of
				// the descriptor): poll(2) for long is a wait.
				if !strings.Contains(g, "Ppoll") {
					break
				}
				found = true
				if looks == 0 {
					polling = time.Now()
				}
				if looks++; looks >= 10 && time.Since(polling) >= 100*time.Millisecond {
					return state, g
				}
			default:
				return state, g
			}
		}
		if !found {
			looks = 0
		}
	}
	t.Fatalf("no goroutine blocked in %s", frame)
	return "", ""
}

// TestIdleConnectionOutOfDescriptors: a connection that goes idle while
// the process is out of descriptors (its duplicate for the netpoller
// fails with EMFILE: idle connections hold two each, and the agent's
// other data planes share the limit) still holds no thread: it watches
// its socket from a goroutine that holds none, registers with the
// netpoller once descriptors are free again, and serves its next
// request. It slept in poll(2) until its next request, however long, on
// a thread MaxPollThreads did not count: every connection that went idle
// during a shortage of descriptors held one, past the bound, for good.
func TestIdleConnectionOutOfDescriptors(t *testing.T) {
	td, _, w := startWatched(t, nil, false)
	_, c := w.dial(t, td.Addr, nil)
	m := w.next(t, true) // before it registers
	restore := accepttest.ExhaustFds(t, 0)
	close(m.release)
	state, stack := goroutineState(t, "rawconn.(*Conn).waitInput")
	restore()
	if state == "syscall" {
		t.Errorf("an idle connection out of descriptors holds a thread, blocked in poll(2):\n%s", stack)
	}
	if parked, polling := td.D.ParkedConns(); parked != 1 || polling != 0 {
		t.Errorf("%d connections parked, %d threads held; want 1 and 0", parked, polling)
	}
	// Descriptors free again, it waits on the netpoller.
	named := map[int]string{m.fd: "an idle connection"}
	for deadline := time.Now().Add(10 * time.Second); len(memorytest.Registrations(t, named)) == 0; runtime.Gosched() {
		if time.Now().After(deadline) {
			t.Fatal("an idle connection did not register with the netpoller once descriptors were free")
		}
	}
	// It serves its next request.
	c.send(t, protocol.Header{Op: protocol.OpPing, Seq: 1}, nil)
	close(w.next(t, false).release)
	c.reply(t, 1, protocol.OpPing)
}

// TestServeOutOfDescriptors: a connection the donor cannot accept, the
// process out of descriptors (EMFILE: idle data connections hold two
// each, connections before their HELLO one, and the agent's data planes
// share its limit), leaves the donor serving: it accepts again once
// descriptors are free, that connection too. Serve returned the accept's
// error, and the agent's memory data plane stopped for good, ending every
// tenant's sessions, at the first descriptor short.
func TestServeOutOfDescriptors(t *testing.T) {
	log, seen := accepttest.Failures()
	d := donor.New(log)
	if err := d.AddRegion(testCred, 1<<20); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.RemoveRegion(testCred) }) // after Serve returns
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nc := accepttest.DialThroughShortage(t, ln, seen, d.Serve)
	// The connection it could not accept is served.
	_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	donor.SendHello(t, nc, protocol.Hello{Kind: protocol.KindControl, Credential: testCred})
}
