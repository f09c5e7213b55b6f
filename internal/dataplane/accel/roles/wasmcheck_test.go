package roles

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/rialto-project/rialto/internal/dataplane/accel/roles/wasmtest"
	"github.com/tetratelabs/wazero"
)

// allocated is what f allocates, in bytes.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// inCappedChild runs test (this test) again in a child process, with env
// set, and reports whether the caller is that child: then its address
// space is capped at 4 GiB, so that what a module makes the runtime
// allocate fails the test instead of taking the machine's memory.
func inCappedChild(t *testing.T, test, env string) bool {
	t.Helper()
	if os.Getenv(env) == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
		cmd.Env = append(os.Environ(), env+"=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("running the modules in a child process: %v\n%.4000s", err, out)
		}
		return false
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_AS, &syscall.Rlimit{Cur: 4 << 30, Max: 4 << 30}); err != nil {
		t.Fatal(err)
	}
	return true
}

// TestWasmClaimedSizes: modules of a few bytes that declare vectors of
// 2²⁸ entries (globals, exports, functions, parameters, an element
// segment's functions, a data segment's bytes, an import's name), a
// function with 2³²−1 locals or a table of 2²⁷ entries are refused as
// bad modules without allocating what they claim: the runtime allocated
// from 256 MiB to 32 GiB for them (FuzzWasmModule's worker was killed).
// So are such claims after a construct of the function-references
// proposal (a (ref null func) parameter, global or local, a rec group)
// or a v128.const offset, which the runtime decodes and the check
// misread or stopped at, leaving what followed unchecked: 256 MiB to
// 6 GiB, and 32 GiB for the locals.
// The loads run in a child process whose address space is capped at
// 4 GiB, so that a regression fails the test instead of taking the
// machine's memory.
func TestWasmClaimedSizes(t *testing.T) {
	if !inCappedChild(t, "TestWasmClaimedSizes", "ROLES_TEST_CLAIMED_SIZES") {
		return
	}
	big := []byte{0x80, 0x80, 0x80, 0x80, 0x01} // 2²⁸
	hdr := []byte{0, 'a', 's', 'm', 1, 0, 0, 0}
	cat := func(bs ...[]byte) []byte {
		var o []byte
		for _, b := range bs {
			o = append(o, b...)
		}
		return o
	}
	sec := func(id byte, body ...[]byte) []byte {
		b := cat(body...)
		return append(binary.AppendUvarint([]byte{id}, uint64(len(b))), b...)
	}
	fn := cat(sec(1, []byte{1, 0x60, 0, 0}), sec(3, []byte{1, 0}))
	v128 := cat([]byte{0xfd, 0x0c}, make([]byte, 16), []byte{0x0b}) // v128.const 0
	refNullFunc := []byte{0x63, 0x70}                               // (ref null func), as the function-references proposal writes it
	for name, mod := range map[string][]byte{
		"globals":       cat(hdr, sec(6, big, []byte{0x7f})),
		"exports":       cat(hdr, sec(7, big, []byte{0})),
		"functions":     cat(hdr, sec(3, big, []byte{0})),
		"parameters":    cat(hdr, sec(1, []byte{1, 0x60}, big)),
		"element items": cat(hdr, sec(9, []byte{1, 0, 0x41, 0, 0x0b}, big)),
		"data bytes":    cat(hdr, sec(11, []byte{1, 0, 0x41, 0, 0x0b}, big)),
		"import name":   cat(hdr, sec(2, []byte{1}, big)),
		"locals":        cat(hdr, fn, sec(10, []byte{1, 8, 1, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x7f, 0x0b})),
		"table":         cat(hdr, sec(4, []byte{1, 0x70, 0, 0x80, 0x80, 0x80, 0x40})),
		"data count":    cat(hdr, sec(12, big)),
		"section size":  cat(hdr, []byte{1, 0xff, 0xff, 0xff, 0xff, 0x0f}),
		// Claims after a construct the check misread or did not read,
		// which the runtime decodes.
		"parameters after a (ref null func) parameter": cat(hdr, sec(1, []byte{2, 0x60, 1}, refNullFunc, []byte{0, 0x60}, big, make([]byte, 120))),
		"parameters after a rec group":                 cat(hdr, sec(1, []byte{2, 0x4e, 1, 0x60, 0, 0, 0x60}, big)),
		"import name after a (ref null func) global":   cat(hdr, sec(2, []byte{2, 1, 'a', 1, 'b', 0x03}, refNullFunc, []byte{0, 1, 'a'}, big)),
		"locals after a (ref null func) local": cat(hdr, fn, sec(10, []byte{1, 11, 2, 1}, refNullFunc,
			[]byte{0xfe, 0xff, 0xff, 0xff, 0x0f, 0x7f, 0x0b})),
		"data bytes after a v128.const offset":    cat(hdr, sec(5, []byte{1, 0, 1}), sec(11, []byte{2, 0}, v128, []byte{0, 0, 0x41, 0, 0x0b}, big)),
		"element items after a v128.const offset": cat(hdr, sec(4, []byte{1, 0x70, 0, 1}), sec(9, []byte{2, 0}, v128, []byte{0, 0, 0x41, 0, 0x0b}, big)),
	} {
		var err error
		n := allocated(func() { _, err = New(context.Background(), Spec{Name: "wasm", Module: mod}) })
		if !errors.Is(err, ErrBadModule) {
			t.Errorf("%s: %v, not a bad module", name, err)
		}
		if n > 64<<20 {
			t.Errorf("%s: loading a %d-byte module allocated %d MiB", name, len(mod), n>>20)
		}
	}
}

