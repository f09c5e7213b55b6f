package main

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
)

// version is set at link time (-ldflags "-X main.version=v1.2.3").
var version = ""

func init() {
	register(&command{Name: "version", Summary: "Print the version of this binary.", Run: runVersion})
}

func versionString() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "devel"
}

func runVersion(_ context.Context, e *env, args []string) error {
	fs := newFlags(e, "version", "")
	out := fs.String("o", "table", "output format: table or json")
	if _, err := parse(fs, args, 0, 0); err != nil {
		return err
	}
	v := versionString()
	if *out == "json" {
		return printJSON(e.stdout, map[string]string{"id": "rialto", "state": "ok", "version": v, "go": runtime.Version()})
	}
	fmt.Fprintf(e.stdout, "rialto %s (%s, %s/%s)\n", v, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return nil
}
