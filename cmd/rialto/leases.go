package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/resource"
)

func init() {
	register(&command{Name: "leases", Summary: "List live leases (--all: also ended ones).", Flags: runLeases})
	register(&command{Name: "lease create", Summary: "Borrow a device: place, reserve and activate a lease.", Flags: leaseCreate(false)})
	register(&command{Name: "lease show", Args: "ID", Summary: "Show a lease, its parts and their URIs.", Help: leaseSizeHelp, Flags: leaseByID("show"), MinArgs: 1, MaxArgs: 1})
	register(&command{Name: "lease release", Args: "ID", Summary: "End a lease and free its devices.", Flags: leaseByID("release"), MinArgs: 1, MaxArgs: 1})
	register(&command{Name: "lease renew", Args: "ID", Summary: "Extend a lease's TTL (--ttl, default the lease's own).", Flags: leaseByID("renew"), MinArgs: 1, MaxArgs: 1})
	register(&command{Name: "explain", Summary: "Show the plan a lease request would get and why, reserving nothing (lease create --dry-run).",
		Help: explainStatus, Flags: leaseCreate(true)})
}

func runLeases(e *env, fs *pflag.FlagSet) runFunc {
	var cf clientFlags
	cf.register(fs, e)
	var all bool
	const allHelp = "also list ended leases (released, expired, failed, lost): the whole history"
	fs.BoolVarP(&all, "all", "a", false, allHelp)
	var kind, tenant string
	fs.StringVar(&kind, "kind", "", "only leases of this kind (block, memory, accel, nic)")
	fs.StringVar(&tenant, "tenant", "", "only this tenant's leases (an admin token)")
	return func(ctx context.Context, _ []string) error {
		c, err := cf.client()
		if err != nil {
			return err
		}
		// By default only live leases (reserved, active, releasing) are asked
		// for: the server answers with what is lent now, not the history.
		ls, err := c.ListLeases(ctx, api.LeaseQuery{All: all, Kind: api.Kind(kind), Tenant: tenant})
		if err != nil {
			return err
		}
		if cf.json() {
			return cf.print(e.stdout, nonNil(ls))
		}
		printLeases(e.stdout, ls, nodeNames(ctx, c), time.Now())
		return nil
	}
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

// printLeases prints the leases table; EXPIRES IN is from now.
func printLeases(w io.Writer, ls []api.Lease, names map[string]string, now time.Time) {
	sort.Slice(ls, func(i, j int) bool { return ls[i].CreatedAt.Before(ls[j].CreatedAt) })
	tw := newTable(w)
	fmt.Fprintln(tw, "ID\tSTATE\tKIND\tMODE\tSIZE\tCOUNT\tNODE\tDEVICE\tTENANT\tEXPIRES IN")
	for _, l := range ls {
		nodes, devices := leaseWhere(l, names)
		exp := "-"
		if !l.State.Terminal() {
			exp = until(now, l.ExpiresAt)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", l.ID, l.State, l.Kind, dash(string(l.Mode)),
			capacity(l.Kind, leaseSize(l)), l.Count, nodesCell(nodes), devicesCell(devices), dash(l.Tenant), exp)
	}
	tw.Flush()
}

// leaseWhere is where a lease's parts are: its lenders' names and its
// devices' IDs, each once, in the parts' order, lost parts left out. A
// lease of several parts (composed, a bond) has several; the API's
// node_id and device_id name only the first part's. A lease without a
// part to show has those.
func leaseWhere(l api.Lease, names map[string]string) (nodes, devices []string) {
	for _, p := range l.Parts {
		if p.Lost() {
			continue
		}
		if n := nodeName(names, p.NodeID); !slices.Contains(nodes, n) {
			nodes = append(nodes, n)
		}
		if p.DeviceID != "" && !slices.Contains(devices, p.DeviceID) {
			devices = append(devices, p.DeviceID)
		}
	}
	if len(nodes) == 0 && l.NodeID != "" {
		nodes = []string{nodeName(names, l.NodeID)}
	}
	if len(devices) == 0 && l.DeviceID != "" {
		devices = []string{l.DeviceID}
	}
	return nodes, devices
}

// nodesCell is the lease table's NODE: the lenders' names, comma
// separated, or how many there are when they would widen the table.
func nodesCell(nodes []string) string {
	switch {
	case len(nodes) == 0:
		return "-"
	case len(nodes) > 3:
		return strconv.Itoa(len(nodes)) + " nodes"
	}
	return strings.Join(nodes, ",")
}

// devicesCell is the lease table's DEVICE: the device's ID, or how many
// devices the lease's parts are on (lease show lists them).
func devicesCell(devices []string) string {
	switch len(devices) {
	case 0:
		return "-"
	case 1:
		return devices[0]
	}
	return strconv.Itoa(len(devices)) + " devices"
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
	switch n := leaseSize(l); {
	case n == l.Size:
		row("Size", capacity(l.Kind, n))
	case l.Size == 0:
		row("Size", capacity(l.Kind, n)+" (a whole device)")
	default:
		row("Size", capacity(l.Kind, n)+" (asked for "+capacity(l.Kind, l.Size)+")")
	}
	row("Count", strconv.Itoa(l.Count))
	if l.StripeUnit > 0 {
		row("Stripe unit", resource.FormatSize(l.StripeUnit))
	}
	// The caps of --bandwidth-cap and --iops-cap, which every lender of
	// the lease enforces.
	if l.BandwidthCap > 0 {
		row("Bandwidth cap", resource.FormatRate(float64(l.BandwidthCap)))
	}
	if l.IOPSCap > 0 {
		row("IOPS cap", strconv.FormatInt(l.IOPSCap, 10)+"/s")
	}
	row("Tenant", l.Tenant)
	row("Borrower", l.Borrower)
	// A lease of several parts is on each of their nodes and devices (the
	// parts' table below says which part is where).
	switch nodes, devices := leaseWhere(l, names); {
	case len(nodes) > 1 || len(devices) > 1:
		row("Nodes", strings.Join(nodes, ", "))
		row("Devices", strings.Join(devices, ", "))
	default:
		if n := names[l.NodeID]; n != "" {
			row("Node", n+" ("+l.NodeID+")")
		} else {
			row("Node", l.NodeID)
		}
		row("Device", l.DeviceID)
	}
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
	if l.Plan != nil {
		printWhy(w, l.Plan.Explanation)
	}
}

// leaseSizeHelp is lease show's help on a lease's size in its JSON.
const leaseSizeHelp = `Size: what the lease holds, what its borrower sees, with the size asked for
beside it when they differ ("1GiB (asked for 256MiB)", "1GiB (a whole device)").
With -o json, .held is what it holds and .size what its request asked for
(0 for a whole device); in the kind's unit: bytes, a nic's rate in bytes/s,
an accel lease's slot units (1000 a slot).`

// printWhy prints a plan's explanation as a list. A line that starts with
// spaces details the line before it (the devices an infeasible request
// was refused on) and is indented under it rather than given a bullet.
func printWhy(w io.Writer, lines []string) {
	if len(lines) == 0 {
		return
	}
	fmt.Fprintln(w, "\nWhy:")
	for _, s := range lines {
		if t := strings.TrimLeft(s, " "); t != s {
			fmt.Fprintf(w, "      %s\n", t)
			continue
		}
		fmt.Fprintf(w, "  - %s\n", s)
	}
}

// leaseSize is what a lease holds, what its borrower sees: the API's
// held, which is more than its size when it asked for a whole device (no
// size: the API's size is 0) or got one (a dedicated lease holds its
// device whole), or when a composed lease's parts are rounded up to its
// stripe unit. A lease that holds nothing (no parts) shows its size.
func leaseSize(l api.Lease) int64 {
	if l.Held > 0 {
		return l.Held
	}
	return l.Size
}

// printParts prints a lease's (or a plan's) parts; a STATE column says
// which are lost when a part is (a bond that lost a lender goes on
// without it, and the lost part's URI is served by no one).
func printParts(w io.Writer, k api.Kind, parts []api.Part, uri bool, names map[string]string) {
	tw := newTable(w)
	lost := slices.ContainsFunc(parts, api.Part.Lost)
	hdr := "PART\tNODE\tDEVICE\tOFFSET\tLENGTH"
	if lost {
		hdr += "\tSTATE"
	}
	if uri {
		hdr += "\tURI"
	}
	fmt.Fprintln(tw, hdr)
	for i, p := range parts {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s", i, nodeName(names, p.NodeID), p.DeviceID, capacity(k, p.Offset), capacity(k, p.Length))
		if lost {
			st := "served"
			if p.Lost() {
				st = "lost"
			}
			fmt.Fprintf(tw, "\t%s", st)
		}
		if uri {
			fmt.Fprintf(tw, "\t%s", dash(p.URI))
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
}

// requestFlags are lease create's (and explain's) flags.
type requestFlags struct {
	kind, mode                                            *choiceFlag
	size, stripe, bwCap, work                             *sizeFlag
	bandwidth                                             *rateFlag
	ttl, deadline                                         *durationFlag
	key, borrower, strategy, role, roleConfig, roleModule string
	count, iopsCap                                        int
	whole                                                 bool
	share                                                 float64
	labels, affinity, anti                                listFlag
}

func (rf *requestFlags) register(fs *pflag.FlagSet) {
	rf.kind = kindFlag(api.KindBlock)
	fs.Var(rf.kind, "kind", "resource kind: "+api.KindNames())
	rf.mode = modeFlag()
	fs.Var(rf.mode, "mode", "dedicated, shared or composed (default: placement chooses; accel: dedicated slots, or shared through the lender's gateway; nic: dedicated is a whole interface)")
	rf.size = sizeVar(fs, "size", "", "size, e.g. 256MiB, 10GiB (block, memory; without it a block or memory lease takes a whole unused device, as with --whole, where it is the least capacity)")
	fs.IntVar(&rf.count, "count", 0, "devices to compose, accelerator slots (with --whole: the least slots), or lent NICs of different lenders to bond (nic)")
	fs.BoolVar(&rf.whole, "whole", false, "an entire unused device, dedicated (block, memory, nic: also no --size or --bandwidth; accel: every slot)")
	rf.ttl = durationVar(fs, "ttl", 0, time.Second, "lease lifetime, e.g. 30m, 2h, or seconds (default: the server's)")
	rf.stripe = sizeVar(fs, "stripe-unit", "", "stripe unit of a composed lease, e.g. 64KiB")
	fs.StringVar(&rf.key, "idempotency-key", "", "retries with the same key return the same lease")
	fs.StringVar(&rf.borrower, "borrower", "", "borrowing node ID or client name")
	fs.StringVar(&rf.strategy, "strategy", "", "binpack or spread")
	fs.StringVar(&rf.role, "role", "", "accelerator role to load (with --mode shared: the role of the lender's batching gateway)")
	fs.Float64Var(&rf.share, "share", 0, "with --kind accel --mode shared: the share of one slot the lease takes, e.g. 0.25 (default 0.25: four leases a slot); also its weight at the gateway")
	fs.StringVar(&rf.roleConfig, "role-config", "", "`file` holding the role's config: the AES-GCM key (raw 16, 24 or 32 bytes), the MCT rule set (JSON)")
	fs.StringVar(&rf.roleModule, "role-module", "", "`file` holding a wasm role's WebAssembly module")
	rf.bandwidth = &rateFlag{kind: rf.kind}
	fs.Var(rf.bandwidth, "bandwidth", "bandwidth wanted, e.g. 500Mbit/s, 1Gbit/s, 500MB/s, or bytes/s (nic: the share of a lent interface to reserve, a bond's total; its lenders cap the lease there)")
	rf.deadline = durationVar(fs, "deadline", 0, time.Millisecond, "completion deadline, e.g. 90s, 20m (a bare number is seconds)")
	rf.bwCap = &sizeFlag{}
	fs.Var(&rateAsSize{rf.bwCap}, "bandwidth-cap", "cap the lease's exports at this rate, e.g. 100MiB/s, 800Mbit/s (block)")
	fs.IntVar(&rf.iopsCap, "iops-cap", 0, "cap the lease's exports at this many requests/s (block)")
	rf.work = sizeVar(fs, "work", "", "bytes the workload will move, e.g. 150GB (for completion times and --deadline)")
	fs.Var(&rf.labels, "label", "select donor nodes carrying label KEY=VALUE (repeatable; all must match)")
	fs.Var(&rf.affinity, "affinity", "donor must match one term: node name or ID, KEY=VALUE, or a device ID to pin (repeatable)")
	fs.Var(&rf.anti, "anti-affinity", "donor must match no term: node name or ID, or KEY=VALUE (repeatable)")
}

// rateAsSize is a rate flag stored as whole bytes/s.
type rateAsSize struct{ f *sizeFlag }

func (r *rateAsSize) String() string {
	if !r.f.set {
		return ""
	}
	return resource.FormatRate(float64(r.f.n))
}
func (r *rateAsSize) Type() string { return "rate" }
func (r *rateAsSize) Set(s string) error {
	v, err := parseRate(s)
	if err != nil {
		return err
	}
	r.f.n, r.f.set = int64(v), true
	return nil
}

func (rf *requestFlags) request() (api.LeaseRequest, error) {
	r := api.LeaseRequest{
		Kind: api.Kind(rf.kind.v), Mode: api.Mode(rf.mode.v), Count: rf.count, Whole: rf.whole,
		IdempotencyKey: rf.key, Borrower: rf.borrower, Strategy: rf.strategy, Role: rf.role,
		DeadlineSecond: rf.deadline.d.Seconds(), IOPSCap: int64(rf.iopsCap),
		Bandwidth: rf.bandwidth.v, BandwidthCap: rf.bwCap.n, Size: rf.size.n, StripeUnit: rf.stripe.n,
		TTLSeconds: int64(rf.ttl.d / time.Second), Work: rf.work.n, Share: rf.share,
	}
	if rf.count < 0 {
		return r, usagef("--count must not be negative")
	}
	if rf.size.set && rf.size.n == 0 && !rf.whole {
		return r, usagef("--size 0 asks for nothing: give a size, or --whole for an entire device")
	}
	var err error
	if rf.roleConfig != "" || rf.roleModule != "" {
		if r.Role == "" {
			return r, usagef("--role-config and --role-module need --role")
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
	for _, l := range rf.labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return r, usagef("bad --label %q: use KEY=VALUE", l)
		}
		if r.Labels == nil {
			r.Labels = map[string]string{}
		}
		r.Labels[k] = v
	}
	r.Affinity, r.AntiAffinity = []string(rf.affinity), []string(rf.anti)
	return r, nil
}

// fieldFlag is the flag that sets a request's field, for flagTerms.
type fieldFlag struct {
	field, flag, given string
	// value is the field's value sent (in the field's unit).
	value float64
	// unit is a number of the field's in the flag's unit: "720h", "1TiB".
	unit func(float64) string
}

// durationText is a number of seconds as a duration flag reads it:
// "720h", "1h30m", "90s".
func durationText(sec float64) string {
	s := time.Duration(sec * float64(time.Second)).String()
	s, _ = strings.CutSuffix(s, "m0s")
	if t, ok := strings.CutSuffix(s, "h0"); ok {
		return t + "h"
	}
	if !strings.HasSuffix(s, "s") {
		s += "m"
	}
	return s
}

// bytesText is a number of bytes as a size flag reads it.
func bytesText(n float64) string { return resource.FormatSize(int64(n)) }

// fieldLimit finds the API's words for a field over its maximum:
// "ttl_seconds 360000000 is more than the maximum 2592000" (lease
// create), "ttl_seconds must be between 0 and 2592000" (renew: also a
// value below 0, the second group then "").
var fieldLimit = regexp.MustCompile(`^([a-z_]+) (?:\S+ is more than the maximum|(must be between 0 and)) (\S+)$`)

// flagTerms says an invalid_request answer about a field one of flags
// sets in the flag's terms, as given: "--ttl 100000h is more than the
// maximum 720h", not "ttl_seconds 360000000 is more than the maximum
// 2592000" (a limit of the control plane's configuration, which the
// command cannot check before asking). Other errors are err.
func flagTerms(err error, flags ...fieldFlag) error {
	var ae *api.Error
	if !errors.As(err, &ae) || !api.IsCode(err, api.CodeInvalid) {
		return err
	}
	m := fieldLimit.FindStringSubmatch(ae.Message)
	if m == nil {
		return err
	}
	limit, perr := strconv.ParseFloat(m[3], 64)
	for _, f := range flags {
		// "must be between 0 and N" also refuses a value below 0: that
		// is not more than the maximum.
		if f.field == m[1] && f.given != "" && perr == nil && (m[2] == "" || f.value > limit) {
			ae.Message = fmt.Sprintf("%s %s is more than the maximum %s", f.flag, f.given, f.unit(limit))
		}
	}
	return err
}

// flagTerms is flagTerms of lease create's (and explain's) flags.
func (rf *requestFlags) flagTerms(err error) error {
	return flagTerms(err, fieldFlag{"ttl_seconds", "--ttl", rf.ttl.text, float64(rf.ttl.d / time.Second), durationText},
		fieldFlag{"deadline_seconds", "--deadline", rf.deadline.text, rf.deadline.d.Seconds(), durationText},
		fieldFlag{"size", "--size", rf.size.text, float64(rf.size.n), bytesText},
		fieldFlag{"stripe_unit", "--stripe-unit", rf.stripe.text, float64(rf.stripe.n), bytesText})
}

// parseRate is resource.ParseRate refusing as a flag does: the flag's
// name and the text given are pflag's to quote.
func parseRate(s string) (float64, error) {
	v, err := resource.ParseRate(s)
	if err != nil {
		return 0, errors.New("want a rate such as 500Mbit/s, 1Gbit/s or 200MB/s")
	}
	return v, nil
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

// leaseCreate is lease create; dry, explain: the plan only (explain is
// lease create --dry-run, one code path).
func leaseCreate(explainOnly bool) func(*env, *pflag.FlagSet) runFunc {
	return func(e *env, fs *pflag.FlagSet) runFunc {
		dry := explainOnly
		var cf clientFlags
		var rf requestFlags
		cf.register(fs, e)
		rf.register(fs)
		fs.BoolVar(&dry, "dry-run", dry, "print the plan and why, reserving nothing (rialto explain); exit status 3 if the request is infeasible")
		if dry {
			fs.MarkHidden("dry-run")
		}
		return func(ctx context.Context, _ []string) error {
			req, err := rf.request()
			if err != nil {
				return err
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			if dry {
				return rf.flagTerms(explain(ctx, e, c, &cf, req))
			}
			l, err := c.CreateLease(ctx, req)
			if err != nil {
				return rf.flagTerms(err)
			}
			if cf.json() {
				return cf.print(e.stdout, l)
			}
			printLease(e.stdout, l, nodeNames(ctx, c))
			return nil
		}
	}
}

func leaseByID(op string) func(*env, *pflag.FlagSet) runFunc {
	return func(e *env, fs *pflag.FlagSet) runFunc {
		var cf clientFlags
		cf.register(fs, e)
		var ttl *durationFlag
		if op == "renew" {
			ttl = durationVar(fs, "ttl", 0, time.Second, "new lifetime from now, e.g. 1h (default: the lease's TTL)")
		}
		return func(ctx context.Context, pos []string) error {
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
				l, err = c.RenewLease(ctx, pos[0], int64(ttl.d/time.Second))
				err = flagTerms(err, fieldFlag{"ttl_seconds", "--ttl", ttl.text, float64(ttl.d / time.Second), durationText})
			}
			if err != nil {
				return err
			}
			if cf.json() {
				return cf.print(e.stdout, l)
			}
			printLease(e.stdout, l, nodeNames(ctx, c))
			return nil
		}
	}
}

// kindRate shows a rate in bytes/s of a lease of kind k: a nic's as a
// link rate (resource.FormatLinkRate, "500Mbit/s", as its size shows),
// any other's as rates print (resource.FormatRate, "477MB/s").
func kindRate(k api.Kind, bytesPerSec float64) string {
	if k == api.KindNIC {
		return resource.FormatLinkRate(bytesPerSec)
	}
	return resource.FormatRate(bytesPerSec)
}

// seconds shows a predicted completion time in seconds, "-" for none (a
// lease that declared no --work has no completion time).
func seconds(s float64) string {
	if s <= 0 {
		return "-"
	}
	return strconv.FormatFloat(s, 'f', 1, 64) + "s"
}

// planOut is a plan as the CLI prints it: plans of dry runs have no ID,
// so the CLI names them "dry-run".
type planOut struct {
	api.Plan
}

// explainStatus is explain's help on its exit status.
const explainStatus = `Exit status: 0 if the request is feasible; 3 if it is infeasible (no placement
satisfies it, or it is over the tenant's quota), after printing the plan and
why; 1 if no plan could be had (the control plane refused the request or could
not be reached); 2 for a mistake on the command line.`

// explain prints the plan req would get; an infeasible one ends with
// exitInfeasible, after the plan.
func explain(ctx context.Context, e *env, c *api.Client, cf *clientFlags, req api.LeaseRequest) error {
	p, err := c.Explain(ctx, req)
	if err != nil {
		return err
	}
	if p.ID == "" {
		p.ID = "dry-run"
	}
	if err := printPlan(ctx, e, c, cf, req, p); err != nil {
		return err
	}
	if p.State == "infeasible" {
		return statusError{exitInfeasible, errors.New("infeasible: no placement satisfies the request; the plan's explanation says why; " + devicesHint)}
	}
	return nil
}

func printPlan(ctx context.Context, e *env, c *api.Client, cf *clientFlags, req api.LeaseRequest, p api.Plan) error {
	if cf.json() {
		return cf.print(e.stdout, planOut{p})
	}
	tw := newTable(e.stdout)
	fmt.Fprintf(tw, "Plan:\t%s\n", p.State)
	if p.Mode != "" {
		fmt.Fprintf(tw, "Mode:\t%s\n", p.Mode)
	}
	if p.PredictedBandwidth > 0 {
		fmt.Fprintf(tw, "Predicted bandwidth:\t%s\n", kindRate(req.Kind, p.PredictedBandwidth))
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
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", im.LeaseID, kindRate(im.Kind, im.BandwidthBefore),
				kindRate(im.Kind, im.BandwidthAfter), seconds(im.CompletionBefore), seconds(im.CompletionAfter))
		}
		tw.Flush()
	}
	printWhy(e.stdout, p.Explanation)
	return nil
}
