// The Transformer's Marian options (plain silu FFN, the halves sinusoid layout, scale_embedding,
// final_logits_bias, no target pad masking) and Hugging Face Marian checkpoints
// (models/hf_marian.h): tiny directories written with graft's own safetensors writer, and every
// refusal naming its cause.
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <filesystem>
#include <map>

#include "graft/autograd/tape.h"
#include "graft/models/hf_marian.h"
#include "graft/models/transformer.h"
#include "graft/nn/layers.h"
#include "graft/nn/text/marian_tokenizer.h"
#include "graft/nn/text/tokenizer.h"
#include "graft/nn/train/checkpoint.h"
#include "graft/ops/ops.h"
#include "tests/test_util.h"

using namespace graft;
using namespace graft::models;
using graft::testing::names;
using graft::testing::TempDir;

namespace {

// d 6, 2 heads, FFN 10, vocab 13, 1+1 layers, no dropout, float64 for exact comparisons.
TransformerConfig tiny_cfg() {
  TransformerConfig c;
  c.vocab = 13, c.d_model = 6, c.heads = 2, c.d_ff = 10, c.max_len = 8;
  c.enc_layers = c.dec_layers = 1;
  c.dropout = 0, c.pad_id = 12, c.bos_id = 12, c.eos_id = 0, c.dtype = DType::f64;
  return c;
}

Tensor ids(const std::vector<int64_t>& v, int64_t rows) {
  return from_vector(v, {rows, (int64_t)v.size() / rows}, DType::i64);
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = to_dtype(a, DType::f64).to_vector<double>(),
                            y = to_dtype(b, DType::f64).to_vector<double>();
  BOOST_REQUIRE_EQUAL(x.size(), y.size());
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

void check_config_refused(const nlohmann::json& j, const std::string& part) {
  BOOST_CHECK_EXCEPTION(TransformerConfig::from_json(j, "cfg.json"), Error,
                        [&](const Error& e) { return names(e, part); });
}

}  // namespace

BOOST_AUTO_TEST_SUITE(transformer_marian_options)

// An older config without the new fields reads today's behaviour; the new fields round-trip.
BOOST_AUTO_TEST_CASE(config_defaults_and_round_trip) {
  nlohmann::json j = tiny_cfg().to_json();
  for (const char* k : {"sinusoid_layout", "scale_embedding", "logits_bias", "mask_target_pad"})
    j.erase(k);
  const TransformerConfig old = TransformerConfig::from_json(j);
  BOOST_TEST((old.sinusoid_layout == SinusoidLayout::interleaved));
  BOOST_TEST(old.scale_embedding);
  BOOST_TEST(!old.logits_bias);
  BOOST_TEST(old.mask_target_pad);
  TransformerConfig c = tiny_cfg();
  c.sinusoid_layout = SinusoidLayout::halves, c.scale_embedding = false, c.logits_bias = true;
  c.mask_target_pad = false, c.activation = nn::Activation::silu;
  const TransformerConfig back = TransformerConfig::from_json(c.to_json());
  BOOST_TEST((back.sinusoid_layout == SinusoidLayout::halves));
  BOOST_TEST(!back.scale_embedding);
  BOOST_TEST(back.logits_bias);
  BOOST_TEST(!back.mask_target_pad);
  BOOST_TEST((back.activation == nn::Activation::silu));
  BOOST_TEST(back.to_json()["activation"] == "silu");
}

BOOST_AUTO_TEST_CASE(config_refusals_name_the_field) {
  nlohmann::json j = tiny_cfg().to_json();
  j["sinusoid_layout"] = "swapped";
  check_config_refused(j, "cfg.json: field \"sinusoid_layout\" must be interleaved or halves");
  j["sinusoid_layout"] = "halves";
  j["positions"] = "learned";
  check_config_refused(j, "field \"sinusoid_layout\" halves needs sinusoidal positions");
  j = tiny_cfg().to_json();
  j["scale_embedding"] = "yes";
  check_config_refused(j, "field \"scale_embedding\"");
}

// Hugging Face Marian's table: sines of t / 10000^(2k/d) in the first half, cosines after.
BOOST_AUTO_TEST_CASE(halves_sinusoid_table) {
  TransformerConfig c = tiny_cfg();
  c.sinusoid_layout = SinusoidLayout::halves;
  Transformer m(c);
  const std::vector<double> t = m.pos->table.to_vector<double>();
  BOOST_REQUIRE_EQUAL(t.size(), 8u * 6u);
  for (int64_t p = 0; p < 8; ++p)
    for (int64_t k = 0; k < 3; ++k) {
      const double a = (double)p / std::pow(10000.0, 2.0 * k / 6.0);
      BOOST_TEST(t[p * 6 + k] == std::sin(a));
      BOOST_TEST(t[p * 6 + 3 + k] == std::cos(a));
    }
  // The interleaved default is unchanged: column 1 is cos of the angle of column 0.
  Transformer plain(tiny_cfg());
  BOOST_TEST(plain.pos->table.to_vector<double>()[6 + 1] == std::cos(1.0));
}

BOOST_AUTO_TEST_CASE(halves_table_has_no_rows_past_max_len) {
  TransformerConfig c = tiny_cfg();
  c.sinusoid_layout = SinusoidLayout::halves;
  Transformer m(c);
  BOOST_CHECK_EXCEPTION(m.embed(ids({1, 2, 3}, 1), 6), Error, [](const Error& e) {
    return names(e, "Transformer: positions 6..8 exceed max_len 8");
  });
  DecodeOptions o;
  o.max_len = 8;
  BOOST_CHECK_EXCEPTION(translate(m, ids({1, 2}, 1), o), Error, [](const Error& e) {
    return names(e, "decode: max_len 8 must be in [1, 7] with the halves sinusoid layout");
  });
}

BOOST_AUTO_TEST_CASE(scale_embedding_off_adds_the_rows_as_they_are) {
  TransformerConfig c = tiny_cfg();
  c.scale_embedding = false;
  Transformer m(c);
  const Tensor x = ids({4, 7}, 1);
  const Tensor want =
      add(index_select(m.embedding->weight, 0, reshape(x, {2})), slice(m.pos->table, 0, 0, 2));
  BOOST_TEST(max_abs_diff(m.embed(x), reshape(want, {1, 2, 6})) == 0.0);
  c.scale_embedding = true;
  Transformer scaled(c);
  BOOST_TEST(max_abs_diff(scaled.embed(x), reshape(want, {1, 2, 6})) > 0.1);
}

// final_logits_bias is a parameter of the state dict (counted), added to the logits and inside
// the loss.
BOOST_AUTO_TEST_CASE(final_logits_bias_is_added) {
  TransformerConfig c = tiny_cfg();
  c.logits_bias = true;
  Transformer m(c);
  bool listed = false;
  for (const auto& [n, t] : m.state_dict()) listed |= n == "final_logits_bias";
  BOOST_TEST(listed);
  BOOST_TEST(m.num_parameters() == c.parameter_count());
  BOOST_TEST(m.num_parameters() == Transformer(tiny_cfg()).num_parameters() + 13);
  Generator gen(3);
  copy_into(m.final_logits_bias, randn({13}, DType::f64, gen));
  const Tensor h = randn({1, 2, 6}, DType::f64, gen);
  const Tensor want = add(linear(h, m.embedding->weight), m.final_logits_bias);
  BOOST_TEST(max_abs_diff(m.logits(h), want) == 0.0);
  const Tensor src = ids({1, 2, 3}, 1), tin = ids({12, 4}, 1), tout = ids({4, 0}, 1);
  const Tensor ce =
      cross_entropy(reshape(m.forward(src, tin), {-1, 13}), reshape(tout, {-1}), 0.0, c.pad_id);
  BOOST_TEST(max_abs_diff(m.loss(src, tin, tout), ce) < 1e-12);
}

// With mask_target_pad false, a target pad (Marian's decoder start) is attended to: the full
// decoder equals the cached steps (which never mask target keys); with the default it differs.
BOOST_AUTO_TEST_CASE(target_pad_not_masked) {
  for (bool mask : {true, false}) {
    TransformerConfig c = tiny_cfg();
    c.mask_target_pad = mask;
    Transformer m(c);
    autograd::NoGrad ng;
    const Tensor src = ids({1, 2, 3}, 1), memory = m.encode(src);
    std::vector<nn::DecoderLayerCache> caches;
    m.decoder->forward_step(m.embed(ids({12}, 1), 0), memory, m.pad_mask(src), caches, 4);
    const Tensor step = m.logits(
        m.decoder->forward_step(m.embed(ids({5}, 1), 1), memory, m.pad_mask(src), caches, 4));
    const Tensor whole = slice(m.decode(memory, src, ids({12, 5}, 1)), 1, 1, 2);
    const double diff = max_abs_diff(step, whole);
    if (mask) BOOST_TEST(diff > 1e-6);
    else BOOST_TEST(diff < 1e-12);
  }
}

// The plain silu FFN: linear2(silu(linear1(x))).
BOOST_AUTO_TEST_CASE(silu_feed_forward) {
  Generator gen(4);
  nn::Linear l1(6, 10, true, DType::f64, gen), l2(10, 6, true, DType::f64, gen);
  nn::Dropout drop(0.0);
  const Tensor x = randn({2, 6}, DType::f64, gen);
  const Tensor h = l1.forward(x);
  const Tensor want = l2.forward(mul(h, sigmoid(h)));
  BOOST_TEST(max_abs_diff(nn::feed_forward(l1, drop, l2, nn::Activation::silu, x), want) < 1e-12);
  nn::Activation a = nn::Activation::relu;
  BOOST_TEST(nn::activation_from_name("silu", a));
  BOOST_TEST((a == nn::Activation::silu));
  TransformerConfig c = tiny_cfg();
  c.activation = nn::Activation::silu;
  BOOST_CHECK_NO_THROW(Transformer{c});
}

BOOST_AUTO_TEST_SUITE_END()

// ---------------------------------------------------------------------------------------------
// load_hf_marian on tiny directories.

namespace {

// d 8, 2 heads, FFN 12, vocab 11 (pad = decoder start 10, eos 0), 1 + 1 layers.
nlohmann::json marian_config() {
  return {{"model_type", "marian"},
          {"vocab_size", 11},
          {"d_model", 8},
          {"encoder_layers", 1},
          {"decoder_layers", 1},
          {"encoder_attention_heads", 2},
          {"decoder_attention_heads", 2},
          {"encoder_ffn_dim", 12},
          {"decoder_ffn_dim", 12},
          {"max_position_embeddings", 16},
          {"activation_function", "swish"},
          {"scale_embedding", true},
          {"pad_token_id", 10},
          {"decoder_start_token_id", 10},
          {"eos_token_id", 0},
          {"forced_eos_token_id", 0},
          {"bad_words_ids", {{10}}},
          {"num_beams", 4},
          {"normalize_before", true}};  // a legacy BART field Hugging Face ignores
}

using Files = std::map<std::string, Tensor>;

void put_layer(Files& t, const std::string& p, bool decoder, DType dt, Generator& gen) {
  const auto put = [&](const std::string& n, const Shape& s) { t[p + n] = randn(s, dt, gen); };
  for (const std::string& a : decoder ? std::vector<std::string>{"self_attn.", "encoder_attn."}
                                      : std::vector<std::string>{"self_attn."}) {
    for (const char* x : {"q_proj", "k_proj", "v_proj", "out_proj"})
      put(a + x + ".weight", {8, 8}), put(a + x + ".bias", {8});
  }
  for (const std::string& n :
       decoder ? std::vector<std::string>{"self_attn_layer_norm", "encoder_attn_layer_norm",
                                          "final_layer_norm"}
               : std::vector<std::string>{"self_attn_layer_norm", "final_layer_norm"})
    put(n + ".weight", {8}), put(n + ".bias", {8});
  put("fc1.weight", {12, 8}), put("fc1.bias", {12}), put("fc2.weight", {8, 12}),
      put("fc2.bias", {8});
}

// What MarianMTModel.save_pretrained writes: model.shared.weight, the layers, final_logits_bias.
Files marian_tensors(DType dt = DType::f32) {
  Generator gen(7);
  Files t;
  t["model.shared.weight"] = randn({11, 8}, dt, gen);
  t["final_logits_bias"] = randn({1, 11}, dt, gen);
  put_layer(t, "model.encoder.layers.0.", false, dt, gen);
  put_layer(t, "model.decoder.layers.0.", true, dt, gen);
  return t;
}

void write_dir(const TempDir& dir, const nlohmann::json& cfg, const Files& t) {
  train::save_json(dir / "config.json", cfg);
  nn::NamedTensors named(t.begin(), t.end());
  train::save_safetensors(dir / "model.safetensors", named, {{"format", "pt"}});
}

void check_load_refused(const TempDir& dir, const std::string& part) {
  BOOST_CHECK_EXCEPTION(load_hf_marian(dir.path.string()), Error,
                        [&](const Error& e) { return names(e, part); });
}

Tensor param(const Transformer& m, const std::string& name) {
  for (const auto& [n, p] : m.named_parameters())
    if (n == name) return p;
  BOOST_FAIL("no parameter " + name);
  return {};
}

}  // namespace

BOOST_AUTO_TEST_SUITE(hf_marian)

BOOST_AUTO_TEST_CASE(loads_the_config_and_the_tensors) {
  TempDir dir("marian");
  const Files t = marian_tensors();
  write_dir(dir, marian_config(), t);
  const HfMarian m = load_hf_marian(dir.path.string());
  const TransformerConfig& c = m.model->cfg;
  BOOST_TEST((c.activation == nn::Activation::silu));
  BOOST_TEST(c.scale_embedding);
  BOOST_TEST((c.sinusoid_layout == SinusoidLayout::halves));
  BOOST_TEST(!c.mask_target_pad);
  BOOST_TEST(!c.norm_first);
  BOOST_TEST(!c.final_norm);
  BOOST_TEST(c.bos_id == 10);
  BOOST_TEST(c.pad_id == 10);
  BOOST_TEST(c.eos_id == 0);
  BOOST_TEST(m.hf.num_beams == 4);
  BOOST_TEST(m.hf.forced_eos_id == 0);
  BOOST_TEST((m.hf.bad_words == std::vector<int64_t>{10}));
  BOOST_TEST(max_abs_diff(param(*m.model, "embedding.weight"), t.at("model.shared.weight")) == 0);
  BOOST_TEST(max_abs_diff(param(*m.model, "final_logits_bias"),
                          reshape(t.at("final_logits_bias"), {11})) == 0);
  const std::string a = "model.decoder.layers.0.encoder_attn.";
  const Tensor qkv =
      concat({t.at(a + "q_proj.weight"), t.at(a + "k_proj.weight"), t.at(a + "v_proj.weight")}, 0);
  BOOST_TEST(max_abs_diff(param(*m.model, "decoder.layers.0.multihead_attn.in_proj_weight"), qkv) ==
             0);
  BOOST_TEST(max_abs_diff(param(*m.model, "encoder.layers.0.norm2.weight"),
                          t.at("model.encoder.layers.0.final_layer_norm.weight")) == 0);
  BOOST_TEST(max_abs_diff(param(*m.model, "decoder.layers.0.norm3.bias"),
                          t.at("model.decoder.layers.0.final_layer_norm.bias")) == 0);
}

// The file's dtype is the model's; a bfloat16 file can be loaded into a float32 model.
BOOST_AUTO_TEST_CASE(keeps_the_dtype) {
  TempDir dir("marian");
  write_dir(dir, marian_config(), marian_tensors(DType::bf16));
  BOOST_TEST((load_hf_marian(dir.path.string()).model->cfg.dtype == DType::bf16));
  BOOST_TEST((load_hf_marian(dir.path.string(), DType::f32).model->cfg.dtype == DType::f32));
  BOOST_CHECK_EXCEPTION(load_hf_marian(dir.path.string(), DType::i64), Error, [](const Error& e) {
    return names(e, "load_hf_marian: the model's dtype must be a float dtype, got int64");
  });
}

// Any non-empty subset of the embedding copies, equal, without the `model.` prefix too;
// sinusoid tables and version buffers ignored; no final_logits_bias means zeros.
BOOST_AUTO_TEST_CASE(embedding_copies_and_ignorable_tensors) {
  TempDir dir("marian");
  Files t = marian_tensors();
  const Tensor e = t.at("model.shared.weight");
  t.erase("model.shared.weight"), t.erase("final_logits_bias");
  t["encoder.embed_tokens.weight"] = e, t["lm_head.weight"] = e;
  t["model.encoder.embed_positions.weight"] = zeros({16, 8});
  t["model.decoder.version"] = zeros({1});
  write_dir(dir, marian_config(), t);
  const HfMarian m = load_hf_marian(dir.path.string());
  BOOST_TEST(max_abs_diff(param(*m.model, "embedding.weight"), e) == 0);
  BOOST_TEST(max_abs_diff(param(*m.model, "final_logits_bias"), zeros({11})) == 0);
}

BOOST_AUTO_TEST_CASE(tensor_refusals_name_the_tensor) {
  TempDir dir("marian");
  Files t = marian_tensors();
  t["lm_head.weight"] = affine(t.at("model.shared.weight"), 1.0, 0.5);
  write_dir(dir, marian_config(), t);
  check_load_refused(dir, "tensor 'lm_head.weight' differs from 'shared.weight'");
  t = marian_tensors();
  t.erase("model.shared.weight");
  write_dir(dir, marian_config(), t);
  check_load_refused(dir, "tensor 'shared.weight' is missing");
  t = marian_tensors();
  t.erase("model.decoder.layers.0.encoder_attn.k_proj.bias");
  write_dir(dir, marian_config(), t);
  check_load_refused(dir, "tensor 'decoder.layers.0.encoder_attn.k_proj.bias' is missing");
  t = marian_tensors();
  t["model.encoder.layers.0.fc1.weight"] = zeros({8, 12});
  write_dir(dir, marian_config(), t);
  check_load_refused(
      dir,
      "tensor 'model.encoder.layers.0.fc1.weight' has shape (8, 12), the config needs "
      "(12, 8)");
  t = marian_tensors();
  t["final_logits_bias"] = zeros({11});
  write_dir(dir, marian_config(), t);
  check_load_refused(dir, "tensor 'final_logits_bias' has shape (11), the config needs (1, 11)");
  t = marian_tensors();
  t["model.encoder.layers.0.extra.weight"] = zeros({2});
  write_dir(dir, marian_config(), t);
  check_load_refused(dir, "unexpected tensor 'model.encoder.layers.0.extra.weight'");
}

// Each config refusal names its field.
BOOST_AUTO_TEST_CASE(config_refusals_name_the_field) {
  const auto refused = [](const char* key, const nlohmann::json& v, const std::string& part) {
    nlohmann::json j = marian_config();
    j[key] = v;
    BOOST_CHECK_EXCEPTION(hf_marian_config(j, "c.json"), Error,
                          [&](const Error& e) { return names(e, part); });
  };
  refused("model_type", "bart", "c.json: field \"model_type\" \"bart\" is not marian");
  refused("activation_function", "gelu_fast",
          "field \"activation_function\" \"gelu_fast\" is not supported");
  refused("share_encoder_decoder_embeddings", false,
          "field \"share_encoder_decoder_embeddings\" is false");
  refused("tie_word_embeddings", false, "field \"tie_word_embeddings\" is false");
  refused("decoder_vocab_size", 12, "field \"decoder_vocab_size\" 12 differs from vocab_size 11");
  refused("decoder_ffn_dim", 16, "field \"decoder_ffn_dim\" 16 differs from encoder_ffn_dim 12");
  refused("decoder_attention_heads", 4,
          "field \"decoder_attention_heads\" 4 differs from encoder_attention_heads 2");
  refused("bad_words_ids", {{3, 4}}, "field \"bad_words_ids\" holds a sequence of 2 tokens");
  refused("bad_words_ids", {{11}},
          "field \"bad_words_ids\" token 11 is outside [0, vocab_size 11)");
  refused("vocab_size", 0, "field \"vocab_size\" must be in [1, ");
  refused("d_model", 9, "field \"encoder_attention_heads\" 2 does not divide d_model 9");
  refused("pad_token_id", 11, "field \"pad_token_id\" must be in [0, 10], got 11");
  refused("eos_token_id", {0, 1}, "field \"eos_token_id\" holds 2 ids: graft reads one");
  refused("forced_eos_token_id", 20,
          "field \"forced_eos_token_id\" 20 is outside [0, vocab_size 11)");
  refused("num_beams", 0, "field \"num_beams\" must be >= 1, got 0");
  refused("scale_embedding", "yes", "field \"scale_embedding\"");
}

// MarianConfig's defaults for absent fields; generation_config.json read over config.json.
BOOST_AUTO_TEST_CASE(defaults_and_generation_config) {
  const HfMarianConfig d = hf_marian_config({{"model_type", "marian"}});
  BOOST_TEST(d.t.vocab == 58101);
  BOOST_TEST(d.t.d_model == 1024);
  BOOST_TEST(d.t.enc_layers == 12);
  BOOST_TEST(d.t.pad_id == 58100);
  BOOST_TEST(d.t.bos_id == 58100);
  BOOST_TEST((d.t.activation == nn::Activation::gelu));
  BOOST_TEST(!d.t.scale_embedding);
  BOOST_TEST(d.hf.forced_eos_id == 0);
  TempDir dir("marian");
  write_dir(dir, marian_config(), marian_tensors());
  train::save_json(dir / "generation_config.json",
                   {{"num_beams", 6}, {"max_length", 40}, {"forced_eos_token_id", nullptr}});
  const HfMarian m = load_hf_marian(dir.path.string());
  BOOST_TEST(m.hf.num_beams == 6);
  BOOST_TEST(m.hf.max_length == 40);
  BOOST_TEST(m.hf.forced_eos_id == -1);
  train::save_json(dir / "generation_config.json", {{"max_length", 1}});
  check_load_refused(dir, "generation_config.json: field \"max_length\" must be >= 2, got 1");
}

BOOST_AUTO_TEST_SUITE_END()

// ---------------------------------------------------------------------------------------------
// Decoding: banned tokens, forced eos, Hugging Face's beam scoring.

namespace {

// Next-token log-probabilities by the last token (V 4: eos 0, start 3); stateless.
class TableStep : public DecodeStep {
 public:
  Tensor next_logits(const Sequences& prefix) override {
    std::vector<double> v;
    for (const auto& p : prefix) {
      const int64_t last = p.back();
      const std::vector<double> row = last == 3 ? std::vector<double>{0.5, 0.3, 0.2, 1e-12}
                                                : std::vector<double>{0.9, 0.05, 0.05, 1e-12};
      for (double x : row) v.push_back(std::log(x));
    }
    return from_vector(v, {(int64_t)prefix.size(), 4}, DType::f64);
  }
  void select(const std::vector<int64_t>&) override {}
};

// Logits of V 50 by a row's last token and length, well apart (steps of 1/1000 from a hash), in
// `dt`: float32 takes decoding's float32 masking of banned ids and the forced eos, float64 its
// float64 rules; stateless.
class HashStep : public DecodeStep {
 public:
  explicit HashStep(DType dt) : dt_(dt) {}
  Tensor next_logits(const Sequences& prefix) override {
    std::vector<double> v;
    for (const auto& p : prefix)
      for (uint64_t k = 0; k < 50; ++k)
        v.push_back(double((k * 2654435761u + p.back() * 40503u + p.size() * 9973u) % 10007) /
                    1000.0);
    return from_vector(v, {(int64_t)prefix.size(), 50}, dt_);
  }
  void select(const std::vector<int64_t>&) override {}

