#!/usr/bin/env bash
# models::load_hf_causal_lm against transformers: tests/hf_reference.py with the Python of
# GRAFT_HF_VENV (a ready venv with torch + transformers) or else BUILD/torch-venv (made by
# `make interop`); without either, skipped (exit 77). Never installs anything.
# Usage: hf_reference.sh BUILD HF_LM_CHECK
set -euo pipefail
build=$1
check=$2
venv=${GRAFT_HF_VENV:-$build/torch-venv}
usable() { [[ -x $venv/bin/python ]] && "$venv/bin/python" -c 'import torch, transformers' 2>/dev/null; }
if [[ -n ${GRAFT_HF_VENV:-} ]] && ! usable; then
  echo "hf_reference: GRAFT_HF_VENV='$GRAFT_HF_VENV' has no python with torch + transformers" >&2
  exit 1
fi
if ! usable; then
  echo "hf_reference: skipped: no torch + transformers in '$venv' (set GRAFT_HF_VENV or run make interop)"
  exit 77
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/graft_hf_reference_XXXXXX")
trap 'rm -rf "$work"' EXIT
"$venv/bin/python" "$(dirname "$0")/hf_reference.py" "$check" "$work"
