package tlspsk

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// k16 is a key of the shortest length taken (16 bytes).
const k16 = "00112233445566778899aabbccddeeff"

func TestParseKeys(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string // in the error; "" for none
	}{
		{"alice:" + k16 + "\n\nbob:" + k16 + "\r\n", 2, ""},
		{"", 0, ""},
		{"ALICE:" + strings.ToUpper(k16) + "\nalice:" + k16 + "\n", 2, ""}, // hex of either case; identities are bytes
		{"\u00e9l\u00e8ve:" + k16 + "\n", 1, ""},
		{"alice\n", 0, "line 1: not identity:hexkey"},
		{":" + k16 + "\n", 0, "line 1: the identity is empty"},
		{"alice:zz\n", 0, "line 1: the key is not hexadecimal"},
		{"alice:\n", 0, "line 1: the key is not hexadecimal"},
		{"a:b:" + k16 + "\n", 0, "line 1: the key is not hexadecimal"}, // no ':' in an identity
		{"alice:" + k16 + "\nalice:" + k16 + "\n", 0, "line 2: an identity given twice"},
		// A short key is refused: one recorded handshake lets anyone
		// test guesses of it offline.
		{"alice:0badc0ffee\n", 0, "line 1: a key of 5 bytes; at least 16"},
		{"alice:" + k16[:30] + "\n", 0, "line 1: a key of 15 bytes"},
	} {
		k, err := ParseKeys([]byte(tc.in))
		if tc.want == "" {
			if err != nil || k.Len() != tc.n {
				t.Errorf("%q: %v, %d keys", tc.in, err, k.Len())
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrKeyFile) {
			t.Errorf("%q: %v, want %q", tc.in, err, tc.want)
		}
		if err != nil && (strings.Contains(err.Error(), "zz") || strings.Contains(err.Error(), "0badc0ffee") || strings.Contains(err.Error(), k16[:30])) {
			t.Errorf("the error shows the key: %v", err)
		}
	}
}

func TestLoadKeyFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "keys.psk")
	secret := "alice:" + testKeyHex + "\n"
	for _, tc := range []struct {
		mode os.FileMode
		body string
		want string
	}{
		{0o600, secret, ""},
		{0o400, secret, ""},
		{0o640, secret, "mode 0640 lets group or others in"},
		{0o604, secret, "mode 0604"},
		{0o600, "\n", "no keys"},
	} {
		os.Remove(path)
		if err := os.WriteFile(path, []byte(tc.body), tc.mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(path, tc.mode)
		k, err := LoadKeyFile(path)
		if tc.want == "" {
			if err != nil || k.Len() != 1 {
				t.Errorf("mode %o: %v", tc.mode, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("mode %o: %v, want %q", tc.mode, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), testKeyHex) {
			t.Errorf("the error shows the key: %v", err)
		}
	}
	if _, err := LoadKeyFile(dir); err == nil {
		t.Error("a directory was taken as a key file")
	}
	// A file over the size limit is refused, not read in part (which
	// could cut the last key short and take it).
	// (Cut at the limit, bob's key would lose 10 of its 64 digits.)
	big := bytes.Repeat([]byte(" "), maxKeyFile+11-70)
	big = append(big, "\nbob:"+testKeyHex+"\n"...)
	os.Remove(path)
	if err := os.WriteFile(path, big, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadKeyFile(path); err == nil || !strings.Contains(err.Error(), "over") || !errors.Is(err, ErrKeyFile) {
		t.Errorf("a key file of %d bytes: %v", len(big), err)
	}
}

// TestPsktoolFile: a file GnuTLS's psktool writes loads as it is.
func TestPsktoolFile(t *testing.T) {
	need(t, "psktool")
	path := filepath.Join(t.TempDir(), "keys.psk")
	for _, u := range []string{"alice", "bob"} {
		if out, err := exec.Command("psktool", "-u", u, "-p", path).CombinedOutput(); err != nil {
			t.Fatalf("psktool: %v\n%s", err, out)
		}
	}
	k, err := LoadKeyFile(path)
	if err != nil || k.Len() != 2 {
		t.Fatalf("psktool's file: %v, %d keys", err, k.Len())
	}
	if key, ok := k.lookup([]byte("alice")); !ok || len(key) != 32 {
		t.Fatalf("alice's key: %d bytes", len(key))
	}
}
