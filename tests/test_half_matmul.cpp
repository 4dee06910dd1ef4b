// Matmuls of 16-bit tensors (DType::bf16, DType::f16): matmul, linear, linear_weight_grad and
// kern::matmul_into forward and backward against float64 on the same (16-bit) values, each
// element within the dtype's output rounding (2^-8 relative for bf16, 2^-11 for f16) plus float32
// accumulation over K terms; outputs and gradients in the operands' dtype; a bf16 linear in
// inference holding no float32 copy of its weight; dtype mismatches refused by name. ctest runs it
// as is (bf16 on oneDNN's kernel on an AVX512_BF16 CPU) and under DNNL_MAX_CPU_ISA=AVX512_CORE and
// AVX2 (no bf16 kernel: float32 on widened operands). Which path ran is printed.
#include <malloc.h>

#include <boost/test/unit_test.hpp>
#include <cmath>
#include <iostream>

#include "graft/autograd/tape.h"
#include "graft/ops/custom.h"
#include "graft/ops/ops.h"
#include "graft/ops/precision.h"
#include "tests/test_util.h"

using namespace graft;
using graft::testing::names_all;
using graft::testing::tview;

namespace {

const bool said = [] {
  std::cout << "test_half_matmul: " << half_matmul_description(DType::bf16) << "\n"
            << "test_half_matmul: " << half_matmul_description(DType::f16) << std::endl;
  return true;
}();

// The unit roundoff of a 16-bit dtype: half its ulp at 1.
double unit_roundoff(DType dt) { return dt == DType::bf16 ? 0x1p-8 : 0x1p-11; }

// Normal values of `shape` rounded to dtype dt (the 16-bit tensor every test starts from).
Tensor half_randn(const Shape& shape, DType dt, uint64_t seed) {
  Generator gen(seed);
  return cast_copy(randn(shape, DType::f32, gen), dt);
}

Tensor f64(const Tensor& t) { return cast_copy(t, DType::f64); }

// got (16-bit or float32) against float64 ref, elementwise: |got - ref| <= u |ref| (its own
// rounding, u = 0 for a float32 got) + K 2^-22 mag, where mag = sum |a_k b_k| of the products
// the element sums (float32 accumulation over K terms, with a factor 4 of slack for the
// kernels' summation orders).
void check_against(const Tensor& got, const Tensor& ref, const Tensor& mag, int64_t K,
                   const char* what) {
  BOOST_REQUIRE(got.shape() == ref.shape());
  const double u = is_half(got.dtype()) ? unit_roundoff(got.dtype()) : 0;
  const auto g = got.to_vector<double>(), r = ref.to_vector<double>(), m = mag.to_vector<double>();
  int bad = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double tol = u * std::fabs(r[i]) + (double)K * 0x1p-22 * m[i] + 1e-30;
    if (!(std::fabs(g[i] - r[i]) <= tol) && bad++ < 5)
      BOOST_ERROR(what << ": element " << i << " got " << g[i] << ", want " << r[i] << " (tol "
                       << tol << ")");
  }
}

