// Hugging Face Llama-family checkpoints (models/hf.h): tiny directories written with graft's own
// safetensors writer, loaded into DecoderOnlyLM, and every refusal naming its cause.
#include <boost/test/unit_test.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include "graft/autograd/tape.h"
#include "graft/models/decoding.h"
#include "graft/models/hf.h"
#include "graft/nn/train/checkpoint.h"
#include "graft/ops/ops.h"
#include "tests/test_util.h"

using namespace graft;
using namespace graft::models;
using graft::testing::names;
using graft::testing::TempDir;

namespace {

// d 8, 2 heads (head_dim 4), 1 kv head, d_ff 12, vocab 10, 2 layers.
nlohmann::json tiny_config(const std::string& type) {
  return {{"model_type", type},
          {"vocab_size", 10},
          {"hidden_size", 8},
          {"intermediate_size", 12},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 2},
          {"num_key_value_heads", 1},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", 500000.0},
          {"hidden_act", "silu"},
          {"tie_word_embeddings", false},
          {"eos_token_id", {2, 3}},
          {"bos_token_id", 1},
          {"max_position_embeddings", 64}};
}

using Files = std::map<std::string, Tensor>;

// The tensors a *ForCausalLM of tiny_config() saves (prefix "model.").
Files tiny_tensors(bool qkv_bias, bool tied, DType dt) {
  Generator gen(5);
  Files t;
  const auto put = [&](const std::string& n, const Shape& s) { t[n] = randn(s, dt, gen); };
  put("model.embed_tokens.weight", {10, 8});
  put("model.norm.weight", {8});
  if (!tied) put("lm_head.weight", {10, 8});
  for (int i = 0; i < 2; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    put(p + "input_layernorm.weight", {8}), put(p + "post_attention_layernorm.weight", {8});
    put(p + "self_attn.q_proj.weight", {8, 8}), put(p + "self_attn.k_proj.weight", {4, 8});
    put(p + "self_attn.v_proj.weight", {4, 8}), put(p + "self_attn.o_proj.weight", {8, 8});
    put(p + "mlp.gate_proj.weight", {12, 8}), put(p + "mlp.up_proj.weight", {12, 8});
    put(p + "mlp.down_proj.weight", {8, 12});
    if (qkv_bias)
      put(p + "self_attn.q_proj.bias", {8}), put(p + "self_attn.k_proj.bias", {4}),
          put(p + "self_attn.v_proj.bias", {4});
  }
  return t;
}

void write_dir(const TempDir& dir, const nlohmann::json& cfg, const Files& t) {
  train::save_json(dir / "config.json", cfg);
  nn::NamedTensors named(t.begin(), t.end());
  train::save_safetensors(dir / "model.safetensors", named, {{"format", "pt"}});
}

std::map<std::string, Tensor> params_of(const DecoderOnlyLM& m) {
  std::map<std::string, Tensor> out;
  for (const auto& [n, p] : m.named_parameters()) out[n] = p;
  return out;
}

// load_hf_causal_lm(dir) fails with a message holding `part`.
void check_refused(const TempDir& dir, const std::string& part) {
  BOOST_CHECK_EXCEPTION(load_hf_causal_lm(dir.path.string()), Error,
                        [&](const Error& e) { return names(e, part); });
}

}  // namespace

