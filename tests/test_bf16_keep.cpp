// bf16 weights kept for inference in the bf16 inner product's blocked layout (keep_weight_bf16,
// models::keep_for_inference(model, Precision::bf16)): linear on the kept form gives what it gives
// on the plain bf16 weight (within one bf16 rounding of the output: the kernels sum in another
// order), over 1 to 4 rows (graft's loop over the blocks) and more (oneDNN's inner product),
// whole and as slices of its rows that do and do not start at a block; the plain bf16 bytes are
// freed and every later read of them is an error naming the parameter; a trained tiny Transformer
// made bf16 decodes the same greedy and beam sequences (batch 32 and batch 1) with its weights
// kept as with them plain. ctest runs it again under DNNL_MAX_CPU_ISA=AVX2, where no bf16 kernel
// runs: the weights stay plain there and the same checks hold.
#include <boost/test/unit_test.hpp>
#include <cmath>

#include "graft/models/decoding.h"
#include "ops/internal/kept.h"
#include "tests/tiny_reverse.h"

using namespace graft;
using graft::testing::names;
using namespace graft::testing::tiny_reverse;

namespace {

Tensor random16(const Shape& s, uint64_t seed) {
  Generator g(seed);
  return cast_copy(randn(s, DType::f32, g, 0.0, 1.0), DType::bf16);
}

// t's values as float32 (reading them: fails where they were freed).
std::vector<float> values(const Tensor& t) { return cast_copy(t, DType::f32).to_vector<float>(); }

// linear(x, w rows [r0, r1), b rows [r0, r1)) for x of 1, 2, 4, 5 and 32 rows, without a tape.
std::vector<Tensor> outputs(const Tensor& w, const Tensor& b, int64_t r0, int64_t r1) {
  autograd::NoGrad ng;
  std::vector<Tensor> y;
  for (int64_t rows : {1, 2, 4, 5, 32}) {
    const Tensor x = random16({rows, w.shape()[1]}, 40 + rows);
    y.push_back(cast_copy(linear(x, slice(w, 0, r0, r1), slice(b, 0, r0, r1)), DType::f32));
  }
  return y;
}

// Whether two bf16 outputs agree within one bf16 rounding (2^-8 relative, either side) plus the
// float32 rounding of their sums (x, w, b from N(0, 1): 4e-5 (IN + 1) covers it).
bool close16(const Tensor& got, const Tensor& want, int64_t IN) {
  const auto g = got.to_vector<float>(), w = want.to_vector<float>();
  for (size_t i = 0; i < g.size(); ++i)
    if (!(std::fabs(g[i] - w[i]) <= std::fabs(w[i]) / 128 + 4e-5 * (IN + 1))) return false;
  return g.size() == w.size();
}

}  // namespace

BOOST_AUTO_TEST_SUITE(bf16_keep_tests)

// Odd sizes (IN, OUT not multiples of the 16 x 64 blocks) and slices of rows that start at a
// block (64..100) and cut one (10..50, read from plain rows copied out of the form once): the kept
// form gives the plain weight's outputs at every row count; the plain bf16 bytes are freed once.
BOOST_AUTO_TEST_CASE(kept_weight_equals_plain_bf16_and_frees_it) {
  struct Case {
    int64_t OUT, IN, r0, r1;  // w (OUT, IN), read as its rows [r0, r1)
  };
  for (const Case c :
       {Case{100, 37, 0, 100}, Case{100, 37, 64, 100}, Case{100, 37, 10, 50}, Case{5, 130, 0, 5},
        Case{130, 1, 0, 130}, Case{192, 64, 64, 192}, Case{256, 512, 0, 256}}) {
    const Tensor w = random16({c.OUT, c.IN}, c.OUT * 7 + c.IN), b = random16({c.OUT}, 3);
    const std::vector<Tensor> want = outputs(w, b, c.r0, c.r1);
    const size_t freed = keep_weight_bf16(w, "enc.linear1.weight");
    // Where no bf16 kernel runs (an AVX2 cap) the weight stays plain, read as before.
    if (bf16_kernel_available()) BOOST_TEST(freed == (size_t)c.OUT * c.IN * 2);
    else BOOST_TEST((freed == 0 && values(w).size() > 0));
    BOOST_TEST(keep_weight_bf16(w, "enc.linear1.weight") == 0u);  // once
    const uint64_t loop_calls = kern::kept_bf16_loop_calls();
    const std::vector<Tensor> got = outputs(w, b, c.r0, c.r1);
    // Where the kept layout is the loop's (AB8b64a2b; oneDNN blocks 5 outputs by 16), the 1, 2
    // and 4 rows run it: a layout change cannot leave it untested unseen.
    if (kern::kept_bf16_loop_expected() && c.OUT >= 64 && c.r0 % 64 == 0)
      BOOST_TEST(kern::kept_bf16_loop_calls() == loop_calls + 3, c.OUT << " x " << c.IN);
    const std::string what = std::to_string(c.OUT) + " x " + std::to_string(c.IN) + " rows " +
                             std::to_string(c.r0) + ".." + std::to_string(c.r1);
    for (size_t i = 0; i < want.size(); ++i)
      BOOST_TEST(close16(got[i], want[i], c.IN), what << ", output " << i);
  }
}

