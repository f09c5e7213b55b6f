// Package resource holds small domain helpers shared by the control plane,
// agents and CLI: parsing and printing sizes and rates, and minting
// identifiers and secrets. It does no I/O other than reading crypto/rand.
//
// Everything here is a pure function and safe for concurrent use.
package resource
