package testcluster

import (
	"os"
	"testing"

	"github.com/rialto-project/rialto/internal/dataplane/memory/mapping"
)

// A mapping's fault handler (TestMoveMemoryLeaseMapping) is this test
// binary re-executed.
func TestMain(m *testing.M) {
	mapping.RunFaultHandlerIfChild()
	os.Exit(m.Run())
}
