#!/usr/bin/env python3
"""CTranslate2 side of `make bench-marian` (bench/marian_bench.sh runs it next to marian_bench),
and its report.

  marian_peer.py --model CT2_DIR --src-ids FILE [--compute-type float32|int8] [--batch 32]
                 [--beam 1] [--max-len 32] [--repeats 3] [--threads 2] [--graft-ids FILE]
  marian_peer.py --report RESULTS.jsonl --meta META.json --md OUT.md

CT2_DIR is bench/marian_make.py's MarianMTModel converted by ct2-transformers-converter. The work
is marian_bench's: the source ids it wrote (--src-ids: MarianTokenizer's ids of the fortune lines,
`</s>` last) fed as the converted model's tokens, translated --batch at a time (translate_batch,
max_batch_size 0), greedy or beam --beam (one hypothesis, length_penalty 1), at most --max-len new
tokens, stopping at eos; CTranslate2's Marian vocabulary has no <pad> (its converter drops it), so
pad can never be produced, as marian_bench bans it. One untimed translation of the first batch,
then the median of --repeats translations of all sentences. The Translator runs on the CPU with
intra_threads = --threads, inter_threads = 1, in its own process per configuration.

Prints one line "RESULT {json}" (the fields of marian_bench's line); with --graft-ids (graft's ids
of the same work) the share of sentences whose ids equal graft's ("agree") and of equal positions
("agree_tokens").
"""
import argparse
import json
import os
import sys
import time

from ct2_peer import agreement, emit, reset_peak_rss, vocabulary
from torch_peer import fmt, median, peak_rss_mib

PRECISION = {"float32": "fp32", "int8": "int8", "int8_float32": "int8"}


def read_ids(path):
    return [[int(x) for x in line.split()] for line in open(path)]


def run_decode(a):
    import ctranslate2
    vocab = vocabulary(a.model)
    src = [[vocab[i] for i in row] for row in read_ids(a.src_ids)]
    index = {tok: i for i, tok in enumerate(vocab)}
    t0 = time.perf_counter()
    tr = ctranslate2.Translator(a.model, device="cpu", compute_type=a.compute_type,
                                intra_threads=a.threads, inter_threads=1)
    load_s, load_peak = time.perf_counter() - t0, peak_rss_mib()
    reset_peak_rss()

    def translate(rows):
        out = []
        for b in range(0, len(rows), a.batch):
            res = tr.translate_batch(rows[b:b + a.batch], beam_size=a.beam, num_hypotheses=1,
                                     length_penalty=1.0, max_decoding_length=a.max_len,
                                     max_batch_size=0)
            out += [[index[t] for t in r.hypotheses[0]] for r in res]
        return out

    translate(src[:a.batch])  # warm-up
    sent_s, tok_s, ids = [], [], []
    for _ in range(a.repeats):
        t = time.perf_counter()
        ids = translate(src)
        s = time.perf_counter() - t
        sent_s.append(len(src) / s)
        tok_s.append(sum(len(r) for r in ids) / s)
    res = {"what": "greedy" if a.beam == 1 else "beam", "engine": "ct2",
           "precision": PRECISION[a.compute_type], "compute_type": a.compute_type,
           "isa": os.environ.get("CT2_FORCE_CPU_ISA") or "default", "batch": a.batch,
           "beam": a.beam, "sentences": len(src), "max_len": a.max_len, "repeats": a.repeats,
           "sent_s": median(sent_s), "tok_s": median(tok_s), "produced": sum(len(r) for r in ids),
           "load_s": load_s, "load_peak_rss_mib": load_peak,
           "peak_rss_mib": max(load_peak, peak_rss_mib())}
    if a.graft_ids:
        res["agree"], res["agree_tokens"] = agreement(ids, a.graft_ids)
    emit(res)


# --------------------------------------------------------------------------------------------
# Report: bench/results/marian_ct2.md.

def load_results(path):
    res = {"graft": [], "ct2": []}
    for line in open(path):
        side, _, js = line.strip().partition(" ")
        if side in res and js:
            res[side].append(json.loads(js))
    return res


def best_ct2(rows, what, prec, batch, wait):
    """CTranslate2's row of this work at its best configuration (the ISA with more sentences/s)."""
    hits = [r for r in rows if (r["what"], r["precision"], r["batch"], r.get("omp_wait")) ==
            (what, prec, batch, wait)]
    return max(hits, key=lambda r: r["sent_s"]) if hits else None


