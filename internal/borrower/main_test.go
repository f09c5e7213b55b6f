package borrower

import (
	"os"
	"testing"

	"github.com/rialto-project/rialto/internal/dataplane/memory/mapping"
	"github.com/rialto-project/rialto/internal/dataplane/memory/memorytest"
)

// A mapping's fault handler and a donor in a child process (which a
// mapping under test needs) are this test binary re-executed.
func TestMain(m *testing.M) {
	mapping.RunFaultHandlerIfChild()
	memorytest.RunChildIfAsked()
	os.Exit(m.Run())
}
