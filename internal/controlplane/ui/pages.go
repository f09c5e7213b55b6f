package ui

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/resource"
)

// apiTimeout bounds the API calls of one page.
const apiTimeout = 15 * time.Second

func (u *UI) ctx(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), apiTimeout)
}

var kindOrder = []api.Kind{api.KindBlock, api.KindMemory, api.KindAccel, api.KindNIC}

// deviceRow is a device with its node's name and its measured use.
type deviceRow struct {
	api.Device
	NodeName          string
	Used              int64
	HasUsed           bool
	ReadBps, WriteBps float64
	HasRate           bool
}

// kindSummary totals one kind's devices.
type kindSummary struct {
	Kind                      api.Kind
	Devices                   int
	Capacity, Allocated, Used int64
	HasUsed                   bool
	Bps                       float64
}

type stateCount struct {
	State string
	N     int
}

type overviewData struct {
	Now         time.Time
	Nodes       []api.Node
	NodeStates  []stateCount
	Kinds       []kindSummary
	Devices     []deviceRow
	LeaseStates []stateCount
	Live        int
	Alloc       string // SVG
}

func counts[T any](xs []T, key func(T) string, order []string) []stateCount {
	m := map[string]int{}
	for _, x := range xs {
		m[key(x)]++
	}
	var out []stateCount
	for _, k := range order {
		if m[k] > 0 {
			out = append(out, stateCount{k, m[k]})
			delete(m, k)
		}
	}
	var rest []string
	for k := range m {
		rest = append(rest, k)
	}
	sort.Strings(rest)
	for _, k := range rest {
		out = append(out, stateCount{k, m[k]})
	}
	return out
}

// inventory reads nodes, devices and usage.
func (u *UI) inventory(ctx context.Context, c *api.Client) ([]api.Node, []deviceRow, error) {
	nodes, err := c.Nodes(ctx)
	if err != nil {
		return nil, nil, err
	}
	devs, err := c.Devices(ctx)
	if err != nil {
		return nil, nil, err
	}
	usage, err := c.Usage(ctx)
	if err != nil {
		return nil, nil, err
	}
	names := map[string]string{}
	for _, n := range nodes {
		names[n.ID] = n.Name
	}
	byDev := map[string]api.DeviceUsage{}
	for _, du := range usage {
		byDev[du.DeviceID] = du
	}
	rows := make([]deviceRow, 0, len(devs))
	for _, d := range devs {
		row := deviceRow{Device: d, NodeName: names[d.NodeID]}
		if row.NodeName == "" {
			row.NodeName = d.NodeID
		}
		if du, ok := byDev[d.ID]; ok {
			if du.UsedBytes != nil {
				row.Used, row.HasUsed = *du.UsedBytes, true
			}
			row.ReadBps, row.WriteBps, row.HasRate = du.ReadBps, du.WriteBps, len(du.Samples) > 0
		}
		rows = append(rows, row)
	}
	sort.SliceStable(rows, func(i, j int) bool {
		if rows[i].Kind != rows[j].Kind {
			return kindRank(rows[i].Kind) < kindRank(rows[j].Kind)
		}
		if rows[i].NodeName != rows[j].NodeName {
			return rows[i].NodeName < rows[j].NodeName
		}
		return rows[i].Name < rows[j].Name
	})
	sort.SliceStable(nodes, func(i, j int) bool { return nodes[i].Name < nodes[j].Name })
	return nodes, rows, nil
}

func kindRank(k api.Kind) int {
	for i, o := range kindOrder {
		if o == k {
			return i
		}
	}
	return len(kindOrder)
}

func summarize(rows []deviceRow) []kindSummary {
	var out []kindSummary
	idx := map[api.Kind]int{}
	for _, d := range rows {
		i, ok := idx[d.Kind]
		if !ok {
			i = len(out)
			idx[d.Kind] = i
			out = append(out, kindSummary{Kind: d.Kind})
		}
		k := &out[i]
		k.Devices++
		k.Capacity += d.Capacity
		k.Allocated += d.Allocated
		if d.HasUsed {
			k.Used += d.Used
			k.HasUsed = true
		}
		k.Bps += d.ReadBps + d.WriteBps
	}
	return out
}

