#include "graft/models/sentence_encoder.h"

#include <algorithm>
#include <filesystem>
#include <numeric>

#include "graft/autograd/tape.h"
#include "graft/autograd/text.h"
#include "graft/nn/train/checkpoint.h"
#include "graft/ops/ops.h"

namespace graft::models {

namespace {

/// sentence_bert_config.json's max_seq_length, or the position table's length without it.
int64_t read_max_seq_length(const std::string& dir, int64_t max_len) {
  const std::string path = dir + "/sentence_bert_config.json";
  if (std::error_code ec; !std::filesystem::exists(path, ec)) return max_len;
  int64_t n = max_len;
  ConfigReader(train::load_json(path), path).get_or_keep("max_seq_length", n);
  if (n < 2 || n > max_len)
    bad_field(path, "max_seq_length",
              "must be in [2, " + std::to_string(max_len) + "] (max_position_embeddings), got " +
                  std::to_string(n));
  return n;
}

/// 1_Pooling/config.json's mode (mean or CLS), mean without it.
Pooling read_pooling(const std::string& dir) {
  const std::string path = dir + "/1_Pooling/config.json";
  if (std::error_code ec; !std::filesystem::exists(path, ec)) return Pooling::mean;
  const nlohmann::json j = train::load_json(path);
  const ConfigReader r(j, path);
  bool mean = false, cls = false, other = false;
  r.get_or_keep("pooling_mode_mean_tokens", mean), r.get_or_keep("pooling_mode_cls_token", cls);
  for (const char* f : {"pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                        "pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken"}) {
    bool on = false;
    r.get_or_keep(f, on);
    if (on) other = true;
  }
  if (other || mean == cls)
    fail(path + ": graft pools by the mean of the tokens or by [CLS], one of them alone");
  return cls ? Pooling::cls : Pooling::mean;
}

/// Whether modules.json lists a Normalize module.
bool read_normalize(const std::string& dir) {
  const std::string path = dir + "/modules.json";
  if (std::error_code ec; !std::filesystem::exists(path, ec)) return false;
  const nlohmann::json j = train::load_json(path);
  if (!j.is_array()) fail(path + ": must be a JSON array of modules");
  for (const auto& m : j)
    if (m.is_object() && m.contains("type") && m["type"].is_string() &&
        m["type"].get<std::string>() == "sentence_transformers.models.Normalize")
      return true;
  return false;
}

}  // namespace

const std::vector<std::string>& embedding_files() {
  static const std::vector<std::string> files = {
      "config.json",           "model.safetensors",
      "tokenizer.json",        "vocab.txt",
      "tokenizer_config.json", "modules.json",
      "1_Pooling/config.json", "sentence_bert_config.json"};
  return files;
}

namespace {

constexpr const char* kAbsent = "absent";

/// The fingerprint of a model file, or kAbsent: a file added or removed changes an embedding too.
std::string model_file_fingerprint(const std::string& dir, const std::string& name) {
  const std::string path = dir + "/" + name;
  if (std::error_code ec; !std::filesystem::exists(path, ec)) return kAbsent;
  return train::file_fingerprint(path, "SentenceEncoder");
}

}  // namespace

std::map<std::string, std::string> SentenceEncoder::index_ties(
    const std::string& collection) const {
  std::map<std::string, std::string> ties = {
      {"format", kIndexFormat},
      {"collection", train::file_fingerprint(collection, "SentenceEncoder")}};
  for (const std::string& name : embedding_files())
    ties["model:" + name] = model_file_fingerprint(dir, name);
  return ties;
}

void SentenceEncoder::check_index_ties(const std::map<std::string, std::string>& metadata,
                                       const std::string& collection,
                                       const std::string& index) const {
  const auto stored = [&](const std::string& key) {
    const auto it = metadata.find(key);
    return it == metadata.end() ? std::string() : it->second;
  };
  const std::string at = "'" + index + "': ";
  if (stored("format") != kIndexFormat)
    fail(at + "written in the format \"" + text::printable(stored("format")) + "\", not \"" +
         kIndexFormat + "\"");
  if (stored("collection") != train::file_fingerprint(collection, "SentenceEncoder"))
    fail(at + "the collection '" + collection + "' was edited since it was built");
  for (const std::string& name : embedding_files()) {
    const std::string was = stored("model:" + name), now = model_file_fingerprint(dir, name);
    if (was == now) continue;
    fail(at + "'" + dir + "/" + name + "' was " +
         (was == kAbsent   ? "added"
          : now == kAbsent ? "removed"
                           : "edited") +
         " since it was built (or the model is another)");
  }
}

Tensor pool(const Tensor& h, const Tensor& pad, Pooling pooling, bool normalize) {
  const Tensor e = pooling == Pooling::cls ? squeeze(slice(h, 1, 0, 1), 1) : mean_pool(h, pad);
  return normalize ? l2_normalize(e) : e;
}

std::vector<std::vector<int64_t>> tokenize_texts(const text::WordPiece& tokenizer,
                                                 const std::vector<std::string>& texts,
                                                 int64_t max_len) {
  std::vector<std::vector<int64_t>> ids;
  ids.reserve(texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    try {
      ids.push_back(tokenizer.encode_with_specials(texts[i], max_len));
    } catch (const Error& e) {
      fail("text " + std::to_string(i) + ": " + e.what());
    }
  }
  return ids;
}

SentenceEncoder::SentenceEncoder(const std::string& d)
    : tokenizer(text::WordPiece::from_directory(d)), model(load_hf_bert(d)), dir(d) {
  if (tokenizer.size() != model->cfg.vocab)
    fail("SentenceEncoder: '" + d + "': the tokenizer has " + std::to_string(tokenizer.size()) +
         " tokens, the model's vocab_size is " + std::to_string(model->cfg.vocab));
  max_seq_length = read_max_seq_length(d, model->cfg.max_len);
  pooling = read_pooling(d);
  normalize = read_normalize(d);
}

std::vector<int64_t> SentenceEncoder::tokenize(const std::string& text) const {
  return tokenizer.encode_with_specials(text, max_seq_length);
}

Tensor SentenceEncoder::embed(const Tensor& ids, const Tensor& pad) const {
  check_token_ids("SentenceEncoder::embed", ids);
  const Tensor p = pad.defined() ? pad : eq(ids, (double)model->cfg.pad_id);
  return pool(model->forward(ids, p), p, pooling, normalize);
}

Tensor SentenceEncoder::encode_ids(const std::vector<std::vector<int64_t>>& ids, int64_t batch_size,
                                   const Progress& progress) const {
  if (batch_size < 1)
    fail("SentenceEncoder::encode: batch_size must be >= 1, got " + std::to_string(batch_size));
  const int64_t n = (int64_t)ids.size(), d = model->cfg.d_model;
  std::vector<int64_t> order((size_t)n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return ids[a].size() < ids[b].size(); });
  std::vector<float> out((size_t)checked_mul(n, d, "SentenceEncoder::encode"));
  autograd::NoGrad no_grad;
  for (int64_t start = 0; start < n; start += batch_size) {
    const int64_t end = std::min(n, start + batch_size);
    std::vector<std::vector<int64_t>> rows;
    for (int64_t i = start; i < end; ++i) rows.push_back(ids[order[i]]);
    const auto [x, pad] = pad_batch(rows, model->cfg.pad_id);
    const std::vector<float> e = to_dtype(embed(x, pad), DType::f32).to_vector<float>();
    for (int64_t i = start; i < end; ++i)
      std::copy_n(e.begin() + (i - start) * d, d, out.begin() + order[i] * d);
    if (progress) progress(end, n);
  }
  return from_vector(out, {n, d});
}

Tensor SentenceEncoder::encode(const std::vector<std::string>& texts, int64_t batch_size,
                               const Progress& progress) const {
  try {
    return encode_ids(tokenize_texts(tokenizer, texts, max_seq_length), batch_size, progress);
  } catch (const Error& e) {
    fail(std::string("SentenceEncoder::encode: ") + e.what());
  }
}

}  // namespace graft::models
