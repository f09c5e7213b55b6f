package appliance

import (
	"bufio"
	"context"
	"encoding/binary"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/accel"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles/wasmtest"
)

// A borrower's START frames are a few dozen bytes each, but a mailbox
// task makes the server copy its input out of slot memory: a lease must
// not make its lender hold a slot's worth of memory per queued task (64
// tasks on a 1 MiB slot were 64 MiB; 1024 per connection, and any number
// of connections, were enough to exhaust the node that serves every other
// lease too). Tasks waiting for a worker read their input only once the
// slot's budget has room.
func TestMailboxInputsWithinBudget(t *testing.T) {
	const mem = 1 << 20
	const tasks = 64
	a := start(t, Config{Slots: 1, SlotMemory: mem, Workers: 1})
	ctx := context.Background()
	if err := a.Load(ctx, 0, roles.Spec{Name: "wasm", Module: wasmtest.MemoryModule(32)}); err != nil {
		t.Fatal(err)
	}
	cred := []byte("cred-budget")
	if err := a.SetCredential(0, cred); err != nil {
		t.Fatal(err)
	}
	addr, _ := a.Addr(0)
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(time.Minute))
	br := bufio.NewReader(nc)
	hello := binary.LittleEndian.AppendUint16(nil, accel.Version)
	hello = binary.LittleEndian.AppendUint16(hello, uint16(len(cred)))
	hello = append(hello, cred...)
	if _, err := nc.Write(accel.AppendFrame(nil, accel.Frame{Op: accel.OpHello, Tag: 1, Payload: hello})); err != nil {
		t.Fatal(err)
	}
	if f, err := accel.ReadFrame(br, 1<<20); err != nil || f.Op != accel.OpReady {
		t.Fatalf("hello: %+v %v", f, err)
	}
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	// Every task spins on the whole slot: the one that gets the worker
	// never returns, the others wait for it.
	var b []byte
	for i := range tasks {
		st := accel.Start{In: 0, InLen: mem, Out: 0, OutCap: mem, Entry: "spin"}
		b = accel.AppendFrame(b, accel.Frame{Op: accel.OpStart, Flags: accel.FlagNotify, Tag: uint32(10 + i), Payload: accel.AppendStart(nil, st)})
	}
	b = accel.AppendFrame(b, accel.Frame{Op: accel.OpPing, Tag: 2})
	if _, err := nc.Write(b); err != nil {
		t.Fatal(err)
	}
	// Frames are handled in order: the PING's answer means every START
	// has been taken.
	for {
		f, err := accel.ReadFrame(br, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		if f.Tag == 2 {
			break
		}
		t.Fatalf("unexpected answer before the PING's: %+v", f)
	}
	// Ending the lease interrupts the tasks and waits for every one of
	// them to return.
	if err := a.SetCredential(0, nil); err != nil {
		t.Fatal(err)
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > 16<<20 {
		t.Fatalf("%d queued mailbox tasks on a %d-byte slot made the server allocate %d MiB", tasks, mem, got>>20)
	}
}

// A slot whose credential is replaced (PUT /v1/slots/{id}/credential on a
// leased slot: one lease handed straight to the next) starts the next
// lease with zeroed memory, as docs/accel-protocol.md says, not with the
// last borrower's bytes.
func TestReplacedCredentialWipes(t *testing.T) {
	a := start(t, Config{Slots: 1, SlotMemory: 4096})
	ctx := context.Background()
	c := leaseSlot(t, a, 0, "echo") // credential "cred-0"
	secret := []byte("tenant A's bytes")
	if err := c.WriteMem(ctx, 0, secret); err != nil {
		t.Fatal(err)
	}
	if err := a.SetCredential(0, []byte("cred-next")); err != nil {
		t.Fatal(err)
	}
	addr, _ := a.Addr(0)
	next, err := accel.Dial(ctx, addr, []byte("cred-next"))
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	got, err := next.ReadMem(ctx, 0, uint32(len(secret)))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(make([]byte, len(secret))) {
		t.Fatalf("the next lease reads %q from the slot", got)
	}
}
