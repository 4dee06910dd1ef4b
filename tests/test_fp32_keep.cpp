// float32 weights kept for inference in a blocked layout (keep_weight_fp32,
// models::keep_for_inference(model, Precision::fp32)): oneDNN's inner product's on an AVX-512
// build, graft's panels of 16 outputs on an AVX2 one (ops/internal/panels.h). linear on the kept
// form gives what it gives on the float32 weight (bit for bit over rows where the same oneDNN
// kernel reads the blocks, within float32 rounding for one row, which graft's loop over the
// blocks sums in another order, and for the panels' kernel), whole and as slices of its rows that
// do and do not start at a block; the float32 bytes are freed and every later read of them is an
// error naming the parameter; the panels' kernel matches float64 at any row count, with the same
// bits on any thread count; a table kept so looks its rows up exactly; a trained tiny Transformer
// decodes the same greedy and beam sequences (batch 32 and batch 1) after
// keep_for_inference(fp32) as before. ctest runs it again under DNNL_MAX_CPU_ISA=AVX2, where an
// AVX-512 build's inner product reads the plain rows and nothing is kept (the checks of freed
// values then print "not checked").
#include <omp.h>
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <iostream>
#include <set>

#include "graft/models/decoding.h"
#include "ops/internal/kept.h"
#include "ops/internal/panels.h"
#include "tests/tiny_reverse.h"

using namespace graft;
using graft::testing::names;
using namespace graft::testing::tiny_reverse;

namespace {

Tensor random(const Shape& s, uint64_t seed, double scale = 1.0) {
  Generator g(seed);
  return randn(s, DType::f32, g, 0.0, scale);
}

// linear(x, w rows [r0, r1), b rows [r0, r1)) for x of 1, 3 and 32 rows, at fp32 without a tape.
std::vector<Tensor> outputs(const Tensor& w, const Tensor& b, int64_t r0, int64_t r1) {
  autograd::NoGrad ng;
  std::vector<Tensor> y;
  for (int64_t rows : {1, 3, 32}) {
    const Tensor x = random({rows, w.shape()[1]}, 40 + rows);
    y.push_back(linear(x, slice(w, 0, r0, r1), slice(b, 0, r0, r1)));
  }
  return y;
}

// Whether one row's outputs agree within float32 rounding of their sums: |got - want| at most
// 1e-5 of Σ|x||w| + |b| per output (x, w, b drawn from N(0, 1): 1e-5 * (IN + 1) * 4 covers it).
bool one_row_close(const Tensor& got, const Tensor& want, int64_t IN) {
  const auto g = got.to_vector<float>(), w = want.to_vector<float>();
  for (size_t i = 0; i < g.size(); ++i)
    if (!(std::fabs(g[i] - w[i]) <= 4e-5 * (IN + 1))) return false;
  return g.size() == w.size();
}

// The bytes a weight (OUT, IN) kept as panels holds (padded to whole panels, 64-byte aligned in
// its block), where keeping adds them back after freeing the float32 values: before, the
// kernel read those values themselves (no copy of its own to drop). 0 where oneDNN's blocked
// form replaces a copy the kernel made (kept_weight_equals_float32_and_frees_it makes it first).
size_t panel_bytes(int64_t OUT, int64_t IN) {
  return kern::panels_built() ? kern::panels_bytes(OUT, IN) + 64 : 0;
}

// Whether several rows' outputs got == want: bit for bit where the same oneDNN kernel reads the
// kept blocks, within one_row_close where graft's panels' kernel does (another summation order).
bool rows_equal(const Tensor& got, const Tensor& want, int64_t IN) {
  if (kern::panels_built()) return one_row_close(got, want, IN);
  return got.to_vector<float>() == want.to_vector<float>();
}

}  // namespace

BOOST_AUTO_TEST_SUITE(fp32_keep_tests)

