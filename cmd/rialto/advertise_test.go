package main

import (
	"net"
	"os"
	"strings"
	"testing"
)

// TestAdvertiseURL: the address other replicas reach a server by is the
// one it listens on, or its host name when it listens on every address.
func TestAdvertiseURL(t *testing.T) {
	hn, err := os.Hostname()
	if err != nil || hn == "" {
		t.Skip("no host name")
	}
	for _, c := range []struct {
		addr  net.Addr
		https bool
		want  string
	}{
		{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7070}, false, "http://127.0.0.1:7070"},
		{&net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 7070}, true, "https://10.1.2.3:7070"},
		{&net.TCPAddr{IP: net.ParseIP("::1"), Port: 7070}, true, "https://[::1]:7070"},
		{&net.TCPAddr{IP: net.IPv4zero, Port: 7070}, true, "https://" + net.JoinHostPort(hn, "7070")},
		{&net.TCPAddr{IP: net.IPv6unspecified, Port: 7071}, false, "http://" + net.JoinHostPort(hn, "7071")},
	} {
		if got := advertiseURL(c.addr, c.https); got != c.want || strings.HasSuffix(got, "/") {
			t.Errorf("advertiseURL(%v, %v) = %q, want %q", c.addr, c.https, got, c.want)
		}
	}
}
