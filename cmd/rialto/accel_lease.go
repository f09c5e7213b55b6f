package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/borrower"
	"github.com/rialto-project/rialto/internal/dataplane/accel"
	"github.com/rialto-project/rialto/internal/resource"
)

// leaseIOFlags are accel run's flags for devices reading devices: a slot
// takes its input from a range of a block lease and stores its output in
// another, talking to the block lenders itself (docs/accelerators.md,
// "Devices reading devices").
type leaseIOFlags struct {
	input, output string
	relay         bool
	relayChunk    string
}

func registerLeaseIOFlags(fs *pflag.FlagSet) *leaseIOFlags {
	var f leaseIOFlags
	fs.StringVar(&f.input, "input-lease", "", "`LEASE:OFF:LEN`: the input is this range of a block lease, which the slot reads from the block lenders itself (e.g. lease-x:0:64MiB)")
	fs.StringVar(&f.output, "output-lease", "", "`LEASE:OFF`: store the output in this block lease at OFF, written by the slot itself")
	fs.BoolVar(&f.relay, "relay", false, "move the lease ranges through this borrower instead (read here, then write to the slot): the path the bytes take without direct device reads")
	f.relayChunk = "4MiB"
	fs.Var(sizeText{&f.relayChunk}, "relay-chunk", "with --relay, bytes per relayed request (at least the range's length: read it all, then send it)")
	return &f
}

func (f *leaseIOFlags) any() bool { return f.input != "" || f.output != "" }

// parseLeaseRange parses LEASE:OFF:LEN (withLen) or LEASE:OFF; OFF and LEN
// are sizes (4096, 64MiB).
func parseLeaseRange(s string, withLen bool) (id string, off, n int64, err error) {
	want, form := 2, "LEASE:OFF"
	if withLen {
		want, form = 3, "LEASE:OFF:LEN"
	}
	f := strings.Split(s, ":")
	if len(f) != want || f[0] == "" {
		return "", 0, 0, fmt.Errorf("%q: want %s", s, form)
	}
	if off, err = resource.ParseSize(f[1]); err != nil || off < 0 {
		return "", 0, 0, fmt.Errorf("%q: bad offset %q", s, f[1])
	}
	if withLen {
		if n, err = resource.ParseSize(f[2]); err != nil || n <= 0 {
			return "", 0, 0, fmt.Errorf("%q: bad length %q", s, f[2])
		}
	}
	return f[0], off, n, nil
}

