package borrower

import (
	"reflect"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/api"
)

// secret is the credential in the URIs below: no error may show it.
const secret = "rlc_topsecret"

func lease(kind api.Kind, state api.LeaseState, uri string, parts ...string) api.Lease {
	l := api.Lease{ID: "lease-1", Kind: kind, State: state, URI: uri}
	for _, p := range parts {
		l.Parts = append(l.Parts, api.Part{URI: p})
	}
	return l
}

func checkErr(t *testing.T, what string, err error, want string) bool {
	t.Helper()
	if want == "" {
		if err != nil {
			t.Errorf("%s: %v", what, err)
			return false
		}
		return true
	}
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("%s: error %v, want one with %q", what, err, want)
	}
	if err != nil && strings.Contains(err.Error(), secret) {
		t.Errorf("%s: error shows the credential: %v", what, err)
	}
	return false
}

func TestBlockURIs(t *testing.T) {
	const a, b = "nbd://10.0.0.1:10809/" + secret + ".0", "nbd://10.0.0.2:10809/" + secret + ".1"
	for _, tc := range []struct {
		name  string
		l     api.Lease
		parts int
		want  []string
		err   string
	}{
		{"one part, URI on the lease", lease(api.KindBlock, api.LeaseActive, a, ""), 1, []string{a}, ""},
		{"no parts", lease(api.KindBlock, api.LeaseActive, a), 1, []string{a}, ""},
		{"composed", lease(api.KindBlock, api.LeaseActive, "", a, b), 2, []string{a, b}, ""},
		{"a part without URI", lease(api.KindBlock, api.LeaseActive, a, a, ""), 0, nil, "lease lease-1: part 1 has no URI"},
		{"no URI", lease(api.KindBlock, api.LeaseActive, ""), 0, nil, "lease lease-1 has no URI"},
		{"released", lease(api.KindBlock, api.LeaseReleased, a), 0, nil, "lease lease-1 is released, not active"},
		{"accelerator", lease(api.KindAccel, api.LeaseActive, a), 0, nil, "lease lease-1 is an accel lease; attach serves block and memory leases"},
	} {
		got, err := BlockURIs(tc.l)
		if checkErr(t, tc.name, err, tc.err) && !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
		n, err := AttachParts(tc.l)
		if checkErr(t, tc.name+" (AttachParts)", err, tc.err) && n != tc.parts {
			t.Errorf("%s: AttachParts %d, want %d", tc.name, n, tc.parts)
		}
	}
	// A memory lease is one part; Attach checks it.
	if n, err := AttachParts(lease(api.KindMemory, api.LeaseExpired, "")); n != 1 || err != nil {
		t.Errorf("AttachParts of a memory lease: %d, %v", n, err)
	}
}

