// The decoding module: sampling distributions computed by hand (temperature, top-k, nucleus),
// a chi-square check of the sampler's frequencies, sampling's limits equal to greedy, seeds,
// option errors; and sampling through the Transformer (same seed and any thread count: same
// tokens).
#include <omp.h>

#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>

#include "graft/models/decoder_only_lm.h"
#include "graft/models/decoding.h"
#include "graft/models/transformer.h"
#include "graft/ops/ops.h"
#include "tests/test_util.h"

using namespace graft;
using graft::testing::names;
using namespace graft::models;

namespace {

std::vector<double> logs(const std::vector<double>& p) {
  std::vector<double> l;
  for (double x : p) l.push_back(std::log(x));
  return l;
}

bool close(const std::vector<double>& a, const std::vector<double>& b, double tol = 1e-12) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::fabs(a[i] - b[i]) > tol) return false;
  return true;
}

// Logits that depend on the row's last token: a deterministic toy "model", V = 9, EOS = 8.
class FakeStep : public DecodeStep {
 public:
  Tensor next_logits(const std::vector<std::vector<int64_t>>& prefix) override {
    std::vector<double> l;
    for (auto& p : prefix)
      for (int64_t v = 0; v < 9; ++v)
        l.push_back(v == 8 ? -1.0
                           : 2.0 * std::sin(1.3 * (double)v + 0.7 * (double)p.back() +
                                            0.1 * (double)p.size()));
    return from_vector(l, {(int64_t)prefix.size(), 9});
  }
  void select(const std::vector<int64_t>&) override {}
};

// FakeStep's logits with token 3 NaN in every row: a broken model.
class NanStep : public FakeStep {
 public:
  Tensor next_logits(const std::vector<std::vector<int64_t>>& prefix) override {
    std::vector<double> l = FakeStep::next_logits(prefix).to_vector<double>();
    for (size_t r = 0; r < prefix.size(); ++r) l[r * 9 + 3] = std::nan("");
    return from_vector(l, {(int64_t)prefix.size(), 9});
  }
};

// The same logits at every step (any dtype or layout): greedy's first pick of each row is their
// argmax.
class TableStep : public DecodeStep {
 public:
  explicit TableStep(Tensor logits) : logits_(std::move(logits)) {}
  Tensor next_logits(const std::vector<std::vector<int64_t>>&) override { return logits_; }
  void select(const std::vector<int64_t>&) override {}

 private:
  Tensor logits_;
};

