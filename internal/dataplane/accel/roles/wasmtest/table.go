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

// TablesModule is a module (not a role: it follows no ABI) that uses
// tables every way a module can, for the tests of what a role's check
// makes of a module's tables (its rewrite of their limits must change
// nothing else): three tables (funcref of 4 entries, its minimum in a
// padded LEB128, at most 16; externref of 2; funcref of none, growable),
// element segments of all six forms (active with and without a table
// index, passive and declarative, of function indices and of
// expressions), a data count section, passive and active data, a start
// function, and custom sections (a name section among them) before,
// between and after the others. Its exports, each of no parameter or one
// i32, return an i32:
//
//	call0(i)  calls entry i of table 0 (entries 0 and 1 return 11 and 22)
//	sizes()   table sizes 0 + 100·1 + 10000·2
//	grow2(n)  grows table 2 by n entries (table.grow: the old size, or -1)
//	init()    copies the passive segment into table 0 and calls it (33),
//	          then drops the segment (a second call traps)
//	copy()    copies table 0's entry 0 to entry 3 and calls it (11)
//	fill()    fills table 1 with null references: 1 if entry 0 is null
//	mem()     copies the passive data ("world") to 32 and drops it: 'w'
//	peek(i)   memory byte i ("hello" at 0; the start function writes 42
//	          at 64)
//
// and "memory" and table 0 ("t0").
func TablesModule() []byte {
	const i32 = 0x7f
	custom := func(n string, payload ...byte) []byte { return section(0, append(name(n), payload...)) }
	types := section(1, vec(
		[]byte{0x60, 0, 1, i32},      // 0: () -> i32
		[]byte{0x60, 1, i32, 1, i32}, // 1: (i32) -> i32
		[]byte{0x60, 0, 0},           // 2: () -> ()
	))
	funcs := section(3, vec([]byte{0}, []byte{0}, []byte{0}, []byte{1}, []byte{0}, []byte{1},
		[]byte{0}, []byte{0}, []byte{0}, []byte{0}, []byte{2}, []byte{1}))
	tables := section(4, vec(
		[]byte{funcref, 0x01, 0x84, 0x80, 0x00, 16}, // min 4 in three bytes, max 16
		[]byte{0x6f, 0x00, 2},                       // externref, min 2
		[]byte{funcref, 0x00, 0},                    // min 0
	))
	mem := section(5, vec([]byte{0x00, 0x01}))
	exports := section(7, vec(
		append(name("memory"), 0x02, 0),
		append(name("t0"), 0x01, 0),
		append(name("call0"), 0x00, 3),
		append(name("sizes"), 0x00, 4),
		append(name("grow2"), 0x00, 5),
		append(name("init"), 0x00, 6),
		append(name("copy"), 0x00, 7),
		append(name("fill"), 0x00, 8),
		append(name("mem"), 0x00, 9),
		append(name("peek"), 0x00, 11),
	))
	start := section(8, []byte{10})
	elems := section(9, vec(
		[]byte{0x00, 0x41, 0x00, 0x0b, 2, 0, 1},                      // active, table 0 at 0: a, b
		[]byte{0x06, 1, 0x41, 0x00, 0x0b, 0x6f, 1, 0xd0, 0x6f, 0x0b}, // active, table 1 at 0: (ref.null extern)
		[]byte{0x01, 0x00, 1, 2},                                     // passive: c
		[]byte{0x03, 0x00, 1, 0},                                     // declarative: a
		[]byte{0x02, 2, 0x41, 0x00, 0x0b, 0x00, 0},                   // active, table 2 at 0: none
		[]byte{0x05, funcref, 1, 0xd2, 1, 0x0b},                      // passive: (ref.func b)
	))
	dataCount := section(12, []byte{2})
	callIndirect := []byte{0x11, 0x00, 0x00} // call_indirect (type 0) (table 0)
	code := section(10, vec(
		body(0x41, 11, 0x0b), // a
		body(0x41, 22, 0x0b), // b
		body(0x41, 33, 0x0b), // c
		body(append(append([]byte{0x20, 0x00}, callIndirect...), 0x0b)...), // call0
		body(append([]byte{0xfc, 0x10, 0, 0xfc, 0x10, 1, 0x41}, append(sleb(100),
			append([]byte{0x6c, 0x6a, 0xfc, 0x10, 2, 0x41}, append(sleb(10000), 0x6c, 0x6a, 0x0b)...)...)...)...), // sizes
		body(0xd0, funcref, 0x20, 0x00, 0xfc, 0x0f, 2, 0x0b),                                                                        // grow2
		body(append([]byte{0x41, 2, 0x41, 0, 0x41, 1, 0xfc, 0x0c, 2, 0, 0xfc, 0x0d, 2, 0x41, 2}, append(callIndirect, 0x0b)...)...), // init
		body(append([]byte{0x41, 3, 0x41, 0, 0x41, 1, 0xfc, 0x0e, 0, 0, 0x41, 3}, append(callIndirect, 0x0b)...)...),                // copy
		body(0x41, 0, 0xd0, 0x6f, 0x41, 2, 0xfc, 0x11, 1, 0x41, 0, 0x25, 1, 0xd1, 0x0b),                                             // fill
		body(0x41, 32, 0x41, 0, 0x41, 5, 0xfc, 0x08, 1, 0, 0xfc, 0x09, 1, 0x41, 32, 0x2d, 0, 0, 0x0b),                               // mem
		body(0x41, 0xc0, 0x00, 0x41, 42, 0x3a, 0, 0, 0x0b),                                                                          // start: store8(64, 42)
		body(0x20, 0x00, 0x2d, 0, 0, 0x0b),                                                                                          // peek
	))
	data := section(11, vec(
		append([]byte{0x00, 0x41, 0x00, 0x0b}, name("hello")...), // active at 0
		append([]byte{0x01}, name("world")...),                   // passive
	))
	var fnames [][]byte
	for i, n := range []string{"a", "b", "c", "call0", "sizes", "grow2", "init", "copy", "fill", "mem", "start", "peek"} {
		fnames = append(fnames, append([]byte{byte(i)}, name(n)...))
	}
	names := vec(fnames...)
	nameSec := custom("name", append(append([]byte{1}, uleb(uint64(len(names)))...), names...)...)
	m := append([]byte{}, header...)
	for _, s := range [][]byte{custom("producers", 0), types, custom("between"), funcs, tables, mem, exports, start,
		elems, dataCount, code, data, nameSec} {
		m = append(m, s...)
	}
	return m
}

// ImportedTableModule imports a table (env.t, funcref of at least one
// entry) and exports size(), its size: a module no role can instantiate
// (a role's runtime has no module env), whose check must not make it one.
func ImportedTableModule() []byte {
	types := section(1, vec([]byte{0x60, 0, 1, 0x7f}))
	imports := section(2, vec(append(append(name("env"), name("t")...), 0x01, funcref, 0x00, 1)))
	funcs := section(3, vec([]byte{0}))
	exports := section(7, vec(append(name("size"), 0x00, 0)))
	code := section(10, vec(body(0xfc, 0x10, 0, 0x0b)))
	m := append([]byte{}, header...)
	for _, s := range [][]byte{types, imports, funcs, exports, code} {
		m = append(m, s...)
	}
	return m
}
