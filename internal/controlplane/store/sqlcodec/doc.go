// Package sqlcodec holds what the SQL stores (store/sqlite and
// store/postgres) share in encoding rows: times as Unix nanoseconds (0 for
// the zero time), values as JSON text, and TextCache, which keeps values
// decoded from stored JSON by their text.
//
// Everything here is pure but TextCache, whose zero value is ready to use
// and which is safe for concurrent use.
package sqlcodec
