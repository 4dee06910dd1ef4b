#include "graft/models/decoding.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <tuple>
#include <type_traits>

#include "graft/autograd/tape.h"
#include "graft/nn/attention.h"
#include "graft/nn/layers.h"
#include "graft/ops/custom.h"
#include "graft/ops/ops.h"

namespace graft::models {

namespace {

// The sampling options' ranges; errors start with `who`.
void check_sampling_options(const SamplingOptions& s, const char* who) {
  if (!(s.temperature > 0) || !std::isfinite(s.temperature))
    fail(std::string(who) + ": temperature must be a finite number > 0, got " +
         std::to_string(s.temperature));
  if (s.top_k < 0)
    fail(std::string(who) + ": top_k must be >= 0 (0: no limit), got " + std::to_string(s.top_k));
  if (!(s.top_p > 0 && s.top_p <= 1))
    fail(std::string(who) + ": top_p must be in (0, 1], got " + std::to_string(s.top_p));
}

// HF's repetition_penalty range: a finite number > 0 (1: off); errors start with `who`.
void check_repetition_penalty(double penalty, const char* who) {
  if (!(penalty > 0) || !std::isfinite(penalty))
    fail(std::string(who) + ": repetition_penalty must be a finite number > 0 (1: off), got " +
         std::to_string(penalty));
}

// The linear weights under `m` (path prefix `at`): nn::Linear's weight and attention's
// in_proj_weight, with their parameter paths.
void linear_weights(const nn::Module& m, const std::string& at, nn::NamedTensors& out) {
  if (auto* l = dynamic_cast<const nn::Linear*>(&m)) out.emplace_back(at + "weight", l->weight);
  if (auto* a = dynamic_cast<const nn::MultiHeadAttention*>(&m))
    out.emplace_back(at + "in_proj_weight", a->in_proj_weight);
  for (const auto& [name, child] : m.children()) linear_weights(*child, at + name + ".", out);
}

// The tables of the nn::Embedding modules under m (at path `at`), each storage once: int8
// inference looks rows up from their int8 form, and a tied output projection reads the same form.
void embedding_tables(const nn::Module& m, const std::string& at, nn::NamedTensors& out,
                      std::set<const Storage*>& seen) {
  if (auto* e = dynamic_cast<const nn::Embedding*>(&m))
    if (seen.insert(e->weight.impl()->storage.get()).second)
      out.emplace_back(at + "weight", e->weight);
  for (const auto& [name, child] : m.children())
    embedding_tables(*child, at + name + ".", out, seen);
}

// Keeps every weight int8_linear_weights() names in `keep`'s inference form (int8:
// quantize_weight_int8; bf16: keep_weight_bf16; fp32 packs them: keep_weights_fp32), freeing its
// float32 (bf16) values; returns the bytes freed.
size_t free_float32_linears(nn::Module& model, size_t (*keep)(const Tensor&, const std::string&)) {
  size_t freed = 0;
  for (const auto& [name, w] : int8_linear_weights(model)) freed += keep(w, name);
  return freed;
}

}  // namespace

std::vector<std::pair<std::string, Tensor>> int8_linear_weights(const nn::Module& model) {
  nn::NamedTensors linears, out;
  linear_weights(model, "", linears);
  std::map<const Storage*, int> users;  // parameters per storage: a shared one stays float32
  for (const auto& [name, t] : model.named_parameters()) ++users[t.impl()->storage.get()];
  for (const auto& [name, w] : linears)
    if (w.defined() && users[w.impl()->storage.get()] == 1) out.emplace_back(name, w);
  return out;
}

std::vector<std::pair<std::string, Tensor>> embedding_tables(const nn::Module& model) {
  nn::NamedTensors out;
  std::set<const Storage*> seen;
  embedding_tables(model, "", out, seen);
  return out;
}

size_t keep_for_inference(nn::Module& model, Precision p) {
  size_t freed = 0;
  if (p == Precision::int8) {
    freed = free_float32_linears(model, quantize_weight_int8);
    for (const auto& [name, w] : embedding_tables(model)) freed += quantize_weight_int8(w, name);
  } else if (p == Precision::fp32) {  // one copy of each linear weight: the kernel's layout
    nn::NamedTensors kept = int8_linear_weights(model);
    // The tables too: lookups read rows out of the kept form, a tied projection reads that form.
    for (auto& table : embedding_tables(model)) kept.push_back(std::move(table));
    freed = keep_weights_fp32(kept);  // packed: one block, huge pages
  } else if (p == Precision::bf16) {  // a bf16 model: 2 bytes a weight, its matmuls native
    for (const auto& [name, t] : model.named_parameters())
      if (t.dtype() == DType::f32) freed += (size_t)t.numel() * 2;
    model.to(DType::bf16);
    // Each linear weight then once in the bf16 kernel's blocked layout (as many bytes): its
    // plain bytes freed, the kept form allocated, so neither counts.
    free_float32_linears(model, keep_weight_bf16);
  }
  keep_weights_together(int8_linear_weights(model));  // what a step streams: on 2 MiB pages
  Storage::release_cached();                          // what loading freed: decoding's sizes differ
  return freed;
}

void check_decode_options(const DecodeOptions& o) {
  if (o.max_len < 1) fail("decode: max_len must be >= 1, got " + std::to_string(o.max_len));
  if (o.beam < 1) fail("decode: beam must be >= 1, got " + std::to_string(o.beam));
  check_sampling_options(o.sampling, "decode");
  if (o.sample && o.beam > 1) fail("decode: sampling draws one sequence per input; beam must be 1");
  check_repetition_penalty(o.repetition_penalty, "decode");
  if (o.min_new_tokens < 0 || o.min_new_tokens > o.max_len)
    fail("decode: min_new_tokens must be in [0, max_len " + std::to_string(o.max_len) + "], got " +
         std::to_string(o.min_new_tokens));
  for (int64_t id : o.stop_ids)
    if (id < 0) fail("decode: stop_ids holds " + std::to_string(id) + ", not a token id (< 0)");
  for (int64_t id : o.banned_ids)
    if (id < 0) fail("decode: banned_ids holds " + std::to_string(id) + ", not a token id (< 0)");
  if (o.forced_eos_id < -1)
    fail("decode: forced_eos_id must be a token id or -1 (off), got " +
         std::to_string(o.forced_eos_id));
  if (!std::isfinite(o.length_penalty))
    fail("decode: length_penalty must be a finite number, got " + std::to_string(o.length_penalty));
}

std::vector<int64_t> stop_set(int64_t eos, const DecodeOptions& o) {
  std::vector<int64_t> ids;
  if (eos >= 0) ids.push_back(eos);
  for (int64_t id : o.stop_ids)
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  return ids;
}

void check_stop_ids(int64_t eos, const DecodeOptions& o, int64_t vocab) {
  for (int64_t id : stop_set(eos, o))
    if (id >= vocab)
      fail("decode: stop id " + std::to_string(id) + " is outside the vocabulary [0, " +
           std::to_string(vocab) + ")");
}

void apply_repetition_penalty(std::vector<double>& scores, const std::vector<int64_t>& seen,
                              double penalty) {
  check_repetition_penalty(penalty, "apply_repetition_penalty");
  const int64_t V = (int64_t)scores.size();
  std::vector<int64_t> ids;
  for (int64_t id : seen)
    if (id >= 0 && id < V) ids.push_back(id);
  std::sort(ids.begin(), ids.end());  // each id once: a token seen twice is penalised once
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  for (int64_t id : ids) scores[id] = scores[id] < 0 ? scores[id] * penalty : scores[id] / penalty;
}

std::vector<double> sampling_distribution(const std::vector<double>& logits,
                                          const SamplingOptions& o) {
  const int64_t V = (int64_t)logits.size();
  if (V == 0) fail("sampling_distribution: no logits");
  check_sampling_options(o, "sampling_distribution");
  // As greedy and beam search: a NaN (or +inf, whose softmax is NaN) is the model's fault, and
  // drawing from it would pick a token silently.
  for (int64_t v = 0; v < V; ++v)
    if (std::isnan(logits[v]) || logits[v] == std::numeric_limits<double>::infinity())
      fail("sample_token: the model's logit of token " + std::to_string(v) + " is " +
           (std::isnan(logits[v]) ? "NaN" : "+inf"));
  // Token ids from most to least likely (ties: lower id first).
  std::vector<int64_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
  const int64_t k = o.top_k > 0 ? std::min(o.top_k, V) : V;
  const double top = logits[order[0]] / o.temperature;
  std::vector<double> p(V, 0.0);
  double sum = 0;
  for (int64_t r = 0; r < k; ++r)
    sum += p[order[r]] = std::exp(logits[order[r]] / o.temperature - top);
  // Nucleus: the smallest prefix of `order` whose probability reaches top_p.
  double kept = 0;
  int64_t n = 0;
  while (n < k && (n == 0 || kept < o.top_p * sum)) kept += p[order[n++]];
  for (int64_t r = n; r < k; ++r) p[order[r]] = 0;
  for (int64_t r = 0; r < n; ++r) p[order[r]] /= kept;
  return p;
}

int64_t sample_token(const std::vector<double>& logits, const SamplingOptions& o, Generator& gen) {
  const std::vector<double> p = sampling_distribution(logits, o);
  const double u = gen.uniform();
  double c = 0;
  int64_t last = 0;
  for (int64_t v = 0; v < (int64_t)p.size(); ++v) {
    if (p[v] == 0) continue;
    c += p[v];
    last = v;
    if (u < c) return v;
  }
  return last;  // u within rounding of 1
}

namespace {

// What every step of one decode applies: its stop ids and the options' score rules.
struct Rules {
  int64_t eos;
  std::vector<int64_t> stops;  // stop_set(): empty when nothing stops a row
  const DecodeOptions& o;

