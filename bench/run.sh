#!/usr/bin/env bash
# `make bench`: graft and PyTorch side by side, same machine, same run, same thread count.
#   bench/run.sh [BUILD_DIR]      (default: build)
# Prints one markdown table and writes bench/results/latest.csv and bench/results/latest.md.
# Every configuration runs in its own process on each side, so peak RSS is per configuration.
set -euo pipefail

cd "$(dirname "$0")/.."
BUILD=${1:-build}
THREADS=${BENCH_THREADS:-2}
CONFIGS=${BENCH_CONFIGS:-tiny small base}  # a subset is only for smoke tests
OUT=bench/results
mkdir -p "$OUT"

source bench/torch_env.sh  # python3-torch, OpenBLAS (openmp) as the BLAS: sets PY, SUDO, blas

# ---- graft in Release ------------------------------------------------------------------------
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j"$THREADS" --target graft_bench >/dev/null
GB="$BUILD/bench/graft_bench"

export OMP_NUM_THREADS=$THREADS
unset OPENBLAS_CORETYPE OPENBLAS_NUM_THREADS MKL_NUM_THREADS || true
RES=$(mktemp /tmp/graft_bench.XXXXXX.jsonl)
LOGS=$(mktemp /tmp/graft_bench.XXXXXX.log)
trap 'rm -f "$RES"; [ -s "$LOGS" ] || rm -f "$LOGS"' EXIT
START=$(date +%s)
LOAD=$(cut -d' ' -f1-3 /proc/loadavg)

# ---- BLAS check: pick the faster OpenBLAS core type and compare with oneDNN ----------------
echo "bench: sgemm peak and OpenBLAS core type" >&2
g1024=$("$GB" --what sgemm --n 1024 | grep '^RESULT ')
pick_openblas_coretype
[ -n "$best_ct" ] && export OPENBLAS_CORETYPE=$best_ct
gg=$(field "$g1024" gflops)
ratio=$(awk -v a="$best_gf" -v b="$gg" 'BEGIN { printf "%.2f", a / b }')
echo "  1024^3 sgemm: graft/oneDNN $gg GFLOP/s, PyTorch/OpenBLAS $best_gf GFLOP/s" \
     "(OPENBLAS_CORETYPE=${best_ct:-(unset)}): PyTorch/graft = $ratio" >&2
if awk -v r="$ratio" 'BEGIN { exit !(r < 0.8) }'; then
  echo "  WARNING: PyTorch's BLAS reaches less than 80% of oneDNN on 1024^3" >&2
fi
echo "graft ${g1024#RESULT }" >>"$RES"
echo "pytorch ${best_line#RESULT }" >>"$RES"
result graft "$GB" --what sgemm --n 2048
result pytorch $PY bench/torch_peer.py --what sgemm --n 2048
result graft "$GB" --what stream  # memory bandwidth: decoding's weight reads are measured against it

# ---- the oneDNN kernels, and bf16 where this CPU has a bf16 kernel ---------------------------
kern=$("$GB" --what kernels | grep '^RESULT ')
kernel_f32=$(sed -n 's/.*"f32":"\([^"]*\)".*/\1/p' <<<"$kern")
kernel_bf16=$(sed -n 's/.*"bf16":"\([^"]*\)".*/\1/p' <<<"$kern")
BF16=false
grep -q '"bf16_available":true' <<<"$kern" && BF16=true
echo "  oneDNN matmul kernels: f32 $kernel_f32, bf16 $kernel_bf16 (bf16 rows: $BF16)" >&2
$BF16 && result graft "$GB" --what sgemm --n 2048 --precision bf16

# ---- op microbenchmarks ----------------------------------------------------------------------
echo "bench: op microbenchmarks (forward + backward)" >&2
result graft "$GB" --what micro
result pytorch $PY bench/torch_peer.py --what micro

# ---- training steps: warm-up 2, median of 21 / 9 / 5 (tiny / small / base) --------------------
# More steps where they are cheap: a shorter step is more exposed to a burst of noise from other
# tenants of the machine.
echo "bench: training steps" >&2
for c in $CONFIGS; do
  case $c in tiny) n=21 ;; small) n=9 ;; *) n=5 ;; esac
  result graft "$GB" --what train --config "$c" --warmup 2 --steps $n
  result pytorch $PY bench/torch_peer.py --what train --config "$c" --warmup 2 --steps $n
  if $BF16; then
    result graft "$GB" --what train --config "$c" --warmup 2 --steps $n --precision bf16
    result pytorch $PY bench/torch_peer.py --what train --config "$c" --warmup 2 --steps $n --precision bf16
  fi
done

# ---- Hessian-vector products: warm-up 1, median of 5, against a training step's forward and
# backward in the same process (graft_bench --what hvp). PyTorch 2.x's side is in torch2.sh:
# 1.13 has no torch.nn.attention.sdpa_kernel to put attention on its double-differentiable path.
echo "bench: Hessian-vector products" >&2
for c in $CONFIGS; do
  result graft "$GB" --what hvp --config "$c" --warmup 1 --steps 5
