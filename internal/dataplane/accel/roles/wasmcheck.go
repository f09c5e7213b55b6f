package roles

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The runtime sizes what it decodes by the counts a module declares,
// before it reads the entries: a 16-byte module whose global section
// claims 2²⁸ globals made it allocate 10 GiB, one whose export section
// claims as many 21 GiB, and a tenant's module must not take the process
// down. checkModule reads a module's sections first and refuses one that
// declares more entries, locals or data than its bytes can hold (every
// entry takes at least a byte), so that what the runtime allocates is
// bounded by the module's size; it drops the custom sections (names and
// other debugging data, which a role does not need and the runtime would
// decode the same way).
//
// The check reads each entry whole, in every form the runtime decodes
// (the function-references proposal's reference types (ref null? ht) as
// value types, rec groups of types, v128.const and the extended-const
// operators in constant expressions), and refuses an entry it cannot
// read: an entry it misread, or stopped at while the runtime decodes on,
// left the entries after it unchecked. A (ref null func) parameter read
// as one byte, or a data segment's offset given as a v128.const, let a
// later entry of a module of a hundred bytes claim 2²⁸ parameters, data
// bytes or element expressions, and the runtime allocated 256 MiB to
// 6 GiB (of 2³²−1, tens of gigabytes); a (ref null func) local let a
// function declare 2³²−1 locals past MaxWasmLocals.

// Section ids (WebAssembly core specification, 5.5.2).
const (
	secCustom    = 0
	secType      = 1
	secImport    = 2
	secTable     = 4
	secExport    = 7
	secElement   = 9
	secCode      = 10
	secData      = 11
	secDataCount = 12
)

// vectorSections are the sections whose content is a vector of entries.
var vectorSections = map[byte]bool{1: true, 2: true, 3: true, 4: true, 5: true, 6: true, 7: true, 9: true, secCode: true, 11: true}

// uleb reads an unsigned LEB128 value of at most 32 bits at the start of b
// and returns it and its length (0 if b holds none).
func uleb(b []byte) (uint32, int) {
	v, n := binary.Uvarint(b)
	if n <= 0 || n > 5 || v > 1<<32-1 {
		return 0, 0
	}
	return uint32(v), n
}

// checkModule checks the counts of module m (see above) and returns it
// without its custom sections; what is not a module (no header) is
// returned as it is, for the runtime to refuse.
func checkModule(m []byte) ([]byte, error) {
	const header = 8
	if len(m) < header {
		return m, nil
	}
	out := append(make([]byte, 0, len(m)), m[:header]...)
	tables := false
	for b := m[header:]; len(b) > 0; {
		id := b[0]
		size, n := uleb(b[1:])
		if n == 0 || uint64(size) > uint64(len(b)-1-n) {
			return nil, fmt.Errorf("%w: section %d: size beyond the module's end", ErrBadModule, id)
		}
		whole, body := b[:1+n+int(size)], b[1+n:1+n+int(size)]
		b = b[len(whole):]
		switch {
		case id == secCustom:
			continue
		case id == secDataCount:
			if c, k := uleb(body); k == 0 || uint64(c) > uint64(len(m)) {
				return nil, fmt.Errorf("%w: data count section: more data segments than the module has bytes", ErrBadModule)
			}
		case vectorSections[id]:
			c, k := uleb(body)
			if k == 0 || uint64(c) > uint64(len(body)-k) {
				return nil, fmt.Errorf("%w: section %d declares %d entries in %d bytes", ErrBadModule, id, c, len(body)-k)
			}
			var err error
			switch id {
			case secCode:
				err = checkCode(body[k:], c)
			case secTable:
				if tables {
					return nil, fmt.Errorf("%w: a second table section", ErrBadModule)
				}
				tables = true
				var bounded []byte
				if bounded, err = boundTables(body[k:], c); err != nil {
					return nil, err
				}
				out = append(out, secTable)
				out = binary.AppendUvarint(out, uint64(k+len(bounded)))
				out = append(append(out, body[:k]...), bounded...)
				continue
			case secType, secImport, secExport, secElement, secData:
				err = checkEntries(id, &vecReader{b: body[k:]}, c)
			}
			if err != nil {
				return nil, err
			}
		}
		out = append(out, whole...)
	}
	return out, nil
}

