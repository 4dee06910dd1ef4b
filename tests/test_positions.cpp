// Positional encodings: ALiBi slopes and T5 buckets against the papers' values, scores that
// depend only on i - j (rope, alibi, relative), sequences longer than max_len, cached decoding
// equal to recomputation for all five kinds, relative-bias gradients, checkpoint names,
// config round trips, and attention dropout in the layer.
#include <boost/test/unit_test.hpp>
#include <cmath>

#include "graft/autograd/gradcheck.h"
#include "graft/models/decoder_only_lm.h"
#include "graft/models/encoder_classifier.h"
#include "graft/models/transformer.h"
#include "graft/nn/positions.h"
#include "graft/ops/ops.h"
#include "tests/test_util.h"
#include "tests/tiny_models.h"

using namespace graft;
using graft::testing::ids;
using graft::testing::names;
using namespace graft::models;
using nn::Positions;

namespace {

const Positions kAll[] = {Positions::sinusoidal, Positions::learned, Positions::rope,
                          Positions::alibi, Positions::relative};

TransformerConfig cfg(Positions p, DType dt = DType::f32) {
  return graft::testing::tiny_transformer(/*max_len=*/16, /*seed=*/5, dt, p);
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  auto x = a.to_vector<double>(), y = b.to_vector<double>();
  BOOST_REQUIRE(x.size() == y.size());
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::fabs(x[i] - y[i]));
  return m;
}

// Self-attention of fixed q, k, v content with every position shifted by `shift`.
Tensor attend_shifted(const nn::AttentionPositions& pos, const Tensor& q, const Tensor& k,
                      const Tensor& v, int64_t shift, bool causal) {
  const int64_t T = q.size(2);
  AttentionOptions o;
  o.causal = causal;
  o.bias = pos.bias(shift, T, shift, T, q.dtype());
  return scaled_dot_product_attention(pos.rotate(q, shift), pos.rotate(k, shift), v, o).out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(positions)

BOOST_AUTO_TEST_CASE(alibi_slopes_follow_the_paper) {
  auto s8 = nn::alibi_slopes(8);
  for (int h = 0; h < 8; ++h) BOOST_TEST(s8[h] == std::pow(2.0, -(h + 1)));
  // 6 heads: the 4-head slopes, then every other slope of 8 heads (the paper's get_slopes).
  const std::vector<double> s6{0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125};
  BOOST_TEST(nn::alibi_slopes(6) == s6);
  BOOST_TEST(nn::alibi_slopes(1) == std::vector<double>{1.0 / 256});
}

BOOST_AUTO_TEST_CASE(relative_buckets_follow_t5) {
  using nn::relative_bucket;
  // Bidirectional, 32 buckets, max distance 128 (T5's defaults); relative = key - query.
  BOOST_TEST(relative_bucket(0, true, 32, 128) == 0);
  BOOST_TEST(relative_bucket(-1, true, 32, 128) == 1);
  BOOST_TEST(relative_bucket(1, true, 32, 128) == 17);
  BOOST_TEST(relative_bucket(-7, true, 32, 128) == 7);
  BOOST_TEST(relative_bucket(-8, true, 32, 128) == 8);
  BOOST_TEST(relative_bucket(-127, true, 32, 128) == 15);
  BOOST_TEST(relative_bucket(-100000, true, 32, 128) == 15);
  BOOST_TEST(relative_bucket(100000, true, 32, 128) == 31);
  // Unidirectional: future keys all share bucket 0, the past gets all 32.
  BOOST_TEST(relative_bucket(5, false, 32, 128) == 0);
  BOOST_TEST(relative_bucket(-15, false, 32, 128) == 15);
  BOOST_TEST(relative_bucket(-20, false, 32, 128) == 17);
  BOOST_TEST(relative_bucket(-1000, false, 32, 128) == 31);
}

// rope, alibi and relative: shifting every position by k leaves the attention output unchanged
// (the scores depend only on i - j), in both directions of attention.
BOOST_AUTO_TEST_CASE(scores_depend_only_on_relative_position) {
  Generator g(7);
  const int64_t H = 4, T = 6, Dh = 8;
  Tensor q = randn({2, H, T, Dh}, DType::f64, g), k = randn({2, H, T, Dh}, DType::f64, g),
         v = randn({2, H, T, Dh}, DType::f64, g);
  for (Positions p : {Positions::rope, Positions::alibi, Positions::relative})
    for (bool causal : {false, true}) {
      nn::PositionOptions po;
      po.kind = p;
      auto pos = nn::make_attention_positions(po, H, causal, DType::f64, g);
      const Tensor a = attend_shifted(*pos, q, k, v, 0, causal);
      const Tensor b = attend_shifted(*pos, q, k, v, 37, causal);
      BOOST_TEST(max_abs_diff(a, b) < 1e-9, nn::positions_name(p) << " causal " << causal);
      // ... and the positional term is not a no-op.
      AttentionOptions plain;
      plain.causal = causal;
      BOOST_TEST(max_abs_diff(a, scaled_dot_product_attention(q, k, v, plain).out) > 1e-3,
                 nn::positions_name(p) << " causal " << causal);
    }
}

// The causal ALiBi bias drops the per-row constant -m i: the same output as -m (i - j).
BOOST_AUTO_TEST_CASE(causal_alibi_equals_the_full_formula) {
  Generator g(8);
  const int64_t H = 3, T = 5;
  Tensor q = randn({1, H, T, 4}, DType::f64, g), k = randn({1, H, T, 4}, DType::f64, g),
         v = randn({1, H, T, 4}, DType::f64, g);
  nn::AlibiPositions alibi(H, true);
  std::vector<double> full(H * T * T);
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j < T; ++j)
        full[(h * T + i) * T + j] = -alibi.slopes[h] * (double)(i - j);
  AttentionOptions a, b;
  a.causal = b.causal = true;
  a.bias = alibi.bias(0, T, 0, T, DType::f64);
  b.bias = from_vector(full, {1, H, T, T});
  BOOST_TEST(a.bias.shape() == (Shape{1, H, 1, T}));  // not materialised per query
  BOOST_TEST(max_abs_diff(scaled_dot_product_attention(q, k, v, a).out,
                          scaled_dot_product_attention(q, k, v, b).out) < 1e-12);
}