func TestMemoryURIs(t *testing.T) {
	const a, b = "rialto-mem://10.0.0.1:7400/" + secret + ".0", "rialto-mem://[fd00::2]:7400/" + secret + ".1"
	for _, tc := range []struct {
		name string
		l    api.Lease
		want []string // address/credential
		err  string
	}{
		{"URI on the lease", lease(api.KindMemory, api.LeaseActive, a, ""), []string{"10.0.0.1:7400/" + secret + ".0"}, ""},
		{"parts", lease(api.KindMemory, api.LeaseActive, a, a, b), []string{"10.0.0.1:7400/" + secret + ".0", "[fd00::2]:7400/" + secret + ".1"}, ""},
		{"no URI", lease(api.KindMemory, api.LeaseActive, ""), nil, "lease lease-1 has no URI"},
		{"a bad part", lease(api.KindMemory, api.LeaseActive, "", a, "nbd://h:1/"+secret), nil,
			"lease lease-1 part 1: not a memory URI (want rialto-mem:// or rialto-mems://HOST:PORT/CREDENTIAL)"},
		{"a part without credential", lease(api.KindMemory, api.LeaseActive, "", "rialto-mem://h:1/"), nil,
			"lease lease-1 part 0: memory URI without a credential"},
	} {
		us, err := MemoryURIs(tc.l)
		if !checkErr(t, tc.name, err, tc.err) {
			continue
		}
		var got []string
		for _, u := range us {
			got = append(got, u.Address+"/"+u.Credential)
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestAccelSlots(t *testing.T) {
	const (
		one    = "rialto-accel://10.0.0.1:4100/" + secret + ".0"
		three  = "rialto-accel://10.0.0.1:4100/" + secret + ".0?slots=10.0.0.1:4101,10.0.0.1:4102"
		other  = "rialto-accel://10.0.0.2:4100/" + secret + ".1"
		shared = "rialto-accel://10.0.0.3:4200/" + secret + ".0?gateway=mct"
		secure = "rialto-accels://10.0.0.4:4300/" + secret + ".0?gateway=mct"
	)
	for _, tc := range []struct {
		name string
		l    api.Lease
		want []AccelSlot
		err  string
	}{
		{"one slot", lease(api.KindAccel, api.LeaseActive, one), []AccelSlot{{"10.0.0.1:4100", secret + ".0", "", false}}, ""},
		{"slots in the query", lease(api.KindAccel, api.LeaseActive, three, three), []AccelSlot{
			{"10.0.0.1:4100", secret + ".0", "", false}, {"10.0.0.1:4101", secret + ".0", "", false}, {"10.0.0.1:4102", secret + ".0", "", false}}, ""},
		{"parts on two lenders", lease(api.KindAccel, api.LeaseActive, one, one, other), []AccelSlot{
			{"10.0.0.1:4100", secret + ".0", "", false}, {"10.0.0.2:4100", secret + ".1", "", false}}, ""},
		{"shared", lease(api.KindAccel, api.LeaseActive, shared, shared), []AccelSlot{{"10.0.0.3:4200", secret + ".0", "mct", false}}, ""},
		{"shared over TLS", lease(api.KindAccel, api.LeaseActive, secure), []AccelSlot{{"10.0.0.4:4300", secret + ".0", "mct", true}}, ""},
		{"no URI", lease(api.KindAccel, api.LeaseActive, ""), nil,
			"lease lease-1: not an accelerator URI (want rialto-accel:// or rialto-accels://HOST:PORT/CREDENTIAL)"},
		{"a bad part", lease(api.KindAccel, api.LeaseActive, one, one, "rialto-accel://h:1/%zz"+secret), nil,
			"lease lease-1: not an accelerator URI"},
		{"no credential", lease(api.KindAccel, api.LeaseActive, "rialto-accel://h:1/"), nil,
			"lease lease-1: accelerator URI without a credential"},
	} {
		got, err := AccelSlots(tc.l)
		if checkErr(t, tc.name, err, tc.err) && !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

func TestNICURIs(t *testing.T) {
	const a, b = "rialto-nic://10.0.0.1:7300/" + secret + ".0", "rialto-nics://10.0.0.2:7300/" + secret + ".1"
	for _, tc := range []struct {
		name  string
		l     api.Lease
		addrs []string
		err   string
	}{
		{"one lender", lease(api.KindNIC, api.LeaseActive, a, ""), []string{"10.0.0.1:7300"}, ""},
		{"a bond", lease(api.KindNIC, api.LeaseActive, "", a, b), []string{"10.0.0.1:7300", "10.0.0.2:7300"}, ""},
		{"a part without URI", lease(api.KindNIC, api.LeaseActive, "", a, ""), nil, "lease lease-1: part 1 has no URI"},
		{"not a NIC URI", lease(api.KindNIC, api.LeaseActive, "nbd://10.0.0.1:10809/"+secret), nil, "lease lease-1 part 0: nic: not a NIC URI"},
		{"expired", lease(api.KindNIC, api.LeaseExpired, a), nil, "lease lease-1 is expired, not active"},
		{"block", lease(api.KindBlock, api.LeaseActive, a), nil, "lease lease-1 is a block lease, not a nic lease"},
	} {
		got, err := NICURIs(tc.l)
		if !checkErr(t, tc.name, err, tc.err) {
			continue
		}
		var addrs []string
		for _, u := range got {
			addrs = append(addrs, u.Address)
			if want := u.Address == "10.0.0.2:7300"; u.TLS != want {
				t.Errorf("%s: %s: TLS %v", tc.name, u.Redacted(), u.TLS)
			}
			if !strings.HasPrefix(u.Credential, secret) {
				t.Errorf("%s: credential %q", tc.name, u.Credential)
			}
		}
		if !reflect.DeepEqual(addrs, tc.addrs) {
			t.Errorf("%s: %v, want %v", tc.name, addrs, tc.addrs)
		}
	}
}