func allocBars(rows []deviceRow, kind api.Kind) []allocBar {
	var out []allocBar
	for _, d := range rows {
		if d.Kind == kind {
			out = append(out, allocBar{Label: d.NodeName + "/" + d.Name, Capacity: d.Capacity, Allocated: d.Allocated, Used: d.Used, HasUsed: d.HasUsed})
		}
	}
	return out
}

func (u *UI) overview(w http.ResponseWriter, r *http.Request, s *session) {
	ctx, cancel := u.ctx(r)
	defer cancel()
	c := u.client(s.token)
	nodes, rows, err := u.inventory(ctx, c)
	if err != nil {
		u.apiFailed(w, r, s, err)
		return
	}
	live, err := c.Leases(ctx)
	if err != nil {
		u.apiFailed(w, r, s, err)
		return
	}
	d := overviewData{Now: u.cfg.Now(), Nodes: nodes, Devices: rows, Kinds: summarize(rows), Live: len(live),
		NodeStates:  counts(nodes, func(n api.Node) string { return string(n.State) }, []string{"ready", "suspect", "down"}),
		LeaseStates: counts(live, func(l api.Lease) string { return string(l.State) }, []string{"reserved", "active", "releasing"}),
	}
	if bars := allocBars(rows, api.KindBlock); len(bars) > 0 {
		d.Alloc = allocChart("alloc-block", "Block devices: leased and actually used", "For each block device, the bar is its capacity, the light fill what leases hold and the dark line what it actually holds (the allocated blocks of its backing file). The device table has the same numbers.", bars, resource.FormatSize)
	}
	u.render(w, http.StatusOK, "overview", page{Title: "Cluster", Nav: "overview", Session: s, Data: d})
}

type devicesData struct {
	Now     time.Time
	Devices []deviceRow
	Kinds   []kindSummary
	Charts  []string // SVG
}

func (u *UI) devicesPage(w http.ResponseWriter, r *http.Request, s *session) {
	ctx, cancel := u.ctx(r)
	defer cancel()
	c := u.client(s.token)
	_, rows, err := u.inventory(ctx, c)
	if err != nil {
		u.apiFailed(w, r, s, err)
		return
	}
	usage, err := c.Usage(ctx)
	if err != nil {
		u.apiFailed(w, r, s, err)
		return
	}
	now := u.cfg.Now()
	label := map[string]string{}
	kind := map[string]api.Kind{}
	for _, d := range rows {
		label[d.ID] = d.NodeName + "/" + d.Name
		kind[d.ID] = d.Kind
	}
	d := devicesData{Now: now, Devices: rows, Kinds: summarize(rows)}
	// The plots span the history there is: at least a minute, at most
	// what the control plane keeps.
	window := time.Minute
	for _, du := range usage {
		if len(du.Samples) > 0 {
			window = max(window, now.Sub(du.Samples[0].At))
		}
	}
	window = min(window.Round(30*time.Second)+30*time.Second, 5*time.Minute)
	for _, k := range kindOrder {
		var series []timeSeries
		for _, du := range usage {
			if kind[du.DeviceID] != k || len(du.Samples) == 0 {
				continue
			}
			ts := timeSeries{Name: label[du.DeviceID]}
			for _, sm := range du.Samples {
				ts.Pts = append(ts.Pts, timePoint{At: sm.At, V: sm.ReadBps + sm.WriteBps})
			}
			series = append(series, ts)
		}
		sort.Slice(series, func(i, j int) bool { return series[i].Name < series[j].Name })
		if len(series) == 0 && k != api.KindBlock {
			continue
		}
		id := "bw-" + string(k)
		title := fmt.Sprintf("Bandwidth per %s device, the last %s", k, window)
		d.Charts = append(d.Charts, timeChart(id, title,
			"Data-plane bytes per second (read plus written) through each device, from its agent's heartbeats; the table below has the current values.",
			"bandwidth (MB/s, read + write)", 1e6, now, window, series))
	}
	if bars := allocBars(rows, api.KindBlock); len(bars) > 0 {
		d.Charts = append(d.Charts, allocChart("alloc-block", "Block devices: leased and actually used", "For each block device, the bar is its capacity, the light fill what leases hold and the dark line what it actually holds.", bars, resource.FormatSize))
	}
	if bars := allocBars(rows, api.KindMemory); len(bars) > 0 {
		d.Charts = append(d.Charts, allocChart("alloc-memory", "Memory: leased", "For each memory device, the bar is its capacity and the fill what leases hold.", bars, resource.FormatSize))
	}
	if bars := allocBars(rows, api.KindAccel); len(bars) > 0 {
		d.Charts = append(d.Charts, allocChart("alloc-accel", "Accelerator slots: leased", "For each accelerator, the bar is its slots and the fill the slots leases hold.", bars, func(n int64) string { return amount(api.KindAccel, n) }))
	}
	u.render(w, http.StatusOK, "devices", page{Title: "Devices", Nav: "devices", Session: s, Data: d})
}

