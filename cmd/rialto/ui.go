package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/pflag"
)

func init() {
	register(&command{Name: "ui", Summary: "Print a one-time link that signs a browser in to the web dashboard (/ui/) as your token.", Flags: runUI})
}

func runUI(e *env, fs *pflag.FlagSet) runFunc {
	var cf clientFlags
	cf.register(fs, e)
	return func(ctx context.Context, _ []string) error {
		c, err := cf.client()
		if err != nil {
			return err
		}
		link, err := c.LoginLink(ctx)
		if err != nil {
			return err
		}
		u := c.BaseURL() + link.Path
		if cf.json() {
			return cf.print(e.stdout, map[string]any{"id": "login-link", "state": "ok", "url": u, "expires_at": link.ExpiresAt})
		}
		fmt.Fprintln(e.stdout, u)
		fmt.Fprintf(e.stderr, "(open it in a browser: it signs in once, until %s; the dashboard is at %s/ui/)\n", link.ExpiresAt.Local().Format(time.Kitchen), c.BaseURL())
		return nil
	}
}
