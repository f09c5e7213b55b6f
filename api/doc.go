// Package api holds Rialto's wire types (the JSON of the REST API under /v1/)
// and a Go client for it. It imports nothing from internal/.
//
// The zero value of Client is not usable; call NewClient. A Client is safe
// for concurrent use by multiple goroutines.
package api
