// Package wasmtest hand-assembles tiny WebAssembly modules for tests and
// demos, so no Wasm toolchain is needed. It has no state; its functions are
// safe for concurrent use.
package wasmtest
