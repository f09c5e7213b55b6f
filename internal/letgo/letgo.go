package letgo

import (
	"net"

	"golang.org/x/sys/unix"
)

// Listen is net.Listen, whose TCP listener lets go of its port when it
// closes (Listener).
func Listen(network, address string) (net.Listener, error) {
	ln, err := net.Listen(network, address)
	if err != nil {
		return nil, err
	}
	return Listener(ln), nil
}

// Listener wraps ln, if it is a TCP listener, so that its Close lets go
// of the port though a child process shares the socket; any other is
// returned as it is.
func Listener(ln net.Listener) net.Listener {
	if t, ok := ln.(*net.TCPListener); ok {
		return tcpListener{t}
	}
	return ln
}

// tcpListener is a TCP listener whose Close lets go of the port.
type tcpListener struct{ *net.TCPListener }

// Close closes the listener, then shuts its socket down through a
// duplicate of its descriptor taken first: an Accept under way returns
// net.ErrClosed as from any listener's Close, and the socket, which a
// child process may still share, no longer listens.
func (l tcpListener) Close() error {
	dup := -1
	if rc, err := l.TCPListener.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) {
			if d, err := unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0); err == nil {
				dup = d
			}
		})
	}
	err := l.TCPListener.Close()
	if dup >= 0 {
		_ = unix.Shutdown(dup, unix.SHUT_RD)
		_ = unix.Close(dup)
	}
	return err
}
