package accel

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// An INLINE START carries its input, up to MaxPayload, and the server
// holds it until the task returns: a client that sends inline STARTs to
// a task that never returns must not make the server hold MaxOutstanding
// inputs of MaxPayload each on one connection. Past the connection's
// budget (Server.MaxInlineInput) a START is refused with InputBudget
// (code 18) and a message; the reader goes on (the PING behind them is
// answered), and once the tasks return the budget is given back.
func TestInlineInputsWithinBudget(t *testing.T) {
	const mem = 1 << 20
	const budget = 3 * mem
	const starts = 16
	tgt := &memTarget{mem: make([]byte, 64), release: make(chan struct{})}
	srv := &Server{Target: tgt, MaxPayload: mem, MaxInlineInput: budget}
	nc, br := serveHello(t, srv, mem)
	// Inputs as large as a frame carries, each to a task that waits.
	in := bytes.Repeat([]byte{0x5a}, mem-64)
	start := func(tag uint32) []byte {
		return AppendFrame(nil, Frame{Op: OpStart, Flags: FlagInline | FlagNotify, Tag: tag,
			Payload: AppendStart(nil, Start{Entry: "block", Payload: in})})
	}
	var b []byte
	for i := range starts {
		b = append(b, start(uint32(100+i))...)
	}
	b = AppendFrame(b, Frame{Op: OpPing, Tag: 2})
	if _, err := nc.Write(b); err != nil {
		t.Fatal(err)
	}
	// Frames are handled in order: the PING's answer comes after every
	// START's refusal, if any.
	refused := 0
	for {
		f, err := ReadFrame(br, mem)
		if err != nil {
			t.Fatal(err)
		}
		if f.Tag == 2 {
			break
		}
		if f.Op != OpError {
			t.Fatalf("START %d: op %#x before the tasks returned", f.Tag, f.Op)
		}
		err = remoteErr(f.Payload)
		if !errors.Is(err, ErrInputBudget) || !strings.Contains(err.Error(), "inline input") {
			t.Fatalf("START %d refused with %v, want InputBudget", f.Tag, err)
		}
		refused++
	}
	held := (starts - refused) * len(in)
	if held > budget || starts-refused != budget/mem {
		t.Fatalf("%d of %d inline STARTs of %d bytes taken (%d bytes held), want %d within the %d-byte budget",
			starts-refused, starts, len(in), held, budget/mem, budget)
	}
	// The tasks return: their completions arrive, the budget is back,
	// and as many inputs are taken again.
	close(tgt.release)
	for range starts - refused {
		if f, err := ReadFrame(br, mem); err != nil || f.Op != OpDone || !bytes.Equal(f.Payload[4:], in) {
			t.Fatalf("completion: op %#x %v", f.Op, err)
		}
	}
	b = nil
	for i := range budget / mem {
		b = append(b, start(uint32(200+i))...)
	}
	if _, err := nc.Write(b); err != nil {
		t.Fatal(err)
	}
	for range budget / mem {
		if f, err := ReadFrame(br, mem); err != nil || f.Op != OpDone {
			t.Fatalf("after the budget came back: op %#x %v (%v)", f.Op, err, remoteErr(f.Payload))
		}
	}
}
