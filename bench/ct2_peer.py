#!/usr/bin/env python3
"""CTranslate2 side of `make bench` (bench/ct2_bench.sh runs it next to graft_bench), and its report.

  ct2_peer.py --what greedy|beam --config tiny|small|base --model CT2_DIR
              [--compute-type float32|int8|bfloat16] [--batch 32] [--beam 4]
              [--warmup 1] [--steps 5] [--threads 2] [--graft-ids FILE]
  ct2_peer.py --what info [--model CT2_DIR]       (version, compute types, bfloat16, the CPU backend)
  ct2_peer.py --report RESULTS.jsonl... --md OUT.md [--meta META.json]
                                                  (appends the "graft vs CTranslate2" section)

CT2_DIR is the graft bench model (graft_bench --what save_model) converted by
examples/translation/ct2_convert.py. The workload is graft_bench's decoding rows: the first
--batch of 32 sources x 32 tokens (make_ids with salt 3, the same ids), exactly 32 new tokens
(min_decoding_length = max_decoding_length = 32: CTranslate2 counts the new target tokens, not
the start token, and masks the end token until the minimum, so no row stops early), greedy or
beam 4 returning one hypothesis; warm-up runs of 4 new tokens, then the median of --steps runs.
The Translator runs on the CPU with intra_threads = --threads, inter_threads = 1, in its own
process per configuration, so peak RSS (VmHWM) is per configuration.

Prints one line "RESULT {json}" (the style of torch_peer.py). With --graft-ids (graft_bench
--ids: one line of new ids per sentence) the line carries the share of sentences whose ids are
identical to graft's ("agree") and the share of identical positions ("agree_tokens").
"""
import argparse
import json
import os
import sys
import time

from torch_peer import fmt, median, peak_rss_mib  # stdlib only at import time

CONFIGS = {"tiny": 1000, "small": 8000, "base": 8000}  # vocabulary (graft_bench's BenchConfig)
ROWS, SRC_LEN, NEW, PAD = 32, 32, 32, 0
PRECISION = {"float32": "fp32", "int8": "int8", "int8_float32": "int8", "bfloat16": "bf16"}


def make_ids(B, L, V, salt):
    """graft_bench's make_ids without the padding: row b holds L - (b % 4) tokens,
    token (b, t) = 4 + (131 b + 31 t + 17 salt) % (V - 4)."""
    return [[4 + (b * 131 + t * 31 + salt * 17) % (V - 4) for t in range(L - (b % 4))] for b in range(B)]


def emit(d):
    print("RESULT " + json.dumps(d), flush=True)


def vocabulary(model_dir):
    """The converted model's target vocabulary, index = id (the JSON or the text form)."""
    for name in ("shared_vocabulary", "target_vocabulary"):
        path = os.path.join(model_dir, name + ".json")
        if os.path.exists(path):
            return json.load(open(path))
        path = os.path.join(model_dir, name + ".txt")
        if os.path.exists(path):
            return [line.rstrip("\n") for line in open(path, encoding="utf-8")]
    sys.exit(f"ct2_peer.py: '{model_dir}' has no shared_vocabulary or target_vocabulary file")


def agreement(ours, graft_ids_path):
    """(share of identical sentences, share of identical positions) against graft's ids."""
    theirs = [[int(x) for x in line.split()] for line in open(graft_ids_path)]
    if len(theirs) != len(ours):
        sys.exit(f"ct2_peer.py: '{graft_ids_path}' has {len(theirs)} sentences for {len(ours)}")
    same = sum(a == b for a, b in zip(ours, theirs))
    pos = sum(x == y for a, b in zip(ours, theirs) for x, y in zip(a, b))
    total = sum(max(len(a), len(b)) for a, b in zip(ours, theirs))
    return same / len(ours), pos / total