// Odd sizes (IN, OUT not multiples of the 16 x 64 blocks): the kept form gives the float32
// weight's outputs, over 3 and 32 rows bit for bit where oneDNN's kernel reads the blocks (the
// same kernel on the same bytes) and within rounding where graft's panels' kernel does, and
// within rounding over one row (graft's loop over the blocks, or the inner product on a slice
// that cuts a block); the float32 bytes are freed once.
BOOST_AUTO_TEST_CASE(kept_weight_equals_float32_and_frees_it) {
  struct Case {
    int64_t OUT, IN, r0, r1;  // w (OUT, IN), read as its rows [r0, r1)
  };
  for (const Case c : {Case{100, 37, 0, 100}, Case{100, 37, 64, 100}, Case{100, 37, 10, 50},
                       Case{5, 130, 0, 5}, Case{130, 1, 0, 130}, Case{192, 64, 64, 192}}) {
    const Tensor w = random({c.OUT, c.IN}, c.OUT * 7 + c.IN), b = random({c.OUT}, 3);
    const std::vector<Tensor> want = outputs(w, b, c.r0, c.r1);
    outputs(w, b, 0, c.OUT);  // the kernel's copy of the whole weight, which keeping frees
    const size_t live = Storage::live_bytes();
    const size_t freed = keep_weight_fp32(w, "enc.linear1.weight");
    // Nothing to free where the kernel reads plain rows (oneDNN's choice for some shapes under
    // AVX2): the weight stays as it is, read as before.
    BOOST_TEST((freed == (size_t)c.OUT * c.IN * 4 ||
                (freed == 0 && w.is_contiguous() && w.to_vector<float>().size() > 0)));
    BOOST_TEST(Storage::live_bytes() <= live - freed + panel_bytes(c.OUT, c.IN));
    if (freed == 0)
      std::cout << "test_fp32_keep: " << c.OUT << " x " << c.IN << " read as plain rows\n";
    BOOST_TEST(keep_weight_fp32(w, "enc.linear1.weight") == 0u);  // once
    const std::vector<Tensor> got = outputs(w, b, c.r0, c.r1);
    const std::string what = std::to_string(c.OUT) + " x " + std::to_string(c.IN) + " rows " +
                             std::to_string(c.r0) + ".." + std::to_string(c.r1);
    BOOST_TEST(one_row_close(got[0], want[0], c.IN), what << ", 1 row");
    for (size_t i = 1; i < want.size(); ++i)
      BOOST_TEST(rows_equal(got[i], want[i], c.IN), what << ", output " << i);
  }
}

// Whatever still wants the float32 values gets an error naming the parameter and what freed it:
// reading them, a training step, another precision; a weight that cannot be freed alone (a view
// of a larger storage) or is not a float32 matrix is refused.
BOOST_AUTO_TEST_CASE(freed_float32_weight_is_an_error_naming_it) {
  const Tensor big = random({32, 8}, 27);
  BOOST_CHECK_EXCEPTION(keep_weight_fp32(slice(big, 0, 0, 16), "half"), Error,
                        [](const Error& e) { return names(e, "half") && names(e, "view"); });
  BOOST_CHECK_EXCEPTION(keep_weight_fp32(random({8}, 28), "bias"), Error,
                        [](const Error& e) { return names(e, "bias") && names(e, "(OUT, IN)"); });
  BOOST_TEST(big.to_vector<float>().size() == 256u);  // refused: nothing freed
  const Tensor q = random({80, 24}, 23);
  if (keep_weight_fp32(q, "dec.out_proj.weight") == 0) {
    // oneDNN's kernel reads the plain rows (every float32 shape under AVX2): nothing is freed.
    BOOST_TEST(q.to_vector<float>().size() == 80u * 24u);
    BOOST_TEST_MESSAGE("not checked: nothing is kept on this CPU");
    return;
  }
  const auto freed = [](const Error& e) {
    return names(e, "dec.out_proj.weight") && names(e, "freed") && names(e, "blocked layout");
  };
  BOOST_CHECK_EXCEPTION(q.to_vector<float>(), Error, freed);
  BOOST_CHECK_EXCEPTION(contiguous_copy(q), Error, freed);
  // A view of the kept storage that is not a block of its rows (reshaped) is not in the kept
  // form: one row and several rows refuse it (they read the blocks as 48 columns before).
  BOOST_CHECK_EXCEPTION(linear(random({1, 48}, 28), reshape(q, {40, 48})), Error, freed);
  BOOST_CHECK_EXCEPTION(linear(random({3, 48}, 29), reshape(q, {40, 48})), Error, freed);
  {
    PrecisionGuard bf16(Precision::bf16);
    BOOST_CHECK_EXCEPTION(linear(random({2, 24}, 24), q), Error, freed);
  }
  Tensor p = random({80, 24}, 25);
  p.requires_grad_(true);
  keep_weight_fp32(p, "dec.linear2.weight");
  BOOST_CHECK_EXCEPTION(sum(linear(random({2, 24}, 26), p)).backward(), Error,
                        [](const Error& e) { return names(e, "dec.linear2.weight"); });
}

