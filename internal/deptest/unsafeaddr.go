package deptest

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"strconv"
	"strings"
)

// UintptrAddresses lists the places in a Go source file that turn a
// pointer into an address (uintptr(unsafe.Pointer(x))) anywhere but in the
// argument list of a system call (Syscall, Syscall6, RawSyscall,
// RawSyscall6 of package syscall or golang.org/x/sys/unix), as
// "file:line: func": the rule of unsafe.Pointer's documentation. Only
// there does the compiler keep x where it is until the call returns; a
// uintptr carried further is not updated when the runtime moves the
// goroutine's stack (x may be on it), nor does it keep a heap object
// alive. A file that does not parse is an error.
//
// The data planes once passed a writev's iovec array (on the stack) as a
// uintptr through a helper to RawSyscall: a stack growth in between sent
// the kernel to the old stack, and another connection's request went out
// in this one's place (docs/nbd.md, "Raw system calls").
func UintptrAddresses(filename string, src []byte) ([]string, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, filename, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	unsafeName := ""
	sysNames := map[string]bool{}
	for _, im := range f.Imports {
		p, _ := strconv.Unquote(im.Path.Value)
		name := p[strings.LastIndex(p, "/")+1:]
		if im.Name != nil {
			name = im.Name.Name
		}
		switch p {
		case "unsafe":
			unsafeName = name
		case "syscall", "golang.org/x/sys/unix":
			sysNames[name] = true
		}
	}
	if unsafeName == "" || unsafeName == "_" {
		return nil, nil
	}
	// Conversions that are a system call's arguments.
	allowed := map[ast.Expr]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || !isSyscall(call.Fun, sysNames) {
			return true
		}
		for _, a := range call.Args {
			allowed[a] = true
		}
		return true
	})
	var out []string
	var fn string
	for _, d := range f.Decls {
		fn = "(package level)"
		if fd, ok := d.(*ast.FuncDecl); ok {
			fn = fd.Name.Name
		}
		ast.Inspect(d, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || allowed[call] || !isIdent(call.Fun, "uintptr") || len(call.Args) != 1 {
				return true
			}
			inner, ok := call.Args[0].(*ast.CallExpr)
			if !ok || !isSelector(inner.Fun, unsafeName, "Pointer") {
				return true
			}
			out = append(out, fmt.Sprintf("%s:%d: %s", filename, fset.Position(call.Pos()).Line, fn))
			return true
		})
	}
	return out, nil
}

// isSyscall reports whether e names a system call function of one of the
// packages imported under names.
func isSyscall(e ast.Expr, names map[string]bool) bool {
	sel, ok := e.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	id, ok := sel.X.(*ast.Ident)
	if !ok || !names[id.Name] {
		return false
	}
	switch sel.Sel.Name {
	case "Syscall", "Syscall6", "RawSyscall", "RawSyscall6":
		return true
	}
	return false
}

func isIdent(e ast.Expr, name string) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == name
}

func isSelector(e ast.Expr, pkg, name string) bool {
	sel, ok := e.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != name {
		return false
	}
	id, ok := sel.X.(*ast.Ident)
	return ok && id.Name == pkg
}
