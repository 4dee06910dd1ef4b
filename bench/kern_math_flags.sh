#!/usr/bin/env bash
# bench/kern_math_flags.sh BUILD_DIR [N]: bench/kern_math_bench.cpp compiled against the build tree
# with the flags a user's program might have, and run (one thread each): what of a custom op's
# raw-loop speed depends on the caller's flags and what does not (issue 48).
set -euo pipefail
BUILD=$(cd "$1" && pwd)
SRC=$(cd "$(dirname "$0")/.." && pwd)
W=$(mktemp -d "${TMPDIR:-/tmp}/kern_math_flags.XXXXXX")
trap 'rm -rf "$W"' EXIT
lscpu | sed -n 's/^Model name: *//p'
for flags in "-O2" "-O3" "-O2 -fopenmp" "-O3 -march=native" "-O3 -march=native -fopenmp"; do
  read -r -a f <<<"$flags"
  g++ -std=c++20 "${f[@]}" -I"$BUILD/include" -I"$BUILD/generated" "$SRC/bench/kern_math_bench.cpp" \
    "$BUILD/libgraft_ops.so" "$BUILD/libgraft_autograd.so" -Wl,-rpath,"$BUILD" -o "$W/bench"
  echo "== g++ $flags"
  OMP_NUM_THREADS=1 "$W/bench" "${2:-4194304}" | tail -n +2
done