// A slice whose rows end inside a block (rows 0..100 of 300) read by the inner product must not
// write over the rows after it (oneDNN zero-fills a memory's padding when it is made on a
// pointer): the next slice (100..200) and the whole weight read after it give the float32
// weight's outputs; the same without a bias.
BOOST_AUTO_TEST_CASE(slice_ending_inside_a_block_leaves_the_next_rows) {
  for (const bool bias : {true, false}) {
    const Tensor w = random({300, 40}, 61), b = bias ? random({300}, 62) : Tensor();
    const auto run = [&](int64_t r0, int64_t r1) {
      autograd::NoGrad ng;
      const Tensor br = bias ? slice(b, 0, r0, r1) : Tensor();
      return linear(random({32, 40}, 63), slice(w, 0, r0, r1), br);
    };
    const Tensor a = run(0, 100), n = run(100, 200), all = run(0, 300);
    keep_weight_fp32(w, "dec.cross.in_proj_weight");
    BOOST_TEST(one_row_close(run(0, 100), a, 40), "bias " << bias);
    BOOST_TEST(one_row_close(run(100, 200), n, 40), "bias " << bias);
    BOOST_TEST(one_row_close(run(0, 300), all, 40), "bias " << bias);
  }
}

// One row through the loop that reads 2 or 4 blocks of 64 outputs side by side
// (one_row_panels): odd IN and OUT (a last block short of 64 outputs, a last group short of its
// blocks), slices of rows starting at a block and ending inside one or at the end, with and
// without a bias, on 1 and 2 threads (which change how many blocks go side by side), under and
// over the size that runs on the threads: within float32 rounding of the float32 weight's
// outputs, and the side-by-side loop ran where the weight was kept.
// ops/matmul.cpp reads blocks side by side where the registers hold their sums: AVX-512's blocks
// of 64 outputs, AVX2's panels of 16.
#if defined(__AVX512F__)
const bool kPanelsBuilt = true;
#else
const bool kPanelsBuilt = kern::panels_built();
#endif

BOOST_AUTO_TEST_CASE(one_row_over_blocks_side_by_side_equals_float32) {
  struct Case {
    int64_t OUT, IN, r0, r1;
  };
  const int threads = omp_get_max_threads();
  for (const Case c : {Case{1000, 37, 0, 1000}, Case{520, 130, 0, 520}, Case{300, 129, 64, 300},
                       Case{1000, 37, 128, 700}, Case{256, 100, 0, 256}, Case{256, 40, 0, 256}})
    for (const bool bias : {true, false})
      for (const int t : {1, 2}) {
        omp_set_num_threads(t);
        const Tensor w = random({c.OUT, c.IN}, c.OUT + c.IN), b = random({c.OUT}, 5);
        const auto run = [&] {
          autograd::NoGrad ng;
          const Tensor br = bias ? slice(b, 0, c.r0, c.r1) : Tensor();
          return linear(random({1, c.IN}, 6), slice(w, 0, c.r0, c.r1), br);
        };
        const Tensor want = run();
        const bool kept = keep_weight_fp32(w, "dec.linear1.weight") > 0;
        const uint64_t calls = kern::kept_f32_panel_calls();
        const Tensor got = run();
        const std::string what = std::to_string(c.OUT) + " x " + std::to_string(c.IN) + " rows " +
                                 std::to_string(c.r0) + ".." + std::to_string(c.r1) + " bias " +
                                 std::to_string(bias) + " threads " + std::to_string(t);
        BOOST_TEST(one_row_close(got, want, c.IN), what);
        BOOST_TEST((!kept || !kPanelsBuilt || kern::kept_f32_panel_calls() == calls + 1), what);
      }
  omp_set_num_threads(threads);
}

