package roles

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/accel/roles/wasmtest"
	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// boundRuntime is a runtime as a role's (newWasm), with a small memory
// limit: what the property tests compile modules with.
func boundRuntime(ctx context.Context) wazero.Runtime {
	return wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfig().
		WithMemoryLimitPages(64).WithCloseOnContextDone(true))
}

// mayGrowTables reports whether module m may hold a table.grow (its
// opcode's bytes, 0xfc 0x0f, anywhere): a module whose calls the fuzz
// target does not compare (a table grown past the bound differs, as it
// should, and unbounded takes the memory the bound is there for).
func mayGrowTables(m []byte) bool { return bytes.Contains(m, []byte{0xfc, 0x0f}) }

// withoutCustom is module m without its custom sections (nil if its
// sections do not add up).
func withoutCustom(m []byte) []byte {
	if len(m) < 8 {
		return nil
	}
	out := append([]byte(nil), m[:8]...)
	for b := m[8:]; len(b) > 0; {
		size, n := uleb(b[1:])
		if n == 0 || uint64(size) > uint64(len(b)-1-n) {
			return nil
		}
		if b[0] != secCustom {
			out = append(out, b[:1+n+int(size)]...)
		}
		b = b[1+n+int(size):]
	}
	return out
}

// firstLine is an error's first line: a trap's message without the
// stack trace, which names functions from the name section (that
// checkModule drops).
func firstLine(err error) string {
	if err == nil {
		return ""
	}
	s, _, _ := strings.Cut(err.Error(), "\n")
	return s
}

// sameResults reports whether a call's results a and b, of types ts,
// are the same: references (an instance's addresses) the same if both
// are null or neither is.
func sameResults(ts []api.ValueType, a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		switch ts[min(i, len(ts)-1)] {
		case api.ValueTypeI32, api.ValueTypeI64, api.ValueTypeF32, api.ValueTypeF64, 0x7b: // 0x7b: v128
			if a[i] != b[i] {
				return false
			}
		default: // a reference
			if (a[i] == 0) != (b[i] == 0) {
				return false
			}
		}
	}
	return true
}

// outcome is what sameModule found of a module.
type outcome struct {
	compiled     bool // the runtime compiled it
	accepted     bool // and checkModule accepted it
	instantiated bool // and it instantiated
}

