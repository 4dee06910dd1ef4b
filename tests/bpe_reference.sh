#!/usr/bin/env bash
# text::ByteLevelBPE against Hugging Face `tokenizers` (docs/hub-models.md): three byte-level BPE
# tokenizers trained here by tokenizers on the fortune files, in the shapes of GPT-2 (ByteLevel
# pre-tokenizer with its regex, merges written as "a b" strings, a RoBERTa-style lstrip <mask>),
# Llama 3 (Split with the cl100k pattern then ByteLevel without regex, ignore_merges, a BOS
# template inside a Sequence post-processor) and Qwen2 (Split with Qwen2's pattern, the NFC
# normaliser, a normalised non-special added token), each with special added tokens. On every
# line of the fortune files (English and the seven others, the file sets of
# wordpiece_reference.sh) and of some lines written here (the added tokens, \x0B and \x85,
# decomposed accents, contractions in capitals), both sides give the same ids with and without
# the special tokens, the same decode of the ids without them, and the same decode of the ids
# with them, skipping them.
#   tests/bpe_reference.sh BUILD_DIR BPE_IDS
# A line is what '\n' ends (a '\r' stays in it). A line that is not UTF-8 is "invalid" on both
# sides (Python's strict decoder refuses it, ByteLevelBPE throws), compared and counted.
# Exit 0 when nothing differs, 1 naming the first difference, 77 (skipped) only without the
# tokenizers package (no PyPI) or the fortune files.
set -uo pipefail
build=$(cd "$1" && pwd)
ids_bin=$2
src=$(cd "$(dirname "$0")/.." && pwd)
fortunes=/usr/share/games/fortunes

skip() { echo "bpe_reference: skipped: $*"; exit 77; }
fail() { echo "bpe_reference: FAILED: $*"; exit 1; }

# shellcheck source=bench/pyvenv.sh
source "$src/bench/pyvenv.sh"
pyvenv "$build/pyvenv" tokenizers || skip "the tokenizers package could not be had from PyPI"

# The file sets of wordpiece_reference.sh: English is the files directly in $fortunes less
# fortunes-br's; the others the regular files of each language's directory.
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
# Lines the fortunes lack: every added token, in and between words, with the whitespace lstrip
# takes; \x0B, \x85 and NBSP; a decomposed accent (NFC composes it); contractions in capitals;
# long digit runs; CRLF; emoji; a long word.
printf '%s\n' \
  'Hello<|endoftext|>world' '<|endoftext|>' 'a <|im_start|>user<|im_end|> b' \
  'x   <mask> y' '<mask>' 'graftword graftwordgraftword e'$'\xcc\x81''graftword' \
  'tab'$'\t''vt'$'\x0b''nel'$'\xc2\x85''nbsp'$'\xc2\xa0''end' $'\x0b\x0b'' '$'\xc2\x85' \
  'cafe'$'\xcc\x81'' '$'\xc3\xa9''t'$'\xc3\xa9' "IT'S WE'LL I'M YOU'VE they'D" \
  '1234567 12 3.14159' $'crlf\r' '   leading and trailing   ' \
  $'\xf0\x9f\x98\x80 \xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd' \
  'Pneumonoultramicroscopicsilicovolcanoconiosis-pneumonoultramicroscopicsilicovolcanoconiosis' \
  '<|begin_of_text|>Hi' $'not UTF-8: \xff\xfe' $'\xe2\x82' '' >"$work/extra.txt"
all+=("$work/extra.txt")

start=$(date +%s.%N)
"$VPY" - "$work" "${all[@]}" <<'PY' || fail "training the tokenizers failed"
import json, sys
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers, processors, trainers

work, paths = sys.argv[1], sys.argv[2:]
CL100K = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = CL100K.replace(r"\p{N}{1,3}", r"\p{N}")

def read_lines(path):
    data = open(path, "rb").read()
    lines = data.split(b"\n") if data else []
    if data.endswith(b"\n"):
        lines.pop()
    return lines

def split_then_byte_level(pattern):
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])

def train(tok, specials, sample):
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=3000, min_frequency=2, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(sample, trainer=trainer)
    return tok

lines = {p: read_lines(p) for p in paths}

def decoded(ls):
    out = []
    for l in ls:
        try:
            out.append(l.decode("utf-8"))
        except UnicodeDecodeError:
            out.append(None)
    return out

texts = {p: decoded(ls) for p, ls in lines.items()}
sample = [t for p in paths for t in texts[p][::8] if t]

gpt2 = Tokenizer(models.BPE())
gpt2.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
gpt2 = train(gpt2, ["<|endoftext|>"], sample)
gpt2.post_processor = processors.ByteLevel(trim_offsets=False)
gpt2.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True, normalized=False)])

llama3 = Tokenizer(models.BPE(ignore_merges=True))
llama3.pre_tokenizer = split_then_byte_level(CL100K)
llama3 = train(llama3, ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"], sample)
llama3.post_processor = processors.Sequence([
    processors.ByteLevel(trim_offsets=False),
    processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B",
                                  special_tokens=[("<|begin_of_text|>", llama3.token_to_id("<|begin_of_text|>"))])])

qwen2 = Tokenizer(models.BPE())
qwen2.normalizer = normalizers.NFC()
qwen2.pre_tokenizer = split_then_byte_level(QWEN2)
qwen2 = train(qwen2, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], sample)
qwen2.post_processor = processors.ByteLevel(trim_offsets=False)
qwen2.add_tokens([AddedToken("graftword", normalized=True, special=False)])

