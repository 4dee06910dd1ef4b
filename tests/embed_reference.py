"""graft's sentence embeddings against sentence-transformers (PyTorch) on the same sentences.

  embed_reference.py MODEL_DIR SENTENCES GRAFT_VECTORS GRAFT_IDS

SENTENCES: one per line. GRAFT_VECTORS: `embed encode`'s safetensors file. GRAFT_IDS: `embed
tokenize --max-len <max_seq_length>`'s output. Passes (exit 0) when every sentence's token ids are
identical and every embedding's cosine with the reference is at least 0.99999; prints the worst
cosine and the worst element difference either way.
"""
import sys

import numpy as np
from safetensors.numpy import load_file
from sentence_transformers import SentenceTransformer

model_dir, sentences_path, vectors_path, ids_path = sys.argv[1:5]
with open(sentences_path, encoding="utf-8") as f:
    sentences = f.read().split("\n")[:-1]
ref_model = SentenceTransformer(model_dir, device="cpu")
ref = ref_model.encode(sentences, batch_size=32, convert_to_numpy=True).astype(np.float64)
ours = load_file(vectors_path)["embeddings"].astype(np.float64)
if ours.shape != ref.shape:
    sys.exit(f"embed_reference: graft gave {ours.shape} vectors, sentence-transformers {ref.shape}")

tok = ref_model.tokenizer
with open(ids_path) as f:
    graft_ids = [[int(t) for t in line.split()] for line in f.read().split("\n")[:-1]]
ref_ids = tok(sentences, truncation=True, max_length=ref_model.max_seq_length)["input_ids"]
id_diff = [i for i, (a, b) in enumerate(zip(graft_ids, ref_ids)) if a != b]
if len(graft_ids) != len(ref_ids):
    id_diff.append(min(len(graft_ids), len(ref_ids)))

cos = (ours * ref).sum(1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(ref, axis=1))
worst = int(cos.argmin())
diff = np.abs(ours - ref)
print(f"embed_reference: {len(sentences)} sentences, {ref.shape[1]} dims, max_seq_length {ref_model.max_seq_length}")
print(f"  token ids: {len(sentences) - len(id_diff)} of {len(sentences)} identical")
print(f"  cosine: min {cos.min():.9f} (sentence {worst + 1}), mean {cos.mean():.9f}")
print(f"  worst element difference {diff.max():.3e} (of values up to {np.abs(ref).max():.3f}), "
      f"mean {diff.mean():.3e}")
ok = True
if id_diff:
    i = id_diff[0]
    print(f"  FAIL: token ids differ on {len(id_diff)} sentences; first, line {i + 1}: {sentences[i]!r}\n"
          f"    graft {graft_ids[i] if i < len(graft_ids) else None}\n    tokenizers {ref_ids[i] if i < len(ref_ids) else None}")
    ok = False
if cos.min() < 0.99999:
    print(f"  FAIL: {int((cos < 0.99999).sum())} cosines under 0.99999; worst, line {worst + 1}: {sentences[worst]!r}")
    ok = False
sys.exit(0 if ok else 1)
