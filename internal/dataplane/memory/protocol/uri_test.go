package protocol

import (
	"log/slog"
	"strings"
	"testing"
)

func TestParseURI(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want URI
		err  string // a substring of the error; "" for none
	}{
		{"rialto-mem://127.0.0.1:9000/abc", URI{"127.0.0.1:9000", "abc", false}, ""},
		{"rialto-mem://[::1]:9000/rlc_0a1b.0", URI{"[::1]:9000", "rlc_0a1b.0", false}, ""},
		{"rialto-mem://node-3.rack:7/c?ignored=1#frag", URI{"node-3.rack:7", "c", false}, ""},
		{"RIALTO-MEM://h:1/c", URI{"h:1", "c", false}, ""},
		{"rialto-mem://h:1/a%2Fb%3Fc", URI{"h:1", "a/b?c", false}, ""},
		{"rialto-mems://10.0.0.7:9000/rlc_x.0", URI{"10.0.0.7:9000", "rlc_x.0", true}, ""},
		{"rialto-mems://10.0.0.7:9000/", URI{}, "memory URI without a credential"},
		{"rialto-mem://127.0.0.1:9000/", URI{}, "memory URI without a credential"},
		{"rialto-mem://127.0.0.1:9000", URI{}, "memory URI without a credential"},
		{"nbd://127.0.0.1:9000/abc", URI{}, "not a memory URI"},
		{"rialto-mem:///abc", URI{}, "not a memory URI"},
		{"rialto-mem://h:1/%zz", URI{}, "not a memory URI"},
		{"", URI{}, "not a memory URI"},
	} {
		got, err := ParseURI(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseURI(%q) = %+v, %v; want an error with %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseURI(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

// String is what the agent has always built by concatenation, byte for
// byte: lease records in existing databases hold these strings.
func TestURIStringIsTheWireForm(t *testing.T) {
	for _, u := range []URI{
		{"127.0.0.1:9000", "rlc_0123456789abcdefghjkmnpqrstvwxyz0123456789abcdefg.0", false},
		{"[fd00::2]:7400", "rlc_x.12", false},
		{"node-3.rack.example:7400", "abc-DEF_ghi.~9", false},
		{"10.0.0.7:7400", "rlc_x.0", true},
	} {
		scheme := "rialto-mem"
		if u.TLS {
			scheme = "rialto-mems"
		}
		if got, want := u.String(), scheme+"://"+u.Address+"/"+u.Credential; got != want {
			t.Errorf("String() = %q, want %q", got, want)
		}
		back, err := ParseURI(u.String())
		if err != nil || back != u {
			t.Errorf("ParseURI(String()) = %+v, %v; want %+v", back, err, u)
		}
	}
}

func TestURIRedacted(t *testing.T) {
	const secret = "rlc_supersecretcredential.0"
	u := URI{Address: "127.0.0.1:9000", Credential: secret}
	if got := u.Redacted(); got != "rialto-mem://127.0.0.1:9000/xxxxx" {
		t.Errorf("Redacted() = %q", got)
	}
	if got := (URI{Address: "h:1", Credential: secret, TLS: true}).Redacted(); got != "rialto-mems://h:1/xxxxx" {
		t.Errorf("Redacted() = %q", got)
	}
	var b strings.Builder
	slog.New(slog.NewTextHandler(&b, nil)).Info("dial", "uri", u)
	if strings.Contains(b.String(), secret) || !strings.Contains(b.String(), "127.0.0.1:9000") {
		t.Errorf("a logged URI shows its credential or hides its address: %s", b.String())
	}
	for _, s := range []string{"rialto-mem://127.0.0.1:9000/" + secret + "%zz", "rialto-mem://[::1/" + secret, "nbd://h:1/" + secret} {
		if _, err := ParseURI(s); err == nil || strings.Contains(err.Error(), secret) {
			t.Errorf("ParseURI(%q): error %v leaks the credential or is missing", s, err)
		}
	}
}

// FuzzParseURI: whatever parses prints to a string that parses back to the
// same URI, and a parse error is one of two fixed messages (it never quotes
// the input, which carries the credential).
func FuzzParseURI(f *testing.F) {
	f.Add("rialto-mem://127.0.0.1:9000/rlc_abc.0")
	f.Add("rialto-mem://[::1]:9000/a%2Fb")
	f.Add("rialto-mem://h/c?x#y")
	f.Add("rialto-mems://h:1/c")
	f.Fuzz(func(t *testing.T, s string) {
		u, err := ParseURI(s)
		if err != nil {
			if err != errNotMemoryURI && err != errNoURICredential {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		back, err := ParseURI(u.String())
		if err != nil || back != u {
			t.Fatalf("%q → %+v → %q → %+v, %v", s, u, u.String(), back, err)
		}
	})
}
