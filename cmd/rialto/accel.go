package main

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/borrower"
	"github.com/rialto-project/rialto/internal/dataplane/accel"
)

func init() {
	register(&command{Name: "accel run", Args: "LEASE ROLE[:ENTRY] INPUT|--input-lease L:OFF:LEN",
		Summary: "Run an accelerator lease's role on INPUT (a file, @FILE as in curl, - for stdin), on --data TEXT or on a range of a block lease the slot reads itself; print the output or store it in a block lease.", Flags: runAccelRun, MinArgs: 2, MaxArgs: 3})
}

// readInput reads INPUT: "-" (or "@-") is stdin, anything else a file,
// written FILE or, as in curl, @FILE. Literal text is --data TEXT.
func readInput(arg string, stdin io.Reader) ([]byte, error) {
	switch {
	case arg == "-" || arg == "@-":
		if stdin == nil {
			stdin = os.Stdin
		}
		return io.ReadAll(stdin)
	case strings.HasPrefix(arg, "@"):
		return os.ReadFile(arg[1:])
	default:
		return os.ReadFile(arg)
	}
}

// accelRunOut is accel run's JSON output; Output is base64 in JSON.
type accelRunOut struct {
	ID     string `json:"id"`
	State  string `json:"state"`
	Role   string `json:"role"`
	Entry  string `json:"entry"`
	Slot   string `json:"slot"` // the slot's address, or the gateway's
	Via    string `json:"via"`  // "slot" (dedicated) or "gateway" (shared)
	Input  int    `json:"input_bytes"`
	Bytes  int    `json:"output_bytes"`
	Output []byte `json:"output,omitempty"`
	File   string `json:"file,omitempty"`
	// Set when a block lease is the input or the output (accel_lease.go).
	InputLease   string  `json:"input_lease,omitempty"`
	InputOffset  int64   `json:"input_offset,omitempty"`
	OutputLease  string  `json:"output_lease,omitempty"`
	OutputOffset int64   `json:"output_offset,omitempty"`
	Path         string  `json:"path,omitempty"` // "direct": the slot reads and writes the block leases; "relay": through this borrower
	Seconds      float64 `json:"seconds,omitempty"`
	// The phases of Seconds: until the input is in slot memory (LOAD or
	// relay), then the task and moving its output.
	InputSeconds float64 `json:"input_seconds,omitempty"`
	TaskSeconds  float64 `json:"task_seconds,omitempty"`
}

// stdinOf lets tests give accel run an input on stdin.
var stdinOf = func(*env) io.Reader { return os.Stdin }

