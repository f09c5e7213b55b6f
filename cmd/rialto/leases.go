package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/resource"
)

func init() {
	register(&command{Name: "leases", Summary: "List live leases (--all: also ended ones).", Run: runLeases})
	register(&command{Name: "lease create", Summary: "Borrow a device: place, reserve and activate a lease.", Run: runLeaseCreate})
	register(&command{Name: "lease show", Args: "ID", Summary: "Show a lease, its parts and their URIs.", Run: leaseByID("show")})
	register(&command{Name: "lease release", Args: "ID", Summary: "End a lease and free its devices.", Run: leaseByID("release")})
	register(&command{Name: "lease renew", Args: "ID", Summary: "Extend a lease's TTL (--ttl, default the lease's own).", Run: leaseByID("renew")})
	register(&command{Name: "explain", Summary: "Show the plan a lease request would get and why, reserving nothing.", Run: runExplain})
}

func runLeases(ctx context.Context, e *env, args []string) error {
	var cf clientFlags
	fs := newFlags(e, "leases", "")
	cf.register(fs, e)
	var all bool
	const allHelp = "also list ended leases (released, expired, failed, lost): the whole history"
	fs.BoolVar(&all, "all", false, allHelp)
	fs.BoolVar(&all, "a", false, "short for --all")
	_, c, err := cf.parse(fs, args, 0, 0)
	if err != nil {
		return err
	}
	// By default only live leases (reserved, active, releasing) are asked
	// for: the server answers with what is lent now, not the history.
	list := c.Leases
	if all {
		list = c.AllLeases
	}
	ls, err := list(ctx)
	if err != nil {
		return err
	}
	if cf.json() {
		return printJSON(e.stdout, nonNil(ls))
	}
	printLeases(e.stdout, ls, nodeNames(ctx, c))
	return nil
}

// nodeNames maps node IDs to names, best effort (tables only).
func nodeNames(ctx context.Context, c *api.Client) map[string]string {
	m := map[string]string{}
	if nodes, err := c.Nodes(ctx); err == nil {
		for _, n := range nodes {
			m[n.ID] = n.Name
		}
	}
	return m
}

func nodeName(names map[string]string, id string) string {
	if n := names[id]; n != "" {
		return n
	}
	return dash(id)
}

func printLeases(w io.Writer, ls []api.Lease, names map[string]string) {
	sort.Slice(ls, func(i, j int) bool { return ls[i].CreatedAt.Before(ls[j].CreatedAt) })
	now := time.Now()
	tw := newTable(w)
	fmt.Fprintln(tw, "ID\tSTATE\tKIND\tMODE\tSIZE\tCOUNT\tNODE\tDEVICE\tTENANT\tEXPIRES IN")
	for _, l := range ls {
		exp := "-"
		if !l.State.Terminal() {
			exp = until(now, l.ExpiresAt)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", l.ID, l.State, l.Kind, dash(string(l.Mode)),
			capacity(l.Kind, l.Size), l.Count, nodeName(names, l.NodeID), dash(l.DeviceID), dash(l.Tenant), exp)
	}
	tw.Flush()
}

func printLease(w io.Writer, l api.Lease, names map[string]string) {
	tw := newTable(w)
	row := func(k, v string) {
		if v != "" {
			fmt.Fprintf(tw, "%s:\t%s\n", k, v)
		}
	}
	row("ID", l.ID)
	row("State", string(l.State))
	row("Reason", l.Reason)
	row("Kind", string(l.Kind))
	row("Mode", string(l.Mode))
	row("Size", capacity(l.Kind, l.Size))
	row("Count", strconv.Itoa(l.Count))
	if l.StripeUnit > 0 {
		row("Stripe unit", resource.FormatSize(l.StripeUnit))
	}
	row("Tenant", l.Tenant)
	row("Borrower", l.Borrower)
	if n := names[l.NodeID]; n != "" {
		row("Node", n+" ("+l.NodeID+")")
	} else {
		row("Node", l.NodeID)
	}
	row("Device", l.DeviceID)
	row("URI", l.URI)
	if l.TTLSeconds > 0 {
		row("TTL", (time.Duration(l.TTLSeconds) * time.Second).String())
	}
	if !l.ExpiresAt.IsZero() {
		row("Expires", l.ExpiresAt.Local().Format(time.RFC3339))
	}
	if !l.CreatedAt.IsZero() {
		row("Created", l.CreatedAt.Local().Format(time.RFC3339))
	}
	row("Idempotency key", l.IdempotencyKey)
	tw.Flush()
	if len(l.Parts) > 0 {
		fmt.Fprintln(w)
		printParts(w, l.Kind, l.Parts, true, names)
	}
	// The server sends the plan's explanation with lease show (GET), not
	// with the answers to create, renew and release.
	if l.Plan != nil && len(l.Plan.Explanation) > 0 {
		fmt.Fprintln(w, "\nWhy:")
		for _, s := range l.Plan.Explanation {
			fmt.Fprintf(w, "  - %s\n", s)
		}
	}
}

