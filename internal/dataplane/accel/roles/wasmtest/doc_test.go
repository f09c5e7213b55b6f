package wasmtest

import (
	"bytes"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDocEchoModule: the echo module docs/accelerators.md gives users in
// base64, to try the wasm role without a toolchain, is EchoModule's bytes.
func TestDocEchoModule(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "..", "..", "..", "docs", "accelerators.md"))
	if err != nil {
		t.Fatal(err)
	}
	const start, end = "base64 -d > echo.wasm <<'B64'\n", "\nB64\n"
	s := string(doc)
	i := strings.Index(s, start)
	if i < 0 {
		t.Fatalf("docs/accelerators.md has no %q", start)
	}
	s = s[i+len(start):]
	j := strings.Index(s, end)
	if j < 0 {
		t.Fatalf("docs/accelerators.md: the echo module's base64 has no end %q", end)
	}
	got, err := base64.StdEncoding.DecodeString(strings.ReplaceAll(s[:j], "\n", ""))
	if err != nil {
		t.Fatalf("the echo module's base64 in docs/accelerators.md: %v", err)
	}
	if want := EchoModule(); !bytes.Equal(got, want) {
		t.Fatalf("docs/accelerators.md's echo.wasm (%d bytes) is not EchoModule (%d bytes): regenerate it with base64 -w 76", len(got), len(want))
	}
}
