package main

import (
	"context"
	"fmt"
	"time"
)

func init() {
	register(&command{Name: "events", Summary: "Show the audit log (--since ID, --follow).", Run: runEvents})
}

func runEvents(ctx context.Context, e *env, args []string) error {
	var cf clientFlags
	fs := newFlags(e, "events", "")
	cf.register(fs, e)
	since := fs.Int64("since", 0, "show events after this ID")
	follow := fs.Bool("follow", false, "keep polling for new events until interrupted")
	every := fs.Duration("interval", time.Second, "polling interval with --follow")
	_, c, err := cf.parse(fs, args, 0, 0)
	if err != nil {
		return err
	}
	first := true
	for {
		evs, err := c.Events(ctx, *since)
		if err != nil {
			if ctx.Err() != nil && !first {
				return nil
			}
			return err
		}
		if cf.json() && !*follow {
			return printJSON(e.stdout, nonNil(evs))
		}
		tw := newTable(e.stdout)
		if first && !cf.json() {
			fmt.Fprintln(tw, "ID\tAT\tTYPE\tSUBJECT\tSTATE\tMESSAGE")
		}
		for _, ev := range evs {
			if cf.json() {
				printJSON(e.stdout, ev)
			} else {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", ev.ID, ev.At.Local().Format(time.DateTime), ev.Type, ev.Subject, dash(ev.State), ev.Message)
			}
			*since = max(*since, ev.ID)
		}
		tw.Flush()
		first = false
		if !*follow {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(*every):
		}
	}
}
