package nic

import (
	"strings"
	"testing"
)

func TestURI(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want URI
		ok   bool
	}{
		{"rialto-nic://10.0.0.2:7300/abc-DEF_1.2~", URI{"10.0.0.2:7300", "abc-DEF_1.2~", false}, true},
		{"rialto-nic://[::1]:7300/k3y", URI{"[::1]:7300", "k3y", false}, true},
		{"rialto-nics://10.0.0.2:7300/abc-DEF_1.2~", URI{"10.0.0.2:7300", "abc-DEF_1.2~", true}, true},
		{"rialto-nics://node1.rack:7300/k3y", URI{"node1.rack:7300", "k3y", true}, true},
		{"rialto-nic://10.0.0.2/x", URI{}, false},
		{"rialto-nics://10.0.0.2/x", URI{}, false},
		{"rialto-nic://10.0.0.2:7300/", URI{}, false},
		{"rialto-nics://10.0.0.2:7300/", URI{}, false},
		{"rialto-nicss://10.0.0.2:7300/x", URI{}, false},
		{"rialto-mem://10.0.0.2:7300/x", URI{}, false},
		{"rialto-mems://10.0.0.2:7300/x", URI{}, false},
		{"::", URI{}, false},
	} {
		got, err := ParseURI(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseURI(%q) = %+v, %v", tc.in, got, err)
		}
		if err != nil && strings.Contains(err.Error(), "abc") {
			t.Errorf("error quotes the credential: %v", err)
		}
		if tc.ok && got.String() != tc.in {
			t.Errorf("String() = %q, want %q", got.String(), tc.in)
		}
		if tc.ok && strings.Contains(got.Redacted(), got.Credential) {
			t.Errorf("Redacted() = %q", got.Redacted())
		}
		if tc.ok && !strings.HasPrefix(got.Redacted(), tc.in[:strings.Index(tc.in, "://")+3]) {
			t.Errorf("Redacted() = %q changes the scheme of %q", got.Redacted(), tc.in)
		}
		if tc.ok && got.Member().TLS != got.TLS {
			t.Errorf("Member() of %q: TLS %v", tc.in, got.Member().TLS)
		}
	}
}

func FuzzParseURI(f *testing.F) {
	f.Add("rialto-nic://10.0.0.2:7300/secret")
	f.Add("rialto-nic://h:1/%2F")
	f.Add("rialto-nics://10.0.0.2:7300/secret")
	f.Fuzz(func(t *testing.T, s string) {
		u, err := ParseURI(s)
		if err != nil {
			return
		}
		again, err := ParseURI(u.String())
		if err != nil || again != u {
			t.Fatalf("round trip of %q: %+v, %v", s, again, err)
		}
		// A scheme is case-insensitive.
		if want := len(s) > len(SchemeTLS) && strings.EqualFold(s[:len(SchemeTLS)+1], SchemeTLS+":"); u.TLS != want {
			t.Fatalf("ParseURI(%q).TLS = %v", s, u.TLS)
		}
	})
}
