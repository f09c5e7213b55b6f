package sqlite

import (
	"context"
	"database/sql"
	"sync"
	"sync/atomic"

	"github.com/rialto-project/rialto/internal/controlplane/store/sqlstore"
)

// Parsing SQL is a large share of the cost of a small transaction with the
// pure-Go driver, so statements are prepared once per database handle and
// reused (bounded: dynamic queries beyond maxStmts are prepared each time).
const maxStmts = 512

type stmtCache struct {
	db      *sql.DB
	m       sync.Map // query → *sql.Stmt
	n       atomic.Int64
	pending sync.Map // queries first seen inside a transaction
}

// get returns the prepared statement for q, or nil to run q unprepared.
// Inside a transaction it never prepares (sql.DB.Prepare would wait for a
// connection the transaction may hold); it notes q for flush instead.
func (c *stmtCache) get(ctx context.Context, q string, inTx bool) *sql.Stmt {
	if v, ok := c.m.Load(q); ok {
		return v.(*sql.Stmt)
	}
	if c.n.Load() >= maxStmts {
		return nil
	}
	if inTx {
		c.pending.Store(q, true)
		return nil
	}
	return c.prepare(ctx, q)
}

// flush prepares the queries noted inside transactions; call it with no
// transaction open in this goroutine.
func (c *stmtCache) flush(ctx context.Context) {
	c.pending.Range(func(k, _ any) bool {
		c.pending.Delete(k)
		if _, ok := c.m.Load(k); !ok && c.n.Load() < maxStmts {
			c.prepare(ctx, k.(string))
		}
		return true
	})
}

func (c *stmtCache) prepare(ctx context.Context, q string) *sql.Stmt {
	st, err := c.db.PrepareContext(ctx, q)
	if err != nil {
		return nil // let the caller run it unprepared and report the error
	}
	if v, loaded := c.m.LoadOrStore(q, st); loaded {
		st.Close()
		return v.(*sql.Stmt)
	}
	c.n.Add(1)
	return st
}

func (c *stmtCache) close() {
	c.m.Range(func(_, v any) bool {
		v.(*sql.Stmt).Close()
		return true
	})
}

// execer runs statements: a transaction or a database handle, with cached
// statements.
type execer = sqlstore.Execer

// Wrappers implementing execer with cached statements.

type cachedTx struct {
	tx *sql.Tx
	c  *stmtCache
}

func (t cachedTx) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	if st := t.c.get(ctx, q, true); st != nil {
		return t.tx.StmtContext(ctx, st).ExecContext(ctx, args...)
	}
	return t.tx.ExecContext(ctx, q, args...)
}

func (t cachedTx) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	if st := t.c.get(ctx, q, true); st != nil {
		return t.tx.StmtContext(ctx, st).QueryContext(ctx, args...)
	}
	return t.tx.QueryContext(ctx, q, args...)
}

func (t cachedTx) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	if st := t.c.get(ctx, q, true); st != nil {
		return t.tx.StmtContext(ctx, st).QueryRowContext(ctx, args...)
	}
	return t.tx.QueryRowContext(ctx, q, args...)
}

type cachedDB struct{ c *stmtCache }

func (d cachedDB) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	if st := d.c.get(ctx, q, false); st != nil {
		return st.ExecContext(ctx, args...)
	}
	return d.c.db.ExecContext(ctx, q, args...)
}

func (d cachedDB) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	if st := d.c.get(ctx, q, false); st != nil {
		return st.QueryContext(ctx, args...)
	}
	return d.c.db.QueryContext(ctx, q, args...)
}

func (d cachedDB) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	if st := d.c.get(ctx, q, false); st != nil {
		return st.QueryRowContext(ctx, args...)
	}
	return d.c.db.QueryRowContext(ctx, q, args...)
}

// rd is the read side with cached statements.
func (s *Store) rd() cachedDB { return cachedDB{s.rs} }
