// matmul and linear: hand-computed values, float32 (oneDNN) vs float64 (loops) on layouts the
// gradcheck cases are too small to reach.
#include <omp.h>
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <tuple>

#include "graft/autograd/tape.h"
#include "graft/ops/matmul.h"
#include "graft/ops/shape.h"
#include "ops/internal/kernels.h"
#include "tests/test_util.h"

using namespace graft;
using namespace graft::testing;

namespace {

// A view of t with its dims reordered.
Tensor permuted(const Tensor& t, const std::vector<int64_t>& dims) {
  Shape s, st;
  for (int64_t d : dims) {
    s.push_back(t.shape()[d]);
    st.push_back(t.strides()[d]);
  }
  return Tensor::view_of(t, s, st, t.offset());
}

// A float32 copy of t stored with t's strides (so views stay views).
Tensor f32_same_layout(const Tensor& t) {
  const int64_t n = (int64_t)(t.impl()->storage->nbytes / dtype_size(t.dtype()));
  Tensor v = Tensor::view_of(Tensor::empty({n}, DType::f32), t.shape(), t.strides(), t.offset());
  copy_into(v, t);
  return v;
}

const DType kFloats[] = {DType::f32, DType::f64};

}  // namespace

BOOST_AUTO_TEST_SUITE(matmul_family)

BOOST_AUTO_TEST_CASE(matmul_values) {
  for (DType dt : kFloats) {
    Tensor a = from_vector(std::vector<double>{1, 2, 3, 4}, {2, 2});
    a = cast_copy(a, dt);
    Tensor b = cast_copy(from_vector(std::vector<double>{5, 6, 7, 8}, {2, 2}), dt);
    check_close(matmul(a, b), {19, 22, 43, 50});
    // b stored transposed: the same matrix read through swapped strides
    Tensor bt = tview(cast_copy(from_vector(std::vector<double>{5, 7, 6, 8}, {2, 2}), dt));
    BOOST_CHECK(!bt.is_contiguous());
    check_close(matmul(a, bt), {19, 22, 43, 50});
    // 1-D promotions
    Tensor v = cast_copy(from_vector(std::vector<double>{1, 2}, {2}), dt);
    Tensor y = matmul(v, b);
    BOOST_CHECK(y.shape() == Shape({2}));
    check_close(y, {19, 22});
    y = matmul(a, v);
    BOOST_CHECK(y.shape() == Shape({2}));
    check_close(y, {5, 11});
    y = matmul(v, v);
    BOOST_CHECK(y.shape() == Shape({}));
    check_close(y, {5});
    // batch (2, 1, 2, 2) @ (3, 2, 2) broadcasts to (2, 3, 2, 2)
    Tensor ab =
        cast_copy(from_vector(std::vector<double>{1, 0, 0, 1, 2, 0, 0, 2}, {2, 1, 2, 2}), dt);
    Tensor bb = cast_copy(
        from_vector(std::vector<double>{1, 2, 3, 4, 0, 1, 1, 0, -1, 0, 0, -1}, {3, 2, 2}), dt);
    y = matmul(ab, bb);
    BOOST_CHECK(y.shape() == Shape({2, 3, 2, 2}));
    check_close(y, {1, 2, 3, 4, 0, 1, 1, 0, -1, 0, 0, -1, 2, 4, 6, 8, 0, 2, 2, 0, -2, 0, 0, -2});
  }
}

BOOST_AUTO_TEST_CASE(matmul_backward_values) {
  // out = a @ b with dout = ones: da = ones @ b^T (row sums of b), db = a^T @ ones (column sums
  // of a, repeated).
  Tensor a = from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3}).requires_grad_();
  Tensor b = from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {3, 2}).requires_grad_();
  matmul(a, b).backward(ones({2, 2}));
  check_close(a.grad(), {3, 7, 11, 3, 7, 11});
  check_close(b.grad(), {5, 5, 7, 7, 9, 9});
  // A 2-D weight under a batched input: its gradient sums over the batch.
  Tensor x = from_vector(std::vector<float>{1, 2, 3, 4}, {2, 1, 2}).requires_grad_();
  Tensor w = from_vector(std::vector<float>{1, 0, 0, 1}, {2, 2}).requires_grad_();
  matmul(x, w).backward(ones({2, 1, 2}));
  check_close(w.grad(), {4, 4, 6, 6});
  BOOST_CHECK(w.grad().shape() == Shape({2, 2}));
  BOOST_CHECK(autograd::tape_size() == 0u);
}

