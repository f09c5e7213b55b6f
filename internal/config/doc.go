// Package config reads the configuration files of Rialto's daemons
// (`rialto server --config FILE`, `rialto agent --config FILE`).
//
// A file is TOML, flat: one key per command-line flag, named as the flag
// (`listen = "0.0.0.0:7070"`, `heartbeat = "1s"`, `quota = ["leases=10",
// "alice:slots=2"]`). Each value is handed to the flag as text, so it
// parses exactly as it would on the command line: a string as it is, an
// integer, float or boolean in its decimal or literal form, an array as
// the flag given once per element (repeatable flags). Tables and
// date-times are refused. A flag given on the command line overrides the
// file: Apply skips the keys its changed function reports.
//
// Errors name the file and the line: a key no flag has, a value the flag
// refuses, a key given twice, a TOML syntax error.
//
// The package knows nothing of a flag library: it sets flags through the
// one-method Flags interface (the standard library's *flag.FlagSet and
// pflag's *pflag.FlagSet both have it) and is told which names are flags
// and which were given on the command line by two functions.
//
// The zero File applies nothing. A File is not changed after Parse and may
// be applied from several goroutines, each to its own flag set.
package config
