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
// that a store that has the file open sees it.) It returns the function
// that repairs it, pointing the table at its own root page again, as a
// restored file would.
func DamageTable(t testing.TB, path, table string) (repair func()) {
	t.Helper()
	var root int
	query(t, path, func(db *sql.DB) error {
		return db.QueryRow(`SELECT rootpage FROM sqlite_schema WHERE type = 'table' AND name = ?`, table).Scan(&root)
	})
	setRoot(t, path, table, fmt.Sprintf(`(SELECT rootpage FROM sqlite_schema WHERE type = 'index' AND tbl_name <> '%s' LIMIT 1)`, table))
	return func() {
		t.Helper()
		setRoot(t, path, table, fmt.Sprint(root))
	}
}

// setRoot sets table's root page in the schema of the database at path
// to the SQL expression root.
func setRoot(t testing.TB, path, table, root string) {
	t.Helper()
	query(t, path, func(db *sql.DB) error {
		var v int
		if err := db.QueryRow(`PRAGMA schema_version`).Scan(&v); err != nil {
			return err
		}
		for _, q := range []string{`PRAGMA writable_schema=ON`,
			fmt.Sprintf(`UPDATE sqlite_schema SET rootpage = %s WHERE type = 'table' AND name = '%s'`, root, table),
			fmt.Sprintf(`PRAGMA schema_version = %d`, v+1), `PRAGMA writable_schema=OFF`} {
			if _, err := db.Exec(q); err != nil {
				return fmt.Errorf("%s: %w", q, err)
			}
		}
		return nil
	})
}

// query runs f on one connection to the database at path.
func query(t testing.TB, path string, f func(*sql.DB) error) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	if err := f(db); err != nil {
		t.Fatal(err)
	}
}