// Greedy's first token of each of the table's rows.
std::vector<int64_t> greedy_first(const Tensor& logits) {
  TableStep step(logits);
  DecodeOptions o;
  o.max_len = 1;
  o.stop_at_eos = false;
  std::vector<int64_t> first;
  for (auto& r : greedy_search(step, Sequences(logits.size(0), {0}), -1, o))
    first.push_back(r.at(0));
  return first;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(decoding)

BOOST_AUTO_TEST_CASE(nucleus_keeps_exactly_the_smallest_set_reaching_p) {
  const std::vector<double> l = logs({0.5, 0.3, 0.1, 0.06, 0.04});
  SamplingOptions o;
  o.top_p = 0.75;  // 0.5 < 0.75 <= 0.8
  BOOST_TEST(close(sampling_distribution(l, o), {0.625, 0.375, 0, 0, 0}));
  o.top_p = 0.85;  // 0.8 < 0.85 <= 0.9
  BOOST_TEST(close(sampling_distribution(l, o), {0.5 / 0.9, 0.3 / 0.9, 0.1 / 0.9, 0, 0}));
  o.top_p = 0.5;  // the top token alone reaches it
  BOOST_TEST(close(sampling_distribution(l, o), {1, 0, 0, 0, 0}));
  o.top_p = 1.0;
  BOOST_TEST(close(sampling_distribution(l, o), {0.5, 0.3, 0.1, 0.06, 0.04}));
  // top-k first, then the nucleus of what is left: {0.5, 0.3, 0.1} / 0.9, p = 0.85 of that
  // is reached by 0.5 + 0.3 = 0.889.
  o.top_k = 3;
  o.top_p = 0.85;
  BOOST_TEST(close(sampling_distribution(l, o), {0.625, 0.375, 0, 0, 0}));
  // Unsorted input and a tie: ranks by logit, the lower id first.
  const std::vector<double> u = logs({0.1, 0.4, 0.1, 0.4});
  SamplingOptions k3;
  k3.top_k = 3;
  BOOST_TEST(close(sampling_distribution(u, k3), {1.0 / 9, 4.0 / 9, 0, 4.0 / 9}));
}

BOOST_AUTO_TEST_CASE(temperature_scales_the_logits) {
  const std::vector<double> l{1.0, 2.0, 0.5};
  SamplingOptions o;
  o.temperature = 0.5;
  std::vector<double> want{std::exp(2.0), std::exp(4.0), std::exp(1.0)};
  const double z = want[0] + want[1] + want[2];
  for (double& w : want) w /= z;
  BOOST_TEST(close(sampling_distribution(l, o), want));
}

// The sampler's frequencies against the distribution computed here independently: temperature
// softmax, cut to the top k, cut to the nucleus, renormalised. A wrong renormalisation or an
// off-by-one in the nucleus moves some expected count by far more than the bound allows.
BOOST_AUTO_TEST_CASE(sampled_frequencies_pass_chi_square) {
  const std::vector<double> l{0.3, 2.0, -1.0, 1.5, 0.9, 1.2, -0.4, 0.1};
  SamplingOptions o;
  o.temperature = 0.7;
  o.top_k = 6;
  o.top_p = 0.9;
  std::vector<int> order(8);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
  std::vector<double> p(8, 0.0);
  double z = 0;
  for (int r = 0; r < 6; ++r) z += p[order[r]] = std::exp(l[order[r]] / 0.7);
  double cum = 0;
  int keep = 0;
  while (cum < 0.9 * z) cum += p[order[keep++]];
  for (int r = keep; r < 8; ++r) p[order[r]] = 0;
  for (double& x : p) x /= cum;
  BOOST_TEST(keep == 4);  // the case exercises a real cut
  Generator g(123);
  const int N = 40000;
  std::vector<int> count(8, 0);
  for (int i = 0; i < N; ++i) ++count[sample_token(l, o, g)];
  double chi2 = 0;
  for (int v = 0; v < 8; ++v) {
    if (p[v] == 0) {
      BOOST_TEST(count[v] == 0, "token " << v << " is outside the set");
      continue;
    }
    chi2 += std::pow(count[v] - N * p[v], 2) / (N * p[v]);
  }
  BOOST_TEST(chi2 < 21.1);  // 3 degrees of freedom: P(chi2 > 21.1) < 1e-4
}

BOOST_AUTO_TEST_CASE(sampling_limits_equal_greedy_and_seeds_repeat) {
  DecodeOptions o;
  o.max_len = 20;
  o.stop_at_eos = false;
  FakeStep s;
  const Sequences greedy = greedy_search(s, Sequences(3, {0}), 8, o);
  o.sample = true;
  o.sampling.top_k = 1;
  BOOST_TEST(sample_search(s, Sequences(3, {0}), 8, o) == greedy);
  o.sampling.top_k = 0;
  o.sampling.temperature = 1e-3;
  BOOST_TEST(sample_search(s, Sequences(3, {0}), 8, o) == greedy);
  o.sampling.temperature = 1.0;
  o.seed = 11;
  const Sequences a = sample_search(s, Sequences(3, {0}), 8, o);
  BOOST_TEST(sample_search(s, Sequences(3, {0}), 8, o) == a);
  BOOST_TEST(decode(s, Sequences(3, {0}), 8, o) == a);
  o.seed = 12;
  BOOST_TEST(sample_search(s, Sequences(3, {0}), 8, o) != a);
  BOOST_TEST(a != greedy);
}

// Beam search over NaN log-probabilities names the cause instead of ranking them.
BOOST_AUTO_TEST_CASE(beam_search_refuses_nan_logits) {
  NanStep step;
  DecodeOptions o;
  o.beam = 3;
  o.max_len = 4;
  BOOST_CHECK_EXCEPTION(beam_search(step, {{1}, {2}}, 8, o), Error, [](const Error& e) {
    return std::string(e.what()).find("NaN") != std::string::npos;
  });
}

// So does greedy search (the argmax op would pick the NaN, as PyTorch's argmax does).
BOOST_AUTO_TEST_CASE(greedy_search_refuses_nan_logits) {
  NanStep step;
  DecodeOptions o;
  o.max_len = 4;
  BOOST_CHECK_EXCEPTION(greedy_search(step, {{1}, {2}}, 8, o), Error, [](const Error& e) {
    return std::string(e.what()).find("logit of token 3 (row 0) is NaN") != std::string::npos;
  });
}

// Greedy search reads the logits itself (one pass, no argmax/max op per step): it picks what the
// argmax op picks in every dtype and layout, ties to the lower token, an all -inf row token 0, and
// a NaN anywhere is refused naming the first NaN (the argmax op's pick).
BOOST_AUTO_TEST_CASE(greedy_picks_the_argmax_ops_token) {
  const double inf = std::numeric_limits<double>::infinity();
  const Tensor table = from_vector(std::vector<double>{1.0, 3.0, 3.0, 2.0,      //
                                                       -inf, -inf, -inf, -inf,  //
                                                       -0.0, 0.0, -1.0, 0.0,    //
                                                       0.5, -2.0, 7.25, 7.0},
                                   {4, 4}, DType::f64);
  const std::vector<int64_t> want = {1, 0, 0, 2};
  for (DType dt : {DType::f64, DType::f32, DType::bf16, DType::f16}) {
    const Tensor lg = to_dtype(table, dt);
    BOOST_TEST(argmax(lg, 1).to_vector<int64_t>() == want);
    BOOST_TEST(greedy_first(lg) == want);
    // a transposed view of the transposed table: the same logits, not contiguous
    const Tensor view = transpose(contiguous(transpose(lg, 0, 1)), 0, 1);
    BOOST_TEST(!view.is_contiguous());
    BOOST_TEST(greedy_first(view) == want);
  }
  // rows over the threads (more than kern::kParallelGrain logits), ties in row 5
  Generator gen(7);
  std::vector<double> big = randn({8, 8192}, DType::f64, gen).to_vector<double>();
  big[5 * 8192 + 100] = big[5 * 8192 + 4000] = 10.0;
  const Tensor wide = from_vector(big, {8, 8192}, DType::f64);
  for (DType dt : {DType::f64, DType::f32, DType::bf16, DType::f16}) {
    const std::vector<int64_t> ref = argmax(to_dtype(wide, dt), 1).to_vector<int64_t>();
    BOOST_TEST(ref[5] == 100);
    BOOST_TEST(greedy_first(to_dtype(wide, dt)) == ref);
  }
  // 16-bit logits are read as they are: no (8, 8192) float32 copy of them per step
  for (DType dt : {DType::bf16, DType::f16}) {
    const Tensor lg = to_dtype(wide, dt);
    const size_t before = Storage::live_bytes();
    Storage::reset_peak_live_bytes();
    greedy_first(lg);
    BOOST_TEST(Storage::peak_live_bytes() - before < lg.numel() * sizeof(float) / 2);
  }
  std::vector<double> v = table.to_vector<double>();
  v[1 * 4 + 2] = std::nan("");  // row 1: NaN at token 2, after -inf
  v[1 * 4 + 3] = std::nan("");
  for (DType dt : {DType::f64, DType::f32, DType::bf16, DType::f16}) {
    const Tensor lg = to_dtype(from_vector(v, {4, 4}, DType::f64), dt);
    BOOST_TEST(argmax(lg, 1).to_vector<int64_t>()[1] == 2);
    BOOST_CHECK_EXCEPTION(greedy_first(lg), Error, [](const Error& e) {
      return names(e, "logit of token 2 (row 1) is NaN");
    });
  }
}

// Beam search ranks each row's tokens skipping chunks of 16 that cannot enter its K best: over a
// wide table whose maxima tie across chunks (and sit late in the row), one step of a beam of
// 1 to 4 picks the argmax op's token (ties to the lower token), with and without Hugging Face's
// scoring.
BOOST_AUTO_TEST_CASE(beam_first_pick_is_the_argmax_over_wide_rows) {
  Generator gen(11);
  std::vector<double> v = randn({6, 1000}, DType::f64, gen).to_vector<double>();
  v[1 * 1000 + 999] = 9.0;                                          // the last token
  v[2 * 1000 + 17] = v[2 * 1000 + 40] = 9.0;                        // a tie across chunks
  v[3 * 1000 + 500] = v[3 * 1000 + 501] = 9.0;                      // a tie inside a chunk
  for (int64_t t = 0; t < 1000; ++t) v[4 * 1000 + t] = -(double)t;  // descending: all skipped
  for (int64_t t = 0; t < 1000; ++t) v[5 * 1000 + t] = (double)t;   // ascending: none skipped
  const Tensor table = from_vector(v, {6, 1000}, DType::f64);
  for (DType dt : {DType::f64, DType::f32}) {
    const Tensor lg = to_dtype(table, dt);
    const std::vector<int64_t> want = argmax(lg, 1).to_vector<int64_t>();
    for (int64_t beam = 1; beam <= 4; ++beam)
      for (bool hf : {false, true}) {
        DecodeOptions o;
        o.beam = beam, o.max_len = 1, o.hf_beam = hf;
        std::vector<int64_t> rows;  // each input's row for each of its beams
        for (int64_t r = 0; r < 6 * beam; ++r) rows.push_back(r / beam);
        TableStep step(index_select(lg, 0, from_vector(rows, {6 * beam}, DType::i64)));
        const Sequences got = beam_search(step, {{0}, {0}, {0}, {0}, {0}, {0}}, -1, o);
        for (size_t r = 0; r < 6; ++r) BOOST_TEST(got[r].back() == want[r]);
      }
  }
  // A step whose logits have another number of rows than sequences is refused, not read past.
  DecodeOptions o;
  o.max_len = 1;
  for (int64_t beam : {1, 3}) {
    o.beam = beam;
    TableStep step(table);
    BOOST_CHECK_EXCEPTION(beam_search(step, {{0}, {0}, {0}}, -1, o), Error, [&](const Error& e) {
      return names(e, "one row for each of the " + std::to_string(3 * beam) + " sequences") &&
             names(e, "(6, 1000)");
    });
  }
}

// And sampling: all-NaN logits once drew token 0; one NaN or +inf logit is refused too.
BOOST_AUTO_TEST_CASE(sampling_refuses_nan_logits) {
  SamplingOptions so;
  Generator gen(1);
  BOOST_CHECK_EXCEPTION(
      sample_token(std::vector<double>(5, std::nan("")), so, gen), Error,
      [](const Error& e) { return names(e, "sample_token: the model's logit of token 0 is NaN"); });
  BOOST_CHECK_EXCEPTION(sample_token({0.5, 1.0, INFINITY}, so, gen), Error,
                        [](const Error& e) { return names(e, "logit of token 2 is +inf"); });
  BOOST_TEST(sample_token({-INFINITY, 1.0, -INFINITY}, so, gen) == 1);  // -inf: a masked token
  NanStep step;
  DecodeOptions o;
  o.sample = true, o.max_len = 4;
  BOOST_CHECK_EXCEPTION(sample_search(step, {{1}, {2}}, 8, o), Error,
                        [](const Error& e) { return names(e, "logit of token 3 is NaN"); });
}

BOOST_AUTO_TEST_CASE(bad_options_name_the_option) {
  FakeStep s;
  auto fails = [&](auto set, const std::string& part) {
    DecodeOptions o;
    o.sample = true;
    set(o);
    BOOST_CHECK_EXCEPTION(decode(s, Sequences(1, {0}), 8, o), Error,
                          [&](const Error& e) { return names(e, part); });
  };
  fails([](DecodeOptions& o) { o.sampling.temperature = 0; },
        "temperature must be a finite number > 0, got 0");
  fails([](DecodeOptions& o) { o.sampling.temperature = -1; }, "temperature");
  fails([](DecodeOptions& o) { o.sampling.temperature = NAN; }, "temperature");
  fails([](DecodeOptions& o) { o.sampling.top_p = 0; }, "top_p must be in (0, 1]");
  fails([](DecodeOptions& o) { o.sampling.top_p = 1.5; }, "top_p must be in (0, 1]");
  fails([](DecodeOptions& o) { o.sampling.top_k = -1; }, "top_k must be >= 0");
  fails([](DecodeOptions& o) { o.beam = 0; }, "beam must be >= 1");
  fails([](DecodeOptions& o) { o.beam = 4; }, "beam must be 1");
  fails([](DecodeOptions& o) { o.max_len = 0; }, "max_len must be >= 1");
  // The public sampling_distribution checks its options itself (temperature 0 would divide by 0).
  SamplingOptions so;
  so.temperature = 0;
  BOOST_CHECK_EXCEPTION(sampling_distribution({1.0, 2.0}, so), Error, [](const Error& e) {
    return names(e, "sampling_distribution: temperature must be a finite number > 0, got 0");
  });
  so.temperature = 1, so.top_p = 0;
  BOOST_CHECK_EXCEPTION(sampling_distribution({1.0, 2.0}, so), Error, [](const Error& e) {
    return names(e, "sampling_distribution: top_p must be in (0, 1]");
  });
}

BOOST_AUTO_TEST_CASE(transformer_sampling_repeats_for_any_thread_count) {
  TransformerConfig c;
  c.vocab = 23;
  c.d_model = 16;
  c.heads = 2;
  c.d_ff = 24;
  c.enc_layers = c.dec_layers = 1;
  c.max_len = 32;
  c.dropout = 0.0;
  c.positions.kind = nn::Positions::rope;
  Transformer m(c);
  m.eval();
  Tensor src = from_vector(std::vector<int64_t>{5, 6, 7, 8, 3, 9, 10, 3, 0, 0}, {2, 5}, DType::i64);
  DecodeOptions o;
  o.max_len = 15;
  o.stop_at_eos = false;
  o.sample = true;
  o.sampling.top_p = 0.95;
  o.seed = 3;
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const Sequences one = translate(m, src, o);
  omp_set_num_threads(std::max(2, threads));
  BOOST_TEST(translate(m, src, o) == one);
  omp_set_num_threads(threads);
  o.use_cache = false;
  BOOST_TEST(translate(m, src, o) == one);
}

// The Llama-style LM (rope, RMSNorm, SwiGLU, 2 KV heads for 4 query heads, no biases, untied
// output): cached decoding (greedy, beam, sampled) gives what recomputing the prefix gives, the
// cache holds kv_heads heads, and each cached step's logits equal the full forward's.
BOOST_AUTO_TEST_CASE(llama_cached_decoding_equals_recomputation) {
  LMConfig c;
  c.vocab = 17, c.d_model = 16, c.heads = 4, c.kv_heads = 2, c.d_ff = 20, c.layers = 2,
  c.max_len = 32;
  c.positions.kind = nn::Positions::rope;
  c.rms_norm = true, c.activation = nn::Activation::swiglu, c.bias = false, c.tied_output = false;
  c.dropout = 0.1;  // generate runs in eval mode
  c.dtype = DType::f64;
  DecoderOnlyLM lm(c);
  BOOST_TEST(lm.output != nullptr);
  BOOST_TEST(!lm.blocks->layers[0]->self_attn->in_proj_bias.defined());
  const Sequences prompts{{1, 4, 5, 9}, {2, 7, 7, 3}};
  DecodeOptions o;
  o.max_len = 12;
  o.stop_at_eos = false;
  for (int mode = 0; mode < 3; ++mode) {
    o.beam = mode == 1 ? 3 : 1;
    o.sample = mode == 2;
    o.seed = 9;
    o.use_cache = true;
    const Sequences cached = generate(lm, prompts, -1, o);
    o.use_cache = false;
    BOOST_TEST(cached == generate(lm, prompts, -1, o), "mode " << mode);
    BOOST_TEST(cached[0].size() == 12u);
  }
  autograd::NoGrad ng;
  lm.eval();
  const std::vector<int64_t> seq{1, 4, 5, 9, 11, 2, 7, 7, 3, 12};  // (2, 5)
  const Tensor whole = lm.forward(from_vector(seq, {2, 5}, DType::i64));
  std::vector<nn::KVCache> caches;
  for (int64_t t = 0; t < 5; ++t) {
    const Tensor x =
        lm.embed(from_vector(std::vector<int64_t>{seq[t], seq[5 + t]}, {2, 1}, DType::i64), t);
    const Tensor step = lm.logits(lm.blocks->forward_step(x, caches, 8));
    graft::testing::check_same(step, slice(whole, 1, t, t + 1), 1e-10);
  }
  BOOST_TEST(caches[0].k.shape() == (Shape{2, 2, 8, 4}));  // (B, kv_heads, capacity, Dh)
}

// One fixed logits row: positive, negative and zero logits (V = 5).
const std::vector<double> kRow = {2.0, -1.0, 0.5, 1.9, 0.0};

BOOST_AUTO_TEST_CASE(repetition_penalty_matches_a_hand_computation) {
  std::vector<double> s = kRow;
  apply_repetition_penalty(s, {1, 3, 3, 1, 4, 9, -2}, 2.0);  // 1 and 3 twice: penalised once
  BOOST_TEST(close(s, {2.0, -2.0, 0.5, 0.95, 0.0}));
  // Greedy: token 0 wins without a penalty; with token 0 in the prompt, 2.0 / 2 < 1.9.
  TableStep plain(from_vector(kRow, {1, 5}));
  DecodeOptions o;
  o.max_len = 1;
  BOOST_TEST(greedy_search(plain, {{2}}, -1, o)[0] == std::vector<int64_t>{0});
  o.repetition_penalty = 2.0;
  BOOST_TEST(greedy_search(plain, {{0}}, -1, o)[0] == std::vector<int64_t>{3});
  // Sampling draws from softmax(penalised row): the same draw as sample_token on it by hand.
  o.sample = true, o.seed = 5;
  std::vector<double> pen = kRow;
  apply_repetition_penalty(pen, {0, 1}, 2.0);
  BOOST_TEST(close(pen, {1.0, -2.0, 0.5, 1.9, 0.0}));
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    o.seed = seed;
    Generator gen(seed);
    BOOST_TEST(sample_search(plain, {{0, 1}}, -1, o)[0][0] == sample_token(pen, o.sampling, gen));
  }
}

