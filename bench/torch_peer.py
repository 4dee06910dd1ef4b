#!/usr/bin/python3
"""PyTorch side of `make bench` (bench/run.sh runs it next to graft_bench), and the report.

  torch_peer.py --what train  --config tiny|small|base [--warmup 2] [--steps 5]
  torch_peer.py --what hvp    --config ...      (a Hessian-vector product against a training step)
  torch_peer.py --what greedy|beam --config ...       (nn.Transformer re-running the prefix)
  torch_peer.py --what greedy_cached|beam_cached --config ...  (an incremental KV-cached decoder)
  --precision bf16 (train, greedy_cached, beam_cached): under torch.autocast("cpu", dtype=torch.bfloat16)
  torch_peer.py --what lm_train|lm_sample|cls_train|cls_infer [--warmup 2] [--steps 5]
                                                      (the zoo: make lm's and make classify's models)
  torch_peer.py --what micro
  torch_peer.py --what sgemm [--n 1024]
  torch_peer.py --what version | config      (the version; one JSON line naming the BLAS, MKL, oneDNN)
  --compile (PyTorch 2.x; not micro, sgemm): the workload under torch.compile as a user writes it:
    training: the forward and the loss (its backward compiled by AOTAutograd), Adam eager;
    decoding: the encoder and the decoder step (greedy/beam: the decoder over the prefix and the
    last position's logits; *_cached, lm_sample: one cached step); cls_infer: the model. The
    warm-up steps absorb the compile time (dynamic shapes are marked after the first recompile;
    every recompile happens there); RESULT's warmup_s is the warm-up's time, compile included
    (shorter once inductor's cache under /tmp holds the kernels).
  --tag TEXT: names a tuning of the run (e.g. mkl-shim) in its RESULT line and the report.
  TORCH_PEER_PROFILE=1 (--what train): after the timing, 2 more steps under torch.profiler, the
    ops by self CPU time on stderr (where PyTorch's step goes, beside GRAFT_PROFILE=1's graft side).
  torch_peer.py --report RESULTS.jsonl --csv OUT.csv --md OUT.md   (no torch needed)

Each measuring run prints one line "RESULT {json}" with medians and the process's peak resident
memory (VmHWM) read at the end. Workloads mirror bench/graft_bench.cpp exactly: same shapes,
same deterministic batches, same hyper-parameters.
"""
import argparse
import json
import math
import os
import sys
import time

CONFIGS = {  # name: d, heads, ffn, layers (enc = dec), vocab, batch, src len, tgt len
    "tiny": (128, 4, 512, 2, 1000, 64, 24, 24),
    "small": (256, 4, 1024, 3, 8000, 64, 32, 32),
    "base": (512, 8, 2048, 6, 8000, 32, 32, 32),
}
PAD, BOS = 0, 2


def make_ids(B, L, V, salt):
    """Row b: L - (b % 4) tokens then padding; token (b, t) = 4 + (131 b + 31 t + 17 salt) % (V - 4)."""
    rows = []
    for b in range(B):
        n = L - (b % 4)
        rows.append([4 + (b * 131 + t * 31 + salt * 17) % (V - 4) if t < n else PAD for t in range(L)])
    return rows


def peak_rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return -1.0


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def time_median(warmup, steps, f, warm=None):
    """warmup calls of warm (default f), then the median of steps timed calls of f."""
    t0 = time.perf_counter()
    for _ in range(warmup):
        (warm or f)()
    PEER["warmup_s"] = round(time.perf_counter() - t0, 3)  # under --compile: with the compile time
    ts = []
    for _ in range(steps):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return median(ts)


def ids_crc(ys):
    """CRC-32 of the generated ids: the two greedy peers must agree."""
    import zlib
    return zlib.crc32(" ".join(map(str, ys.reshape(-1).tolist())).encode())


PEER = {}  # the PyTorch configuration, added to every RESULT line: torch, compile, tag, warmup_s


def emit(d):
    print("RESULT " + json.dumps({**d, **PEER}), flush=True)


def compiled(torch, a, f):
    """torch.compile(f) under --compile, else f itself."""
    return torch.compile(f) if a.compile else f


# --------------------------------------------------------------------------------------------
# The model: nn.Transformer (post-LN, final LayerNorm after each stack, ReLU, dropout 0.1) with
# one embedding shared by source, target and the output projection, scaled by sqrt(d), plus
# sinusoidal positions and dropout, as graft's models::Transformer. graft's fused attention has
# no dropout on the attention probabilities, so the peer's MultiheadAttention dropout is set to
# 0 (residual, FFN and embedding dropout stay 0.1 on both sides).

def build_model(torch, name):
    d, h, ff, L, V, _, _, _ = CONFIGS[name]
    return build_seq2seq(torch, d, h, ff, L, V)


def build_seq2seq(torch, d, h, ff, L, V, dropout=0.1):
    nn = torch.nn
    F = torch.nn.functional

    class Seq2Seq(nn.Module):
        def __init__(self):
            super().__init__()
            self.d = d
            self.embedding = nn.Embedding(V, d, padding_idx=PAD)
            nn.init.normal_(self.embedding.weight, 0.0, d ** -0.5)
            with torch.no_grad():
                self.embedding.weight[PAD].zero_()
            self.tr = nn.Transformer(d, h, L, L, ff, dropout, batch_first=True, norm_first=False)
            for m in self.tr.modules():
                if isinstance(m, nn.MultiheadAttention):
                    m.dropout = 0.0
            pos = torch.arange(256, dtype=torch.float32)[:, None]
            div = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
            pe = torch.zeros(256, d)
            pe[:, 0::2] = torch.sin(pos * div)
            pe[:, 1::2] = torch.cos(pos * div)
            self.register_buffer("pe", pe)
            self.drop = nn.Dropout(dropout)

        def embed(self, ids):
            return self.drop(self.embedding(ids) * math.sqrt(self.d) + self.pe[: ids.size(1)])

        def forward(self, src, tgt_in):
            T = tgt_in.size(1)
            mask = self.tr.generate_square_subsequent_mask(T)
            src_pad, tgt_pad = src == PAD, tgt_in == PAD
            hdec = self.tr(self.embed(src), self.embed(tgt_in), tgt_mask=mask,
                           src_key_padding_mask=src_pad, tgt_key_padding_mask=tgt_pad,
                           memory_key_padding_mask=src_pad)
            return F.linear(hdec, self.embedding.weight)

    return Seq2Seq()


def run_train(torch, a):
    F = torch.nn.functional
    d, h, ff, L, V, B, S, T = CONFIGS[a.config]
    torch.manual_seed(1)
    model = build_model(torch, a.config)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    crit = torch.nn.CrossEntropyLoss(ignore_index=PAD, label_smoothing=0.1)
    src = torch.tensor(make_ids(B, S, V, 1), dtype=torch.int64)
    tgt = torch.tensor(make_ids(B, T + 1, V, 2), dtype=torch.int64)
    tgt[:, 0] = BOS
    tgt_in, tgt_out = tgt[:, :-1].contiguous(), tgt[:, 1:].reshape(-1).contiguous()
    target_tokens = int((tgt_out != PAD).sum())
    state = {}

    def forward_loss():
        with autocast(torch, a):  # bf16: the matmuls in bf16, as torch.autocast decides
            return crit(model(src, tgt_in).reshape(-1, V), tgt_out)  # logits not held (as graft)
    forward_loss = compiled(torch, a, forward_loss)

    def step():
        loss = forward_loss()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)  # graft drops grads too (PyTorch 2's default)
        state["loss"] = loss.item()

    t = time_median(a.warmup, a.steps, step)
    if os.environ.get("TORCH_PEER_PROFILE"):  # where a step goes: 2 more steps, by op, on stderr
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(2):
                step()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20),
              file=sys.stderr)
    emit({"what": "train", "config": a.config, "ms": t * 1e3, "tok_s": target_tokens / t,
          "target_tokens": target_tokens, "params": sum(p.numel() for p in model.parameters()),
          "loss": state["loss"], "peak_rss_mib": peak_rss_mib(), "precision": a.precision})