// The loop over kept blocks gives the same bits on 1 and 2 threads although the blocks it reads
// side by side follow the thread count (384 x 512: AVX-512's 6 blocks of 64, 4 + 2 on one thread,
// 2 + 2 + 2 on two; AVX2's 24 panels of 16, 4 at a time, 12 a thread on two; a slice whose last
// group is short on both), as graft's loops promise (reliability.md).
BOOST_AUTO_TEST_CASE(one_row_over_blocks_is_the_same_on_any_thread_count) {
  const int threads = omp_get_max_threads();
  for (const int64_t r1 : {int64_t{384}, int64_t{320}}) {
    const Tensor w = random({384, 512}, 7), b = random({384}, 8), x = random({1, 512}, 9);
    if (keep_weight_fp32(w, "dec.linear1.weight") == 0) {
      BOOST_TEST_MESSAGE("not checked: the weight was not kept on this CPU");
      continue;
    }
    std::vector<std::vector<float>> got;
    for (const int t : {1, 2}) {
      omp_set_num_threads(t);
      autograd::NoGrad ng;
      got.push_back(linear(x, slice(w, 0, 0, r1), slice(b, 0, 0, r1)).to_vector<float>());
    }
    omp_set_num_threads(threads);
    BOOST_TEST(got[0] == got[1], "rows 0.." << r1);
  }
}

// keep_weights_fp32 packs the forms of several weights into one block (6 MiB here: on 2 MiB pages
// where the system gives them): each weight and a slice of its rows give what their float32
// values gave (over 3 and 32 rows as rows_equal says, rounding over one row, the same bits on 1
// and 2 threads), a weight named twice is kept once, and a bad weight in
// the list (one found while the forms are laid out, after a good one) keeps none.
BOOST_AUTO_TEST_CASE(weights_kept_together_share_one_block_and_equal_float32) {
  const std::vector<Tensor> ws = {random({1024, 512}, 11), random({1024, 512}, 12),
                                  random({100, 37}, 13), random({1024, 512}, 14)};
  const Tensor b = random({1024}, 15);
  const Tensor big = random({64, 512}, 16), bad = slice(big, 0, 0, 16);  // a view: not whole
  BOOST_CHECK_EXCEPTION(
      keep_weights_fp32({{"dec.a", ws[0]}, {"dec.bad", bad}}), Error,
      [](const Error& e) { return std::string(e.what()).find("dec.bad") != std::string::npos; });
  BOOST_TEST(ws[0].to_vector<float>().size() == 1024u * 512u);  // not kept: its values still read
  std::vector<std::vector<Tensor>> want;
  for (const Tensor& w : ws) want.push_back(outputs(w, b, 0, w.shape()[0]));
  const std::vector<Tensor> want_slice = outputs(ws[3], b, 128, 700);
  const size_t freed = keep_weights_fp32({{"dec.a", ws[0]},
                                          {"dec.b", ws[1]},
                                          {"dec.a again", ws[0]},
                                          {"dec.c", ws[2]},
                                          {"dec.d", ws[3]}});
  const auto a = kern::kept_form(ws[0], DType::f32), d = kern::kept_form(ws[3], DType::f32);
  if (!a || !d) {
    BOOST_TEST_MESSAGE("not checked: the weights were not kept on this CPU");
    return;
  }
  size_t bytes = 0;  // where the kernel reads plain rows (some shapes under AVX2) nothing is kept
  for (const Tensor& w : ws)
    if (kern::kept_form(w, DType::f32)) bytes += (size_t)w.numel() * 4;
  BOOST_TEST(freed == bytes);
  BOOST_TEST(a->data == d->data);  // one block
  BOOST_TEST((a->offset % 64 == 0 && d->offset % 64 == 0 && a->offset != d->offset));
  // 6 MiB of forms start at a 2 MiB boundary: the first is on huge pages where any are.
  BOOST_TEST(reinterpret_cast<uintptr_t>(a->bytes()) % (uintptr_t(2) << 20) == 0u);
  BOOST_TEST(a->huge_pages == d->huge_pages);
  BOOST_TEST_MESSAGE("kept on 2 MiB pages: " << a->huge_pages << " " << d->huge_pages);
  const int threads = omp_get_max_threads();
  for (size_t i = 0; i < ws.size(); ++i) {
    const int64_t OUT = ws[i].shape()[0], IN = ws[i].shape()[1];
    const std::vector<Tensor> got = outputs(ws[i], b, 0, OUT);
    BOOST_TEST(one_row_close(got[0], want[i][0], IN), "weight " << i);
    BOOST_TEST(rows_equal(got[1], want[i][1], IN), "weight " << i);
    BOOST_TEST(rows_equal(got[2], want[i][2], IN), "weight " << i);
    std::vector<std::vector<float>> one;
    for (const int t : {1, 2}) {
      omp_set_num_threads(t);
      one.push_back(outputs(ws[i], b, 0, OUT)[0].to_vector<float>());
    }
    omp_set_num_threads(threads);
    BOOST_TEST(one[0] == one[1], "weight " << i);
  }
  const std::vector<Tensor> got = outputs(ws[3], b, 128, 700);  // rows from the 3rd block on
  BOOST_TEST(one_row_close(got[0], want_slice[0], 512));
  BOOST_TEST(rows_equal(got[1], want_slice[1], 512));
  BOOST_TEST(rows_equal(got[2], want_slice[2], 512));
}

