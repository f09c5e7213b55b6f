#!/usr/bin/env bash
# Runs every Go fuzz target in the module for a short time each.
# A target fails the run when it wrote a failing input
# (testdata/fuzz/TARGET/…) or its corpus fails when replayed. Go before
# 1.27 may fail a target at the end of -fuzztime with a bare "context
# deadline exceeded" and no input (a race in its fuzzing coordinator,
# golang/go#75804): such a target's corpus is replayed, and the run goes
# on if it passes.
set -euo pipefail
cd "$(dirname "$0")/.."
t=${1:-20s}
failed=0
one() {
  local pkg=$1 fn=$2 dir=$1/testdata/fuzz/$2 before after log
  before=$(ls "$dir" 2>/dev/null | sort || true)
  log=$(mktemp)
  if go test -run '^$' -fuzz "^${fn}\$" -fuzztime "$t" "$pkg" 2>&1 | tee "$log"; then
    rm -f "$log"; return 0
  fi
  after=$(ls "$dir" 2>/dev/null | sort || true)
  if [ "$before" = "$after" ] && grep -q '^    context deadline exceeded$' "$log" &&
    go test -count=1 -run "^${fn}\$" "$pkg"; then
    echo "== $fn: no failing input written and its corpus passes: the fuzzing coordinator's end-of-time race (golang/go#75804), not a finding"
    rm -f "$log"; return 0
  fi
  rm -f "$log"
  echo "== $fn FAILED"; failed=1
}
# bench/ is a module of its own: its targets run from there.
run() {
  local dir=$1; shift
  pushd "$dir" > /dev/null
  local files
  files=$(grep -rl --include='*_test.go' "$@" '^func Fuzz' . || true)
  for f in $files; do
    pkg=./$(dirname "$f")
    for fn in $(grep -o '^func Fuzz[A-Za-z0-9_]*' "$f" | cut -d' ' -f2); do
      echo "== $dir/$pkg $fn"
      one "$pkg" "$fn"
    done
  done
  popd > /dev/null
}
run . --exclude-dir=bench
run bench
exit $failed
