// The BERT encoder family (models/bert.h): Hugging Face config reading, the checkpoint importer
// (round trip, and every missing, unexpected, mis-shaped or truncated tensor named), padding
// invariance of the pooled embedding, and a float64 gradcheck of a whole small encoder.
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "graft/autograd/gradcheck.h"
#include "graft/models/bert.h"
#include "graft/models/sentence_encoder.h"
#include "graft/nn/train/checkpoint.h"
#include "graft/ops/ops.h"
#include "tests/test_util.h"

using namespace graft;
using namespace graft::models;
using graft::testing::ids;
using graft::testing::names;
using graft::testing::TempDir;

namespace {

nlohmann::json small_hf_config() {
  return {{"model_type", "bert"},
          {"vocab_size", 40},
          {"hidden_size", 16},
          {"num_attention_heads", 2},
          {"intermediate_size", 24},
          {"num_hidden_layers", 2},
          {"max_position_embeddings", 12},
          {"type_vocab_size", 2},
          {"layer_norm_eps", 1e-12},
          {"hidden_act", "gelu"},
          {"hidden_dropout_prob", 0.1},
          {"attention_probs_dropout_prob", 0.1},
          {"pad_token_id", 0}};
}

BertConfig small_cfg(DType dt = DType::f32) {
  BertConfig c = BertConfig::from_hf_json(small_hf_config(), "test");
  c.dtype = dt;
  c.dropout = c.attention_dropout = 0.0;
  c.seed = 5;
  return c;
}

// A small random BertEncoder written as a Hugging Face directory, and the model itself.
std::unique_ptr<BertEncoder> saved_model(const TempDir& dir) {
  auto m = std::make_unique<BertEncoder>(small_cfg());
  m->eval();
  save_hf_bert(*m, dir.path.string());
  return m;
}

// Rewrites dir/model.safetensors through `edit` (a map of the tensors by name).
void edit_weights(const TempDir& dir,
                  const std::function<void(std::map<std::string, Tensor>&)>& edit) {
  const train::SafetensorsFile f = train::load_safetensors(dir / "model.safetensors");
  std::map<std::string, Tensor> t(f.tensors.begin(), f.tensors.end());
  edit(t);
  train::save_safetensors(dir / "model.safetensors", nn::NamedTensors(t.begin(), t.end()));
}

// saved_model() with a vocab.txt of its 40 tokens: a sentence-transformers directory.
void sentence_model(const TempDir& dir) {
  saved_model(dir);
  std::ofstream vocab(dir / "vocab.txt");
  for (const char* special : {"[PAD]", "[UNK]", "[CLS]", "[SEP]"}) vocab << special << "\n";
  for (int i = 4; i < 40; ++i) vocab << "w" << i << "\n";
}

// Whether fn throws a graft::Error containing `what` ("" : whether it throws at all).
template <class Fn>
bool error_names(Fn&& fn, const std::string& what) {
  try {
    fn();
  } catch (const Error& e) {
    return std::string(e.what()).find(what) != std::string::npos;
  }
  return false;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(bert)

BOOST_AUTO_TEST_CASE(hf_config_fields) {
  const BertConfig c = BertConfig::from_hf_json(small_hf_config(), "config.json");
  BOOST_TEST((c.vocab == 40 && c.d_model == 16 && c.heads == 2 && c.d_ff == 24 && c.layers == 2 &&
              c.max_len == 12));
  BOOST_TEST((c.type_vocab == 2 && c.eps == 1e-12 && c.activation == nn::Activation::gelu &&
              !c.norm_first));
  nlohmann::json j = small_hf_config();
  j["hidden_act"] = "gelu_new";
  BOOST_TEST((BertConfig::from_hf_json(j, "x").activation == nn::Activation::gelu_tanh));
  BOOST_TEST(BertConfig::from_json(c.to_json()).to_json() == c.to_json());
  BOOST_TEST(BertEncoder(c).num_parameters() == c.parameter_count());
}

BOOST_AUTO_TEST_CASE(hf_config_errors) {
  nlohmann::json j = small_hf_config();
  j["model_type"] = "gpt2";
  BOOST_CHECK_EXCEPTION(BertConfig::from_hf_json(j, "config.json"), Error, [](const Error& e) {
    return names(e, "config.json: the architecture (model_type \"gpt2\") is not supported");
  });
  j = small_hf_config();
  j.erase("hidden_size");
  BOOST_CHECK_EXCEPTION(BertConfig::from_hf_json(j, "config.json"), Error,
                        [](const Error& e) { return names(e, "\"hidden_size\" is missing"); });
  j = small_hf_config();
  j["hidden_act"] = "swish";
  BOOST_CHECK_EXCEPTION(BertConfig::from_hf_json(j, "config.json"), Error,
                        [](const Error& e) { return names(e, "\"hidden_act\""); });
  j = small_hf_config();
  j["position_embedding_type"] = "relative_key";
  BOOST_CHECK_EXCEPTION(BertConfig::from_hf_json(j, "config.json"), Error,
                        [](const Error& e) { return names(e, "position_embedding_type"); });
  // Numbers are integers in range, never converted as nlohmann would (2.5 -> 2, 1e300 -> UB).
  for (const nlohmann::json& bad : {nlohmann::json(2.5), nlohmann::json(1e300)}) {
    j = small_hf_config();
    j["intermediate_size"] = bad;
    BOOST_CHECK_EXCEPTION(BertConfig::from_hf_json(j, "config.json"), Error, [](const Error& e) {
      return names(e, "config.json: field \"intermediate_size\" must be an integer");
    });
  }
  j = small_hf_config();
  j["num_attention_heads"] = 3;
  BOOST_CHECK_EXCEPTION(BertConfig::from_hf_json(j, "config.json"), Error,
                        [](const Error& e) { return names(e, "heads"); });
}

BOOST_AUTO_TEST_CASE(hf_round_trip_is_exact) {
  TempDir dir("bert");
  auto m = saved_model(dir);
  auto back = load_hf_bert(dir.path.string());
  const Tensor x = ids({2, 5, 7, 3, 0, 0, 9, 4, 1, 8, 11, 12}, 2);
  const std::vector<float> a = m->forward(x).to_vector<float>(),
                           b = back->forward(x).to_vector<float>();
  BOOST_TEST(a == b);
  BOOST_TEST(back->num_parameters() == m->num_parameters());
}

// The file supplies every parameter, so loading builds the encoder without initialising any
// (the old code drew or filled all 29, then overwrote them), in float32 and from a float64 file.
BOOST_AUTO_TEST_CASE(loading_initialises_no_parameter) {
  TempDir dir("bert_noinit");
  auto m = saved_model(dir);
  const Tensor x = ids({2, 5, 7, 3, 0, 0, 9, 4, 1, 8, 11, 12}, 2);
  for (const DType file_dtype : {DType::f32, DType::f64}) {
    edit_weights(dir, [&](auto& t) {
      for (auto& [n, v] : t) v = to_dtype(v, file_dtype);
    });
    const int64_t before = nn::initialised_parameters();
    auto back = load_hf_bert(dir.path.string());
    BOOST_TEST(nn::initialised_parameters() == before);
    BOOST_TEST(m->forward(x).to_vector<float>() == back->forward(x).to_vector<float>());
    BOOST_TEST((back->word->weight.dtype() == DType::f32 && back->word->weight.requires_grad()));
  }
  const int64_t before = nn::initialised_parameters();
  BertEncoder built(small_cfg());  // building one to train still initialises every parameter
  BOOST_TEST(nn::initialised_parameters() - before == (int64_t)built.named_parameters().size());
}

// Hugging Face checkpoints today are mostly BF16 or F16: such a file loads, each tensor converted
// into the model's dtype as load_state_dict does (the importer refused every dtype but F32/F64).
BOOST_AUTO_TEST_CASE(bf16_and_f16_files_load_into_the_models_dtype) {
  TempDir dir("bert_half");
  auto m = saved_model(dir);
  const Tensor x = ids({2, 5, 7, 3, 0, 0, 9, 4, 1, 8, 11, 12}, 2);
  for (const DType file_dtype : {DType::bf16, DType::f16}) {
    saved_model(dir);
    edit_weights(dir, [&](auto& t) {
      for (auto& [n, v] : t) v = cast_copy(v, file_dtype);
    });
    auto back = load_hf_bert(dir.path.string());
    BOOST_TEST((back->word->weight.dtype() == DType::f32));
    // The float32 model holding the rounded weights: the same outputs bit for bit.
    BertEncoder rounded(small_cfg());
    rounded.eval();
    nn::NamedTensors sd;
    for (auto& [n, t] : m->named_parameters()) sd.emplace_back(n, cast_copy(t, file_dtype));
    rounded.load_state_dict(sd);
    BOOST_TEST(back->forward(x).to_vector<float>() == rounded.forward(x).to_vector<float>());
  }
}

BOOST_AUTO_TEST_CASE(importer_names_the_tensor_at_fault) {
  TempDir dir("bert_bad");
  saved_model(dir);
  const std::string d = dir.path.string();
  edit_weights(dir, [](auto& t) { t.erase("encoder.layer.1.attention.self.key.bias"); });
  BOOST_CHECK_EXCEPTION(load_hf_bert(d), Error, [](const Error& e) {
    return names(e, "tensor 'encoder.layer.1.attention.self.key.bias' is missing");
  });
  saved_model(dir);
  edit_weights(dir, [](auto& t) { t["encoder.layer.0.extra.weight"] = zeros({2}); });
  BOOST_CHECK_EXCEPTION(load_hf_bert(d), Error, [](const Error& e) {
    return names(e, "unexpected tensor 'encoder.layer.0.extra.weight'");
  });
  saved_model(dir);
  edit_weights(dir, [](auto& t) {
    t["encoder.layer.0.intermediate.dense.weight"] = zeros({16, 24});
  });
  BOOST_CHECK_EXCEPTION(load_hf_bert(d), Error, [](const Error& e) {
    return names(e,
                 "tensor 'encoder.layer.0.intermediate.dense.weight' has shape (16, 24), the "
                 "config needs (24, 16)");
  });
  saved_model(dir);
  edit_weights(dir, [](auto& t) {
    t["embeddings.word_embeddings.weight"] = zeros({40, 16}, DType::i64);
  });
  BOOST_CHECK_EXCEPTION(load_hf_bert(d), Error, [](const Error& e) {
    return names(e, "'embeddings.word_embeddings.weight' is int64");
  });
  // The tensors a BertModel file carries beside the encoder's are skipped.
  saved_model(dir);
  edit_weights(dir, [](auto& t) {
    t["pooler.dense.weight"] = zeros({16, 16});
    t["embeddings.position_ids"] = zeros({1, 12}, DType::i64);
  });
  BOOST_CHECK_NO_THROW(load_hf_bert(d));
  // A truncated file: the last 100 bytes of the data cut off.
  saved_model(dir);
  std::filesystem::resize_file(dir / "model.safetensors",
                               std::filesystem::file_size(dir / "model.safetensors") - 100);
  BOOST_CHECK_EXCEPTION(load_hf_bert(d), Error,
                        [](const Error& e) { return names(e, "model.safetensors"); });
  std::filesystem::remove(dir / "model.safetensors");
  BOOST_CHECK_EXCEPTION(load_hf_bert(d), Error,
                        [](const Error& e) { return names(e, "model.safetensors' is missing"); });
}

BOOST_AUTO_TEST_CASE(bert_prefix_and_pretraining_heads_load) {
  TempDir dir("bert_prefixed");
  auto m = saved_model(dir);
  edit_weights(dir, [](auto& t) {
    std::map<std::string, Tensor> p;
    for (auto& [n, v] : t) p["bert." + n] = v;
    p["cls.predictions.bias"] = zeros({40});
    t = p;
  });
  auto back = load_hf_bert(dir.path.string());
  const Tensor x = ids({2, 5, 7, 3}, 1);
  BOOST_TEST(m->forward(x).to_vector<float>() == back->forward(x).to_vector<float>());
}

BOOST_AUTO_TEST_CASE(prefixed_and_bare_copies_of_a_tensor_are_an_error) {
  TempDir dir("bert_both");
  saved_model(dir);
  edit_weights(dir, [](auto& t) {
    std::map<std::string, Tensor> p;
    for (auto& [n, v] : t) p["bert." + n] = v;
    p["encoder.layer.0.output.dense.bias"] = zeros({16});  // a second, bare copy
    t = p;
  });
  BOOST_CHECK_EXCEPTION(load_hf_bert(dir.path.string()), Error, [](const Error& e) {
    return names(e,
                 "the file holds both 'bert.encoder.layer.0.output.dense.bias' and "
                 "'encoder.layer.0.output.dense.bias'");
  });
}

// A config far larger than its small file fails on the file's shapes before the model is built:
// the live tensor bytes never reach the config's size (268 MB of FFN weights here).
BOOST_AUTO_TEST_CASE(huge_config_with_small_file_fails_before_allocating) {
  TempDir dir("bert_huge");
  saved_model(dir);
  nlohmann::json j = train::load_json(dir / "config.json");
  j["intermediate_size"] = int64_t(1) << 20;
  train::save_json(dir / "config.json", j);
  Storage::reset_peak_live_bytes();
  const size_t before = Storage::live_bytes();
  BOOST_CHECK_EXCEPTION(load_hf_bert(dir.path.string()), Error, [](const Error& e) {
    return names(e,
                 "tensor 'encoder.layer.0.intermediate.dense.weight' has shape (24, 16), "
                 "the config needs (1048576, 16)");
  });
  BOOST_TEST(Storage::peak_live_bytes() - before < size_t(8) << 20);
}

BOOST_AUTO_TEST_CASE(hf_names_check_the_layer_count) {
  BOOST_TEST(bert_hf_names(2).size() == 5 + 2 * 12);
  for (int64_t layers : {int64_t(-1), int64_t(1) << 40})
    BOOST_CHECK_EXCEPTION(bert_hf_names(layers), Error, [&](const Error& e) {
      return names(e, "bert_hf_names: layers must be in [0, 1024], got " + std::to_string(layers));
    });
}

// Issue 47: an index is tied to every model file that changes an embedding (the pooling,
// normalisation and sequence-length configs, the tokenizer, config.json), not only the weights.
BOOST_AUTO_TEST_CASE(index_ties_name_every_model_file_changed_since) {
  TempDir dir("bert_index");
  sentence_model(dir);
  std::ofstream(dir / "texts.txt") << "one\ntwo\n";
  const std::string collection = dir / "texts.txt", where = "idx";
  const SentenceEncoder enc(dir.path.string());
  const std::map<std::string, std::string> ties = enc.index_ties(collection);
  BOOST_CHECK_NO_THROW(enc.check_index_ties(ties, collection, where));
  const auto refused = [&](const std::string& why) {
    return error_names([&] { enc.check_index_ties(ties, collection, where); }, why);
  };
  std::filesystem::create_directories(dir / "1_Pooling");
  std::ofstream(dir / "1_Pooling/config.json") << R"({"pooling_mode_cls_token": true})";
  BOOST_TEST(
      refused("'idx': '" + (dir / "1_Pooling/config.json") + "' was added since it was built"));
  std::filesystem::remove(dir / "1_Pooling/config.json");
  BOOST_TEST(!refused(""));
  std::ofstream(dir / "vocab.txt", std::ios::app) << "extra\n";
  BOOST_TEST(refused("vocab.txt' was edited since it was built"));
  sentence_model(dir);
  std::filesystem::remove(dir / "config.json");
  BOOST_TEST(refused("config.json' was removed since it was built"));
  save_hf_bert(*enc.model, dir.path.string());
  std::ofstream(dir / "sentence_bert_config.json") << R"({"max_seq_length": 8})";
  BOOST_TEST(refused("sentence_bert_config.json' was added"));
  std::filesystem::remove(dir / "sentence_bert_config.json");
  std::ofstream(dir / "texts.txt", std::ios::app) << "three\n";
  BOOST_TEST(refused("the collection '" + collection + "' was edited since it was built"));
  std::map<std::string, std::string> old_format = ties;
  old_format["format"] = "graft-embed-index-1";
  BOOST_CHECK_EXCEPTION(enc.check_index_ties(old_format, collection, where), Error,
                        [](const Error& e) { return names(e, "\"graft-embed-index-1\", not"); });
}

BOOST_AUTO_TEST_CASE(sentence_configs_numbers_are_integers) {
  TempDir dir("bert_sentence_config");
  sentence_model(dir);
  for (const char* bad : {"2.5", "1e300"}) {
    std::ofstream(dir / "sentence_bert_config.json") << "{\"max_seq_length\": " << bad << "}";
    BOOST_CHECK_EXCEPTION(SentenceEncoder(dir.path.string()), Error, [](const Error& e) {
      return names(e, "sentence_bert_config.json: field \"max_seq_length\" must be an integer");
    });
  }
}

BOOST_AUTO_TEST_CASE(pooled_embedding_ignores_padding) {
  BertEncoder m(small_cfg());
  m.eval();
  const auto [x, pad] = pad_batch({{1, 5, 7, 2}, {1, 9, 2}}, 0);
  const Tensor e = l2_normalize(mean_pool(m.forward(x, pad), pad));
  const auto [x1, pad1] = pad_batch({{1, 9, 2}}, 0);
  const Tensor alone = l2_normalize(mean_pool(m.forward(x1, pad1), pad1));
  testing::check_same(slice(e, 0, 1, 2), alone, 1e-5);
  const std::vector<float> v = e.to_vector<float>();
  double n0 = 0;
  for (int64_t j = 0; j < 16; ++j) n0 += (double)v[j] * v[j];
  BOOST_TEST(std::fabs(n0 - 1.0) < 1e-5);
}

BOOST_AUTO_TEST_CASE(pad_batch_errors) {
  BOOST_CHECK_EXCEPTION(pad_batch({}, 0), Error,
                        [](const Error& e) { return names(e, "no rows"); });
  BOOST_CHECK_EXCEPTION(pad_batch({{1}, {}}, 0), Error,
                        [](const Error& e) { return names(e, "empty row"); });
  BertEncoder m(small_cfg());
  BOOST_CHECK_EXCEPTION(m.forward(ids({1, 2, 3, 4}, 2), zeros({2, 3})), Error,
                        [](const Error& e) { return names(e, "must have the ids' shape (2, 2)"); });
}

BOOST_AUTO_TEST_CASE(whole_encoder_gradcheck_f64) {
  for (nn::Activation act : {nn::Activation::gelu, nn::Activation::gelu_tanh}) {
    BertConfig c = small_cfg(DType::f64);
    c.layers = 1;
    c.activation = act;
    BertEncoder m(c);
    const auto [x, pad] = pad_batch({{1, 5, 7, 2}, {1, 9, 2}}, 0);
    Tensors params = m.parameters();
    const auto r = gradcheck(
        [&](const Tensors&) { return l2_normalize(mean_pool(m.forward(x, pad), pad)); }, params);
    BOOST_TEST(r.ok, r.message);
  }
}

BOOST_AUTO_TEST_SUITE_END()
