// Package httpapi holds the transport pieces of the control plane's
// REST/JSON API that do not depend on its logic: strict, size-limited
// request decoding, JSON answers, and an OpenAPI 3 document generated from
// the route table (schemas derived by reflection from the api package's
// types, so the document cannot drift from the wire types).
//
// Functions here are pure or write only to the given ResponseWriter; they
// are safe for concurrent use. The zero Route is meaningless.
package httpapi