// TestWasmCustomSectionsDropped: a module with a custom section (a name
// section, here truncated) loads and runs: custom sections are not the
// role's.
func TestWasmCustomSectionsDropped(t *testing.T) {
	mod := append(wasmtest.EchoModule(), 0x00, 0x08, 0x04, 'n', 'a', 'm', 'e', 0x01, 0x80, 0x80)
	r := mustNew(t, Spec{Name: "wasm", Module: mod})
	out, err := r.Run(context.Background(), r.Entries()[0], []byte("hi"))
	if err != nil || string(out) != "hi" {
		t.Fatalf("echo: %q, %v", out, err)
	}
}

// TestWasmTableGrowth: a module's tables, at most MaxWasmTableEntries
// entries in all, are bounded at run time too. A module that grows its
// table (table.grow) in a loop gets -1 once the table holds the budget,
// as the specification lets an engine answer, instead of growing it to
// the runtime's own bound (2³²−1 entries, 32 GiB, each execution: the
// child's 4 GiB ran out); the module traps, the call fails, and the
// role's next call works. A module declaring tables of more than the
// budget in all is refused at load time. A maximum the module declares
// above the budget is lowered to it.
func TestWasmTableGrowth(t *testing.T) {
	if !inCappedChild(t, "TestWasmTableGrowth", "ROLES_TEST_TABLE_GROWTH") {
		return
	}
	ctx := context.Background()
	r := mustNew(t, Spec{Name: "wasm", Module: wasmtest.TableModule(0)})
	var err error
	n := allocated(func() { _, err = r.Run(ctx, "grow", wasmtest.TableGrowInput(1<<32-1)) })
	if !errors.Is(err, ErrWasmTrap) || !strings.Contains(err.Error(), "unreachable") {
		t.Fatalf("growing the table without end: %v, want the module's trap when table.grow fails", err)
	}
	// 8 MiB of entries, allocated as a slice that doubles as it grows.
	if n > 64<<20 {
		t.Errorf("growing the table allocated %d MiB", n>>20)
	}
	if out, err := r.Run(ctx, "echo", []byte("next")); err != nil || string(out) != "next" {
		t.Fatalf("the call after the table's growth failed: %q %v", out, err)
	}
	// The whole budget is the one table's.
	out, err := r.Run(ctx, "grow", wasmtest.TableGrowInput(MaxWasmTableEntries))
	if err != nil || binary.LittleEndian.Uint32(out) != MaxWasmTableEntries {
		t.Fatalf("growing the table to %d entries: %x %v", MaxWasmTableEntries, out, err)
	}
	if _, err := r.Run(ctx, "grow", wasmtest.TableGrowInput(MaxWasmTableEntries+1)); !errors.Is(err, ErrWasmTrap) {
		t.Fatalf("growing the table past %d entries: %v", MaxWasmTableEntries, err)
	}
	// A table that declares a maximum above the budget (here 2³²−1)
	// grows to the budget, not to its maximum.
	rmax := mustNew(t, Spec{Name: "wasm", Module: wasmtest.TableModuleOf([]byte{0x70, 1, 0, 0xff, 0xff, 0xff, 0xff, 0x0f})})
	if out, err := rmax.Run(ctx, "grow", wasmtest.TableGrowInput(MaxWasmTableEntries)); err != nil || binary.LittleEndian.Uint32(out) != MaxWasmTableEntries {
		t.Fatalf("growing a table declared of at most 2³²−1 entries to %d: %x %v", MaxWasmTableEntries, out, err)
	}
	if _, err := rmax.Run(ctx, "grow", wasmtest.TableGrowInput(MaxWasmTableEntries+1)); !errors.Is(err, ErrWasmTrap) {
		t.Fatalf("growing a table declared of at most 2³²−1 entries past %d: %v", MaxWasmTableEntries, err)
	}
	// Two tables share it: what is left beyond their initial sizes is
	// split between them.
	r2 := mustNew(t, Spec{Name: "wasm", Module: wasmtest.TableModule(0, 0)})
	if out, err := r2.Run(ctx, "grow", wasmtest.TableGrowInput(MaxWasmTableEntries/2)); err != nil || binary.LittleEndian.Uint32(out) != MaxWasmTableEntries/2 {
		t.Fatalf("growing one of two tables to half the budget: %x %v", out, err)
	}
	if _, err := r2.Run(ctx, "grow", wasmtest.TableGrowInput(MaxWasmTableEntries/2+1)); !errors.Is(err, ErrWasmTrap) {
		t.Fatalf("growing one of two tables past half the budget: %v", err)
	}
	// Tables of the budget each (512 MiB an instance, from a module of a
	// few hundred bytes), of one entry more in all, or of 2²⁷ entries in
	// the function-references proposal's forms, which the runtime reads
	// (a gigabyte an instance), are refused.
	big := []byte{0x80, 0x80, 0x80, 0x40} // 2²⁷
	for name, mod := range map[string][]byte{
		"64 tables of the budget":   wasmtest.TableModule(slices.Repeat([]uint32{MaxWasmTableEntries}, 64)...),
		"one entry too many":        wasmtest.TableModule(MaxWasmTableEntries/2, MaxWasmTableEntries/2+1),
		"table with an initializer": wasmtest.TableModuleOf(slices.Concat([]byte{0x40, 0, 0x70, 0}, big, []byte{0xd0, 0x70, 0x0b})),
		"table of (ref null func)":  wasmtest.TableModuleOf(slices.Concat([]byte{0x63, 0x70, 0}, big)),
	} {
		n := allocated(func() { _, err = New(ctx, Spec{Name: "wasm", Module: mod}) })
		if !errors.Is(err, ErrBadModule) {
			t.Errorf("%s: %v, not a bad module", name, err)
		}
		if n > 64<<20 {
			t.Errorf("%s: loading a %d-byte module allocated %d MiB", name, len(mod), n>>20)
		}
	}
}