// MaxWasmTableEntries bounds the entries of a Wasm role's tables (of
// function references: a role's indirect calls), in all, at
// instantiation and at run time: every instance allocates its tables
// (8 bytes an entry), and the runtime's own bounds, 2²⁷ entries a table
// declared and 2³²−1 grown (table.grow), are a gigabyte and 32 GiB an
// execution.
const MaxWasmTableEntries = 1 << 20

// boundTables reads the n tables of a table section, b (after its
// count), refuses them if their initial sizes add up to more than
// MaxWasmTableEntries, and returns them with a maximum each, so that the
// runtime grows none past it (table.grow returns -1, as the
// specification lets an engine answer, as it does for memory.grow past
// WasmMemoryPages): what the initial sizes leave of MaxWasmTableEntries
// is split equally between the tables, and a table keeps a maximum it
// declares below its share. A table the check cannot read whole is
// refused: it could not be bounded.
func boundTables(b []byte, n uint32) ([]byte, error) {
	tabs := make([]tableType, 0, n) // n is at most len(b): checked by the caller
	var total uint64
	r := &vecReader{b: b}
	for i := range n {
		t, err := readTable(r)
		if err != nil {
			return nil, fmt.Errorf("%w: table %d: %v", ErrBadModule, i, err)
		}
		if total += t.min; total > MaxWasmTableEntries {
			return nil, fmt.Errorf("%w: tables of at least %d entries in all, above %d", ErrBadModule, total, MaxWasmTableEntries)
		}
		tabs = append(tabs, t)
	}
	share := uint64(0)
	if n > 0 {
		share = (MaxWasmTableEntries - total) / uint64(n)
	}
	out := make([]byte, 0, len(b)+int(n)*8)
	for _, t := range tabs {
		max := t.min + share
		if t.hasMax && t.max < max {
			max = t.max
		}
		out = append(out, t.head...)
		out = append(out, 0x01) // limits: a minimum and a maximum
		out = binary.AppendUvarint(out, t.min)
		out = binary.AppendUvarint(out, max)
		out = append(out, t.init...)
	}
	// Bytes past the last table: the runtime refuses the section.
	return append(out, r.b...), nil
}

// tableType is a table of a table section, as boundTables reads it.
type tableType struct {
	head, init []byte // its bytes through its reference type; its initializer's
	min, max   uint64
	hasMax     bool
}

// readTable reads a table (with the function-references proposal's
// forms: a reference type (ref null? ht), and 0x40 0x00 before a table
// with an initializer).
func readTable(r *vecReader) (tableType, error) {
	var t tableType
	start := r.b
	c, err := r.byte()
	if err != nil {
		return t, errors.New("truncated")
	}
	hasInit := c == 0x40
	if hasInit {
		if c, err = r.byte(); err != nil || c != 0x00 {
			return t, errors.New("a table prefix 0x40 not followed by 0x00")
		}
		if c, err = r.byte(); err != nil {
			return t, errors.New("truncated")
		}
	}
	if c == 0x63 || c == 0x64 { // (ref null? heap type)
		if err := r.heapType(); err != nil {
			return t, errors.New("a reference type without its heap type")
		}
	}
	t.head = start[:len(start)-len(r.b)]
	flag, err := r.byte()
	if err != nil {
		return t, errors.New("truncated")
	}
	if flag > 1 {
		return t, fmt.Errorf("limits of form %#x, not 0 or 1 (a shared table?)", flag)
	}
	min, err := r.u32()
	if err != nil {
		return t, errors.New("truncated limits")
	}
	t.min = uint64(min)
	if flag == 1 {
		max, err := r.u32()
		if err != nil {
			return t, errors.New("truncated limits")
		}
		t.max, t.hasMax = uint64(max), true
	}
	if hasInit {
		e := r.b
		if err := r.expr(); err != nil {
			return t, errors.New("an initializer the check does not read")
		}
		t.init = e[:len(e)-len(r.b)]
	}
	return t, nil
}

// MaxWasmLocals bounds the locals a function of a Wasm role declares:
// the limit of the browsers' engines (V8's and SpiderMonkey's), which
// compilers stay within. The runtime reserves a function's locals as it
// compiles it: a body of a few bytes declaring 2³²−1 of them made it
// allocate 32 GiB.
const MaxWasmLocals = 50000

