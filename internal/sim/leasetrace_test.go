package sim

import (
	"errors"
	"strings"
	"testing"
)

func TestReplayLeases(t *testing.T) {
	trace := "arrival_s,borrower,size_bytes,bandwidth_Bps,work_bytes,deadline_s\n" +
		"0,b0,200000000000,477000000,1500000000,\n" +
		"0,b1,200000000000,477000000,1500000000,\n" +
		"1,b2,200000000000,477000000,1500000000,10\n" +
		"2,nowhere,1000,0,0,\n"
	recs, err := ReadLeaseTrace(strings.NewReader(trace))
	if err != nil {
		t.Fatal(err)
	}
	out, events := ReplayLeases(callSnapshot(CallNVMe, 2, 3), recs)
	if events == 0 || len(out) != 4 {
		t.Fatalf("events %d outcomes %d", events, len(out))
	}
	for _, o := range out[:3] {
		if o.Plan == "" || o.Finish == 0 || o.Late || o.Slowdown < 1-1e-9 || o.Slowdown > 1.05 {
			t.Errorf("outcome %+v", o)
		}
	}
	if out[3].Refused == "" {
		t.Errorf("unknown borrower placed: %+v", out[3])
	}
}

func TestReadLeaseTraceErrors(t *testing.T) {
	for _, bad := range []string{
		"arrival_s,borrower,size_bytes,bandwidth_Bps,work_bytes\n0,,1,0,0\n",
		"arrival_s,borrower,size_bytes,bandwidth_Bps,work_bytes\n0,b,0,0,0\n",
		"arrival_s,borrower,size_bytes,bandwidth_Bps,work_bytes\nNaN,b,1,0,0\n",
		"arrival_s,borrower,size_bytes,bandwidth_Bps,work_bytes,deadline_s\n0,b,1,0,0,5\n",
		"borrower\nb\n",
	} {
		if _, err := ReadLeaseTrace(strings.NewReader(bad)); !errors.Is(err, ErrTrace) {
			t.Errorf("%q: err %v", bad, err)
		}
	}
}

func FuzzReadLeaseTrace(f *testing.F) {
	f.Add("arrival_s,borrower,size_bytes,bandwidth_Bps,work_bytes,deadline_s\n0,b0,1000,5,10,3\n")
	f.Add("arrival_s,borrower,size_bytes,bandwidth_Bps,work_bytes\n1e3,b,1e9,0,0\n")
	f.Fuzz(func(t *testing.T, s string) {
		recs, err := ReadLeaseTrace(strings.NewReader(s))
		if err != nil {
			return
		}
		for i, r := range recs {
			if r.Size < 1 || r.Borrower == "" || r.Arrival < 0 || (i > 0 && recs[i-1].Arrival > r.Arrival) {
				t.Fatalf("bad record %+v", r)
			}
		}
	})
}
