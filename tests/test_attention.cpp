// scaled_dot_product_attention: forward values against hand-computed numbers, masking corner
// cases, float32 (oneDNN) vs float64 on head-split views, KVCache::append's errors.
#include <omp.h>

#include <boost/test/unit_test.hpp>
#include <cmath>

#include "graft/autograd/gradcheck.h"
#include "graft/autograd/tape.h"
#include "graft/nn/attention.h"
#include "graft/ops/attention.h"
#include "graft/ops/heads.h"
#include "graft/ops/matmul.h"
#include "graft/ops/reduce.h"
#include "graft/ops/shape.h"

using namespace graft;

namespace {

void check_close(const std::vector<double>& a, const std::vector<double>& b, double tol) {
  BOOST_REQUIRE_EQUAL(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    BOOST_TEST(std::fabs(a[i] - b[i]) <= tol, "at " << i << ": " << a[i] << " vs " << b[i]);
}

bool all_finite(const Tensor& t) {
  for (double v : t.to_vector<double>())
    if (!std::isfinite(v)) return false;
  return true;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(attention)

// q = [1, 0], keys e1 and e2, scale 1/sqrt(2): scores [1/sqrt2, 0].
BOOST_AUTO_TEST_CASE(hand_computed_two_keys) {
  for (DType dt : {DType::f32, DType::f64}) {
    Tensor q = from_vector(std::vector<double>{1, 0}, {1, 1, 1, 2});
    Tensor k = from_vector(std::vector<double>{1, 0, 0, 1}, {1, 1, 2, 2});
    Tensor v = from_vector(std::vector<double>{10, 1, -2, 3}, {1, 1, 2, 2});
    q = cast_copy(q, dt), k = cast_copy(k, dt), v = cast_copy(v, dt);
    AttentionOptions opt;
    opt.return_weights = true;
    auto r = scaled_dot_product_attention(q, k, v, opt);
    const double e = std::exp(1 / std::sqrt(2.0)), p0 = e / (e + 1), p1 = 1 / (e + 1);
    BOOST_TEST(r.out.shape() == (Shape{1, 1, 1, 2}));
    check_close(r.out.to_vector<double>(), {10 * p0 - 2 * p1, p0 + 3 * p1}, 1e-6);
    check_close(r.weights.to_vector<double>(), {p0, p1}, 1e-6);
  }
}

// With a single key every query returns that key's value, whatever the scores.
BOOST_AUTO_TEST_CASE(one_key_returns_its_value) {
  for (DType dt : {DType::f32, DType::f64}) {
    Generator g(3);
    Tensor q = randn({2, 3, 4, 5}, dt, g), k = randn({2, 3, 1, 5}, dt, g),
           v = randn({2, 3, 1, 6}, dt, g);
    auto out = scaled_dot_product_attention(q, k, v).out;
    BOOST_TEST(out.shape() == (Shape{2, 3, 4, 6}));
    auto o = out.to_vector<double>(), vv = v.to_vector<double>();
    for (int64_t bh = 0; bh < 6; ++bh)
      for (int64_t i = 0; i < 4; ++i)
        for (int64_t e = 0; e < 6; ++e)
          BOOST_TEST(std::fabs(o[(bh * 4 + i) * 6 + e] - vv[bh * 6 + e]) < 1e-6);
  }
}

// q = 0 gives uniform weights: out = mean of the values.
BOOST_AUTO_TEST_CASE(zero_query_averages_values) {
  Tensor q = zeros({1, 1, 2, 3}, DType::f64);
  Tensor k = rand({1, 1, 4, 3}, DType::f64);
  Tensor v = from_vector(std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8}, {1, 1, 4, 2});
  check_close(scaled_dot_product_attention(q, k, v).out.to_vector<double>(), {4, 5, 4, 5}, 1e-12);
}

// Causal with Tq == Tk: the first query sees only key 0; with Tq < Tk the mask is aligned to the
// end (query i sees keys j <= i + Tk - Tq).
BOOST_AUTO_TEST_CASE(causal_masks) {
  for (DType dt : {DType::f32, DType::f64}) {
    Generator g(5);
    Tensor q = randn({1, 2, 3, 4}, dt, g), k = randn({1, 2, 3, 4}, dt, g),
           v = randn({1, 2, 3, 2}, dt, g);
    AttentionOptions opt;
    opt.causal = true;
    opt.return_weights = true;
    auto r = scaled_dot_product_attention(q, k, v, opt);
    auto w = r.weights.to_vector<double>();
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < 3; ++i) {
        double s = 0;
        for (int64_t j = 0; j < 3; ++j) {
          const double p = w[(h * 3 + i) * 3 + j];
          if (j > i) BOOST_TEST(p == 0.0);
          s += p;
        }
        BOOST_TEST(std::fabs(s - 1) < 1e-6);
      }
    auto o = r.out.to_vector<double>(), vv = v.to_vector<double>();
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t e = 0; e < 2; ++e) BOOST_TEST(std::fabs(o[h * 6 + e] - vv[h * 6 + e]) < 1e-6);

    // Tq = 2, Tk = 3: query 0 sees keys 0, 1; query 1 sees all three.
    Tensor q2 = randn({1, 1, 2, 4}, dt, g), k2 = randn({1, 1, 3, 4}, dt, g),
           v2 = randn({1, 1, 3, 2}, dt, g);
    auto w2 = scaled_dot_product_attention(q2, k2, v2, opt).weights.to_vector<double>();
    BOOST_TEST(w2[2] == 0.0);
    BOOST_TEST(w2[0] > 0.0);
    BOOST_TEST(w2[1] > 0.0);
    for (int j = 3; j < 6; ++j) BOOST_TEST(w2[j] > 0.0);
  }
}

