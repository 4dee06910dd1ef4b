#!/usr/bin/env bash
# text::WordPiece against Hugging Face `tokenizers` on all-MiniLM-L6-v2's tokenizer.json
# (docs/wordpiece.md): the same ids, [CLS] and [SEP] included and nothing truncated, on every line
# of the fortune files, English and the seven others (de es it pl cs ga, and fortunes-br's), and
# the same normalisation of every code point (each BertNormalizer step alone) and the same
# pre-tokenizer class (punctuation, whitespace, neither).
#   tests/wordpiece_reference.sh BUILD_DIR WORDPIECE_IDS
# A line is what '\n' ends (a '\r' stays in it). A line that is not UTF-8 has no ids: Python's
# strict decoder refuses it and WordPiece throws; both sides write "invalid" for it, so it is
# compared too (both must refuse the same lines), and counted.
# The lowercasing of code points that ICU does not know yet (newer than its Unicode version) is
# not compared: `tokenizers` lowercases with Rust's newer tables.
# Exit 0 when nothing differs, 1 naming the first difference, 77 (skipped) without the model,
# the tokenizers package or the fortune files.
set -uo pipefail
build=$(cd "$1" && pwd)
ids_bin=$2
src=$(cd "$(dirname "$0")/.." && pwd)
model=$build/pretrained/all-MiniLM-L6-v2
fortunes=/usr/share/games/fortunes

skip() { echo "wordpiece_reference: skipped: $*"; exit 77; }
fail() { echo "wordpiece_reference: FAILED: $*"; exit 1; }

"$src/examples/embed/fetch_model.sh" "$model" || skip "the model could not be fetched (examples/embed/fetch_model.sh)"
# shellcheck source=bench/pyvenv.sh
source "$src/bench/pyvenv.sh"
pyvenv "$build/pyvenv" tokenizers || skip "the tokenizers package could not be had from PyPI"

# The file sets: English is the files directly in $fortunes less fortunes-br's; the others are
# the regular files (not the links) of each language's directory. .dat and .u8 are indices and links.
[ -d "$fortunes" ] || skip "no $fortunes (make fortunes installs them)"
brazil=$(dpkg -L fortunes-br 2>/dev/null | grep "^$fortunes/[^/]*$" | grep -v '\.dat$' | sort)
[ -n "$brazil" ] || skip "fortunes-br is not installed (make fortunes)"
list() { find "$@" -type f ! -name '*.dat' ! -name '*.u8' | sort; }
english=$(list "$fortunes" -maxdepth 1 | grep -vxF "$brazil")
sets=(english)
declare -A files=([english]=$english [br]=$brazil)
for lang in de es it pl cs ga; do
  [ -d "$fortunes/$lang" ] || skip "no $fortunes/$lang (make fortunes installs fortunes-$lang)"
  files[$lang]=$(list "$fortunes/$lang")
  sets+=("$lang")
done
sets+=(br)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
all=()
for set in "${sets[@]}"; do
  mapfile -t set_files <<<"${files[$set]}"
  all+=("${set_files[@]}")
  printf '%s %s\n' "$set" "${#set_files[@]}" >>"$work/sets"
done

# tokenizers' side: the same line split and the same output form as wordpiece_ids.
py_start=$(date +%s.%N)
"$VPY" - "$model/tokenizer.json" "${all[@]}" >"$work/reference" <<'PY' || fail "the tokenizers side failed"
import sys
from tokenizers import Tokenizer

tok = Tokenizer.from_file(sys.argv[1])
tok.no_truncation()
tok.no_padding()
out = sys.stdout
for path in sys.argv[2:]:
    out.write("# %s\n" % path)
    data = open(path, "rb").read()
    lines = data.split(b"\n") if data else []
    if data.endswith(b"\n"):
        lines.pop()
    texts = []
    for line in lines:
        try:
            texts.append(line.decode("utf-8"))
        except UnicodeDecodeError:
            texts.append(None)
    valid = [t for t in texts if t is not None]
    encoded = iter(tok.encode_batch(valid))
    for t in texts:
        out.write("invalid\n" if t is None else " ".join(map(str, next(encoded).ids)) + "\n")
PY
py_end=$(date +%s.%N)
"$ids_bin" "$model" "${all[@]}" >"$work/graft" || fail "wordpiece_ids failed"
cpp_end=$(date +%s.%N)