// The panels' kernel (any row count from 2 on, through linear on a weight kept as panels) gives
// the float64 linear's outputs within float32 rounding: row counts around its tiles of 6 rows,
// outputs around its panels of 16 (a last panel short of them), slices of rows from a panel's
// start, with and without a bias; and the path ran. Each output is one chain over the inputs
// whatever the rows beside it and the threads: a row's bits are the same through a 2-row call
// and a 13-row one, on 1 and 2 threads.
BOOST_AUTO_TEST_CASE(panels_kernel_matches_float64_at_any_row_count) {
  if (!kern::panels_built()) {
    BOOST_TEST_MESSAGE("not checked: this build keeps oneDNN's layouts, not panels");
    return;
  }
  const int threads = omp_get_max_threads();
  struct Case {
    int64_t OUT, IN, r0, r1;
  };
  for (const Case c : {Case{1, 7, 0, 1}, Case{15, 64, 0, 15}, Case{16, 1, 0, 16},
                       Case{100, 37, 0, 100}, Case{100, 37, 32, 100}, Case{2053, 70, 16, 2053}})
    for (const bool bias : {true, false}) {
      const Tensor w = random({c.OUT, c.IN}, c.OUT * 3 + c.IN), b = random({c.OUT}, 17);
      const Tensor w64 = to_dtype(slice(w, 0, c.r0, c.r1), DType::f64);
      const Tensor b64 = bias ? to_dtype(slice(b, 0, c.r0, c.r1), DType::f64) : Tensor();
      BOOST_TEST_REQUIRE(keep_weight_fp32(w, "dec.linear1.weight") > 0u);
      autograd::NoGrad ng;
      const Tensor br = bias ? slice(b, 0, c.r0, c.r1) : Tensor();
      for (const int64_t rows : {2, 5, 6, 7, 13, 32, 129}) {
        const Tensor x = random({rows, c.IN}, 50 + rows);
        const uint64_t calls = kern::linear_panels_calls();
        const Tensor got = linear(x, slice(w, 0, c.r0, c.r1), br);
        BOOST_TEST(kern::linear_panels_calls() == calls + 1);
        const Tensor want = linear(to_dtype(x, DType::f64), w64, b64);
        BOOST_TEST(one_row_close(got, to_dtype(want, DType::f32), c.IN),
                   c.OUT << " x " << c.IN << " rows " << c.r0 << ".." << c.r1 << " bias " << bias
                         << " x rows " << rows);
      }
      const Tensor x = random({13, c.IN}, 70);
      std::vector<std::vector<float>> first_rows;
      for (const int t : {1, 2}) {
        omp_set_num_threads(t);
        const Tensor wr = slice(w, 0, c.r0, c.r1);
        first_rows.push_back(slice(linear(x, wr, br), 0, 0, 2).to_vector<float>());
        first_rows.push_back(linear(slice(x, 0, 0, 2), wr, br).to_vector<float>());
      }
      omp_set_num_threads(threads);
      for (size_t i = 1; i < first_rows.size(); ++i)
        BOOST_TEST(first_rows[i] == first_rows[0], c.OUT << " x " << c.IN << " call " << i);
    }
}

