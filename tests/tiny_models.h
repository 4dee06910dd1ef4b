// The tiny Transformer config the model tests build (vocabulary 23, width 16, 2 heads, FFN 24,
// 2 + 2 layers, no dropout), shared by test_models and test_positions.
#pragma once

#include "graft/models/transformer.h"

namespace graft::testing {

// The tiny config with the given longest sequence, seed, dtype and positions.
inline models::TransformerConfig tiny_transformer(int64_t max_len, uint64_t seed,
                                                  DType dt = DType::f32,
                                                  nn::Positions p = nn::Positions::sinusoidal) {
  models::TransformerConfig c;
  c.vocab = 23, c.d_model = 16, c.heads = 2, c.d_ff = 24, c.enc_layers = 2, c.dec_layers = 2;
  c.max_len = max_len, c.dropout = 0.0, c.dtype = dt, c.seed = seed, c.positions.kind = p;
  return c;
}

}  // namespace graft::testing