BOOST_AUTO_TEST_CASE(longer_than_max_len_except_learned) {
  std::vector<int64_t> s(2 * 40, 5), t(2 * 40, 6);
  for (Positions p : kAll) {
    Transformer m(cfg(p));
    m.eval();
    autograd::NoGrad ng;
    if (p == Positions::learned) {
      BOOST_CHECK_EXCEPTION(m.forward(ids(s, 2), ids(t, 2)), Error,
                            [](const Error& e) { return names(e, "max_len 16"); });
      continue;
    }
    Tensor out = m.forward(ids(s, 2), ids(t, 2));
    BOOST_TEST(out.shape() == (Shape{2, 40, 23}));
    for (double x : out.to_vector<double>()) BOOST_REQUIRE(std::isfinite(x));
    DecodeOptions o;
    o.max_len = 30;  // past max_len too
    o.stop_at_eos = false;
    BOOST_TEST(translate(m, ids(s, 2), o)[0].size() == 30u, nn::positions_name(p));
  }
}

BOOST_AUTO_TEST_CASE(cached_decoding_equals_recomputation_for_every_kind) {
  for (Positions p : kAll) {
    Transformer m(cfg(p, DType::f64));
    m.eval();
    Tensor src = ids({5, 6, 7, 8, 3, 9, 10, 3, 0, 0}, 2);
    DecodeOptions o;
    o.max_len = 12;
    o.stop_at_eos = false;
    for (int beam : {1, 3}) {
      o.beam = beam;
      o.use_cache = true;
      auto cached = translate(m, src, o);
      o.use_cache = false;
      BOOST_TEST(cached == translate(m, src, o), nn::positions_name(p) << " beam " << beam);
    }
    // Logits: three cached steps against the full decoder.
    autograd::NoGrad ng;
    Tensor memory = m.encode(src);
    std::vector<nn::DecoderLayerCache> caches;
    const std::vector<int64_t> prefix{2, 11, 4, 2, 12, 7};  // (2, 3)
    Tensor whole = m.decode(memory, src, ids(prefix, 2));
    for (int64_t t = 0; t < 3; ++t) {
      Tensor h = m.decoder->forward_step(m.embed(ids({prefix[t], prefix[3 + t]}, 2), t), memory,
                                         m.pad_mask(src), caches, 4);
      BOOST_TEST(max_abs_diff(m.logits(h), slice(whole, 1, t, t + 1)) < 1e-10, nn::positions_name(p)
                                                                                   << " t " << t);
    }
  }
}

