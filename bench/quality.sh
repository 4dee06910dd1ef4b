#!/usr/bin/env bash
# `make bench-quality`: time to quality on the toy translation task. One model and recipe (the
# tiny preset with sinusoidal positions, i.e. nn.Transformer's model, Noam warmup 400,
# 4096-token batches, label smoothing 0.1, dropout 0.1, seed 1) trained until validation BLEU
# reaches 95 (checked every 50 steps on 200 sentences; a 20-minute cap, 30 for PyTorch) by graft
# fp32, graft bf16 (where this CPU has oneDNN bf16 kernels) and PyTorch fp32
# (bench/torch_quality.py: the same initial weights, batches and batch order, recorded by the
# graft fp32 run, and the same schedule and hyper-parameters). Reports the training seconds to
# get there (validation excluded) and the wall seconds (included), side by side in one run.
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
source bench/torch_env.sh  # python3-torch, OpenBLAS (openmp) as the BLAS
echo "bench-quality: OpenBLAS core type for the PyTorch peer" >&2
export OMP_NUM_THREADS=$THREADS
pick_openblas_coretype train
[ -n "$best_ct" ] && export OPENBLAS_CORETYPE=$best_ct
TRANSLATE=$BUILD/examples/translation/translate
[ -f data/toy/train.tsv ] ||
  "$TRANSLATE" generate-data --out data/toy --seed 1 --train 50000 --valid 1000 --test 1000

precisions=fp32
"$BUILD/bench/graft_bench" --what kernels | grep -q '"bf16_available":true' && precisions="fp32 bf16"
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
echo "benchmark,config,seconds_to_bleu,wall_seconds,step,precision" >"$OUT/quality.csv"
{
  echo "# time to valid BLEU >= $TARGET (toy translation: tiny preset, sinusoidal positions, seed 1)"
  echo
  echo "- $(date -u '+%Y-%m-%d %H:%M UTC'), $cpu, $THREADS threads; PyTorch with OPENBLAS_CORETYPE=${best_ct:-(unset)}"
  echo
  echo "| side | training s to BLEU $TARGET | wall s (with validation) | step |"
  echo "|---|---:|---:|---:|"
} >"$OUT/quality.md"
for p in $precisions; do
  run=runs/quality-$p
  rm -rf "$run"
  dump=()
  [ "$p" = fp32 ] && dump=(--dump-batches "$run.batches.jsonl")
  log=$("$TRANSLATE" train --data data/toy --out "$run" --preset tiny --minutes 20 \
    --batch-tokens 4096 --lr-factor 1 --warmup 400 --label-smoothing 0.1 --dropout 0.1 \
    --vocab 1000 --valid-every 50 --seed 1 --positions sinusoidal --stop-at-bleu "$TARGET" \
    --precision "$p" "${dump[@]}" 2>&1 | tr '\r' '\n' | tee -a /dev/stderr | grep '^reached valid' || true)
  # "reached valid bleu 95 at step N after X s of training (Y s wall)"
  if [ -z "$log" ]; then
    echo "| graft $p | not reached in 20 min | | |" >>"$OUT/quality.md"
    echo "time_to_bleu_$TARGET,graft $p,,,,$p" >>"$OUT/quality.csv"
    continue
  fi
  step=$(sed -n 's/.* at step \([0-9]*\) .*/\1/p' <<<"$log")
  secs=$(sed -n 's/.* after \([0-9.]*\) s of training.*/\1/p' <<<"$log")
  wall=$(sed -n 's/.*(\([0-9.]*\) s wall).*/\1/p' <<<"$log")
  echo "| graft $p | $secs | $wall | $step |" >>"$OUT/quality.md"
  echo "time_to_bleu_$TARGET,graft $p,$secs,$wall,$step,$p" >>"$OUT/quality.csv"
done
line=$($PY bench/torch_quality.py --dump runs/quality-fp32.batches.jsonl --run runs/quality-fp32 \
  --data data/toy/valid.tsv --translate "$TRANSLATE" --bleu "$TARGET" --valid-every 50 --minutes 30 |
  grep '^RESULT ' || true)
if grep -q '"reached": true' <<<"$line"; then
  echo "| PyTorch fp32 | $(field "$line" seconds_to_bleu) | $(field "$line" wall_seconds) | $(field "$line" step) |" >>"$OUT/quality.md"
  echo "time_to_bleu_$TARGET,pytorch fp32,$(field "$line" seconds_to_bleu),$(field "$line" wall_seconds),$(field "$line" step),fp32" >>"$OUT/quality.csv"
else
  echo "| PyTorch fp32 | not reached in 30 min | | ${line:+$(field "$line" step)} |" >>"$OUT/quality.md"
  echo "time_to_bleu_$TARGET,pytorch fp32,,,,fp32" >>"$OUT/quality.csv"
fi
cat "$OUT/quality.md"
