package nbd

import (
	"bufio"
	"io"
	"net"
	"testing"
)

func listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

func netListen(network, addr string) (net.Listener, error) { return net.Listen(network, addr) }

func ioReadFullR(r *bufio.Reader, b []byte) (int, error) { return io.ReadFull(r, b) }
