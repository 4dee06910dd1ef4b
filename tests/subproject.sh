#!/usr/bin/env bash
# The ctest `subproject`: configures tests/subproject, a project that add_subdirectory()s graft
# (configure only: the libraries' build is what `make test` already does), in a temp directory.
#   tests/subproject.sh SOURCE_DIR
set -euo pipefail
src=$(cd "$1" && pwd)
w=$(mktemp -d "${TMPDIR:-/tmp}/graft_subproject.XXXXXX")
trap 'rm -rf "$w"' EXIT
cmake -S "$src/tests/subproject" -B "$w" -DGRAFT_SOURCE="$src" -DCMAKE_BUILD_TYPE=Release >"$w/log" 2>&1 ||
  { cat "$w/log"; echo "subproject: configuring a project that add_subdirectory()s graft failed" >&2; exit 1; }
grep 'subproject:' "$w/log"