 private:
  DType dt_;
};

}  // namespace

BOOST_AUTO_TEST_SUITE(hf_decoding)

// Banned ids and the forced eos on float32 logits (masked in float32) choose what they choose
// on the same logits in float64 (the float64 rules), greedy and HF beam search.
BOOST_AUTO_TEST_CASE(float32_masks_match_float64_rules) {
  DecodeOptions o;
  o.max_len = 7;
  o.banned_ids = {3, 17, 41};
  o.forced_eos_id = 0;
  o.stop_at_eos = false;
  HashStep f32(DType::f32), f64(DType::f64);
  const Sequences start{{1}, {2}, {5}};
  const Sequences greedy = greedy_search(f32, start, 0, o);
  BOOST_TEST((greedy == greedy_search(f64, start, 0, o)));
  for (const auto& row : greedy) {
    BOOST_TEST(row.size() == 7u);
    BOOST_TEST(row.back() == 0);
    for (int64_t id : row) BOOST_TEST((id != 3 && id != 17 && id != 41));
  }
  o.stop_at_eos = true, o.beam = 3, o.hf_beam = true;
  BOOST_TEST((beam_search(f32, start, 0, o) == beam_search(f64, start, 0, o)));
  o.hf_beam = false;
  BOOST_TEST((beam_search(f32, start, 0, o) == beam_search(f64, start, 0, o)));
}

// After the start, eos (0.5) beats "1" (0.3); "1 eos" scores log(0.3 * 0.9) = -1.309. Hugging
// Face finalizes both (each among the 2 best candidates of its step) and divides by the
// generated length: -0.693 / 1 < -1.309 / 2, so "1" wins; graft's GNMT penalty
// ((5 + len) / 6) keeps the empty translation (-0.693 / (5/6) > -1.309).
BOOST_AUTO_TEST_CASE(hf_beam_scores_by_generated_length) {
  DecodeOptions o;
  o.beam = 2, o.max_len = 5;
  TableStep step;
  BOOST_TEST((beam_search(step, {{3}}, 0, o) == Sequences{{}}));
  o.hf_beam = true;
  BOOST_TEST((beam_search(step, {{3}}, 0, o) == Sequences{{1}}));
}

// Banned ids are never chosen; the forced eos ends every row at max_len.
BOOST_AUTO_TEST_CASE(banned_ids_and_forced_eos) {
  DecodeOptions o;
  o.max_len = 3;
  o.stop_at_eos = false;
  TableStep step;
  BOOST_TEST((greedy_search(step, {{3}}, 0, o) == Sequences{{0, 0, 0}}));
  o.banned_ids = {0};
  BOOST_TEST((greedy_search(step, {{3}}, 0, o) == Sequences{{1, 1, 1}}));
  o.forced_eos_id = 0;
  BOOST_TEST((greedy_search(step, {{3}}, 0, o) == Sequences{{1, 1, 0}}));
  o.stop_at_eos = true;
  o.beam = 2, o.hf_beam = true;
  BOOST_TEST((beam_search(step, {{3}}, 0, o) == Sequences{{1, 1}}));
}

BOOST_AUTO_TEST_CASE(option_refusals) {
  const auto refused = [](const DecodeOptions& o, const std::string& part) {
    TableStep step;
    BOOST_CHECK_EXCEPTION(decode(step, {{3}}, 0, o), Error,
                          [&](const Error& e) { return names(e, part); });
  };
  DecodeOptions o;
  o.banned_ids = {-1};
  refused(o, "decode: banned_ids holds -1, not a token id");
  o.banned_ids = {4};
  refused(o, "decode: banned id 4 is outside the vocabulary [0, 4)");
  o.banned_ids = {};
  o.forced_eos_id = 4;
  refused(o, "decode: forced_eos_id 4 is outside the vocabulary [0, 4)");
  o.forced_eos_id = -2;
  refused(o, "decode: forced_eos_id must be a token id or -1 (off), got -2");
  o.forced_eos_id = -1;
  o.length_penalty = std::nan("");
  refused(o, "decode: length_penalty must be a finite number");
}

BOOST_AUTO_TEST_SUITE_END()

// ---------------------------------------------------------------------------------------------
// text::MarianTokenizer on a SentencePiece model trained here.

namespace {

// source.spm = target.spm trained on a few sentences; vocab.json: </s> 0, <unk> 1, every piece of
// the model but "dog" (read as <unk>), <pad> last.
void write_tokenizer(const TempDir& dir, nlohmann::json* vocab_out = nullptr) {
  const std::vector<std::string> lines = {"the cat sees the dog", "a dog sees a cat",
                                          "the bird sings", "cats and dogs and birds"};
  text::Tokenizer::train(lines, dir / "spm", 30);
  std::filesystem::copy_file(dir / "spm.model", dir / "source.spm");
  std::filesystem::copy_file(dir / "spm.model", dir / "target.spm");
  const text::Tokenizer sp(dir / "spm.model");
  nlohmann::json v = {{"</s>", 0}, {"<unk>", 1}};
  for (int i = 4; i < sp.vocab_size(); ++i)
    if (sp.piece(i) !=
        "\xe2\x96\x81"
        "dog")
      v[sp.piece(i)] = (int)v.size();
  v["<pad>"] = (int)v.size();
  v[">>de<<"] = (int)v.size();
  train::save_json(dir / "vocab.json", v);
  if (vocab_out) *vocab_out = v;
}

void check_tokenizer_refused(const TempDir& dir, const std::string& part) {
  BOOST_CHECK_EXCEPTION(text::MarianTokenizer{dir.path.string()}, Error,
                        [&](const Error& e) { return names(e, part); });
}

}  // namespace

BOOST_AUTO_TEST_SUITE(marian_tokenizer)

BOOST_AUTO_TEST_CASE(encodes_through_vocab_json_and_decodes) {
  TempDir dir("marian_tok");
  nlohmann::json v;
  write_tokenizer(dir, &v);
  const text::MarianTokenizer tok(dir.path.string());
  BOOST_TEST(tok.eos_id() == 0);
  BOOST_TEST(tok.unk_id() == 1);
  BOOST_TEST(tok.pad_id() == v["<pad>"].get<int64_t>());
  const std::vector<int64_t> ids = tok.encode("the cat");
  BOOST_TEST(ids.back() == 0);  // </s> appended
  BOOST_TEST(tok.decode(ids) == "the cat");
  const std::vector<int64_t> code = tok.encode(">>de<< the cat");
  BOOST_TEST(code.front() == v[">>de<<"].get<int64_t>());
  BOOST_TEST((std::vector<int64_t>(code.begin() + 1, code.end()) == ids));
  // A piece without an id is <unk>, which decode drops with </s> and <pad>.
  const std::vector<int64_t> dog = tok.encode("the dog");
  BOOST_TEST((std::find(dog.begin(), dog.end(), 1) != dog.end()));
  std::vector<int64_t> padded = {tok.pad_id(), tok.unk_id()};
  padded.insert(padded.end(), ids.begin(), ids.end());
  BOOST_TEST(tok.decode(padded) == "the cat");
  BOOST_CHECK_EXCEPTION(tok.decode({tok.vocab_size()}), Error,
                        [](const Error& e) { return names(e, "MarianTokenizer::decode: id"); });
}

BOOST_AUTO_TEST_CASE(refusals_name_the_file) {
  TempDir dir("marian_tok");
  write_tokenizer(dir);
  train::save_json(dir / "vocab.json", {{"</s>", 0}, {"<unk>", 1}});
  check_tokenizer_refused(dir, "vocab.json' has no <pad> token");
  train::save_json(dir / "vocab.json", {{"</s>", 0}, {"<unk>", 0}, {"<pad>", 2}});
  check_tokenizer_refused(dir, "id 0 is given to");
  train::save_json(dir / "vocab.json", {{"</s>", -1}});
  check_tokenizer_refused(dir, "the id of piece '</s>' is not an integer in [0, 2^31)");
  train::save_json(dir / "vocab.json", nlohmann::json::array());
  check_tokenizer_refused(dir, "vocab.json' is not a JSON object");
  train::save_json(dir / "tokenizer_config.json", {{"separate_vocabs", true}});
  check_tokenizer_refused(dir, "separate_vocabs is true");
  std::filesystem::remove(dir / "tokenizer_config.json");
  std::filesystem::remove(dir / "target.spm");
  check_tokenizer_refused(dir, "MarianTokenizer: cannot load model");
}

BOOST_AUTO_TEST_SUITE_END()