  Rules(int64_t eos_id, const DecodeOptions& opt)
      : eos(eos_id), stops(stop_set(eos_id, opt)), o(opt) {}
  // At the first step, when the vocabulary is known: every stop, banned and forced id in it.
  void check_vocab(int64_t generated, const Tensor& logits) const {
    if (generated != 0 || logits.dim() != 2) return;
    const int64_t V = logits.size(1);
    check_stop_ids(eos, o, V);
    for (int64_t id : o.banned_ids)
      if (id >= V)
        fail("decode: banned id " + std::to_string(id) + " is outside the vocabulary [0, " +
             std::to_string(V) + ")");
    if (o.forced_eos_id >= V)
      fail("decode: forced_eos_id " + std::to_string(o.forced_eos_id) +
           " is outside the vocabulary [0, " + std::to_string(V) + ")");
  }
  bool stops_at(int64_t token) const {
    return std::find(stops.begin(), stops.end(), token) != stops.end();
  }
  // What a finished row repeats (never used when nothing stops a row).
  int64_t pad() const { return stops.empty() ? -1 : stops[0]; }
  // Whether the scores of a step after `generated` new tokens need changing (else they are used
  // as the model gave them, with no copy).
  bool changes_scores(int64_t generated) const {
    return o.repetition_penalty != 1 || (generated < o.min_new_tokens && !stops.empty()) ||
           !o.banned_ids.empty() || forces_eos(generated);
  }
  // Whether the only changes of a step's scores are masks (banned ids, the forced eos), which
  // masked_scores() applies to float32 scores with no float64 round trip.
  bool masks_only(int64_t generated) const {
    return o.repetition_penalty == 1 && !(generated < o.min_new_tokens && !stops.empty());
  }
  // HF's ForcedEOSTokenLogitsProcessor: the last token (the max_len-th) is forced_eos_id.
  bool forces_eos(int64_t generated) const {
    return o.forced_eos_id >= 0 && generated == o.max_len - 1;
  }
  // HF's logits processors on (rows, V) scores: the repetition penalty over each row's tokens so
  // far, then the stop ids masked while fewer than min_new_tokens are generated.
  void change_scores(std::vector<double>& s, int64_t V, const Sequences& prefix,
                     int64_t generated) const {
    for (size_t r = 0; r < prefix.size(); ++r) {
      if (o.repetition_penalty != 1) {
        std::vector<double> row(s.begin() + (long)r * V, s.begin() + (long)(r + 1) * V);
        apply_repetition_penalty(row, prefix[r], o.repetition_penalty);
        std::copy(row.begin(), row.end(), s.begin() + (long)r * V);
      }
      if (generated < o.min_new_tokens)
        for (int64_t id : stops) s[r * V + id] = -std::numeric_limits<double>::infinity();
      for (int64_t id : o.banned_ids) s[r * V + id] = -std::numeric_limits<double>::infinity();
      if (forces_eos(generated)) {
        std::fill(s.begin() + (long)r * V, s.begin() + (long)(r + 1) * V,
                  -std::numeric_limits<double>::infinity());
        s[r * V + o.forced_eos_id] = 0;
      }
    }
  }
};

// The generated part of p (after its first `skip` tokens), cut at its first stop id (`cut`).
std::vector<int64_t> generated_part(const std::vector<int64_t>& p, size_t skip, const Rules& rules,
                                    bool cut) {
  std::vector<int64_t> out;
  for (size_t i = skip; i < p.size(); ++i) {
    if (cut && rules.stops_at(p[i])) break;
    out.push_back(p[i]);
  }
  return out;
}

void check_start(const Sequences& start) {
  if (start.empty() || start[0].empty()) fail("decode: needs at least one row with a first token");
  for (auto& s : start)
    if (s.size() != start[0].size())
      fail("decode: every row must start with the same number of tokens");
}

// The step's logits, refused unless (rows, V > 0): one row per sequence being decoded.
Tensor checked_logits(Tensor lg, size_t rows) {
  if (lg.dim() != 2 || lg.size(0) != (int64_t)rows || lg.size(1) < 1)
    fail("decode: the model's logits must be (rows, V) with one row for each of the " +
         std::to_string(rows) + " sequences being decoded, got " + describe(lg));
  return lg;
}

// One token per row per step, chosen by pick(the step's (rows, V) logits, prefix, tokens
// generated so far) -> a token per row; finished rows repeat the first stop id. Each token the
// result holds goes to o.on_token as it is chosen.
template <class Pick>
Sequences token_by_token(DecodeStep& step, const Sequences& start, const Rules& rules,
                         Pick&& pick) {
  check_start(start);
  autograd::NoGrad ng;
  const DecodeOptions& o = rules.o;
  const int64_t rows = (int64_t)start.size();
  const size_t skip = start[0].size();
  std::vector<std::vector<int64_t>> prefix = start;
  std::vector<bool> done(rows, false);
  for (int64_t t = 0; t < o.max_len; ++t) {
    const std::vector<int64_t> picked =
        pick(checked_logits(step.next_logits(prefix), prefix.size()), prefix, t);
    bool all = true;
    for (int64_t r = 0; r < rows; ++r) {
      const bool was_done = done[r];
      const int64_t next = was_done ? rules.pad() : picked[r];
      prefix[r].push_back(next);
      done[r] = was_done || rules.stops_at(next);
      all = all && done[r];
      if (o.on_token && (!o.stop_at_eos || !done[r])) o.on_token(next, r);
    }
    if (all && o.stop_at_eos) break;
  }
  Sequences out;
  for (auto& p : prefix) out.push_back(generated_part(p, skip, rules, o.stop_at_eos));
  return out;
}

// The step's logits as (rows, V) float64 values after rules.change_scores(); checks the stop ids
// against V at the first step.
std::vector<double> changed_scores(const Tensor& logits, const Sequences& prefix, int64_t generated,
                                   const Rules& rules) {
  const Tensor lg = contiguous(to_dtype(logits, DType::f64));
  if (lg.dim() != 2)
    fail("decode: the model's logits must be (rows, V), got " + shape_str(lg.shape()));
  std::vector<double> s = lg.to_vector<double>();
  rules.change_scores(s, lg.size(1), prefix, generated);
  return s;
}

// Float32 (rows, V) scores with the masks of rules.change_scores() applied to a copy: banned ids
// at -inf, and at the forced-eos step every id -inf but forced_eos_id (0). The same values as
// changed_scores() for rules.masks_only() steps (a float is exact in double), a tenth of its cost
// on Marian's 58101 ids (it converts every score to float64 and back).
Tensor masked_scores(const Tensor& scores, const Rules& rules, int64_t generated) {
  Tensor s = contiguous_copy(scores);
  const int64_t rows = s.size(0), V = s.size(1);
  float* p = s.data<float>();
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t id : rules.o.banned_ids) p[r * V + id] = -kInf;
    if (rules.forces_eos(generated)) {
      std::fill(p + r * V, p + (r + 1) * V, -kInf);
      p[r * V + rules.o.forced_eos_id] = 0;
    }
  }
  return s;
}

