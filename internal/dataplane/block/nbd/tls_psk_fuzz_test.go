package nbd

import (
	"bytes"
	"encoding/hex"
	"testing"

	"github.com/rialto-project/rialto/internal/dataplane/tlspsk"
)

// pskHelloHex is a ClientHello record of openssl s_client offering
// identity "alice" with pskKey.
const pskHelloHex = "16030101100100010c0303a9d251def023173161e873e83fbda9b682407759717b7a445b276f043a79cd96204af2d5ba9280ebaff5c02f2fd2f431f92aaef323c779cb61677b711d50bd574c000813021303130100ff010000bb000b000403000102000a00160014001d0017001e0019001801000101010201030104002300000016000000170000000d001e001c040305030603080708080809080a080b080408050806040105010601002b0003020304002d00020101003300260024001d00207fd145dd5587c608385861a5cfcb6ff6507695ea8e03f44f2e4ee7f9c06eae0700290030000b0005616c69636500000000002120815f1d299781ae6a09e7bb6142e2ac6631e08b51f7c0c731841ca5750a50ba40"

// FuzzHandshakePSK feeds arbitrary client bytes to a server that takes
// pre-shared keys beside its certificate: after STARTTLS the server peeks
// at the ClientHello and picks a handshake. The input never completes one
// (the server's key share is fresh), so no session may reach transmission.
func FuzzHandshakePSK(f *testing.F) {
	flags := []byte{0, 0, 0, 3}
	hello, err := hex.DecodeString(pskHelloHex)
	if err != nil {
		f.Fatal(err)
	}
	seed := func(parts ...[]byte) []byte { return bytes.Join(append([][]byte{flags}, parts...), nil) }
	f.Add(seed(optBytes(optStartTLS, nil), hello))
	f.Add(seed(optBytes(optStartTLS, nil), hello[:40]))
	f.Add(seed(optBytes(optStartTLS, nil), []byte{0x16, 3, 1, 0, 5, 1, 0, 0, 1, 0}))
	f.Add(seed(optBytes(optGo, infoData(testName))))
	keys, err := tlspsk.ParseKeys([]byte(pskIdentity + ":" + pskKey))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		fuzzTLSOnce.Do(func() { fuzzTLS = fuzzServerTLS(t) })
		s := &Server{TLSConfig: fuzzTLS, PSK: keys}
		s.AddExport(Export{Name: testName, Backend: NewMemBackend(1 << 16)})
		r := newConnReader(bytes.NewReader(in))
		sess, err := s.negotiate(&fakeConn{r: bytes.NewReader(in)}, r)
		if err == nil {
			t.Fatalf("a session reached transmission: tls %v, psk %v", sess.tls != nil, sess.psk != nil)
		}
	})
}
