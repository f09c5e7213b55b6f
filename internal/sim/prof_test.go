package sim

import (
	"fmt"
	"os"
	"testing"
	"time"
)

func TestProfGPU(t *testing.T) {
	if os.Getenv("EXPLORE") == "" {
		t.Skip()
	}
	nodes, pods, err := LoadOpenb(os.DirFS(sharedTraces), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, pol := range []string{PolicyWholeDevice, PolicyRialto} {
		cfg := DefaultGPUReplay
		cfg.Policy = pol
		st := time.Now()
		res, err := ReplayGPU(nodes, pods, cfg)
		fmt.Printf("%s %v %+v err=%v\n", pol, time.Since(st), res, err)
	}
}