BOOST_AUTO_TEST_CASE(stop_ids_end_a_row_at_any_of_them) {
  FakeStep s;
  DecodeOptions o;
  o.max_len = 12;
  o.stop_at_eos = false;
  const std::vector<int64_t> all = greedy_search(s, {{1}}, -1, o)[0];
  o.stop_at_eos = true;
  // The second of two stop ids (the first never chosen) cuts the row at its first occurrence.
  o.stop_ids = {all[4]};
  const auto cut = greedy_search(s, {{1}}, 8, o)[0];
  const auto at = std::find(all.begin(), all.end(), all[4]) - all.begin();
  BOOST_TEST(cut == std::vector<int64_t>(all.begin(), all.begin() + at));
  // min_new_tokens: the stop ids masked until then.
  o.min_new_tokens = at + 1;
  const auto longer = greedy_search(s, {{1}}, 8, o)[0];
  BOOST_TEST((int64_t)longer.size() >= at + 1);
  for (int64_t i = 0; i <= at; ++i) BOOST_TEST(longer[i] != all[4]);
}

BOOST_AUTO_TEST_CASE(streamed_tokens_equal_the_result) {
  FakeStep s;
  for (int mode = 0; mode < 3; ++mode) {
    DecodeOptions o;
    o.max_len = 10, o.sample = mode == 1, o.seed = 3, o.beam = mode == 2 ? 3 : 1;
    o.stop_at_eos = false;
    const Sequences free = decode(s, {{1}, {4}}, -1, o);
    o.stop_at_eos = true;
    o.stop_ids = {free[0][2]};  // row 0 chose it third: greedy stops there, streaming included
    Sequences streamed(2);
    const Sequences plain = decode(s, {{1}, {4}}, 8, o);
    if (mode == 0) BOOST_TEST(plain[0].size() < 3u);
    o.on_token = [&](int64_t token, int64_t row) { streamed[row].push_back(token); };
    BOOST_TEST(decode(s, {{1}, {4}}, 8, o) == plain);
    BOOST_TEST(streamed == plain);
  }
}