BOOST_AUTO_TEST_CASE(tiny_llama_loads_with_its_shapes_and_weights) {
  TempDir dir("hf_llama");
  const Files t = tiny_tensors(false, false, DType::f32);
  write_dir(dir, tiny_config("llama"), t);
  HfCausalLM m = load_hf_causal_lm(dir.path.string());
  BOOST_TEST(m.hf.eos_ids == (std::vector<int64_t>{2, 3}), boost::test_tools::per_element());
  BOOST_TEST(m.hf.bos_id == 1);
  const LMConfig& c = m.model->cfg;
  BOOST_TEST(c.kv_heads == 1);
  BOOST_TEST(c.eps == 1e-5);
  BOOST_TEST(c.positions.rope_base == 500000.0);
  BOOST_TEST(!c.tied_output);
  BOOST_TEST(!c.bias);
  auto p = params_of(*m.model);
  BOOST_TEST(p.size() == 2 + 1 + 2 * 7u);
  const Tensor qkv = concat({t.at("model.layers.1.self_attn.q_proj.weight"),
                             t.at("model.layers.1.self_attn.k_proj.weight"),
                             t.at("model.layers.1.self_attn.v_proj.weight")},
                            0);
  graft::testing::check_same(p.at("blocks.layers.1.self_attn.in_proj_weight"), qkv, 0);
  graft::testing::check_same(p.at("blocks.layers.0.linear3.weight"),
                             t.at("model.layers.0.mlp.up_proj.weight"), 0);
  graft::testing::check_same(p.at("output.weight"), t.at("lm_head.weight"), 0);
  const Tensor logits = m.model->forward(graft::testing::ids({0, 1, 2, 0}, 1));
  BOOST_TEST((logits.shape() == Shape{1, 4, 10}));
}

BOOST_AUTO_TEST_CASE(tiny_qwen2_bf16_tied_loads_in_bf16_with_qkv_biases) {
  TempDir dir("hf_qwen2");
  nlohmann::json cfg = tiny_config("qwen2");
  cfg["tie_word_embeddings"] = true;
  Files t = tiny_tensors(true, true, DType::bf16);
  t["model.layers.0.self_attn.rotary_emb.inv_freq"] = zeros({2});  // an old buffer: ignored
  write_dir(dir, cfg, t);
  HfCausalLM m = load_hf_causal_lm(dir.path.string());
  BOOST_TEST(m.model->cfg.tied_output);
  BOOST_TEST(!m.model->output);
  auto p = params_of(*m.model);
  for (const auto& [n, x] : p) BOOST_TEST((x.dtype() == DType::bf16), n);
  BOOST_TEST((p.at("blocks.layers.0.self_attn.in_proj_bias").shape() == Shape{16}));
  // Qwen2 has no o_proj or MLP biases: graft's are zero, so the sums are the same.
  BOOST_TEST(
      sum(abs(to_dtype(p.at("blocks.layers.0.self_attn.out_proj.bias"), DType::f32))).item() ==
      0.0);
  BOOST_TEST((m.model->forward(graft::testing::ids({4, 5}, 1)).dtype() == DType::bf16));
}

BOOST_AUTO_TEST_CASE(the_model_prefix_is_optional_and_old_lm_configs_read_as_before) {
  TempDir dir("hf_noprefix");
  Files t;
  for (auto& [n, x] : tiny_tensors(false, false, DType::f32))
    t[n.rfind("model.", 0) == 0 ? n.substr(6) : n] = x;
  write_dir(dir, tiny_config("mistral"), t);
  BOOST_CHECK_NO_THROW(load_hf_causal_lm(dir.path.string()));
  LMConfig old;
  nlohmann::json j = old.to_json();
  j.erase("eps"), j.erase("mask_pad");
  const LMConfig back = LMConfig::from_json(j);
  BOOST_TEST(back.eps == 1e-5);
  BOOST_TEST(back.mask_pad);
}

