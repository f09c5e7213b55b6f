// Package ui is the control plane's web dashboard, served at /ui/: the
// cluster at a glance (nodes; devices with allocated against actually
// used), leases (filtered by tenant, kind and state; each lease's parts,
// its placement explanation and predicted completion), the fabric topology
// as a graph with link load, bandwidth per device over time, the live
// event stream, and forms to create, explain and release leases.
//
// Pages are rendered on the server (html/template) from templates and
// static files embedded in the binary, so the dashboard needs no internet;
// a little JavaScript adds the live event stream. The UI is a client of
// the /v1 API in this process: every page calls the API handler with the
// signed-in session's token, so a tenant sees exactly what the API shows
// it, and no more. Lease credentials are never rendered, and URIs only
// without their export names (which are secrets).
//
// Sign-in: a one-time login code (NewLoginCode, minted for a tenant token
// by POST /v1/login-links; `rialto up` prints the link) or the login form,
// which takes a token. Either gives an HttpOnly, SameSite=Strict session
// cookie; the token stays in this process's memory, never in a page or a
// URL. Forms carry a per-session CSRF token and cross-site posts are
// refused. Sessions live in memory: a restarted control plane signs
// everyone out.
//
// A UI is made by New and is safe for concurrent use; it starts no
// goroutines. The zero UI is not usable.
package ui
