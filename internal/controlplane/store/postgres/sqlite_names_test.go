package postgres

import (
	"os"
	"path/filepath"
	"sort"
)

// sqliteMigrationNames lists the SQLite store's migration files.
func sqliteMigrationNames() ([]string, error) {
	ents, err := os.ReadDir(filepath.Join("..", "sqlite", "migrations"))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	sort.Strings(out)
	return out, nil
}
