"""The sentence-embedding peer of `make bench`: sentence-transformers (PyTorch) on the same
sentences and model as `graft_bench --what embed`, one RESULT line like graft's.

  embed_peer.py --model DIR --sentences FILE [--batch 32] [--warmup 1] [--steps 3] [--dtype fp32|bf16]
                [--compile]

Threads: torch.set_num_threads(OMP_NUM_THREADS). A timed run embeds every sentence (batches sorted
by length, as SentenceTransformer.encode does). --batch 1: one sentence at a time.
"""
import argparse
import json
import os
import resource
import statistics
import time

import torch
from sentence_transformers import SentenceTransformer

ap = argparse.ArgumentParser()
ap.add_argument("--model", required=True)
ap.add_argument("--sentences", required=True)
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--warmup", type=int, default=1)
ap.add_argument("--steps", type=int, default=3)
ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
ap.add_argument("--compile", action="store_true")
a = ap.parse_args()
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
                              "threads": torch.get_num_threads(), "peak_rss_mib": rss_mib}))
