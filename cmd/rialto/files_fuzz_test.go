package main

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

// FuzzTokenFile reads arbitrary token files (--token-file, the tenants'
// TOKEN:TENANT[:admin] lines; --bootstrap-token-file holding one token)
// as rialto server does: the file's content, trimmed, split at newlines
// and commas. Nothing panics; a refusal never quotes the file's content
// (every token in it is a secret); an accepted file gives tokens and
// tenants that are not empty and carry no separator or surrounding
// space, and writing them out again reads back the same.
func FuzzTokenFile(f *testing.F) {
	for _, s := range []string{"tok1:acme\ntok2:ops:admin\n", "a:b,c:d", "\r\ntok:t\r\n", "tok", "tok:", ":t", "tok:t:root",
		"  \n ", "tok:t:admin:x", "tok:t\n\n,\n", "tok : acme\nt2: ops : admin"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, content []byte) {
		path := filepath.Join(t.TempDir(), "tokens")
		if err := os.WriteFile(path, content, 0o600); err != nil {
			t.Fatal(err)
		}
		s := &secret{name: "token", env: "RIALTO_TOKENS", file: path}
		specs, err := s.get()
		if err != nil {
			if !strings.HasPrefix(err.Error(), "--token-file: ") {
				t.Fatalf("unclear refusal: %v", err)
			}
			return
		}
		if specs != strings.TrimSpace(specs) || specs == "" {
			t.Fatalf("secret %q not trimmed", specs)
		}
		src := tokensFrom(s)
		tokens, err := parseTokens(src, specs)
		if err != nil {
			// The same words whatever the file holds but the line's
			// number (and entry's): nothing of its text.
			_, ref := parseTokens(src, "x")
			if numbers := regexp.MustCompile(`line [0-9]+(, entry [0-9]+)?|entry [0-9]+`); numbers.ReplaceAllString(err.Error(), "N") != numbers.ReplaceAllString(ref.Error(), "N") {
				t.Fatalf("refusal %q depends on the file's content", err)
			}
			return
		}
		var lines []string
		for _, tk := range tokens {
			for _, v := range []string{tk.Token, tk.Tenant} {
				if v == "" || v != strings.TrimSpace(v) || strings.ContainsAny(v, ":,\n") {
					t.Fatalf("token or tenant %q from %q", v, specs)
				}
			}
			l := tk.Token + ":" + tk.Tenant
			if tk.Admin {
				l += ":admin"
			}
			lines = append(lines, l)
		}
		again, err := parseTokens(src, strings.Join(lines, "\n"))
		if err != nil || !reflect.DeepEqual(again, tokens) {
			t.Fatalf("%q reads as %+v, written out as %q, read back as %+v, %v", specs, tokens, lines, again, err)
		}
	})
}