def table(res):
    md = ["| decoding | batch | precision | graft sent/s | CT2 sent/s | ratio | graft new tok/s "
          "| CT2 new tok/s | graft peak RSS MiB | CT2 peak RSS MiB | CT2 ISA | CT2 ids = graft's | load "
          "| OMP_WAIT_POLICY |", "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|---|"]
    for g in res["graft"]:
        p = best_ct2(res["ct2"], g["what"], g["precision"], g["batch"], g.get("omp_wait"))
        if p is None:
            continue
        agree = (f"{p['agree']:.0%} sentences, {p['agree_tokens']:.0%} tokens" if "agree" in p
                 else "")
        what = "greedy" if g["beam"] == 1 else f"beam {g['beam']}"
        md.append(f"| {what} | {g['batch']} | {g['precision']} | {fmt(g['sent_s'])} | "
                  f"{fmt(p['sent_s'])} | {g['sent_s'] / p['sent_s']:.2f} | {fmt(g['tok_s'])} | "
                  f"{fmt(p['tok_s'])} | {fmt(g['peak_rss_mib'])} | {fmt(p['peak_rss_mib'])} | "
                  f"{p['isa']} | {agree} | {g['load']} / {p['load']} | {g.get('omp_wait', 'default')} |")
    return md


def report(a):
    res = load_results(a.report)
    meta = json.load(open(a.meta))
    first = (res["graft"] or [{}])[0]
    counts = "; ".join(sorted({f"batch {g['batch']}: {g['sentences']}" for g in res["graft"]}))
    md = ["# Marian (Opus-MT's shape) against CTranslate2", "",
          f"- {meta['date']}; CPU: {meta['cpu']}; threads {meta['threads']} (graft "
          "OMP_NUM_THREADS, CTranslate2 intra_threads, inter_threads 1); load: the 1-minute load "
          "average before each process (graft's / CTranslate2's)",
          f"- CTranslate2 {meta.get('ct2_version', '?')} ({meta.get('ct2_backend', '?')}), the "
          "model converted by ct2-transformers-converter (float32, and --quantization int8 for the "
          "int8 rows, compute_type int8); each row takes its faster of the default ISA and "
          "CT2_FORCE_CPU_ISA=AVX512 (column CT2 ISA)",
          "- model: random MarianMTModel (bench/marian_make.py): vocab 58101, d 512, 6 + 6 layers, "
          "8 heads, FFN 2048, swish; tokenizer: an 8000-piece spm trained on the English "
          "fortunes, vocab.json padded to 58101 entries",
          f"- work: the same English fortune lines ({counts}; the same source ids on both "
          f"sides), at most {first.get('max_len', '?')} new tokens, stopping at eos, "
          "pad banned; batch 32: padded batches of 32; batch 1: one sentence at a time; each "
          f"configuration in its own process, median of {first.get('repeats', '?')} repeats "
          "after a warm-up",
          "- ratio: graft sentences/s over CTranslate2's (> 1: graft faster); peak RSS: VmHWM of "
          "the whole process (CTranslate2's includes the Python interpreter)",
          "- CT2 ids = graft's: CTranslate2's ids against graft's of the same decoding and "
          "precision (random weights have near-ties; at int8 each side quantizes its own way)",
          ""]
    md += table(res)
    text = "\n".join(md) + "\n"
    with open(a.md, "w") as f:
        f.write(text)
    sys.stdout.write(text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--src-ids")
    ap.add_argument("--compute-type", default="float32", choices=list(PRECISION))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--beam", type=int, default=1)
    ap.add_argument("--max-len", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    ap.add_argument("--graft-ids")
    ap.add_argument("--report")
    ap.add_argument("--meta")
    ap.add_argument("--md")
    a = ap.parse_args()
    if a.report:
        if not a.meta or not a.md:
            sys.exit("marian_peer.py: --report needs --meta and --md")
        report(a)
        return
    if not a.model or not a.src_ids:
        sys.exit("marian_peer.py: give --model CT2_DIR and --src-ids FILE")
    for flag, v in (("--batch", a.batch), ("--beam", a.beam), ("--max-len", a.max_len),
                    ("--repeats", a.repeats), ("--threads", a.threads)):
        if v < 1:
            sys.exit(f"marian_peer.py: {flag} must be at least 1, got {v}")
    run_decode(a)


if __name__ == "__main__":
    main()