def run_hvp(torch, a):
    """A Hessian-vector product of the train loss (autograd.grad with create_graph, then the
    backward of g with grad_outputs v: H v, the gradient of g . v) against a training step's
    forward and backward, as graft_bench --what hvp.
    Attention on the math backend: the fused CPU kernels have no double backward."""
    d, h, ff, L, V, B, S, T = CONFIGS[a.config]
    torch.manual_seed(1)
    model = build_model(torch, a.config)
    model.train()
    crit = torch.nn.CrossEntropyLoss(ignore_index=PAD, label_smoothing=0.1)
    src = torch.tensor(make_ids(B, S, V, 1), dtype=torch.int64)
    tgt = torch.tensor(make_ids(B, T + 1, V, 2), dtype=torch.int64)
    tgt[:, 0] = BOS
    tgt_in, tgt_out = tgt[:, :-1].contiguous(), tgt[:, 1:].reshape(-1).contiguous()
    params = [p for p in model.parameters() if p.requires_grad]
    gen = torch.Generator().manual_seed(5)
    v = [torch.randn(p.shape, generator=gen) for p in params]
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def loss():
        return crit(model(src, tgt_in).reshape(-1, V), tgt_out)

    def step():
        loss().backward()
        model.zero_grad(set_to_none=True)

    def hvp():
        g = torch.autograd.grad(loss(), params, create_graph=True)
        torch.autograd.grad(g, params, grad_outputs=v)

    def timed(f):
        t0 = time.perf_counter()
        f()
        return time.perf_counter() - t0

    steps, hvps = [], []
    with sdpa_kernel(SDPBackend.MATH):  # steps and HVPs alternate, as graft_bench's
        t0 = time.perf_counter()
        for i in range(a.warmup + a.steps):
            if i == a.warmup:
                PEER["warmup_s"] = round(time.perf_counter() - t0, 3)
            ts, th = timed(step), timed(hvp)
            if i >= a.warmup:
                steps.append(ts)
                hvps.append(th)
    t_step, t_hvp = median(steps), median(hvps)
    emit({"what": "hvp", "config": a.config, "step_ms": t_step * 1e3, "hvp_ms": t_hvp * 1e3,
          "hvp_over_step": t_hvp / t_step,
          "hvp_over_step_paired": median([h / s for h, s in zip(hvps, steps)]),
          "peak_rss_mib": peak_rss_mib()})


def autocast(torch, a):
    """torch.autocast("cpu", dtype=torch.bfloat16) under --precision bf16, else a no-op."""
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16")


def run_decode(torch, a, beam):
    """Decoding as nn.Transformer users write it: encode once, then re-run the decoder over the
    whole prefix at every step and project only the last position. No early stop."""
    F = torch.nn.functional
    d, h, ff, L, V, _, _, _ = CONFIGS[a.config]
    B, S, NEW = 32, 32, 32
    torch.manual_seed(1)
    model = build_model(torch, a.config)
    model.eval()
    src = torch.tensor(make_ids(B, S, V, 3), dtype=torch.int64)
    W = model.embedding.weight

    def encode(src, src_pad):
        return model.tr.encoder(model.embed(src), src_key_padding_mask=src_pad)

    def last_logits(ys, memory, src_pad):
        """The decoder over the whole prefix ys; the logits of its last position."""
        mask = model.tr.generate_square_subsequent_mask(ys.size(1))
        out = model.tr.decoder(model.embed(ys), memory, tgt_mask=mask,
                               memory_key_padding_mask=src_pad)
        return F.linear(out[:, -1], W)
    encode, last_logits = compiled(torch, a, encode), compiled(torch, a, last_logits)

    def greedy(NEW=NEW):
        with torch.no_grad():
            src_pad = src == PAD
            memory = encode(src, src_pad)
            ys = torch.full((B, 1), BOS, dtype=torch.int64)
            for _ in range(NEW):
                nxt = last_logits(ys, memory, src_pad).argmax(-1)
                ys = torch.cat([ys, nxt[:, None]], 1)
            return ys

    def beam_search(NEW=NEW):
        K = beam
        with torch.no_grad():
            src_pad = src == PAD
            memory = encode(src, src_pad)
            memory = memory.repeat_interleave(K, 0)
            src_pad = src_pad.repeat_interleave(K, 0)
            ys = torch.full((B * K, 1), BOS, dtype=torch.int64)
            score = torch.full((B, K), float("-inf"))
            score[:, 0] = 0.0
            base = (torch.arange(B) * K)[:, None]
            for _ in range(NEW):
                logp = F.log_softmax(last_logits(ys, memory, src_pad), -1)
                cand = (score.reshape(B * K, 1) + logp).reshape(B, K * V)
                score, idx = cand.topk(K, dim=1)
                rows = (base + torch.div(idx, V, rounding_mode="floor")).reshape(-1)
                ys = torch.cat([ys[rows], (idx % V).reshape(-1, 1)], 1)
            return ys[::K]

    t, ys = time_decode(a, beam_search if beam > 1 else greedy)
    emit({"what": "beam" if beam > 1 else "greedy", "config": a.config, "beam": beam,
          "ms": t * 1e3, "tok_s": B * NEW / t, "produced": int(ys[:, 1:].numel()),
          "ids_crc": ids_crc(ys[:, 1:]),
          "peak_rss_mib": peak_rss_mib()})


def time_decode(a, f):
    """Warm-up runs of 4 new tokens, then the median of a.steps full runs: (seconds, last ids)."""
    res = {}
    t = time_median(a.warmup, a.steps, lambda: res.__setitem__("ys", f()), warm=lambda: f(4))
    return t, res["ys"]


def cached_decoding_model(torch, a):
    """The decoding model (seed 1, eval mode) and the 32 x 32 source batch, for the KV-cached
    peers. Under bf16, 1.13's fused encoder-layer fast path (taken in eval mode) fails under
    autocast ("expected scalar type BFloat16 but found Float"): the layers run their ordinary
    path, in train mode with every dropout module in eval mode, i.e. the same computation."""
    V = CONFIGS[a.config][4]
    torch.manual_seed(1)
    model = build_model(torch, a.config)
    model.eval()
    if a.precision == "bf16":
        for lyr in model.tr.encoder.layers:
            lyr.train()
            for m in lyr.modules():
                if isinstance(m, torch.nn.Dropout):
                    m.eval()
    return model, torch.tensor(make_ids(32, 32, V, 3), dtype=torch.int64)


