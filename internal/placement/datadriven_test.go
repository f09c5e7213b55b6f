package placement

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/fabric"
)

var rewrite = flag.Bool("rewrite", false, "rewrite testdata expectations with actual output")

// A scenario file is a sequence of blocks:
//
//	command arg=value ...
//	input line
//	...
//	----
//	expected output
//	<blank line>
//
// Commands: topology (input: node/link/device/profile/quota/slotunits lines; resets
// the snapshot), lease (input: lease lines), now DURATION, place (args: the
// request — whole, exact, labels=K=V,K=V and pin=DEV,DEV among them; id=NAME
// records the plan as a running lease; brief prints only the plan; role=R
// the accelerator role),
// predict, remove ID, holds (the calibration table against the NVMe-oF
// genomics paper).
func TestScenarios(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scenarios: %v", err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) { runScenario(t, f) })
	}
}

type block struct {
	cmd      string
	args     []string
	input    []string
	expected string
	line     int
}

func parseBlocks(t *testing.T, path string) (blocks []block, comments map[int][]string) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	comments = map[int][]string{}
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	ln := 0
	next := func() (string, bool) {
		if !sc.Scan() {
			return "", false
		}
		ln++
		return sc.Text(), true
	}
	for {
		l, ok := next()
		if !ok {
			break
		}
		if strings.TrimSpace(l) == "" {
			continue
		}
		if strings.HasPrefix(l, "#") {
			comments[len(blocks)] = append(comments[len(blocks)], l)
			continue
		}
		f := strings.Fields(l)
		b := block{cmd: f[0], args: f[1:], line: ln}
		for {
			l, ok = next()
			if !ok {
				t.Fatalf("%s:%d: missing ----", path, b.line)
			}
			if l == "----" {
				break
			}
			b.input = append(b.input, l)
		}
		var out []string
		for {
			l, ok = next()
			if !ok || l == "" {
				break
			}
			out = append(out, l)
		}
		b.expected = strings.Join(out, "\n")
		blocks = append(blocks, b)
	}
	return blocks, comments
}

