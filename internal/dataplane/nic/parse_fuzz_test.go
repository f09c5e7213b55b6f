package nic

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
)

// FuzzParseError turns arbitrary ERROR payloads into errors: each wraps
// the status's sentinel (ErrBadFrame for an empty payload, OK or an
// unknown status) and carries the message; ErrorPayload's payloads come
// back as the status and message (bounded by MaxMessage) they were
// built from.
func FuzzParseError(f *testing.F) {
	f.Add(StatusAuth, "nic: credential refused", []byte(nil))
	f.Add(StatusBusy, "", []byte{StatusGone})
	f.Add(uint8(200), strings.Repeat("x", MaxMessage+5), []byte{})
	f.Add(StatusOK, "ok?", []byte{StatusOK, 'a'})
	f.Fuzz(func(t *testing.T, status uint8, msg string, raw []byte) {
		want := StatusErr(status)
		if want == nil {
			want = ErrBadFrame
		}
		err := ParseError(ErrorPayload(status, msg))
		if !errors.Is(err, want) {
			t.Fatalf("ParseError(ErrorPayload(%d, …)) = %v, want %v", status, err, want)
		}
		if m := msg[:min(len(msg), MaxMessage)]; m != "" && !strings.HasSuffix(err.Error(), ": "+m) {
			t.Fatalf("ParseError lost the message: %v", err)
		}
		err = ParseError(raw)
		if err == nil {
			t.Fatalf("ParseError(%x) = nil", raw)
		}
		want = ErrBadFrame
		if len(raw) > 0 && StatusErr(raw[0]) != nil {
			want = StatusErr(raw[0])
		}
		if !errors.Is(err, want) {
			t.Fatalf("ParseError(%x) = %v, want %v", raw, err, want)
		}
	})
}

// FuzzParseRate parses arbitrary rates: an accepted one is at least 8
// bits/s and is what its number times its unit says (no wrap-around of a
// rate too large for 64 bits); a rate and its bare number of bits/s
// agree.
func FuzzParseRate(f *testing.F) {
	for _, s := range []string{"200mbit", "1gbit", "50mbps", "125000", " 1.5GBIT ", "0", "-1mbit", "7bit", "1e9", "mbit", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRate(s)
		if err != nil {
			if r != 0 {
				t.Fatalf("ParseRate(%q) = %d with error %v", s, r, err)
			}
			return
		}
		if r < 8 {
			t.Fatalf("ParseRate(%q) = %d bits/s", s, r)
		}
		// What the number and unit say, parsed another way.
		t2 := strings.ToLower(strings.TrimSpace(s))
		i := len(t2) - len(strings.TrimLeft(t2, "0123456789."))
		v, perr := strconv.ParseFloat(t2[:i], 64)
		mult := map[string]float64{"": 1, "bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
			"bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9}[t2[i:]]
		if perr != nil || mult == 0 {
			t.Fatalf("ParseRate(%q) = %d; the number or unit does not parse (%v)", s, r, perr)
		}
		if want := v * mult; math.Abs(float64(r)-want) > want*1e-9+1 {
			t.Fatalf("ParseRate(%q) = %d bits/s, the string says %g", s, r, want)
		}
	})
}

// FuzzParseMode accepts "", "flow" and "packet" only.
func FuzzParseMode(f *testing.F) {
	for _, s := range []string{"", "flow", "packet", "Flow", "packet "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseMode(s)
		switch s {
		case "", "flow":
			if err != nil || m != ModeFlow {
				t.Fatalf("ParseMode(%q) = %q, %v", s, m, err)
			}
		case "packet":
			if err != nil || m != ModePacket {
				t.Fatalf("ParseMode(%q) = %q, %v", s, m, err)
			}
		default:
			if err == nil || m != "" {
				t.Fatalf("ParseMode(%q) = %q, %v", s, m, err)
			}
		}
	})
}