// checkCode checks the n function bodies of a code section: each its
// declared size within the section, and declaring at most MaxWasmLocals
// locals.
func checkCode(b []byte, n uint32) error {
	for i := uint32(0); i < n; i++ {
		size, k := uleb(b)
		if k == 0 || uint64(size) > uint64(len(b)-k) {
			return fmt.Errorf("%w: code of function %d: size beyond its section", ErrBadModule, i)
		}
		body := b[k : k+int(size)]
		b = b[k+int(size):]
		groups, g := uleb(body)
		if g == 0 || uint64(groups) > uint64(len(body)-g) {
			return fmt.Errorf("%w: code of function %d: more local declarations than bytes", ErrBadModule, i)
		}
		r, total := &vecReader{b: body[g:]}, uint64(0)
		for j := uint32(0); j < groups; j++ {
			c, err := r.u32() // the count, then the type
			if err == nil {
				err = r.valType()
			}
			if err != nil {
				return fmt.Errorf("%w: code of function %d: locals: %v", ErrBadModule, i, err)
			}
			if total += uint64(c); total > MaxWasmLocals {
				return fmt.Errorf("%w: function %d declares more than %d locals", ErrBadModule, i, MaxWasmLocals)
			}
		}
	}
	return nil
}

// errUnread is what the check cannot read: truncated, or a construct it
// does not know (a later proposal's). The module is refused: were the
// check to stop there while the runtime decodes on, the entries after it
// would go unchecked (see above).
var errUnread = errors.New("a construct the check does not read, or truncated")

// vecReader reads a section's entries for checkEntries.
type vecReader struct{ b []byte }

func (r *vecReader) u32() (uint32, error) {
	v, n := uleb(r.b)
	if n == 0 {
		return 0, errUnread
	}
	r.b = r.b[n:]
	return v, nil
}

