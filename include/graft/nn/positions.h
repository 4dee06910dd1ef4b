/// @file
/// Positional encodings: one kind per model, chosen in its config.
/// - sinusoidal: PE(t, 2j) = sin(t / 10000^(2j/d)), PE(t, 2j+1) = cos(..), added to the embeddings
/// - learned: a (max_len, d) table added to the embeddings; refuses positions >= max_len
/// - rope: q and k head vectors rotated by angle t * base^(-2i/Dh) (ops/rope.h)
/// - alibi: score bias -m_h * (i - j) (causal) or -m_h * |i - j| (bidirectional)
/// - relative: T5's learned score bias b[bucket(j - i), h], shared by the layers of a stack
///
/// The first two act on the embeddings (nn/layers.h); the last three act inside self-attention
/// through AttentionPositions, given the absolute positions of the queries and keys (so a KV
/// cache's offset is honoured). Cross-attention gets no positional term under any of them.
#pragma once

#include <string>
#include <vector>

#include "graft/nn/module.h"

namespace graft::nn {

/// The positional encoding of a model (see the file's description for each kind).
enum class Positions { sinusoidal, learned, rope, alibi, relative };
/// The kind named "sinusoidal", "learned", "rope", "alibi" or "relative".
/// @throws graft::Error for any other name; the message lists the five names.
Positions parse_positions(const std::string& name);
/// The kind's name, as parse_positions() reads it.
const char* positions_name(Positions p);

/// How rope's frequencies are scaled for a longer context (Hugging Face `rope_scaling`):
/// none; linear (every frequency divided by the factor); llama3 (Llama 3.1: wavelengths longer
/// than original_max_len / low_freq_factor divided by the factor, shorter than
/// original_max_len / high_freq_factor kept, the band between blended smoothly).
enum class RopeScaling { none, linear, llama3 };
/// The scaling named "none", "linear" or "llama3".
/// @throws graft::Error for any other name; the message lists the three names.
RopeScaling parse_rope_scaling(const std::string& name);
/// The scaling's name, as parse_rope_scaling() reads it.
const char* rope_scaling_name(RopeScaling s);

/// A model's positional settings, as its config holds them.
struct PositionOptions {
  Positions kind = Positions::sinusoidal;        ///< which encoding
  double rope_base = 10000.0;                    ///< rope: the base of the angles
  RopeScaling rope_scaling = RopeScaling::none;  ///< rope: how the frequencies are scaled
  double rope_factor =
      1.0;  ///< rope linear/llama3: the divisor of the (long) wavelengths' frequencies
  /// rope llama3: the band of wavelengths between original_max_len / high and / low is blended.
  ///@{
  double rope_low_freq_factor = 1.0, rope_high_freq_factor = 4.0;
  ///@}
  int64_t rope_original_max_len = 8192;  ///< rope llama3: the context the model was trained on
  /// relative: the number of buckets and the distance beyond which all share the last one.
  ///@{
  int64_t relative_buckets = 32, relative_max_distance = 128;
  ///@}
};

/// What a self-attention layer adds for positions. Queries sit at positions q_start .. q_start +
/// Tq - 1 and keys at k_start .. k_start + Tk - 1 (a KV cache: keys from 0, new queries at the
/// cache length). The base class adds nothing.
class AttentionPositions : public Module {
 public:
  /// x (B, H, T, Dh) at positions start .. start + T - 1 -> the transformed x (RoPE), or x.
  virtual Tensor rotate(const Tensor& x, int64_t start) const;
  /// Additive score bias broadcastable to (B, H, Tq, Tk), or undefined.
  virtual Tensor bias(int64_t q_start, int64_t Tq, int64_t k_start, int64_t Tk, DType dt) const;
};

/// rope's frequencies for head size Dh under o's base and scaling: base^(-2i/Dh), i < Dh / 2,
/// then scaled (RopeScaling).
/// @throws graft::Error when Dh is odd, the base is not finite and > 1, or a scaling's factors
///         are out of range (factor >= 1, 0 < low < high, original_max_len >= 1).
std::vector<double> rope_frequencies(const PositionOptions& o, int64_t Dh);

/// RoPE: rotates queries and keys by their positions (see rope()).
class RotaryPositions : public AttentionPositions {
 public:
  /// Angles t * base^(-2i/Dh).
  explicit RotaryPositions(double base) {
    options.kind = Positions::rope, options.rope_base = base;
  }
  /// Angles t * rope_frequencies(o, Dh)[i].
  explicit RotaryPositions(const PositionOptions& o) : options(o) {}
  /// x (B, H, T, Dh) rotated at positions start .. start + T - 1.
  /// @throws graft::Error when Dh is odd or base is not > 1 (see rope()).
  Tensor rotate(const Tensor& x, int64_t start) const override;
  PositionOptions options;  ///< the base and the scaling of the angles
};

/// ALiBi slopes for H heads: 2^(-8h/H), h = 1..H, for H a power of two; otherwise those of the
/// nearest smaller power of two n followed by every other slope of 2n (Press et al.).
std::vector<double> alibi_slopes(int64_t heads);

/// ALiBi: a fixed linear score bias per head, no parameters.
class AlibiPositions : public AttentionPositions {
 public:
  /// Slopes for `heads` heads (alibi_slopes()); causal or bidirectional distances.
  AlibiPositions(int64_t heads, bool causal);
  /// causal: -m_h (i - j) equals m_h j up to a per-row constant, which softmax ignores, so the
  /// bias is (1, H, 1, Tk) = -m_h (Tk - 1 - j); bidirectional: (1, H, Tq, Tk) = -m_h |i - j|.
  Tensor bias(int64_t q_start, int64_t Tq, int64_t k_start, int64_t Tk, DType dt) const override;
  std::vector<double> slopes;  ///< m_h, one per head
  bool causal;                 ///< the bias form (see bias())
};

/// T5's bucket of a relative position (key - query): exact below buckets/2 (per direction when
/// bidirectional), log-spaced up to max_distance, the last bucket beyond.
int64_t relative_bucket(int64_t relative, bool bidirectional, int64_t buckets,
                        int64_t max_distance);

/// T5's relative position bias: a learned scalar per (bucket, head), added to the scores.
class RelativePositionBias : public AttentionPositions {
 public:
  /// A (buckets, heads) table drawn from N(0, 0.1^2); see relative_bucket().
  /// @throws graft::Error when buckets < 4 or max_distance does not exceed the exact range.
  RelativePositionBias(int64_t heads, bool bidirectional, int64_t buckets, int64_t max_distance,
                       DType dt, Generator& gen);
  /// (1, H, Tq, Tk) = weight[bucket(j - i), h], through embedding (weight gets gradients).
  /// In the weight's dtype; `dt` is ignored.
  Tensor bias(int64_t q_start, int64_t Tq, int64_t k_start, int64_t Tk, DType dt) const override;
  Tensor weight;  ///< (buckets, heads)
  /// Buckets per direction (encoder), or for keys before the query only (decoder).
  bool bidirectional;
  /// The bucket settings (see relative_bucket()).
  ///@{
  int64_t buckets, max_distance;
  ///@}
};

/// The embedding-side part of a kind: forward(x, start) adds sinusoidal or learned positions
/// start .. start + T - 1 to x (B, T, d), and is the identity for rope, alibi and relative.
/// Learned positions are the parameter "weight" (max_len, d), sinusoidal ones the buffer "table".
class EmbeddingPositions : public Module {
 public:
  /// The table for `kind` (none for rope, alibi and relative).
  EmbeddingPositions(Positions kind, int64_t max_len, int64_t d, DType dt, Generator& gen);
  /// x (B, T, d) -> x + positions start .. start + T - 1 (or x).
  /// @throws graft::Error when x is not 3-D, start < 0, or (learned) start + T > max_len.
  Tensor forward(const Tensor& x, int64_t start = 0) const;
  Positions kind;  ///< which encoding
  Tensor table;    ///< (max_len, d): the weight (learned) or the sinusoid table, else undefined
};

/// The attention-side module of a stack for `o.kind`, or null for sinusoidal and learned.
/// causal: the stack's self-attention is causal (decoder) rather than bidirectional (encoder).
/// @throws graft::Error for bad relative settings (see RelativePositionBias).
std::shared_ptr<AttentionPositions> make_attention_positions(const PositionOptions& o,
                                                             int64_t heads, bool causal, DType dt,
                                                             Generator& gen);

}  // namespace graft::nn
