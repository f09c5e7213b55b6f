package appliance

import (
	"context"
	"encoding/binary"
	"errors"
	"runtime"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/internal/dataplane/accel"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles/wasmtest"
)

// A tenant's Wasm module that grows its table (table.grow) at run time
// does not take the appliance's memory: past roles.MaxWasmTableEntries
// entries (8 MiB) the growth fails, the module traps, the task fails as
// the role's failure, and the next task on the same slot runs. (Asked
// for 2²³ entries, the runtime grew the table to them, 64 MiB for one
// task; roles' TestWasmTableGrowth grows one without end.)
func TestWasmTableGrowthOnSlot(t *testing.T) {
	a := start(t, Config{Slots: 1, SlotMemory: 1 << 16})
	ctx := context.Background()
	if err := a.Load(ctx, 0, roles.Spec{Name: "wasm", Module: wasmtest.TableModule(0)}); err != nil {
		t.Fatal(err)
	}
	c := leaseSlot(t, a, 0, "")
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	out, err := c.Call(ctx, "grow", wasmtest.TableGrowInput(1<<23))
	runtime.ReadMemStats(&after)
	if !errors.Is(err, accel.ErrRoleFailed) || !strings.Contains(err.Error(), "unreachable") {
		t.Fatalf("growing the table to 2²³ entries: %x %v, want the role failed, with the trap of the module when table.grow failed", out, err)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 64<<20 {
		t.Errorf("growing the table allocated %d MiB", got>>20)
	}
	if out, err := c.Call(ctx, "echo", []byte("next")); err != nil || string(out) != "next" {
		t.Fatalf("the slot's next task: %q %v", out, err)
	}
	out, err = c.Call(ctx, "grow", wasmtest.TableGrowInput(roles.MaxWasmTableEntries))
	if err != nil || len(out) != 4 || binary.LittleEndian.Uint32(out) != roles.MaxWasmTableEntries {
		t.Fatalf("growing the table to its bound: %x %v", out, err)
	}
}
