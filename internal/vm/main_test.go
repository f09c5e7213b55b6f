package vm

import (
	"testing"

	"github.com/rialto-project/rialto/internal/uptest"
)

// TestMain removes the rialto binary the rack test builds.
func TestMain(m *testing.M) { uptest.Main(m) }
