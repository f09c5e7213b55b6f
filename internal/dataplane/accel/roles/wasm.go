package roles

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// DefaultWasmMemoryPages caps a Wasm role's linear memory at 256 pages
// (16 MiB) unless the Spec says otherwise; MaxWasmMemoryPages is the ceiling.
const (
	DefaultWasmMemoryPages = 256
	MaxWasmMemoryPages     = 16384 // 1 GiB
	maxIdleInstances       = 16
)

// wasmRole runs a user module; see docs/accelerators.md for the ABI:
//
//   - the module imports nothing (no WASI) and exports "memory";
//   - it exports alloc(len i32) -> i32, returning where the host may write
//     len bytes of input;
//   - every other export of type (ptr i32, len i32) -> i64 is an entry: it
//     returns the output location packed as ptr<<32 | len;
//   - an optional export reset() is called after each invocation so the
//     module can free its arena.
//
// Calls are interrupted when their context ends. A trap discards the
// instance; the next call gets a fresh one.
type wasmRole struct {
	rt      wazero.Runtime
	cm      wazero.CompiledModule
	entries []string
	reset   bool

	mu     sync.Mutex
	idle   []api.Module
	closed bool
}

func newWasm(ctx context.Context, s Spec) (Role, error) {
	pages := s.WasmMemoryPages
	if pages == 0 {
		pages = DefaultWasmMemoryPages
	}
	if pages > MaxWasmMemoryPages {
		return nil, fmt.Errorf("%w: memory limit %d pages above %d", ErrBadConfig, pages, MaxWasmMemoryPages)
	}
	if len(s.Module) == 0 {
		return nil, fmt.Errorf("%w: empty module", ErrBadModule)
	}
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfig().
		WithMemoryLimitPages(pages).WithCloseOnContextDone(true))
	fail := func(err error) (Role, error) {
		_ = rt.Close(ctx)
		return nil, err
	}
	cm, err := rt.CompileModule(ctx, s.Module)
	if err != nil {
		return fail(fmt.Errorf("%w: %v", ErrBadModule, err))
	}
	if imps := cm.ImportedFunctions(); len(imps) > 0 {
		m, n, _ := imps[0].Import()
		return fail(fmt.Errorf("%w: imports are not supported (imports %s.%s)", ErrBadModule, m, n))
	}
	if len(cm.ImportedMemories()) > 0 {
		return fail(fmt.Errorf("%w: imported memory is not supported", ErrBadModule))
	}
	if _, ok := cm.ExportedMemories()["memory"]; !ok {
		return fail(fmt.Errorf("%w: no exported memory \"memory\"", ErrBadModule))
	}
	r := &wasmRole{rt: rt, cm: cm}
	i32, i64 := api.ValueTypeI32, api.ValueTypeI64
	sig := func(d api.FunctionDefinition, params, results []api.ValueType) bool {
		return equalTypes(d.ParamTypes(), params) && equalTypes(d.ResultTypes(), results)
	}
	fns := cm.ExportedFunctions()
	if d, ok := fns["alloc"]; !ok || !sig(d, []api.ValueType{i32}, []api.ValueType{i32}) {
		return fail(fmt.Errorf("%w: no export alloc(i32) -> i32", ErrBadModule))
	}
	if d, ok := fns["reset"]; ok {
		if !sig(d, nil, nil) {
			return fail(fmt.Errorf("%w: reset must take and return nothing", ErrBadModule))
		}
		r.reset = true
	}
	for name, d := range fns {
		if name != "alloc" && name != "reset" && sig(d, []api.ValueType{i32, i32}, []api.ValueType{i64}) {
			r.entries = append(r.entries, name)
		}
	}
	if len(r.entries) == 0 {
		return fail(fmt.Errorf("%w: no entry of type (i32, i32) -> i64", ErrBadModule))
	}
	sort.Strings(r.entries)
	// Instantiate once now so start-function traps surface at load time.
	m, err := r.instantiate(ctx)
	if err != nil {
		return fail(err)
	}
	r.idle = append(r.idle, m)
	return r, nil
}