done

# ---- decoding: 32 sources x 32 tokens, 32 new tokens, warm-up 1, median of 5 ----------------
echo "bench: decoding" >&2
for what in greedy beam; do
  for c in $CONFIGS; do
    result graft "$GB" --what "$what" --config "$c" --warmup 1 --steps 5
    result pytorch $PY bench/torch_peer.py --what "$what" --config "$c" --warmup 1 --steps 5
  done
done
for c in $CONFIGS; do  # the KV-cached PyTorch peers (greedy, beam 4), and bf16 greedy on both sides
  result pytorch $PY bench/torch_peer.py --what greedy_cached --config "$c" --warmup 1 --steps 5
  result pytorch $PY bench/torch_peer.py --what beam_cached --config "$c" --warmup 1 --steps 5
  if $BF16; then
    result graft "$GB" --what greedy --config "$c" --warmup 1 --steps 5 --precision bf16
    result pytorch $PY bench/torch_peer.py --what greedy_cached --config "$c" --warmup 1 --steps 5 --precision bf16
  fi
done
# The cached peers must decode what nn.Transformer's full recomputation decodes.
for what in greedy beam; do
  for c in $CONFIGS; do
    if cached_peer_differs pytorch "$what" "$c"; then
      echo "bench: the KV-cached PyTorch $what peer decodes other ids than nn.Transformer ($c): refusing its numbers" >&2
      exit 1
    fi
  done
done

# ---- the zoo: make lm's LM and make classify's classifier, fp32 (bench/graft_bench.cpp) --------
# lm_train: 16 x 128 tokens a step, warm-up 2, median of 21; lm_sample: 32 prompts x 32 bytes, 64
# new tokens sampled with a KV cache, warm-up 1 (4 new tokens), median of 9; cls_train: 512 lines
# a step, warm-up 2, median of 9; cls_infer: the 512 lines in batches of 64, median of 9.
echo "bench: the zoo (lm, classify)" >&2
for spec in "lm_train 2 21" "lm_sample 1 9" "cls_train 2 9" "cls_infer 2 9"; do
  read -r what w n <<<"$spec"
  result graft "$GB" --what "$what" --warmup "$w" --steps "$n"
  result pytorch $PY bench/torch_peer.py --what "$what" --warmup "$w" --steps "$n"
done

# ---- PyTorch 2.x from PyPI: eager and torch.compile (bench/torch2.sh; skipped with a message
# where the virtual environment cannot be had; BENCH_TORCH2=0 skips it) -----------------------
torch2_json="" torch2_tuning="" torch2_missing="BENCH_TORCH2=0"
if [ "${BENCH_TORCH2:-1}" != 0 ]; then
  source bench/torch2.sh
  torch2_rows
fi

# ---- report ----------------------------------------------------------------------------------
META=$(mktemp /tmp/graft_bench.XXXXXX.json)
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
torchv=$($PY bench/torch_peer.py --what version)
cat >"$META" <<EOF
{"date": "$(date -u '+%Y-%m-%d %H:%M UTC')", "cpu": "$cpu", "nproc": $(nproc), "threads": $THREADS,
 "load": "$LOAD", "torch": "$torchv", "blas": "$(basename "$(dirname "$blas")") ($(basename "$blas"))",
 "coretype": "$best_ct", "graft_1024": $gg, "kernel_f32": "$kernel_f32", "kernel_bf16": "$kernel_bf16",
 "bf16_available": $BF16, "torch_1024": $best_gf, "blas_ratio": $ratio,
 "torch2": ${torch2_json:-null}, "torch2_tuning": "$torch2_tuning", "torch2_missing": "$torch2_missing",
 "seconds": $(( $(date +%s) - START ))}
EOF
$PY bench/torch_peer.py --report "$RES" --meta "$META" --csv "$OUT/latest.csv" --md "$OUT/latest.md"
cp "$RES" "$OUT/latest.jsonl"
rm -f "$META"

# ---- CTranslate2 on the same weights: its own section of latest.md (bench/ct2_bench.sh; PyPI's
# ctranslate2 in $BUILD/pyvenv, skipped with a message where it cannot be had) ----------------
./bench/ct2_bench.sh "$BUILD" "$OUT/latest.md" || echo "bench: the CTranslate2 section failed" >&2
# ---- loading base, file to first token: fp32, bf16 and int8, exports and converted (bench/load_bench.sh)
./bench/load_bench.sh "$BUILD" "$OUT/latest.md" || echo "bench: the loading section failed" >&2
# ---- sentence embeddings of a pretrained encoder against sentence-transformers (bench/embed_bench.sh)
./bench/embed_bench.sh "$BUILD" "$OUT/latest.md" || echo "bench: the sentence-embedding section failed" >&2
echo "bench: done in $(( $(date +%s) - START ))s; wrote $OUT/latest.csv and $OUT/latest.md" >&2
