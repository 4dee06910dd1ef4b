/// @file
/// GPT-2 checkpoints (model_type "gpt2") for load_hf_causal_lm() (internal to models/): the
/// config.json reader and the map from the file's tensors onto DecoderOnlyLM's parameters.
#pragma once

#include <string>
#include <vector>

#include "graft/models/hf.h"
#include "hf_files.h"

namespace graft::models {

/// A GPT-2 config.json as an LMConfig: learned positions, pre-LN LayerNorm with biases, the
/// activation_function (gelu_new/gelu_pytorch_tanh, gelu, relu), tied output by default.
/// @throws graft::Error naming the field for a missing, mistyped or out-of-range one, an
///         activation graft lacks, scale_attn_weights false, scale_attn_by_inverse_layer_idx
///         true or add_cross_attention true.
HfLMConfig hf_gpt2_config(const nlohmann::json& j, const std::string& where);

/// How load_hf_causal_lm() reads a GPT-2 directory: prefix "transformer.", the old causal-mask
/// buffers (attn.bias, attn.masked_bias) and a tied lm_head.weight ignored.
hf::Reading gpt2_reading(bool tied);

/// Every DecoderOnlyLM parameter with its GPT-2 source; the Conv1D weights, stored (in, out),
/// are transposed.
std::vector<hf::Param> gpt2_params(const LMConfig& c);

}  // namespace graft::models