// leaseFilter is the lease list's filter form.
type leaseFilter struct {
	Tenant, Kind, State string
}

var leaseStates = []string{"reserved", "active", "releasing", "released", "failed", "lost", "expired"}

type leasesData struct {
	Now     time.Time
	Filter  leaseFilter
	Leases  []api.Lease
	Names   map[string]string
	Tenants []string
	States  []string
	Kinds   []api.Kind
	// Next links to the page after this one when the API's page was full
	// (its Link rel=next cursor); First to the first page when this one
	// is not.
	Next, First string
}

// leasePage is the lease list's page size: GET /v1/leases's default and
// greatest limit (a limit query parameter asks for fewer).
const leasePage = 1000

func (u *UI) leasesPage(w http.ResponseWriter, r *http.Request, s *session) {
	ctx, cancel := u.ctx(r)
	defer cancel()
	c := u.client(s.token)
	q := r.URL.Query()
	f := leaseFilter{Tenant: q.Get("tenant"), Kind: q.Get("kind"), State: q.Get("state")}
	aq := url.Values{}
	switch {
	case f.State == "all":
	case f.State != "" && f.State != "live":
		aq.Set("state", f.State)
	default:
		f.State = "live"
		aq.Set("live", "1")
	}
	// The API filters (so that a full page holds limit leases of the
	// filter's, not fewer) and pages (oldest first): the filter, limit and
	// the after cursor pass through, and the API refuses bad ones.
	if f.Tenant != "" {
		aq.Set("tenant", f.Tenant)
	}
	if f.Kind != "" {
		aq.Set("kind", f.Kind)
	}
	limit := leasePage
	if v := q.Get("limit"); v != "" {
		aq.Set("limit", v)
		if n, err := strconv.Atoi(v); err == nil {
			limit = n
		}
	}
	after := q.Get("after")
	if after != "" {
		aq.Set("after", after)
	}
	var ls []api.Lease
	if err := c.Do(ctx, http.MethodGet, "/v1/leases?"+aq.Encode(), nil, &ls); err != nil {
		u.apiFailed(w, r, s, err)
		return
	}
	nodes, err := c.Nodes(ctx)
	if err != nil {
		u.apiFailed(w, r, s, err)
		return
	}
	d := leasesData{Now: u.cfg.Now(), Filter: f, Names: map[string]string{}, States: leaseStates, Kinds: kindOrder[:3]}
	pq := url.Values{}
	for k, v := range map[string]string{"tenant": f.Tenant, "kind": f.Kind, "state": f.State, "limit": q.Get("limit")} {
		if v != "" {
			pq.Set(k, v)
		}
	}
	if after != "" {
		d.First = "/ui/leases?" + pq.Encode()
	}
	if len(ls) > 0 && len(ls) >= limit {
		// A full page: the API's Link rel=next has this cursor.
		pq.Set("after", api.LeaseCursor(ls[len(ls)-1]).String())
		d.Next = "/ui/leases?" + pq.Encode()
	}
	for _, n := range nodes {
		d.Names[n.ID] = n.Name
	}
	tenants := map[string]bool{}
	for _, l := range ls {
		tenants[l.Tenant] = true
	}
	d.Leases = ls
	if f.Tenant != "" {
		tenants[f.Tenant] = true
	}
	for t := range tenants {
		d.Tenants = append(d.Tenants, t)
	}
	sort.Strings(d.Tenants)
	// Newest first.
	sort.SliceStable(d.Leases, func(i, j int) bool { return d.Leases[i].CreatedAt.After(d.Leases[j].CreatedAt) })
	u.render(w, http.StatusOK, "leases", page{Title: "Leases", Nav: "leases", Session: s, Data: d})
}

