package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver

	"github.com/rialto-project/rialto/internal/backoff"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/controlplane/store/sqlstore"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Store is a store.Store backed by one SQLite database file.
type Store struct {
	sqlstore.Core // the statements shared with the PostgreSQL store

	w  *sql.DB // single writer connection
	r  *sql.DB // read-only pool (the writer itself for :memory:)
	ws *stmtCache
	rs *stmtCache

	leaseMu sync.Mutex // serializes lease writes with their updates of live
	live    liveCache

	eventSQL sync.Map // the multi-row event INSERTs: rows → statement text

	ck             *sql.DB // checkpoints (file databases only)
	ckStop, ckDone chan struct{}
	ckOnce         sync.Once
}

var _ store.Store = (*Store)(nil)

var memSeq atomic.Int64

// Open opens (creating if needed) the database at path and applies pending
// migrations. ":memory:" gives a private in-memory database.
//
// A file database is checked first (PRAGMA quick_check, before anything
// is written to it): a damaged one is refused with store.ErrCorrupt,
// naming the file and what SQLite found, rather than served until a write
// reaches the damaged pages. The check reads every page: about 12 ms for a
// store of 10,000 leases with their plans and events (8 MB, in the page
// cache), so some 1.5 ms a MB, plus reading the file from disk if it is
// not cached.
func Open(ctx context.Context, path string) (*Store, error) {
	return open(ctx, path, -1)
}

// open applies migrations up to version max (-1: all).
func open(ctx context.Context, path string, max int) (*Store, error) {
	pragmas := []string{"busy_timeout(10000)" /* busyWait */, "foreign_keys(1)", "synchronous(NORMAL)"}
	mem := path == ":memory:"
	if strings.ContainsAny(path, "?#") {
		return nil, fmt.Errorf("sqlite: path %q must not contain '?' or '#'", path)
	}
	var wdsn, rdsn string
	if mem {
		// A named shared-cache memory database is private to this Store but
		// visible to all its connections; one connection serves both roles.
		name := fmt.Sprintf("rialto-mem-%d", memSeq.Add(1))
		wdsn = "file:" + name + "?mode=memory&cache=shared&_txlock=immediate" + pragmaQuery(pragmas)
	} else {
		// Checkpoints mostly run in the background (checkpoints below),
		// not in the commit that happens to cross the WAL's size limit:
		// a checkpoint copies pages and fsyncs, and the single writer
		// would stall meanwhile. Under a steady stream of writes a
		// background checkpoint never catches up with the last frame, so
		// it never lets the WAL start over; the writer still checkpoints
		// when the WAL passes walAutocheckpoint pages (little is left to
		// copy by then), which bounds the file.
		if err := ownerOnly(path); err != nil {
			return nil, err
		}
		pragmas = append(pragmas, "journal_mode(WAL)", fmt.Sprintf("wal_autocheckpoint(%d)", walAutocheckpoint))
		wdsn = "file:" + path + "?_txlock=immediate" + pragmaQuery(pragmas)
		rdsn = "file:" + path + "?_pragma=query_only(1)" + pragmaQuery([]string{"busy_timeout(10000)"})
	}
	w, err := sql.Open("sqlite", wdsn)
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	w.SetConnMaxIdleTime(0)
	s := &Store{w: w, r: w, ws: &stmtCache{db: w}}
	s.Init(dialect{s})
	s.rs = s.ws
	if !mem {
		if err := retryBusy(ctx, func() error { return quickCheck(ctx, w, path) }); err != nil {
			w.Close()
			return nil, err
		}
	}
	if err := s.migrate(ctx, max); err != nil {
		w.Close()
		return nil, err
	}
	if !mem {
		r, err := sql.Open("sqlite", rdsn)
		if err != nil {
			w.Close()
			return nil, fmt.Errorf("sqlite: open %s read-only: %w", path, err)
		}
		n := runtime.GOMAXPROCS(0) * 2
		if n < 4 {
			n = 4
		}
		r.SetMaxOpenConns(n)
		r.SetMaxIdleConns(n)
		s.r = r
		s.rs = &stmtCache{db: r}
		ck, err := sql.Open("sqlite", "file:"+path+"?"+strings.TrimPrefix(pragmaQuery([]string{"busy_timeout(10000)"}), "&"))
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("sqlite: open %s for checkpoints: %w", path, err)
		}
		ck.SetMaxOpenConns(1)
		s.ck, s.ckStop, s.ckDone = ck, make(chan struct{}), make(chan struct{})
		go s.checkpoints(checkpointEvery)
	}
	return s, nil
}