// sameModule checks checkModule's promise on module m: a module the
// runtime compiles is refused only as a bad module (ErrBadModule), or
// comes back as a module the runtime compiles too, with the same
// exports, that instantiates (or fails to) as m does and, if calls is
// set, gives the same results: each exported function called in turn
// (in the order of their names) with every argument 0, then 1, the same
// results or traps, and the same memories after. What checkModule makes
// of a module differs from it in its tables' maximums and its custom
// sections only, so calls that grow no table past its share of
// MaxWasmTableEntries give the same results.
//
// An untrusted m (the fuzz target's) is given to the runtime only once
// checkModule accepted it, without its custom sections: the runtime
// allocates by the counts a module claims, and a module the check
// refuses, or a custom section's claims, could take the memory of the
// machine.
func sameModule(t *testing.T, m []byte, calls, trusted bool) outcome {
	t.Helper()
	ctx := context.Background()
	bounded, cerr := checkModule(m)
	if cerr != nil && !errors.Is(cerr, ErrBadModule) {
		t.Fatalf("checkModule: %v, not a bad module", cerr)
	}
	if !trusted {
		if m = withoutCustom(m); cerr != nil || m == nil {
			return outcome{}
		}
	}
	rtA, rtB := boundRuntime(ctx), boundRuntime(ctx)
	defer rtA.Close(ctx)
	defer rtB.Close(ctx)
	cmA, err := rtA.CompileModule(ctx, m)
	if err != nil {
		return outcome{}
	}
	if cerr != nil {
		return outcome{compiled: true}
	}
	o := outcome{compiled: true, accepted: true}
	cmB, err := rtB.CompileModule(ctx, bounded)
	if err != nil {
		t.Fatalf("the runtime compiles the module, not what checkModule made of it: %v", err)
	}
	fa, fb := cmA.ExportedFunctions(), cmB.ExportedFunctions()
	names := make([]string, 0, len(fa))
	for n, d := range fa {
		e, ok := fb[n]
		if !ok || !slices.Equal(d.ParamTypes(), e.ParamTypes()) || !slices.Equal(d.ResultTypes(), e.ResultTypes()) {
			t.Fatalf("export %q: %v -> %v, after checkModule %v", n, d.ParamTypes(), d.ResultTypes(), e)
		}
		names = append(names, n)
	}
	if len(fb) != len(fa) {
		t.Fatalf("%d exported functions, %d after checkModule", len(fa), len(fb))
	}
	slices.Sort(names)
	memories := func(cm wazero.CompiledModule) []string {
		var ns []string
		for n := range cm.ExportedMemories() {
			ns = append(ns, n)
		}
		slices.Sort(ns)
		return ns
	}
	if !slices.Equal(memories(cmA), memories(cmB)) {
		t.Fatalf("exported memories %q, after checkModule %q", memories(cmA), memories(cmB))
	}
	ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	a, errA := rtA.InstantiateModule(ictx, cmA, wazero.NewModuleConfig().WithName(""))
	b, errB := rtB.InstantiateModule(ictx, cmB, wazero.NewModuleConfig().WithName(""))
	if ictx.Err() != nil {
		return o // a start function that did not end
	}
	// Both fail, not always with the same message: of several imports
	// missing, the runtime names one.
	if (errA == nil) != (errB == nil) {
		t.Fatalf("instantiation: %v; after checkModule: %v", errA, errB)
	}
	if errA != nil {
		return o
	}
	o.instantiated = true
	if !calls {
		return o
	}
	for _, arg := range []uint64{0, 1} {
		for _, n := range names {
			args := make([]uint64, len(fa[n].ParamTypes()))
			for i := range args {
				args[i] = arg
			}
			cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			ra, errA := a.ExportedFunction(n).Call(cctx, args...)
			rb, errB := b.ExportedFunction(n).Call(cctx, args...)
			expired := cctx.Err() != nil
			cancel()
			if expired {
				return o // a call that did not end: the instances are closed
			}
			if firstLine(errA) != firstLine(errB) || !sameResults(fa[n].ResultTypes(), ra, rb) {
				t.Fatalf("%s(%v): %v %v; after checkModule: %v %v", n, args, ra, errA, rb, errB)
			}
		}
	}
	for _, n := range memories(cmA) {
		ma, mb := a.ExportedMemory(n), b.ExportedMemory(n)
		da, _ := ma.Read(0, ma.Size())
		db, _ := mb.Read(0, mb.Size())
		if !bytes.Equal(da, db) {
			t.Fatalf("memory %q differs after the calls", n)
		}
	}
	return o
}

