// The Transformer's Marian options (plain silu FFN, the halves sinusoid layout, scale_embedding,
// final_logits_bias, no target pad masking) and Hugging Face Marian checkpoints
// (models/hf_marian.h): tiny directories written with graft's own safetensors writer, and every
// refusal naming its cause.
#include <boost/test/unit_test.hpp>
#include <cmath>

#include "graft/autograd/tape.h"
#include "graft/models/transformer.h"
#include "graft/nn/layers.h"
#include "graft/ops/ops.h"
#include "tests/test_util.h"

using namespace graft;
using namespace graft::models;
using graft::testing::names;

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