func (r *vecReader) byte() (byte, error) {
	if len(r.b) == 0 {
		return 0, errUnread
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c, nil
}

// heapType skips a heap type (a signed LEB128 of at most 33 bits).
func (r *vecReader) heapType() error {
	_, n := binary.Uvarint(r.b)
	if n <= 0 || n > 5 {
		return errUnread
	}
	r.b = r.b[n:]
	return nil
}

// valType skips a value type: a number, vector or reference type's
// byte, or a reference type (ref null? ht) and its heap type.
func (r *vecReader) valType() error {
	c, err := r.byte()
	if err != nil {
		return err
	}
	switch c {
	case 0x7f, 0x7e, 0x7d, 0x7c, 0x7b, 0x70, 0x6f, 0x69: // i32 i64 f32 f64 v128 funcref externref exnref
		return nil
	case 0x63, 0x64: // (ref null ht), (ref ht)
		return r.heapType()
	}
	return errUnread
}

// valTypes skips a vector of value types (parameters, results).
func (r *vecReader) valTypes() error {
	n, err := r.vec(1)
	if err != nil {
		return err
	}
	for range n {
		if err := r.valType(); err != nil {
			return err
		}
	}
	return nil
}

// funcType skips a function type, its form (0x60) first.
func (r *vecReader) funcType() error {
	if form, err := r.byte(); err != nil || form != 0x60 {
		return errUnread
	}
	if err := r.valTypes(); err != nil { // parameters
		return err
	}
	return r.valTypes() // results
}

// vec reads a vector's length and checks that its n entries, of at least
// each bytes, fit in what is left.
func (r *vecReader) vec(each int) (uint32, error) {
	n, err := r.u32()
	if err != nil {
		return 0, err
	}
	if uint64(n)*uint64(each) > uint64(len(r.b)) {
		return 0, fmt.Errorf("a vector of %d entries in %d bytes", n, len(r.b))
	}
	return n, nil
}

// skip reads a vector of n single bytes (a name, value types, data).
func (r *vecReader) skip() error {
	n, err := r.vec(1)
	if err != nil {
		return err
	}
	r.b = r.b[n:]
	return nil
}

// expr skips a constant expression, through its end.
func (r *vecReader) expr() error {
	for {
		op, err := r.byte()
		if err != nil {
			return err
		}
		switch op {
		case 0x0b: // end
			return nil
		case 0x6a, 0x6b, 0x6c, 0x7c, 0x7d, 0x7e: // extended-const: i32 and i64 add, sub, mul
		case 0xfd: // v128.const: its opcode, 16 bytes
			if op, err := r.byte(); err != nil || op != 0x0c || len(r.b) < 16 {
				return errUnread
			}
			r.b = r.b[16:]
		case 0x41, 0x42, 0x23, 0xd2: // i32.const, i64.const, global.get, ref.func
			if _, n := binary.Uvarint(r.b); n <= 0 || n > 10 {
				return errUnread
			} else {
				r.b = r.b[n:]
			}
		case 0x43, 0x44: // f32.const, f64.const
			w := 4 << (op - 0x43)
			if len(r.b) < w {
				return errUnread
			}
			r.b = r.b[w:]
		case 0xd0: // ref.null
			if err := r.heapType(); err != nil {
				return err
			}
		default:
			return errUnread
		}
	}
}

// limits skips a memory's limits (0x02 and 0x03: shared, which the
// runtime refuses without the threads feature).
func (r *vecReader) limits() error {
	flag, err := r.byte()
	if err != nil || flag > 3 {
		return errUnread
	}
	for range 1 + int(flag&1) {
		if _, err := r.u32(); err != nil {
			return err
		}
	}
	return nil
}

// checkEntries checks the n entries of a type, import, export, element
// or data section: every vector they declare (parameters and results,
// names, an element segment's functions or expressions, a data segment's
// bytes) fits in what is left of the section.
func checkEntries(id byte, r *vecReader, n uint32) error {
	for i := range n {
		if err := checkEntry(id, r); err != nil {
			return fmt.Errorf("%w: section %d: entry %d: %v", ErrBadModule, id, i, err)
		}
	}
	return nil
}

func checkEntry(id byte, r *vecReader) error {
	switch id {
	case secType:
		if len(r.b) > 0 && r.b[0] == 0x4e { // a rec group: its function types
			r.b = r.b[1:]
			n, err := r.vec(1)
			if err != nil {
				return err
			}
			for range n {
				if err := r.funcType(); err != nil {
					return err
				}
			}
			return nil
		}
		return r.funcType()
	case secImport:
		if err := r.skip(); err != nil { // module
			return err
		}
		if err := r.skip(); err != nil { // name
			return err
		}
		kind, err := r.byte()
		if err != nil {
			return err
		}
		switch kind {
		case 0x00: // function: its type
			_, err = r.u32()
		case 0x01: // table: as the table section's
			_, err = readTable(r)
		case 0x02: // memory
			err = r.limits()
		case 0x03: // global: value type, mutability
			if err = r.valType(); err == nil {
				_, err = r.byte()
			}
		default:
			err = errUnread
		}
		return err
	case secExport:
		if err := r.skip(); err != nil { // name
			return err
		}
		if _, err := r.byte(); err != nil { // kind
			return err
		}
		_, err := r.u32() // index
		return err
	case secElement:
		flags, err := r.u32()
		if err != nil || flags > 7 {
			return errUnread
		}
		if flags&3 == 2 { // a table index
			if _, err := r.u32(); err != nil {
				return err
			}
		}
		if flags&1 == 0 { // active: an offset
			if err := r.expr(); err != nil {
				return err
			}
		}
		switch {
		case flags&3 != 0 && flags&4 != 0: // a reference type
			if err := r.valType(); err != nil {
				return err
			}
		case flags&3 != 0: // an element kind
			if _, err := r.byte(); err != nil {
				return err
			}
		}
		items, err := r.vec(1)
		if err != nil {
			return err
		}
		for range items {
			if flags&4 != 0 {
				err = r.expr()
			} else {
				_, err = r.u32()
			}
			if err != nil {
				return err
			}
		}
		return nil
	case secData:
		flags, err := r.u32()
		if err != nil || flags > 2 {
			return errUnread
		}
		if flags == 2 { // a memory index
			if _, err := r.u32(); err != nil {
				return err
			}
		}
		if flags != 1 { // active: an offset
			if err := r.expr(); err != nil {
				return err
			}
		}
		return r.skip() // the bytes
	}
	return errUnread
}
