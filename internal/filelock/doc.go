// Package filelock takes exclusive flock(2) locks on files, so that one
// process at a time owns something on this machine: a state directory, a
// device file, a VM, a SQLite database. The kernel releases a lock when
// its holder exits, however it exits, so a lock is never stale; Holder
// names the process holding one (from /proc/locks) for error messages.
//
// There is no type to hold: a lock is the *os.File it was taken on, and
// Close releases it. Closing the file alone does not, for a moment: the
// lock is the open file description's, which a child process that any
// goroutine forks (an exec.Command) shares until its exec closes its
// copy of the descriptor, tens of milliseconds on a loaded machine; Close
// unlocks it first. The functions are safe for concurrent use; two
// descriptions of one file in one process exclude each other as two
// processes do.
package filelock