// FuzzCLIStateFiles reads arbitrary state files of the CLI: an
// attachment's LEASE.json (what `rialto detach` and a second `rialto
// attach` of the lease read) and `rialto up`'s cluster.json. Nothing
// panics; a refusal names the file; what is read survives being written
// and read again.
func FuzzCLIStateFiles(f *testing.F) {
	f.Add([]byte(`{"id":"lease-1","state":"attached","pid":4242,"uri":"nbd+unix:///x?socket=/run/x.nbd","size":1048576,"parts":2,`+
		`"control":"/run/user/1000/rialto/lease-1.ctl","started":"2024-05-01T10:00:00Z","write_back":true}`),
		[]byte(`{"bootstrap_token":"b","admin_token":"a","port":7443,"metrics_token":"m"}`))
	f.Add([]byte(`{"id":"lease-2","pid":-1,"iface":"rialto0","addr":"100.64.0.2/32","routes":["10.0.0.0/8"],"started":"not a time"}`),
		[]byte(`{"port":"x"}`))
	f.Add([]byte(`null`), []byte(``))
	f.Add([]byte(`{"pid":1e99}`), []byte(`{"port":-5,"extra":{}}`))
	f.Fuzz(func(t *testing.T, attach, cluster []byte) {
		dir := t.TempDir()
		file := filepath.Join(dir, "lease-1.json")
		if err := os.WriteFile(file, attach, 0o600); err != nil {
			t.Fatal(err)
		}
		if st, err := readAttachState(file); err != nil {
			if !strings.Contains(err.Error(), file) {
				t.Fatalf("refusal does not name the file: %v", err)
			}
		} else {
			b, err := json.Marshal(st)
			if err != nil {
				t.Fatalf("an attach state read cannot be written: %v", err)
			}
			if err := os.WriteFile(file, b, 0o600); err != nil {
				t.Fatal(err)
			}
			again, err := readAttachState(file)
			if err != nil || !reflect.DeepEqual(normalAttach(again), normalAttach(st)) {
				t.Fatalf("attach state %+v written and read again: %+v, %v", st, again, err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, "cluster.json"), cluster, 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := loadUpState(dir)
		if err != nil {
			if !strings.Contains(err.Error(), filepath.Join(dir, "cluster.json")) {
				t.Fatalf("refusal does not name the file: %v", err)
			}
			return
		}
		if err := saveUpState(dir, s); err != nil {
			t.Fatal(err)
		}
		if again, err := loadUpState(dir); err != nil || again != s {
			t.Fatalf("cluster state %+v saved and loaded again: %+v, %v", s, again, err)
		}
	})
}

// normalAttach is st with its start time compared as an instant.
func normalAttach(st attachState) attachState {
	st.Started = st.Started.UTC()
	if len(st.Routes) == 0 {
		st.Routes = nil
	}
	return st
}

// FuzzParseDeclared reads arbitrary declared-profile files (`rialto
// characterize --declare FILE`): no panics, a refusal says something,
// and a profile accepted is one the documentation allows: a model of at
// most 256 characters without / \ ? # % or control characters, write
// points, every bandwidth a finite number of at least 100 kB/s, at most
// 1024 points a curve, a finite non-negative latency, and its ID the
// model.
func FuzzParseDeclared(f *testing.F) {
	f.Add([]byte(profDeclaredExample))
	f.Add([]byte(`{"model":" nvme ","write_bps":[1e5],"latency_4k_us":0}`))
	f.Add([]byte(`{"model":"a/b","write_bps":[2000]}`))
	f.Add([]byte(`{"model":"m","write_bps":[1e9],"read_bps":[-1],"latency_4k_us":-5,"source":"measured","id":"x"}`))
	f.Add([]byte(`{"model":"m","write_bps":[1e9]} {}`))
	f.Add([]byte(`{"model":"m","write_bps":"fast"}`))
	f.Add([]byte(`{"model": "m", "write_bps": [1e9, -5e8]}`))
	f.Add([]byte(`{"model": "m", "write_bps": [1e9], "latency_4k_us": 1e309}`))
	f.Add([]byte(`{"id": "x", "model": " m ", "write_bps": [1e9], "source": "declared", "measured_at": "2026-01-01T00:00:00Z"}`))
	f.Add([]byte(``))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := parseDeclared(data)
		if err != nil {
			if strings.TrimSpace(err.Error()) == "" {
				t.Fatal("an empty refusal")
			}
			return
		}
		if p.Model == "" || p.Model != strings.TrimSpace(p.Model) || len(p.Model) > 256 || strings.ContainsAny(p.Model, "/\\?#%") ||
			strings.IndexFunc(p.Model, func(r rune) bool { return r < ' ' }) >= 0 || p.ID != p.Model || p.Source != "declared" {
			t.Fatalf("accepted profile %+v", p)
		}
		if len(p.WriteBps) == 0 || len(p.WriteBps) > 1024 || len(p.ReadBps) > 1024 {
			t.Fatalf("accepted curves of %d and %d points", len(p.WriteBps), len(p.ReadBps))
		}
		for _, x := range append(append([]float64(nil), p.WriteBps...), p.ReadBps...) {
			if math.IsNaN(x) || math.IsInf(x, 0) || x < profMinBps {
				t.Fatalf("accepted bandwidth %g", x)
			}
		}
		if math.IsNaN(p.Latency4KUs) || math.IsInf(p.Latency4KUs, 0) || p.Latency4KUs < 0 {
			t.Fatalf("accepted latency %g", p.Latency4KUs)
		}
	})
}
