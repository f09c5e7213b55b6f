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
// Each execution — one Run, or one RunBatch (roles.RunBatch): the items of
// one task, which on a shared gateway are one lease's, as its batches never
// mix leases — runs on an instance of its own, instantiated for it, whose
// memory and globals are the module's initial state; its items run on that
// instance in turn, and the instance is closed when the execution ends. An
// instance that ran one execution never runs another: a module that
// returns memory it did not write this call (what an earlier input left)
// shows only its own execution's bytes, never another lease's. The
// instantiation is paid once per execution, so a gateway's batches amortise
// it over their items.
//
// Calls are interrupted when their context ends. A trap discards the
// instance; the execution's next item gets a fresh one.
type wasmRole struct {
	rt      wazero.Runtime
	cm      wazero.CompiledModule
	entries []string
	reset   bool

	mu     sync.Mutex
	spare  api.Module // instantiated at load time and never called: the first execution's
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
	// The counts the module declares, checked before the runtime
	// allocates by them (wasmcheck.go).
	mod, err := checkModule(s.Module)
	if err != nil {
		return fail(err)
	}
	cm, err := rt.CompileModule(ctx, mod)
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
	r.spare = m
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

// fresh returns an instance in the module's initial state: the one
// instantiated at load time, which never ran, or a new one.
func (r *wasmRole) fresh(ctx context.Context) (api.Module, error) {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil, ErrClosed
	}
	m := r.spare
	r.spare = nil
	r.mu.Unlock()
	if m != nil {
		return m, nil
	}
	return r.instantiate(ctx)
}

// ErrWasmTrap wraps a module's trap or an interrupted call.
var ErrWasmTrap = errors.New("roles: wasm call failed")

// Run runs one item as an execution of its own, on a fresh instance.
func (r *wasmRole) Run(ctx context.Context, entry string, in []byte) ([]byte, error) {
	x := r.execution()
	defer x.end(context.WithoutCancel(ctx))
	return x.run(ctx, entry, in)
}

// execution implements executor: the items of one execution share an
// instance that no other execution ever uses.
func (r *wasmRole) execution() execution { return &wasmExecution{r: r} }

// wasmExecution is one execution's instance, instantiated at its first
// item.
type wasmExecution struct {
	r *wasmRole
	m api.Module
}

func (x *wasmExecution) run(ctx context.Context, entry string, in []byte) ([]byte, error) {
	r := x.r
	if !r.hasEntry(entry) {
		return nil, fmt.Errorf("%w %q (module exports %v)", ErrUnknownEntry, entry, r.entries)
	}
	if x.m == nil {
		m, err := r.fresh(ctx)
		if err != nil {
			return nil, err
		}
		x.m = m
	}
	out, err := r.call(ctx, x.m, entry, in)
	if err != nil {
		_ = x.m.Close(context.WithoutCancel(ctx))
		x.m = nil
		return nil, err
	}
	return out, nil
}

// end closes the execution's instance: its memory holds the execution's
// inputs, and no other execution may see them.
func (x *wasmExecution) end(ctx context.Context) {
	if x.m != nil {
		_ = x.m.Close(ctx)
		x.m = nil
	}
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
	r.spare = nil
	r.mu.Unlock()
	return r.rt.Close(ctx)
}
