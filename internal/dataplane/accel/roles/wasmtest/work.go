package wasmtest

// WorkModule is a WebAssembly role (the role ABI of docs/accelerators.md:
// memory, alloc, reset) with one entry, work(ptr, len): it reads a
// little-endian u32 n from its input, runs n rounds of x = 31·x + i, and
// returns x as 4 bytes: a CPU-bound kernel whose cost per item the caller
// sets with a 4-byte input (bench/accel's shared tenants run it, so that
// the slots, not the network or the clients, are what they share).
func WorkModule() []byte {
	const (
		i32 = 0x7f
		i64 = 0x7e
	)
	body := func(locals []byte, code ...byte) []byte {
		b := append(append([]byte{}, locals...), code...)
		return append(uleb(uint64(len(b))), b...)
	}
	types := section(1, vec(
		[]byte{0x60, 1, i32, 1, i32},      // 0: (i32) -> i32
		[]byte{0x60, 2, i32, i32, 1, i64}, // 1: (i32, i32) -> i64
		[]byte{0x60, 0, 0},                // 2: () -> ()
	))
	funcs := section(3, vec([]byte{0}, []byte{1}, []byte{2}))
	mem := section(5, vec([]byte{0x00, 0x01})) // one page, no max
	globals := section(6, vec([]byte{i32, 0x01, 0x41, 0x80, 0x08, 0x0b}))
	exports := section(7, vec(
		append(name("memory"), 0x02, 0),
		append(name("alloc"), 0x00, 0),
		append(name("work"), 0x00, 1),
		append(name("reset"), 0x00, 2),
	))
	work := []byte{
		0x20, 0x00, 0x28, 0x02, 0x00, 0x21, 0x02, // n = i32.load(ptr)
		0x41, 0x00, 0x21, 0x03, // x = 0
		0x02, 0x40, 0x03, 0x40, // block, loop
		0x20, 0x02, 0x45, 0x0d, 0x01, // if n == 0 break
		0x20, 0x03, 0x41, 0x1f, 0x6c, 0x20, 0x02, 0x6a, 0x21, 0x03, // x = x*31 + n
		0x20, 0x02, 0x41, 0x01, 0x6b, 0x21, 0x02, // n--
		0x0c, 0x00, 0x0b, 0x0b, // continue; end loop, block
		0x20, 0x00, 0x20, 0x03, 0x36, 0x02, 0x00, // i32.store(ptr, x)
		0x20, 0x00, 0xad, 0x42, 0x20, 0x86, 0x42, 0x04, 0x84, // ptr<<32 | 4
		0x0b,
	}
	code := section(10, vec(
		body([]byte{0x00}, 0x23, 0x00, 0x23, 0x00, 0x20, 0x00, 0x6a, 0x24, 0x00, 0x0b), // alloc: bump from 1024
		body([]byte{0x01, 0x02, i32}, work...),                                         // work: 2 i32 locals
		body([]byte{0x00}, 0x41, 0x80, 0x08, 0x24, 0x00, 0x0b),                         // reset
	))
	m := append([]byte{}, header...)
	for _, s := range [][]byte{types, funcs, mem, globals, exports, code} {
		m = append(m, s...)
	}
	return m
}
