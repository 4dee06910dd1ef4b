/// @file
/// The BERT encoder family, loaded from a Hugging Face checkpoint directory, and sentence
/// embeddings as sentence-transformers computes them.
///
/// BERT is a post-LN encoder (nn::Encoder with norm_first false) under an embedding block:
/// @code
///   x = LayerNorm(word[ids] + position[0 .. T-1] + token_type[types]);  x = Dropout(x)
///   h = Encoder(x, pad)            // each layer: LN(x + SelfAttn(x)), LN(x + FFN(x)), GELU FFN
///   e = mean of h over the real tokens;  e = e / max(|e|_2, 1e-12)   (the sentence embedding)
/// @endcode
/// A Hugging Face directory holds config.json (model_type "bert"), model.safetensors and the
/// tokenizer (tokenizer.json or vocab.txt; text::WordPiece); a sentence-transformers one adds
/// modules.json, 1_Pooling/config.json and sentence_bert_config.json (max_seq_length), which
/// models::SentenceEncoder (sentence_encoder.h) reads.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "graft/models/config_json.h"
#include "graft/nn/transformer.h"

namespace graft::models {

/// A BERT encoder's config: a StackConfig (learned positions, post-LN) plus the token types,
/// the LayerNorm eps, the FFN activation and the attention dropout.
struct BertConfig : StackConfig {
  int64_t type_vocab = 2;                            ///< token types ("segments")
  double eps = 1e-12;                                ///< of every LayerNorm
  nn::Activation activation = nn::Activation::gelu;  ///< gelu (erf) or gelu_tanh
  double attention_dropout = 0.1;  ///< on the attention probabilities while training
  BertConfig();
  /// The config of a Hugging Face config.json (model_type "bert"): vocab_size, hidden_size,
  /// num_attention_heads, intermediate_size, num_hidden_layers, max_position_embeddings,
  /// type_vocab_size, layer_norm_eps, hidden_act ("gelu"; "gelu_new", "gelu_pytorch_tanh" and
  /// "gelu_fast" are the tanh form; "relu"), hidden_dropout_prob, attention_probs_dropout_prob,
  /// pad_token_id; position_embedding_type must be "absolute" when present.
  /// @throws graft::Error `<where>: ...` for another model_type ("the architecture ... is not
  ///         supported"), a missing or mistyped field, or a value out of range.
  static BertConfig from_hf_json(const nlohmann::json& j, const std::string& where);
  /// The field table (bert_fields()), which to_json(), from_json() and validate() follow.
  static const ConfigFields<BertConfig>& fields();
  nlohmann::json to_json() const;  ///< graft's own form (from_json() reads it back)
  /// Reads to_json()'s form, then validate()s it.
  /// @throws graft::Error naming the field and `where`.
  static BertConfig from_json(const nlohmann::json& j, const std::string& where = "BertConfig");
  /// Checks every range of bert_fields(): stack_fields()' plus type_vocab in [1, 2^24], eps in
  /// (0, 1), attention_dropout in [0, 1], a GELU or ReLU activation, learned positions and
  /// post-LN.
  /// @throws graft::Error `<where>: field "<name>" ...` for the first field out of range.
  void validate(const std::string& where = "BertConfig") const;
  /// num_parameters() of the encoder it builds, without building it.
  /// @throws graft::Error when the count overflows int64.
  int64_t parameter_count() const;
};

/// The fields of a BertConfig C (BertConfig or a config derived from it): stack_fields() (with
/// learned positions and post-LN required) plus "type_vocab", "eps", "activation" and
/// "attention_dropout", each required.
template <class C>
ConfigFields<C> bert_fields() {
  ConfigFields<C> f = stack_fields<C>();
  for (ConfigField<C>& p : f) {
    if (std::string(p.name) == "positions")
      p = p.and_check([](const C& c, const ConfigCheck& k) {
        if (c.positions.kind != nn::Positions::learned)
          k.bad("positions", "must be learned for BERT");
      });
    if (std::string(p.name) == "norm_first")
      p = p.and_check([](const C& c, const ConfigCheck& k) {
        if (c.norm_first) k.bad("norm_first", "must be false for BERT (post-LN)");
      });
  }
  const ConfigFields<C> more = {
      size_field<C>("type_vocab", member(&C::type_vocab), "token types", int64_t(1) << 24),
      value_field<C>("eps", member(&C::eps), "of every LayerNorm")
          .and_check([](const C& c, const ConfigCheck& k) {
            if (!(c.eps > 0 && c.eps < 1))
              k.bad("eps", "must be in (0, 1), got " + std::to_string(c.eps));
          }),
      activation_field<C>(member(&C::activation),
                          {nn::Activation::gelu, nn::Activation::gelu_tanh, nn::Activation::relu}),
      probability_field<C>("attention_dropout", member(&C::attention_dropout),
                           "on the attention probabilities"),
  };
  f.insert(f.end(), more.begin(), more.end());
  return f;
}

/// The BERT encoder (see the file's description). Parameters: "word.weight",
/// "position.weight", "token_type.weight", "embed_norm.{weight,bias}" and "encoder.layers.<i>.*"
/// (nn::EncoderLayer's names).
class BertEncoder : public nn::Module {
 public:
  /// An encoder of config c, initialised from c.seed (N(0, 0.02^2) embeddings).
  /// @throws graft::Error "BertEncoder: field ..." when c.validate() refuses c.
  explicit BertEncoder(const BertConfig& c);
  /// ids (B, T) int64 -> hidden states (B, T, d). pad (B, T), non-zero = padding; undefined:
  /// the positions holding pad_id. types (B, T) int64 token types; undefined: all 0.
  /// @throws graft::Error when ids is not int64 (B, T), an id or type is out of range, T exceeds
  ///         max_len, or pad / types differ from ids in shape.
  Tensor forward(const Tensor& ids, const Tensor& pad = Tensor(),
                 const Tensor& types = Tensor()) const;
  BertConfig cfg;         ///< the config it was built from
  Generator dropout_gen;  ///< all dropout masks come from here
  /// "word" (V, d) and "token_type" (types, d).
  ///@{
  std::shared_ptr<nn::Embedding> word, token_type;
  ///@}
  std::shared_ptr<nn::EmbeddingPositions> position;  ///< "position", learned (max_len, d)
  std::shared_ptr<nn::LayerNorm> embed_norm;         ///< "embed_norm", over the summed embeddings
  std::shared_ptr<nn::Dropout> dropout;              ///< on the embeddings
  std::shared_ptr<nn::Encoder> encoder;              ///< "encoder", post-LN, no final norm
};

/// Mean over the real tokens: h (B, T, d), pad (B, T) non-zero = padding -> (B, d); an
/// all-padding row pools to zeros.
/// @throws graft::Error when either is undefined or the shapes do not fit.
Tensor mean_pool(const Tensor& h, const Tensor& pad);
/// x / max(|x|_2, eps) over the last dim (torch.nn.functional.normalize).
/// @throws graft::Error when x is undefined or not floating point.
Tensor l2_normalize(const Tensor& x, double eps = 1e-12);

/// A Hugging Face tensor name and the graft parameter it becomes: the query, key and value
/// weights (biases) of a layer are concatenated into in_proj_weight (in_proj_bias).
struct HfNameMap {
  std::vector<std::string> hf;  ///< one name, or the query, key and value names in order
  std::string graft;            ///< the graft parameter name
};
/// Every parameter of a BertEncoder of `layers` layers with its Hugging Face name(s) (BertModel's,
/// without a prefix).
/// @throws graft::Error when layers is outside [0, kMaxLayers].
std::vector<HfNameMap> bert_hf_names(int64_t layers);

/// Loads a Hugging Face BERT checkpoint directory: config.json and model.safetensors. Names are
/// mapped by bert_hf_names(), optionally under a "bert." prefix; "embeddings.position_ids" and
/// the unused "pooler.*" (and, under "bert.", the "cls.*" heads) are skipped. Every tensor's
/// name, dtype and shape is checked against the config before the model is built, so a config
/// larger than its file allocates nothing of the config's size. The encoder is then built
/// without initialising its parameters (nn::SkipInit: the file supplies every one) and takes the
/// file's tensors' memory (nn::Module::adopt_state_dict()), so loading draws no random number
/// and copies no weight of the model's dtype twice.
/// @throws graft::Error naming the file and the tensor: a missing, unexpected or mis-shaped
///         tensor, a dtype other than F32/F64, a tensor both with and without the "bert."
///         prefix, a truncated file, an unsupported architecture.
std::unique_ptr<BertEncoder> load_hf_bert(const std::string& dir);

/// Writes `model` as a Hugging Face BERT checkpoint directory (created when missing):
/// config.json (model_type "bert", BertConfig::from_hf_json()'s fields) and model.safetensors
/// (BertModel's names, in_proj split into query, key and value), each atomically; load_hf_bert()
/// reads it back bit for bit.
/// @throws graft::Error when a file cannot be written.
void save_hf_bert(const BertEncoder& model, const std::string& dir);

/// Pads token-id rows to their longest: (ids (B, T) int64 with pad_id after each row, pad (B, T)
/// float32, 1 = padding).
/// @throws graft::Error when `rows` is empty or holds an empty row.
std::pair<Tensor, Tensor> pad_batch(const std::vector<std::vector<int64_t>>& rows, int64_t pad_id);

}  // namespace graft::models
