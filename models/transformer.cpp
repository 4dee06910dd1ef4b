#include "models/transformer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "autograd/tape.h"
#include "ops/ops.h"

namespace graft::models {

nlohmann::json TransformerConfig::to_json() const {
  return {{"vocab", vocab},           {"d_model", d_model},   {"heads", heads},
          {"d_ff", d_ff},             {"enc_layers", enc_layers}, {"dec_layers", dec_layers},
          {"max_len", max_len},       {"dropout", dropout},   {"norm_first", norm_first},
          {"final_norm", final_norm}, {"learned_pos", learned_pos},
          {"activation", activation == nn::Activation::relu ? "relu" : "gelu"},
          {"pad_id", pad_id},         {"bos_id", bos_id},     {"eos_id", eos_id},
          {"dtype", dtype_name(dtype)}, {"seed", seed}};
}

TransformerConfig TransformerConfig::from_json(const nlohmann::json& j) {
  TransformerConfig c;
  try {
    c.vocab = j.at("vocab").get<int64_t>();
    c.d_model = j.at("d_model").get<int64_t>();
    c.heads = j.at("heads").get<int64_t>();
    c.d_ff = j.at("d_ff").get<int64_t>();
    c.enc_layers = j.at("enc_layers").get<int64_t>();
    c.dec_layers = j.at("dec_layers").get<int64_t>();
    c.max_len = j.at("max_len").get<int64_t>();
    c.dropout = j.at("dropout").get<double>();
    c.norm_first = j.at("norm_first").get<bool>();
    c.final_norm = j.at("final_norm").get<bool>();
    c.learned_pos = j.value("learned_pos", false);
    const std::string act = j.value("activation", std::string("relu"));
    if (act != "relu" && act != "gelu") fail("activation must be relu or gelu, got '" + act + "'");
    c.activation = act == "relu" ? nn::Activation::relu : nn::Activation::gelu;
    c.pad_id = j.at("pad_id").get<int64_t>();
    c.bos_id = j.at("bos_id").get<int64_t>();
    c.eos_id = j.at("eos_id").get<int64_t>();
    const std::string dt = j.value("dtype", std::string("float32"));
    c.dtype = dt == "float64" ? DType::f64 : DType::f32;
    c.seed = j.value("seed", uint64_t(1));
  } catch (const nlohmann::json::exception& e) {
    fail(std::string("TransformerConfig: bad config: ") + e.what());
  }
  if (c.vocab <= 0 || c.d_model <= 0 || c.heads <= 0 || c.d_model % c.heads || c.max_len <= 0)
    fail("TransformerConfig: inconsistent sizes: " + c.to_json().dump());
  return c;
}

nn::LayerConfig TransformerConfig::layer() const {
  return nn::layer_config(d_model, heads, d_ff, dropout, norm_first, dtype, activation);
}

TransformerConfig preset(const std::string& name, int64_t vocab) {
  TransformerConfig c;
  c.vocab = vocab;
  struct P { const char* n; int64_t d, h, ff, l; };
  static const P presets[] = {{"tiny", 128, 4, 512, 2}, {"small", 256, 4, 1024, 3},
                              {"base", 512, 8, 2048, 6}, {"big", 1024, 16, 4096, 6}};
  for (auto& p : presets)
    if (name == p.n) {
      c.d_model = p.d;
      c.heads = p.h;
      c.d_ff = p.ff;
      c.enc_layers = c.dec_layers = p.l;
      return c;
    }
  fail("preset: unknown preset '" + name + "' (known: tiny, small, base, big)");
}

Transformer::Transformer(const TransformerConfig& c) : cfg(c), dropout_gen(c.seed * 7919 + 1) {
  Generator gen(c.seed);
  // Shared embedding ~ N(0, d^-1/2): scaled by sqrt(d) it has unit variance at the input, and as
  // the tied output projection it gives logits of unit scale.
  embedding = register_module("embedding", std::make_shared<nn::Embedding>(
                                               c.vocab, c.d_model, c.pad_id, c.dtype, gen,
                                               1.0 / std::sqrt((double)c.d_model)));
  if (c.learned_pos)
    learned_pos = register_module("learned_pos", std::make_shared<nn::LearnedPositionalEncoding>(c.max_len, c.d_model, c.dtype, gen));
  else
    sin_pos = register_module("sin_pos", std::make_shared<nn::SinusoidalPositionalEncoding>(c.max_len, c.d_model, c.dtype));
  dropout = register_module("dropout", std::make_shared<nn::Dropout>(c.dropout, &dropout_gen));
  encoder = register_module("encoder", std::make_shared<nn::Encoder>(c.layer(), c.enc_layers, c.final_norm, gen, &dropout_gen));
  decoder = register_module("decoder", std::make_shared<nn::Decoder>(c.layer(), c.dec_layers, c.final_norm, gen, &dropout_gen));
  // nn.Transformer._reset_parameters: Xavier-uniform on every matrix of the stacks.
  for (auto* stack : {(nn::Module*)encoder.get(), (nn::Module*)decoder.get()})
    for (auto& [name, p] : stack->named_parameters())
      if (p.dim() > 1) nn::xavier_uniform_(p, gen);
}

Tensor Transformer::pad_mask(const Tensor& ids) const { return eq(ids, (double)cfg.pad_id); }

Tensor Transformer::embed(const Tensor& ids, int64_t start) const {
  if (ids.dtype() != DType::i64 || ids.dim() != 2)
    fail("Transformer: token ids must be int64 (B, T), got " + describe(ids));
  Tensor x = affine(embedding->forward(ids), std::sqrt((double)cfg.d_model), 0.0);
  x = learned_pos ? learned_pos->forward(x, start) : sin_pos->forward(x, start);
  return dropout->forward(x);
}

Tensor Transformer::encode(const Tensor& src) const { return encoder->forward(embed(src), pad_mask(src)); }

Tensor Transformer::logits(const Tensor& h) const { return linear(h, embedding->weight); }

Tensor Transformer::decoder_states(const Tensor& memory, const Tensor& src, const Tensor& tgt_in,
                                   Tensors* cross_weights) const {
  if (src.shape()[0] != tgt_in.shape()[0])
    fail("Transformer: source batch " + describe(src) + " and target batch " + describe(tgt_in) + " differ");
  return decoder->forward(embed(tgt_in), memory, pad_mask(tgt_in), pad_mask(src), cross_weights);
}

Tensor Transformer::decode(const Tensor& memory, const Tensor& src, const Tensor& tgt_in,
                           Tensors* cross_weights) const {
  return logits(decoder_states(memory, src, tgt_in, cross_weights));
}

Tensor Transformer::loss(const Tensor& src, const Tensor& tgt_in, const Tensor& tgt_out,
                         double label_smoothing) const {
  if (tgt_out.shape() != tgt_in.shape())
    fail("Transformer::loss: tgt_out " + describe(tgt_out) + " must have tgt_in's shape " +
         describe(tgt_in));
  Tensor h = decoder_states(encode(src), src, tgt_in);
  return linear_cross_entropy(reshape(h, {-1, cfg.d_model}), embedding->weight,
                              reshape(tgt_out, {-1}), label_smoothing, cfg.pad_id);
}

nn::NamedTensors state_dict(const Transformer& m) { return m.named_parameters(); }

void load_state_dict(Transformer& m, const nn::NamedTensors& tensors) {
  auto params = m.named_parameters();
  for (auto& [name, p] : params) {
    auto it = std::find_if(tensors.begin(), tensors.end(), [&](auto& kv) { return kv.first == name; });
    if (it == tensors.end()) fail("load_state_dict: missing tensor '" + name + "'");
    if (it->second.shape() != p.shape())
      fail("load_state_dict: tensor '" + name + "' has shape " + shape_str(it->second.shape()) +
           " but the model expects " + shape_str(p.shape()));
    autograd::NoGrad ng;
    copy_into(p, it->second);
  }
  for (auto& [name, t] : tensors) {
    bool known = std::any_of(params.begin(), params.end(), [&](auto& kv) { return kv.first == name; });
    if (!known) fail("load_state_dict: unexpected tensor '" + name + "'");
  }
}

// ---------------------------------------------------------------------------------------------
// Decoding.
namespace {

Tensor ids_tensor(const std::vector<int64_t>& v, int64_t rows) {
  return from_vector(v, {rows, (int64_t)v.size() / rows}, DType::i64);
}

// Log-probabilities of the next token for every row, (rows, V) as doubles.
struct Stepper {
  const Transformer& m;
  Tensor memory, src, src_pad;
  std::vector<nn::DecoderLayerCache> caches;
  int64_t capacity;
  bool use_cache;
  std::vector<std::vector<int64_t>> prefix;  // per row, starting with BOS