func equalTypes(a, b []api.ValueType) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func (r *wasmRole) instantiate(ctx context.Context) (api.Module, error) {
	m, err := r.rt.InstantiateModule(ctx, r.cm, wazero.NewModuleConfig().WithName(""))
	if err != nil {
		return nil, fmt.Errorf("%w: instantiate: %v", ErrBadModule, err)
	}
	return m, nil
}

func (r *wasmRole) Name() string      { return "wasm" }
func (r *wasmRole) Entries() []string { return append([]string(nil), r.entries...) }

func (r *wasmRole) get(ctx context.Context) (api.Module, error) {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil, ErrClosed
	}
	if n := len(r.idle); n > 0 {
		m := r.idle[n-1]
		r.idle = r.idle[:n-1]
		r.mu.Unlock()
		return m, nil
	}
	r.mu.Unlock()
	return r.instantiate(ctx)
}

func (r *wasmRole) put(ctx context.Context, m api.Module) {
	r.mu.Lock()
	if !r.closed && len(r.idle) < maxIdleInstances {
		r.idle = append(r.idle, m)
		r.mu.Unlock()
		return
	}
	r.mu.Unlock()
	_ = m.Close(ctx)
}

// ErrWasmTrap wraps a module's trap or an interrupted call.
var ErrWasmTrap = errors.New("roles: wasm call failed")

func (r *wasmRole) Run(ctx context.Context, entry string, in []byte) ([]byte, error) {
	if !r.hasEntry(entry) {
		return nil, fmt.Errorf("%w %q (module exports %v)", ErrUnknownEntry, entry, r.entries)
	}
	m, err := r.get(ctx)
	if err != nil {
		return nil, err
	}
	out, err := r.call(ctx, m, entry, in)
	if err != nil {
		_ = m.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	r.put(ctx, m)
	return out, nil
}

func (r *wasmRole) hasEntry(e string) bool {
	i := sort.SearchStrings(r.entries, e)
	return i < len(r.entries) && r.entries[i] == e
}

func (r *wasmRole) call(ctx context.Context, m api.Module, entry string, in []byte) ([]byte, error) {
	res, err := m.ExportedFunction("alloc").Call(ctx, uint64(len(in)))
	if err != nil {
		return nil, fmt.Errorf("%w: alloc: %v", ErrWasmTrap, err)
	}
	ptr := uint32(res[0])
	if !m.Memory().Write(ptr, in) {
		return nil, fmt.Errorf("%w: %d-byte input does not fit the module's memory at %#x", ErrBadInput, len(in), ptr)
	}
	res, err = m.ExportedFunction(entry).Call(ctx, uint64(ptr), uint64(len(in)))
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			// Interrupted: the runtime closes the module when ctx ends
			// (WithCloseOnContextDone), even inside an endless loop.
			return nil, fmt.Errorf("%w: %s interrupted: %w", ErrWasmTrap, entry, cerr)
		}
		return nil, fmt.Errorf("%w: %s: %v", ErrWasmTrap, entry, err)
	}
	optr, olen := uint32(res[0]>>32), uint32(res[0])
	view, ok := m.Memory().Read(optr, olen)
	if !ok {
		return nil, fmt.Errorf("%w: %s returned [%#x, +%d) outside its memory", ErrWasmTrap, entry, optr, olen)
	}
	out := append([]byte(nil), view...)
	if r.reset {
		if _, err := m.ExportedFunction("reset").Call(ctx); err != nil {
			return nil, fmt.Errorf("%w: reset: %v", ErrWasmTrap, err)
		}
	}
	return out, nil
}

func (r *wasmRole) Close(ctx context.Context) error {
	r.mu.Lock()
	r.closed = true
	r.idle = nil
	r.mu.Unlock()
	return r.rt.Close(ctx)
}