// A batch row whose keys are all padding gives zero output and zero gradients (no NaN).
BOOST_AUTO_TEST_CASE(fully_masked_row_is_zero) {
  for (DType dt : {DType::f32, DType::f64}) {
    Generator g(9);
    Tensor q = randn({2, 2, 3, 4}, dt, g).requires_grad_(),
           k = randn({2, 2, 3, 4}, dt, g).requires_grad_(),
           v = randn({2, 2, 3, 2}, dt, g).requires_grad_();
    AttentionOptions opt;
    opt.key_padding_mask = from_vector(std::vector<double>{0, 1, 0, 1, 1, 1}, {2, 3});
    opt.return_weights = true;
    auto r = scaled_dot_product_attention(q, k, v, opt);
    BOOST_TEST(!r.weights.requires_grad());
    BOOST_TEST(r.out.requires_grad());
    auto o = r.out.to_vector<double>(), w = r.weights.to_vector<double>();
    for (size_t i = 12; i < 24; ++i) BOOST_TEST(o[i] == 0.0);  // batch 1: 2 heads x 3 queries x 2
    for (size_t i = 18; i < 36; ++i) BOOST_TEST(w[i] == 0.0);
    for (size_t i = 0; i < 18; ++i)
      if (i % 3 == 1) BOOST_TEST(w[i] == 0.0);  // key 1 is padding in batch 0
    r.out.backward(ones(r.out.shape(), dt));
    for (const Tensor* t : {&q, &k, &v}) {
      BOOST_TEST(all_finite(t->grad()));
      auto gv = t->grad().to_vector<double>();
      for (size_t i = gv.size() / 2; i < gv.size(); ++i) BOOST_TEST(gv[i] == 0.0);
    }
    auto gv = v.grad().to_vector<double>();  // padded key 1 of batch 0 gets no value gradient
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t e = 0; e < 2; ++e) BOOST_TEST(gv[(h * 3 + 1) * 2 + e] == 0.0);
  }
}

// A -inf bias row behaves like a fully masked row.
BOOST_AUTO_TEST_CASE(minus_inf_bias_row_is_zero) {
  Tensor q = rand({1, 1, 2, 2}, DType::f64), k = rand({1, 1, 2, 2}, DType::f64),
         v = rand({1, 1, 2, 2}, DType::f64);
  AttentionOptions opt;
  const double ninf = -std::numeric_limits<double>::infinity();
  opt.bias = from_vector(std::vector<double>{0, 0, ninf, ninf}, {2, 2});
  auto o = scaled_dot_product_attention(q, k, v, opt).out.to_vector<double>();
  BOOST_TEST(o[2] == 0.0);
  BOOST_TEST(o[3] == 0.0);
  BOOST_TEST(std::isfinite(o[0]));
}

