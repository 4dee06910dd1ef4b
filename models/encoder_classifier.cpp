#include "graft/models/encoder_classifier.h"

#include <cmath>

#include "graft/models/config_json.h"
#include "graft/ops/ops.h"

namespace graft::models {


nlohmann::json ClassifierConfig::to_json() const {
  nlohmann::json j = stack_json();
  j["classes"] = classes;
  return j;
}

ClassifierConfig ClassifierConfig::from_json(const nlohmann::json& j, const std::string& where) {
  ClassifierConfig c;
  const ConfigReader r(j, where);
  c.read_stack(r);
  r.size("classes", c.classes);
  return c;
}

int64_t ClassifierConfig::parameter_count() const {
  const int64_t head = checked_add(checked_mul(d_model, classes, "parameter count"), classes, "parameter count");
  return checked_add(stack_parameters(/*final_norm=*/norm_first), head, "parameter count");
}

EncoderClassifier::EncoderClassifier(const ClassifierConfig& c) : cfg(c), dropout_gen(c.seed * 31 + 9) {
  Generator gen(c.seed);
  embedding = register_module("embedding", std::make_shared<nn::Embedding>(c.vocab, c.d_model, c.pad_id, c.dtype, gen,
                                                                           1.0 / std::sqrt((double)c.d_model)));
  pos = register_module("pos", std::make_shared<nn::EmbeddingPositions>(c.positions.kind, c.max_len, c.d_model, c.dtype, gen));
  dropout = register_module("dropout", std::make_shared<nn::Dropout>(c.dropout, &dropout_gen));
  encoder = register_module("encoder", std::make_shared<nn::Encoder>(
      c.layer(), c.layers, c.norm_first, gen,
      &dropout_gen, c.positions));
  head = register_module("head", std::make_shared<nn::Linear>(c.d_model, c.classes, true, c.dtype, gen));
}

Tensor EncoderClassifier::forward(const Tensor& ids) const {
  const auto named = scope();
  check_token_ids("EncoderClassifier", ids);
  Tensor pad = eq(ids, (double)cfg.pad_id);
  Tensor x = affine(embedding->forward(ids), std::sqrt((double)cfg.d_model), 0.0);
  Tensor h = encoder->forward(dropout->forward(pos->forward(x)), pad);
  // Mean over non-pad positions: weights (B, T, 1) = keep / count.
  Tensor keep = to_dtype(eq(pad, 0.0), h.dtype());
  Tensor count = sum(keep, {1}, true);
  Tensor w = div(keep, add(count, eq(count, 0.0)));  // an all-padding row pools to zeros, not NaN
  Tensor pooled = sum(mul(h, unsqueeze(w, 2)), {1});
  return head->forward(pooled);
}

}  // namespace graft::models
