#!/usr/bin/env bash
# `make bench-quality`: time to quality on the toy translation task. The demo's model and recipe
# (tiny preset, relative positions, Noam warmup 400, 4096-token batches, seed 1) trained in fp32
# and, where this CPU has oneDNN bf16 kernels, in bf16, each until validation BLEU reaches 95
# (checked every 50 steps; a 20-minute cap). Reports the training seconds to get there
# (validation excluded) and the wall seconds (included), side by side in one run.
#   bench/quality.sh [BUILD_DIR]      writes bench/results/quality.csv and quality.md
set -euo pipefail

cd "$(dirname "$0")/.."
BUILD=${1:-build}
THREADS=${BENCH_THREADS:-2}
TARGET=${QUALITY_BLEU:-95}
OUT=bench/results
mkdir -p "$OUT"
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j"$THREADS" --target translate graft_bench >/dev/null
TRANSLATE=$BUILD/examples/translation/translate
export OMP_NUM_THREADS=$THREADS
[ -f data/toy/train.tsv ] ||
  "$TRANSLATE" generate-data --out data/toy --seed 1 --train 50000 --valid 1000 --test 1000

precisions=fp32
"$BUILD/bench/graft_bench" --what kernels | grep -q '"bf16_available":true' && precisions="fp32 bf16"
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
echo "benchmark,config,seconds_to_bleu,wall_seconds,step,precision" >"$OUT/quality.csv"
{
  echo "# time to valid BLEU >= $TARGET (toy translation, demo recipe)"
  echo
  echo "- $(date -u '+%Y-%m-%d %H:%M UTC'), $cpu, $THREADS threads"
  echo
  echo "| precision | training s to BLEU $TARGET | wall s (with validation) | step |"
  echo "|---|---:|---:|---:|"
} >"$OUT/quality.md"
for p in $precisions; do
  run=runs/quality-$p
  rm -rf "$run"
  log=$("$TRANSLATE" train --data data/toy --out "$run" --preset tiny --minutes 20 \
    --batch-tokens 4096 --lr-factor 1 --warmup 400 --label-smoothing 0.1 --dropout 0.1 \
    --vocab 1000 --valid-every 50 --seed 1 --positions relative --stop-at-bleu "$TARGET" \
    --precision "$p" 2>&1 | tr '\r' '\n' | tee /dev/stderr | grep '^reached valid' || true)
  # "reached valid bleu 95 at step N after X s of training (Y s wall)"
  if [ -z "$log" ]; then
    echo "| $p | not reached in 20 min | | |" >>"$OUT/quality.md"
    echo "time_to_bleu_$TARGET,tiny,,,,$p" >>"$OUT/quality.csv"
    continue
  fi
  step=$(sed -n 's/.* at step \([0-9]*\) .*/\1/p' <<<"$log")
  secs=$(sed -n 's/.* after \([0-9.]*\) s of training.*/\1/p' <<<"$log")
  wall=$(sed -n 's/.*(\([0-9.]*\) s wall).*/\1/p' <<<"$log")
  echo "| $p | $secs | $wall | $step |" >>"$OUT/quality.md"
  echo "time_to_bleu_$TARGET,tiny,$secs,$wall,$step,$p" >>"$OUT/quality.csv"
done
cat "$OUT/quality.md"
