#!/usr/bin/env bash
# The CTranslate2 section of `make bench` (bench/run.sh runs it after its own report; it also runs
# alone):
#   bench/ct2_bench.sh [BUILD_DIR] [MD]      (defaults: build, bench/results/latest.md)
# graft and CTranslate2 on the same weights: graft_bench --what save_model writes the decoding
# rows' seeded model (tiny, small, base) as a translate run directory, and
# examples/translation/ct2_convert.py converts it (float32, and int8 for the int8 rows). Then,
# side by side, one process per configuration: greedy and beam 4 at batch 32 (new tokens/s) and at
# batch 1 (ms per sentence; the median of CT2_LATENCY_ROUNDS, default 7, alternating pairs of
# processes), float32 against float32, int8 against int8 (CTranslate2's int8 rows
# always, graft's only where graft_bench takes --precision int8 on this CPU), bf16 against bf16
# where CTranslate2 has a bf16 CPU type here (not on this AMD EPYC: it refuses bfloat16). Writes bench/results/latest_ct2.jsonl and replaces (or appends) the section
# "graft vs CTranslate2" of MD. Skips with a message, exit 0, when ctranslate2 cannot be had.
# CTranslate2 runs at its default and with CT2_FORCE_CPU_ISA=AVX512 (CT2_ISAS, default "default
# AVX512"); each row of the report takes the faster. Peak RSS: the whole process, loading, and
# decoding after loading (VmHWM reset through /proc/self/clear_refs on both sides).
set -euo pipefail

cd "$(dirname "$0")/.."
BUILD=${1:-build}
MD=${2:-bench/results/latest.md}
THREADS=${BENCH_THREADS:-2}
CONFIGS=${BENCH_CONFIGS:-tiny small base}
OUT=bench/results
mkdir -p "$OUT"

source bench/pyvenv.sh
if ! pyvenv "$BUILD/pyvenv" ctranslate2 numpy; then
  echo "bench: CTranslate2 rows skipped: ctranslate2 cannot be installed into $BUILD/pyvenv (no PyPI?)" >&2
  exit 0
fi
GB="$BUILD/bench/graft_bench"
[ -x "$GB" ] || cmake --build "$BUILD" -j"$THREADS" --target graft_bench >/dev/null

export OMP_NUM_THREADS=$THREADS
WORK=$(mktemp -d /tmp/ct2_bench.XXXXXX)
RES=$WORK/results.jsonl
LOGS=$OUT/ct2_bench.log
: >"$LOGS"
trap 'rm -rf "$WORK"' EXIT
START=$(date +%s)
LOAD=$(cut -d' ' -f1-3 /proc/loadavg)

source bench/results_lib.sh  # result

# The models: the seeded weights of graft_bench's decoding rows, converted once in float32 and
# once in int8 (CTranslate2's int8 rows load the int8 model, as its users deploy one).
for c in $CONFIGS; do
  "$GB" --what save_model --config "$c" --out "$WORK/$c.run" >/dev/null
  "$VPY" examples/translation/ct2_convert.py --run "$WORK/$c.run" --out "$WORK/$c.f32" >/dev/null
  "$VPY" examples/translation/ct2_convert.py --run "$WORK/$c.run" --out "$WORK/$c.int8" --quantization int8 >/dev/null
done
first=${CONFIGS%% *}
info=$("$VPY" bench/ct2_peer.py --what info --model "$WORK/$first.f32" --threads "$THREADS" | grep '^RESULT ' || true)
echo "bench: CTranslate2 ${info#RESULT }" >&2
CT2_BF16=false
grep -q '"bfloat16": true' <<<"$info" && CT2_BF16=true
# graft's int8 rows: only where graft_bench takes --precision int8 here (the option exists and
# the CPU has the kernel); one sentence of tiny decoded is the probe.
if probe=$("$GB" --what greedy --config tiny --batch 1 --warmup 0 --steps 1 --precision int8 2>&1 >/dev/null); then
  GRAFT_INT8="measured (graft_bench --precision int8)"
  INT8=true
else
  GRAFT_INT8="not measured: graft_bench refuses --precision int8 here ($(head -1 <<<"$probe"))"
  INT8=false
fi
GB_BF16=false
"$GB" --what kernels | grep -q '"bf16_available":true' && GB_BF16=true
echo "bench: graft int8 rows: $GRAFT_INT8; bf16 rows: $($CT2_BF16 && $GB_BF16 && echo yes ||
  echo "no (CTranslate2 bfloat16 on this CPU: $CT2_BF16, graft bf16 kernel: $GB_BF16)")" >&2