func printParts(w io.Writer, k api.Kind, parts []api.Part, uri bool, names map[string]string) {
	tw := newTable(w)
	hdr := "PART\tNODE\tDEVICE\tOFFSET\tLENGTH"
	if uri {
		hdr += "\tURI"
	}
	fmt.Fprintln(tw, hdr)
	for i, p := range parts {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s", i, nodeName(names, p.NodeID), p.DeviceID, capacity(k, p.Offset), capacity(k, p.Length))
		if uri {
			fmt.Fprintf(tw, "\t%s", dash(p.URI))
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
}

// requestFlags are lease create's and explain's flags.
type requestFlags struct {
	kind, mode, size, ttl, stripe, key, borrower, strategy, role, bwCap, work string
	roleConfig, roleModule, bandwidth                                         string
	count, iopsCap                                                            int
	whole                                                                     bool
	deadline                                                                  float64
	labels, affinity, anti                                                    listFlag
}

func (rf *requestFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&rf.kind, "kind", "block", "resource kind: block, memory, accel, nic")
	fs.StringVar(&rf.mode, "mode", "", "dedicated, shared or composed (default: placement chooses; accel: dedicated slots, or shared through the lender's gateway; nic: dedicated is a whole interface)")
	fs.StringVar(&rf.size, "size", "", "size, e.g. 256MiB, 2GiB (block, memory)")
	fs.IntVar(&rf.count, "count", 0, "devices to compose, accelerator slots (with --whole: the least slots), or lent NICs of different lenders to bond (nic)")
	fs.BoolVar(&rf.whole, "whole", false, "an entire unused device, dedicated (block, memory, nic: also no --size or --bandwidth; accel: every slot)")
	fs.StringVar(&rf.ttl, "ttl", "", "lease lifetime, e.g. 30m, 2h, or seconds (default: the server's)")
	fs.StringVar(&rf.stripe, "stripe-unit", "", "stripe unit of a composed lease, e.g. 64KiB")
	fs.StringVar(&rf.key, "idempotency-key", "", "retries with the same key return the same lease")
	fs.StringVar(&rf.borrower, "borrower", "", "borrowing node ID or client name")
	fs.StringVar(&rf.strategy, "strategy", "", "binpack or spread")
	fs.StringVar(&rf.role, "role", "", "accelerator role to load (with --mode shared: the role of the lender's batching gateway)")
	fs.StringVar(&rf.roleConfig, "role-config", "", "file holding the role's config: the AES-GCM key (raw 16, 24 or 32 bytes), the MCT rule set (JSON)")
	fs.StringVar(&rf.roleModule, "role-module", "", "file holding a wasm role's WebAssembly module")
	fs.StringVar(&rf.bandwidth, "bandwidth", "", "bandwidth wanted, e.g. 500Mbit/s, 1Gbit/s, 200MB/s, or bytes/s (nic: the share of a lent interface to reserve, a bond's total; its lenders cap the lease there)")
	fs.Float64Var(&rf.deadline, "deadline", 0, "completion deadline, seconds")
	fs.StringVar(&rf.bwCap, "bandwidth-cap", "", "cap the lease's exports at this many bytes/s, e.g. 100MiB (block)")
	fs.IntVar(&rf.iopsCap, "iops-cap", 0, "cap the lease's exports at this many requests/s (block)")
	fs.StringVar(&rf.work, "work", "", "bytes the workload will move, e.g. 150GB (for completion times and --deadline)")
	fs.Var(&rf.labels, "label", "select donor nodes carrying label KEY=VALUE (repeatable; all must match)")
	fs.Var(&rf.affinity, "affinity", "donor must match one term: node name or ID, KEY=VALUE, or a device ID to pin (repeatable)")
	fs.Var(&rf.anti, "anti-affinity", "donor must match no term: node name or ID, or KEY=VALUE (repeatable)")
}

func parseTTL(s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil && n > 0 {
		return n, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < time.Second {
		return 0, fmt.Errorf("bad --ttl %q: use a duration such as 30m or a number of seconds", s)
	}
	return int64(d / time.Second), nil
}

func (rf *requestFlags) request() (api.LeaseRequest, error) {
	r := api.LeaseRequest{
		Kind: api.Kind(strings.ToLower(rf.kind)), Mode: api.Mode(strings.ToLower(rf.mode)), Count: rf.count, Whole: rf.whole,
		IdempotencyKey: rf.key, Borrower: rf.borrower, Strategy: rf.strategy, Role: rf.role,
		DeadlineSecond: rf.deadline, IOPSCap: int64(rf.iopsCap),
	}
	if rf.bandwidth != "" {
		v, err := parseRate(rf.bandwidth)
		if err != nil {
			return r, fmt.Errorf("bad --bandwidth: %w", err)
		}
		r.Bandwidth = v
	}
	if rf.bwCap != "" {
		v, err := resource.ParseSize(rf.bwCap)
		if err != nil {
			return r, fmt.Errorf("bad --bandwidth-cap: %w", err)
		}
		r.BandwidthCap = v
	}
	switch r.Kind {
	case api.KindBlock, api.KindMemory, api.KindAccel, api.KindNIC:
	default:
		return r, fmt.Errorf("unknown --kind %q (block, memory, accel, nic)", rf.kind)
	}
	switch r.Mode {
	case "", api.ModeDedicated, api.ModeShared, api.ModeComposed:
	default:
		return r, fmt.Errorf("unknown --mode %q (dedicated, shared, composed)", rf.mode)
	}
	if rf.count < 0 {
		return r, fmt.Errorf("--count must not be negative")
	}
	var err error
	if rf.size != "" {
		if r.Size, err = resource.ParseSize(rf.size); err != nil {
			return r, fmt.Errorf("bad --size: %w", err)
		}
	}
	if rf.stripe != "" {
		if r.StripeUnit, err = resource.ParseSize(rf.stripe); err != nil {
			return r, fmt.Errorf("bad --stripe-unit: %w", err)
		}
	}
	if r.TTLSeconds, err = parseTTL(rf.ttl); err != nil {
		return r, err
	}
	if rf.roleConfig != "" || rf.roleModule != "" {
		if r.Role == "" {
			return r, fmt.Errorf("--role-config and --role-module need --role")
		}
		r.RoleConfig = &api.RoleConfig{}
		for _, f := range []struct {
			path string
			dst  *[]byte
		}{{rf.roleConfig, &r.RoleConfig.Config}, {rf.roleModule, &r.RoleConfig.Module}} {
			if f.path == "" {
				continue
			}
			if *f.dst, err = readLimited(f.path, api.MaxRoleConfig); err != nil {
				return r, err
			}
		}
	}
	if rf.work != "" {
		if r.Work, err = resource.ParseSize(rf.work); err != nil {
			return r, fmt.Errorf("bad --work: %w", err)
		}
	}
	for _, l := range rf.labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return r, fmt.Errorf("bad --label %q: use KEY=VALUE", l)
		}
		if r.Labels == nil {
			r.Labels = map[string]string{}
		}
		r.Labels[k] = v
	}
	r.Affinity, r.AntiAffinity = []string(rf.affinity), []string(rf.anti)
	return r, nil
}

