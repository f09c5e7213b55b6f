package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/characterize"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/resource"
)

func init() {
	register(&command{Name: "characterize", Args: "DEVICE",
		Summary: "Measure a block device through the data plane (bandwidth for 1..N streams, 4 KiB latency) and store its model's profile.",
		Flags:   runCharacterize, MinArgs: 1, MaxArgs: 1})
	register(&command{Name: "profiles", Summary: "List device profiles (measured and declared).", Flags: runProfiles})
	register(&command{Name: "profile show", Args: "MODEL", Summary: "Show one device model's profile.", Flags: runProfileShow, MinArgs: 1, MaxArgs: 1})
	register(&command{Name: "profile declare", Args: "FILE.json",
		Summary: "Store a declared profile for a device model (write_bps, read_bps in bytes/s).", Flags: runProfileDeclare, MinArgs: 1, MaxArgs: 1})
}

// characterizeBorrower names the lease characterize takes in listings.
const characterizeBorrower = "rialto-characterize"

// characterizeReleaseTimeout bounds the release of characterize's lease, which runs
// even after the verb's context was cancelled (Ctrl-C).
const characterizeReleaseTimeout = 30 * time.Second

func runCharacterize(e *env, fs *pflag.FlagSet) runFunc {
	var cf clientFlags
	cf.register(fs, e)
	streams := fs.Int("max-streams", 8, "measure 1..N concurrent sequential writers and readers")
	bytesFlag := sizeString(fs, "bytes", "256MiB", "bytes moved by all streams together per step")
	reqFlag := sizeString(fs, "request-size", "1MiB", "size of each sequential request")
	ops := fs.Int("latency-ops", 2000, "4 KiB random reads for the latency figure (median)")
	model := fs.String("model", "", "store the profile under this model (default: the device's model)")
	ttl := durationVar(fs, "ttl", 0, time.Second, "lifetime of the measuring lease, e.g. 30m (default: the server's)")
	return func(ctx context.Context, pos []string) error {
		// A closed pipe on stdout or stderr (`rialto characterize … 2>&1 |
		// head`) would kill the process by SIGPIPE at its next line, the
		// measuring lease held until its TTL: taken as an interruption
		// instead, it stops the measurement and the lease is released.
		ctx, stopPipe := signal.NotifyContext(ctx, syscall.SIGPIPE)
		defer stopPipe()
		if *streams < 1 || *streams > characterize.MaxStreams {
			return usagef("--max-streams must be 1..%d, not %d", characterize.MaxStreams, *streams)
		}
		if *ops < 1 || *ops > characterize.MaxLatencyOps {
			return usagef("--latency-ops must be 1..%d, not %d", characterize.MaxLatencyOps, *ops)
		}
		perStep, err := resource.ParseSize(*bytesFlag)
		if err != nil || perStep <= 0 {
			return usagef("bad --bytes %q: use a size such as 256MiB", *bytesFlag)
		}
		reqSize, err := resource.ParseSize(*reqFlag)
		if err != nil || reqSize < 4096 || reqSize > 32<<20 || reqSize%4096 != 0 {
			return usagef("bad --request-size %q: use a multiple of 4KiB up to 32MiB", *reqFlag)
		}
		// Every stream holds a request's buffer.
		if reqSize*int64(*streams) > characterize.MaxBuffered {
			return usagef("--max-streams %d of --request-size %s would hold %s of buffers: at most %s", *streams, resource.FormatSize(reqSize),
				resource.FormatSize(reqSize*int64(*streams)), resource.FormatSize(characterize.MaxBuffered))
		}
		ttlSecs := int64(ttl.d / time.Second)
		c, err := cf.client()
		if err != nil {
			return err
		}
		// The lease is served over TLS with the lender's node certificate
		// (nbds://), verified against the cluster CA of --cacert.
		dataTLS, err := cf.dataTLS()
		if err != nil {
			return err
		}
		dev, nodeLabel, err := characterizeTarget(ctx, c, pos[0])
		if err != nil {
			return err
		}
		name := *model
		if name == "" {
			name = dev.Model
		}
		if strings.TrimSpace(name) == "" {
			return fmt.Errorf("device %s (%s/%s) has no model: pass --model NAME to name its profile", dev.ID, nodeLabel, dev.Name)
		}
		switch {
		case dev.Kind != api.KindBlock:
			return fmt.Errorf("device %s is %s %s device: characterize measures block devices", dev.ID, dev.Kind.Article(), dev.Kind)
		case dev.State != "available":
			return fmt.Errorf("device %s is %s, not available", dev.ID, dev.State)
		case dev.Allocated > 0:
			return fmt.Errorf("device %s is in use (%s of %s leased): characterize needs the whole device; release its leases first",
				dev.ID, resource.FormatSize(dev.Allocated), resource.FormatSize(dev.Capacity))
		}
		if reqSize*int64(*streams) > dev.Capacity {
			return fmt.Errorf("device %s (%s) is too small for %d streams of %s requests: lower --max-streams or --request-size",
				dev.ID, resource.FormatSize(dev.Capacity), *streams, resource.FormatSize(reqSize))
		}

		// Borrow the whole device: a dedicated, whole-device lease pinned to
		// it (an affinity term naming a device ID is a hard pin). The lease's
		// device is still checked, against a control plane that predates pins.
		req := api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeDedicated, Affinity: []string{dev.ID},
			Borrower: characterizeBorrower, TTLSeconds: ttlSecs, IdempotencyKey: resource.NewID("characterize")}
		l, err := c.CreateLease(ctx, req)
		if err != nil {
			if ctx.Err() != nil {
				// Interrupted mid-request: the lease may exist. The same
				// idempotency key finds it (or creates it), and it is released.
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), characterizeReleaseTimeout)
				defer cancel()
				if l, err := c.CreateLease(rctx, req); err == nil {
					releaseMeasuringLease(ctx, e, c, l.ID)
				}
				return fmt.Errorf("borrow device %s: interrupted: %w", dev.ID, ctx.Err())
			}
			return fmt.Errorf("borrow device %s: %w", dev.ID, err)
		}
		defer releaseMeasuringLease(ctx, e, c, l.ID)
		if l.DeviceID != dev.ID || len(l.Parts) != 1 {
			return fmt.Errorf("the control plane placed the measuring lease %s on device %s, not %s (the device was taken meanwhile, or placement ignored the affinity)",
				l.ID, dash(l.DeviceID), dev.ID)
		}
		if l.URI == "" {
			return fmt.Errorf("lease %s has no data-plane URI", l.ID)
		}
		if !cf.json() {
			fmt.Fprintf(e.stderr, "characterize: lease %s on %s/%s (%s); measuring 1..%d streams, %s per step\n",
				l.ID, nodeLabel, dev.Name, resource.FormatSize(l.Parts[0].Length), *streams, resource.FormatSize(perStep))
		}

		// URI.Dial uses dataTLS for an nbds:// URI and plaintext for the
		// nbd:// of a lender with --insecure-dataplane.
		u, err := nbd.ParseURI(l.URI)
		if err != nil {
			return fmt.Errorf("lease %s: %w", l.ID, err)
		}
		nc, err := u.Dial(ctx, dataTLS)
		if err != nil {
			return fmt.Errorf("reach device %s through lease %s: %w", dev.ID, l.ID, err)
		}
		defer nc.Close()
		// Ctrl-C: closing the connection fails the requests in flight, so the
		// measurement stops at once rather than at the next request.
		stop := context.AfterFunc(ctx, func() { nc.Close() })
		defer stop()
		opts := characterize.Options{MaxStreams: *streams, BytesPerStep: perStep, RequestSize: int(reqSize), LatencyOps: *ops, Model: name}
		// On a terminal, a bar: one step per stream count and direction,
		// then the latency run; elsewhere, a line per step.
		bar := newProgress(e, 2**streams+1, "characterize: 1 writer")
		if bar != nil {
			opts.Progress = func(op string, n int, bps float64) {
				next := fmt.Sprintf("characterize: %d %s (%s)", n, profPlural(n, "reader"), resource.FormatRate(bps))
				if op == "read" {
					next = "characterize: 4 KiB latency"
					if n < *streams {
						next = fmt.Sprintf("characterize: %d %s", n+1, profPlural(n+1, "writer"))
					}
				}
				bar.step(next)
			}
		} else if !cf.json() {
			opts.Progress = func(op string, n int, bps float64) {
				fmt.Fprintf(e.stderr, "characterize: %d %s: %s\n", n, profPlural(n, strings.TrimSuffix(op, "e")+"er"), resource.FormatRate(bps))
			}
		}
		p, err := characterize.Measure(ctx, nc, opts)
		bar.done()
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("characterize %s: interrupted: %w", dev.ID, ctx.Err())
			}
			return fmt.Errorf("characterize %s: %w", dev.ID, err)
		}
		stop()
		nc.Close()
		p.ID, p.Model, p.Source, p.State = name, name, "measured", "measured"
		stored, err := c.PutProfile(ctx, p)
		if err != nil {
			// The measurement is not lost: print it, then say why it was not
			// stored.
			if cf.json() {
				cf.print(e.stdout, p)
			} else {
				fmt.Fprintf(e.stdout, "Device %s (%s/%s), profile %q NOT stored:\n\n", dev.ID, nodeLabel, dev.Name, name)
				printProfile(e.stdout, p)
			}
			if api.IsCode(err, api.CodeForbidden) {
				return fmt.Errorf("store profile %s: %w (storing profiles needs an admin token)", name, err)
			}
			return fmt.Errorf("store profile %s: %w", name, err)
		}
		if cf.json() {
			return cf.print(e.stdout, stored)
		}
		fmt.Fprintf(e.stdout, "Device %s (%s/%s), profile %q stored:\n\n", dev.ID, nodeLabel, dev.Name, stored.Model)
		printProfile(e.stdout, stored)
		return nil
	}
}

