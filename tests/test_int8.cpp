// int8 inference (ops/precision.h, Precision::int8): linear against float64 within the bound that
// quantizing the weights per output channel and the input per row allows, oneDNN's int8 kernel
// against the plain integer loop (bit for bit), weights quantized once per version, rows with a
// NaN or only zeros, the errors (a tape, a float64 reference untouched), a weight made int8 for
// good (quantize_weight_int8: the same outputs, its float32 freed, every later read of it an error
// naming it), and a trained tiny Transformer decoding under int8 as it does in float32, before
// and after keep_for_inference. Which paths ran is printed.
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <iostream>
#include <limits>

#include "ops/internal/int8.h"
#include "tests/tiny_reverse.h"

using namespace graft;
using graft::testing::names;
using namespace graft::testing::tiny_reverse;

namespace {

void say_paths() {
  static const bool said = [] {
    std::cout << "test_int8: " << int8_description() << "\ntest_int8: paths tested: reference"
              << (int8_kernel_available() ? ", onednn"
                                          : " (no oneDNN int8 kernel with VNNI on this CPU)")
              << std::endl;
    return true;
  }();
  (void)said;
}

Tensor random(const Shape& s, uint64_t seed, double scale = 1.0) {
  Generator g(seed);
  return randn(s, DType::f32, g, 0.0, scale);
}

// The largest |err| / bound over the elements of y = int8 linear(x, w, b) against float64, where
// the bound for y[n][o] is what rounding x's row and w's row to their int8 grids can change:
//   xs/2 Σ|w| + ws/2 Σ|x| + IN xs ws / 4, xs = max|x_n| / 127, ws = max|w_o| / 127,
// plus float32 rounding of the dequantized result (1e-5 of Σ|x||w| + |b|).
double worst_error_over_bound(const Tensor& x2, const Tensor& w, const Tensor& b,
                              const Tensor& y2) {
  const auto x = x2.to_vector<double>(), wv = w.to_vector<double>(), y = y2.to_vector<double>();
  const std::vector<double> bv = b.defined() ? b.to_vector<double>() : std::vector<double>();
  const int64_t N = x2.shape()[0], IN = x2.shape()[1], OUT = w.shape()[0];
  double worst = 0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OUT; ++o) {
      double exact = bv.empty() ? 0 : bv[o], xmax = 0, wmax = 0, sx = 0, sw = 0, sxw = 0;
      for (int64_t k = 0; k < IN; ++k) {
        const double xv = x[n * IN + k], wk = wv[o * IN + k];
        exact += xv * wk;
        xmax = std::max(xmax, std::fabs(xv));
        wmax = std::max(wmax, std::fabs(wk));
        sx += std::fabs(xv), sw += std::fabs(wk), sxw += std::fabs(xv * wk);
      }
      const double xs = xmax / 127, ws = wmax / 127;
      const double bound = xs / 2 * sw + ws / 2 * sx + IN * xs * ws / 4 +
                           1e-5 * (sxw + (bv.empty() ? 0 : std::fabs(bv[o]))) + 1e-30;
      worst = std::max(worst, std::fabs(y[n * OUT + o] - exact) / bound);
    }
  return worst;
}

