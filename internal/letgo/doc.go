// Package letgo lets go of a listening TCP port when its listener
// closes, though a child process shares the socket.
//
// A child process that any goroutine forks (an exec.Command) shares every
// descriptor of the process until its exec closes its copies, tens of
// milliseconds on a loaded machine: a socket the process closed meanwhile
// stays open in the child, and a listening one keeps its port. A server
// that binds the port right after (an agent started again in the same
// process at its remembered port, an export served again at its address,
// the owner of a port held for it) is refused with EADDRINUSE and moves
// to another port. A listener of this package shuts its socket down
// (shutdown(2) with SHUT_RD, which on Linux stops a socket listening,
// whoever shares it) once it has closed its descriptor: the port is free
// at once for a new listener (net.Listen sets SO_REUSEADDR).
package letgo
