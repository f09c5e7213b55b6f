package main

import (
	"context"
	"encoding/binary"
	"encoding/xml"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/accel/roles/mct"
)

// TestZMQPipeline keeps the baseline honest: every reply is the
// brute-force answer to its own query.
func TestZMQPipeline(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	engine, err := mct.Compile(mct.Generate(rng, 300))
	if err != nil {
		t.Fatal(err)
	}
	enc, _ := engine.EncodeAll(mct.GenerateQueries(rng, 64))
	e := &env{engine: engine}
	for _, batch := range []bool{false, true} {
		checkZMQ(t, newZMQ(ctx, e, 2, 4, batch), engine, enc)
	}
}

func checkZMQ(t *testing.T, z *zmqPipeline, engine *mct.Engine, enc []byte) {
	defer z.close()
	var wg sync.WaitGroup
	for c := 0; c < 4; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := c; i < 64; i += 4 {
				q := enc[i*64 : (i+1)*64]
				out, err := z.call(c, q)
				want, _, _ := engine.BruteForce(q)
				if err != nil || len(out) != 4 || binary.LittleEndian.Uint32(out) != want {
					t.Errorf("query %d: %x %v, want %d", i, out, err, want)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func TestMeasureAndSVG(t *testing.T) {
	s := measure(20*time.Millisecond, 2, func(int) error { return nil })
	if s.qps <= 0 || s.p99 < s.p50 {
		t.Fatalf("sample %+v", s)
	}
	svg := paretoSVG([]svgPoint{{"a", 1000, 50, true}, {"b", 3000, 400, true}, {"c", 2000, 900, false}})
	if err := xml.Unmarshal([]byte(svg), new(struct{})); err != nil {
		t.Fatalf("svg does not parse: %v", err)
	}
	if !strings.Contains(svg, "<polyline") || strings.Count(svg, "<circle") != 3 {
		t.Fatalf("svg content:\n%s", svg)
	}
}