def reset_peak_rss():
    """Starts a new VmHWM measurement at the current RSS (Linux: "5" to /proc/self/clear_refs), so
    that decoding's peak is told apart from loading's; False where the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def run_decode(a):
    import ctranslate2
    base_rss = peak_rss_mib()  # the interpreter with ctranslate2 imported, before the model
    vocab = vocabulary(a.model)
    index = {tok: i for i, tok in enumerate(vocab)}
    src = [[vocab[i] for i in row] for row in make_ids(a.batch, SRC_LEN, CONFIGS[a.config], 3)]
    tr = ctranslate2.Translator(a.model, device="cpu", compute_type=a.compute_type,
                                intra_threads=a.threads, inter_threads=1)
    load_peak = peak_rss_mib()  # loading (as graft_bench's load_peak_rss_mib)
    reset = reset_peak_rss()
    beam = a.beam if a.what == "beam" else 1

    def decode(new=NEW):
        return tr.translate_batch(src, beam_size=beam, num_hypotheses=1, length_penalty=a.length_penalty,
                                  max_decoding_length=new, min_decoding_length=new,
                                  max_batch_size=0, return_scores=False)

    for _ in range(a.warmup):
        decode(4)
    ts, out = [], None
    for _ in range(a.steps):
        t0 = time.perf_counter()
        out = decode()
        ts.append(time.perf_counter() - t0)
    t = median(ts)
    ids = [[index[tok] for tok in r.hypotheses[0]] for r in out]
    produced = sum(len(r) for r in ids)
    if produced != a.batch * NEW:
        sys.exit(f"ct2_peer.py: CTranslate2 produced {produced} tokens for {a.batch} x {NEW}")
    res = {"what": a.what, "config": a.config, "beam": beam, "batch": a.batch, "ms": t * 1e3,
           "ms_per_sentence": t * 1e3 / a.batch, "tok_s": a.batch * NEW / t, "produced": produced,
           "compute_type": a.compute_type, "precision": PRECISION[a.compute_type],
           "isa": os.environ.get("CT2_FORCE_CPU_ISA") or "default",
           "peak_rss_mib": max(load_peak, peak_rss_mib()), "load_peak_rss_mib": load_peak,
           "decode_peak_rss_mib": peak_rss_mib() if reset else -1.0, "base_rss_mib": base_rss}
    if a.graft_ids:
        res["agree"], res["agree_tokens"] = agreement(ids, a.graft_ids)
    emit(res)


def run_info(a):
    """The version, the CPU compute types, what a bfloat16 Translator does here and (with
    --model) the backend CTranslate2 picks (its CT2_VERBOSE log, in a child process)."""
    import subprocess
    import ctranslate2
    base_rss = peak_rss_mib()
    types = sorted(ctranslate2.get_supported_compute_types("cpu"))
    res = {"what": "info", "version": ctranslate2.__version__, "compute_types": types,
           "bfloat16": "bfloat16" in types, "base_rss_mib": base_rss}
    if a.model:
        try:
            ctranslate2.Translator(a.model, device="cpu", compute_type="bfloat16", intra_threads=a.threads)
            res["bf16_refusal"] = ""
        except ValueError as e:
            res["bf16_refusal"] = str(e)
        log = subprocess.run([sys.executable, "-c", "import ctranslate2, sys; ctranslate2.Translator(sys.argv[1], "
                              "device='cpu', intra_threads=%d)" % a.threads, a.model],
                             env=dict(os.environ, CT2_VERBOSE="1"), capture_output=True, text=True).stderr
        keep = ("Selected ISA", "Use Intel MKL", "SGEMM backend", "GEMM_S8 backend")
        res["backend"] = "; ".join(line.split("] ")[-1].lstrip(" -") for line in log.splitlines()
                                   if any(k in line for k in keep))
    emit(res)


# --------------------------------------------------------------------------------------------
# Report: the "graft vs CTranslate2" section, appended to torch_peer.py's markdown.

SECTION = "# graft vs CTranslate2"
ROW_KINDS = [  # (benchmark, what, batch, unit, field, higher_better)
    ("greedy_decode", "greedy", 32, "new tok/s", "tok_s", True),
    ("beam4_decode", "beam", 32, "new tok/s", "tok_s", True),
    ("greedy_latency_batch1", "greedy", 1, "ms/sentence", "ms_per_sentence", False),
    ("beam4_latency_batch1", "beam", 1, "ms/sentence", "ms_per_sentence", False),
]


def side_hits(res, side, what, config, precision, batch):
    """The side's rows of this work in the order they ran (one, or one a round for one
    sentence); CTranslate2's at its best configuration: the ISA setting with the lower median."""
    hits = [r for r in res[side]
            if (r.get("what"), r.get("config"), r.get("precision", "fp32"), r.get("batch", 32)) ==
            (what, config, precision, batch)]
    if hits and side == "ct2":
        by_isa = {}
        for h in hits:
            by_isa.setdefault(h.get("isa", "default"), []).append(h)
        hits = min(by_isa.values(), key=lambda hs: median([h["ms"] for h in hs]))
    return hits


