package wasmtest

import "encoding/binary"

// TableGrowStep is how many entries TableModule's grow adds to its table
// at a time.
const TableGrowStep = 1 << 16

// TableModule is a WebAssembly role (the role ABI: memory, alloc, reset)
// whose funcref tables, one per entry of mins, have those initial sizes
// and declare no maximum, with the entries
//
//	echo(ptr, len)   returns its input in place
//	grow(ptr, len)   reads a little-endian u32 n from its input and grows
//	                 table 0 by TableGrowStep entries (table.grow) until it
//	                 has at least n; traps (unreachable) when table.grow
//	                 fails (returns −1); returns the table's size as 4
//	                 bytes
//
// a module that takes at run time what its tables allocate, to test the
// bound on them (grow with n = 2³²−1 grows until the runtime refuses).
func TableModule(mins ...uint32) []byte {
	var tabs [][]byte
	for _, m := range mins {
		tabs = append(tabs, append([]byte{funcref, 0x00}, uleb(uint64(m))...)) // no maximum
	}
	return TableModuleOf(tabs...)
}

const funcref = 0x70

// TableModuleOf is TableModule with the tables given as they are encoded
// in a table section (a table type, or the function-references
// proposal's forms): table 0 must be a funcref table.
func TableModuleOf(tables ...[]byte) []byte {
	const (
		i32 = 0x7f
		i64 = 0x7e
	)
	types := section(1, vec(
		[]byte{0x60, 1, i32, 1, i32},      // 0: (i32) -> i32
		[]byte{0x60, 2, i32, i32, 1, i64}, // 1: (i32, i32) -> i64
		[]byte{0x60, 0, 0},                // 2: () -> ()
	))
	funcs := section(3, vec([]byte{0}, []byte{1}, []byte{1}, []byte{2}))
	tabs := section(4, vec(tables...))
	mem := section(5, vec([]byte{0x00, 0x01})) // one page, no max
	globals := section(6, vec([]byte{i32, 0x01, 0x41, 0x80, 0x08, 0x0b}))
	exports := section(7, vec(
		append(name("memory"), 0x02, 0),
		append(name("alloc"), 0x00, 0),
		append(name("echo"), 0x00, 1),
		append(name("grow"), 0x00, 2),
		append(name("reset"), 0x00, 3),
	))
	pack := []byte{0x20, 0x00, 0xad, 0x42, 0x20, 0x86, 0x20, 0x01, 0xad, 0x84} // ptr<<32 | len
	grow := []byte{
		0x20, 0x00, 0x28, 0x02, 0x00, 0x21, 0x02, // n = i32.load(ptr)
		0x02, 0x40, 0x03, 0x40, // block, loop
		0xfc, 0x10, 0x00, 0x20, 0x02, 0x4f, 0x0d, 0x01, // if table.size(0) >= n (u) break
		0xd0, funcref, 0x41, // table.grow(0, ref.null func, TableGrowStep)
	}
	grow = append(grow, sleb(TableGrowStep)...)
	grow = append(grow,
		0xfc, 0x0f, 0x00,
		0x41, 0x7f, 0x46, 0x04, 0x40, 0x00, 0x0b, // if it returned -1: unreachable
		0x0c, 0x00, 0x0b, 0x0b, // continue; end loop, block
		0x20, 0x00, 0xfc, 0x10, 0x00, 0x36, 0x02, 0x00, // i32.store(ptr, table.size(0))
		0x20, 0x00, 0xad, 0x42, 0x20, 0x86, 0x42, 0x04, 0x84, // ptr<<32 | 4
		0x0b,
	)
	growBody := append([]byte{0x01, 0x01, i32}, grow...) // one i32 local: n
	code := section(10, vec(
		body(0x23, 0x00, 0x23, 0x00, 0x20, 0x00, 0x6a, 0x24, 0x00, 0x0b), // alloc: bump from 1024
		body(append(pack, 0x0b)...),                                      // echo
		append(uleb(uint64(len(growBody))), growBody...),                 // grow
		body(0x41, 0x80, 0x08, 0x24, 0x00, 0x0b),                         // reset
	))
	m := append([]byte{}, header...)
	for _, s := range [][]byte{types, funcs, tabs, mem, globals, exports, code} {
		m = append(m, s...)
	}
	return m
}

// TableGrowInput is grow's input for TableModule: n as a little-endian
// u32.
func TableGrowInput(n uint32) []byte { return binary.LittleEndian.AppendUint32(nil, n) }