def incremental_decoder(torch, model):
    """nn.Transformer's decoder run one new position at a time, the way fairseq's incremental
    decoding does it, on the model's own weights: per layer, the self-attention keys and values
    of earlier positions are kept in `cache` and the new position's appended; the cross-attention
    keys and values of the encoder output come from cross_kv, computed once. Post-LN layers,
    ReLU, final LayerNorm, as graft's cached decoding. Returns (cross_kv, step)."""
    F = torch.nn.functional
    d, h = model.tr.d_model, model.tr.nhead
    hd = d // h
    layers = model.tr.decoder.layers

    def heads(x):  # (N, T, d) -> (N, h, T, hd)
        return x.view(x.size(0), -1, h, hd).transpose(1, 2)

    def attend(q, k, v, pad=None):
        s = torch.matmul(q, k.transpose(-2, -1)) * hd ** -0.5
        if pad is not None:
            s = s.masked_fill(pad[:, None, None, :], float("-inf"))
        o = torch.matmul(torch.softmax(s, -1), v)
        return o.transpose(1, 2).reshape(q.size(0), -1, d)

    def cross_kv(memory):
        """Per layer: (k, v) of the encoder output."""
        cross = []
        for lyr in layers:
            _, wk, wv = lyr.multihead_attn.in_proj_weight.chunk(3)
            _, bk, bv = lyr.multihead_attn.in_proj_bias.chunk(3)
            cross.append((heads(F.linear(memory, wk, bk)), heads(F.linear(memory, wv, bv))))
        return cross

    def step(tok, t, cache, cross, src_pad):
        """Decodes position t for tok (N, 1), appending its keys and values to cache (a list
        with one (k, v) or None per layer); returns the logits (N, V)."""
        x = model.drop(model.embedding(tok) * math.sqrt(d) + model.pe[t:t + 1])
        for i, lyr in enumerate(layers):
            qkv = F.linear(x, lyr.self_attn.in_proj_weight, lyr.self_attn.in_proj_bias)
            q, k, v = (heads(y) for y in qkv.chunk(3, -1))
            if cache[i] is not None:
                k = torch.cat([cache[i][0], k], 2)
                v = torch.cat([cache[i][1], v], 2)
            cache[i] = (k, v)
            x = lyr.norm1(x + lyr.self_attn.out_proj(attend(q, k, v)))
            wq = lyr.multihead_attn.in_proj_weight[:d]
            bq = lyr.multihead_attn.in_proj_bias[:d]
            ca = lyr.multihead_attn.out_proj(
                attend(heads(F.linear(x, wq, bq)), cross[i][0], cross[i][1], src_pad))
            x = lyr.norm2(x + ca)
            x = lyr.norm3(x + lyr.linear2(F.relu(lyr.linear1(x))))
        x = model.tr.decoder.norm(x)
        return F.linear(x[:, -1], model.embedding.weight)

    return cross_kv, step


def cached_compiled(torch, a, model, step):
    """The KV-cached peers' encoder and decoder step, compiled under --compile: (encode, step)."""
    def encode(src, src_pad):
        return model.tr.encoder(model.embed(src), src_key_padding_mask=src_pad)
    return compiled(torch, a, encode), compiled(torch, a, step)


def run_decode_cached(torch, a):
    """Greedy decoding with the incremental KV-cached decoder: each step runs the decoder on
    the new position only, as graft's cached decoding does."""
    model, src = cached_decoding_model(torch, a)
    cross_kv, step = incremental_decoder(torch, model)
    encode, step = cached_compiled(torch, a, model, step)
    B, NEW = src.size(0), 32

    def greedy(NEW=NEW):
        with torch.no_grad(), autocast(torch, a):
            src_pad = src == PAD
            memory = encode(src, src_pad)
            cross = cross_kv(memory)
            cache = [None] * len(model.tr.decoder.layers)
            tok = torch.full((B, 1), BOS, dtype=torch.int64)
            out_ids = []
            for t in range(NEW):
                tok = step(tok, t, cache, cross, src_pad).argmax(-1)[:, None]
                out_ids.append(tok)
            return torch.cat(out_ids, 1)

    t, ys = time_decode(a, greedy)
    emit({"what": "greedy_cached", "config": a.config, "beam": 1, "ms": t * 1e3,
          "tok_s": B * NEW / t, "produced": int(ys.numel()), "ids_crc": ids_crc(ys),
          "peak_rss_mib": peak_rss_mib(),
          "precision": a.precision})


def run_beam_cached(torch, a):
    """Beam search exactly as run_decode's (no length penalty, no early stop, the best beam of
    each source), on the incremental KV-cached decoder: each step the self-attention caches
    follow the surviving beams (index_select on the batch dim, as fairseq's reorder of its
    incremental state), and the cross-attention keys and values of the B*K expanded encoder
    output are computed once."""
    F = torch.nn.functional
    V = CONFIGS[a.config][4]
    model, src = cached_decoding_model(torch, a)
    cross_kv, step = incremental_decoder(torch, model)
    encode, step = cached_compiled(torch, a, model, step)
    B, NEW, K = src.size(0), 32, a.beam

    def beam_search(NEW=NEW):
        with torch.no_grad(), autocast(torch, a):
            src_pad = src == PAD
            memory = encode(src, src_pad)
            src_pad = src_pad.repeat_interleave(K, 0)
            cross = cross_kv(memory.repeat_interleave(K, 0))
            cache = [None] * len(model.tr.decoder.layers)
            ys = torch.full((B * K, 1), BOS, dtype=torch.int64)
            score = torch.full((B, K), float("-inf"))
            score[:, 0] = 0.0
            base = (torch.arange(B) * K)[:, None]
            for t in range(NEW):
                # scores in float32 also under bf16: beam sums of log-probabilities
                logp = F.log_softmax(step(ys[:, -1:], t, cache, cross, src_pad).float(), -1)
                cand = (score.reshape(B * K, 1) + logp).reshape(B, K * V)
                score, idx = cand.topk(K, dim=1)
                rows = (base + torch.div(idx, V, rounding_mode="floor")).reshape(-1)
                ys = torch.cat([ys[rows], (idx % V).reshape(-1, 1)], 1)
                cache[:] = [(k.index_select(0, rows), v.index_select(0, rows)) for k, v in cache]
            return ys[::K]

    t, ys = time_decode(a, beam_search)
    emit({"what": "beam_cached", "config": a.config, "beam": K, "ms": t * 1e3,
          "tok_s": B * NEW / t, "produced": int(ys[:, 1:].numel()), "ids_crc": ids_crc(ys[:, 1:]),
          "peak_rss_mib": peak_rss_mib(), "precision": a.precision})


def run_sgemm(torch, a):
    n = a.n
    x, y = torch.randn(n, n), torch.randn(n, n)
    t = time_median(max(a.warmup, 2), max(a.steps, 5), lambda: torch.mm(x, y))
    emit({"what": "sgemm", "n": n, "ms": t * 1e3, "gflops": 2.0 * n ** 3 / t / 1e9,
          "coretype": os.environ.get("OPENBLAS_CORETYPE", "")})


def blas_config(torch):
    """What this PyTorch runs its matmuls on, from torch.__config__.show(): the BLAS, the MKL and
    oneDNN versions, the OpenMP runtime."""
    show = torch.__config__.show()

    def line_with(*keys):
        for ln in show.splitlines():
            if all(k in ln for k in keys):
                return ln.strip().lstrip("- ").strip()
        return ""
    blas = line_with("BLAS_INFO=")
    blas = blas.split("BLAS_INFO=")[1].split(",")[0] if blas else "?"
    return {"torch": torch.__version__, "blas_info": blas,
            "mkl": line_with("Math Kernel Library") or "(none)",
            "onednn": line_with("MKL-DNN") or line_with("oneDNN") or "(none)",
            "openmp": line_with("OpenMP") or "?", "compile": hasattr(torch, "compile")}