// The step's scores (rows, V) after the rules: as given when nothing changes them, masked in
// float32 (masked_scores()) when only masks apply to float32 scores, else through
// changed_scores() in float64.
Tensor scores_after_rules(const Tensor& scores, const Sequences& prefix, int64_t generated,
                          const Rules& rules) {
  if (!rules.changes_scores(generated)) return scores;
  if (rules.masks_only(generated) && scores.dtype() == DType::f32 && scores.dim() == 2)
    return masked_scores(scores, rules, generated);
  return from_vector(changed_scores(scores, prefix, generated, rules), scores.shape(), DType::f64);
}

// The first maximum of row[0, n) as the argmax op finds it: a NaN counts as the maximum (as
// PyTorch's argmax), the first of equal maxima wins.
// T is float, double, bfloat16 or float16 (each 16-bit logit widened to float as it is read:
// exact, so the same pick as on float32 logits). Two vectorised passes (the largest value and
// whether a NaN is there, then its first index) instead of one branchy scan: a step of one
// sentence reads its whole vocabulary here.
template <class T>
int64_t row_argmax(const T* row, int64_t n) {
  using W = std::conditional_t<std::is_same_v<T, double>, double, float>;
  W top = -std::numeric_limits<W>::infinity();
  bool nan = false;
#pragma omp simd reduction(max : top) reduction(|| : nan)
  for (int64_t k = 0; k < n; ++k) {
    const W v = W(row[k]);
    top = v > top ? v : top;
    nan = nan || v != v;
  }
  for (int64_t k = 0; k < n; ++k)
    if (nan ? std::isnan(W(row[k])) : W(row[k]) == top) return k;
  return 0;  // a row of -inf only (whatever value the max reduction starts from)
}

