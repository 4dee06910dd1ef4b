/// @file
/// A pretrained sentence encoder as a sentence-transformers directory describes it: the
/// WordPiece tokenizer, a BERT encoder (bert.h), pooling and L2 normalisation.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "graft/models/bert.h"
#include "graft/nn/wordpiece.h"

namespace graft::models {

/// How sentence embeddings are pooled (sentence-transformers' Pooling module).
enum class Pooling { mean, cls };

/// The sentence embedding of hidden states h (B, T, d) with padding pad (B, T): the mean over the
/// real tokens or the [CLS] state, L2-normalised when `normalize` (sentence-transformers' Pooling
/// and Normalize modules).
/// @throws graft::Error as mean_pool() and l2_normalize().
Tensor pool(const Tensor& h, const Tensor& pad, Pooling pooling, bool normalize);

/// The ids of each text ([CLS] pieces [SEP], at most max_len;
/// text::WordPiece::encode_with_specials).
/// @throws graft::Error "text <i>: ..." naming the index of a text that is not UTF-8.
std::vector<std::vector<int64_t>> tokenize_texts(const text::WordPiece& tokenizer,
                                                 const std::vector<std::string>& texts,
                                                 int64_t max_len);

/// A pretrained sentence encoder: tokenizer, BERT encoder, pooling and normalisation, as a
/// sentence-transformers directory describes them (all-MiniLM-L6-v2 and its kind).
class SentenceEncoder {
 public:
  /// Loads `dir`: the tokenizer (text::WordPiece::from_directory), the encoder (load_hf_bert),
  /// max_seq_length from sentence_bert_config.json (else max_position_embeddings), the pooling
  /// from 1_Pooling/config.json (mean or CLS; else mean) and normalisation when modules.json
  /// lists a Normalize module (else none). The encoder is in eval mode.
  /// @throws graft::Error naming the file at fault.
  explicit SentenceEncoder(const std::string& dir);
  /// The ids of one text as the encoder sees it: [CLS] pieces [SEP], at most max_seq_length.
  std::vector<int64_t> tokenize(const std::string& text) const;
  /// Called after each batch with the sentences done and the total.
  using Progress = std::function<void(int64_t done, int64_t total)>;
  /// The embeddings of `texts`, (N, d) float32, row i for texts[i]. Texts are sorted by length
  /// and run in batches of up to batch_size, each padded to its longest (no gradients).
  /// @throws graft::Error when batch_size < 1 or a text is not valid UTF-8 (naming its index).
  Tensor encode(const std::vector<std::string>& texts, int64_t batch_size = 32,
                const Progress& progress = nullptr) const;
  /// The embeddings of tokenized texts (tokenize()), batched as encode().
  Tensor encode_ids(const std::vector<std::vector<int64_t>>& ids, int64_t batch_size = 32,
                    const Progress& progress = nullptr) const;
  /// One padded batch with gradients: ids (B, T), pad (B, T) -> (B, d) embeddings; pad
  /// undefined: the positions holding the model's pad id.
  /// @throws graft::Error as BertEncoder::forward().
  Tensor embed(const Tensor& ids, const Tensor& pad) const;
  text::WordPiece tokenizer;           ///< from the directory's tokenizer files
  std::unique_ptr<BertEncoder> model;  ///< the encoder
  int64_t max_seq_length = 512;        ///< texts are cut to this many ids, [CLS] and [SEP] included
  Pooling pooling = Pooling::mean;     ///< over the hidden states
  bool normalize = false;              ///< L2-normalise the pooled vector
  std::string dir;                     ///< where it was loaded from
};

}  // namespace graft::models