BOOST_AUTO_TEST_CASE(relative_bias_names_shapes_and_gradients) {
  TransformerConfig c = cfg(Positions::relative, DType::f64);
  c.vocab = 7;
  c.d_model = 4;
  c.d_ff = 6;
  c.enc_layers = c.dec_layers = 1;
  c.positions.relative_buckets = 8;
  c.positions.relative_max_distance = 12;
  Transformer m(c);
  int found = 0;
  for (auto& [name, t] : m.state_dict())
    if (name == "encoder.relative_attention_bias.weight" ||
        name == "decoder.relative_attention_bias.weight") {
      BOOST_TEST(t.shape() == (Shape{8, 2}));
      ++found;
    }
  BOOST_TEST(found == 2);
  // The whole model (relative tables included) passes the float64 gradcheck.
  Tensor src = ids({4, 5, 6, 3, 5, 3, 0, 0}, 2);
  Tensor tin = ids({2, 4, 6, 2, 5, 0}, 2);
  Tensor tout = from_vector(std::vector<int64_t>{4, 6, 3, 5, 3, 0}, {6}, DType::i64);
  auto loss = [&](const Tensors&) {
    return cross_entropy(reshape(m.forward(src, tin), {6, c.vocab}), tout, 0.1, 0);
  };
  GradcheckResult r = gradcheck(loss, m.parameters());
  BOOST_TEST(r.ok, r.message);
  sum(loss({})).backward();
  BOOST_TEST(m.encoder->positions->named_parameters()[0].second.grad().defined());
  // rope and alibi add no tensors: the same names as sinusoidal.
  auto names = [](const Transformer& t) {
    std::vector<std::string> n;
    for (auto& [name, x] : t.state_dict()) n.push_back(name);
    return n;
  };
  BOOST_TEST(names(Transformer(cfg(Positions::rope))) ==
             names(Transformer(cfg(Positions::sinusoidal))));
  BOOST_TEST(names(Transformer(cfg(Positions::alibi))) ==
             names(Transformer(cfg(Positions::sinusoidal))));
}

BOOST_AUTO_TEST_CASE(rope_and_alibi_models_pass_float64_gradcheck) {
  for (Positions p : {Positions::rope, Positions::alibi}) {
    TransformerConfig c = cfg(p, DType::f64);
    c.vocab = 7;
    c.d_model = 4;
    c.d_ff = 6;
    c.enc_layers = c.dec_layers = 1;
    Transformer m(c);
    Tensor src = ids({4, 5, 6, 3, 5, 3, 0, 0}, 2), tin = ids({2, 4, 6, 2, 5, 0}, 2);
    Tensor tout = from_vector(std::vector<int64_t>{4, 6, 3, 5, 3, 0}, {6}, DType::i64);
    GradcheckResult r = gradcheck(
        [&](const Tensors&) {
          // pad targets ignored: the pad embedding row gets no gradient by design
          return cross_entropy(reshape(m.forward(src, tin), {6, c.vocab}), tout, 0.0, 0);
        },
        m.parameters());
    BOOST_TEST(r.ok, nn::positions_name(p) << ": " << r.message);
  }
}

