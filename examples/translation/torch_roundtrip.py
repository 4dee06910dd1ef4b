#!/usr/bin/python3
"""Weights move both ways between graft and PyTorch's torch.nn.Transformer.

  /usr/bin/python3 examples/translation/torch_roundtrip.py \\
      --translate build/examples/translation/translate --run RUN --work DIR [--label-smoothing 0.1]

RUN is a graft run directory (config.json, spm.model, model.safetensors, e.g. from
`translate train`); DIR is a scratch directory the script fills. On one seeded batch (with
padded rows) it checks:

  graft -> PyTorch: RUN's weights loaded into nn.Transformer + a tied embedding give the logits of
      `translate forward` (max abs diff <= 1e-4), its loss (cross-entropy with label smoothing,
      PAD ignored) and every parameter's gradient (||g_torch - g_graft|| / ||g_graft|| <= 1e-3);
  PyTorch -> graft: a freshly initialised PyTorch model saved under graft's names, imported with
      `translate import-weights` into a new run DIR/run2, gives the same agreement, and
      `translate translate --run DIR/run2` decodes a sentence.

The PyTorch side knows nothing of graft but the safetensors layout (read and written here by
hand: 8-byte little-endian header length, JSON header, raw little-endian data) and the parameter
names, which are nn.Transformer's plus "embedding.weight". It talks to graft only through the
`translate` program. Needs torch and the standard library; exits 77 (skipped) without torch,
1 when a figure is out of bounds, 0 when both directions agree.
"""
import argparse
import json
import math
import os
import shutil
import struct
import subprocess
import sys

from safetensors_raw import read_raw

LOGITS_TOL, GRAD_TOL = 1e-4, 1e-3
LOSS_TOL = 1e-4  # absolute, on a loss of order 1..5
BATCH_SEED, INIT_SEED = 1234, 4321
SENTENCE = "the dog sees the cat ."


def fail(msg):
    sys.exit(f"torch_roundtrip: {msg}")


# ---------------------------------------------------------------------------------------------
# safetensors by hand

DTYPES = {"F32": ("float32", 4), "I64": ("int64", 8)}


def read_safetensors(torch, path):
    """{name: tensor} of a safetensors file (F32 and I64 tensors)."""
    out = {}
    for name, dtype_name, shape, data in read_raw(path):
        if dtype_name not in DTYPES:
            fail(f"{path}: tensor {name} has dtype {dtype_name}; expected one of {sorted(DTYPES)}")
        dtype = getattr(torch, DTYPES[dtype_name][0])
        t = torch.frombuffer(bytearray(data), dtype=dtype) if data else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(shape).clone()
    return out