def paired_ratio(res, what, config, precision, field):
    """One sentence: the median over the rounds of CTranslate2's time over graft's in the same
    round (the two sides' processes alternate), or None without a pair for every round. On a
    VM whose speed drifts from minute to minute it varies less than the ratio of the medians."""
    g = side_hits(res, "graft", what, config, precision, 1)
    p = side_hits(res, "ct2", what, config, precision, 1)
    if not g or len(g) != len(p) or any(field not in h for h in g + p):
        return None
    return median([b[field] / a[field] for a, b in zip(g, p)])


def find_row(res, side, what, config, precision, batch):
    """The side's rows of this work (one, or one a round for one sentence) as one row: the
    median of each numeric field over them, the lowest agreement with graft's ids."""
    hits = side_hits(res, side, what, config, precision, batch)
    if not hits:
        return None
    row = dict(hits[-1])
    for k, v in row.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            row[k] = median([h[k] for h in hits if isinstance(h.get(k), (int, float))])
    for k in ("agree", "agree_tokens"):
        if k in row:
            row[k] = min(h[k] for h in hits if k in h)
    row["rounds"] = len(hits)
    return row


RSS_ROWS = [  # (benchmark, field): the whole process, loading alone, decoding after loading
    ("peak_rss_greedy_decode", "peak_rss_mib"),
    ("peak_rss_load", "load_peak_rss_mib"),
    ("peak_rss_decoding_only", "decode_peak_rss_mib"),
]


def rss_rows(find, prec):
    """The peak RSS rows of the batch-32 greedy process on each side."""
    rows = []
    for bench, field in RSS_ROWS:
        for c in CONFIGS:
            g, p = find("graft", "greedy", c, prec, 32), find("ct2", "greedy", c, prec, 32)
            if g is None and p is None:
                continue
            gv, pv = (g or {}).get(field), (p or {}).get(field)
            if gv is not None and gv < 0 or pv is not None and pv < 0:
                gv = pv = None  # the VmHWM reset was refused
            ratio = float("nan") if gv is None or pv is None else pv / gv
            rows.append((bench, c, prec, gv, pv, "MiB", ratio))
    return rows


def table_rows(res):
    """The rows (benchmark, config, precision, graft, ct2, unit, ratio), the ids' agreement
    lines and the CTranslate2 ISA setting each speed row took."""
    find = lambda *k: find_row(res, *k)
    rows = []  # benchmark, config, precision, graft, ct2, unit, ratio
    agree = []
    isa = []  # the CTranslate2 configuration each speed row took
    for prec in ("fp32", "int8", "bf16"):
        for bench, what, batch, unit, field, higher in ROW_KINDS:
            for c in CONFIGS:
                g, p = find("graft", what, c, prec, batch), find("ct2", what, c, prec, batch)
                if g is None and p is None:
                    continue
                gv, pv = (g or {}).get(field), (p or {}).get(field)
                ratio = float("nan") if gv is None or pv is None else (gv / pv if higher else pv / gv)
                if batch == 1 and not higher:
                    ratio = paired_ratio(res, what, c, prec, field) or ratio
                rows.append((bench, c, prec, gv, pv, unit, ratio))
                if p is not None:
                    isa.append(f"{bench} {c} {prec}: {p.get('isa', 'default')}")
                if p is not None and "agree" in p and prec == "fp32":
                    agree.append(f"{bench} {c}: {p['agree']:.0%} of sentences, {p['agree_tokens']:.0%} of tokens")
        rows += rss_rows(find, prec)
    return rows, agree, isa


