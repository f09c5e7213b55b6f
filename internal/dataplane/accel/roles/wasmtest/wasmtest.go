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
func EchoModule() []byte { return echoModule(1) }

// MemoryModule is EchoModule with a memory of at least minPages 64 KiB
// pages, to test memory limits.
func MemoryModule(minPages uint32) []byte { return echoModule(minPages) }

func echoModule(minPages uint32) []byte {
	const (
		i32 = 0x7f
		i64 = 0x7e
	)
	types := section(1, vec(
		[]byte{0x60, 1, i32, 1, i32},      // 0: (i32) -> i32
		[]byte{0x60, 2, i32, i32, 1, i64}, // 1: (i32, i32) -> i64
		[]byte{0x60, 0, 0},                // 2: () -> ()
	))
	funcs := section(3, vec([]byte{0}, []byte{1}, []byte{1}, []byte{2}, []byte{1}))
	mem := section(5, vec(append([]byte{0x00}, uleb(uint64(minPages))...))) // min pages, no max
	globals := section(6, vec([]byte{i32, 0x01, 0x41, 0x80, 0x08, 0x0b}))
	exports := section(7, vec(
		append(name("memory"), 0x02, 0),
		append(name("alloc"), 0x00, 0),
		append(name("echo"), 0x00, 1),
		append(name("spin"), 0x00, 2),
		append(name("reset"), 0x00, 3),
		append(name("upper"), 0x00, 4),
	))
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
	code := section(10, vec(
		body(0x23, 0x00, 0x23, 0x00, 0x20, 0x00, 0x6a, 0x24, 0x00, 0x0b), // alloc
		body(append(pack, 0x0b)...),                                      // echo
		body(0x03, 0x40, 0x0c, 0x00, 0x0b, 0x00, 0x0b),                   // spin
		body(0x41, 0x80, 0x08, 0x24, 0x00, 0x0b),                         // reset
		append(uleb(uint64(len(upperBody))), upperBody...),               // upper
	))
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
