// The native 16-bit loops (kern::native_half): layer_norm, add_layer_norm, rms_norm, softmax,
// log_softmax, the binary ops with broadcasting, the unary rows (relu, gelu, affine, ...) and
// scaled_dot_product_attention (few query rows: the decoding loop over a 16-bit KV cache; more:
// the 16-bit matmuls) read and write bf16 and f16 tensors directly when nothing is recorded.
// Each is compared with float32 math on the same (16-bit) values rounded once to the dtype, at
// sizes that are not multiples of 16, and must not go through float32 copies (kern::f32_detours
// stays put: a native path skipped fails here). A recorded call still goes through float32.
// ctest also runs it under DNNL_MAX_CPU_ISA=AVX512_CORE and AVX2.
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <functional>
#include <string>

#include "graft/autograd/tape.h"
#include "graft/ops/ops.h"
#include "ops/internal/kernels.h"

using namespace graft;

namespace {

// Half the ulp at 1 of a 16-bit dtype.
double unit_roundoff(DType dt) { return dt == DType::bf16 ? 0x1p-8 : 0x1p-11; }

// Normal values of `shape` rounded to dtype dt.
Tensor half_randn(const Shape& shape, DType dt, uint64_t seed) {
  Generator gen(seed);
  return cast_copy(randn(shape, DType::f32, gen), dt);
}

Tensor f32(const Tensor& t) { return t.defined() ? cast_copy(t, DType::f32) : t; }

// got (16-bit) against the float32 result ref rounded to got's dtype: at most `ulps` units of
// the dtype's rounding of |ref| apart (the float32 sums may be ordered differently, which can
// move a rounding by one ulp) plus `abs_tol` times the largest |ref| (for the attention's P
// rounded to the dtype before its matmul with V).
void check_close(const Tensor& got, const Tensor& ref32, const std::string& what, double ulps = 2,
                 double abs_tol = 0) {
  BOOST_TEST_CONTEXT(what) {
    BOOST_REQUIRE(got.shape() == ref32.shape());
    const double u = unit_roundoff(got.dtype());
    const auto g = got.to_vector<double>(), r = cast_copy(ref32, got.dtype()).to_vector<double>();
    double mx = 0;
    for (double v : r)
      if (std::isfinite(v)) mx = std::max(mx, std::fabs(v));
    int bad = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      const double tol = ulps * 2 * u * std::fabs(r[i]) + abs_tol * mx + 1e-30;
      const bool same = g[i] == r[i] || (std::isnan(g[i]) && std::isnan(r[i]));
      if (!same && !(std::fabs(g[i] - r[i]) <= tol) && bad++ < 5)
        BOOST_ERROR("element " << i << ": got " << g[i] << ", want " << r[i]);
    }
  }
}

// op on 16-bit inputs without a tape, against op on their float32 values: close, in the 16-bit
// dtype, and with no float32 detour taken.
void check_native(const std::string& what, DType dt, const Tensors& in,
                  const std::function<Tensor(const Tensors&)>& op, double ulps = 2,
                  double abs_tol = 0) {
  autograd::NoGrad no_tape;
  const uint64_t before = kern::f32_detours();
  const Tensor got = op(in);
  BOOST_TEST(kern::f32_detours() == before, what << ": went through float32 copies");
  BOOST_TEST((got.dtype() == dt), what << ": output dtype " << dtype_name(got.dtype()));
  Tensors in32;
  for (const Tensor& t : in) in32.push_back(f32(t));
  check_close(got, op(in32), what + " (" + dtype_name(dt) + ")", ulps, abs_tol);
}

const DType kDtypes[] = {DType::bf16, DType::f16};

}  // namespace

BOOST_AUTO_TEST_CASE(norms_match_float32) {
  for (DType dt : kDtypes) {
    const Tensor x = half_randn({5, 37}, dt, 1), r = half_randn({5, 37}, dt, 2);
    const Tensor w = half_randn({37}, dt, 3), b = half_randn({37}, dt, 4);
    check_native("layer_norm", dt, {x, w, b},
                 [](const Tensors& t) { return layer_norm(t[0], t[1], t[2], 1e-5); });
    check_native("layer_norm without w, b", dt, {x},
                 [](const Tensors& t) { return layer_norm(t[0], Tensor(), Tensor(), 1e-5); });
    check_native("add_layer_norm", dt, {x, r, w, b},
                 [](const Tensors& t) { return add_layer_norm(t[0], t[1], t[2], t[3], 1e-5); });
    check_native("rms_norm", dt, {x, w},
                 [](const Tensors& t) { return rms_norm(t[0], t[1], 1e-6); });
  }
}