// A row whose argmax is a NaN logit: a broken model, refused by name.
void refuse_nan(int64_t r, int64_t token) {
  fail("greedy_search: the model's logit of token " + std::to_string(token) + " (row " +
       std::to_string(r) + ") is NaN");
}

// The argmax and max ops: for logits argmax_rows does not read itself (their errors name the
// shape or dtype).
std::vector<int64_t> argmax_op_rows(const Tensor& logits) {
  const std::vector<int64_t> best = argmax(logits, 1).to_vector<int64_t>();
  const std::vector<double> top = max(logits, 1).to_vector<double>();
  for (size_t r = 0; r < best.size(); ++r)
    if (std::isnan(top[r])) refuse_nan((int64_t)r, best[r]);
  return best;
}

template <class T>
void argmax_each_row(const T* p, int64_t rows, int64_t V, std::vector<int64_t>& best) {
  // Rows over the threads when there are more than kParallelGrain logits (a batch of 32 over a
  // vocabulary of 8000), on this thread otherwise (one sentence: no OpenMP region).
  kern::parallel_for(
      rows,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) best[r] = row_argmax(p + r * V, V);
      },
      std::max<int64_t>(kern::kParallelGrain / V, 1));
  for (int64_t r = 0; r < rows; ++r)  // after the loop: no exception leaves an OpenMP region
    if (std::isnan(float(p[r * V + best[r]]))) refuse_nan(r, best[r]);
}

