"""Converts a Hugging Face checkpoint's PyTorch weights (pytorch_model.bin) to model.safetensors
beside it, once, for graft's importer (models::load_hf_bert reads safetensors only). Needs torch
and safetensors (pip); graft itself never does.

  python3 examples/embed/bin_to_safetensors.py CHECKPOINT_DIR
"""
import os
import sys

import torch
from safetensors.torch import save_file

d = sys.argv[1]
src, dst = os.path.join(d, "pytorch_model.bin"), os.path.join(d, "model.safetensors")
state = torch.load(src, map_location="cpu", weights_only=True)
tensors = {k: v.contiguous() for k, v in state.items() if isinstance(v, torch.Tensor)}
save_file(tensors, dst + ".tmp", metadata={"format": "pt"})
os.replace(dst + ".tmp", dst)
print(f"wrote {len(tensors)} tensors to {dst}")