// Sizes large enough for the optimised paths (folded batch rows, strided batches, broadcasts).
BOOST_AUTO_TEST_CASE(matmul_f32_matches_f64_on_views) {
  Generator g(3);
  struct Pair {
    Tensor a, b;
  };
  std::vector<Pair> pairs;
  // (B, T, C) @ (C, N): folded into one gemm; also with a transposed weight
  pairs.push_back({randn({3, 17, 33}, DType::f64, g), randn({33, 9}, DType::f64, g)});
  pairs.push_back({randn({3, 17, 33}, DType::f64, g), tview(randn({9, 33}, DType::f64, g))});
  // attention-style: q (B, H, T, D) and k^T from (B, T, H, D) storage
  Tensor q = permuted(randn({2, 7, 3, 8}, DType::f64, g), {0, 2, 1, 3});
  Tensor k = permuted(randn({2, 7, 3, 8}, DType::f64, g), {0, 2, 3, 1});
  pairs.push_back({q, k});
  // broadcasts both ways
  pairs.push_back({randn({4, 1, 5, 6}, DType::f64, g), randn({3, 6, 2}, DType::f64, g)});
  pairs.push_back({randn({5, 6}, DType::f64, g), randn({2, 3, 6, 4}, DType::f64, g)});
  for (auto& p : pairs) {
    Tensor a32 = cast_copy(p.a, DType::f32), b32 = cast_copy(p.b, DType::f32);
    // keep the f32 operands in the same strided layout as the f64 ones
    Tensor a32v = f32_same_layout(p.a), b32v = f32_same_layout(p.b);
    check_same(matmul(a32v, b32v), matmul(p.a, p.b), 1e-4);
    check_same(matmul(a32, b32), matmul(p.a, p.b), 1e-4);

    // backward on the same layouts
    Tensor a64 = p.a.detach().requires_grad_(), b64 = p.b.detach().requires_grad_();
    a32v.requires_grad_();
    b32v.requires_grad_();
    Tensor y64 = matmul(a64, b64);
    Tensor dout = randn(y64.shape(), DType::f64, g);
    y64.backward(dout);
    matmul(a32v, b32v).backward(cast_copy(dout, DType::f32));
    check_same(a32v.grad(), a64.grad(), 1e-4);
    check_same(b32v.grad(), b64.grad(), 1e-4);
  }
}

BOOST_AUTO_TEST_CASE(linear_values) {
  for (DType dt : kFloats) {
    Tensor x = cast_copy(from_vector(std::vector<double>{1, 2, -1, 0}, {2, 1, 2}), dt);
    Tensor w = cast_copy(from_vector(std::vector<double>{1, 0, 0, 1, 1, 1}, {3, 2}), dt);
    Tensor b = cast_copy(from_vector(std::vector<double>{0.5, 0, -1}, {3}), dt);
    Tensor y = linear(x, w, b);
    BOOST_CHECK(y.shape() == Shape({2, 1, 3}));
    check_close(y, {1.5, 2, 2, -0.5, 0, -2});
    check_close(linear(x, w), {1, 2, 3, -1, 0, -1});
    // backward with dout = ones: dx = ones @ W, dW = ones^T x, db = number of rows
    x.requires_grad_();
    w.requires_grad_();
    b.requires_grad_();
    linear(x, w, b).backward(ones({2, 1, 3}, dt));
    check_close(x.grad(), {2, 2, 2, 2});
    check_close(w.grad(), {0, 2, 0, 2, 0, 2});
    check_close(b.grad(), {2, 2, 2});
  }
}

// With a tape, float32 linear runs oneDNN matmul forward (the bias in its kernel) and inner
// product backward: both match float64, with and without bias, on a transposed view of x and on a
// shape of many kernel blocks with no dimension a multiple of a vector.
BOOST_AUTO_TEST_CASE(linear_f32_matches_f64) {
  Generator g(5);
  for (auto [rows, in, out] : {std::tuple<int64_t, int64_t, int64_t>{24, 16, 10}, {300, 257, 130}})
    for (bool bias : {true, false}) {
      Tensor x = tview(randn({in, rows}, DType::f64, g));  // (rows, in), non-contiguous
      Tensor w = randn({out, in}, DType::f64, g);
      Tensor b = bias ? randn({out}, DType::f64, g) : Tensor();
      Tensor x32 = cast_copy(x, DType::f32).requires_grad_(),
             w32 = cast_copy(w, DType::f32).requires_grad_();
      Tensor b32 = bias ? cast_copy(b, DType::f32).requires_grad_() : Tensor();
      x.requires_grad_();
      w.requires_grad_();
      if (bias) b.requires_grad_();
      Tensor y = linear(x, w, b);
      Tensor dout = randn(y.shape(), DType::f64, g);
      y.backward(dout);
      Tensor y32 = linear(x32, w32, b32);
      const double tol = 1e-4 * std::max<double>(1.0, (double)std::max(in, rows) / 16.0);
      check_same(y32, y, tol);
      y32.backward(cast_copy(dout, DType::f32));
      check_same(x32.grad(), x.grad(), tol);
      check_same(w32.grad(), w.grad(), tol);
      if (bias) check_same(b32.grad(), b.grad(), tol);
    }
}