// float32 through oneDNN on (B, T, H, D) projections split into heads by permute views (no
// copies), with bias and causal mask, matches the float64 reference in values and gradients.
BOOST_AUTO_TEST_CASE(float32_matches_float64_on_head_split_views) {
  const int64_t B = 2, T = 37, H = 3, D = 8;
  Generator g(21);
  Tensor base64[3];
  for (auto& t : base64) t = randn({B, T, H, D}, DType::f64, g);
  Tensor bias64 = randn({H, T, T}, DType::f64, g);
  Tensor dout64 = randn({B, H, T, D}, DType::f64, g);
  std::vector<std::vector<double>> outs, grads;
  for (DType dt : {DType::f32, DType::f64}) {
    Tensors leaves;
    for (auto& t : base64) leaves.push_back(cast_copy(t, dt).requires_grad_());
    leaves.push_back(cast_copy(bias64, dt).requires_grad_());
    AttentionOptions opt;
    opt.causal = true;
    opt.bias = leaves[3];
    auto heads = [&](const Tensor& x) { return permute(x, {0, 2, 1, 3}); };
    Tensor q = heads(leaves[0]);
    BOOST_TEST(!q.is_contiguous());
    auto r = scaled_dot_product_attention(q, heads(leaves[1]), heads(leaves[2]), opt);
    outs.push_back(r.out.to_vector<double>());
    r.out.backward(cast_copy(dout64, dt));
    std::vector<double> all;
    for (auto& l : leaves) {
      auto v = l.grad().to_vector<double>();
      all.insert(all.end(), v.begin(), v.end());
    }
    grads.push_back(all);
  }
  check_close(outs[0], outs[1], 1e-5);
  check_close(grads[0], grads[1], 1e-4);
}

// Without a tape, few query rows per head (cached decoding) take the row loop instead of the
// batched matmuls: the same values, for queries and keys read from strided slices of a KV cache,
// with the causal mask aligned to the end, key padding (one batch row all padding, the last key
// of the other attended) and a broadcast bias; in float64 and float32, against the taped
// (matmul) path of the same dtype and against float64; value widths below, at and past the row
// loop's blocks of 16 elements.
BOOST_AUTO_TEST_CASE(few_queries_without_tape_match_the_matmul_path) {
  const int64_t B = 2, H = 3, cap = 9, Tk = 7, D = 8;
  for (int64_t Dv : {5, 16, 37})
    for (int64_t Tq : {1, 3}) {
      Generator g(31 + Tq + Dv);
      const Tensor q64 = randn({B, H, Tq, D}, DType::f64, g),
                   k64 = randn({B, H, cap, D}, DType::f64, g),
                   v64 = randn({B, H, cap, Dv}, DType::f64, g),
                   bias64 = randn({H, 1, Tk}, DType::f64, g);
      const Tensor pad =
          from_vector(std::vector<double>{0, 0, 1, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1}, {B, Tk});
      std::vector<double> ref;
      for (DType dt : {DType::f64, DType::f32}) {
        auto run = [&](bool taped) {
          Tensor q = cast_copy(q64, dt), k = cast_copy(k64, dt), v = cast_copy(v64, dt);
          if (taped) q.requires_grad_();
          AttentionOptions opt;
          opt.causal = true;
          opt.key_padding_mask = pad;
          opt.bias = cast_copy(bias64, dt);
          return scaled_dot_product_attention(q, slice(k, 2, 0, Tk), slice(v, 2, 0, Tk), opt).out;
        };
        const Tensor fast = run(false), taped = run(true);
        BOOST_TEST(!fast.requires_grad());
        BOOST_TEST(taped.requires_grad());
        autograd::clear_tape();
        const auto f = fast.to_vector<double>();
        for (size_t i = f.size() / 2; i < f.size(); ++i)
          BOOST_TEST(f[i] == 0.0);  // batch 1: all padding
        const double tol = dt == DType::f64 ? 1e-12 : 1e-5;
        check_close(f, taped.to_vector<double>(), tol);
        if (dt == DType::f64) ref = f;
        else check_close(f, ref, tol);
      }
    }
}

