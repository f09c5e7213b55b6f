// Package sqlitetest helps tests of the SQLite store and of the control
// plane that runs on it: DamageTable damages a table of a database file
// as damage to the file would, through SQLite, so that a store that has
// the file open sees it, and repairs it again. Only tests import it.
package sqlitetest
