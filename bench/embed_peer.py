"""The sentence-embedding peer of `make bench`: sentence-transformers (PyTorch) on the same
sentences and model as `graft_bench --what embed`, one RESULT line like graft's.

  embed_peer.py --model DIR --sentences FILE [--batch 32] [--warmup 1] [--steps 3] [--dtype fp32|bf16]
                [--compile] [--tag TAG]
  embed_peer.py --report RESULTS.jsonl --meta META.json --md MD   (the "Sentence embeddings"
                section of MD, from bench/embed_bench.sh's results)

Threads: torch.set_num_threads(OMP_NUM_THREADS). A timed run embeds every sentence (batches sorted
by length, as SentenceTransformer.encode does). --batch 1: one sentence at a time.
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time

SECTION = "# Sentence embeddings: graft vs sentence-transformers"


def report(a):
    """The markdown section: for each (batch, precision), graft's sentences/s and peak RSS against
    the fastest peer configuration measured."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from ct2_peer import replace_section
    rows = [(l.split(" ", 1)[0], json.loads(l.split(" ", 1)[1])) for l in open(a.report) if l.strip()]
    meta = json.load(open(a.meta))
    md = ["", SECTION, "",
          f"{meta['date']}, {meta['cpu']}, {meta['threads']} threads (load before: {meta['load']}); model "
          f"{meta['model']}; {meta['sentences']} English fortunes (examples/embed/fortunes_collection.sh), "
          f"{meta['single']} of them for batch 1. Peer: sentence-transformers {meta['st']} on torch "
          f"{meta['torch']}, eager and torch.compile, with and without the MKL shim; the fastest shown. "
          f"{meta['onnx']}", "",
          "| batch | precision | graft sentences/s | peer sentences/s (fastest: config) | graft / peer | graft peak RSS MiB | peer peak RSS MiB |",
          "|---:|---|---:|---:|---:|---:|---:|"]
    for batch in sorted({r["batch"] for _, r in rows}, reverse=True):
        peers = [r for s, r in rows if s == "peer" and r["batch"] == batch]
        for g in [r for s, r in rows if s == "graft" and r["batch"] == batch]:
            prec = g["precision"]
            same = [p for p in peers if p["dtype"] == prec] or [p for p in peers if p["dtype"] == "fp32"]
            best = max(same, key=lambda p: p["sent_s"]) if same else None
            cfg = (f"{best['dtype']}, {'compile' if best['compile'] else 'eager'}"
                   f"{', ' + best['tag'] if best.get('tag') else ''}") if best else "-"
            md.append(f"| {batch} | {prec} | {g['sent_s']:.1f} | {best['sent_s']:.1f} ({cfg}) | "
                      f"{g['sent_s'] / best['sent_s']:.2f}x | {g['peak_rss_mib']:.0f} | {best['peak_rss_mib']:.0f} |"
                      if best else f"| {batch} | {prec} | {g['sent_s']:.1f} | - | - | {g['peak_rss_mib']:.0f} | - |")
    text = "\n".join(md) + "\n"
    replace_section(a.md, SECTION, text)
    sys.stdout.write(text)


ap = argparse.ArgumentParser()
ap.add_argument("--model")
ap.add_argument("--sentences")
ap.add_argument("--tag", default="")
ap.add_argument("--report")
ap.add_argument("--meta")
ap.add_argument("--md")
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--warmup", type=int, default=1)
ap.add_argument("--steps", type=int, default=3)
ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
ap.add_argument("--compile", action="store_true")
a = ap.parse_args()
if a.report:
    report(a)
    sys.exit(0)
import torch  # noqa: E402 (the report needs neither)
from sentence_transformers import SentenceTransformer  # noqa: E402

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
with open(a.sentences, encoding="utf-8") as f:
    sentences = f.read().split("\n")[:-1]
model = SentenceTransformer(a.model, device="cpu")
if a.dtype == "bf16":
    model = model.to(torch.bfloat16)
if a.compile:
    model[0].auto_model = torch.compile(model[0].auto_model, dynamic=True)


def run():
    with torch.inference_mode():
        model.encode(sentences, batch_size=a.batch, convert_to_numpy=True, show_progress_bar=False)


for _ in range(a.warmup):
    run()
times = []
for _ in range(a.steps):
    t0 = time.perf_counter()
    run()
    times.append(time.perf_counter() - t0)
t = statistics.median(times)
rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print("RESULT " + json.dumps({"what": "embed", "peer": "sentence-transformers", "torch": torch.__version__,
                              "batch": a.batch, "sentences": len(sentences), "ms": t * 1e3,
                              "sent_s": len(sentences) / t, "dtype": a.dtype, "compile": a.compile,
                              "threads": torch.get_num_threads(), "tag": a.tag, "peak_rss_mib": rss_mib}))
