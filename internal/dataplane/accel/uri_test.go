package accel

import (
	"log/slog"
	"reflect"
	"strings"
	"testing"
)

func TestParseURI(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want URI
		err  string // a substring of the error; "" for none
	}{
		{"rialto-accel://127.0.0.1:5/cred", URI{Slots: []string{"127.0.0.1:5"}, Credential: "cred"}, ""},
		{"rialto-accel://127.0.0.1:5/cred?slots=127.0.0.1:6,127.0.0.1:7",
			URI{Slots: []string{"127.0.0.1:5", "127.0.0.1:6", "127.0.0.1:7"}, Credential: "cred"}, ""},
		{"rialto-accel://[::1]:4100/x?slots=[::1]:4101,,[::1]:4102",
			URI{Slots: []string{"[::1]:4100", "[::1]:4101", "[::1]:4102"}, Credential: "x"}, ""},
		{"rialto-accel://10.0.0.1:4200/rlc_a.0?gateway=mct",
			URI{Slots: []string{"10.0.0.1:4200"}, Credential: "rlc_a.0", Gateway: "mct"}, ""},
		{"rialto-accel://h:1/c?slots=&other=1#f", URI{Slots: []string{"h:1"}, Credential: "c"}, ""},
		{"rialto-accel://127.0.0.1:5/", URI{}, "accelerator URI without a credential"},
		{"nbd://127.0.0.1:5/x", URI{}, "not an accelerator URI"},
		{"rialto-accel:///x", URI{}, "not an accelerator URI"},
		{"rialto-accel://h:1/%zz", URI{}, "not an accelerator URI"},
	} {
		got, err := ParseURI(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseURI(%q) = %+v, %v; want an error with %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseURI(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
		if got.Shared() != (tc.want.Gateway != "") {
			t.Errorf("ParseURI(%q).Shared() = %v", tc.in, got.Shared())
		}
	}
}

// String is what the agent has always built by concatenation, byte for
// byte: lease records in existing databases hold these strings.
func TestURIStringIsTheWireForm(t *testing.T) {
	const cred = "rlc_0123456789abcdefghjkmnpqrstvwxyz0123456789abcdefg.0"
	for _, tc := range []struct {
		u    URI
		want string
	}{
		{URI{Slots: []string{"10.0.0.1:4100"}, Credential: cred}, "rialto-accel://10.0.0.1:4100/" + cred},
		{URI{Slots: []string{"10.0.0.1:4100", "10.0.0.1:4101", "10.0.0.1:4105"}, Credential: cred},
			"rialto-accel://10.0.0.1:4100/" + cred + "?slots=10.0.0.1:4101,10.0.0.1:4105"},
		{URI{Slots: []string{"[fd00::2]:4100", "[fd00::2]:4101"}, Credential: cred},
			"rialto-accel://[fd00::2]:4100/" + cred + "?slots=[fd00::2]:4101"},
		{URI{Slots: []string{"node-3.rack:4200"}, Credential: cred, Gateway: "sha256"},
			"rialto-accel://node-3.rack:4200/" + cred + "?gateway=sha256"},
	} {
		if got := tc.u.String(); got != tc.want {
			t.Errorf("String() = %q, want %q", got, tc.want)
		}
		back, err := ParseURI(tc.u.String())
		if err != nil || !reflect.DeepEqual(back, tc.u) {
			t.Errorf("ParseURI(String()) = %+v, %v; want %+v", back, err, tc.u)
		}
	}
	// What a query would misread is escaped. (An address never holds the
	// "," that separates slots.)
	u := URI{Slots: []string{"h:1", "a b", "c&slots=d"}, Credential: "c/d?e", Gateway: "r+s;t#u%"}
	if back, err := ParseURI(u.String()); err != nil || !reflect.DeepEqual(back, u) {
		t.Errorf("%q parses to %+v, %v", u.String(), back, err)
	}
}

func TestURIRedacted(t *testing.T) {
	const secret = "rlc_supersecretcredential.0"
	u := URI{Slots: []string{"127.0.0.1:5", "127.0.0.1:6"}, Credential: secret}
	if got := u.Redacted(); got != "rialto-accel://127.0.0.1:5/xxxxx?slots=127.0.0.1:6" {
		t.Errorf("Redacted() = %q", got)
	}
	var b strings.Builder
	slog.New(slog.NewTextHandler(&b, nil)).Info("dial", "uri", u)
	if strings.Contains(b.String(), secret) || !strings.Contains(b.String(), "127.0.0.1:6") {
		t.Errorf("a logged URI shows its credential or hides its slots: %s", b.String())
	}
	for _, s := range []string{"rialto-accel://127.0.0.1:5/" + secret + "%zz", "rialto-accel://[::1/" + secret, "nbd://h:1/" + secret} {
		if _, err := ParseURI(s); err == nil || strings.Contains(err.Error(), secret) {
			t.Errorf("ParseURI(%q): error %v leaks the credential or is missing", s, err)
		}
	}
}

// FuzzParseURI: whatever parses prints to a string that parses back to the
// same URI, and a parse error is one of two fixed messages (it never quotes
// the input, which carries the credential).
func FuzzParseURI(f *testing.F) {
	f.Add("rialto-accel://127.0.0.1:5/rlc_abc.0?slots=127.0.0.1:6,127.0.0.1:7")
	f.Add("rialto-accel://[::1]:4200/c?gateway=mct")
	f.Add("rialto-accel://h:1/a%2Fb?slots=x%2Cy,,z&gateway=a+b")
	f.Fuzz(func(t *testing.T, s string) {
		u, err := ParseURI(s)
		if err != nil {
			if err != errNotAccelURI && err != errNoURICredential {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		back, err := ParseURI(u.String())
		if err != nil || !reflect.DeepEqual(back, u) {
			t.Fatalf("%q → %+v → %q → %+v, %v", s, u, u.String(), back, err)
		}
	})
}