// restoreAdvice says what to do about a damaged database.
const restoreAdvice = `stop the server and restore the file from a backup (docs/operations.md, "Backups and restore")`

// quickCheck refuses a damaged database file: it runs PRAGMA quick_check
// (the structure of every page, without cross-checking indexes against
// their tables) on w, which writes nothing.
func quickCheck(ctx context.Context, w *sql.DB, path string) error {
	const lines = 3 // of SQLite's report, in the error
	rows, err := w.QueryContext(ctx, fmt.Sprintf(`PRAGMA quick_check(%d)`, lines))
	if err != nil {
		return checkFailed(path, err)
	}
	defer rows.Close()
	var found []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			return checkFailed(path, err)
		}
		// One row may hold several lines, under a heading.
		for _, l := range strings.Split(line, "\n") {
			if l = strings.TrimSpace(l); l != "" && l != "*** in database main ***" && len(found) < lines {
				found = append(found, l)
			}
		}
	}
	if err := rows.Err(); err != nil {
		return checkFailed(path, err)
	}
	if len(found) == 1 && found[0] == "ok" {
		return nil
	}
	return fmt.Errorf("sqlite: %s: %w: quick_check found: %s; %s", path, store.ErrCorrupt, strings.Join(found, "; "), restoreAdvice)
}

// checkFailed is the error of a quick_check that SQLite could not run.
func checkFailed(path string, err error) error {
	if isCorrupt(err) {
		return fmt.Errorf("sqlite: %s: %w: %w; %s", path, store.ErrCorrupt, err, restoreAdvice)
	}
	return fmt.Errorf("sqlite: check %s: %w", path, err)
}

// isCorrupt reports whether err is SQLite's SQLITE_CORRUPT (11) or
// SQLITE_NOTADB (26), with any extended code.
func isCorrupt(err error) bool {
	var c interface{ Code() int }
	return errors.As(err, &c) && (c.Code()&0xff == 11 || c.Code()&0xff == 26)
}

// ownerOnly creates the database file at path readable by its owner only,
// or takes group and other access away from it and its WAL files if they
// exist: it holds lease credentials and agent keys. SQLite creates the WAL
// files with the database file's mode.
func ownerOnly(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("sqlite: create %s: %w", path, err)
	}
	f.Close()
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		st, err := os.Stat(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err == nil && st.Mode().Perm()&0o077 != 0 {
			err = os.Chmod(p, st.Mode().Perm()&^0o077)
		}
		if err != nil {
			return fmt.Errorf("sqlite: restrict %s to its owner: %w", p, err)
		}
	}
	return nil
}

// checkpointEvery is how often the WAL is checkpointed into the database
// in the background.
const checkpointEvery = 200 * time.Millisecond

// walAutocheckpoint is the WAL size (pages) past which the writer itself
// checkpoints, letting the WAL start over: 32 MiB with 4 KiB pages. A
// variable for tests.
var walAutocheckpoint = 8192

// checkpoints copies the WAL into the database file every period, on its
// own connection, until Close. A passive checkpoint takes no lock that
// writers or readers need: commits keep appending to the WAL while it
// copies and fsyncs. Durability is unchanged (synchronous=NORMAL: a
// commit is in the WAL, durable across a process crash, before it
// returns).
func (s *Store) checkpoints(every time.Duration) {
	defer close(s.ckDone)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.ckStop:
			return
		case <-t.C:
			// An error (e.g. the database is busy) is retried next period.
			s.ck.ExecContext(context.Background(), `PRAGMA wal_checkpoint(PASSIVE)`)
		}
	}
}

