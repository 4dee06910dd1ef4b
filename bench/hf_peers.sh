#!/usr/bin/env bash
# graft against llama.cpp on Hugging Face decoders (issue 50 item 5; `make bench-hf`).
#
#   bench/hf_peers.sh BUILD [smollm] [tinyllama]      (default: both)
#
# 1. The peer: llama-cpp-python 0.3.36 built from its PyPI sdist, CPU only, -march=native
#    (GGML_NATIVE), into BUILD/llama-venv (once; nice -n 19 under the shared build lock
#    $GRAFT_BUILD_LOCK, default /tmp/graft-build.lock). The sdist's vendor/llama.cpp gives
#    convert_hf_to_gguf.py and its gguf-py.
# 2. Random-weight checkpoints at SmolLM-135M's and TinyLlama-1.1B's shapes, F32 and BF16
#    (bench/hf_peers_make.py, with torch + transformers from $GRAFT_HF_VENV when set, else
#    BUILD/torch-venv as `make interop` makes it), converted to GGUF F32, BF16 (from the BF16
#    file) and Q8_0 (from the F32 file), all under BUILD/hf-bench (kept between runs).
# 3. Each configuration in its own process at $HF_PEERS_THREADS threads (default 2):
#    hf_lm_bench (graft fp32/bf16/int8) and bench/hf_peers_llama.py (llama.cpp F32/BF16/Q8_0),
#    prompt 512, generation 128, $HF_PEERS_REPEATS repeats (default 3); plus a triad for the
#    machine's bandwidth. RESULT lines go to BUILD/hf-bench/results.jsonl and the table
#    (bench/hf_peers_table.py) to bench/results/hf_llama.md.
set -euo pipefail
BUILD=${1:?usage: bench/hf_peers.sh BUILD [smollm] [tinyllama]}
shift
MODELS=("$@")
[ ${#MODELS[@]} -gt 0 ] || MODELS=(smollm tinyllama)
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=$BUILD/hf-bench
THREADS=${HF_PEERS_THREADS:-2}
REPEATS=${HF_PEERS_REPEATS:-3}
LLAMA_VERSION=0.3.36
LOCK=${GRAFT_BUILD_LOCK:-/tmp/graft-build.lock}
SRC=$BUILD/llama-src/llama_cpp_python-$LLAMA_VERSION
source "$HERE/pyvenv.sh"

# The sdist, unpacked under BUILD/llama-src (the converter and the package's sources).
llama_sdist() {
  [ -f "$SRC/vendor/llama.cpp/convert_hf_to_gguf.py" ] && return 0
  mkdir -p "$BUILD/llama-src"
  pip download --no-binary :all: --no-deps -q "llama-cpp-python==$LLAMA_VERSION" -d "$BUILD/llama-src"
  tar xzf "$SRC.tar.gz" -C "$BUILD/llama-src"
}

# BUILD/llama-venv with llama_cpp built from the sdist (CPU only, this CPU's instruction set).
llama_venv() {
  local py=$BUILD/llama-venv/bin/python
  "$py" -c 'import llama_cpp' 2>/dev/null && return 0
  llama_sdist
  [ -x "$py" ] || python3 -m venv "$BUILD/llama-venv"
  "$BUILD/llama-venv/bin/pip" install -q --disable-pip-version-check numpy
  echo "hf_peers: building llama-cpp-python $LLAMA_VERSION from source (many minutes)" >&2
  CMAKE_ARGS="-DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_BLAS=OFF -DGGML_NATIVE=ON -DLLAMA_CURL=OFF" \
    CMAKE_BUILD_PARALLEL_LEVEL=2 nice -n 19 flock "$LOCK" \
    "$BUILD/llama-venv/bin/pip" install -q --disable-pip-version-check "$SRC.tar.gz"
}

# OUT/NAME-OUTTYPE.gguf from the checkpoint directory SOURCE (convert_hf_to_gguf.py).
gguf_file() {
  local name=$1 src=$2 type=$3 f=$OUT/$1-$3.gguf
  [ -f "$f" ] && return 0
  nice -n 10 "$HF_PY" "$SRC/vendor/llama.cpp/convert_hf_to_gguf.py" "$src" --outfile "$f.part" \
    --outtype "$type" >"$f.log" 2>&1 ||
    { echo "hf_peers: convert_hf_to_gguf.py failed, see $f.log" >&2; return 1; }
  mv "$f.part" "$f"
}

# OUT/NAME-{f32,bf16} and NAME-{f32,bf16,q8_0}.gguf (BF16 from the BF16 file, Q8_0 from F32).
make_models() {
  local name=$1
  nice -n 10 "$HF_PY" "$HERE/hf_peers_make.py" "$OUT" "$name"
  gguf_file "$name" "$OUT/$name-f32" f32
  gguf_file "$name" "$OUT/$name-bf16" bf16
  gguf_file "$name" "$OUT/$name-f32" q8_0
}

# Appends `{"model": NAME, ...RESULT json}` lines to results.jsonl.
record() {
  local name=$1 line
  while IFS= read -r line; do
    case $line in RESULT\ *) echo "{\"model\":\"$name\",${line#RESULT \{}" >>"$OUT/results.jsonl" ;; esac
  done
}

# Each precision of NAME on both sides: graft precision, the checkpoint it loads, the GGUF type.
run_model() {
  local name=$1 row p dir g
  for row in fp32:f32:f32 bf16:bf16:bf16 int8:f32:q8_0; do
    IFS=: read -r p dir g <<<"$row"
    echo "hf_peers: $name graft $p" >&2
    OMP_NUM_THREADS=$THREADS "$BUILD/bench/hf_lm_bench" --hf "$OUT/$name-$dir" --precision "$p" \
      --repeats "$REPEATS" | tee /dev/stderr | record "$name"
    echo "hf_peers: $name llama.cpp $g" >&2
    "$BUILD/llama-venv/bin/python" "$HERE/hf_peers_llama.py" "$OUT/$name-$g.gguf" \
      --threads "$THREADS" --repeats "$REPEATS" | tee /dev/stderr | record "$name"
  done
}

main() {
  mkdir -p "$OUT"
  [ -x "$BUILD/bench/hf_lm_bench" ] || { echo "hf_peers: build hf_lm_bench first" >&2; exit 1; }
  llama_venv
  llama_sdist
  hf_python "$BUILD"  # HF_PY (bench/pyvenv.sh)
  local name
  for name in "${MODELS[@]}"; do make_models "$name"; done
  : >"$OUT/results.jsonl"
  OMP_NUM_THREADS=$THREADS "$BUILD/bench/hf_lm_bench" --triad | record machine
  for name in "${MODELS[@]}"; do run_model "$name"; done
  python3 "$HERE/hf_peers_table.py" "$OUT" >"$HERE/results/hf_llama.md"
  cat "$HERE/results/hf_llama.md"
}

main