// Whatever still wants the plain bf16 values gets an error naming the parameter and what freed
// them: reading them, a reshaped view, a training step; a weight that cannot be freed alone (a
// view of a larger storage) or is not a bf16 matrix is refused.
BOOST_AUTO_TEST_CASE(freed_bf16_weight_is_an_error_naming_it) {
  const Tensor big = random16({32, 8}, 27);
  BOOST_CHECK_EXCEPTION(keep_weight_bf16(slice(big, 0, 0, 16), "half"), Error, [](const Error& e) {
    return names(e, "half") && names(e, "view") && names(e, "its bfloat16 values");
  });
  BOOST_CHECK_EXCEPTION(keep_weight_bf16(random16({8}, 28), "bias"), Error,
                        [](const Error& e) { return names(e, "bias") && names(e, "(OUT, IN)"); });
  BOOST_CHECK_EXCEPTION(
      keep_weight_bf16(cast_copy(big, DType::f32), "w32"), Error,
      [](const Error& e) { return names(e, "w32") && names(e, "contiguous bf16"); });
  BOOST_TEST(values(big).size() == 256u);  // refused: nothing freed
  if (!bf16_kernel_available()) return;    // nothing is kept, so nothing is freed
  const Tensor q = random16({80, 24}, 23);
  BOOST_TEST(keep_weight_bf16(q, "dec.out_proj.weight") > 0u);
  const auto freed = [](const Error& e) {
    return names(e, "dec.out_proj.weight") && names(e, "freed") && names(e, "blocked layout");
  };
  BOOST_CHECK_EXCEPTION(values(q), Error, freed);
  BOOST_CHECK_EXCEPTION(contiguous_copy(q), Error, freed);
  {
    autograd::NoGrad ng;  // a reshaped view is not in the kept form, at one row or several
    BOOST_CHECK_EXCEPTION(linear(random16({1, 48}, 28), reshape(q, {40, 48})), Error, freed);
    BOOST_CHECK_EXCEPTION(linear(random16({9, 48}, 29), reshape(q, {40, 48})), Error, freed);
  }
  Tensor p = random16({80, 24}, 25);
  p.requires_grad_(true);
  keep_weight_bf16(p, "dec.linear2.weight");
  BOOST_CHECK_EXCEPTION(linear(random16({2, 24}, 26), p), Error,
                        [](const Error& e) { return names(e, "dec.linear2.weight"); });
}

// A slice whose rows end inside a block (rows 0..100 of 300) read by the inner product must not
// write over the rows after it (oneDNN zero-fills a memory's padding when it is made on a
// pointer): the next slice (100..200) and the whole weight read after it give the plain weight's
// outputs; the same without a bias.
BOOST_AUTO_TEST_CASE(slice_ending_inside_a_block_leaves_the_next_rows) {
  for (const bool bias : {true, false}) {
    const Tensor w = random16({300, 40}, 61), b = bias ? random16({300}, 62) : Tensor();
    const auto run = [&](int64_t r0, int64_t r1) {
      autograd::NoGrad ng;
      const Tensor x = random16({32, 40}, 63);
      const Tensor br = bias ? slice(b, 0, r0, r1) : Tensor();
      return cast_copy(linear(x, slice(w, 0, r0, r1), br), DType::f32);
    };
    const Tensor a = run(0, 100), n = run(100, 200), all = run(0, 300);
    keep_weight_bf16(w, "dec.cross.in_proj_weight");
    BOOST_TEST(close16(run(0, 100), a, 40), "bias " << bias);
    BOOST_TEST(close16(run(100, 200), n, 40), "bias " << bias);
    BOOST_TEST(close16(run(0, 300), all, 40), "bias " << bias);
  }
}

