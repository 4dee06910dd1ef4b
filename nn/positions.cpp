#include "graft/nn/positions.h"

#include <cmath>

#include "graft/autograd/text.h"
#include "graft/nn/layers.h"
#include "graft/ops/ops.h"

namespace graft::nn {

namespace {
const char* const kNames[] = {"sinusoidal", "learned", "rope", "alibi", "relative"};
}

Positions parse_positions(const std::string& name) {
  for (int i = 0; i < 5; ++i)
    if (name == kNames[i]) return (Positions)i;
  fail("positions: unknown kind '" + text::printable(name) +
       "' (known: sinusoidal, learned, rope, alibi, relative)");
}

const char* positions_name(Positions p) { return kNames[(int)p]; }

EmbeddingPositions::EmbeddingPositions(Positions k, int64_t max_len, int64_t d, DType dt,
                                       Generator& gen)
    : kind(k) {
  if (kind == Positions::learned)
    table = register_parameter("weight", new_parameter({max_len, d}, dt, [&] {
                                 return randn({max_len, d}, dt, gen, 0.0, 0.02);
                               }));
  if (kind == Positions::sinusoidal)
    table = register_buffer("table", sinusoid_table(0, max_len, d, dt));
}

Tensor EmbeddingPositions::forward(const Tensor& x, int64_t start) const {
  const auto named = scope();
  if (kind != Positions::learned && kind != Positions::sinusoidal) return x;
  return add_positions(x, table, start, kind == Positions::sinusoidal);
}

Tensor AttentionPositions::rotate(const Tensor& x, int64_t) const { return x; }
Tensor AttentionPositions::bias(int64_t, int64_t, int64_t, int64_t, DType) const {
  return Tensor();
}

RopeScaling parse_rope_scaling(const std::string& name) {
  for (RopeScaling s : {RopeScaling::none, RopeScaling::linear, RopeScaling::llama3})
    if (name == rope_scaling_name(s)) return s;
  fail("rope scaling: unknown kind '" + text::printable(name) + "' (known: none, linear, llama3)");
}

const char* rope_scaling_name(RopeScaling s) {
  return s == RopeScaling::linear ? "linear" : s == RopeScaling::llama3 ? "llama3" : "none";
}

namespace {

void check_rope_scaling(const PositionOptions& o) {
  if (o.rope_scaling == RopeScaling::none) return;
  if (!(o.rope_factor >= 1) || !std::isfinite(o.rope_factor))
    fail("rope scaling: factor must be finite and >= 1, got " + std::to_string(o.rope_factor));
  if (o.rope_scaling != RopeScaling::llama3) return;
  if (!(o.rope_low_freq_factor > 0 && o.rope_low_freq_factor < o.rope_high_freq_factor) ||
      !std::isfinite(o.rope_high_freq_factor))
    fail("rope scaling: llama3 needs 0 < low_freq_factor < high_freq_factor, got " +
         std::to_string(o.rope_low_freq_factor) + " and " +
         std::to_string(o.rope_high_freq_factor));
  if (o.rope_original_max_len < 1)
    fail("rope scaling: llama3 needs original_max_len >= 1, got " +
         std::to_string(o.rope_original_max_len));
}

// Llama 3.1's rule (Hugging Face's _compute_llama3_parameters): long wavelengths slowed by the
// factor, short ones kept, the band between blended by where the wavelength falls in it.
double llama3_frequency(double f, const PositionOptions& o) {
  const double old = (double)o.rope_original_max_len, wavelen = 2 * M_PI / f;
  if (wavelen > old / o.rope_low_freq_factor) return f / o.rope_factor;
  if (wavelen < old / o.rope_high_freq_factor) return f;
  const double s =
      (old / wavelen - o.rope_low_freq_factor) / (o.rope_high_freq_factor - o.rope_low_freq_factor);
  return (1 - s) * f / o.rope_factor + s * f;
}

}  // namespace

std::vector<double> rope_frequencies(const PositionOptions& o, int64_t Dh) {
  check_rope_scaling(o);
  std::vector<double> f = graft::rope_frequencies(Dh, o.rope_base);
  for (double& x : f)
    x = o.rope_scaling == RopeScaling::linear   ? x / o.rope_factor
        : o.rope_scaling == RopeScaling::llama3 ? llama3_frequency(x, o)
                                                : x;
  return f;
}

Tensor RotaryPositions::rotate(const Tensor& x, int64_t start) const {
  const int64_t T = x.size(-2);
  std::vector<int64_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = start + t;
  if (options.rope_scaling == RopeScaling::none)
    return rope(x, from_vector(pos, {T}), options.rope_base);
  return rope(x, from_vector(pos, {T}), rope_frequencies(options, x.size(-1)));
}

std::vector<double> alibi_slopes(int64_t heads) {
  auto pow2 = [](int64_t n) {
    std::vector<double> s(n);
    for (int64_t h = 1; h <= n; ++h) s[h - 1] = std::pow(2.0, -8.0 * (double)h / (double)n);
    return s;
  };
  int64_t n = 1;
  while (n * 2 <= heads) n *= 2;
  std::vector<double> s = pow2(n);
  const std::vector<double> extra = pow2(2 * n);
  for (int64_t i = 0; (int64_t)s.size() < heads; i += 2) s.push_back(extra[i]);
  return s;
}

AlibiPositions::AlibiPositions(int64_t heads, bool causal)
    : slopes(alibi_slopes(heads)), causal(causal) {}

Tensor AlibiPositions::bias(int64_t q_start, int64_t Tq, int64_t k_start, int64_t Tk,
                            DType dt) const {
  const int64_t H = (int64_t)slopes.size(), rows = causal ? 1 : Tq;
  std::vector<double> b(H * rows * Tk);
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < Tk; ++j)
        b[(h * rows + i) * Tk + j] =
            causal ? -slopes[h] * (double)(Tk - 1 - j)
                   : -slopes[h] * (double)std::llabs(q_start + i - k_start - j);
  return from_vector(b, {1, H, rows, Tk}, dt);
}

