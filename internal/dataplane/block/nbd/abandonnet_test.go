package nbd

import (
	"crypto/tls"
	"net"
	"testing"
)

// endClient ends rc's connection as a client that lost it would: reset
// (TCP, TLS over TCP), closed without NBD_CMD_DISC (over TLS after
// close_notify), or (disconnect) after the NBD_CMD_DISC already sent, with
// its sending side shut (over TLS after close_notify); shut is the same
// without a disconnect sent.
func endClient(rc *rawConn, how string) {
	raw := tlsRaw(rc)
	switch how {
	case "reset":
		raw.(*net.TCPConn).SetLinger(0)
		raw.Close()
	case "closed":
		rc.c.Close()
	case "disconnect", "shut":
		if tc, ok := rc.c.(*tls.Conn); ok {
			tc.CloseWrite()
		}
		raw.(interface{ CloseWrite() error }).CloseWrite()
	}
}

// dialAbandon serves s over network ("tcp", "unix" or "tls", X.509 over
// TCP) and returns a raw client in transmission on export testName.
// rcvbuf, if not 0, is the client's TCP receive buffer, set before the
// transmission phase.
func dialAbandon(t *testing.T, s *Server, network string, rcvbuf int) *rawConn {
	t.Helper()
	const flags = clientFlagFixedNewstyle | clientFlagNoZeroes
	var rc *rawConn
	var pk *testPKI
	switch network {
	case "tcp":
		rc = rawDial(t, serveOn(t, s), flags)
	case "unix":
		rc = rawDialNet(t, "unix", serveUnix(t, s), flags)
	case "tls":
		pk = newTestPKI(t)
		s.TLSConfig = pk.server
		rc = rawDial(t, serveOn(t, s), flags)
	default:
		t.Fatalf("unknown network %q", network)
	}
	if rcvbuf != 0 {
		if tc, ok := rc.c.(*net.TCPConn); ok {
			if err := tc.SetReadBuffer(rcvbuf); err != nil {
				t.Fatal(err)
			}
		}
	}
	if pk != nil {
		// Full records from the first: a record then holds what the
		// tests send in one segment over TCP (crypto/tls would start
		// with records of one TCP segment's size).
		cfg := pk.clientConfig()
		cfg.DynamicRecordSizingDisabled = true
		rc.starttls(cfg)
	}
	rc.goTransmission(testName, false, false)
	return rc
}

// readReq appends a read request of n bytes at off.
func readReq(b []byte, handle, off uint64, n int) []byte {
	h := make([]byte, requestHeaderLen)
	putRequest(h, Request{Type: CmdRead, Handle: handle, Offset: off, Length: uint32(n)})
	return append(b, h...)
}

// plainReq appends a request without payload.
func plainReq(b []byte, r Request) []byte {
	h := make([]byte, requestHeaderLen)
	putRequest(h, r)
	return append(b, h...)
}

// tlsRaw returns the connection under rc's TLS session, or rc's.
func tlsRaw(rc *rawConn) net.Conn {
	if tc, ok := rc.c.(*tls.Conn); ok {
		return tc.NetConn()
	}
	return rc.c
}
