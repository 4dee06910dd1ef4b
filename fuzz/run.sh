#!/usr/bin/env bash
# Runs each libFuzzer target for SECONDS on one core (`make fuzz`): the corpus grows in a work
# directory (not committed); a crashing, leaking or slow input is copied to
# fuzz/regressions/<target>/ so `make test` replays it from then on.
#   fuzz/run.sh BUILD_DIR SECONDS [TARGET...]
set -euo pipefail
BUILD=$1
SECONDS_EACH=$2
shift 2
TARGETS=${*:-safetensors train_state config tsv bleu}
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=${FUZZ_WORK:-$BUILD/fuzz-work}
status=0
for t in $TARGETS; do
  rm -rf "$WORK/$t-artifacts"
  mkdir -p "$WORK/$t" "$WORK/$t-artifacts"
  echo "== fuzz_$t for $SECONDS_EACH s"
  # -timeout: an input slower than 10 s counts as a hang; -rss_limit_mb bounds memory.
  if ! ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions=$HERE/../tests/lsan.supp OMP_NUM_THREADS=1 \
      "$BUILD/fuzz/fuzz_$t" "$WORK/$t" "$HERE/corpus/$t" "$HERE/regressions/$t" \
      -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
      -artifact_prefix="$WORK/$t-artifacts/" -print_final_stats=1 2>"$WORK/$t.log"; then
    status=1
    echo "fuzz_$t FOUND A PROBLEM: see $WORK/$t.log"
  fi
  grep -E "^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)|cov: " "$WORK/$t.log" | tail -4 || true
  for a in "$WORK/$t-artifacts"/*; do
    [[ -f $a ]] || continue
    cp "$a" "$HERE/regressions/$t/"
    echo "kept $(basename "$a") in fuzz/regressions/$t/"
  done
done
exit $status