int64_t relative_bucket(int64_t relative, bool bidirectional, int64_t buckets,
                        int64_t max_distance) {
  int64_t ret = 0, n = -relative;
  if (bidirectional) {
    buckets /= 2;
    if (n < 0) ret += buckets;
    n = std::llabs(n);
  } else {
    n = std::max<int64_t>(n, 0);
  }
  const int64_t max_exact = buckets / 2;
  if (n < max_exact) return ret + n;
  const int64_t large = max_exact + (int64_t)(std::log((double)n / (double)max_exact) /
                                              std::log((double)max_distance / (double)max_exact) *
                                              (double)(buckets - max_exact));
  return ret + std::min(large, buckets - 1);
}

RelativePositionBias::RelativePositionBias(int64_t heads, bool bidirectional, int64_t buckets,
                                           int64_t max_distance, DType dt, Generator& gen)
    : bidirectional(bidirectional), buckets(buckets), max_distance(max_distance) {
  if (buckets < 4 || max_distance <= buckets / (bidirectional ? 4 : 2))
    fail("RelativePositionBias: need buckets >= 4 and max_distance > the exact range, got " +
         std::to_string(buckets) + " buckets, max_distance " + std::to_string(max_distance));
  weight = register_parameter("weight", new_parameter({buckets, heads}, dt, [&] {
                                return randn({buckets, heads}, dt, gen, 0.0, 0.1);
                              }));
}

Tensor RelativePositionBias::bias(int64_t q_start, int64_t Tq, int64_t k_start, int64_t Tk,
                                  DType) const {
  std::vector<int64_t> ids(Tq * Tk);
  for (int64_t i = 0; i < Tq; ++i)
    for (int64_t j = 0; j < Tk; ++j)
      ids[i * Tk + j] =
          relative_bucket(k_start + j - (q_start + i), bidirectional, buckets, max_distance);
  Tensor b = embedding(weight, from_vector(ids, {Tq, Tk}));  // (Tq, Tk, H)
  return unsqueeze(permute(b, {2, 0, 1}), 0);                // (1, H, Tq, Tk)
}

std::shared_ptr<AttentionPositions> make_attention_positions(const PositionOptions& o,
                                                             int64_t heads, bool causal, DType dt,
                                                             Generator& gen) {
  switch (o.kind) {
    case Positions::rope:
      return std::make_shared<RotaryPositions>(o);
    case Positions::alibi:
      return std::make_shared<AlibiPositions>(heads, causal);
    case Positions::relative:
      return std::make_shared<RelativePositionBias>(heads, !causal, o.relative_buckets,
                                                    o.relative_max_distance, dt, gen);
    default:
      return nullptr;
  }
}

}  // namespace graft::nn
