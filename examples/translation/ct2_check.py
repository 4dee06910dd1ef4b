#!/usr/bin/env python3
"""graft against CTranslate2 on the same weights: greedy and beam-search outputs and BLEU.

    python ct2_check.py --translate BUILD/examples/translation/translate --run RUN \
        --data data/toy/test.tsv [--work DIR] [--beams 1,4] [--min-agree 0.99] [--max-bleu-diff 0.1]

The run is converted to a float32 CTranslate2 model (ct2_convert.convert). graft's outputs come
from `translate translate --run RUN [--beam K]` (the sources on its standard input);
CTranslate2's from Translator.translate_batch on the same SentencePiece ids, decoded the way graft
decodes them: sources sorted by length (stable) in chunks of 128 / K, each chunk's output limit
min(max_len - 1, 2 S + 10) with S its longest source, no BOS/EOS on the source, decoding from BOS.

For each K: the fraction of sentences whose ids agree (graft's `translate` prints text, so both
sides' outputs are compared as SentencePiece ids of their detokenized text: sp.encode(text)), and
the two corpus BLEUs (sacrebleu, the same scorer for both). Beam search: graft ranks the final
beams by score / ((5 + len) / 6)^alpha (GNMT, alpha = `translate --length-penalty`, default 1);
CTranslate2 divides by len^alpha, so the check runs both with alpha = 0 (plain sums of
log-probabilities, the one setting both express) unless --length-penalty says otherwise.
Exit 1 when an agreement is under --min-agree or a BLEU differs by more than --max-bleu-diff.
"""

import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ct2_convert  # noqa: E402


def read_tsv(path):
    """(source, reference) pairs of a source<TAB>reference file (lines without a tab skipped)."""
    pairs = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) == 2 and parts[0].strip() and parts[1].strip():
                pairs.append((parts[0], parts[1]))
    return pairs


def graft_translate(translate, run, sources, beam, length_penalty):
    """graft's translations of `sources` (text lines) by the translate program."""
    cmd = [translate, "translate", "--run", run, "--beam", str(beam)]
    if beam > 1:
        cmd += ["--length-penalty", repr(length_penalty)]
    r = subprocess.run(cmd, input="\n".join(sources) + "\n", capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(cmd), r.returncode, r.stderr.strip()))
    out = r.stdout.split("\n")[: len(sources)]
    if len(out) != len(sources):
        raise RuntimeError("%s printed %d lines for %d sources" % (" ".join(cmd), len(out), len(sources)))
    return out


def ct2_translate(translator, tokens, src_ids, beam, cfg, length_penalty):
    """CTranslate2's output ids for each source id list, chunked and limited as graft does
    (examples/translation/trainer.cpp, translate_lines)."""
    max_len = cfg["max_len"]
    src_ids = [s[:max_len] for s in src_ids]
    order = sorted((i for i in range(len(src_ids)) if src_ids[i]), key=lambda i: len(src_ids[i]))
    out = [[] for _ in src_ids]
    chunk = max(1, 128 // max(1, beam))
    for begin in range(0, len(order), chunk):
        rows = order[begin: begin + chunk]
        S = max(len(src_ids[i]) for i in rows)
        results = translator.translate_batch(
            [ct2_convert.ids_to_tokens(src_ids[i], tokens) for i in rows],
            beam_size=beam, length_penalty=length_penalty, max_decoding_length=min(max_len - 1, 2 * S + 10),
            min_decoding_length=0, max_input_length=0, max_batch_size=0, num_hypotheses=1)
        for i, r in zip(rows, results):
            out[i] = ct2_convert.tokens_to_ids(r.hypotheses[0], tokens)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--translate", required=True, help="graft's translate program")
    ap.add_argument("--run", required=True, help="graft run directory (with spm.model)")
    ap.add_argument("--data", required=True, help="source<TAB>reference test file")
    ap.add_argument("--work", help="directory for the converted model (default: a temporary one)")
    ap.add_argument("--beams", default="1,4", help="beam sizes to check, comma-separated (1: greedy)")
    ap.add_argument("--length-penalty", type=float, default=0.0, help="beam search's alpha on both sides")
    ap.add_argument("--min-agree", type=float, default=0.99, help="least fraction of sentences with equal ids")
    ap.add_argument("--max-bleu-diff", type=float, default=0.1, help="largest BLEU difference")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    a = ap.parse_args(argv)

    import ctranslate2
    import sacrebleu
    import sentencepiece

    work = a.work or tempfile.mkdtemp(prefix="graft_ct2_")
    model_dir = os.path.join(work, "ct2-float32")
    tokens = ct2_convert.convert(a.run, model_dir, "float32")
    cfg = ct2_convert.read_model_config(a.run)
    sp = sentencepiece.SentencePieceProcessor(model_file=os.path.join(a.run, "spm.model"))
    pairs = read_tsv(a.data)
    if not pairs:
        print("ct2_check: no pairs in '%s'" % a.data, file=sys.stderr)
        return 1
    sources, refs = [p[0] for p in pairs], [p[1] for p in pairs]
    src_ids = [sp.encode(s) for s in sources]
    translator = ctranslate2.Translator(model_dir, device="cpu", compute_type="float32",
                                        intra_threads=a.threads, inter_threads=1)
    print("ctranslate2 %s, %d sentences of %s, run %s (%s positions, %s)" % (
        ctranslate2.__version__, len(pairs), a.data, a.run, cfg["positions"],
        "pre-LN" if cfg.get("norm_first") else "post-LN"))
    failed = []
    for beam in [int(b) for b in a.beams.split(",")]:
        name = "greedy" if beam == 1 else "beam %d (length penalty %g)" % (beam, a.length_penalty)
        graft_text = graft_translate(a.translate, a.run, sources, beam, a.length_penalty)
        ct2_ids = ct2_translate(translator, tokens, src_ids, beam, cfg, a.length_penalty)
        ct2_text = [sp.decode(ids) for ids in ct2_ids]
        same = sum(sp.encode(g) == sp.encode(c) for g, c in zip(graft_text, ct2_text))
        agree = same / len(pairs)
        bleu_graft = sacrebleu.corpus_bleu(graft_text, [refs], force=True).score
        bleu_ct2 = sacrebleu.corpus_bleu(ct2_text, [refs], force=True).score
        print("%s: same ids on %d/%d sentences (%.2f%%); BLEU graft %.2f, CTranslate2 %.2f (diff %.2f)" % (
            name, same, len(pairs), 100 * agree, bleu_graft, bleu_ct2, abs(bleu_graft - bleu_ct2)))
        shown = 0
        for s, g, c in zip(sources, graft_text, ct2_text):
            if sp.encode(g) != sp.encode(c) and shown < 3:
                print("  differs: SRC %s\n           graft %s\n           ct2   %s" % (s, g, c))
                shown += 1
        if agree < a.min_agree:
            failed.append("%s: agreement %.2f%% < %.2f%%" % (name, 100 * agree, 100 * a.min_agree))
        if abs(bleu_graft - bleu_ct2) > a.max_bleu_diff:
            failed.append("%s: BLEU differs by %.2f > %.2f" % (name, abs(bleu_graft - bleu_ct2), a.max_bleu_diff))
    for f in failed:
        print("ct2_check: FAILED %s" % f, file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
