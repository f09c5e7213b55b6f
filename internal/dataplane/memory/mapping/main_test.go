package mapping

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/rialto-project/rialto/internal/dataplane/memory/client"
	"github.com/rialto-project/rialto/internal/dataplane/memory/memorytest"
)

// A mapping's fault handler, the donor the mapping tests need in another
// process (an in-process donor would need a scheduler P that the faulting
// goroutine holds) and TestMappingUnderGC's child are all this test binary
// re-executed.
func TestMain(m *testing.M) {
	RunFaultHandlerIfChild()
	memorytest.RunChildIfAsked()
	if addr := os.Getenv(gcChildEnv); addr != "" {
		if err := gcChild(addr); err != nil {
			fmt.Println("ERR", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func dial(t testing.TB, addr string, opts client.Options) *client.Client {
	t.Helper()
	c, err := client.Dial(context.Background(), addr, memorytest.Credential, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}
