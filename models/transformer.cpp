#include "graft/models/transformer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "graft/autograd/tape.h"
#include "graft/autograd/text.h"
#include "graft/models/config_json.h"
#include "graft/ops/ops.h"

namespace graft::models {

namespace {

// "sinusoid_layout": halves (Hugging Face Marian's) needs sinusoidal positions.
ConfigField<TransformerConfig> sinusoid_layout_field() {
  using C = TransformerConfig;
  return choice_field<C, SinusoidLayout>(
             "sinusoid_layout", member(&C::sinusoid_layout),
             {{SinusoidLayout::interleaved, "interleaved"}, {SinusoidLayout::halves, "halves"}},
             "the sinusoid table's columns")
      .optional()
      .and_check([](const C& c, const ConfigCheck& k) {
        if (c.sinusoid_layout == SinusoidLayout::halves &&
            c.positions.kind != nn::Positions::sinusoidal)
          k.bad("sinusoid_layout", "halves needs sinusoidal positions, got positions " +
                                       std::string(nn::positions_name(c.positions.kind)));
      });
}

// Hugging Face Marian's table: sin(t / 10000^(2k/d)) in columns k < ceil(d/2), the cosines of
// the same angles (k < d/2) after them; computed in double as numpy does, then rounded once.
Tensor halves_sinusoid_table(int64_t n, int64_t d, DType dt) {
  const int64_t sines = (d + 1) / 2;
  std::vector<double> v(n * d);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t k = 0; k < sines; ++k) {
      const double angle = (double)t / std::pow(10000.0, (double)(2 * k) / (double)d);
      v[t * d + k] = std::sin(angle);
      if (sines + k < d) v[t * d + sines + k] = std::cos(angle);
    }
  return from_vector(v, {n, d}, dt);
}

}  // namespace

const ConfigFields<TransformerConfig>& TransformerConfig::fields() {
  using C = TransformerConfig;
  static const ConfigFields<C> table = [] {
    ConfigFields<C> f = model_fields<C>();
    for (ConfigField<C>& p : f)
      if (std::string(p.name) == "positions")
        p = p.or_old("learned_pos", [](C& c, const ConfigReader& r, const char* key) {
          bool learned = false;  // configs written before "positions" existed
          r.get(key, learned);
          if (learned) c.positions.kind = nn::Positions::learned;
        });
    const ConfigFields<C> more = {
        size_field<C>("enc_layers", member(&C::enc_layers), "encoder layers", kMaxLayers),
        size_field<C>("dec_layers", member(&C::dec_layers), "decoder layers", kMaxLayers),
        value_field<C>("final_norm", member(&C::final_norm), "a LayerNorm after each stack"),
        probability_field<C>("attention_dropout", member(&C::attention_dropout),
                             "on the attention probabilities")
            .optional(),
        activation_field<C>(member(&C::activation),
                            {nn::Activation::relu, nn::Activation::gelu, nn::Activation::gelu_tanh,
                             nn::Activation::silu})
            .optional(),
        token_field<C>("bos_id", member(&C::bos_id), "the begin-of-sequence token"),
        token_field<C>("eos_id", member(&C::eos_id), "the end-of-sequence token"),
        sinusoid_layout_field(),
        value_field<C>("scale_embedding", member(&C::scale_embedding),
                       "the embeddings times sqrt(d_model)")
            .optional(),
        value_field<C>("logits_bias", member(&C::logits_bias), "a bias added to the logits")
            .optional(),
        value_field<C>("mask_target_pad", member(&C::mask_target_pad),
                       "target pad tokens masked in the decoder's self-attention")
            .optional(),
    };
    f.insert(f.end(), more.begin(), more.end());
    return f;
  }();
  return table;
}

nlohmann::json TransformerConfig::to_json() const { return write_fields(*this, fields()); }

TransformerConfig TransformerConfig::from_json(const nlohmann::json& j, const std::string& where) {
  TransformerConfig c;
  read_fields(c, j, where, fields());
  c.validate(where);
  return c;
}

void TransformerConfig::validate(const std::string& where) const {
  check_fields(*this, where, fields());
}

