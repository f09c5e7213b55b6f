package roles

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/rialto-project/rialto/internal/dataplane/accel/roles/mct"
)

// mctRole serves an MCT rule set (Config: the mct.RuleSet as JSON). Entry
// "match": input is N encoded 64-byte queries, output N little-endian
// uint32 results (mct.NoMatch when no rule matches).
type mctRole struct{ e *mct.Engine }

func newMCT(_ context.Context, s Spec) (Role, error) {
	var rs mct.RuleSet
	if err := json.Unmarshal(s.Config, &rs); err != nil {
		return nil, fmt.Errorf("%w: mct rule set: %v", ErrBadConfig, err)
	}
	e, err := mct.Compile(rs)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	return &mctRole{e: e}, nil
}

// NewMCT wraps a compiled engine as a role (for in-process use and tests).
func NewMCT(e *mct.Engine) Role { return &mctRole{e: e} }

func (*mctRole) Name() string                { return "mct" }
func (*mctRole) Entries() []string           { return []string{"match"} }
func (*mctRole) Close(context.Context) error { return nil }

func (r *mctRole) Run(_ context.Context, entry string, in []byte) ([]byte, error) {
	if entry != "match" {
		return nil, fmt.Errorf("%w %q for mct", ErrUnknownEntry, entry)
	}
	if len(in)%mct.QuerySize != 0 {
		return nil, fmt.Errorf("%w: mct input of %d bytes is not a multiple of %d", ErrBadInput, len(in), mct.QuerySize)
	}
	out := make([]byte, len(in)/mct.QuerySize*mct.ResultSize)
	if err := r.e.MatchBatch(in, out); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadInput, err)
	}
	return out, nil
}

// RunBatch matches the queries of all items in one pass and splits the
// results back per item.
func (r *mctRole) RunBatch(ctx context.Context, entry string, ins [][]byte) ([][]byte, error) {
	total := 0
	for i, in := range ins {
		if len(in)%mct.QuerySize != 0 {
			return nil, fmt.Errorf("%w: item %d: %d bytes is not a multiple of %d", ErrBadInput, i, len(in), mct.QuerySize)
		}
		total += len(in)
	}
	all := make([]byte, 0, total)
	for _, in := range ins {
		all = append(all, in...)
	}
	out, err := r.Run(ctx, entry, all)
	if err != nil {
		return nil, err
	}
	outs := make([][]byte, len(ins))
	off := 0
	for i, in := range ins {
		n := len(in) / mct.QuerySize * mct.ResultSize
		outs[i] = out[off : off+n : off+n]
		off += n
	}
	return outs, nil
}