BOOST_AUTO_TEST_CASE(beam_search_applies_the_penalty_and_min_new_tokens) {
  FakeStep s;
  DecodeOptions o;
  o.max_len = 6, o.beam = 3, o.stop_at_eos = false;
  const auto repeats = [](std::vector<int64_t> r) {
    r.push_back(5);  // the prompt
    return std::set<int64_t>(r.begin(), r.end()).size() < r.size();
  };
  BOOST_TEST(repeats(beam_search(s, {{5}}, -1, o)[0]));  // without a penalty this one does
  // A huge penalty on log-probabilities (negative: multiplied) rules out every token seen.
  o.repetition_penalty = 1e6;
  const std::vector<int64_t> row = beam_search(s, {{5}}, -1, o)[0];
  BOOST_TEST(row.size() == 6u);
  std::set<int64_t> seen{5};
  for (int64_t t : row) BOOST_TEST(seen.insert(t).second, "token " << t << " repeated");
  // min_new_tokens: no stop id among the first tokens, whatever the beam prefers.
  o.repetition_penalty = 1.0;
  const std::vector<int64_t> free = beam_search(s, {{1}}, -1, o)[0];
  o.stop_at_eos = true, o.stop_ids = {free[0]}, o.min_new_tokens = 4;
  const std::vector<int64_t> held = beam_search(s, {{1}}, 8, o)[0];
  BOOST_TEST(held.size() >= 4u);
  for (size_t i = 0; i < 4 && i < held.size(); ++i) BOOST_TEST(held[i] != free[0]);
}

