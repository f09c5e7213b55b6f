package borrower

import (
	"reflect"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/block/stripe"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
	"github.com/rialto-project/rialto/internal/dataplane/nic"
)

// FuzzLeaseURIs runs a lease record as the control plane could hand it
// out (its kind, state, stripe unit, size, URIs and lost parts fuzzed)
// through what `rialto attach` and the accelerator relays read of it
// before dialling: BlockURIs, AttachParts, BlockRange, MemoryURIs,
// NICURIs and AccelSlots. None may panic or show a URI's credential in an
// error; what they accept is consistent with the record: a block range
// lies inside the lease and carries a stripe unit stripe.New accepts (the
// lease's, or the default), memory URIs survive their wire form, NIC
// lenders are the parts not lost, accelerator slots name an address and
// the credential.
func FuzzLeaseURIs(f *testing.F) {
	const (
		blk  = "nbd://10.0.0.1:10809/" + secret + ".0"
		blk2 = "nbds://10.0.0.2:10809/" + secret + ".1"
		mem  = "rialto-mem://10.0.0.1:7100/" + secret
		mems = "rialto-mems://[::1]:7100/" + secret
		nc   = "rialto-nic://10.0.0.3:7200/" + secret
		ncs  = "rialto-nics://10.0.0.5:7200/" + secret
		acc  = "rialto-accel://10.0.0.4:7300/" + secret + "?slots=10.0.0.4:7301,,10.0.0.4:7302"
		accg = "rialto-accels://10.0.0.4:7300/" + secret + "?gateway=fft"
	)
	f.Add(uint8(0), true, int64(0), int64(1<<20), blk, "", uint8(0), int64(4096), int64(4096))
	f.Add(uint8(0), true, int64(64<<10), int64(2<<20), "", blk+"\n"+blk2, uint8(0), int64(0), int64(2<<20))
	f.Add(uint8(0), false, int64(0), int64(1<<20), blk, "", uint8(0), int64(0), int64(1))
	f.Add(uint8(0), true, int64(0), int64(1<<20), "", blk+"\n", uint8(0), int64(0), int64(1))
	f.Add(uint8(1), true, int64(0), int64(1<<30), mem, "", uint8(0), int64(0), int64(0))
	f.Add(uint8(1), true, int64(0), int64(1<<30), "", mems+"\n"+mem, uint8(0), int64(0), int64(0))
	f.Add(uint8(1), true, int64(0), int64(1<<30), "", "rialto-mem://h:1/", uint8(0), int64(0), int64(0))
	f.Add(uint8(2), true, int64(0), int64(0), "", nc+"\n"+nc+"\n"+nc, uint8(2), int64(0), int64(0))
	f.Add(uint8(2), true, int64(0), int64(0), nc, "", uint8(0), int64(0), int64(0))
	f.Add(uint8(2), true, int64(0), int64(0), "", ncs+"\n"+nc, uint8(1), int64(0), int64(0))
	f.Add(uint8(2), true, int64(0), int64(0), "", "rialto-nic://h/"+secret, uint8(0), int64(0), int64(0))
	f.Add(uint8(3), true, int64(0), int64(2000), "", acc, uint8(0), int64(0), int64(0))
	f.Add(uint8(3), true, int64(0), int64(250), accg, "", uint8(0), int64(0), int64(0))
	f.Add(uint8(3), true, int64(0), int64(250), "rialto-accel://%zz/"+secret, "", uint8(0), int64(0), int64(0))
	kinds := []api.Kind{api.KindBlock, api.KindMemory, api.KindNIC, api.KindAccel}
	f.Fuzz(func(t *testing.T, kind uint8, active bool, unit, size int64, leaseURI, partURIs string, lost uint8, off, n int64) {
		l := api.Lease{ID: "lease-1", Kind: kinds[int(kind)%len(kinds)], State: api.LeaseReleased, StripeUnit: unit, Size: size, URI: leaseURI}
		if active {
			l.State = api.LeaseActive
		}
		if partURIs != "" {
			for i, u := range strings.Split(partURIs, "\n") {
				p := api.Part{URI: u}
				if lost&(1<<(i%8)) != 0 {
					p.State = api.PartLost
				}
				l.Parts = append(l.Parts, p)
			}
		}
		// The seeds' credential: no error quotes anything of a URI, so
		// none shows it wherever the fuzzer moves it.
		noCred := func(what string, err error) {
			t.Helper()
			if err != nil && strings.Contains(err.Error(), secret) {
				t.Fatalf("%s: error shows a credential: %v", what, err)
			}
		}

		uris, err := BlockURIs(l)
		noCred("BlockURIs", err)
		if err == nil {
			if l.Kind != api.KindBlock || l.State != api.LeaseActive || len(uris) == 0 {
				t.Fatalf("BlockURIs of a %s %s lease = %d URIs", l.State, l.Kind, len(uris))
			}
			for _, u := range uris {
				if u == "" {
					t.Fatal("BlockURIs returned an empty URI")
				}
			}
		}
		parts, perr := AttachParts(l)
		noCred("AttachParts", perr)
		if l.Kind != api.KindMemory && ((perr == nil) != (err == nil) || parts != len(uris)) {
			t.Fatalf("AttachParts = %d, %v; BlockURIs gave %d, %v", parts, perr, len(uris), err)
		}

		r, rerr := BlockRange(l, off, n)
		noCred("BlockRange", rerr)
		if rerr == nil {
			if err != nil || !reflect.DeepEqual(r.Parts, uris) {
				t.Fatalf("BlockRange parts %d, BlockURIs %d (%v)", len(r.Parts), len(uris), err)
			}
			if off < 0 || n < 0 || off+n > l.Size || r.Offset != uint64(off) {
				t.Fatalf("BlockRange accepted [%d,+%d) of a %d-byte lease (offset %d)", off, n, l.Size, r.Offset)
			}
			if len(uris) > 1 {
				want := l.StripeUnit
				if want == 0 {
					want = stripe.DefaultStripeUnit
				}
				// The slot reads the parts with this unit: it must be the
				// lease's, and one Attach would stripe the lease with.
				if int64(r.StripeUnit) != want {
					t.Fatalf("BlockRange stripe unit %d, the lease's is %d", r.StripeUnit, l.StripeUnit)
				}
				if want < stripe.MinStripeUnit || want > stripe.MaxStripeUnit || want&(want-1) != 0 {
					t.Fatalf("BlockRange accepted stripe unit %d, which Attach refuses", want)
				}
			} else if r.StripeUnit != 0 {
				t.Fatalf("BlockRange of one part has stripe unit %d", r.StripeUnit)
			}
		}

		mu, err := MemoryURIs(l)
		noCred("MemoryURIs", err)
		for _, u := range mu {
			back, err := protocol.ParseURI(u.String())
			if err != nil || back != u {
				t.Fatalf("memory URI does not survive its wire form: %v (%v)", back.Redacted(), err)
			}
			if u.Address == "" || u.Credential == "" {
				t.Fatal("MemoryURIs returned a URI without an address or a credential")
			}
		}

		lenders, nu, err := nicLenders(l)
		noCred("NICURIs", err)
		if err == nil {
			if l.Kind != api.KindNIC || l.State != api.LeaseActive || len(nu) == 0 || len(nu) != len(lenders) {
				t.Fatalf("nicLenders of a %s %s lease = %d parts, %d URIs", l.State, l.Kind, len(lenders), len(nu))
			}
			for k, i := range lenders {
				if i < 0 || (len(l.Parts) > 0 && (i >= len(l.Parts) || l.Parts[i].Lost())) {
					t.Fatalf("NIC lender %d serves part %d, lost or not in the lease", k, i)
				}
				if back, err := nic.ParseURI(nu[k].String()); err != nil || back != nu[k] {
					t.Fatalf("NIC URI does not survive its wire form: %v (%v)", back.Redacted(), err)
				}
			}
		}

		slots, err := AccelSlots(l)
		noCred("AccelSlots", err)
		for _, s := range slots {
			if s.Address == "" || strings.Contains(s.Address, ",") || s.Credential == "" {
				t.Fatalf("accelerator slot %q with credential of %d bytes", s.Address, len(s.Credential))
			}
		}
		if err == nil && len(slots) == 0 {
			t.Fatal("AccelSlots accepted a lease without a slot")
		}
	})
}