def save(name, tok, legacy_merges):
    doc = json.loads(tok.to_str())
    if legacy_merges:
        doc["model"]["merges"] = [" ".join(m) for m in doc["model"]["merges"]]
    with open("%s/%s.json" % (work, name), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False)
    return Tokenizer.from_file("%s/%s.json" % (work, name))

for name, tok, legacy in (("gpt2", gpt2, True), ("llama3", llama3, False), ("qwen2", qwen2, False)):
    save(name, tok, legacy)
PY
trained=$(date +%s.%N)

# tokenizers' side, beside graft's: every distinct line once (both sides give a repeated line
# the row of its first time), in one batch per tokenizer; the ids with
# the special tokens are tokenizers' post_process() of those without, which is what its
# encode(add_special_tokens=True) runs (asserted on every 97th line).
"$VPY" - "$work" "${all[@]}" >"$work/reference.log" 2>&1 <<'PY' &
import sys
from tokenizers import Tokenizer

work, paths = sys.argv[1], sys.argv[2:]

def texts_of(path):
    data = open(path, "rb").read()
    lines = data.split(b"\n") if data else []
    if data.endswith(b"\n"):
        lines.pop()
    out = []
    for line in lines:
        try:
            out.append(line.decode("utf-8"))
        except UnicodeDecodeError:
            out.append(None)
    return out

def write_reference(name, texts):
    tok = Tokenizer.from_file("%s/%s.json" % (work, name))
    valid = list(dict.fromkeys(t for p in paths for t in texts[p] if t is not None))
    encodings = tok.encode_batch(valid, add_special_tokens=False)
    without = [e.ids for e in encodings]
    with_specials = [tok.post_process(e, None, True).ids for e in encodings]
    sample = range(0, len(valid), 97)
    got = tok.encode_batch([valid[i] for i in sample], add_special_tokens=True)
    assert all(e.ids == with_specials[i] for e, i in zip(got, sample)), name
    text = tok.decode_batch(without, skip_special_tokens=False)
    skipped = tok.decode_batch(with_specials, skip_special_tokens=True)
    rows = {t: ("%s\t%s\t%s\t%s\n" % (" ".join(map(str, w)), " ".join(map(str, o)), d1, d2))
            .encode("utf-8", "surrogatepass")
            for t, w, o, d1, d2 in zip(valid, with_specials, without, text, skipped)}
    with open("%s/%s.reference" % (work, name), "wb") as out:
        for path in paths:
            out.write(b"# %s\n" % path.encode())
            out.write(b"".join(b"invalid\n" if t is None else rows[t] for t in texts[path]))

texts = {p: texts_of(p) for p in paths}
for name in ("gpt2", "llama3", "qwen2"):
    write_reference(name, texts)
PY
reference=$!
for name in gpt2 llama3 qwen2; do
  "$ids_bin" "$work/$name.json" "${all[@]}" >"$work/$name.graft" || fail "bpe_ids failed on the $name tokenizer"
done
cpp_end=$(date +%s.%N)
wait "$reference" || { cat "$work/reference.log"; fail "the tokenizers side failed"; }
py_end=$(date +%s.%N)

"$VPY" - "$work" "$start" "$trained" "$cpp_end" "$py_end" <<'PY' || exit 1
import sys
work = sys.argv[1]
start, trained, cpp_end, py_end = map(float, sys.argv[2:6])
failed = False
for name in ("gpt2", "llama3", "qwen2"):
    ref = open("%s/%s.reference" % (work, name), "rb").read().split(b"\n")
    ours = open("%s/%s.graft" % (work, name), "rb").read().split(b"\n")
    if len(ref) != len(ours):
        print("bpe_reference: FAILED: %s: %d output lines from tokenizers, %d from graft" % (name, len(ref), len(ours)))
        sys.exit(1)
    files = lines = invalid = differing = ids = 0
    first = None
    path = line_no = None
    for r, o in zip(ref, ours):
        if r.startswith(b"# "):
            if r != o:
                print("bpe_reference: FAILED: %s: the files are out of step: %r, %r" % (name, r, o))
                sys.exit(1)
            path, line_no, files = r[2:].decode(), 0, files + 1
            continue
        if not r and not o:
            continue
        line_no += 1
        lines += 1
        invalid += r == b"invalid"
        ids += len(r.split(b"\t")[1].split()) if r != b"invalid" else 0
        if r != o:
            differing += 1
            if first is None:
                first = (path, line_no, r, o)
    print("bpe_reference: %-6s %d files, %d lines (%d not UTF-8, refused by both), %d ids, %d lines differing"
          % (name, files, lines, invalid, ids, differing))
    if first:
        path, n, r, o = first
        print("bpe_reference: FAILED: %s: first difference at %s:%d\n  tokenizers: %r\n  graft:      %r" % (name, path, n, r, o))
        failed = True
print("bpe_reference: training %.1f s; then side by side: tokenizers %.1f s (its threads), graft %.1f s "
      "(one thread, two encodes, two decodes and the stream per line)"
      % (trained - start, py_end - trained, cpp_end - trained))
sys.exit(1 if failed else 0)
PY
echo "bpe_reference: passed"
