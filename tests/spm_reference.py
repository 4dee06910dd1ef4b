"""The Python side of tests/spm_reference.sh: text::LlamaTokenizer against Python's sentencepiece
(and, with `hf`, transformers' LlamaTokenizerFast) on a Llama-2-style model trained here.
  spm_reference.py train WORK FILE...      WORK/llama.model from every 8th line of the files
  spm_reference.py reference WORK FILE...  WORK/lines.reference: per line the ids (BOS first) and the
                                           hex of their decoding; WORK/random.ids and
                                           WORK/random.reference: random ids and their decoding
  spm_reference.py hf WORK FILE...         WORK/hf.reference: LlamaTokenizerFast's ids per line
  spm_reference.py compare WORK NAME...    WORK/NAME.reference against WORK/NAME.graft
A line is what '\\n' ends; one that is not UTF-8 is "invalid". Decoding leaves out the special
tokens (control and unknown pieces), as transformers' skip_special_tokens does.
"""
import random
import sys

import sentencepiece as spm


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


def train(work, paths):
    sample = [t for p in paths for t in texts_of(p)[::8] if t]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sample), model_prefix=work + "/llama", model_type="bpe",
        vocab_size=4000, byte_fallback=True, split_digits=True, add_dummy_prefix=True,
        normalization_rule_name="identity", remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True, character_coverage=0.9995, unk_id=0, bos_id=1,
        eos_id=2, pad_id=-1, num_threads=2, input_sentence_size=0, minloglevel=2)


def load(work):
    return spm.SentencePieceProcessor(model_file=work + "/llama.model")


def decoded_hex(sp, ids):
    kept = [i for i in ids if not (sp.is_control(i) or sp.is_unknown(i))]
    return sp.decode(kept).encode("utf-8", "surrogatepass").hex()


def write_rows(out_path, paths, texts, row_of):
    with open(out_path, "wb") as out:
        for path in paths:
            out.write(b"# %s\n" % path.encode())
            out.write(b"".join(b"invalid\n" if t is None else row_of[t] for t in texts[path]))


def reference(work, paths):
    sp = load(work)
    texts = {p: texts_of(p) for p in paths}
    valid = list(dict.fromkeys(t for p in paths for t in texts[p] if t is not None))
    ids = sp.encode(valid, add_bos=True)
    row_of = {t: ("%s\t%s\n" % (" ".join(map(str, i)), decoded_hex(sp, i))).encode()
              for t, i in zip(valid, ids)}
    write_rows(work + "/lines.reference", paths, texts, row_of)
    write_random(work, sp)


def random_ids(sp, rng):
    r = rng.random()
    if r < 0.6:
        b = rng.randrange(0xC0, 0xF5) if r < 0.3 else rng.randrange(0x80, 0xC0) if r < 0.55 \
            else rng.randrange(0x20, 0x7F)
        return sp.piece_to_id("<0x%02X>" % b)
    return rng.randrange(0, 3) if r < 0.65 else rng.randrange(0, sp.get_piece_size())


def write_random(work, sp):
    rng = random.Random(50)
    rows = [[random_ids(sp, rng) for _ in range(rng.randrange(1, 17))] for _ in range(3000)]
    with open(work + "/random.ids", "w") as f:
        f.write("".join(" ".join(map(str, r)) + "\n" for r in rows))
    with open(work + "/random.reference", "w") as f:
        f.write("".join(decoded_hex(sp, r) + "\n" for r in rows))


def hf_tokenizer(work):
    """transformers' tokenizer of a directory holding tokenizer.model alone (converted by
    transformers, as a hub checkpoint without tokenizer.json is), with Llama's BOS."""
    import os
    import shutil
    from transformers import AutoTokenizer
    os.makedirs(work + "/hf", exist_ok=True)
    shutil.copy(work + "/llama.model", work + "/hf/tokenizer.model")
    with open(work + "/hf/tokenizer_config.json", "w") as f:
        f.write('{"tokenizer_class": "LlamaTokenizerFast", "add_bos_token": true, "legacy": true}')
    return AutoTokenizer.from_pretrained(work + "/hf")


