#!/usr/bin/env bash
# The PyTorch 2.x peer of `make bench`: PyPI's torch in a cached virtual environment under the
# build folder (bench/pyvenv.sh; never in CI, never the system python), the same torch_peer.py
# workloads eager and under torch.compile.
#   Sourced by bench/run.sh, which then calls torch2_rows (it uses run.sh's result, field, RES,
#   CONFIGS, BF16, BUILD, and GB for graft's training rows run again next to these). Sets
#   torch2_json (torch_peer.py --what config), torch2_tuning and, where the environment cannot be
#   had, torch2_missing (the rows are then skipped).
#   Alone: bench/torch2.sh [BUILD_DIR] [OUT.jsonl]   (default: build, bench/results/torch2.jsonl)
#   runs only this side (BENCH_CONFIGS, BENCH_THREADS as run.sh; for checks and previews).
#
# MKL on AMD: the wheel's MKL (statically linked into libtorch_cpu, its symbols exported and
# called through the PLT) asks mkl_serv_intel_cpu_true() whether the CPU is Intel's; on an AMD
# EPYC it answers no, mkl_serv_cpu_detect() gives branch 0 (the generic one) and
# MKL_ENABLE_INSTRUCTIONS is ignored. bench/mkl_intel_shim.c, preloaded, answers yes: the branch
# is then 7 (AVX-512; 5 under MKL_ENABLE_INSTRUCTIONS=AVX2), which is how users tune MKL on AMD.
# On Zen 4 (2026-11, MKL 2024.2, 1 thread, loaded machine) it gave ~100-105 against ~87-91
# GFLOP/s. The 1024^3 sgemm, best of 3 processes, picks with or without it, as a user tuning the
# machine would; both sgemm rows, both micro rows and the untuned fp32 training rows stay in the
# table. MKL_DEBUG_CPU_TYPE=5, the old switch, is read by no MKL since 2020.1.

# torch2_venv BUILD: the environment's interpreter in T2, or 1 with torch2_missing set.
torch2_venv() {
  source bench/pyvenv.sh
  local start=$SECONDS
  if ! pyvenv "$1/torch-venv" torch numpy; then
    torch2_missing="pip could not install torch into $1/torch-venv"
    echo "bench: no PyTorch 2.x ($torch2_missing): carrying on with PyTorch 1.13 alone" >&2
    return 1
  fi
  T2=$VPY
  echo "bench: PyTorch 2.x: $("$T2" bench/torch_peer.py --what version) in $1/torch-venv" \
       "(ready after $(( SECONDS - start ))s)" >&2
}

# torch2_pick_mkl BUILD: builds the shim, times PyTorch 2.x's 1024^3 sgemm without and with it
# (best of 3 processes each), records both, and sets T2PRE (the LD_PRELOAD the rows run with)
# and torch2_tuning.
torch2_pick_mkl() {
  local shim pre line gf l g best_gf=0 tag
  shim="$(cd "$1" && pwd)/mkl_intel_shim.so"  # absolute: torch.compile's workers run elsewhere
  T2PRE="" torch2_tuning="none (MKL's own dispatch)"
  if ! cc -shared -fPIC -O2 -o "$shim" bench/mkl_intel_shim.c 2>>"$LOGS"; then
    echo "  cannot build bench/mkl_intel_shim.c: PyTorch 2.x runs MKL's own dispatch" >&2
    return 0
  fi
  for pre in "" "$shim"; do
    tag=${pre:+mkl-shim}
    line="" gf=0
    for _ in 1 2 3; do
      l=$(LD_PRELOAD=$pre "$T2" bench/torch_peer.py --what sgemm --n 1024 --tag "$tag" 2>>"$LOGS" | grep '^RESULT ' || true)
      g=$(field "$l" gflops)
      if awk -v a="$g" -v b="$gf" 'BEGIN { exit !(a > b) }'; then line=$l gf=$g; fi
    done
    [ -n "$line" ] && echo "pytorch2 ${line#RESULT }" >>"$RES"
    echo "  PyTorch 2.x 1024^3 sgemm, ${tag:-untuned}: $gf GFLOP/s (best of 3)" >&2
    if awk -v a="$gf" -v b="$best_gf" 'BEGIN { exit !(a > b) }'; then
      best_gf=$gf T2PRE=$pre
    fi
  done
  if [ -n "$T2PRE" ]; then torch2_tuning="LD_PRELOAD of bench/mkl_intel_shim.c (MKL's AVX-512 kernels; tag mkl-shim)"; fi
  echo "  PyTorch 2.x rows run with: $torch2_tuning" >&2
}

# t2 [--compile] ARGS...: one PyTorch 2.x measurement with the picked tuning.
t2() {
  local tag=${T2PRE:+mkl-shim}
  result pytorch2 env LD_PRELOAD="$T2PRE" "$T2" bench/torch_peer.py --tag "$tag" "$@"
}