// TestCheckModuleKeepsModules: what checkModule makes of the test
// modules (the roles', and modules using tables every way a module can:
// wasmtest.TablesModule) compiles, instantiates and runs as they do,
// table.grow within the tables' bound included; a module importing a
// table fails to instantiate either way. TablesModule's calls give what
// it documents, after checkModule.
func TestCheckModuleKeepsModules(t *testing.T) {
	for name, tc := range map[string]struct {
		m            []byte
		instantiates bool
	}{
		"echo":                 {wasmtest.EchoModule(), true},
		"dump":                 {wasmtest.DumpModule(), true},
		"work":                 {wasmtest.WorkModule(), true},
		"memory":               {wasmtest.MemoryModule(3), true},
		"table":                {wasmtest.TableModule(0), true},
		"tables":               {wasmtest.TableModule(5, 1<<19, 0), true},
		"table with a maximum": {wasmtest.TableModuleOf([]byte{0x70, 1, 1, 3}), true},
		"tables every way":     {wasmtest.TablesModule(), true},
		"an imported table":    {wasmtest.ImportedTableModule(), false},
		"an imported function": {wasmtest.ImportingModule(), false},
	} {
		t.Run(name, func(t *testing.T) {
			o := sameModule(t, tc.m, true, true)
			if !o.accepted || o.instantiated != tc.instantiates {
				t.Fatalf("%+v, want it accepted, and instantiated: %v", o, tc.instantiates)
			}
		})
	}

	ctx := context.Background()
	m, err := checkModule(wasmtest.TablesModule())
	if err != nil {
		t.Fatal(err)
	}
	rt := boundRuntime(ctx)
	defer rt.Close(ctx)
	mod, err := rt.Instantiate(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		fn   string
		args []uint64
		want uint32
	}{
		{"call0", []uint64{1}, 22}, {"sizes", nil, 4 + 200}, {"grow2", []uint64{3}, 0}, {"sizes", nil, 4 + 200 + 30000},
		{"init", nil, 33}, {"copy", nil, 11}, {"fill", nil, 1}, {"mem", nil, 'w'}, {"peek", []uint64{1}, 'e'}, {"peek", []uint64{64}, 42},
	} {
		r, err := mod.ExportedFunction(c.fn).Call(ctx, c.args...)
		if err != nil || uint32(r[0]) != c.want {
			t.Errorf("%s%v: %v %v, want %d", c.fn, c.args, r, err, c.want)
		}
	}
}

// TestCheckModuleSpecModules runs sameModule on the WebAssembly
// specification's test modules, as the runtime's module ships them
// (internal/integration_test/spectest: the core specification 1.0 and
// 2.0, and proposals'), thousands of modules using every construct of
// the binary format, calls included: none that the runtime compiles is
// refused, and what checkModule makes of each compiles, instantiates
// and runs as it does. The check refused the (ref null func) forms of
// the function-references proposal, which the runtime reads.
func TestCheckModuleSpecModules(t *testing.T) {
	if testing.Short() {
		t.Skip("thousands of modules")
	}
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/tetratelabs/wazero").Output()
	if err != nil {
		t.Skipf("the runtime's module: %v", err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "internal", "integration_test", "spectest")
	files, err := filepath.Glob(filepath.Join(dir, "*", "testdata", "*.wasm"))
	if err != nil || len(files) == 0 {
		t.Skipf("no specification test modules in %s: %v", dir, err)
	}
	compiled, accepted := 0, 0
	for _, f := range files {
		m, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Run(strings.TrimPrefix(f, dir), func(t *testing.T) {
			o := sameModule(t, m, true, true)
			if o.compiled && !o.accepted {
				_, err := checkModule(m)
				t.Fatalf("the runtime compiles it; checkModule refuses it: %v", err)
			}
			if o.compiled {
				compiled++
			}
			if o.accepted {
				accepted++
			}
		})
	}
	t.Logf("%d modules, %d compiled and accepted", len(files), accepted)
	if accepted < 1000 {
		t.Fatalf("only %d of %d modules compiled", accepted, len(files))
	}
}

// FuzzCheckModuleKeepsModules runs sameModule on arbitrary modules
// (their calls compared unless they may grow a table).
func FuzzCheckModuleKeepsModules(f *testing.F) {
	for _, m := range [][]byte{wasmtest.EchoModule(), wasmtest.WorkModule(), wasmtest.TableModule(0, 2),
		wasmtest.TableModuleOf([]byte{0x70, 1, 1, 3}), wasmtest.TablesModule(), wasmtest.ImportedTableModule()} {
		f.Add(m)
	}
	f.Fuzz(func(t *testing.T, m []byte) {
		sameModule(t, m, !mayGrowTables(m), false)
	})
}