// releaseMeasuringLease ends characterize's lease even when ctx was cancelled, and
// says so when it cannot.
func releaseMeasuringLease(ctx context.Context, e *env, c *api.Client, id string) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), characterizeReleaseTimeout)
	defer cancel()
	if _, err := c.ReleaseLease(rctx, id); err != nil {
		fmt.Fprintf(e.stderr, "rialto: warning: lease %s was not released (%v); run `rialto lease release %s`\n", id, err, id)
	}
}

// characterizeTarget resolves DEVICE: a device ID, NODE/NAME (node name or ID), or
// a device name unique in the cluster. It returns the device and its
// node's name.
func characterizeTarget(ctx context.Context, c *api.Client, arg string) (api.Device, string, error) {
	devs, err := c.Devices(ctx)
	if err != nil {
		return api.Device{}, "", err
	}
	names := nodeNames(ctx, c)
	label := func(d api.Device) string { return nodeName(names, d.NodeID) }
	for _, d := range devs {
		if d.ID == arg {
			return d, label(d), nil
		}
	}
	node, devName, qualified := strings.Cut(arg, "/")
	if !qualified {
		devName = arg
	}
	var found []api.Device
	for _, d := range devs {
		if d.Name == devName && (!qualified || d.NodeID == node || names[d.NodeID] == node) {
			found = append(found, d)
		}
	}
	if len(found) > 1 {
		// Names are not unique: a removed node's devices (unavailable)
		// keep theirs, and another machine may join under its name.
		var avail []api.Device
		for _, d := range found {
			if d.State != "unavailable" {
				avail = append(avail, d)
			}
		}
		if len(avail) > 0 {
			found = avail
		}
	}
	switch len(found) {
	case 1:
		return found[0], label(found[0]), nil
	case 0:
		return api.Device{}, "", fmt.Errorf("no device %q: give a device ID, NODE/NAME or a unique name (see `rialto devices`)", arg)
	}
	// Each by its ID too: NODE/NAME is the same for devices of nodes that
	// share a name.
	var alts []string
	for _, d := range found {
		alts = append(alts, d.ID+" ("+label(d)+"/"+d.Name+")")
	}
	sort.Strings(alts)
	return api.Device{}, "", fmt.Errorf("device name %q is ambiguous: give one of the device IDs %s", arg, strings.Join(alts, ", "))
}