def notes(meta, agree, isa):
    """What was measured, how, and what the ratio means."""
    md = ["", SECTION, ""]
    md.append(f"- CTranslate2 {meta.get('ct2_version', '?')} (PyPI wheel) on the CPU, intra_threads "
              f"{meta.get('threads', 2)}, inter_threads 1; graft at OMP_NUM_THREADS={meta.get('threads', 2)}; "
              f"machine: {meta.get('cpu', '?')}; load average at start: {meta.get('load', '?')}")
    md.append("- the same weights: graft_bench --what save_model writes the decoding rows' seeded model as a "
              "translate run directory, examples/translation/ct2_convert.py converts it (float32); CTranslate2 "
              "quantizes at load time for compute_type int8")
    md.append("- the same work: the first 1 or 32 of graft_bench's 32 sources x 32 tokens, exactly 32 new "
              "tokens (min = max decoding length), greedy or beam 4 (one hypothesis), warm-up 1 run of 4 new "
              "tokens, median of 5 runs, each configuration in its own process; one sentence: the median of "
              f"{meta.get('latency_rounds', 1)} such processes a side, graft's and CTranslate2's alternating (peak RSS = VmHWM; the Python "
              "side's includes the interpreter and the ctranslate2 module, "
              f"{fmt(meta.get('ct2_base_rss_mib'))} MiB before the model is loaded)")
    md.append(f"- CTranslate2 on this CPU: {meta.get('ct2_backend') or '?'}; compute types "
              f"{', '.join(meta.get('ct2_compute_types', [])) or '?'}"
              + ("" if meta.get("ct2_bfloat16") else
                 "; no bfloat16, so no bf16 rows: a Translator asked for compute_type bfloat16 raises "
                 f"\"{meta.get('ct2_bf16_refusal') or '?'}\""))
    md.append(f"- graft int8 rows: {meta.get('graft_int8', '?')}")
    if isa:
        md.append("- CTranslate2 at its best configuration: each row takes the faster of its default and "
                  "CT2_FORCE_CPU_ISA=AVX512 runs (made side by side in the same bench run): " + "; ".join(isa))
    if agree:
        md.append("- float32 ids identical to graft's float32 (a random-weight model has near-ties): "
                  + "; ".join(agree))
    md.append("- peak RSS rows: peak_rss_greedy_decode is the process's VmHWM; peak_rss_load its VmHWM "
              "once the model is loaded (graft: built, then keep_for_inference, which frees the float32 "
              "weights at int8; CTranslate2: the Translator made); peak_rss_decoding_only the VmHWM of the "
              "decoding runs after that (reset through /proc/self/clear_refs on both sides)")
    md.append("- ratio: graft/CTranslate2 for throughputs, CTranslate2/graft for latency and memory "
              "(> 1: graft better); one sentence: the median over the rounds of the two sides' ratio "
              "within a round (the columns are each side's median)")
    return md


def report(a):
    res = {"graft": [], "ct2": []}
    for path in a.report:
        for line in open(path):
            side, _, js = line.strip().partition(" ")
            if side in res and js:
                res[side].append(json.loads(js))
    meta = json.load(open(a.meta)) if a.meta else {}
    rows, agree, isa = table_rows(res)
    md = notes(meta, agree, isa)
    md.append("")
    md.append("| benchmark | config | precision | graft | CTranslate2 | unit | ratio |")
    md.append("|---|---|---|---:|---:|---|---:|")
    for b, c, prec, g, p, u, r in rows:
        md.append(f"| {b} | {c} | {prec} | {fmt(g)} | {fmt(p)} | {u} | {fmt(r)} |")
    text = "\n".join(md) + "\n"
    if a.md:
        replace_section(a.md, SECTION, text)
    sys.stdout.write(text)


def replace_section(path, header, text):
    """Puts `text` in place of the markdown section `header` of `path` (up to the next "# "
    heading), or at the end when there is none."""
    old = open(path).read() if os.path.exists(path) else ""
    lines = old.split("\n")
    if header in lines:
        i = lines.index(header)
        j = next((k for k in range(i + 1, len(lines)) if lines[k].startswith("# ")), len(lines))
        rest = "\n".join(lines[j:])
        old = "\n".join(lines[:i]).rstrip("\n") + "\n" + ("\n" + rest if rest.strip() else "")
    with open(path, "w") as f:
        f.write(old.rstrip("\n") + "\n" + text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--what", default="greedy", choices=["greedy", "beam", "info"])
    ap.add_argument("--config", default="tiny", choices=list(CONFIGS))
    ap.add_argument("--model")
    ap.add_argument("--compute-type", default="float32", choices=list(PRECISION))
    ap.add_argument("--batch", type=int, default=ROWS)
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--length-penalty", type=float, default=1.0)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    ap.add_argument("--graft-ids")
    ap.add_argument("--report", nargs="+")
    ap.add_argument("--meta")
    ap.add_argument("--md")
    a = ap.parse_args()
    if a.report:
        report(a)
    elif a.what == "info":
        run_info(a)
    else:
        if not a.model:
            sys.exit("ct2_peer.py: --what greedy|beam needs --model CT2_DIR")
        if not 1 <= a.batch <= ROWS:
            sys.exit(f"ct2_peer.py: --batch {a.batch} is outside [1, {ROWS}]")
        run_decode(a)


if __name__ == "__main__":
    main()
