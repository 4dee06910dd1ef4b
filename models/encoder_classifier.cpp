#include "models/encoder_classifier.h"

#include <cmath>

#include "models/config_json.h"
#include "ops/ops.h"

namespace graft::models {

namespace {
void check_ids(const char* who, const Tensor& ids) {
  if (ids.dtype() != DType::i64 || ids.dim() != 2)
    fail(std::string(who) + ": token ids must be int64 (B, T), got " + describe(ids));
}
}  // namespace

nlohmann::json ClassifierConfig::to_json() const {
  nlohmann::json j = {{"vocab", vocab}, {"classes", classes}, {"d_model", d_model}, {"heads", heads},
                      {"d_ff", d_ff}, {"layers", layers}, {"max_len", max_len}, {"dropout", dropout},
                      {"norm_first", norm_first}, {"pad_id", pad_id}, {"dtype", dtype_name(dtype)},
                      {"seed", seed}};
  j.update(positions_json(positions));
  return j;
}

ClassifierConfig ClassifierConfig::from_json(const nlohmann::json& j, const std::string& where) {
  ClassifierConfig c;
  const ConfigReader r(j, where);
  r.size("vocab", c.vocab), r.size("classes", c.classes), r.size("d_model", c.d_model);
  r.size("heads", c.heads), r.size("d_ff", c.d_ff), r.size("layers", c.layers, 1024), r.size("max_len", c.max_len);
  r.probability("dropout", c.dropout);
  r.get("norm_first", c.norm_first), r.get("pad_id", c.pad_id), r.get("seed", c.seed);
  c.dtype = r.dtype("dtype");
  r.positions(c.positions);
  if (c.d_model % c.heads) r.bad("heads", "must divide d_model " + std::to_string(c.d_model));
  return c;
}

EncoderClassifier::EncoderClassifier(const ClassifierConfig& c) : cfg(c), dropout_gen(c.seed * 31 + 9) {
  Generator gen(c.seed);
  embedding = register_module("embedding", std::make_shared<nn::Embedding>(c.vocab, c.d_model, c.pad_id, c.dtype, gen,
                                                                           1.0 / std::sqrt((double)c.d_model)));
  pos = register_module("pos", std::make_shared<nn::EmbeddingPositions>(c.positions.kind, c.max_len, c.d_model, c.dtype, gen));
  dropout = register_module("dropout", std::make_shared<nn::Dropout>(c.dropout, &dropout_gen));
  encoder = register_module("encoder", std::make_shared<nn::Encoder>(
      nn::layer_config(c.d_model, c.heads, c.d_ff, c.dropout, c.norm_first, c.dtype), c.layers, c.norm_first, gen,
      &dropout_gen, c.positions));
  head = register_module("head", std::make_shared<nn::Linear>(c.d_model, c.classes, true, c.dtype, gen));
}

Tensor EncoderClassifier::forward(const Tensor& ids) const {
  check_ids("EncoderClassifier", ids);
  Tensor pad = eq(ids, (double)cfg.pad_id);
  Tensor x = affine(embedding->forward(ids), std::sqrt((double)cfg.d_model), 0.0);
  Tensor h = encoder->forward(dropout->forward(pos->forward(x)), pad);
  // Mean over non-pad positions: weights (B, T, 1) = keep / count.
  Tensor keep = to_dtype(eq(pad, 0.0), h.dtype());
  Tensor w = div(keep, sum(keep, {1}, true));
  Tensor pooled = sum(mul(h, unsqueeze(w, 2)), {1});
  return head->forward(pooled);
}

}  // namespace graft::models
