package wasmtest

// section frames a section body with its id and LEB128 size.
func section(id byte, body []byte) []byte {
	return append(append([]byte{id}, uleb(uint64(len(body)))...), body...)
}

func uleb(v uint64) []byte {
	var out []byte
	for {
		b := byte(v & 0x7f)
		v >>= 7
		if v != 0 {
			out = append(out, b|0x80)
			continue
		}
		return append(out, b)
	}
}

// sleb is v as signed LEB128 (the immediate of i64.const).
func sleb(v int64) []byte {
	var out []byte
	for {
		b := byte(v & 0x7f)
		v >>= 7
		if (v == 0 && b&0x40 == 0) || (v == -1 && b&0x40 != 0) {
			return append(out, b)
		}
		out = append(out, b|0x80)
	}
}

func name(s string) []byte { return append(uleb(uint64(len(s))), s...) }

func vec(items ...[]byte) []byte {
	out := uleb(uint64(len(items)))
	for _, it := range items {
		out = append(out, it...)
	}
	return out
}

func body(code ...byte) []byte {
	b := append([]byte{0x00}, code...) // no locals
	return append(uleb(uint64(len(b))), b...)
}

var header = []byte{0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00}

// EchoModule follows the role ABI: one page of memory, a bump allocator
// (alloc) starting at 1024, reset(), and the entries
//
//	echo(ptr, len) -> ptr<<32|len   returns its input in place
//	upper(ptr, len)                 ASCII-uppercases its input in place
//	spin(ptr, len)                  loops forever (for interruption tests)
func EchoModule() []byte { return echoModule(1, false) }

// MemoryModule is EchoModule with a memory of at least minPages 64 KiB
// pages, to test memory limits.
func MemoryModule(minPages uint32) []byte { return echoModule(minPages, false) }

// DumpAt and DumpLen are the memory window DumpModule's dump entry
// returns: where alloc puts every call's first input.
const (
	DumpAt  = 1024
	DumpLen = 64
)

// DumpModule is EchoModule with one more entry,
//
//	dump(ptr, len)   returns memory [DumpAt, DumpAt+DumpLen), whatever
//	                 it holds: bytes this call did not write
//
// a module that shows what an earlier call left in its memory (called
// with an empty input, it writes nothing there), to test that no call
// sees another lease's inputs.
func DumpModule() []byte { return echoModule(1, true) }

func echoModule(minPages uint32, dump bool) []byte {
	const (
		i32 = 0x7f
		i64 = 0x7e
	)
	types := section(1, vec(
		[]byte{0x60, 1, i32, 1, i32},      // 0: (i32) -> i32
		[]byte{0x60, 2, i32, i32, 1, i64}, // 1: (i32, i32) -> i64
		[]byte{0x60, 0, 0},                // 2: () -> ()
	))
	fidx := [][]byte{{0}, {1}, {1}, {2}, {1}}
	if dump {
		fidx = append(fidx, []byte{1})
	}
	funcs := section(3, vec(fidx...))
	mem := section(5, vec(append([]byte{0x00}, uleb(uint64(minPages))...))) // min pages, no max
	globals := section(6, vec([]byte{i32, 0x01, 0x41, 0x80, 0x08, 0x0b}))
	exps := [][]byte{
		append(name("memory"), 0x02, 0),
		append(name("alloc"), 0x00, 0),
		append(name("echo"), 0x00, 1),
		append(name("spin"), 0x00, 2),
		append(name("reset"), 0x00, 3),
		append(name("upper"), 0x00, 4),
	}
	if dump {
		exps = append(exps, append(name("dump"), 0x00, 5))
	}
	exports := section(7, vec(exps...))
	pack := []byte{0x20, 0x00, 0xad, 0x42, 0x20, 0x86, 0x20, 0x01, 0xad, 0x84} // ptr<<32 | len
	upper := []byte{
		// i = ptr; end = ptr + len (locals 2, 3 are i32)
		0x20, 0x00, 0x21, 0x02,
		0x20, 0x00, 0x20, 0x01, 0x6a, 0x21, 0x03,
		0x02, 0x40, // block
		0x03, 0x40, // loop
		0x20, 0x02, 0x20, 0x03, 0x4f, 0x0d, 0x01, // if i >= end (u) break
		// c = load8_u(i); if c-'a' < 26 (u) store8(i, c-32)
		0x20, 0x02, 0x2d, 0x00, 0x00, 0x21, 0x04,
		0x20, 0x04, 0x41, 0xe1, 0x00, 0x6b, 0x41, 0x1a, 0x49,
		0x04, 0x40, 0x20, 0x02, 0x20, 0x04, 0x41, 0x20, 0x6b, 0x3a, 0x00, 0x00, 0x0b,
		0x20, 0x02, 0x41, 0x01, 0x6a, 0x21, 0x02, // i++
		0x0c, 0x00, // continue
		0x0b, 0x0b, // end loop, end block
	}
	upper = append(upper, pack...)
	upper = append(upper, 0x0b)
	upperBody := append([]byte{0x01, 0x03, i32}, upper...) // 3 i32 locals
	bodies := [][]byte{
		body(0x23, 0x00, 0x23, 0x00, 0x20, 0x00, 0x6a, 0x24, 0x00, 0x0b), // alloc
		body(append(pack, 0x0b)...),                                      // echo
		body(0x03, 0x40, 0x0c, 0x00, 0x0b, 0x00, 0x0b),                   // spin
		body(0x41, 0x80, 0x08, 0x24, 0x00, 0x0b),                         // reset
		append(uleb(uint64(len(upperBody))), upperBody...),               // upper
	}
	if dump {
		// i64.const DumpAt<<32 | DumpLen
		bodies = append(bodies, body(append(append([]byte{0x42}, sleb(DumpAt<<32|DumpLen)...), 0x0b)...))
	}
	code := section(10, vec(bodies...))
	var m []byte
	for _, s := range [][]byte{header, types, funcs, mem, globals, exports, code} {
		m = append(m, s...)
	}
	return m
}

// ImportingModule imports env.f and is otherwise empty: roles must reject it.
func ImportingModule() []byte {
	types := section(1, vec([]byte{0x60, 0, 0}))
	imports := section(2, vec(append(append(name("env"), name("f")...), 0x00, 0)))
	return append(append(append([]byte{}, header...), types...), imports...)
}
