#!/usr/bin/env python3
"""Converts a graft `translate` run directory into a CTranslate2 model directory.

    python ct2_convert.py --run RUN --out DIR [--quantization int8|float32]

or, from Python, ``convert(run_dir, out_dir, quantization="float32")``.

RUN holds config.json, model.safetensors and (usually) spm.model, as `translate train` writes
them. The model is described to CTranslate2 through ``ctranslate2.specs.TransformerSpec`` and
saved with the vocabularies. What is mapped (docs/interop.md, "CTranslate2"):

- the shared embedding ``embedding.weight`` becomes the encoder embedding, the decoder embedding
  and the output projection (graft ties all three; CTranslate2 stores it once, aliased), scaled by
  sqrt(d_model) on input as in graft (``scale_embeddings``);
- positions: ``sinusoidal`` and ``learned`` are passed as graft's own table
  (``position_encodings.encodings``, row t = position t; graft's sinusoid interleaves sin/cos,
  CTranslate2's default concatenates them and starts at 1, so the default is never used);
  ``relative`` (T5 buckets, one table per stack) becomes each self-attention layer's
  ``relative_attention_bias`` (the stack's table, repeated; CTranslate2 aliases the copies) with
  ``relative_attention_max_distance``; ``rope`` and ``alibi`` are refused (UnsupportedRun, naming the
  kind): CTranslate2's encoder-decoder has no ALiBi in its encoder, and its rotary encoder-decoder
  path is not what from_config builds nor checked here;
- queries are scaled by 1/sqrt(head dim) in every attention, as graft's scaled dot product does
  with or without a relative bias (``queries_scale`` set explicitly: CTranslate2's T5 models set
  it to 1);
- post-LN (``norm_first`` false) or pre-LN, with graft's final LayerNorm after each stack when
  ``final_norm`` (nn.Transformer has one even when post-LN; CTranslate2 builds it from the
  stack's ``layer_norm``), LayerNorm eps 1e-5, ReLU or erf-GELU;
- the packed in-projections: self-attention (3d, d) as is; cross-attention's query rows and its
  key/value rows (2d, d) split.

Tokens: with spm.model the vocabulary is SentencePiece's pieces, in id order (graft's ids 0..3
are "<pad>", "<unk>", "<s>", "</s>", CTranslate2's default unk/bos/eos names). Without spm.model
(runs written by graft_bench) the vocabulary is synthetic (``synthetic_vocabulary``): "t<id>" for
every ordinary id and "<pad>", "<s>", "</s>" for the config's pad_id, bos_id and eos_id, "<unk>"
for id 1 (graft's tokenizer's UNK) unless that is one of them (then the first id that is none).
``ids_to_tokens`` / ``tokens_to_ids`` translate between ids and those strings. The source gets no
BOS/EOS (as graft's `translate`); the decoder starts from the bos_id token.
"""

import argparse
import json
import math
import os
import sys

import numpy as np

from safetensors_raw import read_raw

SPECIAL_NAMES = ("<pad>", "<unk>", "<s>", "</s>")
REFUSED_KINDS = {
    "rope": "CTranslate2's TransformerSpec.from_config builds no rotary encoder-decoder "
    "(rotary embeddings are a decoder-only-model feature there)",
    "alibi": "CTranslate2 has ALiBi only in decoders; graft's encoder uses a bidirectional "
    "ALiBi bias it cannot express",
}


class UnsupportedRun(ValueError):
    """A run CTranslate2 cannot express (the message names the field and the value)."""


def read_safetensors(path):
    """Every tensor of a safetensors file as a numpy array (float32/float64/int64), by name."""
    dtypes = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "F16": np.float16}
    out = {}
    for name, dtype, shape, data in read_raw(path):
        if dtype not in dtypes:
            raise UnsupportedRun("%s: tensor '%s' has dtype %s" % (path, name, dtype))
        out[name] = np.frombuffer(data, dtype=dtypes[dtype]).reshape(shape).copy()
    return out