func pragmaQuery(ps []string) string {
	var b strings.Builder
	for _, p := range ps {
		b.WriteString("&_pragma=")
		b.WriteString(url.QueryEscape(p))
	}
	return b.String()
}

// Close closes the database.
func (s *Store) Close() error {
	if s.ck != nil {
		s.ckOnce.Do(func() {
			close(s.ckStop)
			<-s.ckDone
			s.ck.Close()
		})
	}
	s.ws.close()
	if s.rs != s.ws {
		s.rs.close()
	}
	err := s.w.Close()
	if s.r != s.w {
		err = errors.Join(err, s.r.Close())
	}
	return err
}

func migrations() ([]sqlstore.Migration, error) {
	ms, err := sqlstore.ReadMigrations(migrationFS, "migrations")
	if err != nil {
		return nil, fmt.Errorf("sqlite: %w", err)
	}
	return ms, nil
}

// SchemaVersion returns the highest applied migration.
func (s *Store) SchemaVersion(ctx context.Context) (int, error) {
	var v sql.NullInt64
	if err := s.w.QueryRowContext(ctx, `SELECT MAX(version) FROM schema_version`).Scan(&v); err != nil {
		return 0, fmt.Errorf("sqlite: schema version: %w", err)
	}
	return int(v.Int64), nil
}

func (s *Store) migrate(ctx context.Context, max int) error {
	ms, err := migrations()
	if err != nil {
		return err
	}
	return retryBusy(ctx, func() error {
		return sqlstore.Migrate(ctx, s.w, ms, max, "TEXT", `INSERT INTO schema_version (version, name) VALUES (?, ?)`, "sqlite",
			func(what string, err error) error { return fmt.Errorf("sqlite: %s: %w", what, err) })
	})
}

// retryBusy runs f, the first statements of a new connection, again while
// it fails with SQLITE_BUSY, for as long as a busy statement would wait:
// another process opening the file at the same moment may hold it where
// SQLite answers BUSY without waiting (switching a new file to WAL, which
// the connection's pragmas do before its first statement).
func retryBusy(ctx context.Context, f func() error) error {
	b := backoff.Backoff{Min: 10 * time.Millisecond, Max: 500 * time.Millisecond}
	deadline := time.Now().Add(busyWait)
	for {
		err := f()
		if !isBusy(err) || time.Now().After(deadline) {
			return err
		}
		if werr := b.Wait(ctx); werr != nil {
			return err
		}
	}
}

// busyWait is how long a statement waits for another connection's lock
// (the busy_timeout pragma).
const busyWait = 10 * time.Second

// isBusy reports whether err is SQLite's SQLITE_BUSY (5, with any extended
// code).
func isBusy(err error) bool {
	var c interface{ Code() int }
	return errors.As(err, &c) && c.Code()&0xff == 5
}

// tx runs f in a write transaction.
func (s *Store) tx(ctx context.Context, f func(tx execer) error) error {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("sqlite: begin: %w", err)
	}
	defer s.ws.flush(ctx)
	if err := f(cachedTx{tx, s.ws}); err != nil {
		tx.Rollback()
		return corrupt(err)
	}
	if err := tx.Commit(); err != nil {
		return corrupt(fmt.Errorf("sqlite: commit: %w", err))
	}
	return nil
}

// corrupt marks err with store.ErrCorrupt if it is SQLite's report of a
// damaged database, saying what to do.
func corrupt(err error) error {
	if isCorrupt(err) && !errors.Is(err, store.ErrCorrupt) {
		return fmt.Errorf("%w: %w; %s", store.ErrCorrupt, err, restoreAdvice)
	}
	return err
}
