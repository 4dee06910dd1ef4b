#!/usr/bin/env bash
# `make bench-mpi`: data-parallel training on this machine (docs/data-parallel.md). The toy
# translation task, the same global batches (4096 target tokens), each preset trained STEPS steps
# as 1 rank x 1 thread, 1 rank x NCORES threads, and NCORES ranks x 1 thread with the gradient sums
# overlapping backward and without; prints target tokens/s and the share of the training time spent
# waiting for the sums after backward, then a scaling model for 8 and 64 ranks over 10 and 100 Gb/s
# from the measured compute per step and gradient bytes. With BLEU_STEPS=N it also trains the
# demo's recipe N steps in one process and on NCORES ranks and prints both test BLEUs.
#   bench/data_parallel.sh [BUILD_DIR]
set -euo pipefail

cd "$(dirname "$0")/.."
BUILD=${1:-build}
PRESETS=${DP_PRESETS-tiny small}  # empty: BLEU only
STEPS=${DP_STEPS:-40}
CORES=${DP_CORES:-$(nproc)}
BUCKET_MB=${DP_BUCKET_MB:-1}  # small enough that even tiny's 4 MB of gradients make several buckets
T=$BUILD/examples/translation/translate
W=$(mktemp -d /tmp/graft_dp_bench.XXXXXX)
trap '[[ -n ${KEEP:-} ]] || rm -rf "$W"' EXIT
command -v mpirun >/dev/null || { echo "bench-mpi: mpirun not found (apt-get install openmpi-bin)" >&2; exit 1; }

echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $CORES cores; $(mpirun --version | head -1)"
"$T" generate-data --out "$W/data" --seed 1 --train 50000 --valid 200 --test 1000 >/dev/null
# The demo's recipe; validation only at the end, so tokens/s is training alone.
RECIPE=(--data "$W/data" --batch-tokens 4096 --lr-factor 1 --warmup 400 --label-smoothing 0.1 --dropout 0.1
        --vocab 1000 --seed 1 --positions relative)

# train RANKS THREADS NAME ARGS...: one run; prints "tokens/s wait_share_percent grad_MB buckets".
train() {
  local ranks=$1 threads=$2 name=$3
  shift 3
  local launch=()
  if ((ranks > 1)); then launch=(bash tests/mpi/mpirun.sh mpirun "$ranks"); fi
  OMP_NUM_THREADS=$threads "${launch[@]}" "$T" train "${RECIPE[@]}" --out "$W/$name" "$@" \
    >"$W/$name.out" 2>"$W/$name.err" || { cat "$W/$name.err" >&2; exit 1; }
  local tps wait mb buckets
  tps=$(sed -n 's/.*(\([0-9.]*\) target tokens\/s).*/\1/p' "$W/$name.out" | tail -1)
  wait=$(sed -n 's/.*waited .* s for the sums after backward (\([0-9.]*\)% of.*/\1/p' "$W/$name.err" | tail -1)
  mb=$(sed -n 's/.*(\([0-9.]*\) MB a step.*/\1/p' "$W/$name.err" | tail -1)
  buckets=$(sed -n 's/.*, \([0-9]*\) gradient bucket.*/\1/p' "$W/$name.err" | tail -1)
  echo "$tps ${wait:--} ${mb:--} ${buckets:--}"
}

[[ -n $PRESETS ]] && {
  echo "| preset | ranks x threads | overlap | target tokens/s | waiting for the sums (share of training) |"
  echo "|---|---|---|---:|---:|"
  for p in $PRESETS; do
    args=(--preset "$p" --steps "$STEPS" --valid-every 100000)
    read -r t11 _ _ < <(train 1 1 "$p-1x1" "${args[@]}")
    read -r t1n _ _ < <(train 1 "$CORES" "$p-1x$CORES" "${args[@]}")
    read -r tn1 wn1 mb nb < <(train "$CORES" 1 "$p-${CORES}x1" "${args[@]}" --bucket-mb "$BUCKET_MB")
    read -r tno wno _ _ < <(train "$CORES" 1 "$p-${CORES}x1-no" "${args[@]}" --bucket-mb "$BUCKET_MB" --no-overlap)
    echo "| $p | 1 x 1 | | $t11 | |"
    echo "| $p | 1 x $CORES | | $t1n | |"
    echo "| $p | $CORES x 1 | on ($nb buckets of $BUCKET_MB MiB) | $tn1 | $wn1% |"
    echo "| $p | $CORES x 1 | off | $tno | $wno% |"
    echo "$p $t1n $mb" >>"$W/model.in"
  done
} | tee "$W/table.md"

# The scaling model: ranks = machines like this one, each running 1 rank x CORES threads and
# keeping a 4096-token batch (the global batch grows with the ranks). A step is the measured
# compute c = 4096 / (tokens/s at 1 x CORES) plus a ring allreduce of the gradient bytes B,
# 2 (N-1)/N B / bandwidth + 2 (N-1) x 50 us of latency per bucket (buckets of 25 MiB, as one
# would take across hosts); with overlap at most the backward (taken as 2/3 of c) hides it.
# Efficiency: c / step.
[[ -s $W/model.in ]] && echo && python3 - "$W/model.in" <<'PY'
import math, sys
print("| preset | gradient MB (buckets) | compute s/step | ranks | link | allreduce s/step | efficiency without / with overlap |")
print("|---|---:|---:|---:|---|---:|---|")
for line in open(sys.argv[1]):
    p, tps, mb = line.split()
    buckets = math.ceil(float(mb) * 1e6 / (25 << 20))
    c = 4096 / float(tps)
    B = float(mb) * 1e6
    for n in (8, 64):
        for gbps in (10, 100):
            a = 2 * (n - 1) / n * B / (gbps * 1e9 / 8) + buckets * 2 * (n - 1) * 50e-6
            no, ov = c + a, c + max(0.0, a - 2 * c / 3)
            print(f"| {p} | {mb} ({buckets}) | {c:.3f} | {n} | {gbps} Gb/s | {a:.3f} | {100 * c / no:.1f}% / {100 * c / ov:.1f}% |")
PY

if [[ -n ${BLEU_STEPS:-} ]]; then
  echo
  for ranks in 1 "$CORES"; do
    threads=$((ranks == 1 ? CORES : 1))
    train "$ranks" "$threads" "bleu-$ranks" --preset tiny --steps "$BLEU_STEPS" --valid-every 150 >/dev/null
    OMP_NUM_THREADS=$CORES "$T" evaluate --run "$W/bleu-$ranks" --data "$W/data/test.tsv" >"$W/bleu-$ranks.eval" 2>&1
    echo "$ranks rank(s) x $threads thread(s), $BLEU_STEPS steps: $(grep -m1 "^BLEU" "$W/bleu-$ranks.eval")"
  done
fi
