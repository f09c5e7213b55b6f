package tlspsk

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

const (
	testIdentity = "alice"
	testKeyHex   = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
)

func testKeys(t *testing.T) *Keys {
	t.Helper()
	k, err := ParseKeys([]byte("bob:00112233445566778899aabbccddeeff\n" + testIdentity + ":" + testKeyHex + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// echoServer accepts one connection, runs the handshake and echoes each
// line it reads as "echo: LINE" until EOF. The handshake's or the
// session's error comes on the channel.
func echoServer(t *testing.T, keys *Keys) (string, <-chan error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	done := make(chan error, 1)
	go func() {
		defer cancel()
		defer ln.Close()
		nc, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		defer nc.Close()
		c, err := Handshake(ctx, nc, keys)
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		r := bufio.NewReader(c)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				if errors.Is(err, io.EOF) {
					err = nil
				}
				done <- err
				return
			}
			if _, err := c.Write([]byte("echo: " + line)); err != nil {
				done <- err
				return
			}
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().String(), done
}

// talk runs a client command: it sends "ping\n", waits for the echo on
// the command's output, then closes its input. It returns the output.
func talk(t *testing.T, name string, args ...string) (string, error) {
	return converse(t, []string{"ping"}, name, args...)
}

// converse sends each line and waits for the answer on the command's
// output (stdout and stderr): "echo: LINE", or for a one-letter command
// of openssl's s_client (K, k: a key update), its "KEYUPDATE"; then it
// closes the command's input. One line at a time: s_client takes a whole
// read of its input as one command.
func converse(t *testing.T, lines []string, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	want := func() string {
		if len(lines[0]) == 1 {
			return "KEYUPDATE"
		}
		return "echo: " + lines[0]
	}
	io.WriteString(in, lines[0]+"\n")
	var got strings.Builder
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		got.WriteString(sc.Text() + "\n")
		if len(lines) > 0 && strings.Contains(sc.Text(), want()) {
			lines = lines[1:]
			if len(lines) == 0 {
				in.Close()
			} else {
				io.WriteString(in, lines[0]+"\n")
			}
		}
	}
	in.Close()
	err = cmd.Wait()
	return got.String(), err
}

func need(t *testing.T, tool string) {
	t.Helper()
	if _, err := exec.LookPath(tool); err != nil {
		t.Skipf("%s not installed", tool)
	}
}

func TestGnuTLSClient(t *testing.T) {
	need(t, "gnutls-cli")
	for _, prio := range []string{
		"NORMAL:-VERS-ALL:+VERS-TLS1.3:+ECDHE-PSK:+PSK",
		"NORMAL:-VERS-ALL:+VERS-TLS1.3:+ECDHE-PSK:+PSK:-CIPHER-ALL:+CHACHA20-POLY1305",
		"NORMAL:-VERS-ALL:+VERS-TLS1.3:+ECDHE-PSK:+PSK:-GROUP-ALL:+GROUP-SECP256R1",
		"NORMAL:+ECDHE-PSK:+DHE-PSK:+PSK", // libnbd's
	} {
		t.Run(prio, func(t *testing.T) {
			addr, done := echoServer(t, testKeys(t))
			host, port, _ := net.SplitHostPort(addr)
			out, err := talk(t, "gnutls-cli", "--priority", prio, "--pskusername", testIdentity, "--pskkey", testKeyHex, "-p", port, host)
			if err := <-done; err != nil {
				t.Fatalf("server: %v\nclient: %s", err, out)
			}
			// gnutls-cli reports the server's close_notify (after its own
			// at the end of its input) as an error: the echo is the test.
			if !strings.Contains(out, "echo: ping") || !strings.Contains(out, "PSK authentication. Connected as '"+testIdentity+"'") {
				t.Fatalf("client: %v\n%s", err, out)
			}
		})
	}
}

func TestOpenSSLClient(t *testing.T) {
	need(t, "openssl")
	for _, extra := range [][]string{
		{"-ciphersuites", "TLS_AES_128_GCM_SHA256"},
		{"-ciphersuites", "TLS_CHACHA20_POLY1305_SHA256"},
		{"-groups", "ffdhe2048:X25519", "-msg"}, // a HelloRetryRequest for X25519
		{"-groups", "P-256"},
	} {
		t.Run(strings.Join(extra, " "), func(t *testing.T) {
			addr, done := echoServer(t, testKeys(t))
			args := append([]string{"s_client", "-quiet", "-no_ign_eof", "-tls1_3", "-connect", addr, "-psk_identity", testIdentity, "-psk", testKeyHex}, extra...)
			out, err := talk(t, "openssl", args...)
			if err := <-done; err != nil {
				t.Fatalf("server: %v\nclient: %s", err, out)
			}
			if err != nil || !strings.Contains(out, "echo: ping") {
				t.Fatalf("client: %v\n%s", err, out)
			}
			// openssl -msg calls the retry request a ServerHello too.
			if slices.Contains(extra, "-msg") && strings.Count(out, "ServerHello") != 2 {
				t.Fatalf("no HelloRetryRequest:\n%s", out)
			}
		})
	}
}

// TestPeekHello: the recorded hellos offer "alice"; not to a server
// without that identity.
func TestPeekHello(t *testing.T) {
	keys := testKeys(t)
	other, _ := ParseKeys([]byte("bob:00112233445566778899aabbccddeeff"))
	for i, h := range seedHelloHex {
		b, _ := hex.DecodeString(h)
		r := bytes.NewReader(append(b, "after"...))
		read, psk, err := PeekHello(r, keys)
		if err != nil || !psk || !bytes.Equal(read, b) || r.Len() != len("after") {
			t.Errorf("hello %d: psk %v, err %v, read %d of %d", i, psk, err, len(read), len(b))
		}
		if _, psk, _ := PeekHello(bytes.NewReader(b), other); psk {
			t.Errorf("hello %d offers an identity of another key set", i)
		}
		if _, psk, _ := PeekHello(bytes.NewReader(b), nil); psk {
			t.Errorf("hello %d: psk with no keys", i)
		}
	}
}

// TestKeyUpdate: openssl's "K" command sends a KeyUpdate asking for the
// server's; "k" one that does not. The session goes on under the new keys
// both ways. Then the server updates its own keys every two records.
func TestKeyUpdate(t *testing.T) {
	need(t, "openssl")
	args := func(addr string) []string {
		return []string{"s_client", "-quiet", "-no_ign_eof", "-tls1_3", "-connect", addr, "-psk_identity", testIdentity, "-psk", testKeyHex}
	}
	addr, done := echoServer(t, testKeys(t))
	out, err := converse(t, []string{"ping", "K", "pong", "k", "again", "K", "last"}, "openssl", args(addr)...)
	if serr := <-done; serr != nil || err != nil || !strings.Contains(out, "echo: last") {
		t.Fatalf("server: %v; client: %v\n%s", serr, err, out)
	}
	keyUpdateAfter = 2
	defer func() { keyUpdateAfter = 1 << 24 }()
	addr, done = echoServer(t, testKeys(t))
	out, err = converse(t, []string{"a1", "a2", "a3", "a4", "a5"}, "openssl", args(addr)...)
	if serr := <-done; serr != nil || err != nil || !strings.Contains(out, "echo: a5") {
		t.Fatalf("server: %v; client: %v\n%s", serr, err, out)
	}
}
