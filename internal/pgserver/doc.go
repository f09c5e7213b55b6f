// Package pgserver runs a throwaway PostgreSQL server in a directory of
// its own: for `rialto up --replicas N` (the shared store of a local
// high-availability cluster) and for tests that need a real PostgreSQL.
// It uses the machine's PostgreSQL (initdb, pg_ctl, postgres from PATH or
// /usr/lib/postgresql/*/bin); when it runs as root it runs them as the
// unprivileged "postgres" user (PostgreSQL refuses to run as root) and
// gives that user the data directory.
//
// The server listens on 127.0.0.1 only, on a free port, with password
// authentication (SCRAM); the password is random and kept in a file
// readable by its owner only, never on a command line.
//
// The zero value of Server is not usable: Start returns one. A Server's
// methods may be called from several goroutines, but Stop, Kill and Start
// of the same server must not overlap.
package pgserver