def read_model_config(run_dir):
    """config.json's "model" section, with graft's defaults for fields older runs lack."""
    path = os.path.join(run_dir, "config.json")
    with open(path) as f:
        j = json.load(f)
    c = dict(j.get("model", j))
    if c.get("learned_pos") and "positions" not in c:
        c["positions"] = "learned"
    c.setdefault("positions", "sinusoidal")
    c.setdefault("final_norm", True)
    c.setdefault("activation", "relu")
    c.setdefault("relative_buckets", 32)
    c.setdefault("relative_max_distance", 128)
    for field in ("vocab", "d_model", "heads", "enc_layers", "dec_layers", "max_len", "pad_id", "bos_id", "eos_id"):
        if field not in c:
            raise UnsupportedRun("%s: field \"%s\" missing" % (path, field))
    return c


def synthetic_vocabulary(c):
    """Token strings for a run without spm.model: "t<id>", CTranslate2's special names at the
    config's pad/bos/eos ids, and "<unk>" at id 1 unless taken (then the first free id)."""
    tokens = ["t%d" % i for i in range(c["vocab"])]
    special = {c["pad_id"]: "<pad>", c["bos_id"]: "<s>", c["eos_id"]: "</s>"}
    if len(special) != 3:
        raise UnsupportedRun("config: pad_id, bos_id and eos_id must differ, got %d, %d, %d"
                             % (c["pad_id"], c["bos_id"], c["eos_id"]))
    free = [i for i in [1] + list(range(c["vocab"])) if i not in special and i < c["vocab"]]
    if not free:
        raise UnsupportedRun("config: vocab %d leaves no id for <unk>" % c["vocab"])
    special[free[0]] = "<unk>"
    for i, name in special.items():
        tokens[i] = name
    return tokens


def vocabulary(run_dir, c):
    """The token strings of ids 0..vocab-1 (see the module's description)."""
    spm_path = os.path.join(run_dir, "spm.model")
    if not os.path.exists(spm_path):
        return synthetic_vocabulary(c)
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=spm_path)
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    if len(pieces) != c["vocab"]:
        raise UnsupportedRun("'%s' has %d pieces but config.json says vocab %d" % (spm_path, len(pieces), c["vocab"]))
    for field, name in (("pad_id", "<pad>"), ("bos_id", "<s>"), ("eos_id", "</s>")):
        if pieces[c[field]] != name:
            raise UnsupportedRun("config %s %d is piece '%s' in spm.model, expected '%s'"
                                 % (field, c[field], pieces[c[field]], name))
    if "<unk>" not in pieces:
        raise UnsupportedRun("'%s' has no <unk> piece" % spm_path)
    return pieces


def ids_to_tokens(ids, tokens):
    """Token strings of ids, for CTranslate2's translate_batch."""
    return [tokens[i] for i in ids]


def tokens_to_ids(strings, tokens):
    """Ids of token strings (CTranslate2's output), by the vocabulary `tokens`."""
    index = {t: i for i, t in enumerate(tokens)}
    return [index[s] for s in strings]