int64_t TransformerConfig::parameter_count() const {
  int64_t n = embedding_parameters(vocab, d_model, max_len, positions.kind);
  n = checked_add(n, nn::encoder_parameters(layer(), enc_layers, final_norm, positions),
                  "parameter count");
  if (logits_bias) n = checked_add(n, vocab, "parameter count");
  return checked_add(n, nn::decoder_parameters(layer(), dec_layers, final_norm, positions),
                     "parameter count");
}

nn::LayerConfig TransformerConfig::layer() const {
  nn::LayerConfig l =
      nn::layer_config(d_model, heads, d_ff, dropout, norm_first, dtype, activation);
  l.attention_dropout = attention_dropout;
  return l;
}

TransformerConfig preset(const std::string& name, int64_t vocab) {
  TransformerConfig c;
  c.vocab = vocab;
  struct P {
    const char* n;
    int64_t d, h, ff, l;
  };
  static const P presets[] = {{"tiny", 128, 4, 512, 2},
                              {"small", 256, 4, 1024, 3},
                              {"base", 512, 8, 2048, 6},
                              {"big", 1024, 16, 4096, 6}};
  for (auto& p : presets)
    if (name == p.n) {
      c.d_model = p.d;
      c.heads = p.h;
      c.d_ff = p.ff;
      c.enc_layers = c.dec_layers = p.l;
      return c;
    }
  fail("preset: unknown preset '" + text::printable(name) + "' (known: tiny, small, base, big)");
}

Transformer::Transformer(const TransformerConfig& c) : cfg(c), dropout_gen(c.seed * 7919 + 1) {
  c.validate("Transformer");
  Generator gen(c.seed);
  // Shared embedding ~ N(0, d^-1/2): scaled by sqrt(d) it has unit variance at the input, and as
  // the tied output projection it gives logits of unit scale.
  embedding = register_module(
      "embedding", std::make_shared<nn::Embedding>(c.vocab, c.d_model, c.pad_id, c.dtype, gen,
                                                   1.0 / std::sqrt((double)c.d_model)));
  pos = register_module(c.positions.kind == nn::Positions::learned ? "learned_pos" : "sin_pos",
                        std::make_shared<nn::EmbeddingPositions>(c.positions.kind, c.max_len,
                                                                 c.d_model, c.dtype, gen));
  if (c.sinusoid_layout == SinusoidLayout::halves)
    copy_into(pos->table, halves_sinusoid_table(c.max_len, c.d_model, c.dtype));
  if (c.logits_bias)
    final_logits_bias = register_parameter(
        "final_logits_bias",
        nn::new_parameter({c.vocab}, c.dtype, [&] { return zeros({c.vocab}, c.dtype); }));
  dropout = register_module("dropout", std::make_shared<nn::Dropout>(c.dropout, &dropout_gen));
  encoder = register_module(
      "encoder", std::make_shared<nn::Encoder>(c.layer(), c.enc_layers, c.final_norm, gen,
                                               &dropout_gen, c.positions));
  decoder = register_module(
      "decoder", std::make_shared<nn::Decoder>(c.layer(), c.dec_layers, c.final_norm, gen,
                                               &dropout_gen, c.positions));
  // nn.Transformer._reset_parameters: Xavier-uniform on every matrix of the stacks.
  for (auto* stack : {(nn::Module*)encoder.get(), (nn::Module*)decoder.get()})
    for (auto& [name, p] : stack->named_parameters())
      if (p.dim() > 1 && name.find("relative_attention_bias") == std::string::npos)
        nn::xavier_uniform_(p, gen);
}

Tensor Transformer::pad_mask(const Tensor& ids) const { return eq(ids, (double)cfg.pad_id); }

