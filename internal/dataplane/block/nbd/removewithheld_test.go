package nbd

import (
	"bytes"
	"fmt"
	"os"
	"testing"
)

// TestTeardownWithheldMappedPayload: a write whose payload is being read
// straight into a tmpfs file's mapping (in plaintext with read(2), over
// TLS decrypted into it) while the client withholds the rest, and the
// export is torn down as the agent tears a lease down: RemoveExport, the
// backend closed, the range wiped through a backend of its own. The write
// is never answered and the rest of its payload, sent then, never lands:
// the range reads as zeroes to the next tenant. The write holds the
// mapping (not the descriptor) while its payload arrives; RemoveExport
// returns only once the connection's reader, which reads into the
// mapping, has stopped.
func TestTeardownWithheldMappedPayload(t *testing.T) {
	for _, useTLS := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", useTLS), func(t *testing.T) {
			w := startWithheld(t, useTLS, &Server{})
			path := w.b.f.Name()
			if !memoryBacked(t, path) {
				t.Skip("no tmpfs: writes are not read into a mapping")
			}
			if err := w.s.RemoveExport(testName); err != nil {
				t.Fatal(err)
			}
			if err := w.b.Close(); err != nil {
				t.Fatal(err)
			}
			wipe, err := OpenFile(path, FileOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if err := wipe.WriteZeroes(0, withheldSize, false); err != nil {
				t.Fatal(err)
			}
			if err := wipe.Close(); err != nil {
				t.Fatal(err)
			}
			w.rc.c.Write(w.payload[withheldSent:])
			if r, err := w.rc.reply(0); err == nil {
				t.Fatalf("the withheld write was answered: %+v", r)
			}
			raw, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(raw, make([]byte, withheldSize)) {
				t.Fatal("the torn-down tenant's payload landed after the wipe")
			}
		})
	}
}