// Each row's argmax of (rows, V) logits, in one pass over them with no tensor made per step (the
// argmax and max ops, each with its output tensors, cost a one-sentence step of a small model
// about 3%). 16-bit logits are read as they are, widened per element (no float32 copy); only
// strided logits are copied (contiguous).
std::vector<int64_t> argmax_rows(const Tensor& logits) {
  if (logits.dim() != 2 || logits.size(1) == 0) return argmax_op_rows(logits);
  const Tensor lg = contiguous(logits);
  const int64_t rows = lg.size(0), V = lg.size(1);
  std::vector<int64_t> best(rows);
  if (lg.dtype() == DType::f32) argmax_each_row(lg.data<const float>(), rows, V, best);
  else if (lg.dtype() == DType::f64) argmax_each_row(lg.data<const double>(), rows, V, best);
  else if (lg.dtype() == DType::bf16) argmax_each_row(lg.data<const bfloat16>(), rows, V, best);
  else if (lg.dtype() == DType::f16) argmax_each_row(lg.data<const float16>(), rows, V, best);
  else return argmax_op_rows(lg);
  return best;
}

}  // namespace

// The argmax of the model's logits (the first of equal maxima), no float64 copy of them unless
// the scores change (repetition_penalty, min_new_tokens). A NaN counts as the maximum, as in
// PyTorch's argmax: a row with one is refused, as in beam search.
Sequences greedy_search(DecodeStep& step, const Sequences& start, int64_t eos,
                        const DecodeOptions& o) {
  check_decode_options(o);
  const Rules rules(eos, o);
  return token_by_token(step, start, rules,
                        [&](const Tensor& logits, const Sequences& prefix, int64_t t) {
                          rules.check_vocab(t, logits);
                          return argmax_rows(scores_after_rules(logits, prefix, t, rules));
                        });
}

Sequences sample_search(DecodeStep& step, const Sequences& start, int64_t eos,
                        const DecodeOptions& o) {
  check_decode_options(o);
  const Rules rules(eos, o);
  Generator gen(o.seed);
  return token_by_token(
      step, start, rules, [&](const Tensor& logits, const Sequences& prefix, int64_t t) {
        rules.check_vocab(t, logits);
        const std::vector<double> s = changed_scores(logits, prefix, t, rules);
        const int64_t V = logits.size(1);
        std::vector<int64_t> picked(logits.size(0));
        for (int64_t r = 0; r < logits.size(0); ++r)
          picked[r] = sample_token(std::vector<double>(s.begin() + r * V, s.begin() + (r + 1) * V),
                                   o.sampling, gen);
        return picked;
      });
}