Tensor Transformer::embed(const Tensor& ids, int64_t start) const {
  if (ids.dtype() != DType::i64 || ids.dim() != 2)
    fail("Transformer: token ids must be int64 (B, T), got " + describe(ids));
  const int64_t T = ids.shape()[1];
  if (cfg.sinusoid_layout == SinusoidLayout::halves && start + T > cfg.max_len)
    fail("Transformer: positions " + std::to_string(start) + ".." + std::to_string(start + T - 1) +
         " exceed max_len " + std::to_string(cfg.max_len) +
         " (the halves sinusoid layout has no rows past max_len, as Hugging Face Marian)");
  Tensor x = embedding->forward(ids);
  if (cfg.scale_embedding) x = affine(x, std::sqrt((double)cfg.d_model), 0.0);
  x = pos->forward(x, start);
  return dropout->forward(x);
}

Tensor Transformer::encode(const Tensor& src) const {
  return encoder->forward(embed(src), pad_mask(src));
}

Tensor Transformer::logits(const Tensor& h) const {
  const Tensor l = linear(h, embedding->weight);
  return final_logits_bias.defined() ? add(l, final_logits_bias) : l;
}

Tensor Transformer::decoder_states(const Tensor& memory, const Tensor& src, const Tensor& tgt_in,
                                   Tensors* cross_weights) const {
  if (src.shape()[0] != tgt_in.shape()[0])
    fail("Transformer: source batch " + describe(src) + " and target batch " + describe(tgt_in) +
         " differ");
  const Tensor tgt_pad = cfg.mask_target_pad ? pad_mask(tgt_in) : Tensor();
  return decoder->forward(embed(tgt_in), memory, tgt_pad, pad_mask(src), cross_weights);
}

Tensor Transformer::decode(const Tensor& memory, const Tensor& src, const Tensor& tgt_in,
                           Tensors* cross_weights) const {
  return logits(decoder_states(memory, src, tgt_in, cross_weights));
}

Tensor Transformer::loss(const Tensor& src, const Tensor& tgt_in, const Tensor& tgt_out,
                         double label_smoothing) const {
  const auto named = scope();
  if (tgt_out.shape() != tgt_in.shape())
    fail("Transformer::loss: tgt_out " + describe(tgt_out) + " must have tgt_in's shape " +
         describe(tgt_in));
  Tensor h = decoder_states(encode(src), src, tgt_in);
  if (final_logits_bias.defined())  // linear_cross_entropy has no bias: the logits are held
    return cross_entropy(reshape(logits(h), {-1, cfg.vocab}), reshape(tgt_out, {-1}),
                         label_smoothing, cfg.pad_id);
  return linear_cross_entropy(reshape(h, {-1, cfg.d_model}), embedding->weight,
                              reshape(tgt_out, {-1}), label_smoothing, cfg.pad_id);
}

// ---------------------------------------------------------------------------------------------
// Decoding: the Transformer's DecodeStep for models/decoding.

namespace {

Tensor ids_tensor(const std::vector<int64_t>& v, int64_t rows) {
  return from_vector(v, {rows, (int64_t)v.size() / rows}, DType::i64);
}

// Next-token logits of each row given the encoded source; with use_cache only the newest token
// runs through the decoder (self-attention keys/values cached, cross-attention ones computed once).
class TransformerStep : public DecodeStep {
 public:
  TransformerStep(const Transformer& m, const Tensor& src, const DecodeOptions& o)
      : m_(m),
        memory_(m.encode(src)),
        src_(src),
        src_pad_(m.pad_mask(src)),
        capacity_(o.max_len + 1),
        use_cache_(o.use_cache),
        source_(src.shape()[0]) {
    std::iota(source_.begin(), source_.end(), 0);
  }

  Tensor next_logits(const std::vector<std::vector<int64_t>>& prefix) override {
    const int64_t rows = (int64_t)prefix.size(), t = (int64_t)prefix[0].size();
    if (use_cache_) {
      std::vector<int64_t> last(rows);
      for (int64_t r = 0; r < rows; ++r) last[r] = prefix[r].back();
      Tensor h = m_.decoder->forward_step(m_.embed(ids_tensor(last, rows), t - 1), memory_,
                                          src_pad_, caches_, capacity_, nullptr, group_);
      return reshape(m_.logits(h), {rows, m_.cfg.vocab});
    }
    std::vector<int64_t> all;
    for (auto& p : prefix) all.insert(all.end(), p.begin(), p.end());
    Tensor lg = m_.decode(memory_, src_, ids_tensor(all, rows));
    return reshape(slice(lg, 1, t - 1, t), {rows, m_.cfg.vocab});
  }

