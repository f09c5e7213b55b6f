package nic

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
)

// TestNftGetsNoSecretEnv: nft, run by a program that keeps RIALTO_TOKEN in
// its environment (only rialto's main takes it out), does not inherit it.
// The nft first on PATH is a script that records its own environment.
func TestNftGetsNoSecretEnv(t *testing.T) {
	dir := t.TempDir()
	record := filepath.Join(dir, "nft.env")
	script := "#!/bin/sh\ntr '\\0' '\\n' < /proc/$$/environ > " + record + "\ncat > /dev/null\n"
	if err := os.WriteFile(filepath.Join(dir, "nft"), []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+":"+os.Getenv("PATH"))
	t.Setenv("RIALTO_TOKEN", "rat_nft-child-env-0123456789")
	if err := nft(context.Background(), "list tables\n"); err != nil {
		t.Fatal(err)
	}
	env, err := os.ReadFile(record)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(env, []byte("\nPATH="+dir+":")) && !bytes.HasPrefix(env, []byte("PATH="+dir+":")) {
		t.Fatalf("the recorded environment is not nft's (no PATH starting with %s):\n%s", dir, env)
	}
	if bytes.Contains(env, []byte("RIALTO_TOKEN")) || bytes.Contains(env, []byte("rat_nft-child-env")) {
		t.Errorf("nft inherited RIALTO_TOKEN:\n%s", env)
	}
}
