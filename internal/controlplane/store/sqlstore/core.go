package sqlstore

import (
	"context"
	"database/sql"
	"strings"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// Execer runs statements written with "?" placeholders: a transaction or
// a database handle. A dialect whose placeholders differ rewrites them
// (PostgreSQL's Execer turns them into "$n").
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Scanner is a row: *sql.Row, *sql.Rows, or a driver's own.
type Scanner interface{ Scan(dest ...any) error }

// Dialect is what a SQL store does its own way: how it runs transactions
// and classifies errors, what it locks, and the statements whose best form
// differs between the databases (see doc.go).
type Dialect interface {
	// Wrap wraps a database error of the operation what.
	Wrap(what string, err error) error
	// Tx runs f in a write transaction (again if the database asks).
	Tx(ctx context.Context, f func(tx Execer) error) error
	// Read is the read side, outside transactions.
	Read() Execer
	// ReadTx begins a read-only transaction over one snapshot; done
	// ends it.
	ReadTx(ctx context.Context) (tx Execer, done func(), err error)
	// ForUpdate is the suffix that locks the rows a SELECT reads for the
	// rest of the transaction ("" where the writer is serial).
	ForUpdate() string
	// UniqueViolation reports whether err is a unique constraint's.
	UniqueViolation(err error) bool
	// LockParts locks what creations and re-placements re-check: the
	// tenants whose limits they check and the parts' devices (nothing
	// where the writer is serial).
	LockParts(ctx context.Context, tx Execer, tenants []string, parts []api.Part) error
	// LockEventLog is taken before a writer appends events (nothing
	// where the writer is serial).
	LockEventLog(ctx context.Context, tx Execer) error
	// ReadEventLog runs the query q (args) over the event log as a reader
	// of the log must, passing each row to each; start runs before each
	// attempt.
	ReadEventLog(ctx context.Context, what, q string, args []any, start func(), each func(Scanner) error) error
	// AppendEvents appends events in the order given.
	AppendEvents(ctx context.Context, tx Execer, evs []api.Event) error
	// InsertLease writes a new lease's row, its plan (text.Plan, if any)
	// and its parts, live; the lease was checked.
	InsertLease(ctx context.Context, tx Execer, n store.NewLease, text OpText) error
	// TransitionTx does a transition's compare-and-set, records the
	// parts' URIs, frees the parts of a lease that ends or the parts it
	// loses, and replaces its plan (text plan); it returns the lease as
	// written. staged are the values the batch wrote before (the last of
	// a lease is its current value). A refusal (store.ErrConflict,
	// store.ErrNotFound) comes before anything is written; an error after
	// a write is a Late.
	TransitionTx(ctx context.Context, tx Execer, id string, ch store.LeaseChange, plan string, staged []api.Lease) (api.Lease, error)
	// LeaseOps is the dialect's store.LeaseBatcher: CreateLease,
	// TransitionLease and TransitionLeases are batches of one kind or
	// the other. Core.WriteOps is its statement-by-statement form.
	LeaseOps(ctx context.Context, ops []store.LeaseOp) ([]api.Lease, []error, error)
	// Heartbeats is the dialect's store.Store.Heartbeats; Heartbeat is
	// a batch of one.
	Heartbeats(ctx context.Context, beats []store.Beat) ([]api.NodeState, []error, error)
	// Fatal reports whether an error of an op that wrote must abort the
	// batch rather than the op alone (a lost connection, a deadlock).
	Fatal(err error) bool
}

// Core is the part of a SQL store written once for every dialect: the
// statements and their Go logic. A dialect's Store embeds it and calls
// Init with itself.
//
// The zero value is not usable: Init it before use. A Core is safe for
// concurrent use when its Dialect is.
type Core struct {
	d Dialect

	// Decoded JSON of lease plans and parts, by text (TextCache).
	plans textCache[*api.Plan]
	parts textCache[[]api.Part]
}

// Init makes c run its statements through d.
func (c *Core) Init(d Dialect) { c.d = d }

func (s *Core) wrap(what string, err error) error { return s.d.Wrap(what, err) }

func (s *Core) tx(ctx context.Context, f func(tx Execer) error) error { return s.d.Tx(ctx, f) }

func (s *Core) rd() Execer { return s.d.Read() }

// The row encodings (codec.go).
var (
	ns   = NS
	tm   = Time
	js   = JSON
	unjs = Unjson
)

type textCache[T any] = TextCache[T]

// Placeholders is n "?" placeholders, separated by commas.
func Placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}