  // The self-attention caches follow the rows. What depends only on a row's source (the encoder
  // output, the cross-attention cache, the padding: the source rows) is not copied per row when
  // the rows are G consecutive ones per source, in the sources' order (beam search's beams):
  // the cached decoder then reads each source row once for its G rows (group_). Otherwise the
  // source rows are gathered per row, and only when some row's source changes.
  void select(const std::vector<int64_t>& rows) override {
    for (size_t i = 0; i < rows.size(); ++i)
      if (rows[i] < 0 || rows[i] >= (int64_t)source_.size())
        fail("decode: row " + std::to_string(rows[i]) + " (position " + std::to_string(i) +
             ") selected from " + std::to_string(source_.size()) + " rows");
    Tensor r = from_vector(rows, {(int64_t)rows.size()}, DType::i64);
    for (auto& c : caches_) c.self.select_rows(r);
    std::vector<int64_t> source(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) source[i] = source_[rows[i]];
    if (source == source_) return;
    source_ = std::move(source);
    if (use_cache_ && grouped_by_source()) {
      group_ = (int64_t)source_.size() / memory_.shape()[0];
      return;
    }
    std::vector<int64_t> from(rows.size());  // the source row each row reads now
    for (size_t i = 0; i < rows.size(); ++i) from[i] = rows[i] / group_;
    Tensor f = from_vector(from, {(int64_t)from.size()}, DType::i64);
    for (auto& c : caches_) c.cross.select_rows(f);
    memory_ = index_select(memory_, 0, f);
    src_ = index_select(src_, 0, f);
    src_pad_ = index_select(src_pad_, 0, f);
    group_ = 1;
    ungathered_ = false;
  }

 private:
  const Transformer& m_;
  Tensor memory_, src_, src_pad_;
  std::vector<nn::DecoderLayerCache> caches_;
  int64_t capacity_;
  bool use_cache_;
  // Whether source_ is G consecutive rows of each source in order, and the source rows are
  // still the encoder's (one per source, in order).
  bool grouped_by_source() const {
    const int64_t n = memory_.shape()[0], rows = (int64_t)source_.size();
    if (!ungathered_ || rows % n != 0) return false;
    for (int64_t i = 0; i < rows; ++i)
      if (source_[i] != i / (rows / n)) return false;
    return true;
  }

  std::vector<int64_t> source_;  // the source (row of src) of each row
  int64_t group_ = 1;            // rows per source row: row i reads source row i / group_
  bool ungathered_ = true;       // memory_, src_, src_pad_ hold one row per source, in order
};

// Learned positions and the halves sinusoid table exist only below max_len; the others
// extrapolate.
void check_src(const Transformer& m, const Tensor& src, const DecodeOptions& o) {
  if (src.dtype() != DType::i64 || src.dim() != 2)
    fail("decode: source ids must be int64 (B, S), got " + describe(src));
  check_decode_options(o);
  const bool bounded = m.cfg.positions.kind == nn::Positions::learned ||
                       m.cfg.sinusoid_layout == SinusoidLayout::halves;
  if (bounded && o.max_len + 1 > m.cfg.max_len)
    fail("decode: max_len " + std::to_string(o.max_len) + " must be in [1, " +
         std::to_string(m.cfg.max_len - 1) + "] with " +
         (m.cfg.positions.kind == nn::Positions::learned ? "learned positions"
                                                         : "the halves sinusoid layout") +
         " (config max_len " + std::to_string(m.cfg.max_len) + ")");
}

}  // namespace

Sequences translate(const Transformer& m, const Tensor& src, const DecodeOptions& o) {
  check_src(m, src, o);
  check_stop_ids(m.cfg.eos_id, o, m.cfg.vocab);  // before the encoder runs
  autograd::NoGrad ng;
  TransformerStep step(m, src, o);
  return decode(step, Sequences(src.shape()[0], {m.cfg.bos_id}), m.cfg.eos_id, o);
}

}  // namespace graft::models