"$VPY" - "$work/reference" "$work/graft" "$work/sets" "$py_start" "$py_end" "$cpp_end" <<'PY' || exit 1
import sys
ref_path, ours_path, sets_path = sys.argv[1:4]
py_start, py_end, cpp_end = map(float, sys.argv[4:7])
ref = open(ref_path, encoding="utf-8").read().split("\n")
ours = open(ours_path, encoding="utf-8").read().split("\n")
sets = [(name, int(n)) for name, n in (l.split() for l in open(sets_path))]
if len(ref) != len(ours):
    print("wordpiece_reference: FAILED: %d output lines from tokenizers, %d from graft" % (len(ref), len(ours)))
    sys.exit(1)
files = lines = invalid = differing = 0
first = None
path = line_no = None
per_file = {}
for r, o in zip(ref, ours):
    if r.startswith("# "):
        if r != o:
            print("wordpiece_reference: FAILED: the files are out of step: %r, %r" % (r, o))
            sys.exit(1)
        path, line_no = r[2:], 0
        files += 1
        per_file[path] = 0
        continue
    if not r and not o:
        continue
    line_no += 1
    lines += 1
    per_file[path] += 1
    invalid += r == "invalid"
    if r != o:
        differing += 1
        if first is None:
            first = (path, line_no, r, o)
# Per set: files and lines, in the order the script gave the files.
order = list(per_file)
at = 0
for name, n in sets:
    chunk = order[at:at + n]
    at += n
    print("wordpiece_reference: %-7s %3d files, %6d lines" % (name, len(chunk), sum(per_file[p] for p in chunk)))
print("wordpiece_reference: %d files, %d lines (%d not UTF-8, refused by both), %d lines differing; "
      "tokenizers %.2f s (encode_batch, its threads), graft %.2f s (one thread)"
      % (files, lines, invalid, differing, py_end - py_start, cpp_end - py_end))
if first:
    path, n, r, o = first
    print("wordpiece_reference: FAILED: first difference at %s:%d\n  tokenizers: %s\n  graft:      %s" % (path, n, r, o))
    sys.exit(1)
PY

# Every code point through each BertNormalizer step alone and the pre-tokenizer, both sides.
"$VPY" - "$model/tokenizer.json" >"$work/chars_reference" <<'PY' || fail "the tokenizers character sweep failed"
import sys
from tokenizers import normalizers, pre_tokenizers

def step(**on):
    opts = dict(clean_text=False, handle_chinese_chars=False, strip_accents=False, lowercase=False)
    opts.update(on)
    return normalizers.BertNormalizer(**opts)

steps = [step(clean_text=True), step(handle_chinese_chars=True), step(strip_accents=True), step(lowercase=True)]
pre = pre_tokenizers.BertPreTokenizer()
out = []
for c in range(0x110000):
    if 0xD800 <= c < 0xE000:
        continue
    s = chr(c)
    texts = [" ".join("%X" % ord(x) for x in n.normalize_str(s)) for n in steps]
    words = [w for w, _ in pre.pre_tokenize_str("a" + s + "b")]
    kind = "P" if len(words) == 3 else "W" if len(words) == 2 else "-"
    out.append("%X|%s|%s\n" % (c, "|".join(texts), kind))
sys.stdout.write("".join(out))
PY
"$ids_bin" --chars >"$work/chars_graft" || fail "wordpiece_ids --chars failed"
"$VPY" - "$work/chars_reference" "$work/chars_graft" <<'PY' || exit 1
import sys
ref = open(sys.argv[1], encoding="utf-8").read().splitlines()
ours = open(sys.argv[2], encoding="utf-8").read().splitlines()
assert len(ref) == len(ours), (len(ref), len(ours))
names = ["clean_text", "handle_chinese_chars", "strip_accents", "lowercase", "pre-tokenizer"]
differing = unknown = unknown_lowered = 0
first = None
for r, o in zip(ref, ours):
    rf, of = r.split("|"), o.split("|")
    new = len(of) == 7 and of[6] == "u"
    unknown += new
    unknown_lowered += new and rf[4] != of[4]
    cols = [i for i in range(1, 6) if rf[i] != of[i] and not (new and i == 4)]
    if cols:
        differing += 1
        if first is None:
            first = "U+%s %s: tokenizers %r, graft %r" % (rf[0], names[cols[0] - 1], rf[cols[0]], of[cols[0]])
print("wordpiece_reference: %d code points, %d differing (lowercasing not compared for the %d unassigned in "
      "ICU's Unicode, %d of which tokenizers lowercases)" % (len(ref), differing, unknown, unknown_lowered))
if first:
    print("wordpiece_reference: FAILED: first difference at " + first)
    sys.exit(1)
PY
echo "wordpiece_reference: passed"