// A table kept as float32 (keep_for_inference(fp32) keeps every embedding) looks its rows up bit
// for bit, the last row of a short last panel too, and so does a slice of its rows (ids counted
// from the slice's first row); its tied projection gives what it gave; a lookup with a tape is
// refused, naming why.
BOOST_AUTO_TEST_CASE(kept_table_looks_up_its_rows_exactly) {
  const Tensor table = random({37, 24}, 81);
  const Tensor ids = from_vector(std::vector<int64_t>{36, 0, 17, 16, 36}, {5}, DType::i64);
  const Tensor x = random({3, 24}, 82);
  autograd::NoGrad ng;
  const std::vector<float> want = embedding(table, ids).to_vector<float>();
  const Tensor ids_in_slice = from_vector(std::vector<int64_t>{20, 0, 1}, {3}, DType::i64);
  const std::vector<float> want_in_slice =
      embedding(slice(table, 0, 16, 37), ids_in_slice).to_vector<float>();
  const Tensor logits = linear(x, table);
  if (keep_weight_fp32(table, "embedding.weight") == 0) {
    BOOST_TEST_MESSAGE("not checked: the table was not kept on this CPU");
    return;
  }
  BOOST_TEST(embedding(table, ids).to_vector<float>() == want);
  BOOST_TEST(embedding(slice(table, 0, 16, 37), ids_in_slice).to_vector<float>() == want_in_slice);
  BOOST_TEST(rows_equal(linear(x, table), logits, 24));
  autograd::EnableGrad eg;
  Tensor trained = random({37, 24}, 83);
  trained.requires_grad_(true);
  keep_weight_fp32(trained, "embedding.weight");
  BOOST_CHECK_EXCEPTION(embedding(trained, ids), Error, [](const Error& e) {
    return names(e, "kept for float32 inference") && names(e, "NoGrad");
  });
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(fp32_keep_model_tests)

// keep_for_inference(fp32) frees the float32 weights of the model's linears and its tied
// embedding (looked up in the kept form) and the model decodes exactly what it decoded before,
// greedy and beam, batch 32 and batch 1; saving it afterwards fails naming a freed parameter.
BOOST_AUTO_TEST_CASE(kept_model_decodes_as_before) {
  LearnedDecoder d;
  BOOST_TEST_REQUIRE(d.learned, "float32 did not learn the task in " << kCap << " steps");
  const models::Sequences greedy1 = d.decode_one_by_one(8, 1), beam1 = d.decode_one_by_one(8, 3);
  size_t matrix_bytes = 0, kept_bytes = 0;  // the linears' weights and the embedding, once each
  std::set<const Storage*> seen;
  for (const auto& [name, t] : d.run.m.named_parameters())
    if (t.dim() == 2 && seen.insert(t.impl()->storage.get()).second) {
      matrix_bytes += (size_t)t.numel() * 4;
      kept_bytes += panel_bytes(t.shape()[0], t.shape()[1]);
    }
  const size_t live = Storage::live_bytes();
  const size_t freed = models::keep_for_inference(d.run.m, Precision::fp32);
  // Nothing where oneDNN's kernel reads the plain rows (an AVX-512 build under AVX2).
  BOOST_TEST((freed == matrix_bytes || freed == 0));
  BOOST_TEST(Storage::live_bytes() <= live - freed + kept_bytes);
  BOOST_TEST((d.decode(1) == d.greedy));
  BOOST_TEST((d.decode(3) == d.beam));
  BOOST_TEST((d.decode_one_by_one(8, 1) == greedy1));
  BOOST_TEST((d.decode_one_by_one(8, 3) == beam1));
  if (freed == 0) return;
  BOOST_CHECK_EXCEPTION(d.run.m.embedding->weight.to_vector<float>(), Error,
                        [](const Error& e) { return names(e, "embedding") && names(e, "freed"); });
  BOOST_CHECK_EXCEPTION(
      [&] {
        for (const auto& [name, t] : d.run.m.state_dict()) t.to_vector<float>();
      }(),
      Error, [](const Error& e) { return names(e, "weight") && names(e, "freed"); });
}

BOOST_AUTO_TEST_SUITE_END()