  Tensor next_logits() {
    const int64_t rows = (int64_t)prefix.size();
    const int64_t t = (int64_t)prefix[0].size();
    if (use_cache) {
      std::vector<int64_t> last(rows);
      for (int64_t r = 0; r < rows; ++r) last[r] = prefix[r].back();
      Tensor h = m.decoder->forward_step(m.embed(ids_tensor(last, rows), t - 1), memory, src_pad, caches, capacity);
      return reshape(m.logits(h), {rows, m.cfg.vocab});
    }
    std::vector<int64_t> all;
    for (auto& p : prefix) all.insert(all.end(), p.begin(), p.end());
    Tensor lg = m.decode(memory, src, ids_tensor(all, rows));
    return reshape(slice(lg, 1, t - 1, t), {rows, m.cfg.vocab});
  }
  void select(const std::vector<int64_t>& rows) {
    Tensor r = from_vector(rows, {(int64_t)rows.size()}, DType::i64);
    for (auto& c : caches) {
      c.self.select_rows(r);
      c.cross.select_rows(r);
    }
    memory = index_select(memory, 0, r);
    src = index_select(src, 0, r);
    src_pad = index_select(src_pad, 0, r);
    std::vector<std::vector<int64_t>> np;
    for (auto i : rows) np.push_back(prefix[i]);
    prefix = std::move(np);
  }
};

void check_src(const Transformer& m, const Tensor& src, const DecodeOptions& o) {
  if (src.dtype() != DType::i64 || src.dim() != 2)
    fail("decode: source ids must be int64 (B, S), got " + describe(src));
  if (o.max_len < 1 || o.max_len + 1 > m.cfg.max_len)
    fail("decode: max_len " + std::to_string(o.max_len) + " must be in [1, " +
         std::to_string(m.cfg.max_len - 1) + "]");
}

std::vector<int64_t> cut_at_eos(const std::vector<int64_t>& p, int64_t eos) {
  std::vector<int64_t> out;
  for (size_t i = 1; i < p.size(); ++i) {
    if (p[i] == eos) break;
    out.push_back(p[i]);
  }
  return out;
}

}  // namespace

std::vector<std::vector<int64_t>> greedy_decode(const Transformer& m, const Tensor& src,
                                                const DecodeOptions& o) {
  check_src(m, src, o);
  autograd::NoGrad ng;
  const int64_t B = src.shape()[0];
  Stepper s{m, m.encode(src), src, m.pad_mask(src), {}, o.max_len + 1, o.use_cache, {}};
  s.prefix.assign(B, {m.cfg.bos_id});
  std::vector<bool> done(B, false);
  for (int64_t step = 0; step < o.max_len; ++step) {
    auto next = argmax(s.next_logits(), 1).to_vector<int64_t>();
    bool all = true;
    for (int64_t b = 0; b < B; ++b) {
      s.prefix[b].push_back(done[b] ? m.cfg.eos_id : next[b]);
      done[b] = done[b] || next[b] == m.cfg.eos_id;
      all = all && done[b];
    }
    if (all && o.stop_at_eos) break;
  }
  std::vector<std::vector<int64_t>> out;
  for (auto& p : s.prefix) out.push_back(o.stop_at_eos ? cut_at_eos(p, m.cfg.eos_id)
                                                       : std::vector<int64_t>(p.begin() + 1, p.end()));
  return out;
}

std::vector<std::vector<int64_t>> beam_search(const Transformer& m, const Tensor& src,
                                              const DecodeOptions& o) {
  check_src(m, src, o);
  if (o.beam < 1) fail("beam_search: beam size must be >= 1, got " + std::to_string(o.beam));
  autograd::NoGrad ng;
  const int64_t B = src.shape()[0], K = o.beam, V = m.cfg.vocab;
  const double NEG = -std::numeric_limits<double>::infinity();
  std::vector<int64_t> rows;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t k = 0; k < K; ++k) rows.push_back(b);
  Stepper s{m, m.encode(src), src, m.pad_mask(src), {}, o.max_len + 1, o.use_cache, {}};
  s.prefix.assign(B, {m.cfg.bos_id});
  s.select(rows);
  std::vector<double> score(B * K, NEG);
  for (int64_t b = 0; b < B; ++b) score[b * K] = 0;  // only the first beam is live at the start
  std::vector<bool> done(B * K, false);
  auto lp = [&](size_t len) { return std::pow((5.0 + (double)len) / 6.0, o.length_penalty); };
  for (int64_t step = 0; step < o.max_len; ++step) {
    auto logp = log_softmax(to_dtype(s.next_logits(), DType::f64), 1).to_vector<double>();
    std::vector<int64_t> pick(B * K);
    std::vector<int64_t> token(B * K);
    std::vector<double> nscore(B * K);
    std::vector<bool> ndone(B * K);
    for (int64_t b = 0; b < B; ++b) {
      // Candidates (score, beam, token); a finished beam only continues with EOS at no cost.
      std::vector<std::tuple<double, int64_t, int64_t>> cand;
      cand.reserve(K * V);
      for (int64_t k = 0; k < K; ++k) {
        const int64_t r = b * K + k;
        if (score[r] == NEG) continue;
        if (done[r]) {
          cand.emplace_back(score[r], k, m.cfg.eos_id);
          continue;
        }
        for (int64_t v = 0; v < V; ++v) cand.emplace_back(score[r] + logp[r * V + v], k, v);
      }
      // The K best, highest score first; ties go to the lower beam, then the lower token id
      // (as argmax). A partial sort: sorting all K*V candidates dominated decoding time.
      const size_t keep = std::min<size_t>(K, cand.size());
      std::partial_sort(cand.begin(), cand.begin() + keep, cand.end(), [](auto& x, auto& y) {
        if (std::get<0>(x) != std::get<0>(y)) return std::get<0>(x) > std::get<0>(y);
        return std::make_pair(std::get<1>(x), std::get<2>(x)) < std::make_pair(std::get<1>(y), std::get<2>(y));
      });
      for (int64_t k = 0; k < K; ++k) {
        const int64_t r = b * K + k;
        if (k < (int64_t)cand.size()) {
          auto [sc, from, tok] = cand[k];
          pick[r] = b * K + from;
          token[r] = tok;
          nscore[r] = sc;
          ndone[r] = done[b * K + from] || tok == m.cfg.eos_id;
        } else {
          pick[r] = b * K;
          token[r] = m.cfg.eos_id;
          nscore[r] = NEG;
          ndone[r] = true;
        }
      }
    }
    s.select(pick);
    bool all = true;
    for (int64_t r = 0; r < B * K; ++r) {
      s.prefix[r].push_back(token[r]);
      all = all && (ndone[r] || nscore[r] == NEG);
    }
    score = nscore;
    done = ndone;
    if (all && o.stop_at_eos) break;
  }
  std::vector<std::vector<int64_t>> out;
  for (int64_t b = 0; b < B; ++b) {
    int64_t best = -1;
    double best_v = NEG;
    for (int64_t k = 0; k < K; ++k) {
      const int64_t r = b * K + k;
      if (score[r] == NEG) continue;
      const double v = score[r] / lp(cut_at_eos(s.prefix[r], m.cfg.eos_id).size());
      if (best < 0 || v > best_v) best = r, best_v = v;
    }
    auto& p = s.prefix[best < 0 ? b * K : best];
    out.push_back(o.stop_at_eos ? cut_at_eos(p, m.cfg.eos_id) : std::vector<int64_t>(p.begin() + 1, p.end()));
  }
  return out;
}

}  // namespace graft::models
