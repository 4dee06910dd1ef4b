#!/usr/bin/env bash
# text::LlamaTokenizer against Python's sentencepiece (docs/hub-models.md#tokenizers-sentencepiece-llama-2-mistral-v01):
# a Llama-2-style SentencePiece BPE (byte fallback, split digits, the dummy prefix, identity
# normalisation, 4000 pieces) trained here by sentencepiece on every 8th line of the fortune files
# (the eight languages, the file sets of bpe_reference.sh); on every line both sides give the same
# ids with the BOS and the same decoded text, and the same decoded text of 3000 random id rows
# (byte pieces that make invalid UTF-8, special tokens among them). spm_ids checks the streaming
# decoder against decode on every row.
#   tests/spm_reference.sh BUILD_DIR SPM_IDS                 (sentencepiece from BUILD/pyvenv)
#   tests/spm_reference.sh --transformers BUILD_DIR SPM_IDS  the ids against transformers'
#                                                            LlamaTokenizerFast too
# --transformers takes GRAFT_HF_VENV (a venv with transformers and sentencepiece) or else
# BUILD/torch-venv (make interop), and skips (77) without them; never installs.
# Exit 0 when nothing differs, 1 naming the first difference, 77 (skipped) without the package
# (no PyPI) or the fortune files.
set -uo pipefail
hf=
if [[ ${1:-} == --transformers ]]; then hf=1; shift; fi
build=$(cd "$1" && pwd)
ids_bin=$2
src=$(cd "$(dirname "$0")/.." && pwd)
fortunes=/usr/share/games/fortunes

skip() { echo "spm_reference: skipped: $*"; exit 77; }
fail() { echo "spm_reference: FAILED: $*"; exit 1; }

if [[ -n $hf ]]; then
  venv=${GRAFT_HF_VENV:-$build/torch-venv}
  VPY=$venv/bin/python
  [[ -x $VPY ]] && "$VPY" -c 'import transformers, sentencepiece' 2>/dev/null ||
    skip "no transformers + sentencepiece in '$venv' (set GRAFT_HF_VENV or run make interop)"
else
  # shellcheck source=bench/pyvenv.sh
  source "$src/bench/pyvenv.sh"
  pyvenv "$build/pyvenv" sentencepiece || skip "the sentencepiece package could not be had from PyPI"
fi

[ -d "$fortunes" ] || skip "no $fortunes (make fortunes installs them)"
brazil=$(dpkg -L fortunes-br 2>/dev/null | grep "^$fortunes/[^/]*$" | grep -v '\.dat$' | sort)
[ -n "$brazil" ] || skip "fortunes-br is not installed (make fortunes)"
list() { find "$@" -type f ! -name '*.dat' ! -name '*.u8' | sort; }
all=()
mapfile -t english < <(list "$fortunes" -maxdepth 1 | grep -vxF "$brazil")
all+=("${english[@]}")
for lang in de es it pl cs ga; do
  [ -d "$fortunes/$lang" ] || skip "no $fortunes/$lang (make fortunes installs fortunes-$lang)"
  mapfile -t lang_files < <(list "$fortunes/$lang")
  all+=("${lang_files[@]}")
done
mapfile -t brazil_files <<<"$brazil"
all+=("${brazil_files[@]}")

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Lines the fortunes lack: leading, trailing and repeated spaces, digit runs, characters outside
# the vocabulary (byte fallback), "▁" itself, tabs, a lone space, an empty line, invalid UTF-8.
printf '%s\n' '  two leading' 'trailing   ' 'a  b   c' '1234567 12 3.14159' \
  $'\xf0\x9f\x98\x80 \xe6\xbc\xa2\xe5\xad\x97 \xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd' \
  $'\xe2\x96\x81mark \xe2\x96\x81\xe2\x96\x81' $'tab\there' ' ' '' $'not UTF-8: \xff' \
  $'crlf\r' >"$work/extra.txt"
all+=("$work/extra.txt")

py=$src/tests/spm_reference.py
start=$(date +%s.%N)
"$VPY" "$py" train "$work" "${all[@]}" || fail "training the model failed"
trained=$(date +%s.%N)
# The Python side (sentencepiece, or transformers) beside graft's, each timing itself.
mode=reference
[[ -n $hf ]] && mode=hf
("$VPY" "$py" "$mode" "$work" "${all[@]}" >"$work/py.log" 2>&1 || { cat "$work/py.log"; fail "the Python side ($mode) failed"; }
 date +%s.%N >"$work/py_end") &
python_side=$!
"$ids_bin" "$work/llama.model" "${all[@]}" >"$work/lines.graft" || fail "spm_ids failed"
cpp_end=$(date +%s.%N)
wait "$python_side" || exit 1
py_end=$(cat "$work/py_end")
if [[ -n $hf ]]; then
  cut -f1 "$work/lines.graft" >"$work/hf.graft"
  "$VPY" "$py" compare "$work" hf || exit 1
else
  "$ids_bin" --decode "$work/llama.model" "$work/random.ids" >"$work/random.graft" || fail "spm_ids --decode failed"
  "$VPY" "$py" compare "$work" lines random || exit 1
fi
awk -v s="$start" -v t="$trained" -v c="$cpp_end" -v p="$py_end" 'BEGIN {
  printf "spm_reference: training %.1f s; then side by side: Python %.1f s, graft %.1f s (one thread: encode, decode and the stream per distinct line)\n", t - s, p - t, c - t }'
echo "spm_reference: passed"