// Without a tape, linear reads its weights in oneDNN's preferred layout, reordered once per
// weight version: the values match float64 for the shapes decoding uses (32 rows, and the 4 rows
// of beam search), and an in-place update of the weights is seen by the next call.
BOOST_AUTO_TEST_CASE(linear_inference_layout_matches_f64_and_follows_updates) {
  Generator g(6);
  for (int64_t out : {512, 259}) {  // 259: not a multiple of any block size
    Tensor w = randn({out, 256}, DType::f64, g), b = randn({out}, DType::f64, g);
    Tensor w32 = cast_copy(w, DType::f32), b32 = cast_copy(b, DType::f32);
    autograd::NoGrad ng;
    for (int64_t rows : {32, 4}) {
      Tensor x = randn({rows, 256}, DType::f64, g);
      check_same(linear(cast_copy(x, DType::f32), w32, b32), linear(x, w, b), 1e-4);
    }
    Tensor x = randn({32, 256}, DType::f64, g);
    Tensor x32 = cast_copy(x, DType::f32);
    linear(x32, w32, b32);  // the reordered copy of the current weights
    copy_into(w, randn({out, 256}, DType::f64, g));
    copy_into(w32, cast_copy(w, DType::f32));  // bumps the version: the next call reorders again
    check_same(linear(x32, w32, b32), linear(x, w, b), 1e-4);
  }
}

// One row without a tape (greedy decoding of one sentence) takes graft's own matrix-vector loop:
// it matches float64 with and without bias, on one thread's sizes and on sizes split over threads,
// at lengths that are no multiple of a vector, with the row as (IN), (1, IN), (1, 1, IN) or a
// strided view, and it follows in-place updates of the weights. The tolerance grows with the
// length of the dot products: a build that does not vectorise sums each one in order (1.6e-4 seen
// at 1024 in the sanitizer build), far below a dropped bias or a wrong row (order 1).
BOOST_AUTO_TEST_CASE(linear_one_row_inference_matches_f64) {
  Generator g(7);
  for (auto [in, out] : {std::pair<int64_t, int64_t>{3, 5}, {257, 259}, {1024, 256}}) {
    const double tol = 2e-6 * (double)in;
    for (bool bias : {false, true}) {
      Tensor w = randn({out, in}, DType::f64, g);
      Tensor b = bias ? randn({out}, DType::f64, g) : Tensor();
      Tensor w32 = cast_copy(w, DType::f32), b32 = bias ? cast_copy(b, DType::f32) : Tensor();
      autograd::NoGrad ng;
      Tensor x = randn({in}, DType::f64, g), x32 = cast_copy(x, DType::f32);
      for (const Shape& shape : {Shape{in}, Shape{1, in}, Shape{1, 1, in}}) {
        Tensor y32 = linear(reshape(x32, shape), w32, b32);
        Shape y_shape = shape;
        y_shape.back() = out;
        BOOST_TEST(y32.shape() == y_shape);
        check_same(reshape(y32, {out}), linear(x, w, b), tol);
      }
      Tensor wide = randn({in, 2}, DType::f64, g);  // column 0: a strided row
      check_same(linear(squeeze(slice(cast_copy(wide, DType::f32), 1, 0, 1), 1), w32, b32),
                 linear(squeeze(slice(wide, 1, 0, 1), 1), w, b), tol);
      copy_into(w, randn({out, in}, DType::f64, g));
      copy_into(w32, cast_copy(w, DType::f32));
      check_same(linear(x32, w32, b32), linear(x, w, b), tol);
    }
  }
}

