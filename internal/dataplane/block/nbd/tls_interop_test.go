package nbd

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/pki"
)

// sparseFile creates a sparse file of size in dir and opens it as a
// backend, closed when the test ends.
func sparseFile(t *testing.T, dir string, size int64) (string, *FileBackend) {
	t.Helper()
	path := filepath.Join(dir, "served.img")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(size)
	f.Close()
	b, err := OpenFile(path, FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return path, b
}

// serveFileTLS exports a sparse file over TLS (required) and returns its
// path, the server's address and the nbds URI with the client
// certificate directory.
func serveFileTLS(t *testing.T, p *testPKI, dir string, size int64) (path, addr, uri string) {
	t.Helper()
	path, b := sparseFile(t, dir, size)
	_, addr = startTLSServer(t, p.server, false, Export{Name: testName, Description: "rialto test", Backend: b})
	return path, addr, URI{Network: "tcp", Address: addr, Export: testName, TLS: true, TLSCertificates: p.clientDir}.String()
}

func TestInteropTLSNbdinfo(t *testing.T) {
	need(t, "nbdinfo")
	p := newTestPKI(t)
	_, addr, uri := serveFileTLS(t, p, t.TempDir(), 64<<20)
	var info struct {
		TLS        bool `json:"TLS"`
		Structured bool `json:"structured"`
		Exports    []struct {
			Size     int64    `json:"export-size"`
			Contexts []string `json:"contexts"`
		} `json:"exports"`
	}
	out := run(t, "nbdinfo", "--json", uri)
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		t.Fatal(err)
	}
	if !info.TLS || !info.Structured || len(info.Exports) != 1 || info.Exports[0].Size != 64<<20 ||
		len(info.Exports[0].Contexts) != 1 {
		t.Fatalf("nbdinfo over TLS:\n%s", out)
	}
	// A directory with only the CA certificate is enough: the server does
	// not ask for a client certificate.
	caOnly := URI{Network: "tcp", Address: addr, Export: testName, TLS: true, TLSCertificates: p.caOnlyDir}.String()
	run(t, "nbdinfo", "--size", caOnly)

	plain := URI{Network: "tcp", Address: addr, Export: testName}.String()
	// This server has no pre-shared keys (Server.PSK: tls_psk_test.go).
	psk := filepath.Join(t.TempDir(), "keys.psk")
	os.WriteFile(psk, []byte("alice:0123456789abcdef0123456789abcdef\n"), 0o600)
	pskURI := "nbds://alice@" + addr + "/" + testName + "?tls-psk-file=" + psk
	wrongCA := URI{Network: "tcp", Address: addr, Export: testName, TLS: true, TLSCertificates: newTestPKI(t).clientDir}.String()
	for _, tc := range []struct{ name, uri, want string }{
		// libnbd sends its options in clear and is told
		// NBD_REP_ERR_TLS_REQD with the server's message (in its debug
		// output).
		{"plaintext", plain, "TLS is required"},
		{"wrong CA", wrongCA, "certificate verification"},
		{"pre-shared key", pskURI, "gnutls_handshake"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command("nbdinfo", tc.uri)
			cmd.Env = append(os.Environ(), "LIBNBD_DEBUG=1")
			out, err := cmd.CombinedOutput()
			if err == nil || !strings.Contains(string(out), tc.want) || strings.Contains(string(out), "export-size") {
				t.Fatalf("nbdinfo %s: err %v\n%s", tc.name, err, out)
			}
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			t.Logf("refused: %s", lines[len(lines)-1])
		})
	}
}