type leaseData struct {
	Now      time.Time
	Lease    api.Lease
	Names    map[string]string // node ID → name
	Devs     map[string]string // device ID → node/name
	Live     bool
	Released bool
}

func (u *UI) leasePage(w http.ResponseWriter, r *http.Request, s *session) {
	ctx, cancel := u.ctx(r)
	defer cancel()
	c := u.client(s.token)
	l, err := c.Lease(ctx, r.PathValue("id"))
	if err != nil {
		u.apiFailed(w, r, s, err)
		return
	}
	names, devs := u.names(ctx, c)
	d := leaseData{Now: u.cfg.Now(), Lease: l, Names: names, Devs: devs, Live: l.State == api.LeaseReserved || l.State == api.LeaseActive}
	p := page{Title: "Lease " + l.ID, Nav: "leases", Session: s, Data: d}
	switch {
	case r.URL.Query().Has("created"):
		p.Flash = fmt.Sprintf("Lease %s created: %s.", l.ID, l.State)
	case r.URL.Query().Has("released"):
		p.Flash = fmt.Sprintf("Lease %s released.", l.ID)
	}
	u.render(w, http.StatusOK, "lease", p)
}

func (u *UI) releaseLease(w http.ResponseWriter, r *http.Request, s *session) {
	ctx, cancel := u.ctx(r)
	defer cancel()
	id := r.PathValue("id")
	if _, err := u.client(s.token).ReleaseLease(ctx, id); err != nil {
		u.apiFailed(w, r, s, err)
		return
	}
	http.Redirect(w, r, "/ui/leases/"+url.PathEscape(id)+"?released=1", http.StatusSeeOther)
}

// leaseForm is the create/explain form, as typed.
type leaseForm struct {
	Kind, Size, Mode, Count, TTL, Bandwidth, Work, Deadline, Role, Strategy, Borrower string
	Whole                                                                             bool
}

type newLeaseData struct {
	Key   string // the form's idempotency key
	Form  leaseForm
	Plan  *api.Plan
	Names map[string]string
	Devs  map[string]string
	Kinds []api.Kind
	Kind  api.Kind // the form's, in which the plan's parts count
}

func (u *UI) newLeasePage(w http.ResponseWriter, r *http.Request, s *session) {
	f := leaseForm{Kind: "block", Size: "256MiB", TTL: "1h"}
	if k := r.URL.Query().Get("kind"); k != "" {
		f.Kind = k
	}
	u.render(w, http.StatusOK, "newlease", page{Title: "New lease", Nav: "new", Session: s, Data: newLeaseData{Key: newSecret(), Form: f, Kinds: kindOrder[:3]}})
}

