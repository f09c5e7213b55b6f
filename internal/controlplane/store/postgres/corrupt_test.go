package postgres

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/pgserver"
	"github.com/rialto-project/rialto/internal/pgserver/pgtest"
)

// TestDamagedData: PostgreSQL's reports of damaged data are
// store.ErrCorrupt, as SQLite's are (the sweep logs it at ERROR), with
// what to do: a table's page overwritten on disk (XX001 data_corrupted:
// "invalid page in block 0"), and an index's metapage (XX002
// index_corrupted: "is not a btree", REINDEX), for a read and for a write
// in a transaction. With data checksums on (initdb's default from
// PostgreSQL 18 on) the index's page fails its checksum before anything
// reads it: XX001 too, with the advice to restore; REINDEX rebuilds it
// either way (docs/operations.md says so). Both ways are run,
// whatever the installed PostgreSQL's default (pg_checksums turns them on
// or off), the cluster's own last. The server is stopped while the files
// are overwritten, so that it reads them from disk once started again.
// Before, they were plain errors: the sweep logged them at WARN at every
// sweep, without the advice; and the index's damage with checksums on was
// expected to advise REINDEX, which PostgreSQL 18 did not.
func TestDamagedData(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pg := pgtest.Server(t)
	orig, err := pg.Checksums(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, on := range []bool{!orig, orig} {
		t.Run(map[bool]string{false: "checksums off", true: "checksums on"}[on], func(t *testing.T) {
			damagedData(ctx, t, pg, on)
		})
	}
}

// damagedData is TestDamagedData with data checksums on or off.
func damagedData(ctx context.Context, t *testing.T, pg *pgserver.Server, checksums bool) {
	const restore, reindex = "restore the database from a backup", "REINDEX"
	type damaged struct {
		name     string
		relation string // whose first page is overwritten
		offset   int64  // where
		bytes    []byte // with what
		code     string // the SQLSTATE a read answers
		advice   string
		url      string
		file     string
	}
	cases := []*damaged{
		// The page header: flags and bounds no page has.
		{name: "table", relation: "events", offset: 0, bytes: []byte(strings.Repeat("\xff", 24)), code: "XX001", advice: restore},
		// The btree metapage's magic number, after the page header.
		{name: "index", relation: "events_pkey", offset: 24, bytes: make([]byte, 4), code: "XX002", advice: reindex},
	}
	if checksums {
		// A page that fails its checksum is a damaged page, whatever
		// it holds: PostgreSQL says so before it reads the index.
		cases[1].code, cases[1].advice = "XX001", restore
	}
	for _, c := range cases {
		c.url = pgtest.DB(t)
		s, err := Open(ctx, c.url, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.AppendEvent(ctx, api.Event{Type: "x", Subject: "y"}); err != nil {
			t.Fatal(err)
		}
		var rel string
		if err := s.db.QueryRowContext(ctx, `SELECT pg_relation_filepath($1)`, c.relation).Scan(&rel); err != nil {
			t.Fatal(err)
		}
		c.file = filepath.Join(pg.DataDir(), rel)
		s.Close()
	}
	// Stopped cleanly: every page is on disk, none cached.
	if err := pg.Stop(ctx, "fast"); err != nil {
		t.Fatal(err)
	}
	restarted := false
	defer func() {
		if !restarted {
			pg.Restart(context.Background())
		}
	}()
	if err := pg.SetChecksums(ctx, checksums); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		f, err := os.OpenFile(c.file, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(c.bytes, c.offset); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := pg.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	restarted = true

	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := Open(ctx, c.url, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			var on string
			if err := s.db.QueryRowContext(ctx, `SHOW data_checksums`).Scan(&on); err != nil {
				t.Fatal(err)
			}
			if want := map[bool]string{false: "off", true: "on"}[checksums]; on != want {
				t.Fatalf("data_checksums %s, want %s", on, want)
			}
			check := func(what string, err error, code string) {
				t.Helper()
				var pe *pgconn.PgError
				if !errors.Is(err, store.ErrCorrupt) || !errors.As(err, &pe) || pe.Code != code || !strings.Contains(err.Error(), c.advice) {
					t.Errorf("%s: %v, want store.ErrCorrupt with SQLSTATE %s and %q", what, err, code, c.advice)
				}
			}
			_, err = s.Events(ctx, 0, 10, "")
			check("a read", err, c.code)
			if c.name == "index" {
				// The insert reads the index's metapage.
				_, err = s.AppendEvent(ctx, api.Event{Type: "x", Subject: "z"})
				check("a write", err, c.code)
				// Checksums or not, REINDEX rebuilds it from its table.
				if _, err := s.db.ExecContext(ctx, `REINDEX INDEX `+c.relation); err != nil {
					t.Fatalf("REINDEX: %v", err)
				}
				if _, err := s.AppendEvent(ctx, api.Event{Type: "x", Subject: "z"}); err != nil {
					t.Errorf("a write after REINDEX: %v", err)
				}
				if evs, err := s.Events(ctx, 0, 10, ""); err != nil || len(evs) != 2 {
					t.Errorf("a read after REINDEX: %d events, %v; want 2", len(evs), err)
				}
			}
		})
	}
}
