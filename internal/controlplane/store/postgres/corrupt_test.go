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
	"github.com/rialto-project/rialto/internal/pgserver/pgtest"
)

// TestDamagedData: PostgreSQL's reports of damaged data are
// store.ErrCorrupt, as SQLite's are (the sweep logs it once, at ERROR),
// with what to do: a table's page overwritten on disk (XX001
// data_corrupted: "invalid page in block 0"), and an index's metapage
// (XX002 index_corrupted: "is not a btree"), for a read and for a write
// in a transaction. The server is stopped while the files are
// overwritten, so that it reads them from disk once started again.
// Before, they were plain errors: the sweep logged them at WARN at every
// sweep, without the advice.
func TestDamagedData(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pg := pgtest.Server(t)
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
		{name: "table", relation: "events", offset: 0, bytes: []byte(strings.Repeat("\xff", 24)), code: "XX001", advice: "restore the database from a backup"},
		// The btree metapage's magic number, after the page header.
		{name: "index", relation: "events_pkey", offset: 24, bytes: make([]byte, 4), code: "XX002", advice: "REINDEX"},
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
		var rel, checksums string
		if err := s.db.QueryRowContext(ctx, `SELECT pg_relation_filepath($1)`, c.relation).Scan(&rel); err != nil {
			t.Fatal(err)
		}
		if err := s.db.QueryRowContext(ctx, `SHOW data_checksums`).Scan(&checksums); err != nil {
			t.Fatal(err)
		}
		if checksums == "on" {
			// A page that fails its checksum is a damaged page, whatever
			// it holds.
			c.code = "XX001"
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
			}
		})
	}
}