// Asking for the weights never changes the output (issue 32: it used to send up to 4 query rows
// to the batched matmuls instead of the row loop): without a tape, 1..6 query rows, float32 and
// float64, the output is bit-identical with and without weights, and the weights match the taped
// (matmul) path's and sum to 1 over the keys.
BOOST_AUTO_TEST_CASE(asking_for_weights_changes_no_output) {
  const int64_t B = 2, H = 2, Tk = 7, D = 8;
  for (DType dt : {DType::f32, DType::f64}) {
    for (int64_t Tq = 1; Tq <= 6; ++Tq) {
      Generator g(7 + Tq);
      const Tensor q = randn({B, H, Tq, D}, dt, g), k = randn({B, H, Tk, D}, dt, g),
                   v = randn({B, H, Tk, D}, dt, g);
      AttentionOptions opt;
      opt.causal = true;
      const Tensor plain = scaled_dot_product_attention(q, k, v, opt).out;
      opt.return_weights = true;
      const AttentionResult with = scaled_dot_product_attention(q, k, v, opt);
      BOOST_TEST(plain.to_vector<double>() == with.out.to_vector<double>());
      BOOST_TEST(with.weights.shape() == (Shape{B, H, Tq, Tk}));
      Tensor qt = contiguous_copy(q);
      qt.requires_grad_();
      const Tensor taped = scaled_dot_product_attention(qt, k, v, opt).weights;
      autograd::clear_tape();
      check_close(with.weights.to_vector<double>(), taped.to_vector<double>(),
                  dt == DType::f64 ? 1e-12 : 1e-5);
      const auto w = with.weights.to_vector<double>();
      for (size_t r = 0; r < w.size(); r += Tk) {
        double total = 0;
        for (int64_t j = 0; j < Tk; ++j) total += w[r + j];
        BOOST_TEST(std::abs(total - 1.0) < 1e-5);
      }
    }
  }
}

// The float32 result does not depend on the OpenMP thread count.
BOOST_AUTO_TEST_CASE(same_result_for_any_thread_count) {
  Generator g(4);
  Tensor q = randn({2, 4, 64, 16}, DType::f32, g), k = randn({2, 4, 64, 16}, DType::f32, g),
         v = randn({2, 4, 64, 16}, DType::f32, g);
  AttentionOptions opt;
  opt.causal = true;
  opt.return_weights = true;
  const int prev = omp_get_max_threads();
  omp_set_num_threads(1);
  auto w1 = scaled_dot_product_attention(q, k, v, opt).weights.to_vector<float>();
  omp_set_num_threads(std::max(2, prev));
  auto w2 = scaled_dot_product_attention(q, k, v, opt).weights.to_vector<float>();
  omp_set_num_threads(prev);
  BOOST_TEST(w1 == w2);
}

BOOST_AUTO_TEST_CASE(no_tape_entry_without_grad) {
  Tensor q = rand({1, 1, 2, 2}), k = rand({1, 1, 2, 2}), v = rand({1, 1, 2, 2});
  auto r = scaled_dot_product_attention(q, k, v);
  BOOST_TEST(!r.out.requires_grad());
  BOOST_TEST(autograd::tape_size() == 0u);
}

// The op's bad inputs and their errors are in its record (OpRecord::error_inputs,
// testing/cases/attention.cpp) and run by test_gradcheck_all.

namespace {

// Causal grouped-query attention by hand, row 0's last key being padding: q (B, T, H Dh), k and
// v (B, T, kv Dh) -> the heads' outputs (B, T, H Dh), each query head h against K/V head
// h / (H / kv).
std::vector<double> grouped_attention_by_hand(const Tensor& q, const Tensor& k, const Tensor& v,
                                              int64_t H, int64_t kv) {
  const int64_t B = q.size(0), T = q.size(1), d = q.size(2), Dh = d / H;
  std::vector<double> heads_out(B * T * d);
  const auto qv = q.to_vector<double>(), kvv = k.to_vector<double>(), vv = v.to_vector<double>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        const int64_t kh = h / (H / kv);
        std::vector<double> s;
        double mx = -1e300;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < Dh; ++e)
            dot += qv[(b * T + i) * d + h * Dh + e] * kvv[(b * T + j) * kv * Dh + kh * Dh + e];
          s.push_back(b == 0 && j == T - 1 ? -INFINITY : dot / std::sqrt((double)Dh));
          mx = std::max(mx, s.back());
        }
        double z = 0;
        for (double& e : s) z += (e = std::exp(e - mx));
        for (int64_t e = 0; e < Dh; ++e) {
          double o = 0;
          for (int64_t j = 0; j <= i; ++j) o += s[j] / z * vv[(b * T + j) * kv * Dh + kh * Dh + e];
          heads_out[(b * T + i) * d + h * Dh + e] = o;
        }
      }
  return heads_out;
}

}  // namespace

