"""Writes a tiny random BERT checkpoint directory in Hugging Face's layout, for the tests that
need one without the network: config.json, model.safetensors (BertModel's names, float32) and
vocab.txt (11 tokens). Standard library only.

  tiny_bert.py DIR
"""
import json
import os
import random
import struct
import sys

d = sys.argv[1]
os.makedirs(d, exist_ok=True)
vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "##s", "a", "."]
H, F, L, P = 8, 16, 1, 16
cfg = {"model_type": "bert", "architectures": ["BertModel"], "vocab_size": len(vocab), "hidden_size": H,
       "num_attention_heads": 2, "intermediate_size": F, "num_hidden_layers": L, "max_position_embeddings": P,
       "type_vocab_size": 2, "layer_norm_eps": 1e-12, "hidden_act": "gelu", "pad_token_id": 0}
shapes = {"embeddings.word_embeddings.weight": [len(vocab), H], "embeddings.position_embeddings.weight": [P, H],
          "embeddings.token_type_embeddings.weight": [2, H], "embeddings.LayerNorm.weight": [H],
          "embeddings.LayerNorm.bias": [H]}
for i in range(L):
    p = f"encoder.layer.{i}."
    for n in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
        shapes[p + n + ".weight"], shapes[p + n + ".bias"] = [H, H], [H]
    shapes[p + "intermediate.dense.weight"], shapes[p + "intermediate.dense.bias"] = [F, H], [F]
    shapes[p + "output.dense.weight"], shapes[p + "output.dense.bias"] = [H, F], [H]
    for n in ("attention.output.LayerNorm", "output.LayerNorm"):
        shapes[p + n + ".weight"], shapes[p + n + ".bias"] = [H], [H]
rng = random.Random(1)
header, data = {}, b""
for name, shape in shapes.items():
    n = 1
    for s in shape:
        n *= s
    blob = struct.pack(f"<{n}f", *[rng.gauss(0, 0.2) for _ in range(n)])
    header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [len(data), len(data) + len(blob)]}
    data += blob
head = json.dumps(header).encode()
with open(os.path.join(d, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(head)) + head + data)
with open(os.path.join(d, "config.json"), "w") as f:
    json.dump(cfg, f, indent=1)
with open(os.path.join(d, "vocab.txt"), "w") as f:
    f.write("".join(t + "\n" for t in vocab))
