package postgres

import "github.com/rialto-project/rialto/internal/controlplane/store/sqlcodec"

// The row encodings shared with the other SQL store (sqlcodec).
var (
	ns   = sqlcodec.NS
	tm   = sqlcodec.Time
	js   = sqlcodec.JSON
	unjs = sqlcodec.Unjson
)

// textCache keeps values decoded from stored JSON by their text
// (sqlcodec.TextCache).
type textCache[T any] = sqlcodec.TextCache[T]