func runAccelRun(e *env, fs *pflag.FlagSet) runFunc {
	var cf clientFlags
	cf.register(fs, e)
	lf := registerLeaseIOFlags(fs)
	outPath := fs.String("out", "", "write the output to this file instead of stdout")
	entryFlag := fs.String("entry", "", "the role's entry to call (default: its first, e.g. sha256's sum)")
	asHex := fs.Bool("hex", false, "print the output in hexadecimal")
	slot := fs.Int("slot", 0, "which of the lease's slots to use")
	data := fs.String("data", "", "the input as literal `TEXT` (as in curl, @FILE reads FILE, @@TEXT is TEXT starting with @)")
	watch := fs.Duration("watch", 5*time.Second, "with --cacert, how often to take the control plane's revocation list (and a newer ca-crl.pem beside --cacert) while the task runs: the connection to a lender whose certificate it revokes is ended (0: never)")
	return func(ctx context.Context, pos []string) error {
		var err error
		given := 0
		for _, b := range []bool{len(pos) == 3, lf.input != "", fs.Changed("data")} {
			if b {
				given++
			}
		}
		if given != 1 {
			return usagef("give one of INPUT, --data and --input-lease")
		}
		if lf.output != "" && (*outPath != "" || *asHex) {
			return usagef("--output-lease stores the output in a block lease: --out and --hex do not apply")
		}
		role, entry, _ := strings.Cut(pos[1], ":")
		if *entryFlag != "" {
			if entry != "" && entry != *entryFlag {
				return fmt.Errorf("entry given twice (%q and --entry %q)", entry, *entryFlag)
			}
			entry = *entryFlag
		}
		var in []byte
		if fs.Changed("data") {
			if in, err = inline(*data, stdinOf(e)); err != nil {
				return fmt.Errorf("--data: %w", err)
			}
		}
		if len(pos) == 3 {
			if in, err = readInput(pos[2], stdinOf(e)); err != nil {
				if errors.Is(err, os.ErrNotExist) && !strings.HasPrefix(pos[2], "@") {
					// INPUT is a file; text was probably meant.
					return fmt.Errorf("input: %w (INPUT names a file; for the text itself, use --data %s)", err, pos[2])
				}
				return fmt.Errorf("input: %w", err)
			}
		}
		// The revocation list follows the control plane's while the task
		// runs (--watch), as attach's does.
		if err := cf.followRoots(); err != nil {
			return err
		}
		c, err := cf.client()
		if err != nil {
			return err
		}
		l, err := activeLease(ctx, c, pos[0], api.KindAccel, "accel run needs an accel lease")
		if err != nil {
			return err
		}
		slots, err := borrower.AccelSlots(l) // one per slot; a shared lease: its gateway
		if err != nil {
			return err
		}
		if *slot < 0 || *slot >= len(slots) {
			if len(slots) == 1 && slots[0].Shared() {
				return fmt.Errorf("--slot %d: lease %s is shared: its lender's gateway chooses the slot", *slot, l.ID)
			}
			return fmt.Errorf("--slot %d: lease %s has %d slot(s)", *slot, l.ID, len(slots))
		}
		tgt := slots[*slot]
		dataTLS, err := cf.dataTLS()
		if err != nil {
			return err
		}
		log, err := newLogger(e, "warn")
		if err != nil {
			return err
		}
		var opts []accel.DialOption
		if track := cf.dataTrack(log); track != nil {
			opts = append(opts, accel.WithTrack(track))
		}
		conn, err := borrower.DialAccel(ctx, tgt, dataTLS, opts...)
		if err != nil {
			return fmt.Errorf("lease %s: %w", l.ID, err)
		}
		defer conn.Close()
		defer followCA(ctx, cf.caFollower(c, log), *watch)()
		info := conn.Info()
		if info.Role == "" {
			return fmt.Errorf("lease %s's slot runs no role; create the lease with --role %s", l.ID, role)
		}
		if info.Role != role {
			return fmt.Errorf("lease %s runs role %q, not %q", l.ID, info.Role, role)
		}
		if entry == "" {
			if len(info.Entries) == 0 {
				return fmt.Errorf("role %s lists no entries; name one with ROLE:ENTRY", role)
			}
			entry = info.Entries[0]
		} else if len(info.Entries) > 0 && !slices.Contains(info.Entries, entry) {
			return fmt.Errorf("role %s has no entry %q (entries: %s)", role, entry, strings.Join(info.Entries, ", "))
		}
		res := accelRunOut{ID: l.ID, State: "ok", Role: role, Entry: entry, Slot: tgt.Address, Via: "slot", Input: len(in)}
		if tgt.Shared() {
			res.Via = "gateway"
		}
		var out []byte
		if lf.any() {
			if out, err = runAccelLeaseIO(ctx, c, lf, &res, tgt, conn, in, dataTLS); err != nil {
				return leaseEndedErr(ctx, c, l.ID, err)
			}
			if lf.output != "" {
				return printAccelStored(e, &cf, res)
			}
		} else {
			if info.MaxPayload > 0 && uint64(len(in)) > uint64(info.MaxPayload) {
				return fmt.Errorf("input of %d bytes exceeds the slot's limit of %d", len(in), info.MaxPayload)
			}
			if out, err = conn.Call(ctx, entry, in); err != nil {
				return leaseEndedErr(ctx, c, l.ID, fmt.Errorf("%s:%s: %w", role, entry, err))
			}
		}
		res.Bytes = len(out)
		if *outPath != "" {
			if err := os.WriteFile(*outPath, out, 0o644); err != nil {
				return err
			}
			res.File = *outPath
			if cf.json() {
				return cf.print(e.stdout, res)
			}
			fmt.Fprintf(e.stderr, "rialto accel run: %d bytes of %s:%s output written to %s\n", len(out), role, entry, *outPath)
			return nil
		}
		if cf.json() {
			res.Output = out
			return cf.print(e.stdout, res)
		}
		if *asHex {
			_, err = fmt.Fprintln(e.stdout, hex.EncodeToString(out))
			return err
		}
		_, err = e.stdout.Write(out)
		return err
	}
}

// leaseEndedErr is err, a task's failure, prefixed with why lease id
// ended when the control plane says it did (released, expired, lost: its
// lender tore it down, and the connection broke), so that the user reads
// "lease L is lost (lender node N was removed)" rather than only
// "connection closed: EOF". An error of the caller's own ending (ctx), or
// a lease the control plane still holds active, is err as it is.
func leaseEndedErr(ctx context.Context, c *api.Client, id string, err error) error {
	if ctx.Err() != nil {
		return err
	}
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cur, lerr := c.Lease(lctx, id)
	if api.IsCode(lerr, api.CodeNotFound) {
		return fmt.Errorf("lease %s is gone: %w", id, err)
	}
	if lerr != nil || !cur.State.Terminal() {
		return err
	}
	return fmt.Errorf("lease %s is %s%s: %w", id, cur.State, leaseWhy(cur), err)
}