// 5 to 128 rows through a wide weight without a tape (a decoding step at batch 32, or batch 32
// and beam 4, through Marian's vocabulary projection) go through pieces of 256 outputs on AVX2
// builds without AVX-512 (linear_pieces_avx2), where there are 2 pieces a thread: at the edges of
// that path (4 and 129 rows, 2047 outputs), with outputs that end inside a piece, bias or not, on
// one thread and on two (or the machine's count), float32 matches float64, and the path ran
// where expected.
BOOST_AUTO_TEST_CASE(linear_wide_weight_inference_matches_f64) {
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
  constexpr bool kPiecesBuilt = true;
#else
  constexpr bool kPiecesBuilt = false;
#endif
  Generator g(12);
  const int prev = omp_get_max_threads();
  for (int64_t out : {2047, 2048, 2309}) {
    for (bool bias : {false, true}) {
      Tensor w = randn({out, 96}, DType::f64, g), b = bias ? randn({out}, DType::f64, g) : Tensor();
      Tensor w32 = cast_copy(w, DType::f32), b32 = bias ? cast_copy(b, DType::f32) : Tensor();
      autograd::NoGrad ng;
      for (int64_t rows : {4, 5, 37, 128, 129}) {
        Tensor x = randn({rows, 96}, DType::f64, g), x32 = cast_copy(x, DType::f32);
        for (int threads : {1, std::max(2, prev)}) {
          omp_set_num_threads(threads);
          const bool pieces = kPiecesBuilt && out >= 2048 && rows > 4 && rows <= 128 &&
                              (out + 255) / 256 >= 2 * threads;
          const uint64_t calls = kern::linear_pieces_calls();
          BOOST_TEST_CONTEXT("OUT " << out << ", bias " << bias << ", rows " << rows << ", threads "
                                    << threads) {
            check_same(linear(x32, w32, b32), linear(x, w, b), 1e-4);
            BOOST_TEST(kern::linear_pieces_calls() == calls + (pieces ? 1 : 0));
          }
        }
        omp_set_num_threads(prev);
      }
    }
  }
}

// Short rows go several at a time (linear_short_rows, IN <= 256), longer ones one at a time: at
// every length around a vector (16 float32) and around that bound, with output counts below, at
// and past a group of rows, bias or not, the row matches float64 on one and on two threads, and
// both thread counts give the same bits (a row's sum does not depend on which group holds it).
BOOST_AUTO_TEST_CASE(linear_one_row_short_rows_match_f64_on_any_thread_count) {
  Generator g(11);
  const int prev = omp_get_max_threads();
  for (int64_t in : {1, 3, 15, 16, 17, 64, 65, 255, 256, 257, 513}) {
    for (int64_t out : {1, 7, 8, 9, 15, 300}) {
      for (bool bias : {false, true}) {
        Tensor w = randn({out, in}, DType::f64, g), x = randn({1, in}, DType::f64, g);
        Tensor b = bias ? randn({out}, DType::f64, g) : Tensor();
        Tensor w32 = cast_copy(w, DType::f32), x32 = cast_copy(x, DType::f32);
        Tensor b32 = bias ? cast_copy(b, DType::f32) : Tensor();
        autograd::NoGrad ng;
        const Tensor want = linear(x, w, b);
        omp_set_num_threads(1);
        const Tensor y1 = linear(x32, w32, b32);
        omp_set_num_threads(std::max(2, prev));
        const Tensor y2 = linear(x32, w32, b32);
        omp_set_num_threads(prev);
        BOOST_TEST_CONTEXT("IN " << in << ", OUT " << out << ", bias " << bias) {
          check_same(y1, want, 2e-6 * (double)(in + 8));
          BOOST_TEST(y1.to_vector<float>() == y2.to_vector<float>());
        }
      }
    }
  }
}

// Rows 4 KiB apart (1024 float32 columns, >= 256 rows): the weight gradient goes through
// padded copies (ops/matmul.cpp, aliasing); with and without bias, either operand aliasing.
BOOST_AUTO_TEST_CASE(linear_backward_with_4k_row_strides_matches_f64) {
  Generator g(9);
  for (auto [in, out] : {std::pair<int64_t, int64_t>{1024, 24}, {24, 1024}}) {
    for (bool bias : {false, true}) {
      Tensor x = randn({300, in}, DType::f64, g), w = randn({out, in}, DType::f64, g);
      Tensor b = bias ? randn({out}, DType::f64, g) : Tensor();
      Tensor x32 = cast_copy(x, DType::f32), w32 = cast_copy(w, DType::f32).requires_grad_();
      Tensor b32 = bias ? cast_copy(b, DType::f32).requires_grad_() : Tensor();
      w.requires_grad_();
      if (bias) b.requires_grad_();
      Tensor y = linear(x, w, b);
      Tensor dout = randn(y.shape(), DType::f64, g);
      y.backward(dout);
      linear(x32, w32, b32).backward(cast_copy(dout, DType::f32));
      check_same(w32.grad(), w.grad(), 1e-3);
      if (bias) check_same(b32.grad(), b.grad(), 1e-3);
    }
  }
}

// The ops' bad inputs and their errors are in their records (OpRecord::error_inputs,
// testing/cases/matmul.cpp) and run by test_gradcheck_all.

BOOST_AUTO_TEST_SUITE_END()