func runScenario(t *testing.T, path string) {
	blocks, comments := parseBlocks(t, path)
	st := &scenario{s: &Snapshot{Profiles: map[string]Profile{}, Quotas: map[string]Quota{}}}
	var rewritten strings.Builder
	for i, b := range blocks {
		got, err := st.run(b)
		if err != nil {
			t.Fatalf("%s:%d: %v", path, b.line, err)
		}
		got = strings.TrimRight(got, "\n")
		if *rewrite {
			for _, c := range comments[i] {
				rewritten.WriteString(c + "\n")
			}
			rewritten.WriteString(strings.Join(append([]string{b.cmd}, b.args...), " ") + "\n")
			for _, l := range b.input {
				rewritten.WriteString(l + "\n")
			}
			rewritten.WriteString("----\n" + got + "\n\n")
			continue
		}
		if got != b.expected {
			t.Errorf("%s:%d: %s %s\n--- got\n%s\n--- want\n%s", path, b.line, b.cmd, strings.Join(b.args, " "), got, b.expected)
		}
	}
	if *rewrite {
		for _, c := range comments[len(blocks)] {
			rewritten.WriteString(c + "\n")
		}
		if err := os.WriteFile(path, []byte(strings.TrimRight(rewritten.String(), "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

type scenario struct {
	s *Snapshot
}

func (sc *scenario) run(b block) (string, error) {
	switch b.cmd {
	case "topology":
		sc.s = &Snapshot{Profiles: map[string]Profile{}, Quotas: map[string]Quota{}}
		for _, l := range b.input {
			if err := sc.topologyLine(l); err != nil {
				return "", err
			}
		}
		return fmt.Sprintf("%d nodes, %d links, %d devices", len(sc.s.Nodes), len(sc.s.Links), len(sc.s.Devices)), nil
	case "lease":
		for _, l := range b.input {
			kv := kvs(strings.Fields(l))
			le, err := parseLease(kv)
			if err != nil {
				return "", err
			}
			sc.s.Leases = append(sc.s.Leases, le)
		}
		return fmt.Sprintf("%d leases", len(sc.s.Leases)), nil
	case "now":
		d, err := time.ParseDuration(b.args[0])
		sc.s.Now = d
		return "ok", err
	case "remove":
		for i, l := range sc.s.Leases {
			if l.ID == b.args[0] {
				sc.s.Leases = append(sc.s.Leases[:i], sc.s.Leases[i+1:]...)
				return "ok", nil
			}
		}
		return "", fmt.Errorf("no lease %s", b.args[0])
	case "predict":
		var out strings.Builder
		for _, p := range Predict(sc.s) {
			fmt.Fprintf(&out, "%s: %s", p.LeaseID, fmtBW(p.Bandwidth))
			if p.Completion > 0 {
				fmt.Fprintf(&out, ", completion %v", p.Completion.Round(time.Millisecond))
			}
			if p.Late {
				out.WriteString(" (late)")
			}
			out.WriteString("\n")
		}
		return out.String(), nil
	case "place":
		kv := kvs(b.args)
		r, err := parseRequest(kv)
		if err != nil {
			return "", err
		}
		p, err := Place(sc.s, r)
		if err != nil {
			var ie *InfeasibleError
			if !errors.As(err, &ie) {
				return "error: " + err.Error(), nil
			}
			var out strings.Builder
			fmt.Fprintf(&out, "infeasible: %s: %s\n", ie.Constraint, ie.Detail)
			for _, r := range ie.Rejections {
				fmt.Fprintf(&out, "  %s: %s: %s\n", r.Candidate, r.Constraint, r.Reason)
			}
			if ie.Omitted > 0 {
				fmt.Fprintf(&out, "  … %d more\n", ie.Omitted)
			}
			return out.String(), nil
		}
		if id, ok := kv["id"]; ok {
			sc.s.Leases = append(sc.s.Leases, p.Lease(id, r, sc.s.Now))
		}
		var out strings.Builder
		fmt.Fprintf(&out, "plan: %s\n", p)
		fmt.Fprintf(&out, "predicted: %s", rateText(r.Kind, p.PredictedBandwidth))
		if p.PredictedCompletion > 0 {
			fmt.Fprintf(&out, ", completion %v", p.PredictedCompletion.Round(time.Millisecond))
		}
		out.WriteString("\n")
		if _, brief := kv["brief"]; brief {
			return out.String(), nil
		}
		for _, e := range p.Explanation {
			out.WriteString("  " + e + "\n")
		}
		return out.String(), nil
	case "holds":
		return holdsTable(), nil
	}
	return "", fmt.Errorf("unknown command %q", b.cmd)
}

// holdsTable reports, for 1-, 2- and 3-device compositions of the seed-000
// profile, each writer's predicted rate and slowdown for 1..8 writers.
func holdsTable() string {
	var out strings.Builder
	for k := 1; k <= 3; k++ {
		hold := 0
		var row []string
		for n := 1; n <= 8; n++ {
			s := seed000Snapshot(k, n)
			p := Predict(s)
			rate := p[0].Bandwidth
			slow := 1 - rate/SMUFINWriterDemand
			if slow <= 1e-9 && hold == n-1 {
				hold = n
			}
			row = append(row, fmt.Sprintf("%d:%.1f", n, 100*math.Max(slow, 0)))
		}
		fmt.Fprintf(&out, "%d device(s): holds %d writers without slowdown; slowdown %% by writers %s\n", k, hold, strings.Join(row, " "))
	}
	return out.String()
}

// seed000Snapshot has n writers on one node composed over k seed-000 devices
// of another (shared when k = 1).
func seed000Snapshot(k, n int) *Snapshot {
	s := &Snapshot{Profiles: map[string]Profile{SMUFINModel: SMUFINProfile()}}
	s.Nodes = []Node{{ID: "pool"}}
	s.Links = []fabric.Link{{A: "pool", B: "sw", Bandwidth: 12.5e9}}
	for d := 0; d < k; d++ {
		s.Devices = append(s.Devices, Device{ID: fmt.Sprintf("nvme%d", d), Node: "pool", Kind: KindBlock, Model: SMUFINModel, Capacity: 4 << 40})
	}
	for w := 0; w < n; w++ {
		node := fmt.Sprintf("c%d", w)
		s.Nodes = append(s.Nodes, Node{ID: node})
		s.Links = append(s.Links, fabric.Link{A: node, B: "sw", Bandwidth: 12.5e9})
		l := Lease{ID: fmt.Sprintf("w%d", w), Kind: KindBlock, Borrower: node, Mode: ModeComposed, Demand: SMUFINWriterDemand, Remaining: SMUFINWriterWork}
		if k == 1 {
			l.Mode = ModeShared
		}
		for d := 0; d < k; d++ {
			l.Parts = append(l.Parts, Part{NodeID: "pool", DeviceID: fmt.Sprintf("nvme%d", d), Offset: int64(w) << 36, Length: 1 << 36})
		}
		s.Leases = append(s.Leases, l)
	}
	return s
}

func kvs(fields []string) map[string]string {
	m := map[string]string{}
	for _, f := range fields {
		k, v, _ := strings.Cut(f, "=")
		m[k] = v
	}
	return m
}

var units = []struct {
	suffix string
	mult   float64
}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}}

func num(s string) (float64, error) {
	s = strings.TrimSuffix(s, "/s")
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			v, err := strconv.ParseFloat(strings.TrimSuffix(s, u.suffix), 64)
			return v * u.mult, err
		}
	}
	return strconv.ParseFloat(s, 64)
}

func (sc *scenario) topologyLine(l string) error {
	f := strings.Fields(l)
	if len(f) == 0 || strings.HasPrefix(f[0], "#") {
		return nil
	}
	kv := kvs(f[1:])
	var err error
	getF := func(k string) float64 {
		v, ok := kv[k]
		if !ok || err != nil {
			return 0
		}
		var x float64
		x, err = num(v)
		return x
	}
	getD := func(k string) time.Duration {
		v, ok := kv[k]
		if !ok || err != nil {
			return 0
		}
		var d time.Duration
		d, err = time.ParseDuration(v)
		return d
	}
	switch f[0] {
	case "node": // node ID [state=S] [cordoned] [excluded=WHY] [label.K=V]... [rack=SW bw=B lat=L]
		_, cordoned := kv["cordoned"]
		n := Node{ID: f[1], State: kv["state"], Labels: map[string]string{}, Cordoned: cordoned, Excluded: kv["excluded"]}
		for k, v := range kv {
			if lk, ok := strings.CutPrefix(k, "label."); ok {
				n.Labels[lk] = v
			}
		}
		sc.s.Nodes = append(sc.s.Nodes, n)
		if sw, ok := kv["rack"]; ok {
			sc.s.Links = append(sc.s.Links, fabric.Link{ID: f[1] + "-" + sw, A: f[1], B: sw, Kind: fabric.Ethernet,
				Bandwidth: getF("bw"), Latency: getD("lat"), Load: getF("load")})
		}
	case "link": // link A B [kind=K] [bw=B] [lat=L] [load=X] [down]
		_, down := kv["down"]
		sc.s.Links = append(sc.s.Links, fabric.Link{ID: f[1] + "-" + f[2], A: f[1], B: f[2], Kind: fabric.Kind(kv["kind"]),
			Bandwidth: getF("bw"), Latency: getD("lat"), Load: getF("load"), Down: down})
	case "device": // device ID node=N kind=K [model=M] cap=C [bw=B] [lat=L] [state=S] [attach=V] [exclusive] [roles=R,R]
		_, excl := kv["exclusive"]
		var roles []string
		if v, ok := kv["roles"]; ok {
			roles = strings.FieldsFunc(v, func(r rune) bool { return r == ',' })
			if roles == nil {
				roles = []string{}
			}
		}
		sc.s.Devices = append(sc.s.Devices, Device{ID: f[1], Node: kv["node"], Kind: kv["kind"], Model: kv["model"],
			Capacity: int64(getF("cap")), Bandwidth: getF("bw"), Latency: getD("lat"), State: kv["state"], Attach: kv["attach"], Exclusive: excl, Roles: roles})
	case "devices": // devices PREFIX COUNT node=N ... [exclusive] (numbered PREFIX1..)
		n, _ := strconv.Atoi(f[2])
		kv = kvs(f[3:])
		_, excl := kv["exclusive"]
		for i := 1; i <= n; i++ {
			sc.s.Devices = append(sc.s.Devices, Device{ID: fmt.Sprintf("%s%d", f[1], i), Node: kv["node"], Kind: kv["kind"], Model: kv["model"],
				Capacity: int64(getF("cap")), Bandwidth: getF("bw"), Exclusive: excl})
		}
	case "profile": // profile smufin | profile MODEL max=B [curve=b1,b2,...]
		if f[1] == "smufin" { // SMUFINProfile
			sc.s.Profiles[SMUFINModel] = SMUFINProfile()
			break
		}
		p := Profile{Model: f[1], MaxBandwidth: getF("max")}
		if c, ok := kv["curve"]; ok {
			for _, v := range strings.Split(c, ",") {
				x, e := num(v)
				if e != nil {
					return e
				}
				p.Delivered = append(p.Delivered, x)
			}
		}
		sc.s.Profiles[f[1]] = p
	case "slotunits": // slotunits N (Snapshot.SlotUnits)
		sc.s.SlotUnits = int64(getF("n"))
	case "quota": // quota TENANT [leases=N] [bytes=B] [slots=S] [bw=B]
		n, _ := strconv.Atoi(kv["leases"])
		sc.s.Quotas[f[1]] = Quota{Leases: n, Bytes: int64(getF("bytes")), Slots: int64(getF("slots")), Bandwidth: getF("bw")}
	default:
		return fmt.Errorf("unknown topology line %q", l)
	}
	return err
}

func parseLease(kv map[string]string) (Lease, error) {
	l := Lease{ID: kv["id"], Tenant: kv["tenant"], Kind: kv["kind"], Borrower: kv["borrower"], Mode: kv["mode"], Gateway: kv["gateway"]}
	if l.Kind == "" {
		l.Kind = KindBlock
	}
	var err error
	if v, ok := kv["demand"]; ok {
		l.Demand, err = num(v)
	}
	if v, ok := kv["work"]; ok && err == nil {
		var w float64
		w, err = num(v)
		l.Remaining = int64(w)
	}
	if v, ok := kv["deadline"]; ok && err == nil {
		l.Deadline, err = time.ParseDuration(v)
	}
	// parts=dev:off:len,dev:off:len (node looked up by the caller's snapshot is not needed)
	for _, p := range strings.Split(kv["parts"], ",") {
		if p == "" {
			continue
		}
		f := strings.Split(p, ":")
		if len(f) != 3 {
			return l, fmt.Errorf("bad part %q", p)
		}
		off, e1 := num(f[1])
		n, e2 := num(f[2])
		if e1 != nil || e2 != nil {
			return l, fmt.Errorf("bad part %q", p)
		}
		l.Parts = append(l.Parts, Part{DeviceID: f[0], Offset: int64(off), Length: int64(n)})
	}
	return l, err
}

func parseRequest(kv map[string]string) (Request, error) {
	r := Request{Kind: kv["kind"], Borrower: kv["borrower"], Mode: kv["mode"], Tenant: kv["tenant"], Strategy: kv["strategy"], Gateway: kv["gateway"], Role: kv["role"]}
	if r.Kind == "" {
		r.Kind = KindBlock
	}
	var err error
	setF := func(k string, dst *float64) {
		if v, ok := kv[k]; ok && err == nil {
			*dst, err = num(v)
		}
	}
	setI := func(k string, dst *int64) {
		var f float64
		if v, ok := kv[k]; ok && err == nil {
			f, err = num(v)
			*dst = int64(f)
		}
	}
	setD := func(k string, dst *time.Duration) {
		if v, ok := kv[k]; ok && err == nil {
			*dst, err = time.ParseDuration(v)
		}
	}
	setI("size", &r.Size)
	setF("bw", &r.Bandwidth)
	setI("work", &r.Work)
	setD("deadline", &r.Deadline)
	setD("maxlat", &r.MaxLatency)
	if v, ok := kv["width"]; ok {
		r.Width, _ = strconv.Atoi(v)
	}
	_, r.AllowShare = kv["share"]
	_, r.AllowCompose = kv["compose"]
	if v := kv["affinity"]; v != "" {
		r.Affinity = strings.Split(v, ",")
	}
	if v := kv["anti"]; v != "" {
		r.AntiAffinity = strings.Split(v, ",")
	}
	_, r.Whole = kv["whole"]
	_, r.Exact = kv["exact"]
	if v := kv["labels"]; v != "" { // labels=K=V,K=V
		r.Labels = map[string]string{}
		for _, t := range strings.Split(v, ",") {
			k, lv, _ := strings.Cut(t, "=")
			r.Labels[k] = lv
		}
	}
	if v := kv["pin"]; v != "" {
		r.Devices = strings.Split(v, ",")
	}
	return r, err
}