# graft_again ARGS...: graft's training row once more, right before the PyTorch 2.x row it is
# compared with (run.sh's GB; nothing when this file runs alone). The report takes the median of
# graft's runs of a row: this VM's speed drifts by 10% over the minutes between run.sh's graft row
# and these, and one run decided base training's ratio either way (docs/performance.md).
graft_again() {
  if [ -n "${GB:-}" ]; then result graft "$GB" "$@"; fi
}

# torch2_rows: the whole PyTorch 2.x side.
torch2_rows() {
  echo "bench: PyTorch 2.x (PyPI), eager and torch.compile" >&2
  torch2_venv "$BUILD" || return 0
  torch2_missing=""
  if ! torch2_json=$("$T2" bench/torch_peer.py --what config 2>>"$LOGS"); then
    torch2_json="" torch2_missing="$T2 bench/torch_peer.py --what config failed"
    echo "bench: no PyTorch 2.x rows ($torch2_missing)" >&2
    return 0
  fi
  echo "  $torch2_json" >&2
  torch2_pick_mkl "$BUILD"
  local c n mode what spec w pre pres=("")
  [ -n "$T2PRE" ] && pres+=("$T2PRE")
  for pre in "${pres[@]}"; do  # the 2048^3 sgemm and the op micro rows, untuned and tuned
    result pytorch2 env LD_PRELOAD="$pre" "$T2" bench/torch_peer.py --what sgemm --n 2048 \
      --tag "${pre:+mkl-shim}"
    result pytorch2 env LD_PRELOAD="$pre" "$T2" bench/torch_peer.py --what micro --tag "${pre:+mkl-shim}"
  done
  for c in $CONFIGS; do  # as run.sh's training rows
    case $c in tiny) n=21 ;; small) n=9 ;; *) n=5 ;; esac
    if [ -n "$T2PRE" ]; then  # fp32 without the tuning too: what MKL's own dispatch costs a step
      result pytorch2 "$T2" bench/torch_peer.py --what train --config "$c" --warmup 2 --steps $n
    fi
    for mode in "" --compile; do
      graft_again --what train --config "$c" --warmup 2 --steps $n
      t2 $mode --what train --config "$c" --warmup 2 --steps $n
      if $BF16; then
        graft_again --what train --config "$c" --warmup 2 --steps $n --precision bf16
        t2 $mode --what train --config "$c" --warmup 2 --steps $n --precision bf16
      fi
    done
  done
  for c in $CONFIGS; do  # as run.sh's Hessian-vector products (eager)
    t2 --what hvp --config "$c" --warmup 1 --steps 5
  done
  for c in $CONFIGS; do  # as run.sh's decoding rows
    for mode in "" --compile; do
      for what in greedy beam greedy_cached beam_cached; do
        t2 $mode --what "$what" --config "$c" --warmup 1 --steps 5
      done
      if $BF16; then t2 $mode --what greedy_cached --config "$c" --warmup 1 --steps 5 --precision bf16; fi
    done
  done
  torch2_check_cached
  for spec in "lm_train 2 21" "lm_sample 1 9" "cls_train 2 9" "cls_infer 2 9"; do  # the zoo
    read -r what w n <<<"$spec"
    for mode in "" --compile; do
      t2 $mode --what "$what" --warmup "$w" --steps "$n"
    done
  done
}

# torch2_check_cached: the KV-cached 2.x peers (eager) must decode what nn.Transformer's full
# recomputation decodes, as run.sh checks 1.13's; a mismatch is reported, not fatal (the
# compiled rows may differ in the last bits, so only eager is compared).
torch2_check_cached() {
  local what c
  for what in greedy beam; do
    for c in $CONFIGS; do
      if cached_peer_differs pytorch2 "$what" "$c" '.*"compile": false'; then
        echo "bench: WARNING: the KV-cached PyTorch 2.x $what peer decodes other ids than nn.Transformer ($c)" >&2
      fi
    done
  done
}

# ---- alone: only this side --------------------------------------------------------------------
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  cd "$(dirname "$0")/.."
  BUILD=${1:-build}
  RES=${2:-bench/results/torch2.jsonl}
  THREADS=${BENCH_THREADS:-2}
  CONFIGS=${BENCH_CONFIGS:-tiny small base}
  export OMP_NUM_THREADS=$THREADS
  BF16=false
  grep -qw avx512_bf16 /proc/cpuinfo && BF16=true  # as oneDNN's bf16 kernel check in run.sh
  LOGS=$(mktemp /tmp/graft_torch2.XXXXXX.log)
  START=$(date +%s)
  : >"$RES"
  source bench/results_lib.sh  # field, result
  torch2_missing=""
  torch2_rows
  echo "bench: PyTorch 2.x side done in $(( $(date +%s) - START ))s; wrote $RES (log $LOGS)" >&2
fi