BOOST_AUTO_TEST_CASE(refusals_name_the_tensor_at_fault) {
  TempDir dir("hf_bad_tensors");
  const nlohmann::json cfg = tiny_config("llama");
  const auto with = [&](const std::function<void(Files&)>& edit) {
    Files t = tiny_tensors(false, false, DType::f32);
    edit(t);
    write_dir(dir, cfg, t);
  };
  with([](Files& t) { t.erase("model.layers.1.self_attn.k_proj.weight"); });
  check_refused(dir, "tensor 'layers.1.self_attn.k_proj.weight' is missing");
  with([](Files& t) { t.erase("lm_head.weight"); });
  check_refused(dir, "tensor 'lm_head.weight' is missing");
  with([](Files& t) { t["model.layers.0.mlp.gate_proj.bias"] = zeros({12}); });
  check_refused(dir, "unexpected tensor 'model.layers.0.mlp.gate_proj.bias'");
  with([](Files& t) { t["model.layers.0.self_attn.v_proj.weight"] = zeros({8, 8}); });
  check_refused(dir,
                "tensor 'model.layers.0.self_attn.v_proj.weight' has shape (8, 8), the config "
                "needs (4, 8)");
  with([](Files& t) { t["model.norm.weight"] = zeros({8}, DType::i64); });
  check_refused(dir, "tensor 'model.norm.weight' is int64");
  with([](Files& t) { t["norm.weight"] = zeros({8}); });
  check_refused(dir, "(with or without the model prefix)");
}