BOOST_AUTO_TEST_CASE(config_round_trip_and_errors) {
  for (Positions p : kAll) {
    TransformerConfig c = cfg(p);
    c.attention_dropout = 0.2;
    auto back = TransformerConfig::from_json(c.to_json());
    BOOST_TEST((back.positions.kind == p));
    BOOST_TEST(back.attention_dropout == 0.2);
  }
  auto j = cfg(Positions::sinusoidal).to_json();
  j.erase("positions");
  j["learned_pos"] = true;  // a config written before "positions"
  BOOST_TEST((TransformerConfig::from_json(j).positions.kind == Positions::learned));
  j["positions"] = "absolute";
  BOOST_CHECK_EXCEPTION(
      TransformerConfig::from_json(j, "run/config.json"), Error, [](const Error& e) {
        return names(e, "run/config.json: field \"positions\"") &&
               names(e, "unknown kind 'absolute'") && names(e, "rope, alibi, relative");
      });
  // Every field is named: a missing size, a wrong type, an id outside the vocabulary.
  auto bad = [&](const char* field, nlohmann::json v, const std::string& part) {
    auto k = cfg(Positions::rope).to_json();
    if (v.is_null()) k.erase(field);
    else k[field] = v;
    BOOST_CHECK_EXCEPTION(TransformerConfig::from_json(k, "c.json"), Error, [&](const Error& e) {
      return names(e, std::string("c.json: field \"") + field + "\" " + part);
    });
  };
  bad("d_model", nullptr, "is missing");
  bad("heads", "four", "must be an integer, got \"four\"");
  bad("heads", 2.5, "must be an integer, got 2.5");
  bad("seed", -1, "must be a non-negative integer, got -1");
  bad("norm_first", 1, "must be true or false, got 1");
  bad("enc_layers", -2, "must be in [1, 1024]");
  bad("eos_id", 99, "must be a token id in [0, vocab 23)");
  bad("dropout", 1.5, "must be in [0, 1]");
  bad("dtype", "int8", "must be float32, float64, bfloat16 or float16");
}

BOOST_AUTO_TEST_CASE(attention_dropout_in_training_only) {
  TransformerConfig c = cfg(Positions::rope);
  c.attention_dropout = 0.5;
  Transformer m(c);
  Tensor src = ids({5, 6, 7, 3}, 1), tin = ids({2, 9, 10}, 1);
  Tensor a = m.forward(src, tin), b = m.forward(src, tin);
  BOOST_TEST(max_abs_diff(a, b) > 1e-4);  // fresh masks each call
  sum(a).backward();
  BOOST_TEST(m.encoder->layers[0]->self_attn->in_proj_weight.grad().defined());
  m.eval();
  autograd::NoGrad ng;
  BOOST_TEST(max_abs_diff(m.forward(src, tin), m.forward(src, tin)) == 0.0);
  BOOST_CHECK_EXCEPTION(
      nn::MultiHeadAttention(8, 2, DType::f32, default_generator(), 1.5), Error,
      [](const Error& e) { return names(e, "attention dropout must be in [0, 1]"); });
}

