package stripe

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
)

// FuzzDialConfig runs fuzzed part URIs (one a line) and settings through
// Dial with its context already cancelled, so that nothing is dialled
// for long. A part whose URI nbd.ParseURI refuses, or no part at all, is
// a configuration error (ErrConfig) naming the part only — never the
// URI, whose export name is the lease credential; parts that all parse
// are dialled, fail (the context is done), and are not a configuration
// error. No error shows the seeds' credential unless the fuzzer moved
// it into a part's address, which an error may name.
func FuzzDialConfig(f *testing.F) {
	const secret = "rlc_topsecret"
	f.Add("nbd://127.0.0.1:1/"+secret, int64(0), 1)
	f.Add("nbd://127.0.0.1:1/"+secret+".0\nnbds://127.0.0.1:2/"+secret+".1", int64(64<<10), 2)
	f.Add("nbd+unix:///"+secret+"?socket=/nonexistent/sock", int64(3), -1)
	f.Add("nbds://127.0.0.1:1/"+secret+"?tls-certificates=/nonexistent", int64(0), 0)
	f.Add("nbd://[::1/"+secret, int64(0), 1)
	f.Add("http://h/"+secret, int64(0), 1)
	f.Add("", int64(0), 1)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	f.Fuzz(func(t *testing.T, lines string, unit int64, conns int) {
		var uris []string
		if lines != "" {
			uris = strings.Split(lines, "\n")
		}
		if len(uris) > 8 {
			uris = uris[:8]
		}
		conns = 1 + int(uint(conns)%3)
		malformed := len(uris) == 0
		var addrs []string
		for _, s := range uris {
			u, err := nbd.ParseURI(s)
			if err != nil {
				malformed = true
				continue
			}
			addrs = append(addrs, u.Address)
		}
		v, err := Dial(ctx, AttachConfig{URIs: uris, StripeUnit: unit, ConnsPerPart: conns})
		if err == nil {
			v.Close()
			t.Fatalf("Dial of %d parts with a cancelled context succeeded", len(uris))
		}
		if errors.Is(err, ErrConfig) != malformed {
			t.Fatalf("Dial = %v; a part's URI malformed: %v", err, malformed)
		}
		if strings.Contains(err.Error(), secret) {
			named := false
			for _, a := range addrs {
				named = named || strings.Contains(a, secret)
			}
			if !named || malformed {
				t.Fatalf("Dial's error shows the credential: %v", err)
			}
		}
	})
}

// sizeDev is a device of a size only: New looks at nothing else.
type sizeDev int64

func (d sizeDev) Size() int64                          { return int64(d) }
func (sizeDev) ReadAt(p []byte, _ int64) (int, error)  { return 0, errors.New("sizeDev: no data") }
func (sizeDev) WriteAt(p []byte, _ int64) (int, error) { return 0, errors.New("sizeDev: no data") }
func (sizeDev) Flush() error                           { return nil }

// FuzzNewConfig builds volumes of fuzzed stripe units over 1–4 devices
// of fuzzed sizes: New accepts exactly the documented configurations (a
// power-of-two unit in [MinStripeUnit, MaxStripeUnit], 0 meaning
// DefaultStripeUnit; no negative size; the smallest device holding a
// unit; a size that fits in an int64), refusing the others with
// ErrConfig, and the volume's size is the documented formula: N × the
// smallest size rounded down to the unit.
func FuzzNewConfig(f *testing.F) {
	f.Add(int64(0), uint8(2), int64(1<<30), int64(1<<30), int64(0), int64(0))
	f.Add(int64(4096), uint8(3), int64(10000), int64(8192), int64(4096), int64(0))
	f.Add(int64(3<<10), uint8(1), int64(1<<20), int64(0), int64(0), int64(0))
	f.Add(int64(32<<20), uint8(1), int64(1<<40), int64(0), int64(0), int64(0))
	f.Add(int64(1<<20), uint8(4), int64(-1), int64(1<<20), int64(1<<20), int64(1<<20))
	f.Add(int64(16<<20), uint8(4), int64(1<<62), int64(1<<62), int64(1<<62), int64(1<<62))
	f.Add(int64(-4096), uint8(1), int64(1<<20), int64(0), int64(0), int64(0))
	f.Fuzz(func(t *testing.T, unit int64, n uint8, s0, s1, s2, s3 int64) {
		sizes := []int64{s0, s1, s2, s3}[:1+n%4]
		devs := make([]Device, len(sizes))
		for i, s := range sizes {
			devs[i] = sizeDev(s)
		}
		v, err := New(devs, Config{StripeUnit: unit})
		u := unit
		if u == 0 {
			u = DefaultStripeUnit
		}
		valid := u >= MinStripeUnit && u <= MaxStripeUnit && u&(u-1) == 0
		smallest := sizes[0]
		for _, s := range sizes {
			valid = valid && s >= 0
			smallest = min(smallest, s)
		}
		per := smallest / u * u
		valid = valid && per > 0 && per <= (1<<63-1)/int64(len(sizes))
		if !valid {
			if err == nil || !errors.Is(err, ErrConfig) {
				t.Fatalf("New(unit %d, sizes %v) = %v, want ErrConfig", unit, sizes, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("New(unit %d, sizes %v): %v", unit, sizes, err)
		}
		if v.StripeUnit() != u || v.Devices() != len(sizes) || v.Size() != per*int64(len(sizes)) {
			t.Fatalf("New(unit %d, sizes %v): unit %d, %d devices, size %d", unit, sizes, v.StripeUnit(), v.Devices(), v.Size())
		}
	})
}
