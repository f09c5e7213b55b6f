package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strconv"
	"time"

	"github.com/spf13/pflag"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/resource"
)

func init() {
	register(&command{Name: "lease move", Args: "ID", Summary: "Move a block or memory lease to other lenders while it is used (--to NODE|DEVICE, --part N).", Flags: runLeaseMove, MinArgs: 1, MaxArgs: 1})
	register(&command{Name: "moves", Summary: "List lease moves under way and recent (--lease ID).", Flags: runMoves})
}

// movePoll is how often the CLI asks how moves are going.
const movePoll = 500 * time.Millisecond

func runLeaseMove(e *env, fs *pflag.FlagSet) runFunc {
	var cf clientFlags
	cf.register(fs, e)
	to := fs.String("to", "", "destination: a node (ID or name) or a device ID (default: placement chooses, away from the part's node); an exclusive device takes only a whole-device lease's part")
	part := fs.Int("part", -1, "move only this part (from 0, in layout order; default: every part, one after the other)")
	noWait := fs.Bool("no-wait", false, "return once the moves have started")
	timeout := fs.Duration("timeout", time.Hour, "how long to wait for the moves")
	return func(ctx context.Context, pos []string) error {
		c, err := cf.client()
		if err != nil {
			return err
		}
		req := api.MoveRequest{}
		if *part >= 0 {
			req.Part = part
		}
		if *to != "" {
			req.ToNode = *to
			if devs, err := c.Devices(ctx); err == nil {
				for _, d := range devs {
					if d.ID == *to {
						req.ToNode, req.ToDevice = "", *to
					}
				}
			}
		}
		moves, err := c.MoveLease(ctx, pos[0], req)
		if err != nil {
			return err
		}
		if !*noWait {
			wctx, cancel := context.WithTimeout(ctx, *timeout)
			defer cancel()
			if moves, err = waitMoves(wctx, e, c, pos[0], moves, !cf.json()); err != nil {
				return err
			}
		}
		if cf.json() {
			return cf.print(e.stdout, nonNil(moves))
		}
		printMoves(e.stdout, moves, nodeNames(ctx, c))
		for _, m := range moves {
			if m.State == api.MoveFailed {
				return fmt.Errorf("the move of part %d failed: %s (the part is served where it was)", m.Part, m.Error)
			}
		}
		return nil
	}
}

// waitMoves follows moves until they have all ended, printing progress
// to stderr when progress is set.
func waitMoves(ctx context.Context, e *env, c *api.Client, leaseID string, moves []api.Move, lines bool) ([]api.Move, error) {
	ids := map[string]bool{}
	for _, m := range moves {
		ids[m.ID] = true
	}
	last := map[string]string{}
	t := time.NewTicker(movePoll)
	defer t.Stop()
	// On a terminal a bar of the bytes copied; elsewhere a line per change.
	var bar *progress
	if lines {
		if bar = newProgress(e, 1, "moving lease "+leaseID); bar != nil {
			lines = false
			defer bar.done()
		}
	}
	for {
		all, err := c.Moves(ctx, leaseID)
		if err != nil {
			return moves, err
		}
		var cur []api.Move
		done := true
		for _, m := range all {
			if !ids[m.ID] {
				continue
			}
			cur = append(cur, m)
			done = done && m.Done()
			if line := moveProgress(m); lines && line != last[m.ID] {
				fmt.Fprintln(e.stderr, line)
				last[m.ID] = line
			}
		}
		if len(cur) > 0 {
			moves = cur
		}
		if bar != nil && len(cur) > 0 {
			var n, total int64
			for _, m := range cur {
				n += min(m.Copied+m.Skipped, m.Size)
				total += m.Size
			}
			bar.set(n, total, moveProgress(cur[len(cur)-1]))
		}
		if done && len(cur) == len(ids) {
			return moves, nil
		}
		select {
		case <-ctx.Done():
			return moves, fmt.Errorf("waiting for the moves: %w (they go on; see rialto moves --lease %s)", ctx.Err(), leaseID)
		case <-t.C:
		}
	}
}

// moveProgress is a move's state in one line.
func moveProgress(m api.Move) string {
	s := fmt.Sprintf("lease %s part %d: %s", m.LeaseID, m.Part, m.State)
	switch m.State {
	case api.MoveCopying:
		pct := 0.0
		if m.Size > 0 {
			pct = 100 * float64(min(m.Copied+m.Skipped, m.Size)) / float64(m.Size)
		}
		s += fmt.Sprintf(", pass %d, %.0f%% of %s (%s sent, %s written meanwhile)", max(m.Pass, 1), pct,
			resource.FormatSize(m.Size), resource.FormatSize(m.Copied), resource.FormatSize(m.Dirty))
	case api.MoveDone:
		s += fmt.Sprintf(", %s sent, writes held %.1f ms", resource.FormatSize(m.Copied), m.HeldMillis)
	case api.MoveFailed:
		s += ": " + m.Error
	}
	return s
}

func runMoves(e *env, fs *pflag.FlagSet) runFunc {
	var cf clientFlags
	cf.register(fs, e)
	lease := fs.String("lease", "", "only the moves of this lease")
	return func(ctx context.Context, _ []string) error {
		c, err := cf.client()
		if err != nil {
			return err
		}
		ms, err := c.Moves(ctx, *lease)
		if err != nil {
			return err
		}
		if cf.json() {
			return cf.print(e.stdout, nonNil(ms))
		}
		printMoves(e.stdout, ms, nodeNames(ctx, c))
		return nil
	}
}

func printMoves(w io.Writer, ms []api.Move, names map[string]string) {
	sort.Slice(ms, func(i, j int) bool { return ms[i].StartedAt.Before(ms[j].StartedAt) })
	tw := newTable(w)
	fmt.Fprintln(tw, "MOVE\tLEASE\tPART\tKIND\tSTATE\tFROM\tTO\tSIZE\tSENT\tPASSES\tHELD\tREASON")
	for _, m := range ms {
		held := "-"
		if m.HeldMillis > 0 {
			held = strconv.FormatFloat(m.HeldMillis, 'f', 1, 64) + " ms"
		}
		reason := m.Reason
		if m.Error != "" {
			reason = m.Error
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", m.ID, m.LeaseID, m.Part, m.Kind, m.State,
			nodeName(names, m.From.NodeID), nodeName(names, m.To.NodeID), resource.FormatSize(m.Size), resource.FormatSize(m.Copied),
			m.Pass, held, dash(reason))
	}
	tw.Flush()
}