// LM generation through the decoding module: cached equals recomputation (greedy and beam) for
// every kind, sampling repeats by seed, and the prompt's continuation is what forward predicts.
BOOST_AUTO_TEST_CASE(lm_cached_generation_equals_recomputation) {
  for (Positions p : kAll) {
    LMConfig lc;
    lc.vocab = 13;
    lc.d_model = 16;
    lc.heads = 2;
    lc.d_ff = 24;
    lc.max_len = 24;
    lc.dropout = 0.1;  // generate runs in eval mode
    lc.dtype = DType::f64;
    lc.positions.kind = p;
    DecoderOnlyLM lm(lc);
    const Sequences prompts{{1, 4, 5}, {2, 7, 7}};
    DecodeOptions o;
    o.max_len = 10;
    o.stop_at_eos = false;
    for (int beam : {1, 3}) {
      o.beam = beam;
      o.use_cache = true;
      auto cached = generate(lm, prompts, -1, o);
      o.use_cache = false;
      BOOST_TEST(cached == generate(lm, prompts, -1, o), nn::positions_name(p) << " beam " << beam);
      BOOST_TEST(cached[0].size() == 10u);
    }
    o.beam = 1;
    o.use_cache = true;
    auto greedy = generate(lm, prompts, -1, o);
    {
      autograd::NoGrad ng;
      lm.eval();
      auto lg = lm.forward(ids({1, 4, 5, 2, 7, 7}, 2));
      BOOST_TEST(argmax(slice(lg, 1, 2, 3), 2).to_vector<int64_t>()[0] == greedy[0][0]);
      lm.train();
    }
    o.sample = true;
    o.seed = 5;
    BOOST_TEST(generate(lm, prompts, -1, o) == generate(lm, prompts, -1, o));
    BOOST_TEST(lm.training());  // generate restores the mode
  }
  LMConfig lc;
  lc.max_len = 8;
  DecoderOnlyLM learned(lc);
  DecodeOptions o;
  o.max_len = 10;
  BOOST_CHECK_EXCEPTION(generate(learned, {{1, 2}}, -1, o), Error,
                        [](const Error& e) { return names(e, "max_len 8"); });
  BOOST_CHECK_EXCEPTION(generate(learned, {{1, 2}, {3}}, -1, o), Error,
                        [](const Error& e) { return names(e, "equal lengths"); });
  // More beams than tokens with no EOS: the empty beams never reach the model.
  LMConfig tiny;
  tiny.vocab = 3, tiny.d_model = 8, tiny.heads = 2, tiny.d_ff = 8, tiny.layers = 1,
  tiny.max_len = 16;
  tiny.positions.kind = Positions::alibi;
  DecoderOnlyLM small(tiny);
  o.max_len = 4;
  o.beam = 5;
  BOOST_TEST(generate(small, {{1}}, -1, o)[0].size() == 4u);
  // A stack built causal stays causal: causal is said once, in its constructor.
  BOOST_TEST(small.blocks->causal());
}

// Every kind in the other two models: the LM stays causal, the classifier ignores padding.
BOOST_AUTO_TEST_CASE(lm_and_classifier_take_every_kind) {
  for (Positions p : kAll) {
    LMConfig lc;
    lc.vocab = 11;
    lc.d_model = 16;
    lc.heads = 2;
    lc.d_ff = 24;
    lc.max_len = 16;
    lc.dropout = 0;
    lc.dtype = DType::f64;
    lc.positions.kind = p;
    DecoderOnlyLM lm(lc);
    autograd::NoGrad ng;
    std::vector<int64_t> seq{1, 4, 5, 6, 7, 8, 9, 10};
    Tensor a = lm.forward(ids(seq, 1));
    seq[5] = 2;
    Tensor b = lm.forward(ids(seq, 1));
    BOOST_TEST(max_abs_diff(slice(a, 1, 0, 5), slice(b, 1, 0, 5)) == 0.0, nn::positions_name(p));
    BOOST_TEST(max_abs_diff(slice(a, 1, 5, 6), slice(b, 1, 5, 6)) > 0.0, nn::positions_name(p));
    ClassifierConfig cc;
    cc.vocab = 9;
    cc.classes = 3;
    cc.d_model = 8;
    cc.heads = 2;
    cc.d_ff = 12;
    cc.max_len = 8;
    cc.dropout = 0;
    cc.dtype = DType::f64;
    cc.positions.kind = p;
    EncoderClassifier cl(cc);
    BOOST_TEST(
        max_abs_diff(cl.forward(ids({3, 4, 5}, 1)), cl.forward(ids({3, 4, 5, 0, 0}, 1))) < 1e-12,
        nn::positions_name(p));
  }
}