namespace {

// Beam state of B inputs x K beams, row r = b * K + k.
struct Beams {
  int64_t B, K;
  std::vector<std::vector<int64_t>> prefix;
  std::vector<double> score;
  std::vector<bool> done;
};

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Whether every one of row[0, n) is <= limit (false on a NaN).
template <class T>
bool none_above(const T* row, int64_t n, T limit) {
  bool above = false;
  for (int64_t i = 0; i < n; ++i) above |= !(row[i] <= limit);
  return !above;
}

// The K largest entries of row[0, V) as (value, token), largest first; ties go to the lower
// token (as argmax). One pass with a K-long sorted list: K is small, V is the vocabulary.
// @throws graft::Error on a NaN log-probability (a model that produced NaN logits).
template <class T>
std::vector<std::pair<T, int64_t>> top_tokens(const T* row, int64_t V, int64_t K) {
  std::vector<std::pair<T, int64_t>> top;
  top.reserve(K + 1);
  constexpr int64_t kChunk = 16;
  for (int64_t v = 0; v < V; ++v) {
    // Once K are held, a chunk wholly at or below the K-th (no NaN) cannot enter: one vector
    // compare instead of a branch a token (Marian beam 4, batch 32: 4% of a step's samples).
    while (K > 0 && (int64_t)top.size() == K && v % kChunk == 0 && v + kChunk <= V &&
           none_above(row + v, kChunk, top.back().first))
      v += kChunk;
    if (v == V) break;
    if (std::isnan(row[v]))
      fail("beam_search: the model's log-probability of token " + std::to_string(v) + " is NaN");
    if ((int64_t)top.size() == K && !(row[v] > top.back().first)) continue;
    auto at = std::find_if(top.begin(), top.end(), [&](const auto& e) { return row[v] > e.first; });
    top.insert(at, {row[v], v});
    if ((int64_t)top.size() > K) top.pop_back();
  }
  return top;
}

// The K best continuations of input b: (score, beam, token), highest score first; ties go to
// the lower beam, then the lower token id (as argmax). A finished beam only continues with `pad`
// (its first stop id) at no cost. Only each beam's K best tokens can be among the K best
// continuations, so those K * K are ranked (ranking all K * V dominated decoding time).
template <class T>
std::vector<std::tuple<double, int64_t, int64_t>> best_candidates(const Beams& s, int64_t b,
                                                                  const T* logp, int64_t V,
                                                                  int64_t pad) {
  std::vector<std::tuple<double, int64_t, int64_t>> cand;
  for (int64_t k = 0; k < s.K; ++k) {
    const int64_t r = b * s.K + k;
    if (s.score[r] == kNegInf) continue;
    if (s.done[r]) {
      cand.emplace_back(s.score[r], k, pad);
      continue;
    }
    for (const auto& [lp, v] : top_tokens(logp + r * V, V, s.K))
      cand.emplace_back(s.score[r] + (double)lp, k, v);
  }
  const size_t keep = std::min<size_t>(s.K, cand.size());
  std::partial_sort(cand.begin(), cand.begin() + keep, cand.end(), [](auto& x, auto& y) {
    if (std::get<0>(x) != std::get<0>(y)) return std::get<0>(x) > std::get<0>(y);
    return std::make_pair(std::get<1>(x), std::get<2>(x)) <
           std::make_pair(std::get<1>(y), std::get<2>(y));
  });
  cand.resize(keep);
  return cand;
}

// The step's log-probabilities (rows, V): float32 (float64 for a float64 model: the vectorised
// log_softmax; PyTorch's beam search does the same; a bf16 model's logits widened first, so that
// 3-digit log-probabilities do not tie the beams), then HF's logits processors on them as
// transformers' beam search applies them (after log_softmax, no renormalisation), in float64.
Tensor beam_log_probs(DecodeStep& step, const Sequences& prefix, const Rules& rules,
                      int64_t generated) {
  const Tensor logits = checked_logits(step.next_logits(prefix), prefix.size());
  rules.check_vocab(generated, logits);
  const Tensor lg =
      contiguous(log_softmax(is_half(logits.dtype()) ? to_dtype(logits, DType::f32) : logits, 1));
  return scores_after_rules(lg, prefix, generated, rules);
}

// Advances every input's beams by one token (`generated` so far); returns false when all are
// finished. The beams' running scores are in double.
bool beam_step(DecodeStep& step, Beams& s, const Rules& rules, int64_t generated) {
  const Tensor lg = beam_log_probs(step, s.prefix, rules, generated);
  const int64_t V = lg.size(1), pad = rules.pad();
  Beams next{
      s.B, s.K, {}, std::vector<double>(s.B * s.K, kNegInf), std::vector<bool>(s.B * s.K, true)};
  // Dead beams (score -inf) carry a valid id that is never used: the first stop id, or 0.
  std::vector<int64_t> pick(s.B * s.K), token(s.B * s.K, std::max<int64_t>(pad, 0));
  for (int64_t b = 0; b < s.B; ++b) {
    const auto cand = lg.dtype() == DType::f64
                          ? best_candidates(s, b, lg.data<const double>(), V, pad)
                          : best_candidates(s, b, lg.data<const float>(), V, pad);
    for (int64_t k = 0; k < s.K; ++k) {
      const int64_t r = b * s.K + k;
      pick[r] = b * s.K;
      if (k >= (int64_t)cand.size()) continue;
      auto [sc, from, tok] = cand[k];
      pick[r] = b * s.K + from;
      token[r] = tok;
      next.score[r] = sc;
      next.done[r] = s.done[b * s.K + from] || rules.stops_at(tok);
    }
  }
  step.select(pick);
  bool all = true;
  for (int64_t r = 0; r < s.B * s.K; ++r) {
    next.prefix.push_back(s.prefix[pick[r]]);
    next.prefix.back().push_back(token[r]);
    all = all && (next.done[r] || next.score[r] == kNegInf);
  }
  s = std::move(next);
  return !all;
}

// Beam search's streaming: each row's result once the search is over.
void stream_results(const Sequences& out, const DecodeOptions& o) {
  if (!o.on_token) return;
  for (size_t r = 0; r < out.size(); ++r)
    for (int64_t token : out[r]) o.on_token(token, (int64_t)r);
}

// ---------------------------------------------------------------------------------------------
// Hugging Face's beam search (transformers' _beam_search, early_stopping false), for o.hf_beam.

// HF's stand-in for -inf in beam scores: unfilled finished slots, masked candidates.
constexpr double kHfMasked = -1.0e9;

// A continuation: running score + log-probability, the beam (of its input) and the token.
struct HfCandidate {
  double score;
  int64_t beam, token;
};

// A finished slot of an input; unfilled: kHfMasked and not done.
struct HfFinished {
  double score = kHfMasked;
  std::vector<int64_t> seq;
  bool done = false;
};

// B inputs x K running beams (row b * K + k) and K finished slots per input, best first.
struct HfBeams {
  int64_t B, K;
  Sequences prefix;
  std::vector<double> score;
  std::vector<std::vector<HfFinished>> finished;
  std::vector<bool> improving;  // HF's is_early_stop_heuristic_unsatisfied
};

// The `keep` best continuations of input b over all its beams, as torch.topk over the flattened
// (beam x V) scores: highest first, ties to the lower beam, then the lower token. Only each
// beam's `keep` best tokens can be among them.
template <class T>
std::vector<HfCandidate> hf_candidates(const HfBeams& s, int64_t b, const T* logp, int64_t V,
                                       int64_t keep) {
  std::vector<HfCandidate> cand;
  for (int64_t k = 0; k < s.K; ++k) {
    const int64_t r = b * s.K + k;
    for (const auto& [lp, v] : top_tokens(logp + r * V, V, keep))
      cand.push_back({s.score[r] + (double)lp, k, v});
  }
  std::stable_sort(cand.begin(), cand.end(),
                   [](const HfCandidate& x, const HfCandidate& y) { return x.score > y.score; });
  cand.resize(std::min<size_t>(keep, cand.size()));
  return cand;
}

// Candidates among the K best that end their row enter the finished slots with score
// sum / generated_len^length_penalty, while the input can still improve (_update_finished_beams).
void hf_finalize(HfBeams& s, int64_t b, const std::vector<HfCandidate>& cand,
                 const std::vector<bool>& hits, int64_t len, double length_penalty) {
  if (!s.improving[b]) return;
  std::vector<HfFinished>& f = s.finished[b];
  for (int64_t c = 0; c < std::min<int64_t>(s.K, (int64_t)cand.size()); ++c) {
    if (!hits[c]) continue;
    HfFinished e{cand[c].score / std::pow((double)len, length_penalty),
                 s.prefix[b * s.K + cand[c].beam], true};
    e.seq.push_back(cand[c].token);
    f.push_back(std::move(e));
  }
  std::stable_sort(f.begin(), f.end(),
                   [](const HfFinished& x, const HfFinished& y) { return x.score > y.score; });
  f.resize(s.K);
}

// The K best candidates that do not end their row continue (ended ones masked, as
// _get_running_beams_for_next_iteration): their source rows in `pick`, their tokens in `token`.
void hf_running(HfBeams& s, int64_t b, const std::vector<HfCandidate>& cand,
                const std::vector<bool>& hits, std::vector<int64_t>& pick,
                std::vector<int64_t>& token) {
  std::vector<HfCandidate> next = cand;
  for (size_t c = 0; c < next.size(); ++c)
    if (hits[c]) next[c].score += kHfMasked;
  std::stable_sort(next.begin(), next.end(),
                   [](const HfCandidate& x, const HfCandidate& y) { return x.score > y.score; });
  for (int64_t k = 0; k < s.K; ++k) {
    const int64_t r = b * s.K + k;
    const HfCandidate& c = next[std::min<size_t>(k, next.size() - 1)];
    pick[r] = b * s.K + c.beam, token[r] = c.token, s.score[r] = c.score;
  }
}

// _check_early_stop_heuristic: an input stops improving once all K slots are finished and its
// best running score over `len` cannot beat the worst of them.
void hf_update_improving(HfBeams& s, int64_t len, double length_penalty) {
  for (int64_t b = 0; b < s.B; ++b) {
    const std::vector<HfFinished>& f = s.finished[b];
    bool all_done = true;
    double worst = std::numeric_limits<double>::infinity();
    for (const HfFinished& e : f) all_done = all_done && e.done, worst = std::min(worst, e.score);
    const double best = s.score[b * s.K] / std::pow((double)len, length_penalty);
    s.improving[b] = s.improving[b] && (!all_done || best > worst);
  }
}

// One step of HF's beam search after `generated` tokens; false when the search is over (no input
// can improve, or every candidate ended its row).
bool hf_beam_step(DecodeStep& step, HfBeams& s, const Rules& rules, int64_t generated) {
  const DecodeOptions& o = rules.o;
  const Tensor lg = beam_log_probs(step, s.prefix, rules, generated);
  const int64_t V = lg.size(1), K = s.K;
  const int64_t keep = std::max<int64_t>(2, 1 + (int64_t)rules.stops.size()) * K;
  const bool last = generated + 1 == o.max_len;
  std::vector<int64_t> pick(s.B * K), token(s.B * K);
  bool all_hit = true;
  for (int64_t b = 0; b < s.B; ++b) {
    const auto cand = lg.dtype() == DType::f64
                          ? hf_candidates(s, b, lg.data<const double>(), V, keep)
                          : hf_candidates(s, b, lg.data<const float>(), V, keep);
    std::vector<bool> hits(cand.size());
    for (size_t c = 0; c < cand.size(); ++c)
      hits[c] = last || (o.stop_at_eos && rules.stops_at(cand[c].token));
    for (bool h : hits) all_hit = all_hit && h;
    hf_finalize(s, b, cand, hits, generated + 1, o.length_penalty);
    hf_running(s, b, cand, hits, pick, token);
  }
  step.select(pick);
  Sequences next;
  for (int64_t r = 0; r < s.B * K; ++r) {
    next.push_back(s.prefix[pick[r]]);
    next.back().push_back(token[r]);
  }
  s.prefix = std::move(next);
  hf_update_improving(s, generated + 1, o.length_penalty);
  const bool improving =
      std::any_of(s.improving.begin(), s.improving.end(), [](bool v) { return v; });
  return improving && !all_hit;
}

Sequences hf_beam_search(DecodeStep& step, const Sequences& start, const Rules& rules) {
  const DecodeOptions& o = rules.o;
  const int64_t K = o.beam, rows = (int64_t)start.size();
  HfBeams s{rows,
            K,
            {},
            std::vector<double>(rows * K, kHfMasked),
            std::vector<std::vector<HfFinished>>(rows, std::vector<HfFinished>(K)),
            std::vector<bool>(rows, true)};
  std::vector<int64_t> expand;
  for (int64_t b = 0; b < rows; ++b)
    for (int64_t k = 0; k < K; ++k) expand.push_back(b), s.prefix.push_back(start[b]);
  step.select(expand);
  for (int64_t b = 0; b < rows; ++b) s.score[b * K] = 0;  // the other beams start at kHfMasked
  for (int64_t t = 0; t < o.max_len; ++t)
    if (!hf_beam_step(step, s, rules, t)) break;
  Sequences out;
  for (int64_t b = 0; b < rows; ++b) {
    const HfFinished& best = s.finished[b][0];
    out.push_back(generated_part(best.done ? best.seq : s.prefix[b * K], start[0].size(), rules,
                                 o.stop_at_eos));
  }
  stream_results(out, o);
  return out;
}

}  // namespace