var runProfiles = listCommand((*api.Client).Profiles, func(_ context.Context, w io.Writer, _ *api.Client, ps []api.Profile) {
	printProfiles(w, ps)
})

func runProfileShow(e *env, fs *pflag.FlagSet) runFunc {
	var cf clientFlags
	cf.register(fs, e)
	return func(ctx context.Context, pos []string) error {
		c, err := cf.client()
		if err != nil {
			return err
		}
		ps, err := c.Profiles(ctx)
		if err != nil {
			return err
		}
		for _, p := range ps {
			if p.Model == pos[0] {
				if cf.json() {
					return cf.print(e.stdout, p)
				}
				printProfile(e.stdout, p)
				return nil
			}
		}
		return fmt.Errorf("no profile for model %q (see `rialto profiles`)", pos[0])
	}
}

func runProfileDeclare(e *env, fs *pflag.FlagSet) runFunc {
	var cf clientFlags
	cf.register(fs, e)
	force := fs.Bool("force", false, "replace a measured profile of the same model")
	return func(ctx context.Context, pos []string) error {
		data, err := readDeclared(pos[0])
		if err != nil {
			return err
		}
		p, err := parseDeclared(data)
		if err != nil {
			return fmt.Errorf("%s: %w", pos[0], err)
		}
		c, err := cf.client()
		if err != nil {
			return err
		}
		existing, err := c.Profiles(ctx)
		if err != nil {
			return err
		}
		for _, q := range existing {
			if q.Model == p.Model && q.Source == "measured" && !*force {
				return fmt.Errorf("model %q already has a measured profile (%s): a declaration would replace it; pass --force to do so",
					p.Model, q.MeasuredAt.Format(time.RFC3339))
			}
		}
		if devs, err := c.Devices(ctx); err == nil && !cf.json() {
			for _, d := range devs {
				if d.Model == p.Model && d.Kind == api.KindBlock {
					fmt.Fprintf(e.stderr, "rialto: note: device %s is a %s; `rialto characterize %s` measures it\n", d.ID, p.Model, d.ID)
					break
				}
			}
		}
		stored, err := c.PutProfile(ctx, p)
		if err != nil {
			return err
		}
		if cf.json() {
			return cf.print(e.stdout, stored)
		}
		fmt.Fprintf(e.stdout, "Profile %q declared:\n\n", stored.Model)
		printProfile(e.stdout, stored)
		return nil
	}
}

