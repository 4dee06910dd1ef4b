#!/usr/bin/python3
"""PyTorch side of `make bench-quality`: the toy translation model trained to a validation BLEU.

  torch_quality.py --dump runs/quality-fp32/batches.jsonl --run runs/quality-fp32 \\
      --data data/toy/valid.tsv --translate build/examples/translation/translate [--bleu 95]

graft's run (translate train --dump-batches) wrote what this run needs to train the same model
on the same data in the same order: every batch's ids, the per-step batch order, the BLEU
sources' ids and graft's initial weights (<dump>.init.safetensors, nn.Transformer's parameter
names). This run loads those weights into nn.Transformer + a tied embedding (bench/torch_peer.py's
model), and trains with graft's schedule and hyper-parameters, read from the run's config.json:
Noam(lr_factor, d_model, warmup), Adam(0.9, 0.98, 1e-9), gradient-norm clip 1.0, label
smoothing, dropout. Past the last step graft recorded, batches continue in a seeded shuffle
(said in the result). Every `--valid-every` steps it decodes the BLEU sources greedily (sorted by
length, chunks of 128, at most 2 * S + 10 new tokens, as graft's validation), writes the ids,
and `translate score` (graft's SentencePiece detokenisation and sacreBLEU-compatible BLEU)
scores them. Prints "RESULT {json}" with the training seconds (validation excluded) and wall
seconds to the first validation at or above --bleu.
"""
import argparse
import json
import math
import os
import random
import re
import subprocess
import sys
import tempfile
import time

import torch_peer

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples",
                                "translation"))
from safetensors_raw import read_raw  # noqa: E402 (the path above)

PAD, BOS, EOS = 0, 2, 3


def read_dump(path):
    batches, bleu_src, order = {}, [], []
    with open(path) as f:
        for line in f:
            j = json.loads(line)
            if "batch" in j:
                batches[j["batch"]] = (j["src"], j["tgt_in"], j["tgt_out"])
            elif "bleu_src" in j:
                bleu_src.append(j["bleu_src"])
            elif "step_batch" in j:
                order.append(j["step_batch"])
    return [batches[i] for i in range(len(batches))], bleu_src, order


def load_safetensors(torch, path):
    """graft's weights file (the safetensors layout: header length, JSON header, raw data)."""
    out = {}
    for name, dtype, shape, data in read_raw(path):
        if dtype != "F32":
            sys.exit(f"torch_quality.py: {path}: {name} is {dtype}, expected F32")
        out[name] = torch.frombuffer(bytearray(data), dtype=torch.float32).reshape(shape)
    return out


def load_graft_weights(torch, model, path):
    """graft's names are nn.Transformer's (encoder.layers.0.self_attn.in_proj_weight, ...) plus
    embedding.weight; the peer's transformer is model.tr."""
    w = load_safetensors(torch, path)
    state = model.state_dict()
    loaded = set()
    for name, t in w.items():
        key = name if name == "embedding.weight" else "tr." + name
        if key not in state:
            if name.endswith("pos") or name.startswith("sin_pos"):
                continue  # graft's sinusoidal table: the peer computes the same one
            sys.exit(f"torch_quality.py: {path}: no peer parameter for graft's {name}")
        if tuple(state[key].shape) != tuple(t.shape):
            sys.exit(f"torch_quality.py: {name}: graft {tuple(t.shape)} vs peer {tuple(state[key].shape)}")
        state[key].copy_(t)
        loaded.add(key)
    missing = [k for k in state if k not in loaded and k != "pe"]
    if missing:
        sys.exit(f"torch_quality.py: {path} has no weights for {missing[:5]}")


def greedy_ids(torch, model, bleu_src):
    """graft's validation decoding: sources sorted by length, chunks of 128, new tokens at most
    min(max_len - 1, 2 * S + 10), stop at EOS."""
    F = torch.nn.functional
    order = sorted(range(len(bleu_src)), key=lambda i: len(bleu_src[i]))
    out = [[] for _ in bleu_src]
    model.eval()
    with torch.no_grad():
        for c in range(0, len(order), 128):
            rows = [i for i in order[c:c + 128] if bleu_src[i]]
            if not rows:
                continue
            S = max(len(bleu_src[i]) for i in rows)
            src = torch.tensor([bleu_src[i] + [PAD] * (S - len(bleu_src[i])) for i in rows])
            pad = src == PAD
            memory = model.tr.encoder(model.embed(src), src_key_padding_mask=pad)
            ys = torch.full((len(rows), 1), BOS, dtype=torch.int64)
            done = torch.zeros(len(rows), dtype=torch.bool)
            for _ in range(min(255, 2 * S + 10)):
                mask = model.tr.generate_square_subsequent_mask(ys.size(1))
                h = model.tr.decoder(model.embed(ys), memory, tgt_mask=mask, memory_key_padding_mask=pad)
                nxt = F.linear(h[:, -1], model.embedding.weight).argmax(-1)
                nxt = torch.where(done, torch.full_like(nxt, PAD), nxt)
                ys = torch.cat([ys, nxt[:, None]], 1)
                done |= nxt == EOS
                if bool(done.all()):
                    break
            for r, i in enumerate(rows):
                seq = ys[r, 1:].tolist()
                out[i] = seq[:seq.index(EOS)] if EOS in seq else seq
    model.train()
    return out