// Grouped-query attention (nn::MultiHeadAttention with kv_heads < heads): the output equals
// attention computed by hand, each query head h against K/V head h / (heads / kv_heads) of the
// packed projection's K and V rows; gradients pass gradcheck; bad kv_heads are refused.
BOOST_AUTO_TEST_CASE(grouped_query_attention_matches_repeated_heads) {
  Generator g(11);
  const int64_t B = 2, T = 5, d = 12, H = 6, Dh = d / H;
  for (int64_t kv : {1, 2, 3, 6}) {
    nn::MultiHeadAttention mha(d, H, DType::f64, g, 0.0, nullptr, kv, /*bias=*/kv % 2 == 0);
    BOOST_TEST(mha.in_proj_weight.shape() == (Shape{d + 2 * kv * Dh, d}));
    BOOST_TEST(mha.in_proj_bias.defined() == (kv % 2 == 0));
    BOOST_TEST(mha.out_proj->bias.defined() == (kv % 2 == 0));
    Tensor x = randn({B, T, d}, DType::f64, g);
    Tensor mask = zeros({B, T}, DType::i64);
    mask.data<int64_t>()[T - 1] = 1;  // row 0's last key is padding
    Tensor got;
    {
      autograd::NoGrad ng;
      got = mha.forward(x, x, mask, /*causal=*/true);
    }
    // By hand: per head, scores against the key head it shares, softmax, values.
    Tensor w = mha.in_proj_weight;
    auto proj = [&](int64_t r0, int64_t r1) {
      Tensor b = mha.in_proj_bias.defined() ? slice(mha.in_proj_bias, 0, r0, r1) : Tensor();
      return linear(x, slice(w, 0, r0, r1), b);  // (B, T, r1 - r0)
    };
    const Tensor q = proj(0, d), k = proj(d, d + kv * Dh), v = proj(d + kv * Dh, d + 2 * kv * Dh);
    const std::vector<double> heads_out = grouped_attention_by_hand(q, k, v, H, kv);
    const Tensor want = mha.out_proj->forward(from_vector(heads_out, {B, T, d}, DType::f64));
    check_close(got.to_vector<double>(), want.to_vector<double>(), 1e-12);
    // Gradients in x and the packed projection (through the repeated K/V heads).
    Tensor xs = randn({1, 3, d}, DType::f64, g).requires_grad_();
    const GradcheckResult r =
        gradcheck([&](const Tensors& in) { return mha.forward(in[0], in[0], Tensor(), true); },
                  {xs, mha.in_proj_weight});
    BOOST_TEST(r.ok, "kv_heads " << kv << ": " << r.message);
  }
  for (int64_t bad : {int64_t(-1), int64_t(4), int64_t(7)})
    BOOST_CHECK_EXCEPTION(
        nn::MultiHeadAttention(d, H, DType::f32, g, 0.0, nullptr, bad), Error, [&](const Error& e) {
          return std::string(e.what()).find("kv_heads " + std::to_string(bad) +
                                            " must divide heads 6") != std::string::npos;
        });
}

