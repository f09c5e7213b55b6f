package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/pflag"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/borrower"
	"github.com/rialto-project/rialto/internal/resource"
)

func init() {
	register(&command{Name: "memtest", Args: "LEASE", Summary: "Verify a memory lease: a pattern over the sync, bulk and queue channels and the mapping.", Flags: runMemtest, MinArgs: 1, MaxArgs: 1})
}

// memtestStep is one row of memtest's output.
type memtestStep struct {
	ID       string  `json:"id"`    // the step: channel and pattern
	State    string  `json:"state"` // ok, mismatch, error or skipped
	Part     int     `json:"part"`
	Channel  string  `json:"channel"`
	Bytes    int64   `json:"bytes"`
	Seconds  float64 `json:"seconds"`
	MBPerSec float64 `json:"mb_per_s"`
	Detail   string  `json:"detail,omitempty"`
}

type memtestOut struct {
	ID    string        `json:"id"`
	State string        `json:"state"` // ok or failed
	Size  int64         `json:"size"`
	Span  int64         `json:"span"`
	Steps []memtestStep `json:"steps"`
}

func runMemtest(e *env, fs *pflag.FlagSet) runFunc {
	var cf clientFlags
	cf.register(fs, e)
	spanFlag := sizeVar(fs, "span", "", "test only the first SIZE bytes of each part (default: all of it)")
	timeout := fs.Duration("timeout", 0, "per-request timeout (default 5s)")
	return func(ctx context.Context, pos []string) error {
		span := spanFlag.n
		if spanFlag.set && span <= 0 {
			return usagef("--span must be positive")
		}
		c, err := cf.client()
		if err != nil {
			return err
		}
		l, err := activeLease(ctx, c, pos[0], api.KindMemory, "memtest tests memory leases")
		if err != nil {
			return err
		}
		dataTLS, err := cf.dataTLS()
		if err != nil {
			return err
		}
		parts, err := borrower.MemtestLease(ctx, c, l, span, *timeout, dataTLS)
		if err != nil {
			return err
		}

		out := memtestOut{ID: l.ID, State: "ok", Size: l.Size, Span: span}
		var failed error
		var uffdNote string
		for _, p := range parts {
			i, steps, err := p.Part, p.Steps, p.Err
			if err != nil && failed == nil {
				failed = fmt.Errorf("lease %s part %d: %w", l.ID, i, err)
			}
			for _, s := range steps {
				row := memtestStep{ID: s.Name, State: "ok", Part: i, Channel: channelOf(s.Name), Bytes: s.Bytes, Seconds: s.Duration.Seconds()}
				if s.Duration > 0 && s.Skipped == "" {
					row.MBPerSec = float64(s.Bytes) / 1e6 / s.Duration.Seconds()
				}
				switch {
				case s.Skipped != "":
					row.State, row.Detail = "skipped", s.Skipped
					uffdNote = s.Skipped
				case errors.Is(s.Err, borrower.ErrVerify):
					row.State, row.Detail = "mismatch", s.Err.Error()
				case s.Err != nil:
					row.State, row.Detail = "error", s.Err.Error()
				}
				out.Steps = append(out.Steps, row)
			}
			if err != nil && len(steps) == 0 {
				out.Steps = append(out.Steps, memtestStep{ID: "memtest", State: "error", Part: i, Detail: err.Error()})
			}
		}
		if failed != nil {
			out.State = "failed"
		}
		if cf.json() {
			if err := cf.print(e.stdout, out); err != nil {
				return err
			}
		} else {
			tw := newTable(e.stdout)
			hdr := "CHANNEL\tBYTES\tRESULT\tMB/S\tPATTERN"
			if len(parts) > 1 {
				hdr = "PART\t" + hdr
			}
			fmt.Fprintln(tw, hdr)
			for _, s := range out.Steps {
				if len(parts) > 1 {
					fmt.Fprintf(tw, "%d\t", s.Part)
				}
				rate := "-"
				if s.MBPerSec > 0 {
					rate = fmt.Sprintf("%.1f", s.MBPerSec)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", dash(s.Channel), resource.FormatSize(s.Bytes), s.State, rate, s.ID)
			}
			tw.Flush()
			if uffdNote != "" {
				fmt.Fprintf(e.stdout, "\nThe mapping was not tested: %s.\nThe explicit channels were.\n", uffdNote)
			}
			for _, s := range out.Steps {
				if s.State == "mismatch" || s.State == "error" {
					fmt.Fprintf(e.stdout, "\n%s: %s: %s\n", s.ID, s.State, s.Detail)
				}
			}
		}
		return failed
	}
}

// channelOf names the channel a memtest step exercises (the prefix of its
// name, "sync: …").
func channelOf(step string) string {
	ch, _, ok := strings.Cut(step, ":")
	if !ok {
		return ""
	}
	return ch
}
