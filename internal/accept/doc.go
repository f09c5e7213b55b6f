// Package accept keeps a server's accept loop going through errors a
// later accept may not repeat: a timeout, or a shortage of descriptors or
// memory (EMFILE, ENFILE, ENOBUFS, ENOMEM). A data plane that returned
// from its accept loop at the first shortage stopped serving for good,
// and its caller ended every tenant's connections with it; with Backoff
// the connection waits in the listener's backlog while the connections
// being served go on, and is accepted once descriptors are free again.
//
// The zero Backoff is ready to use. A Backoff belongs to one accept loop:
// it is not safe for concurrent use.
package accept