// Llama 3.1's rule by hand (factor 8, low 1, high 4, original 64): wavelengths above 64 are
// slowed 8x, below 16 kept, between blended by s = (64 / wavelength - 1) / 3.
BOOST_AUTO_TEST_CASE(scaled_rope_frequencies_follow_llama3_and_linear) {
  nn::PositionOptions o;
  o.kind = Positions::rope, o.rope_base = 500000.0;
  o.rope_scaling = nn::RopeScaling::llama3, o.rope_factor = 8;
  o.rope_low_freq_factor = 1, o.rope_high_freq_factor = 4, o.rope_original_max_len = 64;
  const std::vector<double> plain = rope_frequencies(16, 500000.0), f = rope_frequencies(o, 16);
  BOOST_REQUIRE(f.size() == 8u);
  int slowed = 0, kept = 0, blended = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    const double w = 2 * M_PI / plain[i];
    double want = plain[i];
    if (w > 64) want = plain[i] / 8, ++slowed;
    else if (w < 16) ++kept;
    else want = (1 - (64 / w - 1) / 3) * plain[i] / 8 + (64 / w - 1) / 3 * plain[i], ++blended;
    BOOST_TEST(f[i] == want, boost::test_tools::tolerance(1e-15));
  }
  BOOST_TEST((slowed > 0 && kept > 0 && blended > 0));
  o.rope_scaling = nn::RopeScaling::linear, o.rope_factor = 2;
  BOOST_TEST(rope_frequencies(o, 16)[3] == plain[3] / 2);
  // No scaling: the same rotation, bit for bit, as the base form.
  Generator gen(3);
  const Tensor x = randn({2, 4, 16}, DType::f32, gen);
  const Tensor pos = from_vector(std::vector<int64_t>{0, 5, 9, 70}, {4});
  BOOST_TEST(max_abs_diff(rope(x, pos, 500000.0), rope(x, pos, plain)) == 0.0);
  BOOST_TEST(max_abs_diff(nn::RotaryPositions(o).rotate(x, 3),
                          rope(x, from_vector(std::vector<int64_t>{3, 4, 5, 6}, {4}),
                               rope_frequencies(o, 16))) == 0.0);
  o.rope_high_freq_factor = 0.5;  // below low_freq_factor
  o.rope_scaling = nn::RopeScaling::llama3;
  BOOST_CHECK_EXCEPTION(rope_frequencies(o, 16), Error, [](const Error& e) {
    return names(e, "0 < low_freq_factor < high_freq_factor");
  });
}

BOOST_AUTO_TEST_CASE(rope_scaling_round_trips_through_the_config) {
  LMConfig c;
  c.positions.kind = Positions::rope;
  nlohmann::json plain = c.to_json();
  BOOST_TEST(plain.at("rope_scaling") == "none");
  c.positions.rope_scaling = nn::RopeScaling::llama3, c.positions.rope_factor = 8;
  c.positions.rope_original_max_len = 64;
  const LMConfig back = LMConfig::from_json(c.to_json());
  BOOST_TEST((back.positions.rope_scaling == nn::RopeScaling::llama3));
  BOOST_TEST(back.positions.rope_factor == 8.0);
  BOOST_TEST(back.positions.rope_original_max_len == 64);
  nlohmann::json bad = c.to_json();
  bad["rope_scaling"] = "yarn";
  BOOST_CHECK_EXCEPTION(LMConfig::from_json(bad), Error,
                        [](const Error& e) { return names(e, "field \"rope_scaling\""); });
  bad = c.to_json();
  bad["rope_factor"] = 0.5;
  BOOST_CHECK_EXCEPTION(LMConfig::from_json(bad), Error, [](const Error& e) {
    return names(e, "field \"rope_scaling\"") && names(e, "factor must be finite and >= 1");
  });
}

BOOST_AUTO_TEST_SUITE_END()