def run_micro(torch, a):
    F = torch.nn.functional
    torch.manual_seed(11)
    ops = []

    def fwd_bwd(leaves, fwd, up):
        def f():
            for l in leaves:
                l.grad = None
            y = fwd()
            if up is None:
                y.backward()
            else:
                y.backward(up)
        return time_median(max(a.warmup, 2), max(a.steps, 7), f)

    def row(op, shape, t, amount, unit):
        ops.append({"op": op, "shape": shape, "ms": t * 1e3, "value": amount / t / 1e9, "unit": unit})

    M, K, N = 4096, 512, 2048
    x = torch.randn(M, K, requires_grad=True)
    w = (torch.randn(N, K) * 0.05).requires_grad_()
    b = torch.randn(N, requires_grad=True)
    up = torch.randn(M, N)
    row("linear", "x 4096x512, W 2048x512", fwd_bwd([x, w, b], lambda: F.linear(x, w, b), up),
        6.0 * M * N * K, "GFLOP/s")

    B, H, T, D = 32, 8, 128, 64
    q, k, v = (torch.randn(B, H, T, D, requires_grad=True) for _ in range(3))
    up = torch.randn(B, H, T, D)
    scale = 1.0 / math.sqrt(D)

    def attn():  # what nn.MultiheadAttention does in 1.13: scaled QK^T, softmax, times V
        return torch.matmul(torch.softmax(torch.matmul(q * scale, k.transpose(-2, -1)), -1), v)
    row("attention", "q,k,v 32x8x128x64", fwd_bwd([q, k, v], attn, up), 12.0 * B * H * T * T * D,
        "GFLOP/s")

    R, C = 8192, 512
    x = torch.randn(R, C, requires_grad=True)
    w = torch.randn(C, requires_grad=True)
    bb = torch.randn(C, requires_grad=True)
    up = torch.randn(R, C)
    row("layer_norm", "8192x512", fwd_bwd([x, w, bb], lambda: F.layer_norm(x, (C,), w, bb, 1e-5), up),
        5.0 * R * C * 4, "GB/s")

    R, C = 32768, 128
    x = torch.randn(R, C, requires_grad=True)
    up = torch.randn(R, C)
    row("softmax", "32768x128", fwd_bwd([x], lambda: torch.softmax(x, -1), up), 5.0 * R * C * 4, "GB/s")

    N, V = 2048, 8000
    x = torch.randn(N, V, requires_grad=True)
    tgt = torch.tensor([PAD if i % 16 == 0 else 1 + (i * 7919) % (V - 1) for i in range(N)])
    row("cross_entropy", "2048x8000",
        fwd_bwd([x], lambda: F.cross_entropy(x, tgt, ignore_index=PAD, label_smoothing=0.1), None),
        3.0 * N * V * 4, "GB/s")
    emit({"what": "micro", "ops": ops})


# --------------------------------------------------------------------------------------------
# The model zoo (graft_bench's "the model zoo" section): the decoder-only LM `make lm` trains
# and the encoder classifier `make classify` trains, with the same shapes, batches and
# hyper-parameters as graft's side.

# examples/lm's preset lm-mini with the Makefile's --positions rope and the program's defaults:
# byte vocabulary 259 (PAD 258), pre-LN, ReLU, dropout 0, tied embedding, final LayerNorm, no
# label smoothing; batches of 16 rows x 128 tokens.
LM = dict(d=128, h=4, ff=512, L=2, V=259, pad=258, rows=16, ctx=128, dropout=0.0, rope_base=10000.0)
# examples/classify's defaults: d 64, 4 heads, FFN 128, 2 layers, post-LN without a final
# LayerNorm, sinusoidal positions, ReLU, dropout 0.3, byte 2..5-gram inputs hashed into 262,144
# rows (+1 "no n-gram" row), 8 classes, PAD 256, max_len 160; one batch of 512 lines of
# 64 - (b % 8) bytes (the training lines' median is 57).
CLS = dict(d=64, h=4, ff=128, L=2, V=257, pad=256, classes=8, max_len=160, buckets=262144,
           ngram_max=5, dropout=0.3, rows=512, len=64)


def byte_ids(B, L, salt, short_mod, pad):
    """Row b: L - (b % short_mod) tokens then pad; token (b, t) = (131 b + 31 t + 17 salt) % 256."""
    return [[(b * 131 + t * 31 + salt * 17) % 256 if t < L - (b % short_mod) else pad
             for t in range(L)] for b in range(B)]


def lm_block_class(torch):
    """build_lm's pre-LN block: attention with a fused q,k,v projection and biases (RoPE on
    queries and keys, "rotate half"), FFN with ReLU; forward(x, cos, sin, mask, cache)."""
    nn, F = torch.nn, torch.nn.functional
    d, h, ff, p = LM["d"], LM["h"], LM["ff"], LM["dropout"]
    hd = d // h

    def rope(x, cos, sin):
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.out_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.linear1, self.linear2 = nn.Linear(d, ff), nn.Linear(ff, d)
            self.drop = nn.Dropout(p)

        def attn(self, x, cos, sin, mask, cache):
            B, T, _ = x.shape
            q, k, v = (y.view(B, T, h, hd).transpose(1, 2) for y in self.qkv(x).chunk(3, -1))
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            if cache is not None:
                if cache:
                    k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
                cache[:] = [k, v]
            s = torch.matmul(q, k.transpose(-2, -1)) * hd ** -0.5
            o = torch.matmul(torch.softmax(s.masked_fill(mask, float("-inf")), -1), v)
            return self.out_proj(o.transpose(1, 2).reshape(B, T, d))

        def forward(self, x, cos, sin, mask, cache):
            x = x + self.drop(self.attn(self.norm1(x), cos, sin, mask, cache))
            return x + self.drop(self.linear2(self.drop(F.relu(self.linear1(self.norm2(x))))))

    return Block