// runAccelLeaseIO runs accel run's task through slot memory with block
// leases as input or output: LOAD (or the borrower's relay, or a WRITE of
// the INPUT bytes), START, then STORE (or the relay) to the output lease or
// a READ of the output, which it returns. It fills in res.
func runAccelLeaseIO(ctx context.Context, c *api.Client, lf *leaseIOFlags, res *accelRunOut,
	tgt borrower.AccelSlot, conn *accel.Conn, in []byte, dataTLS *tls.Config) ([]byte, error) {
	if tgt.Shared() {
		return nil, fmt.Errorf("lease %s is shared: --input-lease and --output-lease need a dedicated lease's slot (a gateway has no slot memory)", res.ID)
	}
	chunk := 0
	if lf.relay {
		n, err := resource.ParseSize(lf.relayChunk)
		if err != nil || n <= 0 || n > math.MaxInt32 {
			return nil, usagef("bad --relay-chunk %q", lf.relayChunk)
		}
		chunk = int(n)
	} else if lf.relayChunk != "4MiB" {
		return nil, usagef("--relay-chunk needs --relay")
	}
	info := conn.Info()
	mem := int64(info.MemSize)
	inLen := int64(len(in))
	var inRange accel.BlockRange
	if lf.input != "" {
		id, off, n, err := parseLeaseRange(lf.input, true)
		if err != nil {
			return nil, fmt.Errorf("--input-lease %w", err)
		}
		bl, err := activeLease(ctx, c, id, api.KindBlock, "--input-lease needs a block lease")
		if err != nil {
			return nil, err
		}
		if inRange, err = borrower.BlockRange(bl, off, n); err != nil {
			return nil, fmt.Errorf("--input-lease: %w", err)
		}
		inLen, res.InputLease, res.InputOffset = n, bl.ID, off
	}
	outAddr := (inLen + 63) &^ 63
	if outAddr >= mem || inLen > math.MaxUint32 {
		return nil, fmt.Errorf("an input of %s leaves no room for the output in the slot's %s of memory (the lender sets slot memory: rialto agent --slot-memory)",
			resource.FormatSize(inLen), resource.FormatSize(mem))
	}
	outCap := min(mem-outAddr, math.MaxUint32)
	var outRange *accel.BlockRange
	var outLease api.Lease
	if lf.output != "" {
		id, off, _, err := parseLeaseRange(lf.output, false)
		if err != nil {
			return nil, fmt.Errorf("--output-lease %w", err)
		}
		if outLease, err = activeLease(ctx, c, id, api.KindBlock, "--output-lease needs a block lease"); err != nil {
			return nil, err
		}
		// The role cannot write past the lease: its output buffer ends
		// where the lease does.
		r, err := borrower.BlockRange(outLease, off, 0)
		if err != nil {
			return nil, fmt.Errorf("--output-lease: %w", err)
		}
		outCap = min(outCap, outLease.Size-off)
		if outCap == 0 {
			return nil, fmt.Errorf("--output-lease: offset %d is the end of lease %s", off, outLease.ID)
		}
		outRange, res.OutputLease, res.OutputOffset = &r, outLease.ID, off
	}
	res.Input, res.Path = int(inLen), "direct"
	if lf.relay {
		res.Path = "relay"
	}
	what := res.Role + ":" + res.Entry
	t0 := time.Now()
	var loaded time.Time
	defer func() {
		end := time.Now()
		res.Seconds = end.Sub(t0).Seconds()
		if !loaded.IsZero() {
			res.InputSeconds, res.TaskSeconds = loaded.Sub(t0).Seconds(), end.Sub(loaded).Seconds()
		}
	}()

	if lf.input != "" && !lf.relay {
		// LOAD and START in one round trip, then STORE or READ.
		n, out, err := conn.RunBlockTask(ctx, accel.BlockTask{Entry: res.Entry, Input: inRange, InLen: uint32(inLen),
			Output: outRange, OutAddr: uint64(outAddr), OutCap: uint32(outCap), Loaded: func() { loaded = time.Now() }})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		res.Bytes = int(n)
		return out, nil
	}
	switch {
	case lf.input != "":
		if err := borrower.RelayLoad(ctx, conn, 0, uint32(inLen), inRange, chunk, dataTLS); err != nil {
			return nil, fmt.Errorf("relay the input: %w", err)
		}
	default:
		if err := writeSlot(ctx, conn, in); err != nil {
			return nil, fmt.Errorf("input: %w", err)
		}
	}
	loaded = time.Now()
	task, err := conn.Start(ctx, accel.TaskSpec{Entry: res.Entry, InLen: uint32(inLen), Out: uint64(outAddr), OutCap: uint32(outCap)})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	n, err := task.Wait(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	res.Bytes = int(n)
	switch {
	case outRange == nil:
		return conn.ReadMem(ctx, uint64(outAddr), n)
	case lf.relay:
		if err := borrower.RelayStore(ctx, conn, uint64(outAddr), n, *outRange, chunk, dataTLS); err != nil {
			return nil, fmt.Errorf("relay the output: %w", err)
		}
	default:
		if err := conn.Store(ctx, uint64(outAddr), n, *outRange); err != nil {
			return nil, fmt.Errorf("store the output: %w", err)
		}
	}
	return nil, nil
}

// writeSlot writes in at address 0 of the slot, in frames the slot takes.
func writeSlot(ctx context.Context, conn *accel.Conn, in []byte) error {
	step := 16 << 20
	if mp := int(conn.Info().MaxPayload); mp > 4096 && step > mp-4096 {
		step = mp - 4096
	}
	for off := 0; off < len(in); off += step {
		if err := conn.WriteMem(ctx, uint64(off), in[off:min(off+step, len(in))]); err != nil {
			return err
		}
	}
	return nil
}

// printAccelStored reports an output stored in a block lease.
func printAccelStored(e *env, cf *clientFlags, res accelRunOut) error {
	if cf.json() {
		return cf.print(e.stdout, res)
	}
	_, err := fmt.Fprintf(e.stdout, "%d bytes of %s:%s output stored in lease %s at offset %d (%s path, %.3f s)\n",
		res.Bytes, res.Role, res.Entry, res.OutputLease, res.OutputOffset, res.Path, res.Seconds)
	return err
}
