/// @file
/// Decoding, written once for every generative model against a small step interface: greedy,
/// beam search (GNMT length penalty) and sampling (temperature, top-k, top-p, combinable, drawn
/// from a seeded Generator). A model plugs in by implementing DecodeStep (the encoder-decoder
/// Transformer in models/transformer.cpp, the decoder-only LM in models/decoder_only_lm.cpp).
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "graft/autograd/tensor.h"
#include "graft/ops/precision.h"

namespace graft::nn {
class Module;
}

namespace graft::models {

/// Makes a model hold only what inference at precision `p` runs on, once, before decoding.
/// int8: the weight of every nn::Linear and every attention's in_proj_weight is quantized for
/// good and its float32 values freed (quantize_weight_int8, each named by its parameter path),
/// and so is the table of every nn::Embedding (embedding_tables(): lookups then dequantize rows
/// of the int8 form, scale[id] * q[id], and a tied output projection reads that same form).
/// bf16: the model becomes a bf16 model (Module::to(DType::bf16): parameters and float buffers,
/// 2 bytes each, the float32 ones freed), run by the ops natively or through float32
/// (docs/mixed-precision.md), then the same linear weights kept in the layout oneDNN's bf16
/// inference inner product reads, their plain bf16 values freed (keep_weight_bf16; where no bf16
/// kernel runs they stay plain). fp32: the same linear weights and the embedding tables are kept
/// in the blocked layout float32 inference reads and their float32 values freed
/// (keep_weights_fp32), so each is held once, not twice (values and kernel copy); lookups read
/// rows out of the kept form, and a tied output projection reads that same form. In every precision
/// the process cache of freed big blocks goes back to the OS (what loading freed;
/// Storage::release_cached). Afterwards the model runs linear only under PrecisionGuard(p) without
/// a tape; training it, saving it or running it in another precision fails naming the first freed
/// parameter it reads.
/// @return the bytes of float32 values freed.
/// @throws graft::Error from quantize_weight_int8 (a NaN or inf weight, named),
///         keep_weight_fp32 or keep_weight_bf16.
size_t keep_for_inference(nn::Module& model, Precision p);
/// The weights keep_for_inference(model, Precision::int8) makes int8, with their parameter paths,
/// in the model's order: every nn::Linear's weight and attention's in_proj_weight that no other
/// parameter shares a storage with (an int8 export holds exactly these in int8).
std::vector<std::pair<std::string, Tensor>> int8_linear_weights(const nn::Module& model);

/// The tables of the model's nn::Embedding modules with their parameter paths, each storage
/// once, in the model's order: keep_for_inference(model, Precision::int8) quantizes them like the
/// linear weights (an int8 export keeps them float32).
std::vector<std::pair<std::string, Tensor>> embedding_tables(const nn::Module& model);

/// How sampling picks a token (DecodeOptions::sample); the three filters combine.
struct SamplingOptions {
  double temperature = 1.0;  ///< > 0; logits are divided by it
  int64_t top_k = 0;         ///< keep the k most likely tokens (0: all)
  double top_p = 1.0;        ///< then the smallest set whose probability reaches p, in (0, 1]
};

/// How decode() continues the rows: greedy, beam search or sampling, and for how long.
struct DecodeOptions {
  int64_t max_len = 64;         ///< new tokens at most
  int beam = 1;                 ///< 1: greedy (or sampling)
  double length_penalty = 1.0;  ///< GNMT-style ((5 + len) / 6)^alpha on the log-probability
  bool use_cache = true;        ///< false: re-run the decoder over the whole prefix each step
  bool stop_at_eos = true;      ///< false: always generate max_len tokens (benchmarks)
  bool sample = false;          ///< draw each token instead of taking the most likely one
  SamplingOptions sampling;     ///< the sampling filters (when sample is set)
  uint64_t seed = 0;            ///< the sampling generator's seed: same seed, same tokens
  /// Hugging Face's repetition_penalty (RepetitionPenaltyLogitsProcessor): each token id present
  /// in a row so far (its start or prompt included, counted once) has its score divided by it
  /// when > 0, multiplied by it when < 0; the score is the logit in greedy and sampling (before
  /// temperature, top-k and top-p), the log-probability in beam search (as transformers does).
  /// A finite number > 0; 1: off.
  double repetition_penalty = 1.0;
  /// Token ids that end a row as the `eos` argument does (HF's eos_token_id given as a list, e.g.
  /// Llama 3.1's three): a row stops at the first of eos and these; each in [0, vocabulary).
  std::vector<int64_t> stop_ids;
  /// Stop ids (eos and stop_ids) cannot be chosen before this many new tokens (HF's
  /// min_new_tokens: their scores set to -inf); in [0, max_len].
  int64_t min_new_tokens = 0;
  /// Streaming: called with each new token of a row (token, row) as it is chosen, before the
  /// next step, in row order within a step; exactly the tokens the result holds (a stop id that
  /// ends a row is not passed), so the calls of row r concatenated equal the result's row r.
  /// Beam search calls it with each row's tokens once the search is over (the best beam is
  /// known only then). Empty: not called. An exception it throws ends decoding, unchanged.
  std::function<void(int64_t token, int64_t row)> on_token;
  /// Beam search's scoring: false, graft's (the o.beam best running beams, the result chosen
  /// with the GNMT length penalty); true, Hugging Face's `generate(num_beams=...)` (transformers'
  /// _beam_search with early_stopping false): 2K candidates a step, a candidate ending a row
  /// (a stop id, or the max_len-th token) finalized when among the K best with score
  /// sum_logprobs / generated_len^length_penalty (generated_len counting the stop id), the K best
  /// unfinished continue, a row done once its best running score over its length cannot beat
  /// its worst of K finished ones.
  bool hf_beam = false;
  /// Token ids never chosen (HF's bad_words_ids of one token each, e.g. Marian's pad): their
  /// scores are -inf at every step, in every mode; each in [0, vocabulary).
  std::vector<int64_t> banned_ids;
  /// HF's forced_eos_token_id: the max_len-th new token is this one (every other score -inf, its
  /// own 0, as ForcedEOSTokenLogitsProcessor); -1: off, else in [0, vocabulary).
  int64_t forced_eos_id = -1;
};

/// Every id that ends a row: `eos` (when >= 0) then o.stop_ids, without repeats, in that order.
std::vector<int64_t> stop_set(int64_t eos, const DecodeOptions& o);
/// Checks that every stop id (`eos` when >= 0 and o.stop_ids) is a token of a vocabulary of
/// `vocab` ids; decode() checks this at its first step, a program can before any work.
/// @throws graft::Error "decode: stop id <id> is outside the vocabulary [0, <vocab>)".
void check_stop_ids(int64_t eos, const DecodeOptions& o, int64_t vocab);
/// Applies DecodeOptions::repetition_penalty `penalty` to `scores` (one row, V entries) for each
/// id of `seen` in [0, V), each id once however often it occurs: score < 0 ? score * penalty :
/// score / penalty. Ids outside [0, V) are skipped (no score to change).
/// @throws graft::Error naming repetition_penalty when it is not a finite number > 0.
void apply_repetition_penalty(std::vector<double>& scores, const std::vector<int64_t>& seen,
                              double penalty);

/// Checks the options before any decoding work.
/// Throws naming the option (temperature, top_k, top_p, beam, max_len, repetition_penalty,
/// min_new_tokens, stop_ids, banned_ids, forced_eos_id) for values a decoder must not receive:
/// temperature <= 0 or not finite, top_k < 0, top_p outside (0, 1], beam < 1, sampling together
/// with a beam, repetition_penalty <= 0 or not finite, min_new_tokens outside [0, max_len], a
/// negative stop or banned id, forced_eos_id < -1, a length_penalty that is not finite (the
/// vocabulary is checked by check_stop_ids() and at decoding's first step).
/// @throws graft::Error "decode: ..." for max_len < 1 and the values above.
void check_decode_options(const DecodeOptions& o);

/// The distribution sampling draws from for one row of logits: softmax(logits / temperature)
/// restricted to the top_k most likely tokens, then to the smallest set of the most likely whose
/// probability sum reaches top_p, renormalised; zeros elsewhere. Ties rank the lower id first.
/// @throws graft::Error "sampling_distribution: ..." when logits is empty or an option is out of
///         the ranges check_decode_options() names; "sample_token: the model's logit of token
///         <v> is NaN" (or +inf) for a logit that is, as greedy and beam search refuse one.
std::vector<double> sampling_distribution(const std::vector<double>& logits,
                                          const SamplingOptions& o);
/// One draw from sampling_distribution (one gen.uniform()).
/// @throws graft::Error as sampling_distribution(): no logits, a NaN or +inf logit.
int64_t sample_token(const std::vector<double>& logits, const SamplingOptions& o, Generator& gen);

/// What decoding needs from a model.
class DecodeStep {
 public:
  virtual ~DecodeStep() = default;
  /// Logits of the next token for every row (rows, V), given each row's tokens so far (starting
  /// with BOS; with a cache only the newest one is new).
  virtual Tensor next_logits(const std::vector<std::vector<int64_t>>& prefix) = 0;
  /// Keep only the given rows, in this order (beam search reorders and copies rows).
  virtual void select(const std::vector<int64_t>& rows) = 0;
};

/// Token id sequences, one per row.
using Sequences = std::vector<std::vector<int64_t>>;

/// Continues each row of `start` (its first tokens: BOS for a translation, a prompt for a
/// language model; all rows of one length); each result is the generated tokens only, cut at
/// (and excluding) the first stop id: eos or one of o.stop_ids (eos < 0 and no stop_ids: never
/// stops early). Dispatches on o.sample and o.beam; runs under NoGrad.
/// @throws graft::Error for bad options (check_decode_options()), no rows, an empty first row,
///         rows of different lengths, a stop id outside the logits' vocabulary
///         (check_stop_ids()); and whatever the step or o.on_token throws.
Sequences decode(DecodeStep& step, const Sequences& start, int64_t eos, const DecodeOptions& o);
/// decode() taking the most likely token at each step (o.beam and o.sample are ignored).
/// @throws graft::Error as decode().
Sequences greedy_search(DecodeStep& step, const Sequences& start, int64_t eos,
                        const DecodeOptions& o);
/// decode() drawing each token from sampling_distribution() with a Generator seeded by o.seed
/// (o.beam is ignored).
/// @throws graft::Error as decode().
Sequences sample_search(DecodeStep& step, const Sequences& start, int64_t eos,
                        const DecodeOptions& o);
/// decode() keeping the o.beam best continuations of each row by log-probability, the result
/// chosen with the GNMT length penalty (o.length_penalty), or with Hugging Face's scoring when
/// o.hf_beam; o.sample is not consulted.
/// @throws graft::Error as decode().
Sequences beam_search(DecodeStep& step, const Sequences& start, int64_t eos,
                      const DecodeOptions& o);

}  // namespace graft::models