def score(a, hyps):
    with tempfile.NamedTemporaryFile("w", suffix=".ids", delete=False) as f:
        for h in hyps:
            f.write(" ".join(map(str, h)) + "\n")
        path = f.name
    try:
        res = subprocess.run([a.translate, "score", "--run", a.run, "--data", a.data, "--hyp-ids", path],
                             capture_output=True, text=True, check=True)
    finally:
        os.unlink(path)
    m = re.search(r"BLEU = ([0-9.]+)", res.stdout)
    if not m:
        sys.exit(f"torch_quality.py: no BLEU in translate score's output: {res.stdout!r} {res.stderr!r}")
    return float(m.group(1))


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", required=True)
    ap.add_argument("--run", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--translate", required=True)
    ap.add_argument("--bleu", type=float, default=95.0)
    ap.add_argument("--valid-every", type=int, default=50)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    return ap.parse_args()


def run_config(run):
    """The run's model section, train section and Noam schedule, refused unless the peer can
    train the same model."""
    cfg = json.load(open(os.path.join(run, "config.json")))
    m, t = cfg["model"], cfg["train"]
    # The schedule is in the recipe (graft >= 0.6); older runs kept it at the top level.
    s = t["recipe"]["schedule"] if "recipe" in t else \
        {"schedule": "noam" if t["lr"] == 0 else "constant", "warmup": t["warmup"], "factor": t["lr_factor"]}
    if m["positions"] != "sinusoidal" or m["norm_first"] or not m["final_norm"] or m["activation"] != "relu" \
            or m["attention_dropout"] != 0 or s["schedule"] != "noam":
        sys.exit("torch_quality.py: the peer model is post-LN nn.Transformer with sinusoidal positions, "
                 "ReLU, no attention dropout and the Noam schedule; the run differs")
    if m["enc_layers"] != m["dec_layers"]:
        sys.exit("torch_quality.py: the peer needs as many encoder as decoder layers")
    return m, t, s


def batch_order(batches, order):
    """The batch of each step: graft's order first, then every batch once per epoch, shuffled."""
    shuffle, step = random.Random(1), 0
    while True:
        if step < len(order):
            yield batches[order[step]]
        else:
            if (step - len(order)) % len(batches) == 0:
                extra = list(range(len(batches)))
                shuffle.shuffle(extra)
            yield batches[extra[(step - len(order)) % len(batches)]]
        step += 1


def train_step(torch, model, opt, crit, b, lr):
    for g in opt.param_groups:
        g["lr"] = lr
    src, tin, tout = (torch.tensor(x, dtype=torch.int64) for x in b)
    logits = model(src, tin)
    loss = crit(logits.reshape(-1, logits.size(-1)), tout.reshape(-1))
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    if math.isfinite(float(norm)):
        opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def main():
    a = parse_args()
    import warnings
    warnings.filterwarnings("ignore")
    import torch
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    m, t, s = run_config(a.run)
    d, warmup, factor = m["d_model"], s["warmup"], s["factor"]
    model = torch_peer.build_seq2seq(torch, d, m["heads"], m["d_ff"], m["enc_layers"], m["vocab"], m["dropout"])
    load_graft_weights(torch, model, a.dump + ".init.safetensors")
    batches, bleu_src, order = read_dump(a.dump)
    crit = torch.nn.CrossEntropyLoss(ignore_index=PAD, label_smoothing=t["label_smoothing"])
    opt = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    model.train()
    train_s, valid_s, step, bleu, reached = 0.0, 0.0, 0, 0.0, False
    t_start = time.perf_counter()
    steps = batch_order(batches, order)
    while train_s + valid_s < a.minutes * 60 and not reached:
        step += 1
        t0 = time.perf_counter()
        lr = factor / math.sqrt(d) * min(step ** -0.5, step * warmup ** -1.5)
        loss = train_step(torch, model, opt, crit, next(steps), lr)
        train_s += time.perf_counter() - t0
        if step % a.valid_every == 0:
            t1 = time.perf_counter()
            bleu = score(a, greedy_ids(torch, model, bleu_src))
            valid_s += time.perf_counter() - t1
            print(f"step {step} loss {loss.item():.4f} valid bleu {bleu:.2f} ({train_s:.1f} s training)",
                  file=sys.stderr, flush=True)
            reached = bleu >= a.bleu
    result = {"what": "quality", "side": "pytorch", "precision": "fp32", "reached": reached,
              "step": step, "seconds_to_bleu": train_s if reached else None,
              "wall_seconds": time.perf_counter() - t_start, "bleu": bleu,
              "graft_order_steps": len(order)}
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
