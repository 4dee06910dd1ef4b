#!/usr/bin/env bash
# `make bench-quality`: time to quality on the toy translation task. One model and recipe (the
# tiny preset with sinusoidal positions, i.e. nn.Transformer's model, Noam warmup 400,
# 4096-token batches, label smoothing 0.1, dropout 0.1, seed 1) trained until validation BLEU
# reaches 95 (checked every 50 steps on 200 sentences; a 20-minute cap, 30 for PyTorch) by graft
# fp32, graft bf16 (where this CPU has oneDNN bf16 kernels) and PyTorch fp32
# (bench/torch_quality.py: the same initial weights, batches and batch order, recorded by the
# graft fp32 run, and the same schedule and hyper-parameters). Reports the training seconds to
# get there (validation excluded) and the wall seconds (included), side by side in one run:
# QUALITY_RUNS rounds (default 3), each running every side once in turn (graft fp32, graft bf16,
# PyTorch), and the median round of each side. PyTorch runs with the OpenBLAS core type that
# PyTorch's 1024^3 sgemm probe picks (bench/torch_env.sh).
#   bench/quality.sh [BUILD_DIR]      writes bench/results/quality.csv and quality.md
set -euo pipefail

cd "$(dirname "$0")/.."
BUILD=${1:-build}
THREADS=${BENCH_THREADS:-2}
TARGET=${QUALITY_BLEU:-95}
RUNS=${QUALITY_RUNS:-3}
OUT=bench/results
mkdir -p "$OUT"
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j"$THREADS" --target translate graft_bench >/dev/null
source bench/torch_env.sh  # python3-torch, OpenBLAS (openmp) as the BLAS
echo "bench-quality: OpenBLAS core type for the PyTorch peer" >&2
export OMP_NUM_THREADS=$THREADS
pick_openblas_coretype
[ -n "$best_ct" ] && export OPENBLAS_CORETYPE=$best_ct
TRANSLATE=$BUILD/examples/translation/translate
[ -f data/toy/train.tsv ] ||
  "$TRANSLATE" generate-data --out data/toy --seed 1 --train 50000 --valid 1000 --test 1000

precisions=fp32
"$BUILD/bench/graft_bench" --what kernels | grep -q '"bf16_available":true' && precisions="fp32 bf16"
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
# graft_run P ROUND: one graft training run to the target; prints "seconds wall step" or nothing.
graft_run() {
  local p=$1 run=runs/quality-$1-$2 dump=() log
  rm -rf "$run"
  [ "$p" = fp32 ] && dump=(--dump-batches "$run.batches.jsonl")
  log=$("$TRANSLATE" train --data data/toy --out "$run" --preset tiny --minutes 20 \
    --batch-tokens 4096 --lr-factor 1 --warmup 400 --label-smoothing 0.1 --dropout 0.1 \
    --vocab 1000 --valid-every 50 --seed 1 --positions sinusoidal --stop-at-bleu "$TARGET" \
    --precision "$p" "${dump[@]}" 2>&1 | tr '\r' '\n' | grep '^reached valid' || true)
  # "reached valid bleu 95 at step N after X s of training (Y s wall)"
  [ -n "$log" ] && echo "$(sed -n 's/.* after \([0-9.]*\) s of training.*/\1/p' <<<"$log")" \
    "$(sed -n 's/.*(\([0-9.]*\) s wall).*/\1/p' <<<"$log")" "$(sed -n 's/.* at step \([0-9]*\) .*/\1/p' <<<"$log")"
  return 0
}
# torch_run ROUND: the PyTorch peer on that round's graft fp32 batches and weights.
torch_run() {
  local line
  line=$($PY bench/torch_quality.py --dump "runs/quality-fp32-$1.batches.jsonl" --run "runs/quality-fp32-$1" \
    --data data/toy/valid.tsv --translate "$TRANSLATE" --bleu "$TARGET" --valid-every 50 --minutes 30 |
    grep '^RESULT ' || true)
  grep -q '"reached": true' <<<"$line" &&
    echo "$(field "$line" seconds_to_bleu) $(field "$line" wall_seconds) $(field "$line" step)"
  return 0
}
sides="$precisions pytorch"
declare -A got  # side -> one "seconds wall step" line per round that reached the target
for ((r = 1; r <= RUNS; r++)); do
  for side in $sides; do
    if [ "$side" = pytorch ]; then res=$(torch_run "$r"); else res=$(graft_run "$side" "$r"); fi
    echo "bench-quality: round $r, $side: ${res:-not reached}" >&2
    [ -n "$res" ] && got[$side]+="$res"$'\n'
  done
done

echo "benchmark,config,seconds_to_bleu,wall_seconds,step,precision,runs_reached" >"$OUT/quality.csv"
{
  echo "# time to valid BLEU >= $TARGET (toy translation: tiny preset, sinusoidal positions, seed 1)"
  echo
  echo "- $(date -u '+%Y-%m-%d %H:%M UTC'), $cpu, $THREADS threads; PyTorch with OPENBLAS_CORETYPE=${best_ct:-(unset)}"
  echo "- the median of $RUNS runs per side (the run with the median training seconds), sides alternating"
  echo
  echo "| side | training s to BLEU $TARGET | wall s (with validation) | step | runs that reached it | all runs' training s |"
  echo "|---|---:|---:|---:|---:|---|"
} >"$OUT/quality.md"
for side in $sides; do
  name=$([ "$side" = pytorch ] && echo "PyTorch fp32" || echo "graft $side")
  lines=$(printf '%s' "${got[$side]:-}" | sed '/^$/d' | sort -n)
  n=$(printf '%s' "$lines" | grep -c . || true)
  k=$(( (RUNS + 1) / 2 ))  # the median's rank, a run that missed the target counting as slowest
  if [ "$n" -lt "$k" ]; then
    echo "| $name | not reached in most runs | | | $n of $RUNS | |" >>"$OUT/quality.md"
    echo "time_to_bleu_$TARGET,$name,,,,${side/pytorch/fp32},$n" >>"$OUT/quality.csv"
    continue
  fi
  read -r secs wall step <<<"$(sed -n "${k}p" <<<"$lines" | awk '{ printf "%.1f %.1f %s", $1, $2, $3 }')"
  all=$(awk '{ printf "%s%.1f", NR > 1 ? " " : "", $1 }' <<<"$lines")
  echo "| $name | $secs | $wall | $step | $n of $RUNS | $all |" >>"$OUT/quality.md"
  echo "time_to_bleu_$TARGET,$name,$secs,$wall,$step,${side/pytorch/fp32},$n" >>"$OUT/quality.csv"
done
cat "$OUT/quality.md"