// parseRate parses a rate into bytes/s: bits with a unit ending in "bit"
// ("500Mbit/s", "1gbit", "100 kbit/s"; decimal prefixes), else bytes as
// sizes are written ("200MB/s", "64MiB/s", "2e9": a bare number is bytes/s).
func parseRate(s string) (float64, error) {
	t := strings.TrimSpace(s)
	lt := strings.ToLower(t)
	if u, ok := strings.CutSuffix(lt, "/s"); ok {
		lt, t = u, t[:len(u)]
	} else if u, ok := strings.CutSuffix(lt, "ps"); ok && strings.HasSuffix(u, "bit") {
		lt, t = u, t[:len(u)] // "500mbitps"
	}
	if num, ok := strings.CutSuffix(lt, "bit"); ok {
		mult := 1.0
		if n := len(num); n > 0 {
			switch num[n-1] {
			case 'k':
				mult, num = 1e3, num[:n-1]
			case 'm':
				mult, num = 1e6, num[:n-1]
			case 'g':
				mult, num = 1e9, num[:n-1]
			case 't':
				mult, num = 1e12, num[:n-1]
			}
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
		if err != nil || v < 0 || math.IsInf(v, 0) || math.IsNaN(v) {
			return 0, fmt.Errorf("%q: want a rate such as 500Mbit/s, 1Gbit/s or 200MB/s", s)
		}
		return v * mult / 8, nil
	}
	n, err := resource.ParseSize(t)
	if err != nil {
		return 0, fmt.Errorf("%q: want a rate such as 500Mbit/s, 1Gbit/s or 200MB/s", s)
	}
	return float64(n), nil
}

// readLimited reads a file of at most limit bytes (without quoting it in
// errors: it may hold a key).
func readLimited(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes; load large roles through the appliance's management API", path, limit)
	}
	return b, nil
}

