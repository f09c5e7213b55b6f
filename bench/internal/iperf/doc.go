// Package iperf runs iperf3 for the bench programs' link ceilings: it starts
// a server (in whatever network namespace the caller's command constructor
// puts it), waits until the server accepts connections, runs a client with
// -J and reads the received rate from its JSON report.
//
// There is no state beyond a *Server, whose zero value is not usable (get
// one from StartServer). A Server's Stop may be called from one goroutine;
// the functions of the package are safe for concurrent use.
package iperf