BOOST_AUTO_TEST_CASE(refusals_name_the_config_field) {
  TempDir dir("hf_bad_config");
  const Files t = tiny_tensors(false, false, DType::f32);
  const auto with = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& part) {
    nlohmann::json cfg = tiny_config("llama");
    edit(cfg);
    write_dir(dir, cfg, t);
    check_refused(dir, part);
  };
  with([](auto& c) { c["model_type"] = "gpt_neox"; }, "field \"model_type\" \"gpt_neox\"");
  with([](auto& c) { c["hidden_act"] = "gelu"; }, "field \"hidden_act\"");
  with([](auto& c) { c["head_dim"] = 8; }, "field \"head_dim\"");
  with([](auto& c) { c.erase("hidden_size"); }, "field \"hidden_size\" is missing");
  with(
      [](auto& c) {
        c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
      },
      "field \"rope_scaling.rope_type\" \"yarn\"");
  with(
      [](auto& c) {
        c["rope_scaling"] = {{"type", "dynamic"}};
      },
      "field \"rope_scaling.rope_type\" \"dynamic\"");
  with(
      [](auto& c) {
        c["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 1e4}};
      },
      "rope_parameters: field \"factor\" is missing");
  with(
      [](auto& c) {
        c["model_type"] = "mistral";
        c["sliding_window"] = 16;
      },
      "field \"sliding_window\" 16 < max_position_embeddings 64");
  with(
      [](auto& c) {
        c["model_type"] = "qwen2";
        c["use_sliding_window"] = true;
      },
      "field \"use_sliding_window\"");
  // transformers 5.x: rope_theta inside rope_parameters.
  nlohmann::json v5 = tiny_config("llama");
  v5.erase("rope_theta");
  v5["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1234.0}};
  write_dir(dir, v5, t);
  BOOST_TEST(load_hf_causal_lm(dir.path.string()).model->cfg.positions.rope_base == 1234.0);
  v5["rope_parameters"] = {{"rope_type", "llama3"},   {"rope_theta", 1234.0},
                           {"factor", 8.0},           {"low_freq_factor", 1.0},
                           {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 32}};
  write_dir(dir, v5, t);
  const nn::PositionOptions o = load_hf_causal_lm(dir.path.string()).model->cfg.positions;
  BOOST_TEST((o.rope_scaling == nn::RopeScaling::llama3 && o.rope_factor == 8.0 &&
              o.rope_original_max_len == 32 && o.rope_high_freq_factor == 4.0));
}

BOOST_AUTO_TEST_CASE(shards_load_and_a_missing_shard_is_named) {
  TempDir dir("hf_shards");
  const Files t = tiny_tensors(false, false, DType::f32);
  train::save_json(dir / "config.json", tiny_config("llama"));
  nn::NamedTensors a, b;
  nlohmann::json map = nlohmann::json::object();
  for (const auto& [n, x] : t) {
    const bool first = n.find("layers.1.") == std::string::npos;
    (first ? a : b).emplace_back(n, x);
    map[n] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  train::save_safetensors(dir / "model-00001-of-00002.safetensors", a, {});
  train::save_safetensors(dir / "model-00002-of-00002.safetensors", b, {});
  train::save_json(dir / "model.safetensors.index.json", {{"weight_map", map}});
  BOOST_CHECK_NO_THROW(load_hf_causal_lm(dir.path.string()));
  std::filesystem::remove(dir / "model-00002-of-00002.safetensors");
  check_refused(
      dir, "names shard '" + (dir / "model-00002-of-00002.safetensors") + "', which is missing");
}

BOOST_AUTO_TEST_CASE(a_lying_header_allocates_nothing) {
  TempDir dir("hf_lying");
  train::save_json(dir / "config.json", tiny_config("llama"));
  const std::string header =
      R"({"model.embed_tokens.weight":{"dtype":"F32","shape":[1000000000,1000000],)"
      R"("data_offsets":[0,16]}})";
  std::ofstream f(dir / "model.safetensors", std::ios::binary);
  const uint64_t n = header.size();
  f.write((const char*)&n, 8);
  f << header << std::string(16, '\0');
  f.close();
  check_refused(dir, "model.embed_tokens.weight");
}

BOOST_AUTO_TEST_CASE(mixed_dtypes_give_a_float32_model) {
  TempDir dir("hf_mixed");
  Files t = tiny_tensors(false, false, DType::bf16);
  t["model.norm.weight"] = ones({8});
  write_dir(dir, tiny_config("llama"), t);
  HfCausalLM m = load_hf_causal_lm(dir.path.string());
  for (const auto& [n, x] : params_of(*m.model)) BOOST_TEST((x.dtype() == DType::f32), n);
  graft::testing::check_same(params_of(*m.model).at("embedding.weight"),
                             to_dtype(t.at("model.embed_tokens.weight"), DType::f32), 0);
}

BOOST_AUTO_TEST_CASE(config_ranges_are_named_by_the_files_fields) {
  TempDir dir("hf_ranges");
  const Files t = tiny_tensors(false, false, DType::f32);
  const auto with = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& part) {
    nlohmann::json cfg = tiny_config("llama");
    edit(cfg);
    write_dir(dir, cfg, t);
    check_refused(dir, part);
  };
  with([](auto& c) { c["hidden_size"] = 0; }, "field \"hidden_size\"");
  with([](auto& c) { c["num_key_value_heads"] = 3; }, "field \"num_key_value_heads\"");
  with([](auto& c) { c["num_attention_heads"] = 3; }, "field \"num_attention_heads\"");
  with([](auto& c) { c["rms_norm_eps"] = 0.0; }, "field \"rms_norm_eps\"");
  with([](auto& c) { c["eos_token_id"] = {2, 10}; }, "field \"eos_token_id\"");
  with([](auto& c) { c["bos_token_id"] = -1; }, "field \"bos_token_id\"");
  // 2^62 * 2 heads would overflow a product: the check divides instead.
  with([](auto& c) { c["head_dim"] = int64_t(1) << 62; }, "field \"head_dim\"");
  // A nested rope dict's errors name the file and the dict.
  with(
      [](auto& c) {
        c["rope_scaling"] = {{"rope_type", 5}};
      },
      "config.json: rope_scaling: field \"rope_type\"");
  // Mistral's window is 4096 when the field is absent: shorter than 8192 positions.
  with(
      [](auto& c) {
        c["model_type"] = "mistral";
        c["max_position_embeddings"] = 8192;
      },
      "field \"sliding_window\" 4096 < max_position_embeddings 8192");
}

BOOST_AUTO_TEST_CASE(long_position_limits_are_kept_and_pad_is_not_special) {
  TempDir dir("hf_long");
  nlohmann::json cfg = tiny_config("qwen2");
  cfg["max_position_embeddings"] = 131072;  // more than graft's 65536: rope has no table
  write_dir(dir, cfg, tiny_tensors(true, false, DType::f32));
  HfCausalLM m = load_hf_causal_lm(dir.path.string());
  BOOST_TEST(m.hf.max_positions == 131072);
  BOOST_TEST(m.model->cfg.max_len == 65536);
  // No pad masking: token 0's embedding row trains like any other.
  BOOST_TEST(m.model->embedding->padding_idx == -1);
  cfg.erase("max_position_embeddings");
  write_dir(dir, cfg, tiny_tensors(true, false, DType::f32));
  BOOST_TEST(load_hf_causal_lm(dir.path.string()).hf.max_positions == 32768);
}

BOOST_AUTO_TEST_CASE(a_shard_that_is_a_directory_is_refused) {
  TempDir dir("hf_shard_dir");
  train::save_json(dir / "config.json", tiny_config("llama"));
  std::filesystem::create_directory(dir / "model-00001-of-00001.safetensors");
  train::save_json(dir / "model.safetensors.index.json",
                   {{"weight_map", {{"lm_head.weight", "model-00001-of-00001.safetensors"}}}});
  check_refused(dir, "which is not a regular file");
}

namespace {

// d 8, 2 heads, n_inner null (32), vocab 10, 2 layers, 16 positions.
nlohmann::json gpt2_config() {
  return {{"model_type", "gpt2"}, {"vocab_size", 10},  {"n_embd", 8},
          {"n_layer", 2},         {"n_head", 2},       {"n_positions", 16},
          {"n_inner", nullptr},   {"eos_token_id", 9}, {"bos_token_id", 9}};
}

// The tensors the original GPT-2 file holds: no prefix, Conv1D weights (in, out), and the old
// causal-mask buffers.
Files gpt2_tensors() {
  Generator gen(7);
  Files t;
  const auto put = [&](const std::string& n, const Shape& s) { t[n] = randn(s, DType::f32, gen); };
  put("wte.weight", {10, 8}), put("wpe.weight", {16, 8});
  put("ln_f.weight", {8}), put("ln_f.bias", {8});
  for (int i = 0; i < 2; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    for (const char* n : {"ln_1.weight", "ln_1.bias", "ln_2.weight", "ln_2.bias"}) put(h + n, {8});
    put(h + "attn.c_attn.weight", {8, 24}), put(h + "attn.c_attn.bias", {24});
    put(h + "attn.c_proj.weight", {8, 8}), put(h + "attn.c_proj.bias", {8});
    put(h + "mlp.c_fc.weight", {8, 32}), put(h + "mlp.c_fc.bias", {32});
    put(h + "mlp.c_proj.weight", {32, 8}), put(h + "mlp.c_proj.bias", {8});
    put(h + "attn.bias", {1, 1, 16, 16}), t[h + "attn.masked_bias"] = full({}, -1e4);
  }
  return t;
}

}  // namespace

BOOST_AUTO_TEST_CASE(gpt2_conv1d_weights_are_transposed_and_old_buffers_ignored) {
  TempDir dir("hf_gpt2");
  const Files t = gpt2_tensors();
  write_dir(dir, gpt2_config(), t);
  HfCausalLM m = load_hf_causal_lm(dir.path.string());
  const LMConfig& c = m.model->cfg;
  BOOST_TEST(m.hf.model_type == "gpt2");
  BOOST_TEST((c.positions.kind == nn::Positions::learned && c.max_len == 16 && c.d_ff == 32));
  BOOST_TEST((c.activation == nn::Activation::gelu_tanh && c.bias && c.tied_output));
  BOOST_TEST(!c.rms_norm);
  auto p = params_of(*m.model);
  graft::testing::check_same(p.at("blocks.layers.1.self_attn.in_proj_weight"),
                             transpose(t.at("h.1.attn.c_attn.weight"), 0, 1), 0);
  graft::testing::check_same(p.at("blocks.layers.0.linear2.weight"),
                             transpose(t.at("h.0.mlp.c_proj.weight"), 0, 1), 0);
  graft::testing::check_same(p.at("pos.weight"), t.at("wpe.weight"), 0);
  BOOST_TEST((m.model->forward(graft::testing::ids({0, 9, 3}, 1)).shape() == Shape{1, 3, 10}));
}

BOOST_AUTO_TEST_CASE(gpt2_refusals_name_the_field_or_tensor) {
  TempDir dir("hf_gpt2_bad");
  const auto with = [&](const std::function<void(nlohmann::json&, Files&)>& edit,
                        const std::string& part) {
    nlohmann::json cfg = gpt2_config();
    Files t = gpt2_tensors();
    edit(cfg, t);
    write_dir(dir, cfg, t);
    check_refused(dir, part);
  };
  with([](auto& c, auto&) { c["scale_attn_by_inverse_layer_idx"] = true; },
       "field \"scale_attn_by_inverse_layer_idx\"");
  with([](auto& c, auto&) { c["activation_function"] = "quick_gelu"; },
       "field \"activation_function\" \"quick_gelu\"");
  with([](auto& c, auto&) { c["n_head"] = 3; }, "field \"n_head\"");
  with([](auto& c, auto&) { c["n_positions"] = 1 << 20; }, "field \"n_positions\"");
  // A c_attn stored as a Linear (out, in) is not GPT-2's Conv1D layout.
  with(
      [](auto&, auto& t) {
        t["h.0.attn.c_attn.weight"] = zeros({24, 8});
      },
      "tensor 'h.0.attn.c_attn.weight' has shape (24, 8), the config needs (8, 24)");
  with([](auto& c, auto&) { c["tie_word_embeddings"] = false; },
       "tensor 'lm_head.weight' is missing");
}

namespace {

// Greedy logits of `m` at every position of a short prompt, under PrecisionGuard(p) without a
// tape.
std::vector<float> logits_at(const DecoderOnlyLM& m, Precision p) {
  const PrecisionGuard g(p);
  const autograd::NoGrad ng;
  return m.forward(graft::testing::ids({0, 1, 2, 5, 9}, 1)).to_vector<float>();
}

}  // namespace

// load_hf_causal_lm(dir, int8) quantizes each linear weight and the (tied) embedding as it reads
// them: the model equals one loaded whole and made int8 by keep_for_inference, bit for bit, and
// holds no float32 copy of any of them.
BOOST_AUTO_TEST_CASE(int8_loading_quantizes_as_it_reads_and_equals_keep_for_inference) {
  for (bool tied : {true, false}) {
    TempDir dir("hf_int8");
    nlohmann::json cfg = tiny_config("llama");
    cfg["tie_word_embeddings"] = tied;
    write_dir(dir, cfg, tiny_tensors(false, tied, DType::bf16));
    HfCausalLM whole = load_hf_causal_lm(dir.path.string());
    whole.model->to(DType::f32);
    keep_for_inference(*whole.model, Precision::int8);
    const HfCausalLM streamed = load_hf_causal_lm(dir.path.string(), Precision::int8);
    const std::vector<float> a = logits_at(*whole.model, Precision::int8),
                             b = logits_at(*streamed.model, Precision::int8);
    BOOST_TEST(a == b, boost::test_tools::per_element());
    auto p = params_of(*streamed.model);
    for (const char* n : {"embedding.weight", "blocks.layers.1.linear2.weight"})
      BOOST_CHECK_EXCEPTION(p.at(n).to_vector<float>(), Error,
                            [&](const Error& e) { return names(e, "int8"); });
    BOOST_TEST((p.at("blocks.norm.weight").dtype() == DType::f32));
    const autograd::NoGrad ng;  // the embedding's rows come from its int8 form
    const Tensor e = embedding(p.at("embedding.weight"), graft::testing::ids({3, 7}, 1), -1);
    BOOST_TEST((e.shape() == Shape{1, 2, 8}));
  }
}
