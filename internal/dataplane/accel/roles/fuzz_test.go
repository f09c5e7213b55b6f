package roles

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/accel/roles/wasmtest"
)

// FuzzNativeRoles runs a borrower's arbitrary input (a START's payload)
// through every built-in role's entries, and an arbitrary AES key (the
// role config a tenant sends) through aesgcm's construction. Nothing
// panics; a refusal wraps ErrBadInput, ErrUnknownEntry or ErrBadConfig;
// aesgcm opens what it sealed, sha256 streams to the sum Run gives, and
// echo returns its input.
func FuzzNativeRoles(f *testing.F) {
	key := bytes.Repeat([]byte{7}, 16)
	nonce := make([]byte, 12)
	mm := binary.LittleEndian.AppendUint32(nil, 1)
	mm = binary.LittleEndian.AppendUint32(mm, 2)
	mm = binary.LittleEndian.AppendUint32(mm, 1)
	mm = append(mm, make([]byte, 4*(2+2))...)
	f.Add(byte(0), byte(0), key, []byte("hello"))
	f.Add(byte(1), byte(0), key, []byte("abc"))
	f.Add(byte(2), byte(0), key, append(append([]byte(nil), nonce...), "plaintext"...))
	f.Add(byte(2), byte(1), key, append(append([]byte(nil), nonce...), make([]byte, 16)...))
	f.Add(byte(2), byte(0), []byte("short"), nonce)
	f.Add(byte(3), byte(0), key, mm)
	f.Add(byte(3), byte(0), key, []byte{0, 0, 0, 16, 0, 0, 0, 0, 0, 0, 0, 16})
	f.Add(byte(3), byte(0), key, []byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0}) // 2³²−1 rows of no column: no work
	f.Add(byte(4), byte(0), key, make([]byte, 16*8))
	f.Add(byte(4), byte(1), key, make([]byte, 16*3))
	f.Add(byte(4), byte(2), key, []byte{})
	names := []string{"echo", "sha256", "aesgcm", "matmul", "fft"}
	f.Fuzz(func(t *testing.T, role, entry byte, config, in []byte) {
		ctx := context.Background()
		name := names[int(role)%len(names)]
		if name == "matmul" && len(in) >= 12 {
			// Keep the output (m×n floats, up to MaxMatmulElems: 64 MiB
			// for a 12-byte input with k = 0, which RunBatch's budget
			// bounds) small enough to run many inputs.
			m, n := uint64(binary.LittleEndian.Uint32(in)), uint64(binary.LittleEndian.Uint32(in[8:]))
			if m*n > 1<<16 {
				return
			}
		}
		if name == "fft" && len(in) > 16<<10 {
			return
		}
		r, err := New(ctx, Spec{Name: name, Config: config})
		if err != nil {
			if !errors.Is(err, ErrBadConfig) {
				t.Fatalf("New(%s): %v does not wrap ErrBadConfig", name, err)
			}
			return
		}
		defer r.Close(ctx)
		entries := append(r.Entries(), "nope")
		e := entries[int(entry)%len(entries)]
		out, err := r.Run(ctx, e, in)
		if err != nil {
			if !errors.Is(err, ErrBadInput) && !errors.Is(err, ErrUnknownEntry) {
				t.Fatalf("%s.%s: %v wraps neither ErrBadInput nor ErrUnknownEntry", name, e, err)
			}
			if e != "nope" && errors.Is(err, ErrUnknownEntry) {
				t.Fatalf("%s refuses its own entry %s", name, e)
			}
			return
		}
		if e == "nope" {
			t.Fatalf("%s ran an entry it does not have", name)
		}
		switch {
		case name == "echo" && !bytes.Equal(out, in):
			t.Fatal("echo changed its input")
		case name == "aesgcm" && e == "seal":
			back, err := r.Run(ctx, "open", append(append([]byte(nil), in[:12]...), out...))
			if err != nil || !bytes.Equal(back, in[12:]) {
				t.Fatalf("aesgcm does not open what it sealed: %v", err)
			}
		case name == "sha256":
			s := r.(Streamer).NewStream(e)
			_, _ = s.Write(in[:len(in)/2])
			_, _ = s.Write(in[len(in)/2:])
			if !bytes.Equal(s.Sum(), out) {
				t.Fatal("the streamed sum differs from Run's")
			}
		}
	})
}

// FuzzWasmModule loads arbitrary Wasm binaries (a tenant's role module,
// sent with a lease) and runs each entry they export on an arbitrary
// input, under a deadline. Loading never panics and refuses with
// ErrBadModule or ErrBadConfig; a loaded module has entries, sorted; a
// run succeeds or fails with ErrWasmTrap or ErrBadInput (a module that
// loops is interrupted); a closed role refuses with ErrClosed.
func FuzzWasmModule(f *testing.F) {
	f.Add(wasmtest.EchoModule(), byte(0), []byte("hi"))
	f.Add(wasmtest.DumpModule(), byte(1), []byte("x"))
	f.Add(wasmtest.WorkModule(), byte(0), []byte{0xff, 0xff, 0xff, 0x7f})
	f.Add(wasmtest.MemoryModule(300), byte(2), []byte{})
	f.Add(wasmtest.TableModule(0), byte(0), []byte{0xff, 0xff, 0xff, 0xff}) // grows its table until table.grow fails
	f.Add(wasmtest.ImportingModule(), byte(0), []byte{})
	f.Add([]byte{0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00}, byte(0), []byte{})
	f.Fuzz(func(t *testing.T, module []byte, pages byte, in []byte) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		r, err := New(ctx, Spec{Name: "wasm", Module: module, WasmMemoryPages: 1 + uint32(pages%32)})
		if err != nil {
			if !errors.Is(err, ErrBadModule) && !errors.Is(err, ErrBadConfig) {
				t.Fatalf("load refused with %v", err)
			}
			return
		}
		es := r.Entries()
		if len(es) == 0 {
			t.Fatal("loaded a module without an entry")
		}
		for i := 1; i < len(es); i++ {
			if es[i-1] >= es[i] {
				t.Fatalf("entries %q not sorted", es)
			}
		}
		for _, e := range es[:min(len(es), 3)] {
			rctx, rcancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			_, err := r.Run(rctx, e, in)
			rcancel()
			if err != nil && !errors.Is(err, ErrWasmTrap) && !errors.Is(err, ErrBadInput) {
				t.Fatalf("%s: %v wraps neither ErrWasmTrap nor ErrBadInput", e, err)
			}
		}
		if err := r.Close(context.Background()); err != nil {
			t.Fatalf("close: %v", err)
		}
		if _, err := r.Run(context.Background(), es[0], in); !errors.Is(err, ErrClosed) {
			t.Fatalf("a closed role ran: %v", err)
		}
	})
}
