package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/rialto-project/rialto/api"
)

func init() {
	register(&command{Name: "node cordon", Args: "NODE", Summary: "Place no new part on a node (its leases stay).", Flags: runNodeCordon(true), MinArgs: 1, MaxArgs: 1})
	register(&command{Name: "node uncordon", Args: "NODE", Summary: "Let placement use a cordoned node again.", Flags: runNodeCordon(false), MinArgs: 1, MaxArgs: 1})
	register(&command{Name: "node drain", Args: "NODE", Summary: "Cordon a node and move every lease off it while used (--deadline 10m).", Flags: runNodeDrain, MinArgs: 1, MaxArgs: 1})
}

func runNodeCordon(cordon bool) func(*env, *pflag.FlagSet) runFunc {
	return func(e *env, fs *pflag.FlagSet) runFunc {
		var cf clientFlags
		cf.register(fs, e)
		return func(ctx context.Context, pos []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			var n api.Node
			if cordon {
				n, err = c.CordonNode(ctx, pos[0])
			} else {
				n, err = c.UncordonNode(ctx, pos[0])
			}
			if err != nil {
				return err
			}
			if cf.json() {
				return cf.print(e.stdout, n)
			}
			state := "uncordoned: placement may use it"
			if n.Cordoned {
				state = "cordoned: no new part is placed on it; its leases stay"
			}
			fmt.Fprintf(e.stdout, "node %s (%s) %s\n", n.Name, n.ID, state)
			return nil
		}
	}
}

func runNodeDrain(e *env, fs *pflag.FlagSet) runFunc {
	var cf clientFlags
	cf.register(fs, e)
	deadline := durationVar(fs, "deadline", 10*time.Minute, time.Millisecond, "what has not moved by then is left in place and reported (its borrower told), e.g. 10m, 90s")
	noWait := fs.Bool("no-wait", false, "return once the drain has started")
	return func(ctx context.Context, pos []string) error {
		c, err := cf.client()
		if err != nil {
			return err
		}
		d, err := c.DrainNode(ctx, pos[0], api.DrainRequest{DeadlineSeconds: deadline.d.Seconds()})
		if err != nil {
			return err
		}
		if !*noWait {
			d, err = waitDrain(ctx, e, c, pos[0], d, !cf.json())
			if err != nil {
				return err
			}
		}
		if cf.json() {
			if err := cf.print(e.stdout, d); err != nil {
				return err
			}
		} else {
			printDrain(e.stdout, d)
		}
		if d.State == api.DrainIncomplete {
			left := 0
			for _, l := range d.Leases {
				if l.State == api.DrainLeaseLeft {
					left++
				}
			}
			return fmt.Errorf("drain of %s incomplete: %d lease(s) left in place, their borrowers told", dash(d.NodeName), left)
		}
		return nil
	}
}

// waitDrain follows a drain until it ends, printing each lease's
// progress to stderr when progress is set (drainProgress).
func waitDrain(ctx context.Context, e *env, c *api.Client, node string, d api.Drain, progress bool) (api.Drain, error) {
	p := newDrainProgress(e.stderr)
	t := time.NewTicker(movePoll)
	defer t.Stop()
	for {
		if progress {
			p.print(d)
		}
		if d.State != api.DrainRunning {
			return d, nil
		}
		select {
		case <-ctx.Done():
			return d, fmt.Errorf("waiting for the drain: %w (it goes on until its deadline)", ctx.Err())
		case <-t.C:
		}
		nd, err := c.NodeDrain(ctx, node)
		if err != nil {
			return d, err
		}
		d = nd
	}
}

// drainProgress prints a drain's progress, lease by lease: each change
// of a lease's action, state or reason, each reason once. A lease that
// cannot move yet (no other lender has room, a move failed) is tried
// again until the drain's deadline, which its line says; the reason it
// is left with at the deadline quotes that reason, which is not printed
// again ("as above"; the report on stdout has it whole).
type drainProgress struct {
	w    io.Writer
	last map[string]string   // per lease, its action, state and reason printed last
	said map[string][]string // per lease, the reasons printed
}

func newDrainProgress(w io.Writer) *drainProgress {
	return &drainProgress{w: w, last: map[string]string{}, said: map[string][]string{}}
}

// print prints what changed in d since the last call.
func (p *drainProgress) print(d api.Drain) {
	for _, l := range d.Leases {
		reason := l.Reason
		for _, r := range p.said[l.LeaseID] {
			// A long reason (placement's explanation) printed before is
			// named by its start.
			if head, _, ok := strings.Cut(r, ": "); ok && len(r) > 80 && strings.Contains(reason, r) {
				reason = strings.Replace(reason, r, head+": as above", 1)
			}
		}
		line := fmt.Sprintf("lease %s (%s): %s %s", l.LeaseID, l.Kind, l.Action, l.State)
		if reason != "" {
			line += ": " + reason
		}
		key := l.Action + "\x00" + string(l.State) + "\x00" + l.Reason
		if key == p.last[l.LeaseID] {
			continue
		}
		p.last[l.LeaseID] = key
		if l.Reason != "" && !slices.Contains(p.said[l.LeaseID], l.Reason) {
			p.said[l.LeaseID] = append(p.said[l.LeaseID], l.Reason)
		}
		if l.State == api.DrainLeasePending && l.Reason != "" && d.State == api.DrainRunning {
			line += fmt.Sprintf("; tried again until the drain's deadline (%s, --deadline)", d.Deadline.Local().Format(time.TimeOnly))
		}
		fmt.Fprintln(p.w, line)
	}
}

func printDrain(w io.Writer, d api.Drain) {
	took := "-"
	if !d.FinishedAt.IsZero() {
		took = d.FinishedAt.Sub(d.StartedAt).Round(time.Millisecond).String()
	}
	fmt.Fprintf(w, "drain of node %s (%s): %s in %s\n", dash(d.NodeName), d.NodeID, d.State, took)
	if len(d.Leases) == 0 {
		fmt.Fprintln(w, "no leases were on the node")
		return
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "LEASE\tKIND\tTENANT\tACTION\tSTATE\tREASON")
	for _, l := range d.Leases {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", l.LeaseID, l.Kind, dash(l.Tenant), l.Action, l.State, dash(l.Reason))
	}
	tw.Flush()
}
