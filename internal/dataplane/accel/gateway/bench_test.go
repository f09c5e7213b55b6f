package gateway

import (
	"context"
	"testing"

	"github.com/rialto-project/rialto/internal/dataplane/accel/roles"
)

// BenchmarkCall measures the gateway's own overhead per request: 64
// callers per CPU, an in-process echo backend.
func BenchmarkCall(b *testing.B) {
	echo, _ := roles.New(context.Background(), roles.Spec{Name: "echo"})
	g, err := New(Config{MaxBatch: 64, Workers: 2}, []Backend{Local(echo), Local(echo)})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Run(ctx) }()
	defer func() { cancel(); <-done }()
	for !g.Running() {
	}
	msg := make([]byte, 64)
	b.SetParallelism(32)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := g.Call(ctx, "echo", msg); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(g.Stats().AvgBatch, "items/exec")
}