def sinusoid_table(n, d):
    """graft's nn::sinusoid_table: PE(t, 2j) = sin(t / 10000^(2j/d)), PE(t, 2j+1) = cos(same)."""
    t = np.arange(n, dtype=np.float64)[:, None]
    j = np.arange(0, d, 2, dtype=np.float64)[None, :]
    angle = t / np.power(10000.0, j / d)
    table = np.zeros((n, d), dtype=np.float64)
    table[:, 0::2] = np.sin(angle)
    table[:, 1::2] = np.cos(angle[:, : d // 2])
    return table.astype(np.float32)


class _Weights:
    """The run's tensors by name; every one must be used exactly once or more (checked)."""

    def __init__(self, tensors, where):
        self.t, self.used, self.where = tensors, set(), where

    def __call__(self, name):
        if name not in self.t:
            raise UnsupportedRun("%s: no tensor '%s'" % (self.where, name))
        self.used.add(name)
        return self.t[name].astype(np.float32)

    def check_all_used(self):
        left = sorted(set(self.t) - self.used)
        if left:
            raise UnsupportedRun("%s: tensors the converter does not map: %s" % (self.where, ", ".join(left)))


def _linear(spec, weight, bias=None):
    spec.weight = np.ascontiguousarray(weight)
    if bias is not None:
        spec.bias = np.ascontiguousarray(bias)


def _layer_norm(spec, w, prefix):
    spec.gamma = w(prefix + ".weight")
    spec.beta = w(prefix + ".bias")


def _self_attention(spec, w, prefix, d, queries_scale):
    _linear(spec.linear[0], w(prefix + ".in_proj_weight"), w(prefix + ".in_proj_bias"))
    _linear(spec.linear[1], w(prefix + ".out_proj.weight"), w(prefix + ".out_proj.bias"))
    spec.queries_scale = queries_scale


def _cross_attention(spec, w, prefix, d, queries_scale):
    W, b = w(prefix + ".in_proj_weight"), w(prefix + ".in_proj_bias")
    _linear(spec.linear[0], W[:d], b[:d])
    _linear(spec.linear[1], W[d:], b[d:])
    _linear(spec.linear[2], w(prefix + ".out_proj.weight"), w(prefix + ".out_proj.bias"))
    spec.queries_scale = queries_scale


def _ffn(spec, w, prefix):
    _linear(spec.linear_0, w(prefix + ".linear1.weight"), w(prefix + ".linear1.bias"))
    _linear(spec.linear_1, w(prefix + ".linear2.weight"), w(prefix + ".linear2.bias"))


def _relative(attention, table, max_distance):
    attention.relative_attention_bias = table
    attention.relative_attention_max_distance = np.dtype("int32").type(max_distance)


# The Transformer's options for imported Marian models, at the values every graft-trained run has.
MARIAN_DEFAULTS = {"sinusoid_layout": "interleaved", "scale_embedding": True, "logits_bias": False}


def check_convertible(c):
    """Raises UnsupportedRun naming the field for a run CTranslate2 cannot express."""
    kind = c["positions"]
    if kind in REFUSED_KINDS:
        raise UnsupportedRun("positions '%s' cannot be converted to CTranslate2: %s" % (kind, REFUSED_KINDS[kind]))
    if kind not in ("sinusoidal", "learned", "relative"):
        raise UnsupportedRun("positions: unknown kind '%s'" % kind)
    if c["activation"] not in ("relu", "gelu"):
        raise UnsupportedRun("activation '%s' cannot be converted (relu or gelu)" % c["activation"])
    if c["d_model"] % c["heads"]:
        raise UnsupportedRun("heads %d must divide d_model %d" % (c["heads"], c["d_model"]))
    for field, default in MARIAN_DEFAULTS.items():  # Marian's options: not mapped yet
        if c.get(field, default) != default:
            raise UnsupportedRun("field \"%s\" %s cannot be converted (only %s)"
                                 % (field, json.dumps(c[field]), json.dumps(default)))


def _fill_embeddings(spec, w, c):
    """The shared embedding (tied to the output projection) and the position table."""
    d, kind = c["d_model"], c["positions"]
    E = w("embedding.weight")
    if E.shape != (c["vocab"], d):
        raise UnsupportedRun("embedding.weight is %s, config says (%d, %d)" % (E.shape, c["vocab"], d))
    spec.encoder.embeddings[0].weight = E
    spec.decoder.embeddings.weight = E
    spec.decoder.projection.weight = E  # tied: CTranslate2 aliases the three copies
    spec.encoder.scale_embeddings = True  # x sqrt(d_model), as graft's embed()
    spec.decoder.scale_embeddings = True

    if kind == "learned":
        table = w("learned_pos.weight")
    elif kind == "sinusoidal":
        table = sinusoid_table(max(c["max_len"], 1024), d)  # graft's extrapolates past max_len
    if kind in ("learned", "sinusoidal"):
        spec.encoder.position_encodings.encodings = table
        spec.decoder.position_encodings.encodings = table


def _fill_layers(spec, w, c):
    """Every encoder and decoder layer, the relative bias tables and the final norms."""
    d, heads, relative = c["d_model"], c["heads"], c["positions"] == "relative"
    queries_scale = np.dtype("float32").type(1.0 / math.sqrt(d // heads))
    for i, layer in enumerate(spec.encoder.layer):
        p = "encoder.layers.%d" % i
        _self_attention(layer.self_attention, w, p + ".self_attn", d, queries_scale)
        _layer_norm(layer.self_attention.layer_norm, w, p + ".norm1")
        _ffn(layer.ffn, w, p)
        _layer_norm(layer.ffn.layer_norm, w, p + ".norm2")
        if relative:
            _relative(layer.self_attention, w("encoder.relative_attention_bias.weight"), c["relative_max_distance"])
    for i, layer in enumerate(spec.decoder.layer):
        p = "decoder.layers.%d" % i
        _self_attention(layer.self_attention, w, p + ".self_attn", d, queries_scale)
        _layer_norm(layer.self_attention.layer_norm, w, p + ".norm1")
        _cross_attention(layer.attention, w, p + ".multihead_attn", d, queries_scale)
        _layer_norm(layer.attention.layer_norm, w, p + ".norm2")
        _ffn(layer.ffn, w, p)
        _layer_norm(layer.ffn.layer_norm, w, p + ".norm3")
        if relative:
            _relative(layer.self_attention, w("decoder.relative_attention_bias.weight"), c["relative_max_distance"])
    if c["final_norm"]:
        _layer_norm(spec.encoder.layer_norm, w, "encoder.norm")
        _layer_norm(spec.decoder.layer_norm, w, "decoder.norm")


def _set_tokens(spec, tokens, c):
    """The special tokens and the (shared) vocabulary."""
    spec.config.layer_norm_epsilon = 1e-5  # graft's LayerConfig eps
    spec.config.unk_token = "<unk>"
    spec.config.bos_token = tokens[c["bos_id"]]
    spec.config.eos_token = tokens[c["eos_id"]]
    spec.config.decoder_start_token = tokens[c["bos_id"]]
    spec.config.add_source_bos = False
    spec.config.add_source_eos = False
    spec.register_source_vocabulary(tokens)
    spec.register_target_vocabulary(tokens)


def build_spec(run_dir):
    """The TransformerSpec of a run and its token strings (nothing written)."""
    import ctranslate2.specs as specs
    from ctranslate2.specs import common_spec, transformer_spec

    c = read_model_config(run_dir)
    check_convertible(c)
    tokens = vocabulary(run_dir, c)
    w = _Weights(read_safetensors(os.path.join(run_dir, "model.safetensors")), os.path.join(run_dir, "model.safetensors"))
    relative = c["positions"] == "relative"
    activation = common_spec.Activation.RELU if c["activation"] == "relu" else common_spec.Activation.GELU
    # pre_norm=True makes from_config declare the stacks' final layer_norm; graft's post-LN
    # stacks have one too (final_norm), so pre_norm is then set to graft's own value.
    spec = specs.TransformerSpec.from_config(
        (c["enc_layers"], c["dec_layers"]), c["heads"], pre_norm=True, no_final_norm=not c["final_norm"],
        activation=activation, relative_attention_bias=relative)
    spec.encoder.pre_norm = bool(c.get("norm_first", False))
    spec.decoder.pre_norm = bool(c.get("norm_first", False))

    _fill_embeddings(spec, w, c)
    _fill_layers(spec, w, c)
    w.check_all_used()
    _set_tokens(spec, tokens, c)
    return spec, tokens


def convert(run_dir, out_dir, quantization="float32", force=True):
    """Writes the CTranslate2 model of graft run `run_dir` into `out_dir`; returns the token
    strings of ids 0..vocab-1. quantization: "float32" or "int8" (or any CTranslate2 accepts).
    Raises UnsupportedRun for a run it cannot express (position kind rope or alibi, ...)."""
    spec, tokens = build_spec(run_dir)
    if os.path.exists(out_dir) and not force:
        raise FileExistsError("'%s' exists" % out_dir)
    os.makedirs(out_dir, exist_ok=True)
    spec.validate()
    spec.optimize(quantization=quantization)
    spec.save(out_dir)
    return tokens


def main(argv=None):
    ap = argparse.ArgumentParser(description="graft translate run -> CTranslate2 model directory")
    ap.add_argument("--run", required=True, help="graft run directory (config.json, model.safetensors, spm.model)")
    ap.add_argument("--out", required=True, help="CTranslate2 model directory to write")
    ap.add_argument("--quantization", default="float32", choices=["float32", "int8", "int8_float32", "bfloat16", "int8_bfloat16"],
                    help="weight type of the converted model")
    a = ap.parse_args(argv)
    try:
        tokens = convert(a.run, a.out, a.quantization)
    except (UnsupportedRun, OSError) as e:
        print("ct2_convert: %s" % e, file=sys.stderr)
        return 1
    print("ct2_convert: wrote %s (%s, %d tokens)" % (a.out, a.quantization, len(tokens)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
