package sqlitetest

import (
	"database/sql"
	"fmt"
	"testing"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// DamageTable points table's root page, in the schema of the SQLite
// database at path, as damage to the file would: every statement that
// reads the table fails with SQLITE_CORRUPT. (It goes through SQLite, so
// that a store that has the file open sees it.)
func DamageTable(t testing.TB, path, table string) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	var v int
	if err := db.QueryRow(`PRAGMA schema_version`).Scan(&v); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{`PRAGMA writable_schema=ON`,
		fmt.Sprintf(`UPDATE sqlite_schema SET rootpage = (SELECT rootpage FROM sqlite_schema WHERE type = 'index' AND tbl_name <> '%[1]s' LIMIT 1)
			WHERE type = 'table' AND name = '%[1]s'`, table),
		fmt.Sprintf(`PRAGMA schema_version = %d`, v+1), `PRAGMA writable_schema=OFF`} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}