# pair C WHAT BATCH PREC CT2_TYPE MODEL GRAFT: graft's row (when GRAFT is true), then
# CTranslate2's on the same work; at float32 CTranslate2's ids are compared with graft's. One
# sentence (batch 1) runs LATENCY_ROUNDS such pairs, the two sides alternating, and the report
# takes each side's median over them and, as the ratio, the median of the rounds' ratios: a
# one-sentence run lasts milliseconds, and this VM's speed drifts by a third from minute to minute.
LATENCY_ROUNDS=${CT2_LATENCY_ROUNDS:-7}
# CTranslate2's best configuration on a CPU is its default or its AVX-512 kernels forced (on AMD it
# picks AVX2): both run, each row of the report takes the faster (ct2_peer.py --report).
# CT2_ISAS=default runs the default alone.
CT2_ISAS=${CT2_ISAS:-default AVX512}
if ! [[ $LATENCY_ROUNDS =~ ^[1-9][0-9]?$ ]]; then
  echo "bench: CT2_LATENCY_ROUNDS must be a whole number from 1 to 99, got '$LATENCY_ROUNDS'" >&2
  exit 2
fi
pair() {
  local c=$1 what=$2 batch=$3 prec=$4 ct=$5 model=$6 graft=$7
  local ids=$WORK/$c.$what.$batch.$prec.ids rounds=1 i
  [ "$batch" = 1 ] && rounds=$LATENCY_ROUNDS
  for ((i = 0; i < rounds; ++i)); do
    $graft && result graft "$GB" --what "$what" --config "$c" --batch "$batch" --warmup 1 --steps 5 \
      --precision "$prec" --ids "$ids"
    local cmp=() isa
    [ "$prec" = fp32 ] && [ -s "$ids" ] && cmp=(--graft-ids "$ids")
    for isa in $CT2_ISAS; do
      local set_isa=(-u CT2_FORCE_CPU_ISA)
      [ "$isa" = default ] || set_isa=("CT2_FORCE_CPU_ISA=$isa")
      result ct2 env "${set_isa[@]}" "$VPY" bench/ct2_peer.py --what "$what" \
        --config "$c" --batch "$batch" --warmup 1 --steps 5 --compute-type "$ct" --model "$model" \
        --threads "$THREADS" "${cmp[@]}"
    done
  done
}

for c in $CONFIGS; do
  echo "bench: CTranslate2 against graft, $c" >&2
  for what in greedy beam; do
    for batch in 32 1; do
      pair "$c" "$what" "$batch" fp32 float32 "$WORK/$c.f32" true
      pair "$c" "$what" "$batch" int8 int8 "$WORK/$c.int8" $INT8
      if $CT2_BF16 && $GB_BF16; then pair "$c" "$what" "$batch" bf16 bfloat16 "$WORK/$c.f32" true; fi
    done
  done
done

META=$WORK/meta.json
CPU=$(lscpu | sed -n 's/^Model name: *//p' | head -1) DATE=$(date -u '+%Y-%m-%d %H:%M UTC') LOAD=$LOAD \
  THREADS=$THREADS GRAFT_INT8=$GRAFT_INT8 INFO=${info#RESULT } ROUNDS=$LATENCY_ROUNDS SECONDS_TAKEN=$(( $(date +%s) - START )) \
  "$VPY" -c '
import json, os
e = os.environ
info = json.loads(e["INFO"] or "{}")
meta = {"date": e["DATE"], "cpu": e["CPU"], "threads": int(e["THREADS"]), "load": e["LOAD"],
        "graft_int8": e["GRAFT_INT8"], "seconds": int(e["SECONDS_TAKEN"]),
        "latency_rounds": int(e["ROUNDS"])}
meta.update({"ct2_" + k: v for k, v in info.items() if k != "what"})
print(json.dumps(meta))' >"$META"
cp "$RES" "$OUT/latest_ct2.jsonl"
"$VPY" bench/ct2_peer.py --report "$RES" --meta "$META" --md "$MD"
[ -s "$LOGS" ] || rm -f "$LOGS"
echo "bench: CTranslate2 section done in $(( $(date +%s) - START ))s; wrote $OUT/latest_ct2.jsonl and its section of $MD" >&2