// TestInteropTLSNbdinfoExpired: libnbd refuses a server certificate that
// expired, and accepts one issued the same way that has not.
func TestInteropTLSNbdinfoExpired(t *testing.T) {
	need(t, "nbdinfo")
	p := newTestPKI(t)
	serve := func(shift time.Duration) string {
		ca, err := pki.Load(p.ca.Dir(), pki.Options{Now: func() time.Time { return time.Now().Add(shift) }})
		if err != nil {
			t.Fatal(err)
		}
		iss, err := ca.Issue(pki.Request{CommonName: "nbd-server", Hosts: []string{"127.0.0.1"}, Usage: pki.ServerAuth, Lifetime: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		c, err := iss.TLSCertificate()
		if err != nil {
			t.Fatal(err)
		}
		_, addr := startTLSServer(t, &tls.Config{Certificates: []tls.Certificate{c}}, false, Export{Name: testName, Backend: NewMemBackend(1 << 20)})
		return URI{Network: "tcp", Address: addr, Export: testName, TLS: true, TLSCertificates: p.clientDir}.String()
	}
	run(t, "nbdinfo", "--size", serve(0))
	// GnuTLS says only that verification failed; the control above
	// differs in nothing but the certificate's validity period.
	out, err := exec.Command("nbdinfo", "--size", serve(-2*time.Hour)).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "certificate verification") {
		t.Fatalf("nbdinfo with an expired server certificate: err %v\n%s", err, out)
	}
	t.Logf("refused: %s", bytes.TrimSpace(out))
}

// TestInteropTLSNbdcopy round-trips 64 MiB through nbdcopy over TLS (with
// several connections, as CAN_MULTI_CONN allows). The file is on tmpfs, so
// the connections' readers decrypt nbdcopy's large writes straight into
// the file's mapping.
func TestInteropTLSNbdcopy(t *testing.T) {
	need(t, "nbdcopy")
	const size = 64 << 20
	dir := fastDir(t)
	_, _, uri := serveFileTLS(t, p(t), dir, size)
	src := filepath.Join(dir, "src.img")
	dst := filepath.Join(dir, "dst.img")
	want := writeRandom(t, src, size)
	w0 := tlsMappedWrites.Load()
	run(t, "nbdcopy", src, uri)
	if tlsMappedWrites.Load() == w0 {
		t.Error("no write over TLS was decrypted into the file's mapping")
	}
	run(t, "nbdcopy", uri, dst)
	if got := fileSum(t, dst); got != want {
		t.Fatal("nbdcopy round trip over TLS: checksums differ")
	}
}

func p(t *testing.T) *testPKI { return newTestPKI(t) }

// TestInteropTLSQemu: qemu-img and qemu-io with a tls-creds-x509 object
// (qemu checks the certificates' key usage and purposes itself).
func TestInteropTLSQemu(t *testing.T) {
	need(t, "qemu-img", "qemu-io")
	pk := newTestPKI(t)
	dir := fastDir(t)
	const size = 16 << 20
	served, addr, _ := serveFileTLS(t, pk, dir, size)
	host, port, _ := net.SplitHostPort(addr)
	obj := "tls-creds-x509,id=tls0,endpoint=client,dir=" + pk.clientDir
	image := func(export string) string {
		return fmt.Sprintf(`json:{"driver":"raw","file":{"driver":"nbd","server":{"type":"inet","host":%q,"port":%q},"export":%q,"tls-creds":"tls0"}}`,
			host, port, export)
	}
	src := filepath.Join(dir, "src.img")
	writeRandom(t, src, size)
	run(t, "qemu-img", "convert", "-n", "--object", obj, "-f", "raw", "--target-image-opts", src,
		"driver=raw,file.driver=nbd,file.server.type=inet,file.server.host="+host+",file.server.port="+port+
			",file.export="+testName+",file.tls-creds=tls0")
	out := run(t, "qemu-img", "compare", "--object", obj, "-f", "raw", src, image(testName))
	if !strings.Contains(out, "identical") {
		t.Fatalf("qemu-img compare: %s", out)
	}
	out = run(t, "qemu-io", "--object", obj,
		"-c", "write -P 0xa5 0 1M", "-c", "read -P 0xa5 0 1M", "-c", "flush", image(testName))
	if strings.Contains(out, "failed") || strings.Contains(out, "error") {
		t.Fatalf("qemu-io:\n%s", out)
	}
	raw, _ := os.ReadFile(served)
	if !bytes.Equal(raw[:1<<20], bytes.Repeat([]byte{0xa5}, 1<<20)) {
		t.Fatal("qemu-io write over TLS not in the served file")
	}
	// Without tls-creds qemu meets NBD_REP_ERR_TLS_REQD.
	plain := fmt.Sprintf(`json:{"driver":"raw","file":{"driver":"nbd","server":{"type":"inet","host":%q,"port":%q},"export":%q}}`, host, port, testName)
	if out, err := exec.Command("qemu-img", "info", plain).CombinedOutput(); err == nil || !strings.Contains(string(out), "TLS") {
		t.Fatalf("qemu-img in plaintext: err %v\n%s", err, out)
	}
	// With another CA's certificates qemu refuses the server.
	wrong := "tls-creds-x509,id=tls0,endpoint=client,dir=" + newTestPKI(t).clientDir
	if out, err := exec.Command("qemu-img", "info", "--object", wrong, image(testName)).CombinedOutput(); err == nil {
		t.Fatalf("qemu-img with the wrong CA succeeded:\n%s", out)
	} else {
		t.Logf("refused: %s", bytes.TrimSpace(out))
	}
}

// TestInteropTLSFio: fio's nbd engine does not let libnbd read files named
// in the URI (tls-certificates), so the certificates go where libnbd looks
// by default, $HOME/.pki/libnbd.
func TestInteropTLSFio(t *testing.T) {
	need(t, "fio")
	pk := newTestPKI(t)
	_, addr, _ := serveFileTLS(t, pk, fastDir(t), 16<<20)
	home := t.TempDir()
	cl, err := pk.ca.Issue(pki.Request{CommonName: "borrower", Usage: pki.ClientAuth})
	if err != nil {
		t.Fatal(err)
	}
	if err := pki.WriteFiles(filepath.Join(home, ".pki", "libnbd"), "client", pk.ca.CertPEM(), cl.CertPEM, cl.KeyPEM); err != nil {
		t.Fatal(err)
	}
	uri := URI{Network: "tcp", Address: addr, Export: testName, TLS: true}.String()
	cmd := exec.Command("fio", "--name=verify", "--ioengine=nbd", "--uri="+uri, "--rw=randwrite", "--bs=4k",
		"--size=16M", "--iodepth=16", "--verify=crc32c", "--do_verify=1", "--verify_fatal=1", "--verify_state_save=0")
	cmd.Env = append(os.Environ(), "HOME="+home)
	b, err := cmd.CombinedOutput()
	out := string(b)
	if err != nil || !strings.Contains(out, "verify") || strings.Contains(out, "err=") && !strings.Contains(out, "err= 0") {
		t.Fatalf("fio: %v\n%s", err, out)
	}
}
