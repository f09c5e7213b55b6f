package main

import (
	"context"
	"fmt"
	"time"
)

func init() {
	register(&command{Name: "ui", Summary: "Print a one-time link that signs a browser in to the web dashboard (/ui/) as your token.", Run: runUI})
}

func runUI(ctx context.Context, e *env, args []string) error {
	var cf clientFlags
	fs := newFlags(e, "ui", "")
	cf.register(fs, e)
	_, c, err := cf.parse(fs, args, 0, 0)
	if err != nil {
		return err
	}
	link, err := c.LoginLink(ctx)
	if err != nil {
		return err
	}
	u := c.BaseURL() + link.Path
	if cf.json() {
		return printJSON(e.stdout, map[string]any{"id": "login-link", "state": "ok", "url": u, "expires_at": link.ExpiresAt})
	}
	fmt.Fprintln(e.stdout, u)
	fmt.Fprintf(e.stderr, "(open it in a browser: it signs in once, until %s; the dashboard is at %s/ui/)\n", link.ExpiresAt.Local().Format(time.Kitchen), c.BaseURL())
	return nil
}