Sequences beam_search(DecodeStep& step, const Sequences& start, int64_t eos,
                      const DecodeOptions& o) {
  check_decode_options(o);
  check_start(start);
  autograd::NoGrad ng;
  const Rules rules(eos, o);
  if (o.hf_beam) return hf_beam_search(step, start, rules);
  const int64_t K = o.beam, rows = (int64_t)start.size();
  const size_t skip = start[0].size();
  Beams s{rows, K, {}, std::vector<double>(rows * K, kNegInf), std::vector<bool>(rows * K, false)};
  std::vector<int64_t> expand;
  for (int64_t b = 0; b < rows; ++b)
    for (int64_t k = 0; k < K; ++k) expand.push_back(b);
  step.select(expand);
  for (int64_t r : expand) s.prefix.push_back(start[r]);
  for (int64_t b = 0; b < rows; ++b)
    s.score[b * K] = 0;  // only the first beam is live at the start
  for (int64_t t = 0; t < o.max_len; ++t)
    if (!beam_step(step, s, rules, t) && o.stop_at_eos) break;
  auto lp = [&](size_t len) { return std::pow((5.0 + (double)len) / 6.0, o.length_penalty); };
  Sequences out;
  for (int64_t b = 0; b < rows; ++b) {
    int64_t best = -1;
    double best_v = kNegInf;
    for (int64_t k = 0; k < K; ++k) {
      const int64_t r = b * K + k;
      if (s.score[r] == kNegInf) continue;
      const double v = s.score[r] / lp(generated_part(s.prefix[r], skip, rules, true).size());
      if (best < 0 || v > best_v) best = r, best_v = v;
    }
    out.push_back(generated_part(s.prefix[best < 0 ? b * K : best], skip, rules, o.stop_at_eos));
  }
  stream_results(out, o);
  return out;
}

Sequences decode(DecodeStep& step, const Sequences& start, int64_t eos, const DecodeOptions& o) {
  if (o.sample) return sample_search(step, start, eos, o);
  return o.beam > 1 ? beam_search(step, start, eos, o) : greedy_search(step, start, eos, o);
}

}  // namespace graft::models
