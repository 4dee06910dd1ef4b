#!/usr/bin/env bash
# graft's Marian against CTranslate2 at Opus-MT's shape (issue 50 item 5; `make bench-marian`).
#
#   bench/marian_bench.sh BUILD
#
# 1. bench/marian_make.py (torch + transformers + sentencepiece from $GRAFT_HF_VENV when set, else
#    BUILD/torch-venv as `make interop` makes it): a random MarianMTModel at Opus-MT's shape with a
#    tokenizer trained on the English fortunes, and the source sentences (fortune lines), under
#    BUILD/marian-bench (kept between runs); ct2-transformers-converter converts it once in
#    float32 and once with --quantization int8.
# 2. Each configuration in its own process at $MARIAN_BENCH_THREADS threads (default 2): for each
#    beam of $MARIAN_BENCH_BEAMS (default "1 4"), batch 32 ($MARIAN_BENCH_SENTENCES sentences,
#    default 64) and batch 1 (the first $MARIAN_BENCH_ONE, default 8), fp32 and int8: marian_bench
#    (graft), then bench/marian_peer.py (CTranslate2, compute_type float32 on the float32 model,
#    int8 on the int8 model) at its default ISA and, on a CPU with AVX-512, with
#    CT2_FORCE_CPU_ISA=AVX512; at most $MARIAN_BENCH_MAX_LEN new tokens (default 32), median of
#    $MARIAN_BENCH_REPEATS repeats (default 3). CTranslate2's ids are compared with graft's of the
#    same precision.
# 3. Each configuration's RESULT lines (with the 1-minute load average before it and the
#    OMP_WAIT_POLICY both sides inherit, "default" when unset) go to
#    BUILD/marian-bench/rows/BEAM.BATCH.PRECISION.WAIT.jsonl, replaced when that configuration
#    runs again;
#    bench/marian_peer.py --report turns every rows file into bench/results/marian_ct2.md.
set -euo pipefail
BUILD=${1:?usage: bench/marian_bench.sh BUILD}
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=$BUILD/marian-bench
THREADS=${MARIAN_BENCH_THREADS:-2}
REPEATS=${MARIAN_BENCH_REPEATS:-3}
SENTENCES=${MARIAN_BENCH_SENTENCES:-64}
ONE=${MARIAN_BENCH_ONE:-8}
MAX_LEN=${MARIAN_BENCH_MAX_LEN:-32}
BEAMS=${MARIAN_BENCH_BEAMS:-1 4}
MB=$BUILD/bench/marian_bench
WAIT=${OMP_WAIT_POLICY:-default}  # both sides' OpenMP wait policy, as the environment sets it
source "$HERE/pyvenv.sh"

# HF_PY with ctranslate2 as well (its converter and its runtime).
peer_python() {
  hf_python "$BUILD"
  "$HF_PY" -c 'import ctranslate2' 2>/dev/null && return 0
  if [ -n "${GRAFT_HF_VENV:-}" ]; then
    echo "marian_bench: $HF_PY (GRAFT_HF_VENV) cannot import ctranslate2" >&2
    exit 1
  fi
  pyvenv "$BUILD/torch-venv" ctranslate2
}

# OUT/ct2-NAME: the model converted by ct2-transformers-converter (ARGS: its extra options).
convert() {
  local name=$1; shift
  [ -f "$OUT/ct2-$name/model.bin" ] && return 0
  rm -rf "$OUT/ct2-$name"
  "$(dirname "$HF_PY")/ct2-transformers-converter" --model "$OUT/model" \
    --output_dir "$OUT/ct2-$name" "$@" >"$OUT/ct2-$name.log" 2>&1 ||
    { echo "marian_bench: ct2-transformers-converter failed, see $OUT/ct2-$name.log" >&2; exit 1; }
}

