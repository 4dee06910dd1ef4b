#!/usr/bin/env bash
# graft's safetensors reader and writer against Python's safetensors package with numpy
# (tests/test_safetensors_py.py): BF16, F16, I8, F32, F64 and I64 files written by either side
# load in the other to the same dtypes and values.
#   tests/test_safetensors_py.sh BUILD_DIR SAFETENSORS_VALUES
# The packages come from BUILD_DIR/pyvenv (bench/pyvenv.sh installs what is missing, as make test
# does); exit 77 (skipped), saying so, only when they cannot be had (no PyPI reachable).
set -uo pipefail
build=$(cd "$1" && pwd)
tool=$2
src=$(cd "$(dirname "$0")/.." && pwd)

# shellcheck source=bench/pyvenv.sh
source "$src/bench/pyvenv.sh"
if ! pyvenv "$build/pyvenv" safetensors numpy; then
  echo "test_safetensors_py: skipped: the safetensors and numpy packages could not be had from PyPI"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$VPY" "$src/tests/test_safetensors_py.py" "$tool" "$work"
