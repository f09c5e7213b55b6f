package postgres

import "github.com/rialto-project/rialto/internal/controlplane/store/sqlstore"

// ns is a time as stored (sqlstore.NS).
var ns = sqlstore.NS
