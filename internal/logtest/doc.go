// Package logtest gives tests a place to send a log, or a program's
// output, that they read while it is being written: Buffer, a
// bytes.Buffer safe for concurrent writes and reads, and Logger, a
// log/slog text logger writing to one. Only tests import it; it imports
// nothing of the project and not package testing.
//
// The zero Buffer is empty and ready for use. Its methods may be called
// from any number of goroutines at once: each Write is appended whole,
// and String and Lines see every Write that returned before them.
package logtest
