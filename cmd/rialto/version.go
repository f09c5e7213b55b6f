package main

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/pflag"
)

// version is set at link time (-ldflags "-X main.version=v1.2.3").
var version = ""

func init() {
	register(&command{Name: "version", Summary: "Print the version of this binary.", Flags: runVersion})
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

func runVersion(e *env, fs *pflag.FlagSet) runFunc {
	out := outputVar(fs)
	return func(ctx context.Context, _ []string) error {
		v := versionString()
		if out.structured() {
			return out.print(e.stdout, map[string]string{"id": "rialto", "state": "ok", "version": v, "go": runtime.Version()})
		}
		fmt.Fprintf(e.stdout, "rialto %s (%s, %s/%s)\n", v, runtime.Version(), runtime.GOOS, runtime.GOARCH)
		return nil
	}
}
