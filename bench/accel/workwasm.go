package main

import (
	"encoding/binary"

	"github.com/rialto-project/rialto/internal/dataplane/accel/roles/wasmtest"
)

// workModule is the shared leases' role: wasmtest.WorkModule, whose
// work(ptr, len) runs n rounds of x = 31·x + i for a little-endian u32 n
// (-work-rounds), so that the slots, not the network or the clients, are
// what the tenants share.
func workModule() []byte { return wasmtest.WorkModule() }

// workResult is what work returns for n rounds.
func workResult(n uint32) uint32 {
	x := uint32(0)
	for ; n > 0; n-- {
		x = x*31 + n
	}
	return x
}

// workInput is work's input for n rounds.
func workInput(n uint32) []byte { return binary.LittleEndian.AppendUint32(nil, n) }