// matmul of 16-bit operands against float64 matmul of their values.
void check_matmul(const Tensor& a, const Tensor& b, const char* what) {
  const Tensor y = matmul(a, b);
  BOOST_CHECK(y.dtype() == a.dtype());
  check_against(y, matmul(f64(a), f64(b)), matmul(abs(f64(a)), abs(f64(b))), a.shape().back(),
                what);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(half_matmul)

BOOST_AUTO_TEST_CASE(matmul_forward_shapes) {
  for (DType dt : {DType::bf16, DType::f16}) {
    check_matmul(half_randn({33, 70}, dt, 1), half_randn({70, 45}, dt, 2), "2-D");
    check_matmul(half_randn({3, 1, 9, 20}, dt, 3), half_randn({4, 20, 7}, dt, 4), "broadcast");
    check_matmul(tview(half_randn({2, 17, 40}, dt, 5)), half_randn({2, 17, 6}, dt, 6),
                 "transposed a");
    check_matmul(half_randn({5, 64}, dt, 7), tview(half_randn({31, 64}, dt, 8)), "transposed b");
    check_matmul(half_randn({6, 12}, dt, 9), half_randn({12}, dt, 10), "1-D b");
    check_matmul(half_randn({12}, dt, 11), half_randn({2, 12, 5}, dt, 12), "1-D a");
  }
}

BOOST_AUTO_TEST_CASE(matmul_into_f32_out_with_alpha_and_accumulate) {
  for (DType dt : {DType::bf16, DType::f16}) {
    const Tensor a = half_randn({2, 9, 30}, dt, 20), b = half_randn({2, 30, 11}, dt, 21);
    const Tensor start = randn({2, 9, 11}, DType::f32);
    Tensor out = contiguous_copy(start);
    kern::matmul_into(a, b, out, 0.5, /*accumulate=*/true);
    BOOST_CHECK(out.dtype() == DType::f32);
    const Tensor ref = add(f64(start), mul(matmul(f64(a), f64(b)), full({1}, 0.5, DType::f64)));
    check_against(out, ref, matmul(abs(f64(a)), abs(f64(b))), 31, "matmul_into f32 out");
    Tensor out16 = cast_copy(start, dt);  // a 16-bit out: the sum rounded once
    kern::matmul_into(a, b, out16, 1.0, /*accumulate=*/true);
    check_against(out16, add(f64(cast_copy(start, dt)), matmul(f64(a), f64(b))),
                  matmul(abs(f64(a)), abs(f64(b))), 31, "matmul_into 16-bit out");
  }
}

// 1 and 3 rows take linear's own row loop, 21 oneDNN's matmul (or float32 without the kernel).
BOOST_AUTO_TEST_CASE(linear_forward_inference_and_recorded) {
  for (DType dt : {DType::bf16, DType::f16})
    for (int64_t rows : {1, 3, 21}) {
      const Tensor x = half_randn({rows, 130}, dt, 30 + rows), w = half_randn({40, 130}, dt, 31),
                   b = half_randn({40}, dt, 32);
      const Tensor ref = linear(f64(x), f64(w), f64(b));
      const Tensor mag = add(linear(abs(f64(x)), abs(f64(w))), abs(f64(b)));
      Tensor y;
      {
        autograd::NoGrad no_tape;
        y = linear(x, w, b);
      }
      BOOST_CHECK(y.dtype() == dt);
      check_against(y, ref, mag, 131, "linear inference");
      Tensor xl = contiguous_copy(x);
      xl.requires_grad_();
      check_against(linear(xl, w, b), ref, mag, 131, "linear recorded");
      check_against(linear(x, w), linear(f64(x), f64(w)), linear(abs(f64(x)), abs(f64(w))), 130,
                    "linear without bias");
    }
}

BOOST_AUTO_TEST_CASE(linear_backward_in_the_parameters_dtype) {
  for (DType dt : {DType::bf16, DType::f16}) {
    Tensor x = half_randn({2, 13, 36}, dt, 40), w = half_randn({24, 36}, dt, 41),
           b = half_randn({24}, dt, 42);
    for (Tensor* t : {&x, &w, &b}) t->requires_grad_();
    const Tensor g = half_randn({2, 13, 24}, dt, 43);  // a random upstream gradient
    linear(x, w, b).backward(g);
    for (const Tensor* t : {&x, &w, &b}) BOOST_CHECK(t->grad().dtype() == dt);
    const Tensor g2 = reshape(f64(g), {26, 24}), x2 = reshape(f64(x), {26, 36});
    check_against(x.grad(), matmul(f64(g), f64(w)), matmul(abs(f64(g)), abs(f64(w))), 24, "dx");
    check_against(w.grad(), matmul(transpose(g2, 0, 1), x2),
                  matmul(transpose(abs(g2), 0, 1), abs(x2)), 26, "dw");
    check_against(b.grad(), sum(g2, {0}), sum(abs(g2), {0}), 26, "db");
  }
}

BOOST_AUTO_TEST_CASE(matmul_backward_in_the_operands_dtype) {
  for (DType dt : {DType::bf16, DType::f16}) {
    Tensor a = half_randn({3, 10, 22}, dt, 50), b = half_randn({22, 15}, dt, 51);
    a.requires_grad_();
    b.requires_grad_();
    const Tensor g = half_randn({3, 10, 15}, dt, 52);
    matmul(a, b).backward(g);
    BOOST_CHECK(a.grad().dtype() == dt && b.grad().dtype() == dt);
    check_against(a.grad(), matmul(f64(g), transpose(f64(b), 0, 1)),
                  matmul(abs(f64(g)), transpose(abs(f64(b)), 0, 1)), 15, "da");
    const Tensor a2 = reshape(f64(a), {30, 22}), g2 = reshape(f64(g), {30, 15});
    check_against(b.grad(), matmul(transpose(a2, 0, 1), g2),
                  matmul(transpose(abs(a2), 0, 1), abs(g2)), 30, "db (batch summed)");
  }
}

// Under create_graph linear's backward is recorded ops (matmul, linear_weight_grad): in bf16 too.
BOOST_AUTO_TEST_CASE(linear_create_graph_in_bf16) {
  Tensor x = half_randn({4, 9, 20}, DType::bf16, 60), w = half_randn({16, 20}, DType::bf16, 61);
  x.requires_grad_();
  w.requires_grad_();
  const Tensor g = half_randn({4, 9, 16}, DType::bf16, 62);
  autograd::GradOptions o;
  o.create_graph = true;
  const Tensors d = autograd::grad({linear(x, w)}, {x, w}, {g}, o);
  BOOST_CHECK(d[0].dtype() == DType::bf16 && d[1].dtype() == DType::bf16);
  const Tensor g2 = reshape(f64(g), {36, 16}), x2 = reshape(f64(x), {36, 20});
  check_against(d[0], matmul(f64(g), f64(w)), matmul(abs(f64(g)), abs(f64(w))), 16, "dx");
  check_against(d[1], matmul(transpose(g2, 0, 1), x2), matmul(transpose(abs(g2), 0, 1), abs(x2)),
                36, "dw (linear_weight_grad)");
}

BOOST_AUTO_TEST_CASE(empty_sums) {
  const Tensor x = Tensor::empty({3, 0}, DType::bf16), w = Tensor::empty({4, 0}, DType::bf16);
  const Tensor b = cast_copy(from_vector(std::vector<float>{1, 2, 3, 4}, {4}), DType::bf16);
  BOOST_CHECK(linear(x, w, b).to_vector<double>() ==
              std::vector<double>({1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4}));
  BOOST_CHECK(matmul(x, tview(w)).to_vector<double>() == std::vector<double>(12, 0.0));
}

BOOST_AUTO_TEST_CASE(dtype_mismatches_are_refused_by_name) {
  const Tensor a16 = half_randn({2, 3}, DType::bf16, 70), a32 = randn({3, 2}),
               h16 = half_randn({3, 2}, DType::f16, 71);
  BOOST_CHECK_EXCEPTION(matmul(a16, a32), Error, [](const Error& e) {
    return names_all(e, {"matmul", "dtype mismatch", "bf16", "(2, 3)", "(3, 2)"});
  });
  BOOST_CHECK_EXCEPTION(matmul(a16, h16), Error, [](const Error& e) {
    return names_all(e, {"matmul", "dtype mismatch"});
  });
  BOOST_CHECK_EXCEPTION(linear(a16, randn({4, 3})), Error, [](const Error& e) {
    return names_all(e, {"linear", "dtype mismatch", "(2, 3)", "(4, 3)"});
  });
  BOOST_CHECK_EXCEPTION(
      kern::matmul_into(a16, cast_copy(a32, DType::bf16), zeros({2, 2}, DType::f16)), Error,
      [](const Error& e) {
        return names_all(e, {"matmul_into", "dtype mismatch"});
      });
}

// A bf16 linear of a 4096 x 4096 weight in inference: the weight (2 bytes an element) is all it
// holds, no float32 copy (4 bytes an element) at any point, and nothing kept after. Without a
// bf16 kernel the call widens the weight into a float32 buffer (6 bytes an element at its peak).
BOOST_AUTO_TEST_CASE(bf16_inference_holds_no_float32_weight) {
  const int64_t n = 4096;
  const Tensor w = cast_copy(full({n, n}, 0.01, DType::f32), DType::bf16);
  const Tensor x = half_randn({1, n}, DType::bf16, 80);
  autograd::NoGrad no_tape;
  linear(x, w);  // warm: thread buffers, primitives
  const size_t before = Storage::live_bytes();
  const uint64_t copies = bf16_weight_copies_made();
  Storage::reset_peak_live_bytes();
  const Tensor y = linear(x, w);
  const double peak = (double)Storage::peak_live_bytes() / (double)(n * n);
  BOOST_TEST_MESSAGE("peak live bytes per weight element: " << peak);
  BOOST_CHECK(y.dtype() == DType::bf16);
  double sx = 0, sabs = 0;  // every output is w's one value times the sum of x
  for (double v : x.to_vector<double>()) sx += v, sabs += std::fabs(v);
  const double w0 = w.to_vector<double>()[0], y0 = y.to_vector<double>()[0];
  BOOST_CHECK_LE(std::fabs(y0 - w0 * sx), 0x1p-8 * std::fabs(w0 * sx) + n * 0x1p-22 * w0 * sabs);
  BOOST_CHECK_LT(peak, half_kernel_available(DType::bf16) ? 2.1 : 6.1);
  BOOST_CHECK_LT(Storage::live_bytes(), before + (size_t)n * 4 + 4096);  // y, nothing kept
  BOOST_CHECK_EQUAL(bf16_weight_copies_made(), copies);
}

namespace {
// glibc heap in use (its arena and its own mappings); 0 under AddressSanitizer, whose allocator
// glibc's counters do not see.
size_t heap_in_use() {
  const struct mallinfo2 mi = mallinfo2();
  return mi.uordblks + mi.hblkhd;
}
}  // namespace

// The gradients of a bf16 linear for batches of 16 lengths: each length makes new oneDNN matmuls,
// cached, whose bf16 outputs need float32 accumulators in a scratchpad. Made in oneDNN's library
// scratchpad mode (on Debian's DNNL_ENABLE_CONCURRENT_EXEC build) each cached primitive held its
// own scratchpad from glibc for good: 9.7 MiB more heap after these calls (0.6 MiB a length; 96
// MiB after 8 steps of bf16 base training). The scratchpad comes from Storage for each run now
// (1.4 MiB held: the primitives and their code).
// Where it cannot tell (no bf16 kernel: no bf16 scratchpad; AddressSanitizer: mallinfo2 sees
// none of its heap) it says so and checks nothing.
BOOST_AUTO_TEST_CASE(cached_matmuls_of_many_shapes_hold_no_scratchpad) {
#if defined(__SANITIZE_ADDRESS__)
  const bool heap_seen = false;
#else
  const bool heap_seen = true;
#endif
  if (!heap_seen || !half_kernel_available(DType::bf16)) {
    BOOST_TEST_MESSAGE("not checked: " << (heap_seen ? "no oneDNN bf16 kernel on this CPU"
                                                     : "glibc's heap counters miss ASan's heap"));
    return;
  }
  const int64_t d = 512;
  Tensor w = half_randn({d, d}, DType::bf16, 90);
  w.requires_grad_();
  auto weight_grad = [&](int64_t rows) {
    const Tensor x = half_randn({rows, d}, DType::bf16, 91 + rows);
    linear(x, w).backward(half_randn({rows, d}, DType::bf16, 92 + rows));
    w.zero_grad();
  };
  weight_grad(300);  // warm: thread buffers, the gradient's first allocation
  const size_t before = heap_in_use();
  for (int64_t rows = 301; rows < 317; ++rows) weight_grad(rows);
  const double held_mib = ((double)heap_in_use() - (double)before) / (1 << 20);
  BOOST_TEST_MESSAGE("glibc heap held after 16 new matmul shapes: " << held_mib << " MiB");
  BOOST_CHECK_LT(held_mib, 4.0);
}

BOOST_AUTO_TEST_SUITE_END()