func formOf(r *http.Request) leaseForm {
	g := func(k string) string { return strings.TrimSpace(r.PostFormValue(k)) }
	return leaseForm{Kind: g("kind"), Size: g("size"), Mode: g("mode"), Count: g("count"), TTL: g("ttl"), Bandwidth: g("bandwidth"),
		Work: g("work"), Deadline: g("deadline"), Role: g("role"), Strategy: g("strategy"), Borrower: g("borrower"), Whole: g("whole") != ""}
}

// request turns the form into a lease request; errors name the field.
func (f leaseForm) request() (api.LeaseRequest, error) {
	req := api.LeaseRequest{Kind: api.Kind(f.Kind), Mode: api.Mode(f.Mode), Role: f.Role, Strategy: f.Strategy, Borrower: f.Borrower, Whole: f.Whole}
	var err error
	if f.Kind == "" {
		return req, errors.New("choose a kind")
	}
	if f.Size != "" {
		if req.Size, err = resource.ParseSize(f.Size); err != nil {
			return req, fmt.Errorf("size: %v (e.g. 256MiB, 1GiB)", err)
		}
	}
	if f.Count != "" {
		if req.Count, err = strconv.Atoi(f.Count); err != nil || req.Count < 0 {
			return req, errors.New("count: a whole number")
		}
	}
	if f.TTL != "" {
		d, err := time.ParseDuration(f.TTL)
		if err != nil {
			n, err2 := strconv.ParseInt(f.TTL, 10, 64)
			if err2 != nil {
				return req, errors.New("time to live: a duration such as 30m or 2h")
			}
			d = time.Duration(n) * time.Second
		}
		if d < time.Second {
			return req, errors.New("time to live: at least 1s")
		}
		req.TTLSeconds = int64(d / time.Second)
	}
	if f.Bandwidth != "" {
		// A rate as the CLI's --bandwidth takes it and as the pages print
		// it (500MB/s, 1Gbit/s); a bare number is MB/s.
		if mb, err := strconv.ParseFloat(strings.TrimSpace(f.Bandwidth), 64); err == nil && mb >= 0 && !math.IsInf(mb, 0) {
			req.Bandwidth = mb * 1e6
		} else if req.Bandwidth, err = resource.ParseRate(f.Bandwidth); err != nil {
			return req, errors.New("bandwidth: a rate such as 500MB/s or 1Gbit/s, or a number of MB/s")
		}
	}
	if f.Work != "" {
		if req.Work, err = resource.ParseSize(f.Work); err != nil {
			return req, fmt.Errorf("bytes to move: %v (e.g. 10GiB)", err)
		}
	}
	if f.Deadline != "" {
		if req.DeadlineSecond, err = strconv.ParseFloat(f.Deadline, 64); err != nil || req.DeadlineSecond < 0 {
			return req, errors.New("deadline: seconds, a number")
		}
	}
	return req, nil
}

func (u *UI) formPage(w http.ResponseWriter, status int, s *session, f leaseForm, plan *api.Plan, names, devs map[string]string, msg string) {
	u.render(w, status, "newlease", page{Title: "New lease", Nav: "new", Session: s, Error: msg,
		Data: newLeaseData{Key: newSecret(), Form: f, Plan: plan, Names: names, Devs: devs, Kinds: kindOrder[:3], Kind: api.Kind(f.Kind)}})
}

// names maps node IDs to names and device IDs to "node/device"; what it
// cannot read stays an ID on the page.
func (u *UI) names(ctx context.Context, c *api.Client) (nodes, devs map[string]string) {
	nodes, devs = map[string]string{}, map[string]string{}
	if ns, err := c.Nodes(ctx); err == nil {
		for _, n := range ns {
			nodes[n.ID] = n.Name
		}
	}
	if ds, err := c.Devices(ctx); err == nil {
		for _, d := range ds {
			devs[d.ID] = cmp.Or(nodes[d.NodeID], d.NodeID) + "/" + d.Name
		}
	}
	return nodes, devs
}