func runLeaseCreate(ctx context.Context, e *env, args []string) error {
	var cf clientFlags
	var rf requestFlags
	fs := newFlags(e, "lease create", "")
	cf.register(fs, e)
	rf.register(fs)
	dry := fs.Bool("dry-run", false, "print the plan only (same as explain)")
	if _, err := parse(fs, args, 0, 0); err != nil {
		return err
	}
	req, err := rf.request()
	if err != nil {
		return err
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	if *dry {
		return explain(ctx, e, c, &cf, req)
	}
	l, err := c.CreateLease(ctx, req)
	if err != nil {
		return err
	}
	if cf.json() {
		return printJSON(e.stdout, l)
	}
	printLease(e.stdout, l, nodeNames(ctx, c))
	return nil
}

func leaseByID(op string) func(context.Context, *env, []string) error {
	return func(ctx context.Context, e *env, args []string) error {
		var cf clientFlags
		fs := newFlags(e, "lease "+op, "ID")
		cf.register(fs, e)
		var ttl *string
		if op == "renew" {
			ttl = fs.String("ttl", "", "new lifetime from now, e.g. 1h (default: the lease's TTL)")
		}
		pos, err := parse(fs, args, 1, 1)
		if err != nil {
			return err
		}
		c, err := cf.client()
		if err != nil {
			return err
		}
		var l api.Lease
		switch op {
		case "show":
			l, err = c.Lease(ctx, pos[0])
		case "release":
			l, err = c.ReleaseLease(ctx, pos[0])
		case "renew":
			var secs int64
			if secs, err = parseTTL(*ttl); err != nil {
				return err
			}
			l, err = c.RenewLease(ctx, pos[0], secs)
		}
		if err != nil {
			return err
		}
		if cf.json() {
			return printJSON(e.stdout, l)
		}
		printLease(e.stdout, l, nodeNames(ctx, c))
		return nil
	}
}

func runExplain(ctx context.Context, e *env, args []string) error {
	var cf clientFlags
	var rf requestFlags
	fs := newFlags(e, "explain", "")
	cf.register(fs, e)
	rf.register(fs)
	if _, err := parse(fs, args, 0, 0); err != nil {
		return err
	}
	req, err := rf.request()
	if err != nil {
		return err
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	return explain(ctx, e, c, &cf, req)
}

// planOut is a plan as the CLI prints it: plans of dry runs have no ID,
// so the CLI names them "dry-run".
type planOut struct {
	api.Plan
}

func explain(ctx context.Context, e *env, c *api.Client, cf *clientFlags, req api.LeaseRequest) error {
	p, err := c.Explain(ctx, req)
	if err != nil {
		return err
	}
	if p.ID == "" {
		p.ID = "dry-run"
	}
	if cf.json() {
		return printJSON(e.stdout, planOut{p})
	}
	tw := newTable(e.stdout)
	fmt.Fprintf(tw, "Plan:\t%s\n", p.State)
	if p.Mode != "" {
		fmt.Fprintf(tw, "Mode:\t%s\n", p.Mode)
	}
	if p.PredictedBandwidth > 0 {
		fmt.Fprintf(tw, "Predicted bandwidth:\t%s/s\n", resource.FormatSize(int64(p.PredictedBandwidth)))
	}
	if p.PredictedCompletion > 0 {
		fmt.Fprintf(tw, "Predicted completion:\t%.1fs\n", p.PredictedCompletion)
	}
	tw.Flush()
	if len(p.Parts) > 0 {
		fmt.Fprintln(e.stdout)
		printParts(e.stdout, req.Kind, p.Parts, false, nodeNames(ctx, c))
	}
	if len(p.Impacts) > 0 {
		fmt.Fprintln(e.stdout)
		tw := newTable(e.stdout)
		fmt.Fprintln(tw, "SLOWS LEASE\tBANDWIDTH BEFORE\tAFTER\tCOMPLETION BEFORE\tAFTER")
		for _, im := range p.Impacts {
			if im.LeaseID == "" {
				im.LeaseID = "(another tenant's)"
			}
			fmt.Fprintf(tw, "%s\t%s/s\t%s/s\t%.1fs\t%.1fs\n", im.LeaseID, resource.FormatSize(int64(im.BandwidthBefore)),
				resource.FormatSize(int64(im.BandwidthAfter)), im.CompletionBefore, im.CompletionAfter)
		}
		tw.Flush()
	}
	if len(p.Explanation) > 0 {
		fmt.Fprintln(e.stdout, "\nWhy:")
		for _, s := range p.Explanation {
			fmt.Fprintf(e.stdout, "  - %s\n", s)
		}
	}
	return nil
}
