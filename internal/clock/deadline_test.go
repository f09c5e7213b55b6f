package clock

import (
	"testing"
	"time"
)

func TestDeadline(t *testing.T) {
	f := NewFake(t0)
	d := NewDeadline(f)
	if d.Passed() {
		t.Fatal("a deadline with no time set passed")
	}
	d.Set(t0.Add(time.Second))
	f.Advance(999 * time.Millisecond)
	if d.Passed() {
		t.Fatal("passed before its time")
	}
	f.Advance(time.Millisecond)
	if !d.Passed() {
		t.Fatal("not passed at its time")
	}
	d.Set(t0.Add(2 * time.Second)) // renewed
	if d.Passed() || !d.At().Equal(t0.Add(2*time.Second)) {
		t.Fatalf("a moved deadline: passed %v at %v", d.Passed(), d.At())
	}
	d.Set(time.Time{})
	f.Advance(time.Hour)
	if d.Passed() || !d.At().IsZero() {
		t.Fatal("a removed deadline passed")
	}
	var none *Deadline
	if none.Passed() {
		t.Fatal("a nil deadline passed")
	}
}

// BenchmarkDeadlinePassed is the check a data plane makes per request.
func BenchmarkDeadlinePassed(b *testing.B) {
	d := NewDeadline(nil)
	d.Set(time.Now().Add(time.Hour))
	for b.Loop() {
		if d.Passed() {
			b.Fatal("passed")
		}
	}
}
