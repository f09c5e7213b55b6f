package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"

	"github.com/rialto-project/rialto/api"
)

func init() {
	register(&command{Name: "events", Summary: "Show the audit log (--since ID; --follow streams new events as they happen).", Flags: runEvents})
}

func runEvents(e *env, fs *pflag.FlagSet) runFunc {
	var cf clientFlags
	cf.register(fs, e)
	since := fs.Int64("since", 0, "show events after this ID")
	follow := fs.BoolP("follow", "f", false, "stay connected and show each new event as it is appended (resumes after a dropped connection with no gap) until interrupted")
	return func(ctx context.Context, _ []string) error {
		c, err := cf.client()
		if err != nil {
			return err
		}
		if !*follow {
			evs, err := c.Events(ctx, *since)
			if err != nil {
				return err
			}
			if cf.json() {
				return cf.print(e.stdout, nonNil(evs))
			}
			tw := newTable(e.stdout)
			eventHeader(tw)
			for _, ev := range evs {
				eventRow(tw, ev)
			}
			return tw.Flush()
		}
		// Following: one JSON object per line with -o json (jq-friendly),
		// a YAML document per event with -o yaml, the template per event,
		// else a table row per event, flushed as it comes.
		tw := newTable(e.stdout)
		if !cf.json() {
			eventHeader(tw)
			tw.Flush()
		}
		return c.FollowEvents(ctx, *since, api.FollowOptions{
			Reconnected: func(err error) { fmt.Fprintf(e.stderr, "rialto events: reconnected after: %v\n", err) },
		}, func(ev api.Event) error {
			switch cf.out.format {
			case "json":
				return printJSONLine(e.stdout, ev)
			case "yaml":
				if _, err := io.WriteString(e.stdout, "---\n"); err != nil {
					return err
				}
				return cf.print(e.stdout, ev)
			case "template":
				return cf.print(e.stdout, ev)
			}
			eventRow(tw, ev)
			return tw.Flush()
		})
	}
}

func eventHeader(tw *tabwriter.Writer) {
	fmt.Fprintln(tw, "ID\tAT\tTYPE\tSUBJECT\tSTATE\tMESSAGE")
}

func eventRow(tw *tabwriter.Writer, ev api.Event) {
	fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", ev.ID, ev.At.Local().Format(time.DateTime), ev.Type, ev.Subject, dash(ev.State), ev.Message)
}

// printJSONLine writes v as one line of JSON.
func printJSONLine(w io.Writer, v any) error {
	return json.NewEncoder(w).Encode(v)
}
