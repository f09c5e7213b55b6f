//go:build tools

// Package tools pins module dependencies that are not yet imported by
// non-test code, so that `go mod tidy` keeps them.
package tools

import (
	_ "github.com/go-zeromq/zmq4"
	_ "github.com/tetratelabs/wazero"
	_ "golang.org/x/sys/unix"
	_ "modernc.org/sqlite"
)
