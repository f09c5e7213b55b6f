package main

import (
	"math"
	"testing"
)

// FuzzParseDeclared: `rialto profile declare FILE` parses a user's file;
// whatever it holds, parsing returns a profile or an error, and an accepted
// profile is one placement can use (a model, 1..1024 positive finite
// points per curve, a finite latency).
func FuzzParseDeclared(f *testing.F) {
	f.Add([]byte(profDeclaredExample))
	f.Add([]byte(`{"model": "m", "write_bps": [1e9, -5e8]}`))
	f.Add([]byte(`{"model": "m", "write_bps": [1e9], "latency_4k_us": 1e309}`))
	f.Add([]byte(`{"model": "m", "write_bps": [1e9]} {}`))
	f.Add([]byte(`{"id": "x", "model": " m ", "write_bps": [1e9], "source": "declared", "measured_at": "2026-01-01T00:00:00Z"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := parseDeclared(data)
		if err != nil {
			return
		}
		if p.Model == "" || p.ID != p.Model || p.Source != "declared" || len(p.WriteBps) == 0 || len(p.WriteBps) > 1024 || len(p.ReadBps) > 1024 {
			t.Fatalf("accepted %+v", p)
		}
		for _, v := range append(append([]float64{}, p.WriteBps...), p.ReadBps...) {
			if !(v >= profMinBps) || math.IsInf(v, 0) {
				t.Fatalf("accepted bandwidth %v in %+v", v, p)
			}
		}
		if !(p.Latency4KUs >= 0) || math.IsInf(p.Latency4KUs, 0) {
			t.Fatalf("accepted latency %v", p.Latency4KUs)
		}
	})
}
