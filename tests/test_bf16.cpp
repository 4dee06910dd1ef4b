// bf16 mixed precision (ops/precision.h): the matmul ops forward and backward against float32
// within bf16 tolerances, the oneDNN bf16 kernel against the reference path (rounded operands,
// float32 products), weight copies made once per change, a tiny Transformer trained to the same
// criterion in both precisions, and bf16 decoding. Every test runs the reference path; the oneDNN
// path too where this CPU has a bf16 kernel. Which ran is printed, so nothing is skipped silently.
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <memory>

#include "graft/autograd/tape.h"
#include "graft/models/decoding.h"
#include "graft/models/transformer.h"
#include "graft/nn/train/optim.h"
#include "graft/ops/ops.h"
#include "tests/test_util.h"
#include "tests/tiny_reverse.h"

using namespace graft;
using graft::testing::ids;

namespace {

std::vector<Bf16Path> paths() {
  static const bool said = [] {
    std::cout << "test_bf16: " << bf16_description() << "\ntest_bf16: paths tested: reference"
              << (bf16_kernel_available() ? ", onednn" : " (no oneDNN bf16 kernel on this CPU)")
              << std::endl;
    return true;
  }();
  (void)said;
  std::vector<Bf16Path> p{Bf16Path::reference};
  if (bf16_kernel_available()) p.push_back(Bf16Path::onednn);
  return p;
}

// ||a - b|| / ||b|| over all elements.
double rel_err(const Tensor& a, const Tensor& b) {
  BOOST_REQUIRE(a.shape() == b.shape());
  const auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  double num = 0, den = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    num += (va[i] - vb[i]) * (va[i] - vb[i]);
    den += vb[i] * vb[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// Fresh leaves with the values of `in`, requiring grad.
Tensors leaves(const Tensors& in) {
  Tensors out;
  for (const Tensor& t : in) {
    Tensor c = contiguous_copy(t);
    c.requires_grad_();
    out.push_back(c);
  }
  return out;
}

// fn's output and the gradients of sum(output * upstream) for every input.
template <class F>
Tensors forward_backward(const Tensors& in, const Tensor& upstream, F fn) {
  Tensors x = leaves(in);
  Tensor y = fn(x);
  Tensor loss = upstream.defined() ? sum(mul(y, upstream)) : y;
  loss.backward();
  Tensors out{y.detach()};
  for (const Tensor& t : x) {
    BOOST_REQUIRE(t.grad().defined());
    BOOST_TEST((t.grad().dtype() == DType::f32));
    out.push_back(t.grad());
  }
  return out;
}

// The same function in float32, and in bf16 on every path: each bf16 result within tol of
// float32 (relative, over the whole tensor), the two bf16 paths within 1e-4 of each other.
template <class F>
void check_bf16(const std::string& what, const Tensors& in, const Tensor& upstream, double tol,
                F fn) {
  const Tensors ref = forward_backward(in, upstream, fn);
  Tensors first;
  for (Bf16Path path : paths()) {
    PrecisionGuard guard(Precision::bf16, path);
    const Tensors got = forward_backward(in, upstream, fn);
    for (size_t i = 0; i < got.size(); ++i) {
      const double e = rel_err(got[i], ref[i]);
      BOOST_TEST_MESSAGE(what << " " << bf16_path_name(path) << " output " << i << ": rel err "
                              << e);
      BOOST_CHECK_MESSAGE(e <= tol, what << " (" << bf16_path_name(path) << "): output " << i
                                         << " rel err " << e << " vs float32 > " << tol);
      if (i == 0)  // the forward output always comes out of a matmul
        BOOST_CHECK_MESSAGE(e > 0, what << ": the output equals float32 exactly: bf16 did not run");
      if (!first.empty())
        BOOST_CHECK_MESSAGE(rel_err(got[i], first[i]) <= 1e-4,
                            what << ": onednn and reference paths differ at output " << i << " by "
                                 << rel_err(got[i], first[i]));
    }
    if (first.empty()) first = got;
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(bf16_tests)

BOOST_AUTO_TEST_CASE(rounding_is_to_nearest_even) {
  BOOST_TEST(round_to_bf16(1.0f) == 1.0f);
  BOOST_TEST(round_to_bf16(1.0f + 0x1p-8f) == 1.0f);                       // tie, to even
  BOOST_TEST(round_to_bf16(1.0f + 3 * 0x1p-8f) == 1.0f + 0x1p-6f);         // tie, to even (up)
  BOOST_TEST(round_to_bf16(1.0f + 0x1p-8f + 0x1p-20f) == 1.0f + 0x1p-7f);  // above the tie
  BOOST_TEST(std::isnan(round_to_bf16(std::numeric_limits<float>::quiet_NaN())));
  BOOST_TEST(std::isinf(round_to_bf16(std::numeric_limits<float>::max())));
  BOOST_TEST(std::signbit(round_to_bf16(-0.0f)));
  BOOST_TEST(round_to_bf16(-3.0f) == -3.0f);
}

BOOST_AUTO_TEST_CASE(precision_names_and_guard_nesting) {
  BOOST_TEST((parse_precision("bf16", "--precision") == Precision::bf16));
  BOOST_CHECK_EXCEPTION(parse_precision("fp16", "--precision"), Error, [](const Error& e) {
    return testing::names(e, "--precision: unknown precision 'fp16'");
  });
  BOOST_TEST((matmul_precision() == Precision::fp32));
  {
    PrecisionGuard a(Precision::bf16, Bf16Path::reference);
    BOOST_TEST((bf16_path() == Bf16Path::reference));
    {
      PrecisionGuard b(Precision::fp32);
      BOOST_TEST((matmul_precision() == Precision::fp32));
    }
    BOOST_TEST((matmul_precision() == Precision::bf16));
  }
  BOOST_TEST((matmul_precision() == Precision::fp32));
  if (!bf16_kernel_available())
    BOOST_CHECK_EXCEPTION(
        PrecisionGuard(Precision::bf16, Bf16Path::onednn), Error,
        [](const Error& e) { return testing::names(e, "no native bf16 matmul kernel"); });
}

// With oneDNN's ISA capped below AVX512_BF16 (DNNL_MAX_CPU_ISA=AVX512_CORE or AVX2: ctest runs
// this program so as test_bf16_avx512_core and test_bf16_avx2, as on such CPUs) there is no bf16
// kernel: on AVX512_CORE oneDNN's bf16 gemm:jit widens to float32 (slower than float32), and
// graft does not count it. Uncapped, the ISA decides and the other cases cover both answers.
boost::test_tools::assertion_result isa_capped_below_bf16(boost::unit_test::test_unit_id) {
  const char* cap = std::getenv("DNNL_MAX_CPU_ISA");
  const std::string isa = cap ? cap : "";
  boost::test_tools::assertion_result r(isa == "AVX512_CORE" || isa == "AVX2");
  r.message() << "DNNL_MAX_CPU_ISA is not AVX512_CORE or AVX2";
  return r;
}

BOOST_AUTO_TEST_CASE(no_bf16_kernel_below_avx512_bf16,
                     *boost::unit_test::precondition(isa_capped_below_bf16)) {
  BOOST_TEST(!bf16_kernel_available());
  BOOST_TEST(bf16_description().find("no native bf16 matmul kernel") != std::string::npos,
             bf16_description());
  BOOST_TEST(bf16_unavailable_reason("--precision").find("use fp32") != std::string::npos);
  PrecisionGuard guard(Precision::bf16);
  BOOST_TEST((bf16_path() == Bf16Path::reference));
}

BOOST_AUTO_TEST_CASE(linear_forward_backward) {
  Generator g(11);
  const Tensors in{randn({64, 96}, DType::f32, g), randn({80, 96}, DType::f32, g, 0, 0.1),
                   randn({80}, DType::f32, g)};
  const Tensor up = randn({64, 80}, DType::f32, g);
  check_bf16("linear", in, up, 1e-2, [](const Tensors& x) { return linear(x[0], x[1], x[2]); });
  // 3-D input, no bias.
  const Tensors in3{randn({4, 16, 96}, DType::f32, g), randn({80, 96}, DType::f32, g, 0, 0.1)};
  check_bf16("linear 3-D", in3, randn({4, 16, 80}, DType::f32, g), 1e-2,
             [](const Tensors& x) { return linear(x[0], x[1]); });
  // Of an activation: the oneDNN path keeps x's bf16 copy for dW.
  check_bf16("linear of an activation", in, up, 1e-2,
             [](const Tensors& x) { return linear(affine(x[0], 1.0, 0.0), x[1], x[2]); });
}

BOOST_AUTO_TEST_CASE(matmul_forward_backward) {
  Generator g(12);
  const Tensors in{randn({3, 40, 48}, DType::f32, g), randn({48, 56}, DType::f32, g)};
  check_bf16("matmul", in, randn({3, 40, 56}, DType::f32, g), 1e-2,
             [](const Tensors& x) { return matmul(x[0], x[1]); });
  const Tensors bt{randn({2, 3, 24, 32}, DType::f32, g), randn({2, 3, 40, 32}, DType::f32, g)};
  check_bf16("matmul transposed", bt, randn({2, 3, 24, 40}, DType::f32, g), 1e-2,
             [](const Tensors& x) { return matmul(x[0], transpose(x[1], -1, -2)); });
  // Row views of bigger tensors, as a KV cache's first positions (and K^T of them): converted
  // row by row.
  const Tensors cache{randn({2, 3, 24, 32}, DType::f32, g), randn({2, 3, 64, 32}, DType::f32, g),
                      randn({2, 3, 64, 32}, DType::f32, g)};
  check_bf16("matmul on cache views", cache, randn({2, 3, 24, 32}, DType::f32, g), 1e-2,
             [](const Tensors& x) {
               const Tensor k = slice(x[1], 2, 0, 40), v = slice(x[2], 2, 0, 40);
               return matmul(matmul(x[0], transpose(k, -1, -2)), v);
             });
}

BOOST_AUTO_TEST_CASE(attention_forward_backward) {
  Generator g(13);
  const Tensors in{randn({2, 3, 20, 16}, DType::f32, g), randn({2, 3, 20, 16}, DType::f32, g),
                   randn({2, 3, 20, 16}, DType::f32, g)};
  const Tensor up = randn({2, 3, 20, 16}, DType::f32, g);
  const Tensor pad = from_vector(std::vector<int64_t>(40, 0), {2, 20}, DType::i64);
  for (bool causal : {false, true})
    check_bf16(causal ? "attention causal" : "attention", in, up, 1e-2, [&](const Tensors& x) {
      AttentionOptions o;
      o.causal = causal;
      o.key_padding_mask = pad;
      return scaled_dot_product_attention(x[0], x[1], x[2], o).out;
    });
  // Of activations: the oneDNN path keeps q, k, v as bf16 for the backward's products.
  check_bf16("attention of activations", in, up, 1e-2, [&](const Tensors& x) {
    auto act = [](const Tensor& t) { return affine(t, 1.0, 0.0); };
    return scaled_dot_product_attention(act(x[0]), act(x[1]), act(x[2]), AttentionOptions{}).out;
  });
}

// Under the oneDNN bf16 path linear and attention of activations keep only bf16 copies of their
// inputs: their backward under create_graph needs the float inputs and says so, naming the op.
BOOST_AUTO_TEST_CASE(create_graph_through_kept_bf16_inputs_is_a_clear_error) {
  if (!bf16_kernel_available()) return;  // only the oneDNN path keeps bf16 copies
  PrecisionGuard guard(Precision::bf16, Bf16Path::onednn);
  Generator g(17);
  auto act = [](const Tensor& t) { return affine(t, 1.0, 0.0); };
  auto expect_error = [](const char* op, const Tensor& out, const Tensor& wrt) {
    BOOST_CHECK_EXCEPTION(
        autograd::grad({sum(out)}, {wrt}, {}, {.create_graph = true}), Error, [&](const Error& e) {
          const std::string m = e.what();
          return m.find(std::string("first backward of '") + op + "'") != std::string::npos &&
                 m.find("compute higher-order gradients in float32 precision") != std::string::npos;
        });
    autograd::clear_tape();
  };
  Tensor x = randn({64, 96}, DType::f32, g).requires_grad_(),
         w = randn({80, 96}, DType::f32, g).requires_grad_();
  expect_error("linear", linear(act(x), w), w);
  Tensor q = randn({2, 3, 20, 16}, DType::f32, g).requires_grad_();
  expect_error("scaled_dot_product_attention",
               scaled_dot_product_attention(act(q), act(q), act(q), AttentionOptions{}).out, q);
  BOOST_TEST(autograd::tape_size() == 0u);
}

// Cached decoding's attention (no tape, one query row per head, steady cross K/V) runs the
// float32 row loop under bf16 as well: the same values as without bf16, and within bf16's error
// of the matmul path that a taped call takes.
BOOST_AUTO_TEST_CASE(decoding_attention_runs_in_float32_under_bf16) {
  Generator g(17);
  const Tensor q = randn({2, 4, 1, 16}, DType::f32, g), k = randn({2, 4, 24, 16}, DType::f32, g),
               v = randn({2, 4, 24, 16}, DType::f32, g);
  AttentionOptions o;
  o.steady_kv = true;
  const auto fp32 = scaled_dot_product_attention(q, k, v, o).out.to_vector<double>();
  for (Bf16Path path : paths()) {
    PrecisionGuard guard(Precision::bf16, path);
    const Tensor fast = scaled_dot_product_attention(q, k, v, o).out;
    BOOST_TEST(fast.to_vector<double>() == fp32, boost::test_tools::per_element());
    Tensor qt = q.detach();
    qt.requires_grad_();
    const Tensor taped = scaled_dot_product_attention(qt, k, v, o).out;
    autograd::clear_tape();
    BOOST_TEST(rel_err(fast, taped) < 1e-2, bf16_path_name(path));
  }
}

// The FFN under bf16: on the oneDNN path relu_dropout keeps one bit per element and linear2
// keeps its input as bf16; the reference path keeps relu_dropout's float32 output. Both must
// give the same gradients.
BOOST_AUTO_TEST_CASE(ffn_forward_backward) {
  Generator g(16);
  const Tensors in{randn({64, 96}, DType::f32, g), randn({128, 96}, DType::f32, g, 0, 0.1),
                   randn({128}, DType::f32, g), randn({80, 128}, DType::f32, g, 0, 0.1),
                   randn({80}, DType::f32, g)};
  // Two bf16 matmuls in a row (and relu's kink moved by the first one's rounding): ~2% off
  // float32; the two paths must still agree within 1e-4.
  check_bf16("ffn", in, randn({64, 80}, DType::f32, g), 3e-2, [](const Tensors& x) {
    Generator drop(5);
    return linear(relu_dropout(linear(x[0], x[1], x[2]), 0.3, true, drop), x[3], x[4]);
  });
}

namespace {
// The bytes the live tape keeps for `op` (see autograd::saved_bytes_by_op).
size_t saved_bytes(const std::string& op) {
  for (const auto& r : autograd::saved_bytes_by_op())
    if (r.op == op) return r.bytes;
  return 0;
}
}  // namespace

namespace {
// Where oneDNN has a bf16 kernel: the oneDNN bf16 path in force, a weight and a leaf to make
// activations from. Elsewhere (no kernel: the float32 tensors are kept) `ok` is false.
struct KeptSetup {
  bool ok = bf16_kernel_available();
  Generator g{17};
  Tensor w = randn({32, 256}, DType::f32, g).requires_grad_();
  Tensor leaf = randn({64, 256}, DType::f32, g).requires_grad_();
  const size_t w_bytes = 32 * 256 * 4, n = 64 * 256;
  std::unique_ptr<PrecisionGuard> guard;
  KeptSetup() {
    if (ok) guard = std::make_unique<PrecisionGuard>(Precision::bf16, Bf16Path::onednn);
    else
      std::cout << "test_bf16: kept bf16 activations: no oneDNN bf16 kernel here, the float32 ones "
                   "are kept"
                << std::endl;
  }
  Tensor activation() const { return affine(leaf, 1.0, 0.0); }  // affine keeps nothing
};
}  // namespace

// On the oneDNN bf16 path linear keeps an activation it reads as bf16 (2 bytes an element) in
// place of the float32 one, unless another tape entry keeps it anyway or it is a leaf (its owner
// holds it). On the reference path nothing changes.
BOOST_AUTO_TEST_CASE(bf16_linear_keeps_activations_in_half_the_bytes) {
  KeptSetup k;
  if (!k.ok) return;
  {
    Tensor y = linear(k.activation(), k.w);
    BOOST_TEST(saved_bytes("linear") == k.w_bytes + k.n * 2);
    sum(y).backward();
  }
  {
    Tensor y = linear(k.leaf, k.w);  // a leaf: kept as it is
    BOOST_TEST(saved_bytes("linear") == k.w_bytes + k.n * 4);
    sum(y).backward();
  }
  {
    Tensor x = k.activation();
    Tensor m = mul(x, x);  // mul keeps x: linear keeps no second copy of it
    BOOST_TEST(x.impl()->storage->saved_by_tape == 1u);
    Tensor y = linear(x, k.w);
    BOOST_TEST(saved_bytes("linear") == k.w_bytes);
    sum(add(y, sum(m))).backward();
    BOOST_TEST(x.impl()->storage->saved_by_tape == 0u);  // the entries are freed
  }
}

// Attention keeps one bf16 copy of q = k = v; relu_dropout keeps a bit per element.
BOOST_AUTO_TEST_CASE(bf16_attention_and_relu_dropout_keep_less) {
  KeptSetup k;
  if (!k.ok) return;
  {
    Tensor x = affine(reshape(k.leaf, {2, 4, 32, 64}), 1.0, 0.0);
    Tensor y = scaled_dot_product_attention(x, x, x, AttentionOptions{}).out;
    BOOST_TEST(saved_bytes("scaled_dot_product_attention") == k.n * 2);
    sum(y).backward();
  }
  {
    Generator drop(3);
    Tensor y = relu_dropout(k.activation(), 0.5, true, drop);
    BOOST_TEST(saved_bytes("relu_dropout") == k.n / 8);
    sum(y).backward();
  }
}

// An in-place write to what a kept copy was made from still fails backward; the saved counts
// return to zero after a retained graph is cleared.
BOOST_AUTO_TEST_CASE(bf16_kept_copies_follow_their_sources) {
  KeptSetup k;
  if (!k.ok) return;
  {
    Tensor x = k.activation();
    Tensor y = linear(x, k.w);
    fill_(x, 0.5);  // after the forward: the kept copy no longer matches x
    BOOST_CHECK_EXCEPTION(sum(y).backward(), Error, [](const Error& e) {
      return testing::names(e, "backward of 'linear'") && testing::names(e, "modified in place");
    });
    autograd::clear_tape();
  }
  {
    Tensor x = k.activation();
    Tensor m = mul(x, x);
    sum(m).backward(Tensor(), /*retain_graph=*/true);
    BOOST_TEST(x.impl()->storage->saved_by_tape == 1u);  // retained
    autograd::clear_tape();
    BOOST_TEST(x.impl()->storage->saved_by_tape == 0u);
  }
}

BOOST_AUTO_TEST_CASE(linear_cross_entropy_forward_backward) {
  Generator g(14);
  std::vector<int64_t> t(96);
  for (auto& v : t) v = (int64_t)g.below(200);
  const Tensor target = from_vector(t, {96}, DType::i64);
  const Tensors in{randn({96, 64}, DType::f32, g), randn({200, 64}, DType::f32, g, 0, 0.2)};
  check_bf16("linear_cross_entropy", in, Tensor(), 1e-2, [&](const Tensors& x) {
    return linear_cross_entropy(x[0], x[1], target, 0.1, -100, 40);  // 3 chunks
  });
}

BOOST_AUTO_TEST_CASE(weight_copies_follow_the_weights_version) {
  Generator g(15);
  Tensor x = randn({8, 32}, DType::f32, g), w = randn({16, 32}, DType::f32, g);
  for (Bf16Path path : paths()) {
    PrecisionGuard guard(Precision::bf16, path);
    const uint64_t c0 = bf16_weight_copies_made();
    Tensor y1 = linear(x, w);
    Tensor y1b = linear(x, w);
    BOOST_TEST(bf16_weight_copies_made() == c0 + 1);  // converted once, used twice
    BOOST_TEST(rel_err(y1b, y1) == 0.0);
    fill_(w, 0.5);  // an in-place write (bumps the version): the copy must not be used again
    Tensor y2 = linear(x, w);
    BOOST_TEST(bf16_weight_copies_made() == c0 + 2);
    PrecisionGuard fp32(Precision::fp32);
    BOOST_TEST(rel_err(y2, linear(x, w)) < 1e-2);
    w = randn({16, 32}, DType::f32, g);
  }
}

// A kept bf16 copy of a weight refuses a NaN or inf in it, or a finite value that rounds to inf
// in bf16, naming the weight and the element (in training the weight is converted per call and
// NaN propagates like any value).
BOOST_AUTO_TEST_CASE(kept_weight_copies_refuse_nonfinite_weights) {
  Generator g(16);
  const Tensor x = randn({4, 8}, DType::f32, g);
  for (Bf16Path path : paths())
    for (double bad : {std::numeric_limits<double>::quiet_NaN(),
                       -std::numeric_limits<double>::infinity(), 3.4e38}) {
      std::vector<float> wv = randn({3, 8}, DType::f32, g).to_vector<float>();
      wv[2 * 8 + 1] = (float)bad;
      const Tensor w = from_vector(wv, {3, 8});
      PrecisionGuard guard(Precision::bf16, path);
      autograd::NoGrad ng;
      const std::string value = std::isnan(bad) ? "holds nan" : bad < 0 ? "holds -inf" : "beyond";
      BOOST_CHECK_EXCEPTION(linear(x, w), Error, [&](const Error& e) {
        return testing::names(e, "weight f32 (3, 8)") && testing::names(e, value) &&
               testing::names(e, "at (2, 1)") && testing::names(e, "bf16");
      });
      const Tensor target = from_vector(std::vector<int64_t>{0, 1, 2, 0}, {4}, DType::i64);
      BOOST_CHECK_EXCEPTION(linear_cross_entropy(x, w, target), Error, [&](const Error& e) {
        return testing::names(e, "bf16 matmul: weight f32 (3, 8)") &&
               testing::names(e, "at (2, 1)") && testing::names(e, value);
      });
    }
}

BOOST_AUTO_TEST_SUITE_END()

// ---- a tiny Transformer: training and decoding ----------------------------------------------

using namespace graft::testing::tiny_reverse;

BOOST_AUTO_TEST_SUITE(bf16_model_tests)

// bf16 training tracks float32 from the same initial weights: it learns the task within one
// check of the step float32 does, and once both have learned and trained one more interval
// side by side (the flat part of the curve), their held-out losses are within 2%.
BOOST_AUTO_TEST_CASE(tiny_transformer_trains_alike_in_bf16_and_fp32) {
  std::vector<std::unique_ptr<TinyRun>> runs;
  runs.push_back(std::make_unique<TinyRun>());
  for (Bf16Path path : paths()) runs.push_back(std::make_unique<TinyRun>(Precision::bf16, path));
  std::vector<int> learned;
  int64_t common = 0;
  for (auto& r : runs) {
    learned.push_back(train_until_learned(*r));
    BOOST_TEST_REQUIRE(learned.back() > 0, "did not learn the task in " << kCap << " steps");
    common = std::max(common, r->steps + kEvery);
  }
  for (auto& r : runs) r->train((int)(common - r->steps));
  const double want = runs[0]->held_out_loss();
  std::cout << "test_bf16: tiny Transformer learned (held-out loss < " << kLearned << ") at step "
            << learned[0] << " in fp32; held-out loss at step " << common << ": " << want << "\n";
  for (size_t i = 1; i < runs.size(); ++i) {
    const TinyRun& bf = *runs[i];
    const double got = runs[i]->held_out_loss();
    std::cout << "test_bf16: bf16 (" << bf16_path_name(bf.path) << ") learned at step "
              << learned[i] << "; held-out loss at step " << common << ": " << got << "\n";
    BOOST_TEST(std::abs(learned[i] - learned[0]) <= kEvery);
    BOOST_TEST(std::fabs(got - want) <= 0.02 * want);
    // Kept weight copies in training: the output projection's (the tied embedding, read by each
    // chunk of linear_cross_entropy), once a step; linear converts its weights at each use.
    BOOST_TEST(bf.copies_last_step == 1u);
  }
}

BOOST_AUTO_TEST_CASE(bf16_decoding_matches_fp32_and_converts_weights_once) {
  LearnedDecoder d;
  BOOST_TEST_REQUIRE(d.learned, "float32 did not learn the task in " << kCap << " steps");
  for (Bf16Path path : paths()) {
    PrecisionGuard guard(Precision::bf16, path);
    const auto greedy = d.decode(1);
    const uint64_t c0 = bf16_weight_copies_made();
    BOOST_TEST((d.decode(1) == greedy));          // deterministic
    BOOST_TEST(bf16_weight_copies_made() == c0);  // weights converted once
    const int same_greedy = LearnedDecoder::same(greedy, d.greedy),
              same_beam = LearnedDecoder::same(d.decode(3), d.beam);
    std::cout << "test_bf16: decoding 32 sources (" << bf16_path_name(path) << "): greedy "
              << same_greedy << "/32, beam " << same_beam << "/32 equal to fp32\n";
    // A trained model's choices have margins far above bf16's error: nearly all agree.
    BOOST_TEST(same_greedy >= 30);
    BOOST_TEST(same_beam >= 30);
  }
  // keep_for_inference(bf16) makes the model a bf16 one (2 bytes a weight): greedy and beam
  // search decode it (beam search widens its bf16 logits to float32 log-probabilities).
  PrecisionGuard guard(Precision::bf16);
  BOOST_TEST(models::keep_for_inference(d.run.m, Precision::bf16) > 0u);
  BOOST_TEST((d.run.m.embedding->weight.dtype() == DType::bf16));
  const int same_greedy = LearnedDecoder::same(d.decode(1), d.greedy),
            same_beam = LearnedDecoder::same(d.decode(3), d.beam);
  std::cout << "test_bf16: decoding 32 sources as a bf16 model: greedy " << same_greedy
            << "/32, beam " << same_beam << "/32 equal to fp32\n";
  BOOST_TEST(same_greedy >= 28);
  BOOST_TEST(same_beam >= 28);
}

BOOST_AUTO_TEST_SUITE_END()
