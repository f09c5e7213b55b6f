// Package roles holds the kernels an accelerator slot can run: native Go
// kernels (echo, FFT, SHA-256, AES-GCM, float32 matrix multiply, the MCT
// rule-matching engine of package mct) and sandboxed WebAssembly modules
// loaded at run time through wazero.
//
// A Role is created from a Spec by New. The zero value of Spec is invalid
// (it names no role). Every Role returned by New is safe for concurrent use by
// multiple goroutines: native kernels keep no mutable state and Wasm roles
// keep a pool of module instances, one per concurrent call. Close releases a
// role's resources; calls after Close fail.
package roles