// keep_weights_together moves the bytes inference reads (plain bf16 rows, a kept bf16 form, an
// int8 form) into one block: linear gives the same bits before and after, a slice made before
// reads the moved rows, each storage moves once (a tied weight named twice too), and a second
// call or less than 2 MiB moves nothing.
BOOST_AUTO_TEST_CASE(weights_kept_together_read_the_same) {
  Tensor w1 = random16({512, 1024}, 1), w2 = random16({768, 1024}, 2), b = random16({768}, 3);
  Tensor f = randn({512, 1024}, DType::f32, default_generator(), 0.0, 1.0);
  keep_weight_bf16(w2, "w2");
  BOOST_TEST(quantize_weight_int8(f, "f") > 0u);
  const Tensor head = slice(w1, 0, 0, 64);
  const std::vector<float> head_values = values(head);
  autograd::NoGrad ng;
  const Tensor x = random16({3, 1024}, 4), xf = cast_copy(x, DType::f32);
  const auto run = [&] {
    PrecisionGuard int8(Precision::int8);
    return std::vector<std::vector<float>>{values(linear(x, w1)), values(linear(x, w2, b)),
                                           linear(xf, f).to_vector<float>()};
  };
  const auto before = run();
  BOOST_TEST(keep_weights_together({{"w1", w1}, {"w2", w2}, {"f", f}, {"w1 again", w1}}) >
             (size_t(2) << 20));
  const auto& host = w1.impl()->storage->host;
  BOOST_TEST_REQUIRE(host != nullptr);
  BOOST_TEST((run() == before));
  BOOST_TEST((values(head) == head_values));
  BOOST_TEST(keep_weights_together({{"w1", w1}, {"w2", w2}, {"f", f}}) == 0u);
  Tensor small = random16({64, 64}, 5);
  BOOST_TEST(keep_weights_together({{"small", small}}) == 0u);
  BOOST_TEST(!small.impl()->storage->host);
  BOOST_CHECK_EXCEPTION(keep_weights_together({{"none", Tensor()}}), Error,
                        [](const Error& e) { return names(e, "none") && names(e, "undefined"); });
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(bf16_keep_model_tests)

// The model's logits for d's 32 sources and targets, without a tape (32 rows through every linear,
// in_proj's q, k, v slices of 32 rows each: d_model 32 ends each inside one 64-row block).
std::vector<float> no_grad_logits(const LearnedDecoder& d) {
  autograd::NoGrad ng;
  return cast_copy(d.run.m.forward(d.batch.src, d.batch.tgt_in), DType::f32).to_vector<float>();
}

// Whether kept-weight logits agree with plain-weight ones within the bf16 roundings of a few
// layers summed in another order: 1/16 of the largest logit (a slice of rows read as zeros moves
// them by far more).
bool logits_agree(const std::vector<float>& got, const std::vector<float>& want) {
  float big = 0, worst = 0;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    big = std::max(big, std::fabs(want[i]));
    worst = std::max(worst, std::fabs(got[i] - want[i]));
  }
  return got.size() == want.size() && worst <= big / 16;
}

// keep_for_inference(bf16) on a model made bf16 keeps its linears' weights (not the tied
// embedding, whose lookup reads them) and the model decodes exactly what it decoded with them
// plain, greedy and beam, batch 32 and batch 1; reading its state afterwards fails naming a freed
// parameter.
BOOST_AUTO_TEST_CASE(kept_bf16_model_decodes_as_plain) {
  LearnedDecoder d;
  BOOST_TEST_REQUIRE(d.learned, "float32 did not learn the task in " << kCap << " steps");
  PrecisionGuard bf16(Precision::bf16);
  d.run.m.to(DType::bf16);
  const models::Sequences greedy = d.decode(1), beam = d.decode(3);
  const models::Sequences greedy1 = d.decode_one_by_one(8, 1), beam1 = d.decode_one_by_one(8, 3);
  const std::vector<float> logits = no_grad_logits(d);
  models::keep_for_inference(d.run.m, Precision::bf16);
  BOOST_TEST(logits_agree(no_grad_logits(d), logits));  // first: in_proj's slices read in turn
  BOOST_TEST((d.decode(1) == greedy));
  BOOST_TEST((d.decode(3) == beam));
  BOOST_TEST((d.decode_one_by_one(8, 1) == greedy1));
  BOOST_TEST((d.decode_one_by_one(8, 3) == beam1));
  BOOST_TEST(values(d.run.m.embedding->weight).size() > 0u);  // tied: plain
  if (!bf16_kernel_available()) return;  // nothing is kept, so nothing is freed
  BOOST_CHECK_EXCEPTION(
      [&] {
        for (const auto& [name, t] : d.run.m.state_dict()) values(t);
      }(),
      Error, [](const Error& e) { return names(e, "weight") && names(e, "freed"); });
}

BOOST_AUTO_TEST_SUITE_END()
