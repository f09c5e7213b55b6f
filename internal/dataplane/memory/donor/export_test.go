package donor

import (
	"net"
	"testing"

	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

// RawFds returns the descriptors of the connections the donor serves with
// raw syscalls (sync connections, bulk streams, fault connections).
func (d *Donor) RawFds() []int {
	d.mu.Lock()
	defer d.mu.Unlock()
	var fds []int
	for conn := range d.conns {
		if dc, ok := conn.(detachedConn); ok {
			fds = append(fds, dc.p.Fd())
		}
	}
	return fds
}

// SetMoved has f called (before Serve) as a raw connection's waits move
// to the netpoller (parked) and back, from its serving goroutine, with its
// descriptor (rawconn.Idle.Moved): a test may send requests then.
func (d *Donor) SetMoved(f func(fd int, parked bool)) { d.moved = f }

// SendFrame is send (h with payload on c), for the external tests.
func SendFrame(t *testing.T, c net.Conn, h protocol.Header, payload []byte) {
	t.Helper()
	send(t, c, h, payload)
}

// SendHello is helloRaw (HELLO m on c; the reply's session id), for the
// external tests.
func SendHello(t *testing.T, c net.Conn, m protocol.Hello) uint64 {
	t.Helper()
	return helloRaw(t, c, m)
}

// DataConns is how many data connections the donor serves now, of every
// session (from their HELLO until their handlers return: what MaxConns
// bounds).
func (d *Donor) DataConns() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.dataConns
}

// Subscribed reports whether the region of credential has a session now.
func (d *Donor) Subscribed(credential string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	r := d.regions[credKey(credential)]
	return r != nil && r.sess != nil
}