Tensor int8_linear(const Tensor& x, const Tensor& w, const Tensor& b, bool reference) {
  Tensor y = Tensor::empty({x.shape()[0], w.shape()[0]}, DType::f32);
  kern::linear_int8(x, w, b, y, reference);
  return y;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(int8_linear_tests)

BOOST_AUTO_TEST_CASE(int8_linear_is_within_the_quantization_bound_of_float64) {
  say_paths();
  struct Case {
    int64_t N, IN, OUT;
    bool bias;
  };
  for (const Case c : {Case{1, 64, 48, true}, Case{37, 129, 65, false}, Case{64, 512, 256, true}}) {
    const Tensor x = random({c.N, c.IN}, 1 + c.N), w = random({c.OUT, c.IN}, 2 + c.IN, 0.05);
    const Tensor b = c.bias ? random({c.OUT}, 3) : Tensor();
    Tensor y;
    {
      PrecisionGuard guard(Precision::int8);
      y = linear(x, w, b);
    }
    const double worst = worst_error_over_bound(x, w, b, y);
    // Not float32 in disguise: the int8 result differs from float32's by far more than rounding.
    const double off = amax(abs(sub(y, linear(x, w, b)))).item();
    std::cout << "test_int8: linear " << c.N << "x" << c.IN << " -> " << c.OUT << ": worst error "
              << worst << " of the bound; max |int8 - fp32| " << off << "\n";
    BOOST_TEST(worst <= 1.0);
    BOOST_TEST(off > 1e-4);
  }
}

BOOST_AUTO_TEST_CASE(onednn_kernel_equals_the_integer_loop_bit_for_bit) {
  say_paths();
  if (!int8_kernel_available()) {
    std::cout << "test_int8: no oneDNN int8 kernel here: the loop alone was checked (bound test)\n";
    const Tensor x = random({3, 40}, 4), w = random({5, 40}, 5);
    BOOST_TEST(worst_error_over_bound(x, w, Tensor(), int8_linear(x, w, Tensor(), true)) <= 1.0);
    return;
  }
  for (int64_t N : {1, 4, 32, 100}) {
    const Tensor x = random({N, 384}, 6 + N, 3.0), w = random({320, 384}, 7), b = random({320}, 8);
    const auto got = int8_linear(x, w, b, false).to_vector<float>();
    const auto want = int8_linear(x, w, b, true).to_vector<float>();
    BOOST_TEST(got == want);
  }
}

BOOST_AUTO_TEST_CASE(weights_are_quantized_once_per_version) {
  const Tensor x = random({8, 32}, 9);
  Tensor w = random({16, 32}, 10);
  PrecisionGuard guard(Precision::int8);
  const Tensor y0 = linear(x, w);
  const uint64_t c0 = int8_weight_copies_made();
  const Tensor y1 = linear(x, w);
  BOOST_TEST(int8_weight_copies_made() == c0);  // the kept copy was used
  BOOST_TEST(y0.to_vector<float>() == y1.to_vector<float>());
  copy_into(w,
            random({16, 32}, 15));  // a new version of w: quantized again, and the result follows
  const Tensor y2 = linear(x, w);
  BOOST_TEST(int8_weight_copies_made() == c0 + 1);
  BOOST_TEST(worst_error_over_bound(x, w, Tensor(), y2) <= 1.0);
}

BOOST_AUTO_TEST_CASE(zero_rows_and_nan_rows) {
  std::vector<float> xv(4 * 16, 0.5f);
  for (int k = 0; k < 16; ++k) xv[k] = 0.f;                            // row 0: zeros
  xv[2 * 16 + 5] = std::numeric_limits<float>::quiet_NaN();            // row 2: a NaN
  for (int k = 0; k < 16; ++k) xv[3 * 16 + k] = k % 2 ? 0.f : 1e-39f;  // row 3: subnormal scale
  const Tensor x = from_vector(xv, {4, 16}), w = random({4, 16}, 11), b = random({4}, 12);
  for (bool reference : {true, false}) {
    if (!reference && !int8_kernel_available()) continue;
    const auto y = int8_linear(x, w, b, reference).to_vector<float>();
    const auto bv = b.to_vector<float>();
    for (int o = 0; o < 4; ++o) {
      BOOST_TEST(y[o] == bv[o]);            // zeros in: exactly the bias out
      BOOST_TEST(std::isfinite(y[4 + o]));  // an ordinary row stays finite
      BOOST_TEST(std::isnan(y[8 + o]));     // a NaN in the row: NaN out, as float32 gives
      BOOST_TEST(std::fabs(y[12 + o] - bv[o]) <=
                 1e-6);  // 1 / scale would overflow: still ~ the bias
    }
  }
}

// A NaN or inf weight is refused when quantized, naming the op, the weight and the element: its
// channel's scale would be NaN and every output of that channel NaN, silently.
BOOST_AUTO_TEST_CASE(nonfinite_weights_are_refused) {
  const Tensor x = random({2, 8}, 15);
  for (double bad :
       {std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
        std::numeric_limits<double>::quiet_NaN()})
    for (bool reference : {true, false}) {
      if (!reference && !int8_kernel_available()) continue;
      std::vector<float> wv = random({3, 8}, 16).to_vector<float>();
      wv[1 * 8 + 5] = (float)bad;
      const Tensor w = from_vector(wv, {3, 8});
      const std::string value = std::isnan(bad) ? "nan" : bad > 0 ? "inf" : "-inf";
      BOOST_CHECK_EXCEPTION(int8_linear(x, w, Tensor(), reference), Error, [&](const Error& e) {
        return names(e, "linear (int8): weight f32 (3, 8) holds " + value + " at (1, 5)");
      });
    }
  // Through linear itself, under the guard: where modules push their names (anomaly mode), the
  // error names the module whose weight it is.
  std::vector<float> wv = random({3, 8}, 17).to_vector<float>();
  wv[0] = std::numeric_limits<float>::infinity();
  PrecisionGuard guard(Precision::int8);
  autograd::NoGrad ng;
  BOOST_CHECK_EXCEPTION(linear(x, from_vector(wv, {3, 8})), Error, [](const Error& e) {
    return names(e, "holds inf at (0, 0)") &&
           names(e, "anomaly mode, GRAFT_DETECT_ANOMALY=1, names the module");
  });
  autograd::AnomalyMode anomaly;
  autograd::NameScope decoder("decoder"), proj("proj");
  BOOST_CHECK_EXCEPTION(linear(x, from_vector(wv, {3, 8})), Error, [](const Error& e) {
    return names(e, "linear (int8) in decoder.proj: weight f32 (3, 8) holds inf at (0, 0)");
  });
}

BOOST_AUTO_TEST_CASE(int8_errors_and_what_it_leaves_alone) {
  Tensor x = random({2, 8}, 13), w = random({3, 8}, 14);
  w.requires_grad_();
  PrecisionGuard guard(Precision::int8);
  BOOST_CHECK_EXCEPTION(linear(x, w), Error, [](const Error& e) {
    return names(e, "linear") && names(e, "int8") && names(e, "NoGrad");
  });
  // float64 is the reference: untouched by int8.
  const Tensor x64 = to_dtype(x, DType::f64), w64 = to_dtype(w.detach(), DType::f64);
  Tensor under, plain;
  {
    autograd::NoGrad ng;
    under = linear(x64, w64);
  }
  PrecisionGuard fp32(Precision::fp32);
  plain = linear(x64, w64);
  BOOST_TEST(under.to_vector<double>() == plain.to_vector<double>());
  BOOST_CHECK_EXCEPTION(parse_precision("int4", "--precision"), Error,
                        [](const Error& e) { return names(e, "int4") && names(e, "int8"); });
}

// A weight made int8 for good (quantize_weight_int8) gives what PrecisionGuard(int8) gives over its
// float32 values, bit for bit: whole, as a slice of its rows (attention's in_proj parts), at any
// number of rows and on the integer loop (its plain rows derived from the kept kernel layout);
// its float32 bytes are freed.
BOOST_AUTO_TEST_CASE(quantized_weight_equals_int8_over_float32_and_frees_it) {
  say_paths();
  const Tensor w = random({96, 80}, 21, 0.2), b = random({96}, 22);
  const Tensor q = contiguous_copy(w);
  PrecisionGuard guard(Precision::int8);
  autograd::NoGrad ng;
  std::vector<Tensor> want;
  const auto outputs = [&](const Tensor& weight) {
    std::vector<Tensor> y;
    for (int64_t rows : {1, 7, 32}) {
      const Tensor x = random({rows, 80}, 30 + rows);
      y.push_back(linear(x, weight, b));
      y.push_back(linear(x, slice(weight, 0, 32, 96), slice(b, 0, 32, 96)));
      const Tensor y2 = Tensor::empty({rows, 96});
      kern::linear_int8(x, weight, b, y2, /*reference=*/true);
      y.push_back(y2);
    }
    return y;
  };
  want = outputs(w);
  const size_t live = Storage::live_bytes();
  BOOST_TEST(quantize_weight_int8(q, "enc.linear1.weight") == 96u * 80 * 4);
  // Left: the int8 form, in the kernel's layout padded to blocks of 64 (128 x 128), and scales.
  BOOST_TEST(Storage::live_bytes() <= live - 96 * 80 * 4 + 128 * 128 + 1024);
  BOOST_TEST(quantize_weight_int8(q, "enc.linear1.weight") == 0u);  // once
  const std::vector<Tensor> got = outputs(q);
  for (size_t i = 0; i < want.size(); ++i)
    BOOST_TEST(got[i].to_vector<float>() == want[i].to_vector<float>(), "output " << i);
}

// Whatever still wants the float32 values gets an error naming the parameter and what freed it,
// not a crash: reading them, float32 inference, training, a second view's copy; and a weight that
// cannot be freed alone (a view of a larger storage) or is not a float32 matrix is refused.
BOOST_AUTO_TEST_CASE(freed_float32_weight_is_an_error_naming_it) {
  const Tensor q = random({16, 8}, 23);
  quantize_weight_int8(q, "dec.out_proj.weight");
  const auto freed = [](const Error& e) {
    return names(e, "dec.out_proj.weight") && names(e, "freed") && names(e, "int8");
  };
  BOOST_CHECK_EXCEPTION(q.to_vector<float>(), Error, freed);
  BOOST_CHECK_EXCEPTION(contiguous_copy(q), Error, freed);
  BOOST_CHECK_EXCEPTION(linear(random({2, 8}, 24), q), Error, freed);  // fp32, no tape
  Tensor p = random({16, 8}, 25);
  p.requires_grad_(true);
  quantize_weight_int8(p, "dec.linear2.weight");
  BOOST_CHECK_EXCEPTION(sum(linear(random({2, 8}, 26), p)).backward(), Error,
                        [](const Error& e) { return names(e, "dec.linear2.weight"); });
  const Tensor big = random({32, 8}, 27);
  BOOST_CHECK_EXCEPTION(quantize_weight_int8(slice(big, 0, 0, 16), "half"), Error,
                        [](const Error& e) { return names(e, "half") && names(e, "view"); });
  BOOST_CHECK_EXCEPTION(quantize_weight_int8(random({8}, 28), "bias"), Error,
                        [](const Error& e) { return names(e, "bias") && names(e, "(OUT, IN)"); });
  Tensor bad = random({4, 4}, 29);
  bad.data<float>()[5] = std::numeric_limits<float>::infinity();
  BOOST_CHECK_EXCEPTION(quantize_weight_int8(bad, "enc.bad.weight"), Error, [](const Error& e) {
    return names(e, "enc.bad.weight") && names(e, "inf");
  });
  BOOST_TEST(big.to_vector<float>().size() == 256u);  // refused: nothing freed
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(int8_model_tests)

// A trained tiny Transformer decodes under int8 what it decodes in float32 (a trained model's
// choices have margins far above int8's error), and quantizes each weight once.
BOOST_AUTO_TEST_CASE(int8_decoding_matches_fp32_and_quantizes_weights_once) {
  say_paths();
  LearnedDecoder d;
  BOOST_TEST_REQUIRE(d.learned, "float32 did not learn the task in " << kCap << " steps");
  PrecisionGuard guard(Precision::int8);
  const auto greedy = d.decode(1);
  const uint64_t c0 = int8_weight_copies_made();
  BOOST_TEST((d.decode(1) == greedy));          // deterministic
  BOOST_TEST(int8_weight_copies_made() == c0);  // weights quantized once
  const int same_greedy = LearnedDecoder::same(greedy, d.greedy),
            same_beam = LearnedDecoder::same(d.decode(3), d.beam);
  std::cout << "test_int8: decoding 32 sources: greedy " << same_greedy << "/32, beam " << same_beam
            << "/32 equal to fp32\n";
  BOOST_TEST(same_greedy >= 30);
  BOOST_TEST(same_beam >= 30);
  // keep_for_inference(int8) frees the float32 weights of the model's linears and of the tied
  // embedding (looked up from its int8 rows since, a change of a step of its grid per value): it
  // still decodes what float32 decodes; saving the model afterwards fails naming a freed
  // parameter, the embedding among them.
  const size_t live = Storage::live_bytes();
  const size_t freed = models::keep_for_inference(d.run.m, Precision::int8);
  BOOST_TEST(freed > 0u);
  BOOST_TEST(Storage::live_bytes() < live);
  BOOST_TEST(LearnedDecoder::same(d.decode(1), d.greedy) >= 30);
  BOOST_TEST(LearnedDecoder::same(d.decode(3), d.beam) >= 30);
  BOOST_CHECK_EXCEPTION(d.run.m.embedding->weight.to_vector<float>(), Error,
                        [](const Error& e) { return names(e, "freed"); });
  BOOST_CHECK_EXCEPTION(
      [&] {
        for (const auto& [name, t] : d.run.m.state_dict()) t.to_vector<float>();
      }(),
      Error, [](const Error& e) { return names(e, "weight") && names(e, "freed"); });
}

BOOST_AUTO_TEST_SUITE_END()

// gather_int8_rows finds every element where oneDNN's reorders put it, in the plain and blocked
// layouts of its int8 kernels (odd sizes: padded last blocks).
BOOST_AUTO_TEST_CASE(int8_layout_offsets_match_onednn_reorders) {
  BOOST_TEST(kern::int8_layout_mismatches(70, 37) == 0);
  BOOST_TEST(kern::int8_layout_mismatches(128, 64) == 0);
}

// An embedding table made int8 is looked up as scale[id] * q[id] (int8_weight_parts' form), from
// plain rows (reference) and from the kernel's layout alike; recording it is refused by name.
BOOST_AUTO_TEST_CASE(int8_embedding_rows_are_the_dequantized_form) {
  const Tensor ids = from_vector(std::vector<int64_t>{4, 0, 63, 4, 17}, {5}, DType::i64);
  for (bool reference : {true, false}) {
    const Tensor w = random({64, 40}, 11);
    const Int8Weight parts = int8_weight_parts(w, "table");
    kern::quantize_for_inference(w, "table", reference);
    const autograd::NoGrad ng;
    const auto got = embedding(w, ids, -1).to_vector<float>();
    const auto q = parts.values.to_vector<float>(), s = parts.scales.to_vector<float>();
    std::vector<float> want;
    for (int64_t id : {4, 0, 63, 4, 17})
      for (int64_t k = 0; k < 40; ++k) want.push_back(s[id] * q[id * 40 + k]);
    BOOST_TEST(got == want, boost::test_tools::per_element());
  }
  Tensor w = random({8, 4}, 12);
  quantize_weight_int8(w, "table");
  w.requires_grad_(true);
  BOOST_CHECK_EXCEPTION(embedding(w, slice(ids, 0, 0, 1), -1), Error, [](const Error& e) {
    return names(e, "embedding") && names(e, "int8") && names(e, "NoGrad");
  });
}

// quantize_weight_int8_from gives a weight built without memory the form quantize_weight_int8
// makes of the same values, and refuses values of another shape by name.
BOOST_AUTO_TEST_CASE(quantize_from_values_equals_quantizing_in_place) {
  const Tensor values = random({24, 16}, 13);
  const Tensor in_place = contiguous_copy(values);
  quantize_weight_int8(in_place, "w");
  Tensor fresh = Tensor::empty({24, 16}, DType::f32);
  quantize_weight_int8_from(fresh, values, "w");
  const Int8Weight a = int8_weight_parts(in_place, "w"), b = int8_weight_parts(fresh, "w");
  BOOST_TEST(a.values.to_vector<float>() == b.values.to_vector<float>(),
             boost::test_tools::per_element());
  BOOST_TEST(a.scales.to_vector<float>() == b.scales.to_vector<float>(),
             boost::test_tools::per_element());
  BOOST_CHECK_EXCEPTION(
      quantize_weight_int8_from(Tensor::empty({24, 16}, DType::f32), random({16, 24}, 14), "w2"),
      Error, [](const Error& e) { return names(e, "w2") && names(e, "shape"); });
}

// The integer loop (reference) gives each row the same bits whether it runs alone or among others
// (4 rows per weight load, then single rows; 32 columns per step, then the tail).
BOOST_AUTO_TEST_CASE(integer_loop_rows_do_not_depend_on_their_neighbours) {
  for (int64_t IN : {37, 64, 200}) {
    const Tensor x = random({7, IN}, 21), w = random({19, IN}, 22), b = random({19}, 23);
    const auto all = int8_linear(x, w, b, /*reference=*/true).to_vector<float>();
    for (int64_t n = 0; n < 7; ++n) {
      const auto one =
          int8_linear(contiguous(slice(x, 0, n, n + 1)), w, b, true).to_vector<float>();
      const std::vector<float> row(all.begin() + n * 19, all.begin() + (n + 1) * 19);
      BOOST_TEST(one == row, boost::test_tools::per_element());
    }
    BOOST_TEST(worst_error_over_bound(x, w, b, int8_linear(x, w, b, true)) <= 1.0);
  }
}

// The integer loop's sums are exact at the ends of the int8 range, where a u8 x s8 pair of
// products overflows int16 (oneDNN's AVX2 GEMM saturates there: 2 * 255 * 127 > 32767): x and w
// of -1, 0 and 1 quantize to -127, 0 and 127 exactly, so y is the integer dot product (up to the
// float32 rounding of the scales, 1 / 127 each). Lengths 64 (whole 32-column steps), 100 (a tail)
// and 7 (the tail alone); 9 rows (two 4-row tiles and one single row) by 5 (2 x 2 + 1).
BOOST_AUTO_TEST_CASE(integer_loop_is_exact_at_the_ends_of_the_int8_range) {
  for (int64_t IN : {64, 100, 7}) {
    const int64_t N = 9, OUT = 5;
    std::vector<float> xv(N * IN), wv(OUT * IN);
    for (int64_t i = 0; i < N * IN; ++i) xv[i] = i % IN == 0 ? 1.f : (float)((i * 7 / 3) % 3 - 1);
    for (int64_t i = 0; i < OUT * IN; ++i)
      wv[i] = i % IN == 1 ? -1.f : (float)((i * 5 / 2) % 3 - 1);
    for (int64_t k = 0; k < IN; ++k) xv[k] = wv[k] = -1.f;  // row 0 with weight row 0: +1 each
    const Tensor x = from_vector(xv, {N, IN}), w = from_vector(wv, {OUT, IN});
    const auto y = int8_linear(x, w, Tensor(), /*reference=*/true).to_vector<float>();
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < OUT; ++o) {
        double dot = 0;
        for (int64_t k = 0; k < IN; ++k) dot += (double)xv[n * IN + k] * wv[o * IN + k];
        BOOST_TEST(std::fabs(y[n * OUT + o] - dot) <= 1e-5 * IN,
                   "IN " << IN << " y[" << n << "][" << o << "] = " << y[n * OUT + o] << ", exact "
                         << dot);
      }
    BOOST_TEST(y[0] == IN, boost::test_tools::tolerance(1e-5));
  }
}
