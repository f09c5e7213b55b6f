package appliance

import (
	"context"
	"github.com/rialto-project/rialto/internal/dataplane/accel"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles"
	"testing"
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
