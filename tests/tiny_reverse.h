// A tiny Transformer learning to reverse sequences (tests of the reduced precisions: test_bf16,
// test_int8): its config, the data, a run in one precision and training to a criterion.
#pragma once

#include <cstdint>
#include <vector>

#include "graft/autograd/tape.h"
#include "graft/models/transformer.h"
#include "graft/nn/train/optim.h"
#include "graft/ops/ops.h"
#include "tests/test_util.h"

namespace graft::testing::tiny_reverse {

inline models::TransformerConfig tiny_cfg() {
  models::TransformerConfig c;
  c.vocab = 24;
  c.d_model = 32;
  c.heads = 2;
  c.d_ff = 64;
  c.enc_layers = 1;
  c.dec_layers = 1;
  c.max_len = 32;
  c.dropout = 0.0;
  c.seed = 5;
  return c;
}

// Reverse-the-sequence batches: sources of 6 tokens in [4, 24), targets reversed, BOS 2, EOS 3.
struct Batch {
  Tensor src, tgt_in, tgt_out;
};
inline Batch reverse_batch(Generator& g, int64_t B) {
  std::vector<int64_t> src, tin, tout;
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int64_t> s(6);
    for (auto& v : s) v = 4 + (int64_t)g.below(20);
    src.insert(src.end(), s.begin(), s.end());
    src.push_back(3);
    tin.push_back(2);
    for (int i = 5; i >= 0; --i) {
      tin.push_back(s[i]);
      tout.push_back(s[i]);
    }
    tout.push_back(3);
  }
  return {ids(src, B), ids(tin, B), ids(tout, B)};
}

// A tiny Transformer learning to reverse sequences in one precision: Adam steps (lr 1e-3, batches
// of 32, the same data order for every run) and the loss on 8 fixed held-out batches (eval mode,
// float32 matmuls, label smoothing as in training).
struct TinyRun {
  models::Transformer m{tiny_cfg()};  // the same seed, so the same initial weights, for every run
  train::Adam opt{m.named_parameters(), 1e-3};
  Generator data{77};
  Precision precision;
  Bf16Path path;
  int64_t steps = 0;
  uint64_t copies_last_step = 0;  // the bf16 weight copies the last step made
  explicit TinyRun(Precision p = Precision::fp32, Bf16Path bp = Bf16Path::onednn)
      : precision(p), path(bp) {}

  void train(int n) {
    PrecisionGuard guard(precision, path);
    for (int s = 0; s < n; ++s, ++steps) {
      const uint64_t c0 = bf16_weight_copies_made();
      const Batch b = reverse_batch(data, 32);
      opt.zero_grad();
      Tensor loss = m.loss(b.src, b.tgt_in, b.tgt_out, 0.1);
      loss.backward();
      opt.step();
      copies_last_step = bf16_weight_copies_made() - c0;
    }
  }
  double held_out_loss() {
    PrecisionGuard fp32(Precision::fp32);
    nn::EvalScope eval(m);
    autograd::NoGrad ng;
    Generator held_out(78);
    double l = 0;
    for (int i = 0; i < 8; ++i) {
      const Batch b = reverse_batch(held_out, 32);
      l += m.loss(b.src, b.tgt_in, b.tgt_out, 0.1).item() / 8;
    }
    return l;
  }
};

// The task is learned once the held-out loss is below this (from ln 24 = 3.2 at the start; the
// label-smoothed floor is about 0.63). A run drops from ~2.4 to ~0.7 within a hundred-odd steps
// somewhere between steps 100 and 400 (it depends on the initial weights): a comparison at a
// fixed step inside that drop would measure when the drop came, not how well bf16 trains.
constexpr double kLearned = 0.7;
constexpr int kEvery = 50, kCap = 3000;

// Trains until the held-out loss is below kLearned (checked every kEvery steps, at most kCap
// steps); returns the step it got there, or -1.
inline int train_until_learned(TinyRun& r) {
  while (r.steps < kCap) {
    r.train(kEvery);
    if (r.held_out_loss() < kLearned) return (int)r.steps;
  }
  return -1;
}

// A TinyRun that has learned the task and trained kEvery steps further (onto the flat part of the
// curve, where decoding choices have margins far above a reduced precision's error), in eval
// mode, with 32 held-out sources and their float32 greedy and beam-3 decodes (10 tokens at most).
struct LearnedDecoder {
  TinyRun run;
  Batch batch;
  models::Sequences greedy, beam;
  bool learned = false;  // false: float32 did not learn the task in kCap steps

  LearnedDecoder() {
    if (train_until_learned(run) < 0) return;
    learned = true;
    run.train(kEvery);
    run.m.eval();
    Generator g(99);
    batch = reverse_batch(g, 32);
    PrecisionGuard fp32(Precision::fp32);
    greedy = decode(1);
    beam = decode(3);
  }
  // The 32 sources decoded greedily (beam_size 1) or by beam search, in the precision in force.
  models::Sequences decode(int64_t beam_size) const {
    models::DecodeOptions o;
    o.max_len = 10;
    o.beam = beam_size;
    return models::translate(run.m, batch.src, o);
  }
  // The first n sources decoded one at a time (batch 1), greedily or by beam search.
  models::Sequences decode_one_by_one(int64_t n, int64_t beam_size) const {
    models::DecodeOptions o;
    o.max_len = 10;
    o.beam = beam_size;
    models::Sequences all;
    for (int64_t i = 0; i < n; ++i)
      all.push_back(models::translate(run.m, slice(batch.src, 0, i, i + 1), o)[0]);
    return all;
  }
  // How many of the sequences equal their counterparts in `want`.
  static int same(const models::Sequences& got, const models::Sequences& want) {
    int n = 0;
    for (size_t i = 0; i < got.size() && i < want.size(); ++i) n += got[i] == want[i];
    return n;
  }
};

}  // namespace graft::testing::tiny_reverse