def build_lm(torch):
    """A nanoGPT-style causal Transformer with graft's DecoderOnlyLM's structure: pre-LN blocks
    (attention with a fused q,k,v projection and biases, FFN with ReLU), RoPE on queries and keys
    ("rotate half", as graft's ops/rope.h), a final LayerNorm, logits through the tied embedding.
    forward(ids, start, caches): caches None in training; else one [k, v] list per block that
    grows with each call (the keys and values after RoPE), queries at positions start.."""
    nn, F = torch.nn, torch.nn.functional
    d, L, V, p, n = LM["d"], LM["L"], LM["V"], LM["dropout"], LM["ctx"]
    hd = d // LM["h"]
    inv = LM["rope_base"] ** (-torch.arange(0, hd // 2, dtype=torch.float32) * 2.0 / hd)
    ang = torch.arange(n, dtype=torch.float32)[:, None] * inv[None, :]
    Block = lm_block_class(torch)

    class LMModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(V, d, padding_idx=LM["pad"])
            nn.init.normal_(self.embedding.weight, 0.0, 0.02)
            self.drop = nn.Dropout(p)
            self.blocks = nn.ModuleList(Block() for _ in range(L))
            self.norm = nn.LayerNorm(d)
            self.register_buffer("cos", ang.cos())
            self.register_buffer("sin", ang.sin())
            self.register_buffer("future", torch.ones(n, n, dtype=torch.bool).triu(1))

        def forward(self, ids, start=0, caches=None, last=False):
            T = ids.size(1)
            cos, sin = self.cos[start:start + T], self.sin[start:start + T]
            mask = self.future[start:start + T, :start + T]  # key after query: masked
            x = self.drop(self.embedding(ids))
            for i, blk in enumerate(self.blocks):
                x = blk(x, cos, sin, mask, None if caches is None else caches[i])
            x = self.norm(x)
            return F.linear(x[:, -1:] if last else x, self.embedding.weight)  # last: as graft's generate

    return LMModel()


def adam(torch, model):
    """The optimiser of the training rows (dense Adam, as graft's)."""
    return torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)


def train_rows(torch, a, what, config, model, loss_fn, tokens):
    """Times forward + backward + Adam (median of a.steps after a.warmup) and emits the row."""
    opt, state = adam(torch, model), {}
    model.train()
    loss_fn = compiled(torch, a, loss_fn)

    def step():
        loss = loss_fn()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        state["loss"] = loss.item()

    t = time_median(a.warmup, a.steps, step)
    emit({"what": what, "config": config, "ms": t * 1e3, "tok_s": tokens / t, "tokens": tokens,
          "params": sum(p.numel() for p in model.parameters()), "loss": state["loss"],
          "peak_rss_mib": peak_rss_mib(), "precision": "fp32"})


def run_lm_train(torch, a):
    F = torch.nn.functional
    torch.manual_seed(1)
    model = build_lm(torch)
    R, T, V = LM["rows"], LM["ctx"], LM["V"]
    w = torch.tensor(byte_ids(R, T + 1, 4, 1, LM["pad"]), dtype=torch.int64)
    inp, tgt = w[:, :-1].contiguous(), w[:, 1:].reshape(-1).contiguous()
    train_rows(torch, a, "lm_train", "lm-mini", model,
               lambda: F.cross_entropy(model(inp).reshape(-1, V), tgt), R * T)


def run_lm_sample(torch, a):
    """Sampling at temperature 1 (softmax, torch.multinomial, a seeded generator) with the KV
    cache of build_lm: the prompts in one pass, then one new position per step; 32 prompts of
    32 bytes, 64 new tokens, no early stop (as graft's models::generate here)."""
    torch.manual_seed(1)
    model = build_lm(torch)
    model.eval()
    B, P, NEW = 32, 32, 64
    prompts = torch.tensor(byte_ids(B, P, 5, 1, LM["pad"]), dtype=torch.int64)
    forward = compiled(torch, a, model)

    def sample(new=NEW):
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            caches, x, start, out = [[] for _ in model.blocks], prompts, 0, []
            for _ in range(new):
                logits = forward(x, start, caches, last=True)[:, -1]
                start += x.size(1)
                x = torch.multinomial(torch.softmax(logits / 1.0, -1), 1, generator=gen)
                out.append(x)
            return torch.cat(out, 1)

    res = {}  # warm-up: 4 new tokens, as graft's
    t = time_median(a.warmup, a.steps, lambda: res.__setitem__("ys", sample()), warm=lambda: sample(4))
    emit({"what": "lm_sample", "config": "lm-mini", "ms": t * 1e3, "tok_s": B * NEW / t,
          "produced": int(res["ys"].numel()), "params": sum(p.numel() for p in model.parameters()),
          "peak_rss_mib": peak_rss_mib(), "precision": "fp32"})


def build_classifier(torch):
    """graft's EncoderClassifier in PyTorch: (token embedding + the sum of the ngram_max - 1
    n-gram embeddings) * sqrt(d) + sinusoidal positions, dropout, nn.TransformerEncoder (post-LN,
    ReLU, no final LayerNorm; attention-probability dropout 0 as graft's), the mean over the
    non-pad positions, a linear head. forward(ids, ngram_ids (B, T, ngram_max - 1))."""
    nn, F = torch.nn, torch.nn.functional
    c = CLS
    d, p = c["d"], c["dropout"]

    class Classifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(c["V"], d, padding_idx=c["pad"])
            self.ngrams = nn.Embedding(c["buckets"] + 1, d)  # dense gradients, as graft's
            for e in (self.embedding, self.ngrams):
                nn.init.normal_(e.weight, 0.0, d ** -0.5)
            with torch.no_grad():
                self.embedding.weight[c["pad"]].zero_()
            pos = torch.arange(c["max_len"], dtype=torch.float32)[:, None]
            div = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
            pe = torch.zeros(c["max_len"], d)
            pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * div), torch.cos(pos * div)
            self.register_buffer("pe", pe)
            self.drop = nn.Dropout(p)
            layer = nn.TransformerEncoderLayer(d, c["h"], c["ff"], p, batch_first=True, norm_first=False)
            self.encoder = nn.TransformerEncoder(layer, c["L"])
            for m in self.encoder.modules():
                if isinstance(m, nn.MultiheadAttention):
                    m.dropout = 0.0
            self.head = nn.Linear(d, c["classes"])

        def forward(self, ids, ngram_ids):
            pad = ids == c["pad"]
            x = (self.embedding(ids) + self.ngrams(ngram_ids).sum(2)) * math.sqrt(d)
            hid = self.encoder(self.drop(x + self.pe[: ids.size(1)]), src_key_padding_mask=pad)
            keep = (~pad).to(hid.dtype)
            w = keep / keep.sum(1, keepdim=True).clamp_min(1.0)
            return self.head((hid * w[..., None]).sum(1))

    return Classifier()


def cls_batch(torch):
    """The 512 lines, their labels (b % 8) and n-gram rows. graft hashes each line's n-grams
    (FNV-1a + splitmix64, models/encoder_classifier.cpp); here the rows are random ids of the
    same shape, "no n-gram" where graft has it (pad positions and n-grams starting before the
    line): the throughput does not depend on which rows the hash picks."""
    c, K = CLS, CLS["ngram_max"] - 1
    ids = torch.tensor(byte_ids(c["rows"], c["len"], 6, 8, c["pad"]), dtype=torch.int64)
    g = torch.Generator().manual_seed(1)
    ng = torch.randint(0, c["buckets"], (c["rows"], c["len"], K), generator=g)
    pos = torch.arange(c["len"])[None, :, None]
    n = torch.arange(2, c["ngram_max"] + 1)[None, None, :]
    none = (ids == c["pad"])[..., None] | (pos + 1 < n)  # no pad inside a line: only its tail
    ng = ng.masked_fill(none, c["buckets"])
    return ids, torch.arange(c["rows"]) % c["classes"], ng, int((ids != c["pad"]).sum())


def run_cls_train(torch, a):
    F = torch.nn.functional
    torch.manual_seed(1)
    model = build_classifier(torch)
    ids, labels, ng, tokens = cls_batch(torch)
    train_rows(torch, a, "cls_train", "classify", model,
               lambda: F.cross_entropy(model(ids, ng), labels), tokens)


def run_cls_infer(torch, a):
    """The same 512 lines in batches of 64 rows (as classify evaluate), eval mode, no grad:
    nn.TransformerEncoder takes 1.13's fast path here (nested tensors skip the padding)."""
    torch.manual_seed(1)
    model = build_classifier(torch)
    model.eval()
    ids, _, ng, tokens = cls_batch(torch)
    batches = list(zip(ids.split(64), ng.split(64)))
    res, forward = {}, compiled(torch, a, model)

    def infer():
        with torch.no_grad():
            res["n"] = sum(forward(i, g).argmax(-1).numel() for i, g in batches)

    t = time_median(a.warmup, a.steps, infer)
    emit({"what": "cls_infer", "config": "classify", "ms": t * 1e3, "tok_s": tokens / t,
          "tokens": tokens, "predicted": res["n"], "params": sum(p.numel() for p in model.parameters()),
          "peak_rss_mib": peak_rss_mib(), "precision": "fp32"})


# --------------------------------------------------------------------------------------------
# Report: one table from the RESULT lines of both sides.

