package mapping

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/internal/dataplane/memory/client"
	"github.com/rialto-project/rialto/internal/dataplane/memory/memorytest"
)

// TestMappingOverTLS: with a session over TLS, the fault handler process
// runs its own TLS session to the donor (pinning the key the session
// verified) from a handoff on its control socket: faults fetch and write
// back the right bytes, and the lease credential is in neither the
// handler's command line nor its environment.
func TestMappingOverTLS(t *testing.T) {
	const size = 2 << 20
	ca := memorytest.NewCA(t)
	_, addr := memorytest.StartChildTLS(t, ca, size)
	c := dial(t, addr, client.Options{TLS: memorytest.ClientTLS(t, ca)})
	ctx := context.Background()
	shadow := make([]byte, size)
	_, _ = rand.NewChaCha8([32]byte{9}).Read(shadow)
	if err := c.Write(ctx, client.ChannelBulk, shadow, 0); err != nil {
		t.Fatal(err)
	}
	m := mapOrSkip(t, c, Options{CacheBytes: size / 8})
	b := m.Bytes()
	if !bytes.Equal(b, shadow) {
		t.Fatal("mapped bytes differ")
	}
	for i := 0; i < size; i += 4096 {
		b[i] ^= 0xff
		shadow[i] ^= 0xff
	}
	pid := m.cmd.Process.Pid
	for _, f := range []string{"cmdline", "environ"} {
		got, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/" + f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(got), memorytest.Credential) {
			t.Errorf("the fault handler's %s holds the lease credential", f)
		}
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, size)
	if err := c.Read(ctx, client.ChannelBulk, got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, shadow) {
		t.Fatal("the donor does not hold the written-back pages")
	}
}