def kind_of(line):
    """Where transformers' tokenizer may differ from SentencePiece's: "special" for a line holding
    a special token's text, "lead" for one that starts with a space or "▁", else "plain"."""
    if any(s in line for s in ("<s>", "</s>", "<unk>")):
        return "special"
    return "lead" if line[:1] in (" ", "\u2581") else "plain"


def hf(work, paths):
    """WORK/hf.reference: per line transformers' ids of the line and of " " + the line, and the
    line's kind_of."""
    tok = hf_tokenizer(work)
    texts = {p: texts_of(p) for p in paths}
    valid = list(dict.fromkeys(t for p in paths for t in texts[p] if t is not None))
    plain = tok(valid, add_special_tokens=True)["input_ids"]
    spaced = tok([" " + t for t in valid], add_special_tokens=True)["input_ids"]
    row_of = {t: ("%s\t%s\t%s\n" % (" ".join(map(str, a)), " ".join(map(str, b)), kind_of(t)))
              .encode() for t, a, b in zip(valid, plain, spaced)}
    write_rows(work + "/hf.reference", paths, texts, row_of)


def compare_hf(work):
    """graft's ids against transformers': equal on every line, except that for a line starting
    with a space or "▁" transformers adds no "▁" before it (its ids of " " + the line must then
    be graft's), and that it splits out a special token's text (such lines are only counted)."""
    ref = open(work + "/hf.reference", "rb").read().split(b"\n")[:-1]
    ours = open(work + "/hf.graft", "rb").read().split(b"\n")[:-1]
    n = {"lines": 0, "equal": 0, "lead": 0, "special": 0, "other": 0}
    first = None
    for r, o in zip(ref, ours):
        if r.startswith(b"# ") or r == b"invalid":
            continue
        plain, spaced, kind = r.split(b"\t")
        n["lines"] += 1
        if plain == o:
            n["equal"] += 1
        elif kind == b"lead" and spaced == o:
            n["lead"] += 1
        elif kind == b"special":
            n["special"] += 1
        else:
            n["other"] += 1
            first = first or (r, o)
    print("spm_reference: transformers: %(lines)d lines, %(equal)d the same ids, %(lead)d starting "
          "with a space the same as its ids of \" \" + the line, %(special)d with a special "
          "token's text differing, %(other)d other lines differing" % n)
    if first:
        print("spm_reference: FAILED: first difference:\n  transformers: %r\n  graft: %r" % first)
    return 1 if n["other"] else 0


def first_difference(ref, ours):
    path = line_no = None
    counts = {"files": 0, "lines": 0, "invalid": 0, "differing": 0}
    first = None
    for r, o in zip(ref, ours):
        if r.startswith(b"# "):
            path, line_no = r[2:].decode(), 0
            counts["files"] += 1
            continue
        line_no += 1
        counts["lines"] += 1
        counts["invalid"] += r == b"invalid"
        if r != o:
            counts["differing"] += 1
            first = first or (path, line_no, r, o)
    return counts, first


def compare(work, names):
    failed = False
    for name in names:
        ref = open("%s/%s.reference" % (work, name), "rb").read().split(b"\n")[:-1]
        ours = open("%s/%s.graft" % (work, name), "rb").read().split(b"\n")[:-1]
        if len(ref) != len(ours):
            print("spm_reference: FAILED: %s: %d lines from Python, %d from graft"
                  % (name, len(ref), len(ours)))
            return 1
        if ref and not ref[0].startswith(b"# "):
            ref, ours = [b"# random"] + ref, [b"# random"] + ours
        counts, first = first_difference(ref, ours)
        print("spm_reference: %-9s %d files, %d lines (%d not UTF-8), %d differing"
              % (name, counts["files"], counts["lines"], counts["invalid"], counts["differing"]))
        if first:
            print("spm_reference: FAILED: %s: first difference at %s:%d\n  python: %r\n  graft:  %r"
                  % ((name,) + first))
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    mode, work, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
    if mode == "compare":
        sys.exit(compare_hf(work) if rest == ["hf"] else compare(work, rest))
    {"train": train, "reference": reference, "hf": hf}[mode](work, rest)