// maxDeclaredBytes bounds a declared profile's file: two curves of 1,024
// points are under 60 KiB of JSON.
const maxDeclaredBytes = 1 << 20

// readDeclared reads a declared profile's file, refusing one larger than
// maxDeclaredBytes (or endless: /dev/zero) rather than reading it all.
func readDeclared(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxDeclaredBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(data) > maxDeclaredBytes {
		return nil, fmt.Errorf("%s: larger than %s: a profile is one JSON object such as %s", path, resource.FormatSize(maxDeclaredBytes), profDeclaredExample)
	}
	return data, nil
}

// profMinBps is the smallest bandwidth a declaration may carry; below
// it the figures were almost certainly written in MB/s or GB/s.
const profMinBps = 100e3

// parseDeclared decodes and validates a declared profile: a JSON api.Profile
// with a model and at least one write_bps point, every bandwidth finite and
// at least 100 kB/s (bytes/s, not MB/s), a non-negative latency, at most
// 1024 points per curve. Curves may rise, saturate or fall with concurrency:
// the NVMe device of the NVMe-oF genomics paper (Call et al.) delivers
// less in aggregate with more writers, and
// placement relies on that fall to predict saturation.
func parseDeclared(data []byte) (api.Profile, error) {
	var p api.Profile
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		var se *json.SyntaxError
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &se):
			return p, fmt.Errorf("not JSON at byte %d: %v", se.Offset, err)
		case errors.As(err, &te):
			return p, fmt.Errorf("field %q must be %s, not a JSON %s", te.Field, profJSONKind(te.Type.String()), te.Value)
		case errors.Is(err, io.EOF):
			return p, errors.New("empty file: want a JSON profile such as " + profDeclaredExample)
		}
		return p, fmt.Errorf("bad profile: %v (fields: id, state, model, write_bps, read_bps, latency_4k_us, source, measured_at)", err)
	}
	if dec.More() {
		return p, errors.New("more than one JSON value: declare one profile per file")
	}
	var errs []string
	bad := func(f string, a ...any) { errs = append(errs, fmt.Sprintf(f, a...)) }
	p.Model = strings.TrimSpace(p.Model)
	switch {
	case p.Model == "":
		bad("model is empty: name the device model the profile describes (devices report it in `rialto devices -o json`)")
	case len(p.Model) > 256 || strings.ContainsAny(p.Model, "/\\?#%") || strings.IndexFunc(p.Model, func(r rune) bool { return r < ' ' }) >= 0:
		bad("model %q: use at most 256 characters without / \\ ? # %% or control characters", p.Model)
	}
	if p.ID != "" && p.ID != p.Model {
		bad("id %q differs from model %q: a profile's id is its model (omit id)", p.ID, p.Model)
	}
	switch p.Source {
	case "", "declared":
	default:
		bad("source %q: a declared profile's source is \"declared\" (omit it); measured profiles come from `rialto characterize`", p.Source)
	}
	if len(p.WriteBps) == 0 {
		bad("write_bps is empty: give the delivered aggregate bytes/s for 1, 2, … concurrent writers")
	}
	checkCurve := func(name string, v []float64) {
		if len(v) > 1024 {
			bad("%s has %d points: at most 1024", name, len(v))
			return
		}
		for i, x := range v {
			switch {
			case math.IsNaN(x) || math.IsInf(x, 0):
				bad("%s[%d] (%d %s) is not a number", name, i, i+1, profPlural(i+1, "stream"))
			case x <= 0:
				bad("%s[%d] (%d %s) is %g: bandwidths must be positive", name, i, i+1, profPlural(i+1, "stream"), x)
			case x < profMinBps:
				bad("%s[%d] (%d %s) is %g bytes/s: bandwidths are bytes/s (2 GB/s is 2e9), not MB/s", name, i, i+1, profPlural(i+1, "stream"), x)
			}
		}
	}
	checkCurve("write_bps", p.WriteBps)
	checkCurve("read_bps", p.ReadBps)
	if math.IsNaN(p.Latency4KUs) || math.IsInf(p.Latency4KUs, 0) || p.Latency4KUs < 0 {
		bad("latency_4k_us is %g: give the 4 KiB read latency in µs, or 0 if unknown", p.Latency4KUs)
	}
	if len(errs) > 0 {
		return p, fmt.Errorf("invalid profile:\n  - %s", strings.Join(errs, "\n  - "))
	}
	p.ID, p.Source, p.State = p.Model, "declared", "declared"
	return p, nil
}