# Appends "SIDE {RESULT json, load}" for each RESULT line of stdin to the file ROWS (and shows
# every line on stderr).
record() {
  local side=$1 rows=$2 load=$3 line
  while IFS= read -r line; do
    echo "$line" >&2
    case $line in RESULT\ *) echo "$side {\"load\": \"$load\", \"omp_wait\": \"$WAIT\", ${line#RESULT \{}" >>"$rows" ;; esac
  done
}

# One configuration: graft, then CTranslate2 at each ISA.
run_config() {
  local beam=$1 batch=$2 prec=$3 n=$SENTENCES isa load
  [ "$batch" = 1 ] && n=$ONE
  local tag=$beam.$batch.$prec rows=$OUT/rows/$beam.$batch.$prec.$WAIT.jsonl
  local ct=float32 model=$OUT/ct2-f32
  [ "$prec" = int8 ] && ct=int8 model=$OUT/ct2-int8
  : >"$rows.part"
  load=$(cut -d' ' -f1 /proc/loadavg)
  echo "marian_bench: beam $beam, batch $batch, $prec: graft (load $load)" >&2
  OMP_NUM_THREADS=$THREADS "$MB" --hf "$OUT/model" --text "$OUT/sources.txt" --sentences "$n" \
    --batch "$batch" --beam "$beam" --max-len "$MAX_LEN" --precision "$prec" --repeats "$REPEATS" \
    --src-ids "$OUT/src.$n.ids" --ids "$OUT/graft.$tag.ids" | record graft "$rows.part" "$load"
  for isa in $ISAS; do
    local set_isa=(-u CT2_FORCE_CPU_ISA)
    [ "$isa" = default ] || set_isa=("CT2_FORCE_CPU_ISA=$isa")
    load=$(cut -d' ' -f1 /proc/loadavg)
    echo "marian_bench: beam $beam, batch $batch, $prec: CTranslate2 $ct, ISA $isa (load $load)" >&2
    env "${set_isa[@]}" "$HF_PY" "$HERE/marian_peer.py" --model "$model" --compute-type "$ct" \
      --src-ids "$OUT/src.$n.ids" --batch "$batch" --beam "$beam" --max-len "$MAX_LEN" \
      --repeats "$REPEATS" --threads "$THREADS" --graft-ids "$OUT/graft.$tag.ids" |
      record ct2 "$rows.part" "$load"
  done
  mv "$rows.part" "$rows"
}

# META: the CPU, the threads, the date, CTranslate2's version and backend (ct2_peer.py --what info).
write_meta() {
  local info
  info=$("$HF_PY" "$HERE/ct2_peer.py" --what info --model "$OUT/ct2-f32" --threads "$THREADS" |
    grep '^RESULT ' | cut -c8-)
  CPU=$(lscpu | sed -n 's/^Model name: *//p' | head -1) DATE=$(date -u '+%Y-%m-%d %H:%M UTC') \
    THREADS=$THREADS INFO=$info "$HF_PY" -c '
import json, os
e = os.environ
info = json.loads(e["INFO"])
print(json.dumps({"date": e["DATE"], "cpu": e["CPU"], "threads": int(e["THREADS"]),
                  "ct2_version": info["version"], "ct2_backend": info.get("backend", "?")}))' \
    >"$OUT/meta.json"
}

main() {
  [ -x "$MB" ] || { echo "marian_bench: build marian_bench first ($MB)" >&2; exit 1; }
  peer_python
  mkdir -p "$OUT/rows"
  "$HF_PY" "$HERE/marian_make.py" "$OUT" "$SENTENCES"
  convert f32
  convert int8 --quantization int8
  ISAS=default
  grep -qw avx512f /proc/cpuinfo && ISAS="default AVX512"
  local beam batch prec
  for beam in $BEAMS; do
    for batch in 32 1; do
      for prec in fp32 int8; do run_config "$beam" "$batch" "$prec"; done
    done
  done
  write_meta
  cat "$OUT"/rows/*.jsonl >"$OUT/results.jsonl"
  "$HF_PY" "$HERE/marian_peer.py" --report "$OUT/results.jsonl" --meta "$OUT/meta.json" \
    --md "$HERE/results/marian_ct2.md"
}

main