BOOST_AUTO_TEST_CASE(softmax_matches_float32) {
  for (DType dt : kDtypes) {
    const Tensor x = affine(half_randn({3, 4, 53}, dt, 5), 3, 0);
    for (int64_t axis : {-1, 1, 0}) {
      const std::string at = " axis " + std::to_string(axis);
      check_native("softmax" + at, dt, {x},
                   [axis](const Tensors& t) { return softmax(t[0], axis); });
      check_native("log_softmax" + at, dt, {x},
                   [axis](const Tensors& t) { return log_softmax(t[0], axis); });
    }
    // A small result next to a large one, to the ulp (0.5: within half an ulp, so equal) of the
    // float64 result (oneDNN's float32 logsoftmax loses it too): x - (mx + log(sum)) rounded
    // -4.54e-5 2 bf16 ulps off.
    const Tensor big = cast_copy(from_vector(std::vector<double>{10, 0}, {1, 2}, DType::f32), dt);
    autograd::NoGrad no_tape;
    check_close(log_softmax(big, -1), log_softmax(cast_copy(big, DType::f64), -1),
                "log_softmax [10, 0]", 0.5);
  }
}

BOOST_AUTO_TEST_CASE(elementwise_matches_float32) {
  for (DType dt : kDtypes) {
    const Tensor a = half_randn({2, 3, 37}, dt, 6), row = half_randn({37}, dt, 7);
    const Tensor col = half_randn({3, 1}, dt, 8), c = affine(half_randn({2, 3, 37}, dt, 9), 1, 4);
    check_native("add (bias row)", dt, {a, row}, [](const Tensors& t) { return add(t[0], t[1]); });
    check_native("sub (column)", dt, {a, col}, [](const Tensors& t) { return sub(t[0], t[1]); });
    check_native("mul (column first)", dt, {col, a},
                 [](const Tensors& t) { return mul(t[0], t[1]); });
    check_native("div", dt, {a, c}, [](const Tensors& t) { return div(t[0], t[1]); });
    // Non-contiguous and offset operands of the binary broadcast loop: a transposed view, a
    // strided slice that starts past the storage's first element, a sliced column.
    const Tensor at = half_randn({37, 3, 2}, dt, 17), wide = half_randn({2, 4, 40}, dt, 18);
    check_native("add (transposed + sliced)", dt, {at, wide}, [](const Tensors& t) {
      return add(transpose(t[0], 0, 2), slice(slice(t[1], 1, 1, 4), 2, 2, 39));
    });
    check_native("mul (sliced column * transposed)", dt, {wide, at}, [](const Tensors& t) {
      return mul(slice(slice(t[0], 1, 1, 4), 2, 5, 6), transpose(t[1], 0, 2));
    });
    check_native("relu", dt, {a}, [](const Tensors& t) { return relu(t[0]); });
    check_native("gelu", dt, {a}, [](const Tensors& t) { return gelu(t[0]); });
    check_native("gelu_tanh", dt, {a}, [](const Tensors& t) { return gelu(t[0], true); });
    check_native("affine", dt, {a}, [](const Tensors& t) { return affine(t[0], 22.6, 0.5); });
    check_native("exp", dt, {a}, [](const Tensors& t) { return exp(t[0]); });
  }
}