def write_safetensors(torch, path, tensors, metadata=None):
    """Writes {name: float32 or int64 tensor} in order, little-endian, header padded to 8 bytes."""
    header, chunks, offset = {}, [], 0
    for name, t in tensors.items():
        code = {torch.float32: "F32", torch.int64: "I64"}.get(t.dtype)
        if code is None:
            fail(f"write_safetensors: {name} is {t.dtype}; only float32 and int64 are written")
        raw = _le_bytes(torch, t)
        header[name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for c in chunks:
            f.write(c)


def _le_bytes(torch, t):
    """The tensor's raw bytes, little-endian, without numpy."""
    t = t.detach().contiguous().cpu()
    fmt = "f" if t.dtype == torch.float32 else "q"
    return struct.pack(f"<{t.numel()}{fmt}", *t.reshape(-1).tolist())


# ---------------------------------------------------------------------------------------------
# The model: nn.Transformer (batch_first) with one embedding for source, target and the output
# projection, scaled by sqrt(d), plus sinusoidal positions, as graft's models::Transformer.

def read_config(run):
    m = json.load(open(os.path.join(run, "config.json")))["model"]
    if m.get("positions", "sinusoidal") != "sinusoidal":
        fail(f"{run}/config.json: positions '{m['positions']}' is not supported here; nn.Transformer "
             "has no positional scheme of its own and this check models only graft's sinusoidal one")
    if m.get("activation", "relu") not in ("relu", "gelu"):
        fail(f"{run}/config.json: activation '{m['activation']}' is neither relu nor gelu")
    for field, default in (("sinusoid_layout", "interleaved"), ("scale_embedding", True),
                           ("logits_bias", False), ("mask_target_pad", True)):
        if m.get(field, default) != default:  # Marian's options: this model has none of them
            fail(f"{run}/config.json: field \"{field}\" {m[field]!r} is not supported here")
    if m.get("dtype", "float32") != "float32":
        fail(f"{run}/config.json: dtype '{m['dtype']}'; this check compares float32 models")
    return m


def sinusoid_table(torch, n, d):
    """pe[p, 2i] = sin(p / 10000^(2i/d)), pe[p, 2i+1] = cos(same), computed in float64."""
    pos = torch.arange(n, dtype=torch.float64)[:, None]
    angle = pos / torch.pow(10000.0, torch.arange(0, d, 2, dtype=torch.float64) / d)
    pe = torch.zeros(n, d, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle[:, : d // 2])
    return pe.float()


def build_model(torch, m):
    nn, F = torch.nn, torch.nn.functional
    d, pad = m["d_model"], m["pad_id"]

    class Seq2Seq(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(m["vocab"], d, padding_idx=pad)
            nn.init.normal_(self.embedding.weight, 0.0, d ** -0.5)
            with torch.no_grad():
                self.embedding.weight[pad].zero_()
            self.transformer = nn.Transformer(
                d, m["heads"], m["enc_layers"], m["dec_layers"], m["d_ff"], m["dropout"],
                activation=m.get("activation", "relu"), layer_norm_eps=1e-5, batch_first=True,
                norm_first=m["norm_first"])
            for mod in self.transformer.modules():  # graft's attention dropout is its own setting
                if isinstance(mod, nn.MultiheadAttention):
                    mod.dropout = m.get("attention_dropout", 0.0)
            if not m["final_norm"]:
                self.transformer.encoder.norm = None
                self.transformer.decoder.norm = None
            self.register_buffer("pe", sinusoid_table(torch, max(m["max_len"], 512), d), persistent=False)
            self.drop = nn.Dropout(m["dropout"])

        def embed(self, ids):
            x = F.embedding(ids, self.embedding.weight, padding_idx=pad) * math.sqrt(d)
            return self.drop(x + self.pe[: ids.size(1)])

        def forward(self, src, tgt_in):
            T = tgt_in.size(1)
            causal = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
            src_pad, tgt_pad = src == pad, tgt_in == pad
            h = self.transformer(self.embed(src), self.embed(tgt_in), tgt_mask=causal,
                                 src_key_padding_mask=src_pad, tgt_key_padding_mask=tgt_pad,
                                 memory_key_padding_mask=src_pad)
            return F.linear(h, self.embedding.weight)  # tied output projection

    return Seq2Seq()


def graft_name(torch_name):
    """PyTorch parameter name -> graft's (nn.Transformer's names without the module prefix)."""
    prefix = "transformer."
    return torch_name[len(prefix):] if torch_name.startswith(prefix) else torch_name


def torch_params(model):
    """{graft name: torch parameter}, refusing a name clash."""
    out = {}
    for name, p in model.named_parameters():
        g = graft_name(name)
        if g in out:
            fail(f"two PyTorch parameters map to graft's {g}")
        out[g] = p
    return out


def load_graft_weights(torch, model, path):
    """Copies a graft weights file into the model: every tensor to one parameter and back."""
    w = read_safetensors(torch, path)
    params = torch_params(model)
    extra = sorted(set(w) - set(params))
    missing = sorted(set(params) - set(w))
    if extra or missing:
        fail(f"{path} does not map one to one onto the PyTorch model: graft tensors without a PyTorch "
             f"parameter {extra}, PyTorch parameters without a graft tensor {missing}")
    with torch.no_grad():
        for name, p in params.items():
            if tuple(w[name].shape) != tuple(p.shape) or w[name].dtype != torch.float32:
                fail(f"{path}: {name} is {w[name].dtype} {tuple(w[name].shape)}, "
                     f"PyTorch has float32 {tuple(p.shape)}")
            p.copy_(w[name])
    return len(params)


def save_graft_weights(torch, model, path):
    write_safetensors(torch, path, {n: p.detach() for n, p in torch_params(model).items()},
                      {"format": "pytorch", "written_by": "torch_roundtrip.py"})


# ---------------------------------------------------------------------------------------------
# The batch, and the two forward passes

def make_batch(torch, m, B=4, S=9, T=8):
    """Seeded ids in [4, vocab): rows of different lengths, PAD at the ends of the shorter ones."""
    g = torch.Generator().manual_seed(BATCH_SEED)
    pad, bos, eos, V = m["pad_id"], m["bos_id"], m["eos_id"], m["vocab"]
    src = torch.full((B, S), pad, dtype=torch.int64)
    tgt_in = torch.full((B, T), pad, dtype=torch.int64)
    tgt_out = torch.full((B, T), pad, dtype=torch.int64)
    for b in range(B):
        ns, nt = S - (2 * b) % S, T - (3 * b) % (T - 1)  # row 0 full, the others padded
        src[b, :ns] = torch.randint(4, V, (ns,), generator=g)
        y = torch.randint(4, V, (nt - 1,), generator=g)
        tgt_in[b, 0] = bos
        tgt_in[b, 1:nt] = y
        tgt_out[b, : nt - 1] = y
        tgt_out[b, nt - 1] = eos
    return {"src": src, "tgt_in": tgt_in, "tgt_out": tgt_out}


def torch_forward(torch, model, batch, eps, pad):
    model.eval()  # dropout off
    model.zero_grad(set_to_none=True)
    logits = model(batch["src"], batch["tgt_in"])
    crit = torch.nn.CrossEntropyLoss(ignore_index=pad, label_smoothing=eps)
    loss = crit(logits.reshape(-1, logits.size(-1)), batch["tgt_out"].reshape(-1))
    loss.backward()
    grads = {}
    for name, p in torch_params(model).items():
        grads[name] = p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
    return logits.detach(), float(loss), grads


def run_translate(args, *cmd, stdin=None):
    r = subprocess.run([args.translate, *cmd], input=stdin, capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"`translate {' '.join(cmd)}` exited {r.returncode}:\n{r.stdout}{r.stderr}")
    return r.stdout


def graft_forward(torch, args, run, batch_path, out_path):
    run_translate(args, "forward", "--run", run, "--batch", batch_path, "--out", out_path,
                  "--label-smoothing", repr(args.label_smoothing))
    out = read_safetensors(torch, out_path)
    grads = {k[len("grad."):]: v for k, v in out.items() if k.startswith("grad.")}
    return out["logits"], float(out["loss"].reshape(-1)[0]), grads


# ---------------------------------------------------------------------------------------------
# Comparing

def compare(direction, graft, peer):
    """Figures of one direction and the list of failures."""
    (g_logits, g_loss, g_grads), (t_logits, t_loss, t_grads) = graft, peer
    failures = []
    if tuple(g_logits.shape) != tuple(t_logits.shape):
        fail(f"{direction}: graft's logits are {tuple(g_logits.shape)}, PyTorch's {tuple(t_logits.shape)}")
    logits_diff = float((g_logits - t_logits).abs().max())
    if not logits_diff <= LOGITS_TOL:
        failures.append(f"{direction}: logits max abs diff {logits_diff:.3g} > {LOGITS_TOL:g}")
    loss_diff = abs(g_loss - t_loss)
    if not loss_diff <= LOSS_TOL:
        failures.append(f"{direction}: loss graft {g_loss:.7f} vs torch {t_loss:.7f} (diff {loss_diff:.3g})")
    only_graft, only_torch = sorted(set(g_grads) - set(t_grads)), sorted(set(t_grads) - set(g_grads))
    if only_graft or only_torch:
        failures.append(f"{direction}: gradients only graft has {only_graft}, only PyTorch has {only_torch}")
    worst, worst_name = 0.0, "-"
    for name in sorted(set(g_grads) & set(t_grads)):
        g, t = g_grads[name].double(), t_grads[name].double()
        ref = float(g.norm())
        rel = float((t - g).norm()) / ref if ref > 0 else float((t - g).norm())
        if not rel <= GRAD_TOL:
            failures.append(f"{direction}: gradient of {name}: relative error {rel:.3g} > {GRAD_TOL:g} "
                            f"(|g_graft| {ref:.3g}, |g_torch| {float(t.norm()):.3g})")
        if not rel <= worst:  # also catches NaN
            worst, worst_name = rel, name
    print(f"{direction}:")
    print(f"  logits max abs diff   {logits_diff:.3g}  (<= {LOGITS_TOL:g})")
    print(f"  loss graft / torch    {g_loss:.7f} / {t_loss:.7f}  (diff {loss_diff:.3g})")
    print(f"  worst grad rel error  {worst:.3g}  ({worst_name}; <= {GRAD_TOL:g})")
    print(f"  parameters compared   {len(set(g_grads) & set(t_grads))}")
    return failures


def graft_to_torch(torch, args, m, batch, batch_path):
    model = build_model(torch, m)
    load_graft_weights(torch, model, os.path.join(args.run, "model.safetensors"))
    graft = graft_forward(torch, args, args.run, batch_path, os.path.join(args.work, "forward1.safetensors"))
    peer = torch_forward(torch, model, batch, args.label_smoothing, m["pad_id"])
    return compare("graft -> PyTorch", graft, peer)


def torch_to_graft(torch, args, m, batch, batch_path):
    torch.manual_seed(INIT_SEED)
    model = build_model(torch, m)
    run2 = os.path.join(args.work, "run2")
    shutil.rmtree(run2, ignore_errors=True)
    os.makedirs(run2)
    for f in ("config.json", "spm.model"):
        shutil.copy(os.path.join(args.run, f), run2)
    weights = os.path.join(args.work, "torch_weights.safetensors")
    save_graft_weights(torch, model, weights)
    run_translate(args, "import-weights", "--run", run2, "--weights", weights)
    graft = graft_forward(torch, args, run2, batch_path, os.path.join(args.work, "forward2.safetensors"))
    peer = torch_forward(torch, model, batch, args.label_smoothing, m["pad_id"])
    failures = compare("PyTorch -> graft", graft, peer)
    out = run_translate(args, "translate", "--run", run2, stdin=SENTENCE + "\n")
    lines = out.count("\n")
    if lines != 1 or not out.endswith("\n"):
        failures.append(f"PyTorch -> graft: `translate translate` printed {lines} lines, expected 1: {out!r}")
    # An untrained model may well decode to nothing: the line is then empty.
    print(f"  translate {SENTENCE!r} -> {out.rstrip(chr(10))!r} (exit 0)")
    return failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--translate", required=True, help="graft's translate program")
    ap.add_argument("--run", required=True, help="a graft run directory")
    ap.add_argument("--work", required=True, help="scratch directory")
    ap.add_argument("--label-smoothing", type=float, default=0.1)
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("torch_roundtrip: skipped: PyTorch is not installed (apt-get install python3-torch)")
        sys.exit(77)
    import warnings
    warnings.filterwarnings("ignore")  # nn.Transformer's prototype notes
    torch.set_num_threads(2)
    os.makedirs(args.work, exist_ok=True)
    m = read_config(args.run)
    batch = make_batch(torch, m)
    batch_path = os.path.join(args.work, "batch.safetensors")
    write_safetensors(torch, batch_path, batch)
    failures = graft_to_torch(torch, args, m, batch, batch_path)
    failures += torch_to_graft(torch, args, m, batch, batch_path)
    if failures:
        print("torch_roundtrip: FAILED:")
        for f in failures:
            print("  " + f)
        sys.exit(1)
    print("torch_roundtrip: both directions agree")


if __name__ == "__main__":
    main()