def model_flops(name):
    """Analytic FLOPs of one training step (forward + backward), counting every position
    (padding included, the work is dense):
      matmuls: 6 * sum over weight matrices of (rows x cols) * tokens it is applied to
        encoder layer: (4 d^2 + 2 d ff) on B*S tokens
        decoder layer: (4 d^2 + 2 d^2 + 2 d ff) on B*T tokens (self q,k,v,o; cross q,o; FFN)
                       + 2 d^2 on B*S memory tokens (cross k,v)
        output projection (tied embedding): d V on B*T tokens
      attention: 12 * B * d * (L_enc S^2 + L_dec (T^2 + T S))  (QK^T and PV, forward 4 and
        backward 8 FLOPs per multiply-add pair; the causal half is counted in full)"""
    d, h, ff, L, V, B, S, T = CONFIGS[name]
    mm = (B * S * L * (4 * d * d + 2 * d * ff) + B * T * L * (6 * d * d + 2 * d * ff)
          + B * S * L * 2 * d * d + B * T * d * V)
    att = 12 * B * d * (L * S * S + L * (T * T + T * S))
    return 6 * mm + att


# The zoo's rows: --what, benchmark name, config column, unit.
ZOO_ROWS = (
    ("lm_train", "lm_train_throughput", "lm-mini rope, 16 x 128 tokens", "tok/s"),
    ("lm_sample", "lm_sample_cached", "lm-mini rope, 32 prompts x 32 bytes, 64 new", "new tok/s"),
    ("cls_train", "cls_train_throughput", "classify, 512 lines x 57-64 bytes", "tok/s"),
    ("cls_infer", "cls_infer_throughput", "classify, 512 lines, batches of 64", "tok/s"),
)


def peer_label(side, r):
    """A PyTorch configuration's name in the report: its version, eager or compiled, its tag."""
    v = r.get("torch") or ("1.13" if side == "pytorch" else "2.x")
    label = ".".join(v.split("+")[0].split(".")[:2]) + (" compiled" if r.get("compile") else " eager")
    return label + (" " + r["tag"] if r.get("tag") else "")


def matches(r, what, config, precision, kw):
    """Whether result record r is of benchmark `what`, config (None: any), precision and the
    other fields kw."""
    return r.get("what") == what and (config is None or r.get("config") == config) and \
        r.get("precision", "fp32") == precision and all(r.get(k) == v for k, v in kw.items())


