package roles

import (
	"context"
	"errors"
	"fmt"
	"sort"
)

// Sentinel errors. Callers match them with errors.Is.
var (
	ErrUnknownRole  = errors.New("roles: unknown role")
	ErrUnknownEntry = errors.New("roles: unknown entry")
	ErrBadInput     = errors.New("roles: bad input")
	ErrBadConfig    = errors.New("roles: bad config")
	ErrBadModule    = errors.New("roles: bad wasm module")
	ErrClosed       = errors.New("roles: role closed")
)

// Role is a kernel loaded into a slot. Run executes one invocation of the
// named entry point on in and returns its output.
type Role interface {
	Name() string
	Entries() []string
	Run(ctx context.Context, entry string, in []byte) ([]byte, error)
	Close(ctx context.Context) error
}

// Batcher is implemented by roles that process many independent items in one
// invocation more cheaply than one by one (the MCT engine does).
type Batcher interface {
	RunBatch(ctx context.Context, entry string, ins [][]byte) ([][]byte, error)
}

// executor is implemented by roles whose invocations leave state behind (a
// Wasm module's linear memory): execution returns the state of one
// execution — the items of one RunBatch — which starts from the role's
// initial state, runs the items in turn, and is discarded by end, so that
// no execution sees another's bytes.
type executor interface {
	execution() execution
}

type execution interface {
	run(ctx context.Context, entry string, in []byte) ([]byte, error)
	end(ctx context.Context)
}

// Streamer is implemented by roles whose entry can consume its input in
// pieces, in order, as it arrives (a hash): NewStream returns a fresh
// stream for entry, or nil when entry does not stream. Writing the input
// to the stream and then calling Sum gives what Run gives for the whole
// input. An appliance filling slot memory from a block lease uses it to
// compute while the bytes land (docs/accelerators.md, "Devices reading
// devices").
type Streamer interface {
	NewStream(entry string) Stream
}

// Stream is one streaming invocation (Streamer); not safe for concurrent
// use.
type Stream interface {
	Write(p []byte) (int, error)
	Sum() []byte
}

// RunBatch runs ins through r as one invocation when r is a Batcher and one
// by one otherwise. The result has one output per input. With maxOut > 0,
// outputs adding up to more than maxOut bytes fail the batch with
// ErrBadInput (the reply could not carry them); run one by one (on state of
// the batch's own when the role keeps state between invocations: a Wasm
// module's instance serves one batch and is then discarded), it stops
// when ctx ends (a cancellation point per item: the context's error) and at
// the item that passes the budget, so a few bytes of input asking for large
// outputs (a matmul with k = 0) cannot make it hold many of them.
func RunBatch(ctx context.Context, r Role, entry string, ins [][]byte, maxOut int) ([][]byte, error) {
	if b, ok := r.(Batcher); ok {
		outs, err := b.RunBatch(ctx, entry, ins)
		if err == nil && maxOut > 0 {
			total := 0
			for _, o := range outs {
				total += len(o)
			}
			if total > maxOut {
				return nil, fmt.Errorf("%w: outputs of %d bytes, above the %d a reply carries", ErrBadInput, total, maxOut)
			}
		}
		return outs, err
	}
	run := r.Run
	if e, ok := r.(executor); ok {
		x := e.execution()
		defer x.end(context.WithoutCancel(ctx))
		run = x.run
	}
	outs := make([][]byte, len(ins))
	total := 0
	for i, in := range ins {
		// The cancellation point of a native role: a cancelled batch
		// (its caller gone, its lease ended) stops at the next item.
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("item %d: %w", i, err)
		}
		out, err := run(ctx, entry, in)
		if err != nil {
			return nil, fmt.Errorf("item %d: %w", i, err)
		}
		if total += len(out); maxOut > 0 && total > maxOut {
			return nil, fmt.Errorf("%w: outputs of items 0–%d add up to %d bytes, above the %d a reply carries", ErrBadInput, i, total, maxOut)
		}
		outs[i] = out
	}
	return outs, nil
}

// Spec names a role and carries what it needs to be built: Config is
// role-specific (the AES key, the MCT rule set as JSON), Module is the Wasm
// binary of a "wasm" role.
type Spec struct {
	Name   string `json:"name"`
	Config []byte `json:"config,omitempty"`
	Module []byte `json:"module,omitempty"`
	// WasmMemoryPages caps a Wasm role's linear memory (64 KiB pages);
	// zero means DefaultWasmMemoryPages.
	WasmMemoryPages uint32 `json:"wasm_memory_pages,omitempty"`
}

type constructor func(ctx context.Context, s Spec) (Role, error)

var catalog = map[string]constructor{
	"echo":   func(context.Context, Spec) (Role, error) { return echoRole{}, nil },
	"sha256": func(context.Context, Spec) (Role, error) { return shaRole{}, nil },
	"aesgcm": newAESGCM,
	"matmul": func(context.Context, Spec) (Role, error) { return matmulRole{}, nil },
	"fft":    func(context.Context, Spec) (Role, error) { return fftRole{}, nil },
	"mct":    newMCT,
	"wasm":   newWasm,
}

// Names lists the roles New can build, sorted.
func Names() []string {
	out := make([]string, 0, len(catalog))
	for n := range catalog {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// New builds the role s names.
func New(ctx context.Context, s Spec) (Role, error) {
	c, ok := catalog[s.Name]
	if !ok {
		return nil, fmt.Errorf("%w %q (known: %v)", ErrUnknownRole, s.Name, Names())
	}
	return c(ctx, s)
}
