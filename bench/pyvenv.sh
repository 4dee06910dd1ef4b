# Sourced by the scripts that use PyPI packages (the CTranslate2 check and peer, the PyTorch 2.x
# peer). The library and its programs never need them.
#   source bench/pyvenv.sh; pyvenv DIR PACKAGE...
# Creates the virtual environment DIR (under the build folder) when it is missing, installs those
# of the packages that do not import yet, and sets VPY to its interpreter. Returns 1, with a
# message on stderr, when the environment cannot be made or a package cannot be installed (no
# network, no wheel for this platform): callers that are tests then skip.
pyvenv() {
  local dir=$1; shift
  local spec mod missing=()
  if [ ! -x "$dir/bin/python" ]; then
    python3 -m venv "$dir" >&2 || { echo "pyvenv: cannot create $dir (python3 -m venv)" >&2; return 1; }
  fi
  for spec in "$@"; do
    mod=${spec%%[=<>]*}
    mod=${mod//-/_}
    "$dir/bin/python" -c "import $mod" 2>/dev/null || missing+=("$spec")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "pyvenv: installing ${missing[*]} into $dir" >&2
    "$dir/bin/pip" install -q --disable-pip-version-check "${missing[@]}" >&2 ||
      { echo "pyvenv: pip could not install ${missing[*]}" >&2; return 1; }
  fi
  VPY=$dir/bin/python
}

# hf_python BUILD: sets HF_PY to an interpreter with torch + transformers + sentencepiece +
# safetensors + numpy: $GRAFT_HF_VENV's when set (used as it is), else BUILD/torch-venv (made, or
# completed, by pyvenv as `make interop` makes it). Used by bench/hf_peers.sh and
# bench/marian_bench.sh.
hf_python() {
  if [ -n "${GRAFT_HF_VENV:-}" ]; then
    HF_PY=$GRAFT_HF_VENV/bin/python
  else
    pyvenv "$1/torch-venv" torch transformers sentencepiece safetensors numpy
    HF_PY=$VPY
  fi
}