const profDeclaredExample = `{"model": "nvme-x", "write_bps": [2.0e9, 1.7e9, 1.25e9], "read_bps": [3.0e9, 3.0e9, 3.0e9], "latency_4k_us": 90}`

func profJSONKind(goType string) string {
	switch {
	case strings.HasPrefix(goType, "[]"):
		return "an array of numbers"
	case goType == "float64" || strings.HasPrefix(goType, "int"):
		return "a number"
	case goType == "string":
		return "a string"
	case goType == "time.Time":
		return "an RFC 3339 time"
	}
	return goType
}

func printProfiles(w io.Writer, ps []api.Profile) {
	sort.Slice(ps, func(i, j int) bool { return ps[i].Model < ps[j].Model })
	tw := newTable(w)
	fmt.Fprintln(tw, "MODEL\tSOURCE\tSTREAMS\tWRITE MB/s (1..N)\tREAD MB/s (1..N)\tLAT 4K\tMEASURED")
	for _, p := range ps {
		at := "-"
		if !p.MeasuredAt.IsZero() {
			at = p.MeasuredAt.UTC().Format("2006-01-02 15:04")
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", p.Model, dash(p.Source), max(len(p.WriteBps), len(p.ReadBps)),
			profCurve(p.WriteBps), profCurve(p.ReadBps), profLatency(p.Latency4KUs), at)
	}
	tw.Flush()
}

// printProfile prints one profile: a row per stream count, then latency.
func printProfile(w io.Writer, p api.Profile) {
	tw := newTable(w)
	fmt.Fprintln(tw, "STREAMS\tWRITE MB/s\tREAD MB/s")
	for i := range max(len(p.WriteBps), len(p.ReadBps)) {
		fmt.Fprintf(tw, "%d\t%s\t%s\n", i+1, profAt(p.WriteBps, i), profAt(p.ReadBps, i))
	}
	tw.Flush()
	fmt.Fprintf(w, "\n4 KiB read latency (median): %s\n", profLatency(p.Latency4KUs))
	if p.Source != "" {
		fmt.Fprintf(w, "Source: %s", p.Source)
		if !p.MeasuredAt.IsZero() {
			fmt.Fprintf(w, ", %s", p.MeasuredAt.UTC().Format(time.RFC3339))
		}
		fmt.Fprintln(w)
	}
}

func profAt(v []float64, i int) string {
	if i < len(v) {
		return profMBps(v[i])
	}
	return "-"
}

// profMBps prints bytes/s as decimal MB/s.
func profMBps(bps float64) string {
	mb := bps / 1e6
	if mb >= 100 {
		return strconv.FormatFloat(mb, 'f', 0, 64)
	}
	return strconv.FormatFloat(mb, 'f', 1, 64)
}

func profCurve(v []float64) string {
	if len(v) == 0 {
		return "-"
	}
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = profMBps(x)
	}
	return strings.Join(s, " ")
}

func profLatency(us float64) string {
	if us <= 0 {
		return "-"
	}
	if us >= 1000 {
		return strconv.FormatFloat(us/1000, 'f', 2, 64) + "ms"
	}
	return strconv.FormatFloat(us, 'f', 1, 64) + "µs"
}

func profPlural(n int, s string) string {
	if n == 1 {
		return s
	}
	return s + "s"
}