func (u *UI) explain(w http.ResponseWriter, r *http.Request, s *session) {
	ctx, cancel := u.ctx(r)
	defer cancel()
	f := formOf(r)
	req, err := f.request()
	if err != nil {
		u.formPage(w, http.StatusBadRequest, s, f, nil, nil, nil, err.Error())
		return
	}
	c := u.client(s.token)
	plan, err := c.Explain(ctx, req)
	if err != nil {
		var ae *api.Error
		if errors.As(err, &ae) && ae.Status != http.StatusUnauthorized {
			u.formPage(w, ae.Status, s, f, nil, nil, nil, ae.Message)
			return
		}
		u.apiFailed(w, r, s, err)
		return
	}
	names, devs := u.names(ctx, c)
	u.formPage(w, http.StatusOK, s, f, &plan, names, devs, "")
}

func (u *UI) createLease(w http.ResponseWriter, r *http.Request, s *session) {
	ctx, cancel := u.ctx(r)
	defer cancel()
	f := formOf(r)
	req, err := f.request()
	if err != nil {
		u.formPage(w, http.StatusBadRequest, s, f, nil, nil, nil, err.Error())
		return
	}
	// One key per form post: a resubmitted form (back, reload) does not
	// make a second lease.
	req.IdempotencyKey = r.PostFormValue("key")
	c := u.client(s.token)
	l, err := c.CreateLease(ctx, req)
	if err != nil {
		var ae *api.Error
		if errors.As(err, &ae) && ae.Status != http.StatusUnauthorized {
			// Show why, with the plan placement would make now.
			var plan *api.Plan
			if p, err := c.Explain(ctx, req); err == nil {
				plan = &p
			}
			names, devs := u.names(ctx, c)
			u.formPage(w, ae.Status, s, f, plan, names, devs, ae.Message)
			return
		}
		u.apiFailed(w, r, s, err)
		return
	}
	http.Redirect(w, r, "/ui/leases/"+url.PathEscape(l.ID)+"?created=1", http.StatusSeeOther)
}

// topology

type linkRow struct {
	api.Link
	FromName, ToName string
}

type topologyData struct {
	Now   time.Time
	Graph string
	Links []linkRow
}

func (u *UI) topologyPage(w http.ResponseWriter, r *http.Request, s *session) {
	ctx, cancel := u.ctx(r)
	defer cancel()
	topo, err := u.client(s.token).Topology(ctx)
	if err != nil {
		u.apiFailed(w, r, s, err)
		return
	}
	names := map[string]string{"controlplane": "control plane"}
	gn := []graphNode{{ID: "controlplane", Label: "control plane", Hub: true}}
	for _, n := range topo.Nodes {
		names[n.ID] = n.Name
		gn = append(gn, graphNode{ID: n.ID, Label: n.Name, State: string(n.State)})
	}
	// One edge per pair: the larger RTT of the two directions, the sum
	// of the loads, down if either direction is.
	type pair struct{ a, b string }
	edges := map[pair]*graphEdge{}
	var order []pair
	d := topologyData{Now: u.cfg.Now()}
	for _, l := range topo.Links {
		d.Links = append(d.Links, linkRow{Link: l, FromName: names[l.From], ToName: names[l.To]})
		if l.From == l.To {
			continue
		}
		k := pair{l.From, l.To}
		if k.b < k.a && k.b != "controlplane" || k.a == "controlplane" {
			k = pair{l.To, l.From}
		}
		e := edges[k]
		if e == nil {
			e = &graphEdge{A: k.a, B: k.b, Up: true}
			edges[k] = e
			order = append(order, k)
		}
		if l.RTTMicros > e.RTT {
			e.RTT = l.RTTMicros
		}
		if l.LoadBps > 0 || l.To == "controlplane" {
			e.Load += float64(l.LoadBps)
			e.HasLoad = true
		}
		if l.Status != "up" {
			e.Up = false
		}
	}
	var ge []graphEdge
	for _, k := range order {
		ge = append(ge, *edges[k])
	}
	sort.SliceStable(d.Links, func(i, j int) bool {
		if d.Links[i].FromName != d.Links[j].FromName {
			return d.Links[i].FromName < d.Links[j].FromName
		}
		return d.Links[i].ToName < d.Links[j].ToName
	})
	d.Graph = topologyGraph("topo", "Fabric topology", fmt.Sprintf(
		"The control plane in the middle and %d nodes around it, coloured by state. Each line is a measured link, labelled with its round-trip time; a node's line to the control plane is its uplink, thicker and orange with more data-plane load. The table below lists every link.",
		len(topo.Nodes)), gn, ge)
	u.render(w, http.StatusOK, "topology", page{Title: "Topology", Nav: "topology", Session: s, Data: d})
}