// A cached decoding step of grouped-query attention reads K and V as cached (each group's query
// heads as rows over its KV head, no repeated copy): step by step it gives the full causal
// forward's rows.
BOOST_AUTO_TEST_CASE(grouped_query_decoding_steps_match_the_full_forward) {
  Generator g(12);
  const int64_t B = 2, T = 6, d = 12, H = 6;
  for (int64_t kv : {1, 2, 3}) {
    nn::MultiHeadAttention mha(d, H, DType::f64, g, 0.0, nullptr, kv, /*bias=*/true);
    const Tensor x = randn({B, T, d}, DType::f64, g);
    autograd::NoGrad ng;
    const Tensor full = mha.forward(x, x, Tensor(), /*causal=*/true);
    nn::KVCache cache;
    for (int64_t t = 0; t < T; ++t) {
      const Tensor step = mha.forward_self_step(slice(x, 1, t, t + 1), cache, T);
      check_close(step.to_vector<double>(),
                  contiguous(slice(full, 1, t, t + 1)).to_vector<double>(), 1e-12);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

// A user's own single-head causal attention block (its own q/k/v Linear layers and
// scaled_dot_product_attention) decoding through nn::KVCache::append, in chunks of 3, 1, 2 and
// then 1 position (causal aligned to the end inside a chunk), gives the full causal forward's
// outputs: within 1e-6 in float32, 1e-12 in float64.
BOOST_AUTO_TEST_CASE(own_block_decodes_with_kv_cache_append) {
  for (DType dt : {DType::f32, DType::f64}) {
    Generator g(32);
    const int64_t B = 2, T = 7, d = 8;
    nn::Linear wq(d, d, true, dt, g), wk(d, d, false, dt, g), wv(d, d, true, dt, g);
    const auto head = [](const Tensor& t) { return unsqueeze(t, 1); };  // (B, T, d) -> (B, 1, T, d)
    AttentionOptions causal;
    causal.causal = true;
    const Tensor x = randn({B, T, d}, dt, g);
    const Tensor full = scaled_dot_product_attention(head(wq.forward(x)), head(wk.forward(x)),
                                                     head(wv.forward(x)), causal)
                            .out;
    autograd::NoGrad ng;
    nn::KVCache cache;
    int64_t at = 0;
    for (int64_t n : {3, 1, 2, 1}) {
      const Tensor xs = slice(x, 1, at, at + n);
      const auto [k, v] = cache.append(head(wk.forward(xs)), head(wv.forward(xs)), T);
      at += n;
      BOOST_TEST(cache.len == at);
      BOOST_TEST(k.shape() == (Shape{B, 1, at, d}));
      BOOST_TEST(v.shape() == (Shape{B, 1, at, d}));
      const Tensor out = scaled_dot_product_attention(head(wq.forward(xs)), k, v, causal).out;
      check_close(contiguous(out).to_vector<double>(),
                  contiguous(slice(full, 2, at - n, at)).to_vector<double>(),
                  dt == DType::f32 ? 1e-6 : 1e-12);
    }
    BOOST_TEST(cache.k.shape() ==
               (Shape{B, 1, T, d}));  // allocated once, at the first call's capacity
  }
}

// KVCache::append refuses a mismatched batch, head count, head size or dtype, k_new and v_new of
// different shapes, a non-positive first capacity and a cache past its capacity, naming the shapes;
// a refused call leaves the cache as it was.
BOOST_AUTO_TEST_CASE(kv_cache_append_errors_name_the_shapes) {
  const auto refused = [](std::initializer_list<const char*> parts) {
    return [parts](const Error& e) {
      const std::string m = e.what();
      for (auto p : parts)
        if (m.find(p) == std::string::npos) return false;
      return m.find("KVCache::append") != std::string::npos;
    };
  };
  nn::KVCache cache;
  BOOST_CHECK_EXCEPTION(cache.append(zeros({2, 3, 1, 4}), zeros({2, 3, 1, 4}), 0), Error,
                        refused({"capacity", "0"}));
  BOOST_TEST(!cache.k.defined());
  BOOST_CHECK_EXCEPTION(cache.append(zeros({2, 3, 1, 4}), zeros({2, 3, 1, 5}), 4), Error,
                        refused({"(2, 3, 1, 4)", "(2, 3, 1, 5)"}));
  BOOST_CHECK_EXCEPTION(cache.append(zeros({3, 1, 4}), zeros({3, 1, 4}), 4), Error,
                        refused({"(3, 1, 4)"}));
  cache.append(zeros({2, 3, 1, 4}), zeros({2, 3, 1, 4}), 4);
  BOOST_CHECK_EXCEPTION(cache.append(zeros({1, 3, 1, 4}), zeros({1, 3, 1, 4}), 4), Error,
                        refused({"(1, 3, 1, 4)", "(2, 3, 4, 4)"}));
  BOOST_CHECK_EXCEPTION(cache.append(zeros({2, 2, 1, 4}), zeros({2, 2, 1, 4}), 4), Error,
                        refused({"(2, 2, 1, 4)", "(2, 3, 4, 4)"}));
  BOOST_CHECK_EXCEPTION(cache.append(zeros({2, 3, 1, 8}), zeros({2, 3, 1, 8}), 4), Error,
                        refused({"(2, 3, 1, 8)", "(2, 3, 4, 4)"}));
  BOOST_CHECK_EXCEPTION(
      cache.append(zeros({2, 3, 1, 4}, DType::f64), zeros({2, 3, 1, 4}, DType::f64), 4), Error,
      refused({"f64 (2, 3, 1, 4)", "f32 (2, 3, 4, 4)"}));
  BOOST_CHECK_EXCEPTION(cache.append(zeros({2, 3, 4, 4}), zeros({2, 3, 4, 4}), 4), Error,
                        refused({"capacity 4", "1 + 4", "(2, 3, 4, 4)"}));
  BOOST_TEST(cache.len == 1);
  cache.append(zeros({2, 3, 3, 4}), zeros({2, 3, 3, 4}), 4);  // exactly full is fine
  BOOST_TEST(cache.len == 4);
}
