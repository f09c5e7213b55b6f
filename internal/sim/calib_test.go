package sim

import (
	"fmt"
	"os"
	"testing"
)

func TestCalibRedis(t *testing.T) {
	if os.Getenv("EXPLORE") == "" {
		t.Skip()
	}
	for _, keys := range []int{77000, 77500} {
		for _, base := range []float64{53e6, 54e6} {
			s := DefaultRedis
			s.Keys, s.BaseBytes = keys, base
			a, _ := RunRedis(s, 70e6, 50e6, 1)
			b, _ := RunRedis(s, 350e6, 50e6, 1)
			fmt.Printf("keys=%d base=%.0f h70=%.4f h350=%.4f\n", keys, base/1e6, a.HitRate, b.HitRate)
		}
	}
}