// boundTables gives every table a maximum, its share of what the tables'
// initial sizes leave of MaxWasmTableEntries, or the maximum it declares
// if lower, in each form of table the runtime reads, and the runtime
// compiles what it returns.
func TestBoundTables(t *testing.T) {
	budget := binary.AppendUvarint(nil, MaxWasmTableEntries)
	half := binary.AppendUvarint(nil, MaxWasmTableEntries/2)
	cat := func(bs ...[]byte) []byte { return slices.Concat(bs...) }
	for _, tc := range []struct {
		name    string
		n       uint32
		in, out []byte
	}{
		{"no maximum", 1, []byte{0x70, 0, 0}, cat([]byte{0x70, 1, 0}, budget)},
		{"a maximum above the budget", 1, []byte{0x6f, 1, 0, 0xff, 0xff, 0xff, 0xff, 0x0f}, cat([]byte{0x6f, 1, 0}, budget)},
		{"a maximum below it", 1, []byte{0x70, 1, 2, 3}, []byte{0x70, 1, 2, 3}},
		{"two tables", 2, []byte{0x70, 0, 0, 0x70, 0, 0}, cat([]byte{0x70, 1, 0}, half, []byte{0x70, 1, 0}, half)},
		{"(ref null func)", 1, []byte{0x63, 0x70, 0, 0}, cat([]byte{0x63, 0x70, 1, 0}, budget)},
		{"an initializer", 1, []byte{0x40, 0, 0x70, 0, 0, 0xd0, 0x70, 0x0b}, cat([]byte{0x40, 0, 0x70, 1, 0}, budget, []byte{0xd0, 0x70, 0x0b})},
	} {
		got, err := boundTables(tc.in, tc.n)
		if err != nil || !bytes.Equal(got, tc.out) {
			t.Errorf("%s: % x %v, want % x", tc.name, got, err, tc.out)
			continue
		}
		mod := cat([]byte{0, 'a', 's', 'm', 1, 0, 0, 0, secTable}, binary.AppendUvarint(nil, uint64(1+len(got))), []byte{byte(tc.n)}, got)
		rt := wazero.NewRuntime(context.Background())
		if _, err := rt.CompileModule(context.Background(), mod); err != nil {
			t.Errorf("%s: the runtime refuses the bounded tables: %v", tc.name, err)
		}
		_ = rt.Close(context.Background())
	}
	for name, in := range map[string][]byte{
		"shared":                {0x70, 3, 0, 1},
		"truncated":             {0x70, 1, 0},
		"an unread initializer": {0x40, 0, 0x70, 0, 0, 0xfb, 0x0b},
	} {
		if _, err := boundTables(in, 1); !errors.Is(err, ErrBadModule) {
			t.Errorf("%s: %v, not a bad module", name, err)
		}
	}
}
