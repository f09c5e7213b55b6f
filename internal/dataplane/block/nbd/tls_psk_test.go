package nbd

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/tlspsk"
	"github.com/rialto-project/rialto/internal/logtest"
)

const (
	pskIdentity = "alice"
	pskKey      = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
)

// pskFile writes a psktool-format key file (identity:hexkey) and returns
// its path.
func pskFile(t *testing.T, lines ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "keys.psk")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// servePSK exports a sparse file of size on a server that requires TLS and
// takes both the test PKI's certificate and the key file's PSKs, as an
// agent given --tls-psk does. It returns the file's path and the address.
func servePSK(t *testing.T, pk *testPKI, dir string, size int64) (string, string, *logtest.Buffer) {
	t.Helper()
	keys, err := tlspsk.LoadKeyFile(pskFile(t, "bob:00112233445566778899aabbccddeeff", pskIdentity+":"+pskKey))
	if err != nil {
		t.Fatal(err)
	}
	path, b := sparseFile(t, dir, size)
	logger, log := debugLogger()
	s := &Server{TLSConfig: pk.server, PSK: keys, Logger: logger}
	if err := s.AddExport(Export{Name: testName, Backend: b}); err != nil {
		t.Fatal(err)
	}
	return path, serveOn(t, s), log
}

// pskURI is libnbd's URI for TLS with a pre-shared key: the identity is
// the URI's user (libnbd 1.14 has no tls-username parameter).
func pskURI(addr, user, export, file string) string {
	return "nbds://" + user + "@" + addr + "/" + export + "?tls-psk-file=" + file
}

// TestInteropPSKNbdinfo: nbdinfo with a psktool key file reads a lease's
// export over TLS with a pre-shared key, the same server still serves
// X.509 clients, and each refusal is one.
func TestInteropPSKNbdinfo(t *testing.T) {
	need(t, "nbdinfo")
	pk := newTestPKI(t)
	_, addr, log := servePSK(t, pk, t.TempDir(), 64<<20)
	keyFile := pskFile(t, pskIdentity+":"+pskKey)
	var info struct {
		TLS     bool `json:"TLS"`
		Exports []struct {
			Size int64 `json:"export-size"`
		} `json:"exports"`
	}
	out := run(t, "nbdinfo", "--json", pskURI(addr, pskIdentity, testName, keyFile))
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		t.Fatal(err)
	}
	if !info.TLS || len(info.Exports) != 1 || info.Exports[0].Size != 64<<20 {
		t.Fatalf("nbdinfo over TLS-PSK:\n%s", out)
	}
	waitFor(t, "the server's log to name the identity", func() bool {
		return strings.Contains(log.String(), "psk_identity="+pskIdentity)
	})
	if strings.Contains(log.String(), pskKey) {
		t.Fatal("the server logged a key")
	}
	// Certificates on the same server, as before.
	x509 := URI{Network: "tcp", Address: addr, Export: testName, TLS: true, TLSCertificates: pk.clientDir}.String()
	if got := strings.TrimSpace(run(t, "nbdinfo", "--size", x509)); got != "67108864" {
		t.Fatalf("nbdinfo over X.509: %q", got)
	}

	wrongKey := pskFile(t, pskIdentity+":"+strings.Repeat("ab", 32))
	unknown := pskFile(t, "mallory:"+pskKey)
	for _, tc := range []struct{ name, uri, want, server string }{
		// The PSK authenticates the connection; the export name is
		// still the credential checked.
		{"wrong export name", pskURI(addr, pskIdentity, "rlc_not-a-lease", keyFile), "server has no export named", ""},
		// libnbd says only "A TLS fatal alert has been received"; the
		// server says which.
		{"wrong key", pskURI(addr, pskIdentity, testName, wrongKey), "gnutls_handshake", "sent decrypt_error"},
		// An identity the server does not know goes to the X.509
		// handshake, which a client holding only a PSK cannot pass:
		// GnuTLS gives up when the server's certificate comes.
		{"unknown identity", pskURI(addr, "mallory", testName, unknown), "Insufficient credentials", ""},
		{"plaintext", URI{Network: "tcp", Address: addr, Export: testName}.String(), "TLS is required", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command("nbdinfo", "--size", tc.uri)
			cmd.Env = append(os.Environ(), "LIBNBD_DEBUG=1")
			out, err := cmd.CombinedOutput()
			if err == nil || !strings.Contains(string(out), tc.want) || strings.Contains(string(out), "67108864\n") {
				t.Fatalf("nbdinfo %s: err %v\n%s", tc.name, err, out)
			}
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			t.Logf("refused: %s", lines[len(lines)-1])
			if tc.server != "" {
				defer func() {
					if t.Failed() {
						t.Logf("server log:\n%s", log)
					}
				}()
				waitFor(t, "the server's log to say "+tc.server, func() bool { return strings.Contains(log.String(), tc.server) })
			}
		})
	}
}

// TestInteropPSKNbdcopy round-trips data through nbdcopy (several
// connections) over TLS with a pre-shared key.
func TestInteropPSKNbdcopy(t *testing.T) {
	need(t, "nbdcopy")
	const size = 32 << 20
	dir := fastDir(t)
	_, addr, log := servePSK(t, newTestPKI(t), dir, size)
	defer func() {
		if t.Failed() {
			t.Logf("server log:\n%s", log)
		}
	}()
	uri := pskURI(addr, pskIdentity, testName, pskFile(t, pskIdentity+":"+pskKey))
	src := filepath.Join(dir, "src.img")
	dst := filepath.Join(dir, "dst.img")
	want := writeRandom(t, src, size)
	run(t, "nbdcopy", src, uri)
	run(t, "nbdcopy", uri, dst)
	if got := fileSum(t, dst); got != want {
		t.Fatal("nbdcopy round trip over TLS-PSK: checksums differ")
	}
}

