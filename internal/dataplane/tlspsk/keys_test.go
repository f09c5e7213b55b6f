package tlspsk

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseKeys(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string // in the error; "" for none
	}{
		{"alice:00ff\n\nbob:0102\r\n", 2, ""},
		{"", 0, ""},
		{"alice\n", 0, "line 1: not identity:hexkey"},
		{":00ff\n", 0, "line 1: the identity is empty"},
		{"alice:zz\n", 0, "line 1: the key is not hexadecimal"},
		{"alice:\n", 0, "line 1: the key is not hexadecimal"},
		{"alice:00\nalice:01\n", 0, "line 2: an identity given twice"},
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
		if err != nil && strings.Contains(err.Error(), "zz") {
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
