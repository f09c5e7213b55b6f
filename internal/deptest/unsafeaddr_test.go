package deptest

import (
	"slices"
	"strings"
	"testing"
)

func TestUintptrAddresses(t *testing.T) {
	const head = "package p\nimport (\n\t\"syscall\"\n\t\"unsafe\"\n)\n"
	for _, c := range []struct {
		name, src string
		want      []string
	}{
		{"in a system call's arguments", head + "func f(b []byte) {\n\tsyscall.RawSyscall(0, 0, uintptr(unsafe.Pointer(&b[0])), 0)\n}", nil},
		{"through a helper", head + "func f(b []byte) {\n\th(uintptr(unsafe.Pointer(&b[0])))\n}\nfunc h(uintptr) {}", []string{"f.go:7: f"}},
		{"kept in a variable", head + "func f(b []byte) {\n\tp := uintptr(unsafe.Pointer(&b[0]))\n\tsyscall.Syscall(0, p, 0, 0)\n}", []string{"f.go:7: f"}},
		{"nested in a system call's argument", head + "func f(b []byte) {\n\tsyscall.Syscall(0, uintptr(unsafe.Pointer(&b[0]))+1, 0, 0)\n}", []string{"f.go:7: f"}},
		{"package level", head + "var x int\nvar a = uintptr(unsafe.Pointer(&x))", []string{"f.go:7: (package level)"}},
		{"x/sys/unix, renamed", "package p\nimport (\n\tsys \"golang.org/x/sys/unix\"\n\t\"unsafe\"\n)\nfunc f(b []byte) {\n\tsys.Syscall6(0, uintptr(unsafe.Pointer(&b[0])), 0, 0, 0, 0, 0)\n}", nil},
		{"a pointer passed as a pointer", head + "func f(b []byte) {\n\th(unsafe.Pointer(&b[0]))\n}\nfunc h(p unsafe.Pointer) { syscall.Syscall(0, uintptr(p), 0, 0) }", nil},
		{"no unsafe import", "package p\nfunc f() {}", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := UintptrAddresses("f.go", []byte(c.src))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("got %q, want %q", got, c.want)
			}
		})
	}
	if _, err := UintptrAddresses("bad.go", []byte("package")); err == nil {
		t.Error("a file that does not parse gave no error")
	}
}

// reviewedAddresses are the places that take a uintptr address outside a
// system call's arguments on purpose, each of memory that never moves and
// stays alive while the address is used: "file: func" → why.
var reviewedAddresses = map[string]string{
	"internal/dataplane/memory/mapping/mapping.go: Map":        "mmap'd region, registered with userfaultfd by address",
	"internal/dataplane/memory/mapping/handler.go: fault":      "the staging buffer is mmap'd (newFaultHandler)",
	"internal/dataplane/memory/mapping/handler.go: faultBatch": "the staging buffer is mmap'd (newFaultHandler)",
	"bench/memory/uffdfloor.go: uffdFloor":                     "mmap'd region",
	"bench/memory/uffdfloor.go: serveFaults":                   "page is on the heap (or mmap'd) and kept alive (runtime.KeepAlive)",
}

// TestRepositoryUintptrAddresses: outside a system call's argument list,
// the module turns pointers into uintptr addresses only where reviewed.
func TestRepositoryUintptrAddresses(t *testing.T) {
	root := moduleRoot(t)
	seen := map[string]bool{}
	eachGoFile(t, root, false, func(rel string, src []byte) error {
		found, err := UintptrAddresses(rel, src)
		if err != nil {
			return err
		}
		for _, f := range found {
			file, _, _ := strings.Cut(f, ":")
			key := file + ": " + f[strings.LastIndex(f, ": ")+2:]
			if _, ok := reviewedAddresses[key]; ok {
				seen[key] = true
				continue
			}
			t.Errorf("%s turns a pointer into a uintptr outside a system call's arguments: pass unsafe.Pointer and convert in the call (the stack may move meanwhile), or add it to reviewedAddresses with the reason its memory never moves", f)
		}
		return nil
	})
	for key := range reviewedAddresses {
		if !seen[key] {
			t.Errorf("reviewedAddresses lists %q, which takes no such address any more: remove it", key)
		}
	}
}
