// Moving a translation model to and from another implementation (PyTorch's nn.Transformer in
// examples/translation/torch_roundtrip.py). Both sides speak only the safetensors layout and
// graft's parameter names, which are nn.Transformer's (encoder.layers.0.self_attn.in_proj_weight,
// ...) plus the tied embedding.weight.
#pragma once

#include <string>

namespace graft::translation {

// The run's model (eval mode: no dropout) on one batch: the safetensors file `batch_path` holds
// int64 "src" (B, S), "tgt_in" (B, T) and "tgt_out" (B, T). Writes to `out_path` "logits"
// (B, T, V), "loss" (the label-smoothed cross-entropy, mean over non-PAD targets, shape (1))
// and "grad.<name>" for every parameter (the gradient of that loss). Errors name the file and
// the tensor.
void write_forward(const std::string& run_dir, const std::string& batch_path,
                   double label_smoothing, const std::string& out_path);

// Writes run_dir/model.safetensors (checksummed, tied to run_dir's config.json and spm.model)
// from plain safetensors weights under graft's names, e.g. saved from PyTorch: every parameter
// of the model run_dir/config.json describes, float32, of its shape, and nothing else.
void import_weights(const std::string& run_dir, const std::string& weights_path);

}  // namespace graft::translation