// events

type eventsData struct {
	Events []api.Event // newest first
	Last   int64
}

// lastEventID finds the greatest event ID the session sees, by asking
// whether any event follows an ID (an exponential, then a binary search:
// a few small reads, however long the log).
func lastEventID(ctx context.Context, c *api.Client) (int64, error) {
	after := func(id int64) (bool, error) {
		var evs []api.Event
		err := c.Do(ctx, http.MethodGet, fmt.Sprintf("/v1/events?since=%d&limit=1", id), nil, &evs)
		return len(evs) > 0, err
	}
	if ok, err := after(0); err != nil || !ok {
		return 0, err
	}
	lo, hi := int64(0), int64(1024) // some event follows lo
	for {
		ok, err := after(hi)
		if err != nil {
			return 0, err
		}
		if !ok {
			break
		}
		lo, hi = hi, hi*2
	}
	for hi-lo > 1 { // an event follows lo, none follows hi
		mid := lo + (hi-lo)/2
		ok, err := after(mid)
		if err != nil {
			return 0, err
		}
		if ok {
			lo = mid
		} else {
			hi = mid
		}
	}
	return hi, nil
}

// recentEvents is the page's history: up to 50 of the latest events.
const recentEvents = 50

func (u *UI) eventsPage(w http.ResponseWriter, r *http.Request, s *session) {
	ctx, cancel := u.ctx(r)
	defer cancel()
	c := u.client(s.token)
	last, err := lastEventID(ctx, c)
	if err != nil {
		u.apiFailed(w, r, s, err)
		return
	}
	d := eventsData{Last: last}
	if last > 0 {
		evs, err := c.Events(ctx, max(0, last-4*recentEvents))
		if err != nil {
			u.apiFailed(w, r, s, err)
			return
		}
		for i := len(evs) - 1; i >= 0 && len(d.Events) < recentEvents; i-- {
			if evs[i].ID <= last {
				d.Events = append(d.Events, evs[i])
			}
		}
	}
	u.render(w, http.StatusOK, "events", page{Title: "Events", Nav: "events", Session: s, Data: d})
}

// eventStream passes the API's event stream (Server-Sent Events) through
// to the page's EventSource, with the session's token: the browser never
// holds it.
func (u *UI) eventStream(w http.ResponseWriter, r *http.Request, s *session) {
	q := url.Values{"follow": {"1"}, "format": {"sse"}}
	if v := r.URL.Query().Get("since"); v != "" {
		q.Set("since", v)
	}
	sr := r.Clone(r.Context())
	sr.URL = &url.URL{Path: "/v1/events", RawQuery: q.Encode()}
	sr.RequestURI = sr.URL.RequestURI()
	sr.Header = http.Header{"Authorization": {"Bearer " + s.token}, "Accept": {"text/event-stream"}}
	if id := r.Header.Get("Last-Event-ID"); id != "" {
		sr.Header.Set("Last-Event-ID", id)
	}
	// The API's answer replaces this package's page headers.
	w.Header().Del("Content-Security-Policy")
	u.cfg.API.ServeHTTP(w, sr)
}
