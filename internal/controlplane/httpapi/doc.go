// Package httpapi holds the route table's description of the control
// plane's REST/JSON API: an OpenAPI 3 document generated from the route
// table (schemas derived by reflection from the api package's types, so
// the document cannot drift from the wire types). Request decoding and
// JSON answers are internal/httpx's, which every server shares.
//
// Functions here are pure or write only to the given ResponseWriter; they
// are safe for concurrent use. The zero Route is meaningless.
package httpapi
