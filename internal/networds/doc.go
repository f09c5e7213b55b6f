// Package networds says why a connection to a peer failed in words a user
// reads: that the peer could not be reached and the system's word for why
// ("connection refused", "no route to host", "timed out"), that its
// certificate was not accepted here and why ("signed by an unknown
// authority", "expired", "revoked", "its CA was dropped", "name mismatch"), that it did not
// accept ours, or that it does not speak TLS. The words name no address,
// path or package: the whole error is for the log of whoever saw it.
//
// The control plane says so of the lenders it calls, and a lender's agent
// of the destination it moves a part to. Describe is pure and safe for
// concurrent use.
package networds
