package nbd

import (
	"bytes"
	"crypto/tls"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/rialto-project/rialto/internal/pki"
)

var (
	fuzzTLSOnce sync.Once
	fuzzTLS     *tls.Config
)

// fuzzServerTLS is a server certificate of a fresh CA.
func fuzzServerTLS(t *testing.T) *tls.Config {
	ca, err := pki.Open(t.TempDir(), pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := ca.ServerConfig("fuzz", []string{"127.0.0.1"}, tls.NoClientCert, 0)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// FuzzHandshakeTLS feeds arbitrary client bytes to a server that offers TLS
// (required, or optional when optional is set). The input never completes a
// TLS handshake, so no session may reach transmission when TLS is required,
// and none may without a valid export either way.
func FuzzHandshakeTLS(f *testing.F) {
	flags := []byte{0, 0, 0, 3}
	seed := func(parts ...[]byte) []byte { return bytes.Join(append([][]byte{flags}, parts...), nil) }
	f.Add(false, seed(optBytes(optGo, infoData(testName, infoBlockSize))))
	f.Add(false, seed(optBytes(optStartTLS, nil)))
	f.Add(false, seed(optBytes(optStartTLS, nil), optBytes(optGo, infoData(testName))))
	f.Add(false, seed(optBytes(optStartTLS, []byte{1}), optBytes(optAbort, nil)))
	f.Add(false, seed(optBytes(optInfo, infoData(testName)), optBytes(optList, nil), optBytes(optExportName, []byte(testName))))
	f.Add(true, seed(optBytes(optStructuredReply, nil), optBytes(optGo, infoData(testName))))
	f.Add(true, seed(optBytes(optStartTLS, nil), []byte{0x16, 3, 1, 0, 5, 1, 0, 0, 1, 0}))
	f.Fuzz(func(t *testing.T, optional bool, in []byte) {
		fuzzTLSOnce.Do(func() { fuzzTLS = fuzzServerTLS(t) })
		s := &Server{TLSConfig: fuzzTLS, TLSOptional: optional}
		s.AddExport(Export{Name: testName, Backend: NewMemBackend(1 << 16)})
		// The socket side gives the rest of the input too, so that a
		// STARTTLS is followed by whatever bytes came after it.
		r := newConnReader(bytes.NewReader(in))
		sess, err := s.negotiate(&fakeConn{r: bytes.NewReader(in)}, r)
		if err != nil {
			return
		}
		if !optional && sess.tls == nil {
			t.Fatal("a session reached transmission without TLS on a server that requires it")
		}
		if sess.exp == nil || sess.name != testName {
			t.Fatalf("success without a valid session: %+v", sess)
		}
	})
}

// FuzzParseURI: parsing never panics, never quotes the export name in an
// error, and what it parses formats back to the same URI.
func FuzzParseURI(f *testing.F) {
	for _, s := range []string{
		"nbd://127.0.0.1:10809/" + testName,
		"nbds://h:7/e?tls-certificates=/etc/rialto/certs",
		"nbds+unix:///e?socket=/run/s&tls-certificates=/d%20x",
		"nbd+unix:///e?socket=/tmp/s",
		"nbds://h/e?tls-psk-file=/k",
		"nbd://[::1]:99/a%2Fb",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := ParseURI(s)
		if err != nil {
			if errors.Is(err, ErrUnsupported) {
				return
			}
			if len(u.Export) > 8 && strings.Contains(err.Error(), u.Export) {
				t.Fatalf("error quotes the export: %v", err)
			}
			return
		}
		back, err := ParseURI(u.String())
		if err != nil {
			t.Fatalf("%q formats as %q, which does not parse: %v", s, u.String(), err)
		}
		if back != u {
			t.Fatalf("%q -> %+v -> %q -> %+v", s, u, u.String(), back)
		}
	})
}
