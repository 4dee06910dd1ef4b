#!/usr/bin/env bash
# bf16 decoding speed side by side (docs/mixed-precision.md#bf16-tensors-for-inference): this
# build's graft_bench at --precision bf16 (the model converted to bf16 tensors) and at fp32,
# against another build's graft_bench at --precision bf16 (OLD_BUILD: 0.6.0's PrecisionGuard
# path, float32 weights with bf16 matmul operands), interleaved round by round so the machine's
# load hits all three alike; prints the best ms of each per config, and the peak decoding RSS.
#   bench/bf16_decode.sh OLD_BUILD [BUILD_DIR]
# Environment: ROUNDS (3), BENCH_THREADS (2), STEPS (2).
set -euo pipefail

cd "$(dirname "$0")/.."
OLD=${1:?usage: bench/bf16_decode.sh OLD_BUILD [BUILD_DIR]}
BUILD=${2:-build}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-2}
export OMP_NUM_THREADS=${BENCH_THREADS:-2}
NEW_BENCH=$BUILD/bench/graft_bench OLD_BENCH=$OLD/bench/graft_bench
for b in "$NEW_BENCH" "$OLD_BENCH"; do
  [ -x "$b" ] || { echo "bf16_decode: no graft_bench at $b" >&2; exit 1; }
done

CONFIGS=("base 32 1" "base 32 4" "base 1 1" "tiny 1 1")  # config, batch, beam

# field JSON NAME: a number from graft_bench's RESULT line.
field() { grep -o "\"$2\":[0-9.]*" <<<"$1" | cut -d: -f2; }

# run BENCH PRECISION CONFIG BATCH BEAM: prints "ms rss" of one run.
run() {
  local line
  line=$("$1" --what greedy --config "$3" --batch "$4" --beam "$5" --precision "$2" \
    --warmup 1 --steps "$STEPS" 2>/dev/null | grep '^RESULT')
  echo "$(field "$line" ms) $(field "$line" decode_peak_rss_mib)"
}

declare -A best rss
for ((r = 1; r <= ROUNDS; r++)); do
  for c in "${CONFIGS[@]}"; do
    read -r cfg batch beam <<<"$c"
    for side in "bf16 $NEW_BENCH new_bf16" "fp32 $NEW_BENCH new_fp32" "bf16 $OLD_BENCH old_bf16"; do
      read -r prec bench key <<<"$side"
      read -r ms mib <<<"$(run "$bench" "$prec" "$cfg" "$batch" "$beam")"
      k="$c|$key"
      if [ -z "${best[$k]:-}" ] || awk "BEGIN{exit !($ms < ${best[$k]})}"; then best[$k]=$ms; fi
      rss[$k]=${mib:-}
    done
  done
done
echo "config batch beam | bf16 tensors ms | fp32 ms | old bf16 ms | bf16/old | bf16 RSS / fp32 RSS"
for c in "${CONFIGS[@]}"; do
  n=${best[$c|new_bf16]} f=${best[$c|new_fp32]} o=${best[$c|old_bf16]}
  echo "$c | $n | $f | $o | $(awk "BEGIN{printf \"%.2f\", $n / $o}") |" \
    "${rss[$c|new_bf16]} / ${rss[$c|new_fp32]} MiB"
done
