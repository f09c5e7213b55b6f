package appliance

import (
	"context"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/dataplane/accel"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles"
)

func BenchmarkCallParallel(b *testing.B) {
	a, err := New(Config{Slots: 1, SlotMemory: 4096})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() { cancel(); <-done }()
	_ = a.Load(ctx, 0, rolesEcho)
	_ = a.SetCredential(0, []byte("c"))
	addr, _ := a.Addr(0)
	b.SetParallelism(32)
	b.RunParallel(func(pb *testing.PB) {
		c, err := dialT(ctx, addr)
		if err != nil {
			b.Error(err)
			return
		}
		defer c.Close()
		msg := make([]byte, 64)
		for pb.Next() {
			if _, err := c.Call(ctx, "echo", msg); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

var rolesEcho = roles.Spec{Name: "echo"}

func dialT(ctx context.Context, addr string) (*accel.Conn, error) {
	return accel.Dial(ctx, addr, []byte("c"))
}

// BenchmarkCallQD1 is one 64-byte echo call at a time on a slot with no
// deadline and on one with a deadline (a lease's expiry, on the real
// clock), which every call checks: compare the two for its cost.
func BenchmarkCallQD1(b *testing.B) {
	for _, withDeadline := range []bool{false, true} {
		name := "none"
		if withDeadline {
			name = "deadline"
		}
		b.Run(name, func(b *testing.B) {
			a, err := New(Config{Slots: 1, SlotMemory: 4096})
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- a.Run(ctx) }()
			defer func() { cancel(); <-done }()
			_ = a.Load(ctx, 0, rolesEcho)
			_ = a.SetCredential(0, []byte("c"))
			if withDeadline {
				dl := clock.NewDeadline(nil)
				dl.Set(time.Now().Add(time.Hour))
				_ = a.SetDeadline(0, dl)
			}
			addr, _ := a.Addr(0)
			c, err := dialT(ctx, addr)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			msg := make([]byte, 64)
			for b.Loop() {
				if _, err := c.Call(ctx, "echo", msg); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
