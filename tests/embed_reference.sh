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
# 1000 sentences: the fortunes of the English topic files, one per line (lines joined by spaces),
# the first 1000 of 20 or more characters, in file order.
python3 - "$work/sentences.txt" <<'PY'
import glob, os, sys
out = []
for path in sorted(glob.glob("/usr/share/games/fortunes/*.u8")):
    with open(path, encoding="utf-8", errors="strict") as f:
        try:
            text = f.read()
        except UnicodeDecodeError:
            continue
    for fortune in text.split("\n%\n"):
        s = " ".join(fortune.split())
        if len(s) >= 20 and len(out) < 1000:
            out.append(s)
with open(sys.argv[1], "w", encoding="utf-8") as f:
    f.write("".join(s + "\n" for s in out))
PY
[ "$(wc -l < "$work/sentences.txt")" = 1000 ] || { echo "embed_reference: could not gather 1000 fortunes"; exit 1; }
max_len=$(python3 -c "import json; print(json.load(open('$model/sentence_bert_config.json'))['max_seq_length'])")
"$build/examples/embed/embed" encode --model "$model" --in "$work/sentences.txt" --out "$work/graft.safetensors" || exit 1
"$build/examples/embed/embed" tokenize --model "$model" --max-len "$max_len" < "$work/sentences.txt" > "$work/ids.txt" || exit 1
"$venv/bin/python" "$root/tests/embed_reference.py" "$model" "$work/sentences.txt" "$work/graft.safetensors" "$work/ids.txt"