class Report:
    """The rows of the report: graft against the fastest PyTorch configuration of each row."""

    def __init__(self, path):
        self.res = {"graft": []}
        for line in open(path):
            line = line.strip()
            if not line:
                continue
            side, js = line.split(" ", 1)
            self.res.setdefault(side, []).append(json.loads(js))
        self.rows = []  # benchmark, config, graft, pytorch, unit, ratio, PyTorch configuration
        self.by_peer = []  # benchmark, config, unit, [(label, value)]: every PyTorch configuration
        self.profile_lines = []  # the per-family split of the base steps, below the table
        peak = self.find("graft", "sgemm", n=2048)
        self.peak_gflops = peak["gflops"] if peak else float("nan")

    def find(self, side, what, config=None, precision="fp32", **kw):
        return next((r for r in self.res[side] if matches(r, what, config, precision, kw)), None)

    def graft_train(self, config, precision="fp32"):
        """graft's training row: the run of median step time among graft's runs of it (run.sh's,
        and one next to each PyTorch 2.x row of the config when torch2.sh ran), so a row is not
        decided by the minute graft happened to run in."""
        runs = sorted((r for r in self.res["graft"] if matches(r, "train", config, precision, {})),
                      key=lambda r: r["ms"])
        return runs[(len(runs) - 1) // 2] if runs else None

    def peers(self, what, config=None, precision="fp32", value=None, **kw):
        """Every PyTorch configuration's value for a row: [(label, value)]; value(record) or
        the record itself."""
        return [(peer_label(side, r), value(r) if value else r)
                for side in self.res if side != "graft"
                for r in self.res[side] if matches(r, what, config, precision, kw)]

    def add(self, bench, config, g, p, unit, higher_better, peer=""):
        """p: a number (peer names what it is) or [(label, value)], of which the best (the
        fastest; for memory, the smallest) is the row's PyTorch value."""
        if isinstance(p, list):
            cands = [(l, v) for l, v in p if v is not None]
            if len(p) > 1:
                self.by_peer.append((bench, config, unit, cands))
            best = (max if higher_better else min)(cands, key=lambda lv: lv[1]) if cands else ("", None)
            peer, p = best
        if g is None or p is None:
            ratio = float("nan")
        elif higher_better:
            ratio = g / p if p else float("nan")
        else:
            ratio = p / g if g else float("nan")
        self.rows.append((bench, config, g, p, unit, ratio, peer))


def key(k):
    return lambda r: r[k]


def gk(r, k):
    return r[k] if r else None


def add_hvp_and_train_rows(R):
    for c in CONFIGS:  # Hessian-vector products (PyTorch 2.x only)
        g = R.find("graft", "hvp", c)
        if g is None:
            continue
        R.add("hvp_time", c, gk(g, "hvp_ms"), R.peers("hvp", c, value=key("hvp_ms")), "ms", False)
        paired = lambda r: r.get("hvp_over_step_paired", r["hvp_over_step"])  # older runs: unpaired
        R.add("hvp_over_train_step", c, paired(g) if g else None, R.peers("hvp", c, value=paired),
              "x its step", False)
    for c in CONFIGS:
        g = R.graft_train(c)
        R.add("train_step_time", c, gk(g, "ms"), R.peers("train", c, value=key("ms")), "ms", False)
        R.add("train_throughput", c, gk(g, "tok_s"), R.peers("train", c, value=key("tok_s")),
              "target tok/s", True)
        R.add("train_peak_rss", c, gk(g, "peak_rss_mib"),
              R.peers("train", c, value=key("peak_rss_mib")), "MiB", False)
        fl = model_flops(c)
        mfu = lambda r: (fl / (r["ms"] / 1e3) / 1e9 / R.peak_gflops * 100.0) if r else None
        R.add("train_mfu", c, mfu(g), R.peers("train", c, value=mfu), "% of sgemm peak", True)


def add_bf16_rows(R):
    for c in CONFIGS:  # bf16 (rows only where this CPU has oneDNN bf16 kernels)
        gb, gf = R.graft_train(c, "bf16"), R.graft_train(c)
        pb = R.peers("train", c, "bf16", value=key("tok_s"))
        if gb or pb:
            R.add("train_throughput_bf16", c, gk(gb, "tok_s"), pb, "target tok/s", True)
            R.add("train_throughput_bf16_vs_fp32", c, gk(gb, "tok_s"),
                  R.peers("train", c, value=key("tok_s")), "target tok/s", True)
            # graft against itself: the "pytorch" column holds graft fp32 here.
            R.add("train_bf16_speedup_vs_graft_fp32", c, gk(gb, "tok_s"), gk(gf, "tok_s"),
                  "target tok/s", True, "graft fp32")
            R.add("train_peak_rss_bf16", c, gk(gb, "peak_rss_mib"),
                  R.peers("train", c, "bf16", value=key("peak_rss_mib")), "MiB", False)


def add_cached_decode_rows(R):
    for c in CONFIGS:
        g = R.find("graft", "greedy", c)
        R.add("greedy_decode_cached_peer", c, gk(g, "tok_s"),
              R.peers("greedy_cached", c, value=key("tok_s")), "new tok/s", True)
    for c in CONFIGS:
        g, p = R.find("graft", "greedy", c, "bf16"), R.peers("greedy_cached", c, "bf16", value=key("tok_s"))
        if g or p:
            R.add("greedy_decode_bf16", c, gk(g, "tok_s"), p, "new tok/s", True)
    for c in CONFIGS:
        g = R.find("graft", "beam", c)
        R.add("beam4_decode_cached_peer", c, gk(g, "tok_s"),
              R.peers("beam_cached", c, value=key("tok_s")), "new tok/s", True)


def add_bandwidth_and_profile_rows(R, triad):
    for prec in ("fp32", "bf16"):  # decoding steps' weight reads against the triad's bandwidth
        for c in CONFIGS:
            g = R.find("graft", "greedy", c, prec)
            if g and "weight_gbs" in g:
                # the "pytorch" column holds the STREAM-like triad: ratio = share of the bandwidth
                R.add("greedy_weight_read_" + prec, c, g["weight_gbs"], triad, "GB/s", True, "triad")
    for prec in ("fp32", "bf16"):  # where a training step goes (graft_bench's profile pass)
        for c in CONFIGS:
            g = R.graft_train(c, prec)
            if g and "profile_ms" in g:
                R.add("train_attention_share_" + prec, c, 100 * g["attention_share"], None, "% of step", True)
                R.add("train_nonmatmul_share_" + prec, c, 100 * g["nonmatmul_share"], None, "% of step", True)
                if c == "base":
                    fams = ", ".join(f"{k} {v:.0f}" for k, v in sorted(g["profile_ms"].items()))
                    R.profile_lines.append(f"- base {prec} step ({g['profile_step_ms']:.0f} ms profiled), "
                                           f"ms by op family: {fams}")


def add_uncached_decode_and_zoo_rows(R):
    for what in ("greedy", "beam"):
        for c in CONFIGS:
            g = R.find("graft", what, c)
            name = "greedy_decode" if what == "greedy" else "beam4_decode"
            R.add(name, c, gk(g, "tok_s"), R.peers(what, c, value=key("tok_s")), "new tok/s", True)
    for what, name, config, unit in ZOO_ROWS:  # the zoo: throughput and peak RSS
        g, ps = R.find("graft", what), R.peers(what)
        R.add(name, config, gk(g, "tok_s"), [(l, r["tok_s"]) for l, r in ps], unit, True)
        R.add(what + "_peak_rss", config, gk(g, "peak_rss_mib"),
              [(l, r["peak_rss_mib"]) for l, r in ps], "MiB", False)
        for l, p in ps:
            if g and g.get("params") != p.get("params"):
                print(f"report: {what}: graft has {g.get('params')} parameters, PyTorch {l} "
                      f"{p.get('params')}: not the same model", file=sys.stderr)


def add_micro_and_gemm_rows(R, stream, triad):
    gm, pms = R.find("graft", "micro"), R.peers("micro")
    for i, op in enumerate((gm or (pms[0][1] if pms else {"ops": []}))["ops"]):
        go = gm["ops"][i] if gm else None
        R.add("op_" + op["op"] + "_fwd_bwd", op["shape"], go["value"] if go else None,
              [(l, pm["ops"][i]["value"]) for l, pm in pms], op["unit"], True)
    s_g = R.find("graft", "sgemm", n=2048)
    R.add("sgemm_2048", "f32 2048^3", gk(s_g, "gflops"), R.peers("sgemm", n=2048, value=key("gflops")),
          "GFLOP/s", True)
    s_g = R.find("graft", "sgemm", None, "bf16", n=2048)
    if s_g:
        R.add("bf16_gemm_2048", "bf16 2048^3, f32 out", s_g["gflops"], None, "GFLOP/s", True)
    s_g = R.find("graft", "sgemm", n=1024)
    R.add("sgemm_1024", "f32 1024^3", gk(s_g, "gflops"), R.peers("sgemm", n=1024, value=key("gflops")),
          "GFLOP/s", True)
    R.add("stream_triad", "3 x 128 MiB float32", triad, None, "GB/s", True)
    for prec in ("fp32", "bf16"):  # decoding-shaped linears alone, against the triad
        if stream and "linear32_gbs_" + prec in stream:
            R.add("linear32_weight_read_" + prec, "32 rows, 24 x (2048 x 512) weights",
                  stream["linear32_gbs_" + prec], triad, "GB/s", True, "triad")


def fmt(v):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"


def write_csv(path, rows):
    with open(path, "w") as f:
        f.write("benchmark,config,graft,pytorch,unit,ratio,pytorch_config\n")
        for b, c, g, p, u, r, pc in rows:
            cv = lambda v: "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.6g}"
            f.write(f"{b},\"{c}\",{cv(g)},{cv(p)},{u},{cv(r)},\"{pc}\"\n")


def machine_lines(meta, peak_gflops):
    """The report's first lines: date, machine, the PyTorch builds, the sgemm peak and kernels."""
    md = []
    md.append("# graft vs PyTorch")
    md.append("")
    md.append(f"- date: {meta.get('date', '?')}")
    md.append(f"- machine: {meta.get('cpu', '?')}, {meta.get('threads', 2)} threads on each side "
              f"(of {meta.get('nproc', '?')} cores); load average at start: {meta.get('load', '?')}")
    md.append(f"- PyTorch {meta.get('torch', '?')} with {meta.get('blas', '?')}, "
              f"OPENBLAS_CORETYPE={meta.get('coretype') or '(unset)'}; graft matmul = oneDNN")
    t2 = meta.get("torch2")
    if t2:
        md.append(f"- PyTorch {t2['torch']} (PyPI, build/torch-venv) with BLAS_INFO={t2['blas_info']}: "
                  f"{t2['mkl']}; {t2['onednn']}; {t2['openmp']}; fp32 matmuls through MKL, bf16 "
                  f"(autocast) through oneDNN; MKL tuning of its rows: {meta.get('torch2_tuning') or 'none'}; "
                  "compiled = torch.compile (inductor, default mode) of the forward + loss (training) "
                  "or of the encoder and the decoder step (decoding), its compile time absorbed by the "
                  "warm-up steps")
    else:
        md.append(f"- PyTorch 2.x: not measured ({meta.get('torch2_missing') or 'no virtual environment'})")
    md.append(f"- sgemm peak (graft/oneDNN f32 2048^3): {fmt(peak_gflops)} GFLOP/s; "
              f"1024^3: graft {fmt(meta.get('graft_1024'))}, PyTorch {fmt(meta.get('torch_1024'))} GFLOP/s "
              f"(PyTorch/graft = {fmt(meta.get('blas_ratio'))})")
    md.append(f"- oneDNN matmul kernels (impl_info_str, 1024^3): f32 {meta.get('kernel_f32', '?')}, "
              f"bf16 {meta.get('kernel_bf16', '?')}"
              + ("" if meta.get("bf16_available", False) else " (no bf16 kernel: bf16 rows not measured)"))
    return md


def method_lines(R):
    """What each row measures, how, and what the ratio means."""
    md = []
    md.append("- bf16 rows: graft --precision bf16 (bf16 matmul operands, float32 accumulation) against "
              "PyTorch under torch.autocast(\"cpu\", dtype=torch.bfloat16); train_throughput_bf16_vs_fp32 "
              "compares with PyTorch fp32; train_bf16_speedup_vs_graft_fp32 has graft fp32 in the "
              "PyTorch column")
    md.append("- hvp_time / hvp_over_train_step: a Hessian-vector product of the train loss (the "
              "gradient g with create_graph, then g's backward with upstream gradients v: the "
              "gradient of g . v), median of 5 after 1 warm-up, and its ratio to a training step's "
              "forward and backward (no optimizer) timed in the same process (steps and HVPs "
              "alternate; the median of each HVP over the step before it); PyTorch 2.x eager with "
              "attention on the math backend (its fused CPU kernels have no double backward); ratio < 1 in the last row means graft's HVP costs "
              "more of its own step than PyTorch's does")
    md.append("- greedy_decode_cached_peer / greedy_decode_bf16 / beam4_decode_cached_peer: against a "
              "PyTorch decoder with an incremental KV cache (fairseq-style; beam search reorders the "
              "self-attention caches by the surviving beams each step; its ids equal nn.Transformer's "
              "full recomputation, checked by CRC in the run); greedy_decode / beam4_decode: against "
              "nn.Transformer re-running the prefix")
    md.append("- training: median of 21 (tiny), 9 (small), 5 (base) steps after 2 warm-up steps (forward, backward, Adam); "
              "graft's row is the median of its runs of it: one next to PyTorch 1.13's row and, "
              "with PyTorch 2.x, one right before each 2.x row (eager, compiled), so 3 runs; "
              "decoding: median of 5 runs after 1 warm-up run of 4 new tokens, 32 sources x 32 tokens, 32 new tokens, "
              "no early stop (tok/s counts 32 x 32 output tokens, also for beam 4); each config "
              "in its own process, peak RSS = VmHWM")
    return md


def more_method_lines(R):
    """The zoo's, the bandwidth rows', the ratio's and MFU's notes."""
    md = []
    zoo_params = {w: (R.find("graft", w) or R.find("pytorch", w) or {}).get("params")
                  for w in ("lm_train", "cls_train")}
    md.append("- zoo (fp32): lm_* is the model `make lm` trains (lm-mini: d 128, 4 heads, FFN 512, 2 layers, "
              "pre-LN, rope, ReLU, dropout 0, tied embedding, byte vocabulary 259; "
              f"{zoo_params['lm_train'] or '?'} parameters) against a nanoGPT-style PyTorch model; "
              "lm_train: median of 21 steps of 16 x 128 tokens (forward, backward, Adam); lm_sample_cached: "
              "sampling at temperature 1 with a KV cache on both sides, median of 9 runs; cls_* is the model "
              "`make classify` trains (d 64, 4 heads, FFN 128, 2 layers, post-LN, sinusoidal, dropout 0.3, "
              "hashed byte 2-5-grams in 262,144 rows with dense Adam; "
              f"{zoo_params['cls_train'] or '?'} parameters) against nn.TransformerEncoder with the same "
              "inputs, pooling and head; cls_train: median of 9 steps of 512 lines; cls_infer: eval mode, "
              "no grad, median of 9 runs; tok/s counts non-pad input tokens")
    md.append("- greedy_weight_read_*: the bytes of decoder weights (and the tied output projection) one "
              "decoding step reads x 32 steps / (decode time - encoder time), against the STREAM-like triad "
              "(the PyTorch column; ratio = share of the bandwidth); train_*_share: graft's per-op profile "
              "of 3 more steps, attention = the fused attention op, non-matmul = everything but the linear "
              "layers, the attention op and the output projection + loss (optimizer included)")
    md.append("- ratio: graft/PyTorch for throughputs, PyTorch/graft for times and memory "
              "(> 1: graft better); PyTorch = the fastest PyTorch configuration measured for the row "
              "(the smallest for memory), named in the last column; every configuration's value is in "
              "the second table")
    md.append("- MFU = model FLOPs / step time / sgemm peak, model FLOPs = 6 * (matmul weights x "
              "tokens they see) + 12 * B * d * (L_enc S^2 + L_dec (T^2 + T S)); per step: " +
              ", ".join(f"{c} {model_flops(c) / 1e9:.1f} GFLOP" for c in CONFIGS))
    return md


def tables(R):
    """The table of rows, then every PyTorch configuration's value per row, then the profile."""
    md = []
    md.append("")
    md.append("| benchmark | config | graft | PyTorch | unit | ratio | PyTorch configuration |")
    md.append("|---|---|---:|---:|---|---:|---|")
    for b, c, g, p, u, r, pc in R.rows:
        md.append(f"| {b} | {c} | {fmt(g)} | {fmt(p)} | {u} | {fmt(r)} | {pc} |")
    labels = []  # the PyTorch configurations, in the order first seen
    for *_, cands in R.by_peer:
        labels += [l for l, _ in cands if l not in labels]
    if R.by_peer:
        md.append("")
        md.append("Every PyTorch configuration measured, per row:")
        md.append("")
        md.append("| benchmark | config | unit | " + " | ".join(labels) + " |")
        md.append("|---|---|---|" + "---:|" * len(labels))
        for b, c, u, cands in R.by_peer:
            vals = dict(cands)
            md.append(f"| {b} | {c} | {u} | " + " | ".join(fmt(vals.get(l)) for l in labels) + " |")
    if R.profile_lines:
        md.append("")
        md.extend(R.profile_lines)
    return md


def report(a):
    """The table: graft against the fastest PyTorch configuration of each row. The sides are
    graft, pytorch (Debian's 1.13) and pytorch2 (PyPI's 2.x; eager, compiled, tuned)."""
    R = Report(a.report)
    meta = json.load(open(a.meta)) if a.meta else {}
    stream = R.find("graft", "stream")
    triad = stream["gbs"] if stream else None
    add_hvp_and_train_rows(R)
    add_bf16_rows(R)
    add_cached_decode_rows(R)
    add_bandwidth_and_profile_rows(R, triad)
    add_uncached_decode_and_zoo_rows(R)
    add_micro_and_gemm_rows(R, stream, triad)
    write_csv(a.csv, R.rows)
    md = machine_lines(meta, R.peak_gflops) + method_lines(R) + more_method_lines(R) + tables(R)
    text = "\n".join(md) + "\n"
    with open(a.md, "w") as f:
        f.write(text)
    sys.stdout.write(text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--what", default="train")
    ap.add_argument("--config", default="tiny")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--tag", default="")
    ap.add_argument("--report")
    ap.add_argument("--meta")
    ap.add_argument("--csv")
    ap.add_argument("--md")
    a = ap.parse_args()
    if a.report:
        report(a)
        return
    import warnings
    warnings.filterwarnings("ignore")  # 1.13's "nested tensors are a prototype" from the encoder fast path
    import torch
    torch.set_num_threads(a.threads)
    if a.compile and not hasattr(torch, "compile"):
        sys.exit(f"torch_peer.py: --compile needs torch.compile (PyTorch 2.x); this is {torch.__version__}")
    if a.compile and a.what in ("micro", "sgemm"):
        sys.exit(f"torch_peer.py: --compile does not apply to --what {a.what}")
    PEER.update({"torch": torch.__version__, "compile": a.compile, "tag": a.tag})
    runs = {"train": run_train, "hvp": run_hvp, "greedy": lambda t, a: run_decode(t, a, 1),
            "greedy_cached": run_decode_cached, "beam": lambda t, a: run_decode(t, a, a.beam),
            "beam_cached": run_beam_cached,
            "lm_train": run_lm_train, "lm_sample": run_lm_sample, "cls_train": run_cls_train,
            "cls_infer": run_cls_infer, "micro": run_micro, "sgemm": run_sgemm,
            "version": lambda t, a: print(t.__version__),
            "config": lambda t, a: print(json.dumps(blas_config(t)))}
    if a.what not in runs:
        sys.exit(f"torch_peer.py: unknown --what {a.what}")
    runs[a.what](torch, a)


if __name__ == "__main__":
    main()