// TestPSKOnlyKE: a client offering only psk_ke (a PSK without a key
// exchange, so without forward secrecy) is refused with
// insufficient_security. libnbd does not let one ask for that, so
// gnutls-cli does, through a proxy that runs the NBD handshake up to the
// server's STARTTLS reply and then passes the TLS bytes both ways.
func TestPSKOnlyKE(t *testing.T) {
	need(t, "gnutls-cli")
	_, addr, _ := servePSK(t, newTestPKI(t), t.TempDir(), 1<<20)
	for _, tc := range []struct{ name, prio, want string }{
		{"psk_ke only", "NORMAL:-VERS-ALL:+VERS-TLS1.3:-KX-ALL:+PSK", "Received alert [71]"},
		{"psk_dhe_ke", "NORMAL:-VERS-ALL:+VERS-TLS1.3:-KX-ALL:+ECDHE-PSK", "Handshake was completed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc := rawDial(t, addr, clientFlagFixedNewstyle|clientFlagNoZeroes)
			if got := rc.optExpect(optStartTLS, nil); len(got) != 1 || got[0] != repAck {
				t.Fatalf("STARTTLS: %x", got)
			}
			ln := listen(t)
			var wg sync.WaitGroup
			defer wg.Wait()
			defer rc.c.Close()
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				var cw sync.WaitGroup
				cw.Add(1)
				go func() { defer cw.Done(); io.Copy(rc.c, c); rc.c.(*net.TCPConn).CloseWrite() }()
				io.Copy(c, rc.r)
				c.Close()
				cw.Wait()
			}()
			_, port, _ := net.SplitHostPort(ln.Addr().String())
			cmd := exec.Command("gnutls-cli", "--priority", tc.prio, "--pskusername", pskIdentity, "--pskkey", pskKey, "-p", port, "127.0.0.1")
			cmd.Stdin = bytes.NewReader(nil)
			out, _ := cmd.CombinedOutput()
			ln.Close()
			if !strings.Contains(string(out), tc.want) {
				t.Fatalf("gnutls-cli: want %q\n%s", tc.want, out)
			}
		})
	}
}

// TestPSKOnlyServer: a server with keys and no certificate serves PSK
// clients and refuses certificate ones with a TLS alert.
func TestPSKOnlyServer(t *testing.T) {
	need(t, "nbdinfo")
	keyFile := pskFile(t, pskIdentity+":"+pskKey)
	keys, err := tlspsk.LoadKeyFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	logger, log := debugLogger()
	s := &Server{PSK: keys, Logger: logger}
	if err := s.AddExport(Export{Name: testName, Backend: NewMemBackend(1 << 20)}); err != nil {
		t.Fatal(err)
	}
	addr := serveOn(t, s)
	if got := strings.TrimSpace(run(t, "nbdinfo", "--size", pskURI(addr, pskIdentity, testName, keyFile))); got != "1048576" {
		t.Fatalf("nbdinfo over TLS-PSK: %q", got)
	}
	// The plaintext refusal is FORCEDTLS's, as with certificates.
	plain := URI{Network: "tcp", Address: addr, Export: testName}.String()
	if out, err := exec.Command("nbdinfo", "--size", plain).CombinedOutput(); err == nil {
		t.Fatalf("plaintext nbdinfo served by a PSK-only server:\n%s", out)
	}
	_, err = DialURI(t.Context(), URI{Network: "tcp", Address: addr, Export: testName, TLS: true}.String(), WithTLS(newTestPKI(t).clientConfig()))
	if err == nil {
		t.Fatal("an X.509 client was served by a PSK-only server")
	}
	t.Logf("X.509 client refused: %v", err)
	waitFor(t, "the server's log to say it refused the client", func() bool {
		return strings.Contains(log.String(), "sent handshake_failure")
	})
}

// TestPSKHandshakeDeadline: a client that stops inside the TLS handshake
// after STARTTLS (in the ClientHello the server peeks at, or after the
// server's PSK flight, before its Finished) does not hold the
// connection: the handshake timeout closes it.
func TestPSKHandshakeDeadline(t *testing.T) {
	keys, err := tlspsk.LoadKeyFile(pskFile(t, pskIdentity+":"+pskKey))
	if err != nil {
		t.Fatal(err)
	}
	hello, err := hex.DecodeString(pskHelloHex)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		tls  bool // the server also has a certificate
		send []byte
	}{
		{"in the ClientHello", true, hello[:40]},
		{"in the ClientHello, PSK only", false, hello[:40]},
		{"before the client's Finished", true, hello},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Server{PSK: keys, HandshakeTimeout: time.Second}
			if tc.tls {
				s.TLSConfig = newTestPKI(t).server
			}
			if err := s.AddExport(Export{Name: testName, Backend: NewMemBackend(1 << 16)}); err != nil {
				t.Fatal(err)
			}
			rc := rawDial(t, serveOn(t, s), clientFlagFixedNewstyle|clientFlagNoZeroes)
			if got := rc.optExpect(optStartTLS, nil); len(got) != 1 || got[0] != repAck {
				t.Fatalf("STARTTLS: %x", got)
			}
			rc.write(tc.send)
			// The server's flight, if any, then the end (rawDial's
			// deadline of 20 s is the test's bound).
			n, err := io.Copy(io.Discard, rc.r)
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatalf("the server still holds the connection after %d bytes", n)
			}
			if tc.send[5] == 1 && len(tc.send) == len(hello) && n == 0 {
				t.Fatal("no ServerHello for a whole hello")
			}
		})
	}
}