BOOST_AUTO_TEST_CASE(bad_generation_options_name_the_option) {
  FakeStep s;
  auto fails = [&](auto set, const std::string& part) {
    DecodeOptions o;
    set(o);
    BOOST_CHECK_EXCEPTION(decode(s, Sequences(1, {0}), 8, o), Error,
                          [&](const Error& e) { return names(e, part); });
  };
  fails([](DecodeOptions& o) { o.repetition_penalty = 0; }, "repetition_penalty must be");
  fails([](DecodeOptions& o) { o.repetition_penalty = -1; }, "repetition_penalty");
  fails([](DecodeOptions& o) { o.repetition_penalty = NAN; }, "repetition_penalty");
  fails([](DecodeOptions& o) { o.repetition_penalty = INFINITY; }, "repetition_penalty");
  fails([](DecodeOptions& o) { o.min_new_tokens = 65; }, "min_new_tokens must be in [0, max_len");
  fails([](DecodeOptions& o) { o.min_new_tokens = -1; }, "min_new_tokens");
  fails([](DecodeOptions& o) { o.stop_ids = {-3}; }, "stop_ids holds -3");
  fails([](DecodeOptions& o) { o.stop_ids = {9}; }, "stop id 9 is outside the vocabulary [0, 9)");
  fails([](DecodeOptions& o) { o.beam = 2, o.stop_ids = {9}; }, "stop id 9 is outside");
}

BOOST_AUTO_TEST_SUITE_END()
