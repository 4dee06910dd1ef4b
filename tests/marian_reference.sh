#!/usr/bin/env bash
# models::load_hf_marian against transformers: tests/marian_reference.py with the Python of
# GRAFT_HF_VENV (a ready venv with torch + transformers) or else BUILD/torch-venv (made by
# `make interop`); without either, skipped (exit 77). Never installs anything.
# Usage: marian_reference.sh BUILD MARIAN_CHECK
set -euo pipefail
build=$1
check=$2
venv=${GRAFT_HF_VENV:-$build/torch-venv}
if [[ ! -x $venv/bin/python ]] || ! "$venv/bin/python" -c 'import torch, transformers' 2>/dev/null; then
  echo "marian_reference: skipped: no torch + transformers in '$venv' (set GRAFT_HF_VENV or run make interop)"
  exit 77
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/graft_marian_reference_XXXXXX")
trap 'rm -rf "$work"' EXIT
"$venv/bin/python" "$(dirname "$0")/marian_reference.py" "$check" "$work"