namespace {

// Attention of q (B, H, Tq, D) over k, v (B, H, Tk, D / Dv) with a padding mask, causal or not,
// with a bias broadcast over the batch, in `dt`, against float32.
void check_attention(DType dt, int64_t Tq, bool causal, double abs_tol) {
  const int64_t B = 2, H = 3, Tk = 19, D = 13, Dv = 11;
  const Tensor q = half_randn({B, H, Tq, D}, dt, 10), k = half_randn({B, H, Tk, D}, dt, 11);
  const Tensor v = half_randn({B, H, Tk, Dv}, dt, 12), bias = half_randn({H, Tq, Tk}, dt, 13);
  std::vector<double> pad(B * Tk, 0.0);
  pad[Tk - 1] = pad[Tk + 2] = 1;
  const Tensor mask = from_vector(pad, {B, Tk}, DType::f32);
  const std::string what = "attention Tq " + std::to_string(Tq) + (causal ? " causal" : "");
  for (bool weights : {false, true}) {
    auto run = [&](const Tensors& t) {
      AttentionOptions o;
      o.causal = causal;
      o.key_padding_mask = mask;
      o.bias = t[3];
      o.return_weights = weights;
      const AttentionResult r = scaled_dot_product_attention(t[0], t[1], t[2], o);
      return weights ? r.weights : r.out;
    };
    check_native(what + (weights ? " weights" : " out"), dt, {q, k, v, bias}, run, 2,
                 weights ? 0 : abs_tol);
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(attention_matches_float32) {
  for (DType dt : kDtypes) {
    // One query row (cached decoding): the loop reads the 16-bit cache, sums in float32.
    check_attention(dt, 1, true, 0);
    check_attention(dt, 3, false, 0);
    // More rows: P is rounded to the dtype before P V (as a 16-bit matmul operand).
    check_attention(dt, 7, true, 2 * unit_roundoff(dt));
    check_attention(dt, 7, false, 2 * unit_roundoff(dt));
  }
}

// A recorded call keeps the float32 detour (its tape entries and backward are float32's), and
// the gradient reaches the 16-bit input in its dtype.
BOOST_AUTO_TEST_CASE(recorded_calls_go_through_float32) {
  const Tensor x = half_randn({4, 21}, DType::bf16, 14).requires_grad_();
  const uint64_t before = kern::f32_detours();
  Tensor y = sum(layer_norm(relu(x), Tensor(), Tensor(), 1e-5));
  BOOST_TEST(kern::f32_detours() >= before + 2);
  y.backward();
  BOOST_TEST((x.grad().dtype() == DType::bf16));
}

// The dtype checks are those of the float32 detour: mixed float dtypes are refused by name.
BOOST_AUTO_TEST_CASE(mixed_dtypes_refused) {
  autograd::NoGrad no_tape;
  Generator gen(1);
  const Tensor x = half_randn({2, 5}, DType::bf16, 15), w = randn({5}, DType::f32, gen);
  auto says = [](const std::string& want) {
    return [want](const Error& e) { return std::string(e.what()).find(want) != std::string::npos; };
  };
  BOOST_CHECK_EXCEPTION(layer_norm(x, w, Tensor(), 1e-5), Error,
                        says("layer_norm: dtype mismatch"));
  BOOST_CHECK_EXCEPTION(add(x, w), Error, says("add: dtype mismatch"));
  BOOST_CHECK_EXCEPTION(add_layer_norm(x, cast_copy(x, DType::f16), Tensor(), Tensor(), 1e-5),
                        Error, says("add_layer_norm: dtype mismatch"));
}

// Non-finite inputs give what the float32 path gives: a row of -inf (a fully masked row), NaN
// and +-inf among finite values, in softmax, log_softmax, max and argmax along both axes.
BOOST_AUTO_TEST_CASE(non_finite_match_float32) {
  const double inf = INFINITY, nan = NAN;
  const std::vector<double> v{-inf, -inf, -inf, -inf, 1, nan, 3, 2, 5, inf, 0, -inf};
  for (DType dt : kDtypes) {
    const Tensor x = cast_copy(from_vector(v, {3, 4}, DType::f32), dt);
    for (int64_t axis : {1, 0}) {
      const std::string at = " axis " + std::to_string(axis);
      check_native("softmax (non-finite)" + at, dt, {x},
                   [axis](const Tensors& t) { return softmax(t[0], axis); });
      check_native("log_softmax (non-finite)" + at, dt, {x},
                   [axis](const Tensors& t) { return log_softmax(t[0], axis); });
      check_native(
          "max (non-finite)" + at, dt, {x}, [axis](const Tensors& t) { return max(t[0], axis); },
          0);
      autograd::NoGrad no_tape;
      BOOST_TEST(argmax(x, axis).to_vector<int64_t>() == argmax(f32(x), axis).to_vector<int64_t>(),
                 boost::test_tools::per_element());
    }
  }
}

// max and argmax of 16-bit tensors (greedy decoding's pick from a bf16 model's logits) compare
// the values exactly, without a float32 copy.
BOOST_AUTO_TEST_CASE(max_and_argmax_native) {
  for (DType dt : kDtypes) {
    const Tensor x = half_randn({3, 41}, dt, 16);
    check_native(
        "max", dt, {x}, [](const Tensors& t) { return max(t[0], 1); }, 0);
    check_native(
        "max axis 0", dt, {x}, [](const Tensors& t) { return max(t[0], 0, true); }, 0);
    autograd::NoGrad no_tape;
    const uint64_t before = kern::f32_detours();
    const auto got = argmax(x, 1).to_vector<int64_t>();
    BOOST_TEST(kern::f32_detours() == before);
    BOOST_TEST(got == argmax(f32(x), 1).to_vector<int64_t>(), boost::test_tools::per_element());
  }
}

// ---- recorded 16-bit calls: one 16-bit tape entry (kern::widened) ----

namespace {

size_t saved_bytes(const std::string& op) {
  for (const auto& r : autograd::saved_bytes_by_op())
    if (r.op == op) return r.bytes;
  return 0;
}

size_t saved_entries(const std::string& op) {
  for (const auto& r : autograd::saved_bytes_by_op())
    if (r.op == op) return r.entries;
  return 0;
}

// The ops with a 16-bit tape entry of their own, each on one tensor x (B, H, T, D) of dtype dt
// and the same constants rounded to the 16-bit dtype `half` (then cast to dt); the generators
// start equal.
struct Recorded {
  const char* op;
  std::function<Tensor(const Tensor& x, DType dt)> run;
};

std::vector<Recorded> recorded_ops(DType half) {
  Generator gen(5);
  const Tensor w = affine(rand({24}, DType::f32, gen), 1.0, 0.5);
  const Tensor r = randn({2, 3, 16, 24}, DType::f32, gen);
  auto on = [half](const Tensor& t, DType dt) { return cast_copy(cast_copy(t, half), dt); };
  return {
      {"scaled_dot_product_attention",
       [](const Tensor& x, DType) {
         Generator gen(7);
         AttentionOptions o;
         o.dropout = 0.25;
         o.generator = &gen;
         return scaled_dot_product_attention(x, x, x, o).out;
       }},
      {"relu_dropout",
       [](const Tensor& x, DType) {
         Generator gen(9);
         return relu_dropout(x, 0.25, true, gen);
       }},
      {"add_layer_norm",  // xhat rebuilt from y
       [w, r, on](const Tensor& x, DType dt) {
         return add_layer_norm(x, on(r, dt), on(w, dt), on(affine(w, 0.1, 0), dt));
       }},
      {"add_layer_norm",  // b > w: x and r kept
       [w, r, on](const Tensor& x, DType dt) {
         return add_layer_norm(x, on(r, dt), on(w, dt), on(affine(w, 100, 0), dt));
       }},
      {"layer_norm",  // xhat rebuilt from y
       [w, on](const Tensor& x, DType dt) {
         return layer_norm(x, on(w, dt), on(affine(w, 0.1, 0), dt));
       }},
      {"layer_norm",  // b > w: x kept
       [w, on](const Tensor& x, DType dt) {
         return layer_norm(x, on(w, dt), on(affine(w, 100, 0), dt));
       }},
  };
}

// (|a - b|) / (|b|) over all elements, a and b read as float64.
double rel_diff(const Tensor& a, const Tensor& b) {
  const auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  double d = 0, n = 0;
  for (size_t i = 0; i < va.size(); ++i) d += (va[i] - vb[i]) * (va[i] - vb[i]), n += vb[i] * vb[i];
  return std::sqrt(d / std::max(n, 1e-30));
}

}  // namespace

// A recorded 16-bit attention, relu_dropout, add_layer_norm or layer_norm saves 16-bit tensors
// (and a bit per element for relu_dropout), no float32 copy: through kern::via_f32 the float32
// entries saved float32 copies of q, k and v (12 bytes an element of x here), relu_dropout's
// float32 output (4), add_layer_norm's float32 y or sum (4) and layer_norm's float32 y or x (4).
BOOST_AUTO_TEST_CASE(recorded_16_bit_ops_save_no_float32_copies) {
  for (DType dt : kDtypes) {
    const Tensor x0 = half_randn({2, 3, 16, 24}, dt, 21);
    const size_t n = x0.numel(), rows = n / 24;
    const size_t most[] = {n * 2,
                           n / 8 + 1,
                           n * 2 + 4 * 24 + 10 * rows,
                           n * 4 + 4 * 24 + 10 * rows,  // x and r, no rounded sum
                           n * 2 + 4 * 24 + 10 * rows,
                           n * 2 + 4 * 24 + 10 * rows};
    const auto ops = recorded_ops(dt);
    for (size_t i = 0; i < ops.size(); ++i) {
      const Tensor leaf = x0.detach().requires_grad_();
      const Tensor x = affine(leaf, 2.0, 0.0);  // not a leaf; affine keeps nothing
      const uint64_t before = kern::f32_detours();
      const size_t casts = saved_entries("to_dtype");  // other tests' entries may be live
      const Tensor y = ops[i].run(x, dt);
      // The float32 arithmetic on float32 copies, counted once (relu_dropout's runs element by
      // element on the 16-bit tensors: no copy).
      BOOST_TEST(kern::f32_detours() ==
                 before + (ops[i].op == std::string("relu_dropout") ? 0 : 1));
      BOOST_TEST((y.dtype() == dt));
      const size_t saved = saved_bytes(ops[i].op);
      BOOST_TEST_INFO(ops[i].op << " case " << i << " " << describe(x));
      BOOST_TEST(saved <= most[i]);
      BOOST_TEST(saved_entries("to_dtype") == casts);  // no cast around a float32 entry
      sum(y).backward();
      BOOST_TEST((leaf.grad().dtype() == dt));
    }
  }
}

// The same entries differentiate twice: with L = sum(f(x) c), the gradient of sum(dL/dx v)
// with respect to x and to c (a Hessian-vector product and J v) matches float32 math on the
// same 16-bit values within the 16-bit dtype's rounding.
BOOST_AUTO_TEST_CASE(recorded_16_bit_ops_differentiate_twice) {
  for (DType dt : kDtypes) {
    const double tol = 40 * unit_roundoff(dt);
    const Tensor x0 = half_randn({2, 3, 16, 24}, dt, 31), c0 = half_randn(x0.shape(), dt, 32);
    const Tensor v0 = half_randn(x0.shape(), dt, 33);
    for (const Recorded& r : recorded_ops(dt)) {
      auto second = [&](DType d) {
        const Tensor x = cast_copy(x0, d).requires_grad_(), c = cast_copy(c0, d).requires_grad_();
        const Tensor loss = sum(mul(r.run(x, d), c));
        const Tensor gx = autograd::grad({loss}, {x}, {}, {.create_graph = true})[0];
        return autograd::grad({sum(mul(gx, cast_copy(v0, d)))}, {x, c}, {}, {.allow_unused = true});
      };
      const Tensors h = second(dt), f = second(DType::f32);
      BOOST_TEST_INFO(r.op << " " << dtype_name(dt));
      BOOST_TEST((h[1].dtype() == dt));
      BOOST_TEST(rel_diff(h[1], f[1]) < tol);
      BOOST_TEST(h[0].defined() == f[0].defined());
      if (h[0].defined() && f[0].defined()) BOOST_TEST(rel_diff(h[0], f[0]) < tol);
    }
  }
}

namespace {

// The gradients of sum(norm(x) dy) for x, r (add_layer_norm only), w, b on the 16-bit values
// x0, r0, w0, b0, dy0 cast to d: layer_norm(x, w, b) or add_layer_norm(x, r, w, b).
Tensors norm_grads(DType d, bool with_r, const Tensors& v) {
  Tensors in;
  for (const Tensor& t : v) in.push_back(cast_copy(t, d).requires_grad_());
  const Tensor y =
      with_r ? add_layer_norm(in[0], in[1], in[2], in[3]) : layer_norm(in[0], in[2], in[3]);
  const Tensor loss = sum(mul(y, cast_copy(v[4], d).detach()));
  return autograd::grad(
      {loss}, with_r ? Tensors{in[0], in[1], in[2], in[3]} : Tensors{in[0], in[2], in[3]});
}

}  // namespace

// First-order gradients of a recorded 16-bit layer_norm / add_layer_norm match float32 math on
// the same 16-bit values within the dtype's rounding, where rebuilding xhat from a 16-bit y
// would not be exact enough (a channel with w = 0.02, b = 1: 50 |w|) and where the x + r kept
// as a rounded 16-bit sum would not be (rows of 100 +- 1 and a channel with b = 100 |w|).
BOOST_AUTO_TEST_CASE(recorded_16_bit_norms_first_order_match_float32) {
  for (DType dt : kDtypes) {
    for (double shift : {50.0, 100.0}) {
      Generator gen(41);
      const Tensor x0 = cast_copy(affine(randn({64, 24}, DType::f32, gen), 1.0, 100.0), dt);
      const Tensor r0 = cast_copy(randn({64, 24}, DType::f32, gen), dt);
      std::vector<float> w(24, 1.0f), b(24, 0.1f);
      w[0] = 0.02f, b[0] = (float)(0.02 * shift);
      const Tensor dy0 = cast_copy(randn({64, 24}, DType::f32, gen), dt);
      const Tensors v{x0, r0, cast_copy(from_vector(w, {24}), dt),
                      cast_copy(from_vector(b, {24}), dt), dy0};
      for (bool with_r : {false, true}) {
        const Tensors h = norm_grads(dt, with_r, v), f = norm_grads(DType::f32, with_r, v);
        for (size_t i = 0; i < h.size(); ++i)
          check_close(h[i], f[i],
                      std::string(with_r ? "add_layer_norm" : "layer_norm") + " grad " +
                          std::to_string(i) + " b/w " + std::to_string(shift) + " " +
                          dtype_name(dt),
                      2, unit_roundoff(dt));
      }
    }
  }
}

// Every recorded 16-bit op's first-order gradient matches float32 math on the same 16-bit
// values (constants rounded too) within the dtype's rounding.
BOOST_AUTO_TEST_CASE(recorded_16_bit_ops_first_order_match_float32) {
  for (DType dt : kDtypes) {
    const Tensor x0 = half_randn({2, 3, 16, 24}, dt, 51), c0 = half_randn(x0.shape(), dt, 52);
    for (const Recorded& r : recorded_ops(dt)) {
      auto first = [&](DType d) {
        const Tensor x = cast_copy(x0, d).requires_grad_();
        return autograd::grad({sum(mul(r.run(x, d), cast_copy(c0, d)))}, {x})[0];
      };
      const Tensor h = first(dt), f = first(DType::f32);
      BOOST_TEST_INFO(r.op << " " << dtype_name(dt));
      BOOST_TEST(rel_diff(h, f) < 8 * unit_roundoff(dt));
    }
  }
}

// relu_dropout's 16-bit entry under create_graph gives the first-order gradient bit for bit:
// dout times mask / (1 - p) in float32, rounded once (not 1 / (1 - p) rounded to the dtype).
BOOST_AUTO_TEST_CASE(recorded_16_bit_relu_dropout_create_graph_keeps_scale) {
  for (DType dt : kDtypes) {
    const Tensor x0 = half_randn({64, 24}, dt, 61), c0 = half_randn(x0.shape(), dt, 62);
    auto grad = [&](bool create) {
      Generator gen(3);
      const Tensor x = x0.detach().requires_grad_();
      const Tensor loss = sum(mul(relu_dropout(x, 0.1, true, gen), c0));
      return autograd::grad({loss}, {x}, {}, {.create_graph = create})[0].detach();
    };
    check_close(grad(true), f32(grad(false)), std::string("relu_dropout ") + dtype_name(dt), 0);
  }
}

// The gradient of a broadcast 16-bit attention bias is summed in float32 and rounded once: it
// equals float32 math on the same 16-bit values rounded (a sum of dS rounded per element
// misses by an ulp here and there).
BOOST_AUTO_TEST_CASE(recorded_16_bit_attention_bias_gradient_summed_in_float32) {
  for (DType dt : kDtypes) {
    const Tensor q0 = half_randn({4, 4, 16, 8}, dt, 71), bias0 = half_randn({1, 1, 16, 16}, dt, 72);
    const Tensor c0 = half_randn({4, 4, 16, 8}, dt, 73);
    auto grad = [&](DType d) {
      const Tensor q = cast_copy(q0, d), bias = cast_copy(bias0, d).requires_grad_();
      AttentionOptions o;
      o.bias = bias;
      const Tensor out = scaled_dot_product_attention(q, q, q, o).out;
      return autograd::grad({sum(mul(out, cast_copy(c0, d)))}, {bias})[0];
    };
    check_close(grad(dt), grad(DType::f32), std::string("attention dbias ") + dtype_name(dt), 0);
  }
}

// A 16-bit layer_norm / add_layer_norm entry under create_graph sums dw and db over the rows in
// float32 and rounds once, as its first-order backward does: the two agree to the dtype's
// rounding (the tape summing dy * xhat rounded per element was ulps off).
BOOST_AUTO_TEST_CASE(recorded_16_bit_norms_create_graph_sum_dw_in_float32) {
  for (DType dt : kDtypes) {
    Generator gen(81);
    const Tensor w = cast_copy(affine(rand({24}, DType::f32, gen), 1.0, 0.5), dt);
    const Tensor x = half_randn({256, 24}, dt, 82), r = half_randn({256, 24}, dt, 83);
    const Tensors in{x, r, w, cast_copy(affine(w, 0.1, 0), dt), half_randn({256, 24}, dt, 84)};
    for (bool with_r : {false, true}) {
      auto grads = [&](bool create) {
        Tensors p;
        for (const Tensor& t : in) p.push_back(t.detach().requires_grad_());
        const Tensor y =
            with_r ? add_layer_norm(p[0], p[1], p[2], p[3]) : layer_norm(p[0], p[2], p[3]);
        return autograd::grad({sum(mul(y, in[4]))}, {p[2], p[3]}, {}, {.create_graph = create});
      };
      const Tensors a = grads(true), b = grads(false);
      for (size_t i = 0; i < 2; ++i)
        check_close(a[i].detach(), f32(b[i]),
                    std::string(with_r ? "add_layer_norm" : "layer_norm") + (i ? " db " : " dw ") +
                        dtype_name(dt),
                    0);
    }
  }
}

// relu_dropout's 16-bit entry holds no float32 tensor: its forward peaks at about 2 bytes an
// element of x (the 16-bit out and a bit per element), the backward pass at under 4 (16-bit
// tensors: dx and the pass's own); through float32 copies they peaked at 8 (x widened, the
// float32 out) and 10 (dout widened, the float32 dx, dx). Its values are float32's on the same
// 16-bit values, rounded once.
BOOST_AUTO_TEST_CASE(recorded_16_bit_relu_dropout_holds_no_float32_tensor) {
  for (DType dt : kDtypes) {
    const Tensor x0 = half_randn({256, 96}, dt, 71), g = half_randn(x0.shape(), dt, 72);
    const size_t n = x0.numel();
    Generator gen(5);
    const Tensor x = x0.detach().requires_grad_();
    size_t live = Storage::live_bytes();
    Storage::reset_peak_live_bytes();
    const Tensor y = relu_dropout(x, 0.1, true, gen);
    const size_t forward_peak = Storage::peak_live_bytes() - live;
    live = Storage::live_bytes();
    Storage::reset_peak_live_bytes();
    const Tensor dx = autograd::grad({y}, {x}, {g})[0];
    const size_t backward_peak = Storage::peak_live_bytes() - live;
    BOOST_TEST_INFO(dtype_name(dt));
    BOOST_TEST(forward_peak <= n * 2 + n / 8 + 8192);
    BOOST_TEST(backward_peak <= n * 4 + 8192);
    Generator gen32(5);
    const Tensor x32 = f32(x0).requires_grad_();
    const Tensor y32 = relu_dropout(x32, 0.1, true, gen32);
    check_close(y, y32, std::string("relu_dropout forward ") + dtype_name(dt), 0);
    const Tensor dx32 = autograd::grad({y32}, {x32}, {f32(g)})[0];
    check_close(dx, dx32, std::string("relu_dropout backward ") + dtype_name(dt), 0);
  }
}

// linear_cross_entropy of 16-bit x and w on the tape saves 16-bit tensors (dx, dw, x and w: 4
// bytes an element of x and w, and the targets); through kern::via_f32 its float32 entry saved
// float32 dx and dw (8 bytes) beside float32 copies of x and w; f16 keeps that entry (below).
// Its first-order gradients are
// float32's on the same values rounded once; under create_graph they agree within an ulp.
BOOST_AUTO_TEST_CASE(recorded_16_bit_linear_cross_entropy_saves_16_bit_tensors) {
  const int64_t N = 70, V = 37, d = 24;
  std::vector<int64_t> tv(N);
  for (int64_t i = 0; i < N; ++i) tv[i] = (i * 7) % V;
  tv[3] = -100;  // ignored
  const Tensor t = from_vector(tv, {N});
  for (DType dt : kDtypes) {
    const Tensor x0 = half_randn({N, d}, dt, 81), w0 = half_randn({V, d}, dt, 82);
    auto grads = [&](DType in, bool create) {
      const Tensor x = cast_copy(x0, in).requires_grad_(), w = cast_copy(w0, in).requires_grad_();
      const double before = (double)saved_bytes("linear_cross_entropy");  // others' still live
      const Tensor loss = linear_cross_entropy(x, w, t, 0.1, -100, 16);   // 5 chunks
      if (in == DType::bf16)  // f16 keeps via_f32's float32 entry (see below)
        BOOST_TEST((double)saved_bytes("linear_cross_entropy") - before <= (N + V) * d * 4 + N * 8);
      const Tensors g = autograd::grad({loss}, {x, w}, {}, {.create_graph = create});
      return Tensors{g[0].detach(), g[1].detach()};
    };
    const Tensors g16 = grads(dt, false), g32 = grads(DType::f32, false), gc = grads(dt, true);
    for (size_t i = 0; i < 2; ++i) {
      const std::string what = std::string(i ? "dw " : "dx ") + dtype_name(dt);
      BOOST_TEST((g16[i].dtype() == dt));
      check_close(g16[i], g32[i], what, 0);
      check_close(gc[i], g32[i], what + " under create_graph", 1);
    }
  }
}

namespace {

// x (70, 24), w (37, 24) and targets (one ignored) for the linear_cross_entropy cases below.
struct LceCase {
  Tensor x0, w0, t;
};
LceCase lce_case(DType dt) {
  const int64_t N = 70, V = 37, d = 24;
  std::vector<int64_t> tv(N);
  for (int64_t i = 0; i < N; ++i) tv[i] = (i * 7) % V;
  tv[3] = -100;
  return {half_randn({N, d}, dt, 91), half_randn({V, d}, dt, 92), from_vector(tv, {N})};
}

// dx and dw of linear_cross_entropy on x0, w0 cast to `in`, for an upstream gradient dloss.
Tensors lce_grads(const LceCase& k, DType in, const Tensor& dloss, bool create = false) {
  const Tensor x = cast_copy(k.x0, in).requires_grad_(), w = cast_copy(k.w0, in).requires_grad_();
  const Tensor loss = linear_cross_entropy(x, w, k.t, 0.1, -100, 16);
  const Tensors g =
      autograd::grad({loss}, {x, w}, {cast_copy(dloss, in)}, {.create_graph = create});
  return {g[0].detach(), g[1].detach()};
}

}  // namespace

// An upstream gradient other than 1 (a data-parallel shard's scale, loss / k in gradient
// accumulation): f16 gradients are float32's times dloss rounded once, exactly (loss scaling
// must reach entries that would underflow in f16); bf16's saved bf16 gradients times dloss are
// rounded a second time: within one bf16 ulp of the single rounding.
BOOST_AUTO_TEST_CASE(linear_cross_entropy_16_bit_gradients_scaled_by_dloss) {
  for (DType dt : kDtypes)
    for (double s : {0.75, 1.0 / 3.0}) {
      const LceCase k = lce_case(dt);
      const Tensor dloss = cast_copy(scalar(s, DType::f32), dt);
      const Tensors g16 = lce_grads(k, dt, dloss), g32 = lce_grads(k, DType::f32, dloss);
      for (size_t i = 0; i < 2; ++i)
        check_close(g16[i], g32[i],
                    std::string(i ? "dw " : "dx ") + dtype_name(dt) + " dloss " + std::to_string(s),
                    dt == DType::bf16 ? 1 : 0);
    }
}

// Under create_graph the backward runs the float32 op again under the precision setting of the
// forward, not the one in force when backward runs: the same gradients as a backward under the
// forward's guard.
BOOST_AUTO_TEST_CASE(linear_cross_entropy_16_bit_create_graph_keeps_forward_precision) {
  const LceCase k = lce_case(DType::bf16);
  const Tensor one = scalar(1.0, DType::bf16);
  const Tensors inside = [&] {
    PrecisionGuard g(Precision::bf16, Bf16Path::reference);
    return lce_grads(k, DType::bf16, one, true);
  }();
  const Tensor x = k.x0.detach().requires_grad_(), w = k.w0.detach().requires_grad_();
  Tensor loss;
  {
    PrecisionGuard g(Precision::bf16, Bf16Path::reference);
    loss = linear_cross_entropy(x, w, k.t, 0.1, -100, 16);
  }
  const Tensors outside = autograd::grad({loss}, {x, w}, {}, {.create_graph = true});
  check_close(outside[0], inside[0], "dx", 0);
  check_close(outside[1], inside[1], "dw", 0);
}

// Second order through the bf16 entry: the gradient of sum(dw^2) with respect to x matches
// float32 math on the same bf16 values within bf16's rounding.
BOOST_AUTO_TEST_CASE(linear_cross_entropy_16_bit_differentiates_twice) {
  const LceCase k = lce_case(DType::bf16);
  auto second = [&](DType d) {
    const Tensor x = cast_copy(k.x0, d).requires_grad_(), w = cast_copy(k.w0, d).requires_grad_();
    const Tensor loss = linear_cross_entropy(x, w, k.t, 0.1, -100, 16);
    const Tensor dw = autograd::grad({loss}, {w}, {}, {.create_graph = true})[0];
    return autograd::grad({sum(mul(dw, dw))}, {x})[0];
  };
  const Tensor h = second(DType::bf16), f = second(DType::f32);
  BOOST_TEST((h.dtype() == DType::bf16));
  BOOST_TEST(rel_diff(h, f) < 40 * unit_roundoff(DType::bf16));
}
