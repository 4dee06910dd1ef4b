/// @file
/// A pretrained sentence encoder as a sentence-transformers directory describes it: the
/// WordPiece tokenizer, a BERT encoder (bert.h), pooling and L2 normalisation.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "graft/models/bert.h"
#include "graft/nn/text/wordpiece.h"

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

/// The format an index of embeddings (SentenceEncoder::index_ties()) is written in; 2 ties it to
/// every file of the model directory that changes an embedding, 1 tied only the weights.
constexpr const char* kIndexFormat = "graft-embed-index-2";

/// The files of a sentence-transformers directory that change its embeddings, relative to it:
/// config.json, model.safetensors, the tokenizer's (tokenizer.json, vocab.txt,
/// tokenizer_config.json), modules.json (normalisation), 1_Pooling/config.json (pooling) and
/// sentence_bert_config.json (max_seq_length). Any of them may be absent.
const std::vector<std::string>& embedding_files();

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
  /// The metadata that ties an index of `collection`'s embeddings to everything they came from:
  /// "format" (kIndexFormat), "collection" (the fingerprint of its bytes) and "model:NAME" for
  /// each of embedding_files(): the fingerprint of dir/NAME, or "absent".
  /// @throws graft::Error when a file cannot be read (or is over 256 MiB).
  std::map<std::string, std::string> index_ties(const std::string& collection) const;
  /// Checks an index's metadata (index_ties() when it was written) against the files now.
  /// @throws graft::Error "'<index>': ..." naming the first difference: another format, or the
  ///         collection or a model file (named) edited, added or removed since.
  void check_index_ties(const std::map<std::string, std::string>& metadata,
                        const std::string& collection, const std::string& index) const;
  text::WordPiece tokenizer;           ///< from the directory's tokenizer files
  std::unique_ptr<BertEncoder> model;  ///< the encoder
  int64_t max_seq_length = 512;        ///< texts are cut to this many ids, [CLS] and [SEP] included
  Pooling pooling = Pooling::mean;     ///< over the hidden states
  bool normalize = false;              ///< L2-normalise the pooled vector
  std::string dir;                     ///< where it was loaded from
};

}  // namespace graft::models
