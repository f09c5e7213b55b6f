package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/rialto-project/rialto/api"
	"github.com/spf13/pflag"
)

func init() {
	register(&command{Name: "node remove", Args: "NODE", Summary: "Remove a node: its leases are lost, its certificates revoked, its credential forgotten (--force for a node that still heartbeats).", Flags: runNodeRemove, MinArgs: 1, MaxArgs: 1})
}

func runNodeRemove(e *env, fs *pflag.FlagSet) runFunc {
	var cf clientFlags
	cf.register(fs, e)
	force := fs.Bool("force", false, "remove a node whose agent still heartbeats (it joins again at once, as the same node, unless the bootstrap token changed)")
	return func(ctx context.Context, pos []string) error {
		c, err := cf.client()
		if err != nil {
			return err
		}
		id, err := nodeID(ctx, c, pos[0])
		if err != nil {
			return err
		}
		r, err := c.RemoveNode(ctx, id, *force)
		var ae *api.Error
		if errors.As(err, &ae) && ae.Code == api.CodeConflict && !ae.Plain && !*force {
			// The control plane says "force the removal": the flag.
			fe := *ae
			fe.Message += fmt.Sprintf("; force it with `rialto node remove --force %s`", id)
			return &fe
		}
		if err != nil {
			return err
		}
		if cf.json() {
			return cf.print(e.stdout, r)
		}
		fmt.Fprintf(e.stdout, "node %s (%s) removed: %d certificate(s) revoked, %d lease(s) lost\n", r.Node.Name, r.Node.ID, r.Revoked, len(r.Lost))
		for _, l := range r.Lost {
			fmt.Fprintf(e.stdout, "  lost: %s\n", l)
		}
		return nil
	}
}

// nodeID resolves a node given by ID or by name. Names are not unique
// (another machine may join under a removed node's name): a node that is
// not removed is taken over removed ones, and a name that still names
// several is ambiguous.
func nodeID(ctx context.Context, c *api.Client, s string) (string, error) {
	if _, err := c.Node(ctx, s); err == nil {
		return s, nil
	} else if !api.IsCode(err, api.CodeNotFound) {
		return "", err
	}
	nodes, err := c.Nodes(ctx)
	if err != nil {
		return "", err
	}
	switch ns := api.NodesNamed(nodes, s); len(ns) {
	case 0:
		return "", fmt.Errorf("no node %q (by ID or name)", s)
	case 1:
		return ns[0].ID, nil
	default:
		return "", fmt.Errorf("node name %q is ambiguous: give one of the IDs %s", s, api.NodeIDsAndStates(ns))
	}
}
