package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/rialto-project/rialto/internal/netns"
	"github.com/rialto-project/rialto/internal/rack"
	"github.com/rialto-project/rialto/internal/resource"
)

// upNetns is what `rialto up --netns` was asked for.
type upNetns struct {
	dir                  string
	port                 int
	agents, disks, slots int
	diskSize, memory     int64
	linkRate, level      string
	uplinks              bool
	uplinkRate           string
	quotas               []string
	tm                   timings
	log                  *slog.Logger
	insecureDataplane    bool
}

// runUpNetns runs an emulated rack (internal/rack): the control plane and
// each agent as `rialto server` and `rialto agent` processes in their own
// network namespaces, until ctx is done.
func runUpNetns(ctx context.Context, e *env, o upNetns) error {
	if err := rack.Available(); err != nil {
		return fmt.Errorf("rialto up --netns %s", strings.TrimPrefix(err.Error(), rack.ErrUnavailable.Error()+": "))
	}
	if o.linkRate != "" {
		if _, err := netns.ParseRate(o.linkRate); err != nil {
			return usagef("bad --link-rate %q: want a tc rate such as 1gbit or 400mbit", o.linkRate)
		}
	}
	if o.agents > rack.MaxAgents {
		return usagef("--agents: at most %d with --netns", rack.MaxAgents)
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("rialto up --netns: cannot find its own binary: %w", err)
	}
	if err := makeStateDir(o.dir); err != nil {
		return err
	}
	// The tokens are saved only once the rack holds the state dir, so a
	// second `rialto up` refused for it changes nothing.
	st, err := loadUpState(o.dir)
	if err != nil {
		return err
	}
	if st.BootstrapToken == "" {
		st.BootstrapToken = resource.NewSecret("rbt")
	}
	if st.AdminToken == "" {
		st.AdminToken = resource.NewSecret("rat")
	}
	var serverArgs []string
	for _, q := range o.quotas {
		serverArgs = append(serverArgs, "--quota", q)
	}
	r, err := rack.Start(ctx, rack.Config{
		Binary: self, StateDir: o.dir, Agents: o.agents, Disks: o.disks, DiskSize: o.diskSize,
		Memory: o.memory, AccelSlots: o.slots, LinkRate: o.linkRate, Uplinks: o.uplinks, UplinkRate: o.uplinkRate,
		NICRate:   o.uplinkRate, // the agents lend their uplinks at the rate they are shaped to
		Heartbeat: o.tm.heartbeat, SuspectAfter: o.tm.suspect, DownAfter: o.tm.down,
		PrepareTimeout: o.tm.prepare, DefaultTTL: o.tm.ttl,
		BootstrapToken: st.BootstrapToken, AdminToken: st.AdminToken, APIPort: o.port,
		ServerArgs: serverArgs, LogLevel: o.level, Logger: o.log.With("component", "rack"),
		InsecureDataplane: o.insecureDataplane,
	})
	if err != nil {
		if errors.Is(err, rack.ErrBadConfig) {
			return fmt.Errorf("rialto up --netns: %w", err)
		}
		if errors.Is(err, rack.ErrInUse) {
			return stateDirInUse(o.dir, err)
		}
		return err
	}
	if err := saveUpState(o.dir, st); err != nil {
		return errors.Join(err, r.Close())
	}
	where := fmt.Sprintf("a control plane and %s, each a process in its own network namespace", agentsText(o.agents))
	if o.linkRate != "" {
		where += ", links shaped to " + o.linkRate
	}
	caFile, err := filepath.Abs(r.CACert())
	if err != nil {
		return errors.Join(err, r.Close())
	}
	if err := printUp(ctx, e, r.URL(), caFile, st, o.dir, where, o.insecureDataplane, func(w io.Writer) { printRack(w, r) }); err != nil {
		return errors.Join(err, r.Close())
	}
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintln(e.stderr, "rialto up: stopping")
			return r.Close()
		case x := <-r.Exits():
			if x.Node == rack.ControlPlaneName {
				fmt.Fprintf(e.stderr, "rialto up: the control plane's process exited (%v); stopping\n", x.Err)
				return errors.Join(fmt.Errorf("control plane exited: %v (log: %s)", x.Err, r.ControlPlane().Log), r.Close())
			}
			// An agent's crash is something to watch (its node goes
			// suspect, then down), not a reason to stop the rack.
			fmt.Fprintf(e.stderr, "rialto up: %s's process exited (%v); log: %s\n", x.Node, x.Err, filepath.Join(o.dir, "logs", x.Node+".log"))
		}
	}
}

// printRack prints the rack's namespaces: where each node runs and how to
// reach into it.
func printRack(w io.Writer, r *rack.Rack) {
	nodes := append([]rack.Node{r.ControlPlane()}, r.Agents()...)
	printRackNodes(w, nodes, r.Gateway().String(), filepath.Join(r.StateDir(), "logs"))
	if o := r.Outside(); o != nil {
		fmt.Fprintf(w, "Outside: %s (namespace %s), reached only through each agent's wan0, which it lends as NIC wan.\n", o.Server, o.Namespace)
	}
}

func printRackNodes(w io.Writer, nodes []rack.Node, gateway, logs string) {
	tw := newTable(w)
	fmt.Fprintln(tw, "NODE\tNAMESPACE\tADDRESS\tLINK\tROOT END")
	for _, n := range nodes {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", n.Name, n.Namespace, n.Addr, dash(n.Rate), n.RootIface)
	}
	tw.Flush()
	fmt.Fprintf(w, "\nThis shell is the borrower, at %s on the rack's bridge. Logs: %s/NODE.log\n", gateway, logs)
	if len(nodes) > 1 {
		fmt.Fprintf(w, "Inside a node: ip netns exec %s COMMAND\n", nodes[1].Namespace)
	}
}
