#!/usr/bin/env bash
# The ctest `embed_reference`: graft's all-MiniLM-L6-v2 embeddings of 1000 fortune sentences
# against sentence-transformers on PyTorch (tests/embed_reference.py): identical token ids and a
# cosine of at least 0.99999 each. Skips (exit 77) when the model or the PyPI packages (torch,
# sentence-transformers, in BUILD/torch-venv as `make bench` and `make interop` make it) cannot
# be had: they are never installed by `make test`.
#   tests/embed_reference.sh BUILD_DIR
set -uo pipefail
build=$(cd "$1" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
model=$build/pretrained/all-MiniLM-L6-v2
venv=$build/torch-venv
"$root/examples/embed/fetch_model.sh" "$model" || { echo "embed_reference: SKIP: no model (fetch_model.sh failed)"; exit 77; }
if ! "$venv/bin/python" -c "import sentence_transformers, torch" 2>/dev/null; then
  echo "embed_reference: SKIP: no sentence-transformers in $venv (make interop or make bench installs it)"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# 1000 sentences: the first 1000 of the English fortunes collection `make embed` searches.
"$root/examples/embed/fortunes_collection.sh" >"$work/all.txt" || exit 1
head -1000 "$work/all.txt" >"$work/sentences.txt"
[ "$(wc -l < "$work/sentences.txt")" = 1000 ] || { echo "embed_reference: could not gather 1000 fortunes"; exit 1; }
max_len=$(python3 -c "import json; print(json.load(open('$model/sentence_bert_config.json'))['max_seq_length'])")
"$build/examples/embed/embed" encode --model "$model" --in "$work/sentences.txt" --out "$work/graft.safetensors" || exit 1
"$build/examples/embed/embed" tokenize --model "$model" --max-len "$max_len" < "$work/sentences.txt" > "$work/ids.txt" || exit 1
"$venv/bin/python" "$root/tests/embed_reference.py" "$model" "$work/sentences.txt" "$work/graft.safetensors" "$work/ids.txt"
