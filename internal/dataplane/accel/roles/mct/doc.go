// Package mct is a business-rule matching engine in the manner of ERBIUM
// (Maschi and Alonso, "The Difficult Balance Between Modern Hardware and
// Conventional CPUs"): Minimum Connecting Time rules whose criteria are
// exact values, wildcards or numeric ranges are compiled into a
// non-deterministic finite automaton with one level per criterion, whose
// common suffixes are merged; queries are dictionary-encoded into fixed
// 64-byte records (16 little-endian uint32 fields) and each query yields the
// result of the highest-weight rule that matches it (ties go to the larger
// result, the conservative connecting time).
//
// The zero value of Engine is not usable; build one with Compile. An Engine is
// immutable once compiled and safe for concurrent use by multiple goroutines.
// BruteForce is the reference the tests check the automaton against.
package mct
