// Package pgtest gives tests a real PostgreSQL: one throwaway server per
// test binary (started on first use in a temporary directory, stopped and
// removed by Main), and a fresh database per test. Tests skip when
// PostgreSQL is not installed.
//
// Use it from TestMain: func TestMain(m *testing.M) { pgtest.Main(m) }.
// Its functions are safe for concurrent use.
package pgtest
