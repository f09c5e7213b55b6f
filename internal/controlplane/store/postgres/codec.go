package postgres

import "github.com/rialto-project/rialto/internal/controlplane/store/sqlcodec"

// ns is a time as stored (sqlcodec).
var ns = sqlcodec.NS
