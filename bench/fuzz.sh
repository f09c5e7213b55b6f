#!/usr/bin/env bash
# Runs every Go fuzz target in the module for a short time each.
set -euo pipefail
cd "$(dirname "$0")/.."
t=${1:-20s}
# bench/ is a module of its own: its targets run from there.
run() {
  local dir=$1; shift
  (cd "$dir" && grep -rl --include='*_test.go' "$@" '^func Fuzz' . | while read -r f; do
    pkg=./$(dirname "$f")
    for fn in $(grep -o '^func Fuzz[A-Za-z0-9_]*' "$f" | cut -d' ' -f2); do
      echo "== $dir/$pkg $fn"
      go test -run '^$' -fuzz "^${fn}\$" -fuzztime "$t" "$pkg"
    done
  done)
}
run . --exclude-dir=bench
run bench
