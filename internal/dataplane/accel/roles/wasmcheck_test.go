package roles

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"testing"

	"github.com/rialto-project/rialto/internal/dataplane/accel/roles/wasmtest"
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

// TestWasmClaimedSizes: modules of a few bytes that declare vectors of
// 2²⁸ entries (globals, exports, functions, parameters, an element
// segment's functions, a data segment's bytes, an import's name), a
// function with 2³²−1 locals or a table of 2²⁷ entries are refused as
// bad modules without allocating what they claim: the runtime allocated
// from 256 MiB to 32 GiB for them (FuzzWasmModule's worker was killed).
// The loads run in a child process whose address space is capped at
// 4 GiB, so that a regression fails the test instead of taking the
// machine's memory.
func TestWasmClaimedSizes(t *testing.T) {
	if os.Getenv("ROLES_TEST_CLAIMED_SIZES") == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestWasmClaimedSizes$", "-test.count=1")
		cmd.Env = append(os.Environ(), "ROLES_TEST_CLAIMED_SIZES=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("loading the modules in a child process: %v\n%.4000s", err, out)
		}
		return
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_AS, &syscall.Rlimit{Cur: 4 << 30, Max: 4 << 30}); err != nil {
		t.Fatal(err)
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
		return append([]byte{id, byte(len(b))}, b...)
	}
	fn := cat(sec(1, []byte{1, 0x60, 0, 0}), sec(3, []byte{1, 0}))
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
