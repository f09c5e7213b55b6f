package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/spf13/pflag"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/placement"
	"github.com/rialto-project/rialto/internal/resource"
)

func init() {
	register(&command{Name: "nodes", Summary: "List the nodes and their state (ready, suspect, down).", Flags: runNodes})
	register(&command{Name: "devices", Summary: "List the lendable devices and their allocation.", Flags: runDevices})
	register(&command{Name: "topology", Summary: "Show nodes and the measured links between them.", Flags: runTopology})
}

// listCommand is a command that lists what fetch returns: as -o asks, or
// as table prints it (table may ask the client for more, as devices does
// for the nodes' names).
func listCommand[T any](fetch func(*api.Client, context.Context) ([]T, error),
	table func(ctx context.Context, w io.Writer, c *api.Client, xs []T)) func(*env, *pflag.FlagSet) runFunc {
	return func(e *env, fs *pflag.FlagSet) runFunc {
		var cf clientFlags
		cf.register(fs, e)
		return func(ctx context.Context, _ []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			xs, err := fetch(c, ctx)
			if err != nil {
				return err
			}
			if cf.json() {
				return cf.print(e.stdout, nonNil(xs))
			}
			table(ctx, e.stdout, c, xs)
			return nil
		}
	}
}

var runNodes = listCommand((*api.Client).Nodes, func(_ context.Context, w io.Writer, _ *api.Client, nodes []api.Node) {
	printNodes(w, nodes)
})

func printNodes(w io.Writer, nodes []api.Node) {
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].Name < nodes[j].Name })
	now := time.Now()
	tw := newTable(w)
	fmt.Fprintln(tw, "ID\tNAME\tSTATE\tADDRESS\tCORES\tMEMORY\tHEALTH\tLAST HEARTBEAT")
	for _, n := range nodes {
		state := string(n.State)
		if n.Cordoned {
			state += ",cordoned"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", n.ID, n.Name, state, dash(n.Address),
			n.Fingerprint.Cores, resource.FormatSize(n.Fingerprint.MemoryBytes), dash(nodeHealth(n)), ago(now, n.LastHeartbeat))
	}
	tw.Flush()
}

// nodeHealth is a node's health as the tables show it: unknown while the
// node is not ready, whose agent's last report is not current (the API
// says so; a control plane from before it did not).
func nodeHealth(n api.Node) string {
	if n.State != api.NodeReady {
		return api.HealthUnknown
	}
	return n.Health
}

var runDevices = listCommand((*api.Client).Devices, func(ctx context.Context, w io.Writer, c *api.Client, devs []api.Device) {
	names := map[string]string{}
	if nodes, err := c.Nodes(ctx); err == nil {
		for _, n := range nodes {
			names[n.ID] = n.Name
		}
	}
	printDevices(w, devs, names)
})

// capacity formats a device quantity: bytes, a rate (nic), or slots and
// shares of one (accel: n is slot units, api.SlotUnits a slot).
func capacity(k api.Kind, n int64) string {
	if k == api.KindAccel {
		return placement.FormatSlots(n, api.SlotUnits)
	}
	if k == api.KindNIC { // bytes/s, shown as a link rate
		return resource.FormatLinkRate(float64(n))
	}
	return resource.FormatSize(n)
}

func printDevices(w io.Writer, devs []api.Device, nodeNames map[string]string) {
	sort.Slice(devs, func(i, j int) bool {
		a, b := nodeNames[devs[i].NodeID], nodeNames[devs[j].NodeID]
		if a != b {
			return a < b
		}
		return devs[i].Name < devs[j].Name
	})
	tw := newTable(w)
	fmt.Fprintln(tw, "ID\tNODE\tNAME\tKIND\tSTATE\tCAPACITY\tALLOCATED\tSHARING")
	for _, d := range devs {
		node := nodeNames[d.NodeID]
		if node == "" {
			node = d.NodeID
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", d.ID, node, d.Name, d.Kind, d.State,
			capacity(d.Kind, d.Capacity), capacity(d.Kind, d.Allocated), dash(d.Sharing))
	}
	tw.Flush()
}

// topologyOut is topology's JSON: the API's object, itself given an id
// and a state like every object the CLI prints.
type topologyOut struct {
	ID    string `json:"id"`
	State string `json:"state"`
	api.Topology
}

func runTopology(e *env, fs *pflag.FlagSet) runFunc {
	var cf clientFlags
	cf.register(fs, e)
	return func(ctx context.Context, _ []string) error {
		c, err := cf.client()
		if err != nil {
			return err
		}
		t, err := c.Topology(ctx)
		if err != nil {
			return err
		}
		t.Nodes, t.Links = nonNil(t.Nodes), nonNil(t.Links)
		if cf.json() {
			return cf.print(e.stdout, topologyOut{ID: "topology", State: "ok", Topology: t})
		}
		return printTopology(e.stdout, t, time.Now())
	}
}

// printTopology prints the nodes, then the links between them, a link's
// bandwidth as rates print (resource.FormatRate).
func printTopology(w io.Writer, t api.Topology, now time.Time) error {
	printNodes(w, t.Nodes)
	fmt.Fprintln(w)
	names := map[string]string{"controlplane": "controlplane"}
	for _, n := range t.Nodes {
		names[n.ID] = n.Name
	}
	name := func(id string) string {
		if n := names[id]; n != "" {
			return n
		}
		return id
	}
	sort.Slice(t.Links, func(i, j int) bool {
		if t.Links[i].From != t.Links[j].From {
			return name(t.Links[i].From) < name(t.Links[j].From)
		}
		return name(t.Links[i].To) < name(t.Links[j].To)
	})
	tw := newTable(w)
	fmt.Fprintln(tw, "LINK\tFROM\tTO\tKIND\tSTATE\tRTT\tBANDWIDTH\tMEASURED")
	for _, l := range t.Links {
		bw := "-"
		if l.BandwidthBps > 0 {
			bw = resource.FormatRate(float64(l.BandwidthBps))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%.0fµs\t%s\t%s\n", l.ID, name(l.From), name(l.To), dash(l.Kind),
			dash(l.Status), l.RTTMicros, bw, ago(now, l.MeasuredAt))
	}
	return tw.Flush()
}

// nonNil makes JSON print [] rather than null.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
