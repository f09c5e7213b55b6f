package sim

import (
	"os"
	"testing"
	"time"
)

func TestGPUOpenb(t *testing.T) {
	if _, err := os.Stat(sharedTraces); err != nil {
		t.Skip("traces absent")
	}
	start := time.Now()
	r := runExp(t, "gpu-openb", Options{Traces: os.DirFS(sharedTraces), Sample: 8})
	t.Logf("took %v", time.Since(start))
	w := metric(t, r, "whole-device: deadline misses")
	x := metric(t, r, "rialto: deadline misses")
	if x > w {
		t.Errorf("rialto misses %v > whole-device %v", x, w)
	}
	if sw, sx := metric(t, r, "whole-device: GPU stranded"), metric(t, r, "rialto: GPU stranded"); sx > sw {
		t.Errorf("rialto strands %v > whole-device %v", sx, sw)
	}
}
