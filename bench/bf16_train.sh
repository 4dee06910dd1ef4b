#!/usr/bin/env bash
# bf16 training two ways (docs/mixed-precision.md#training-in-bf16-float32-master-weights), the issue-49 training target: the
# same model, data, recipe and seed trained for a fixed number of steps with
#   guard  --precision bf16   float32 weights, grads and moments; matmul operands rounded to bf16
#                             (PrecisionGuard, the mixed precision graft had before)
#   dtype  --dtype bf16       Module::to(bf16): bf16 weights, activations and grads; AdamW keeps
#                             float32 master weights and moments
# and prints the validation loss curves side by side, each run's peak RSS, and, with two seeds or
# more, the noise: the largest gap between two seeds of the same side next to the largest gap
# between the sides. The toy translation task (data/toy, made as bench/quality.sh makes it).
#   bench/bf16_train.sh [BUILD_DIR]
# Environment: BF16_PRESET (base), BF16_STEPS (200), BF16_VALID_EVERY (25), BF16_SEEDS ("1 2"),
# BF16_WARMUP (100), BENCH_THREADS (2), KEEP=1 keeps the runs in runs/bf16-*.
set -euo pipefail

cd "$(dirname "$0")/.."
BUILD=${1:-build}
PRESET=${BF16_PRESET:-base}
STEPS=${BF16_STEPS:-200}
VALID_EVERY=${BF16_VALID_EVERY:-25}
SEEDS=${BF16_SEEDS:-1 2}
WARMUP=${BF16_WARMUP:-100}
THREADS=${BENCH_THREADS:-2}
TRANSLATE=$BUILD/examples/translation/translate
export OMP_NUM_THREADS=$THREADS
[ -x /usr/bin/time ] || { echo "bf16_train: /usr/bin/time is needed for the peak RSS" >&2; exit 1; }
[ -x "$TRANSLATE" ] || { echo "bf16_train: build the translate program first ($TRANSLATE)" >&2; exit 1; }
[ -f data/toy/train.tsv ] ||
  "$TRANSLATE" generate-data --out data/toy --seed 1 --train 50000 --valid 1000 --test 1000 >/dev/null
W=$(mktemp -d "${TMPDIR:-/tmp}/graft_bf16_train.XXXXXX")
trap 'rm -rf "$W"' EXIT

# The same recipe for both sides; only the precision flag differs.
RECIPE=(--data data/toy --preset "$PRESET" --steps "$STEPS" --valid-every "$VALID_EVERY"
        --batch-tokens 4096 --optimizer adamw --lr-factor 1 --warmup "$WARMUP"
        --label-smoothing 0.1 --dropout 0.1 --vocab 1000 --positions sinusoidal)

# train_run SIDE SEED: one run; writes $W/SIDE-SEED.curve ("step valid_loss" lines) and
# $W/SIDE-SEED.rss (peak RSS in MiB).
train_run() {
  local side=$1 seed=$2 run=runs/bf16-$1-$2 flag
  case $side in
    guard) flag=(--precision bf16) ;;
    dtype) flag=(--dtype bf16) ;;
  esac
  rm -rf "$run"
  echo "bf16_train: $side, seed $seed ($PRESET, $STEPS steps)" >&2
  if ! /usr/bin/time -f '%M' -o "$W/$side-$seed.kb" "$TRANSLATE" train "${RECIPE[@]}" \
    --seed "$seed" --out "$run" "${flag[@]}" >"$W/$side-$seed.out" 2>"$W/$side-$seed.err"; then
    echo "bf16_train: the $side run failed:" >&2
    tail -n 5 "$W/$side-$seed.err" >&2
    exit 1
  fi
  valid_curve "$run/metrics.csv" >"$W/$side-$seed.curve"
  echo $(($(tail -n 1 "$W/$side-$seed.kb") / 1024)) >"$W/$side-$seed.rss"
  [[ -n ${KEEP:-} ]] || rm -rf "$run"
}

# valid_curve METRICS_CSV: "step valid_loss" for each row that has a validation.
valid_curve() {
  awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "valid_loss") c = i; next }
           c && $c != "" { print $1, $c }' "$1"
}

# The largest |a - b| over the steps both curves have.
max_gap() {
  join <(sort -k1,1 "$1") <(sort -k1,1 "$2") |
    awk '{ d = $2 - $3; if (d < 0) d = -d; if (d > m) m = d } END { printf "%.4f", m }'
}

# The curves side by side: one row per validation step, one column per run.
print_table() {
  local header="| step |" rule="|---:|" files=()
  for seed in $SEEDS; do
    for side in guard dtype; do
      header+=" $side seed $seed |"
      rule+="---:|"
      files+=("$W/$side-$seed.curve")
    done
  done
  echo "$header"
  echo "$rule"
  awk '{ v[$1] = v[$1] " | " $2; if (!($1 in seen)) { seen[$1] = 1; order[n++] = $1 } }
       END { for (i = 0; i < n; i++) print "| " order[i] v[order[i]] " |" }' "${files[@]}" |
    sort -t'|' -k2,2n
  local rss="| peak RSS (MiB) |"
  for seed in $SEEDS; do
    for side in guard dtype; do rss+=" $(cat "$W/$side-$seed.rss") |"; done
  done
  echo "$rss"
}

# The gap between the sides against the gap between seeds of one side (the noise).
print_noise() {
  local seeds=($SEEDS) worst=0 gap
  for seed in "${seeds[@]}"; do
    gap=$(max_gap "$W/guard-$seed.curve" "$W/dtype-$seed.curve")
    echo "seed $seed: largest valid-loss gap between --dtype bf16 and --precision bf16: $gap"
  done
  ((${#seeds[@]} >= 2)) || return 0
  for side in guard dtype; do
    gap=$(max_gap "$W/$side-${seeds[0]}.curve" "$W/$side-${seeds[1]}.curve")
    echo "noise: largest gap between seeds ${seeds[0]} and ${seeds[1]} of $side: $gap"
  done
}

echo "CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $THREADS threads"
for seed in $SEEDS; do
  for side in guard dtype; do train_run "$side" "$seed"; done
done
print_table
print_noise
