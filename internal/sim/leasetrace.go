package sim

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"time"

	"github.com/rialto-project/rialto/internal/placement"
)

// LeaseRecord is one line of a generic lease trace: at Arrival seconds a
// borrower asks for a block lease of Size bytes and writes Work bytes
// through it at up to Bandwidth bytes/s (0: as fast as it can), optionally
// within Deadline seconds.
type LeaseRecord struct {
	Arrival   float64
	Borrower  string
	Size      int64
	Bandwidth float64
	Work      float64
	Deadline  float64
}

// ReadLeaseTrace parses a lease trace CSV with the header
// arrival_s,borrower,size_bytes,bandwidth_Bps,work_bytes[,deadline_s],
// sorted by arrival on return.
func ReadLeaseTrace(r io.Reader) ([]LeaseRecord, error) {
	rows, err := csvTable(r, "arrival_s", "borrower", "size_bytes", "bandwidth_Bps", "work_bytes")
	if err != nil {
		return nil, err
	}
	num := func(row csvRow, col string, line int) (float64, error) {
		s := row.get(col)
		if s == "" {
			return 0, nil
		}
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 || v > 1e18 {
			return 0, fmt.Errorf("%w: row %d: %s=%q", ErrTrace, line, col, s)
		}
		return v, nil
	}
	out := make([]LeaseRecord, 0, len(rows))
	for i, row := range rows {
		line := i + 2
		rec := LeaseRecord{Borrower: row.get("borrower")}
		if rec.Borrower == "" {
			return nil, fmt.Errorf("%w: row %d: no borrower", ErrTrace, line)
		}
		var size float64
		for _, c := range []struct {
			col string
			dst *float64
		}{{"arrival_s", &rec.Arrival}, {"size_bytes", &size}, {"bandwidth_Bps", &rec.Bandwidth}, {"work_bytes", &rec.Work}, {"deadline_s", &rec.Deadline}} {
			if *c.dst, err = num(row, c.col, line); err != nil {
				return nil, err
			}
		}
		if size < 1 {
			return nil, fmt.Errorf("%w: row %d: size must be positive", ErrTrace, line)
		}
		if rec.Deadline > 0 && rec.Work == 0 {
			return nil, fmt.Errorf("%w: row %d: a deadline needs work", ErrTrace, line)
		}
		rec.Size = int64(size)
		out = append(out, rec)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Arrival < out[j].Arrival })
	return out, nil
}

// LeaseOutcome is what happened to one traced lease.
type LeaseOutcome struct {
	Record   LeaseRecord
	Plan     string // placement's plan, or "" when refused
	Refused  string // placement's reason when refused
	Finish   Time   // completion time (0 when refused)
	Slowdown float64
	Late     bool // finished after its deadline
}

// ReplayLeases replays a lease trace on a cluster built from snap: each
// record is placed by internal/placement when it arrives (refused records
// are reported with placement's explanation, not queued), its work moves
// through the fabric model, and the lease is released when done.
func ReplayLeases(snap *placement.Snapshot, recs []LeaseRecord) ([]LeaseOutcome, uint64) {
	c := NewCluster(snap)
	var e Engine
	net := NewNet(&e)
	out := make([]LeaseOutcome, len(recs))
	for i, rec := range recs {
		e.At(rec.Arrival, func() {
			o := &out[i]
			o.Record = rec
			req := placement.Request{Kind: placement.KindBlock, Size: rec.Size, Borrower: rec.Borrower, Bandwidth: rec.Bandwidth,
				Work: int64(rec.Work), Deadline: time.Duration(rec.Deadline * float64(time.Second)), AllowShare: true, AllowCompose: true}
			plan, err := c.Index.Place(req)
			if err != nil {
				o.Refused = err.Error()
				return
			}
			id := "trace-" + strconv.Itoa(i)
			if err := c.Index.Add(plan.Lease(id, req, time.Duration(e.Now()*float64(time.Second)))); err != nil {
				o.Refused = err.Error()
				return
			}
			o.Plan = plan.String()
			if rec.Work <= 0 {
				_ = c.Index.Remove(id)
				return
			}
			rate := rec.Bandwidth
			if rate <= 0 {
				rate = math.Inf(1)
			}
			vol := c.Volume(rec.Borrower, plan.Parts)
			k := float64(len(vol.Members))
			left := len(vol.Members)
			start := e.Now()
			for _, p := range vol.Members {
				cp := 0.0
				if !math.IsInf(rate, 1) {
					cp = rate / k
				}
				net.Start(rec.Work/k, p, cp, func(*Flow) {
					if left--; left > 0 {
						return
					}
					o.Finish = e.Now()
					if !math.IsInf(rate, 1) {
						o.Slowdown = (e.Now() - start) / (rec.Work / rate)
					}
					o.Late = rec.Deadline > 0 && e.Now()-start > rec.Deadline
					_ = c.Index.Remove(id)
				})
			}
		})
	}
	e.Run(0)
	return out, e.Events()
}
