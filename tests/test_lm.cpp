// The language-model example's library: documents, byte tokens, bits per character, and a tiny
// model learning a text through train::train_loop, then generating it back.
#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "examples/lm/kneser_ney.h"
#include "examples/lm/lm.h"
#include "tests/nan_weight.h"
#include "tests/test_util.h"

using namespace graft;
using graft::testing::names;
using graft::testing::TempDir;
namespace fs = std::filesystem;

namespace {
fs::path write(const TempDir& dir, const std::string& name, const std::string& text) {
  const fs::path p = dir / name;
  std::ofstream(p, std::ios::binary) << text;
  return p;
}
}  // namespace

BOOST_AUTO_TEST_SUITE(lm_example)

BOOST_AUTO_TEST_CASE(documents_from_fortune_and_plain_files) {
  const TempDir dir("lm");
  auto f = write(dir, "f.txt", "first one\n  two lines\n%\n\n%\nsecond\n%\n");
  auto p = write(dir, "p.txt", "para one\nstill one\n\n\npara two\r\n");
  auto docs = lm::read_documents({f.string(), p.string()});
  BOOST_TEST(docs == (std::vector<std::string>{"first one\n  two lines", "second",
                                               "para one\nstill one", "para two"}));
  auto bad = write(dir, "bad.txt", std::string("ok\xff\n"));
  BOOST_CHECK_EXCEPTION(lm::read_documents({bad.string()}), Error, [](const Error& e) {
    return std::string(e.what()).find("not UTF-8") != std::string::npos;
  });
  std::vector<std::string> tr, va;
  lm::split_documents(docs, 2, 1, tr, va);
  BOOST_TEST(tr.size() + va.size() == 4u);
  BOOST_TEST(!tr.empty());
  BOOST_TEST(!va.empty());
}

BOOST_AUTO_TEST_CASE(bits_per_character_count_code_points) {
  // "é" is two bytes, one character; each document's EOS counts as one character.
  const std::vector<int64_t> s = lm::token_stream({"aé", "b"});
  BOOST_TEST(s ==
             (std::vector<int64_t>{lm::kBOS, 'a', 0xC3, 0xA9, lm::kEOS, lm::kBOS, 'b', lm::kEOS}));
  models::LMConfig c = lm::preset("lm-mini");
  c.d_model = 16, c.heads = 2, c.d_ff = 16, c.layers = 1, c.max_len = 8, c.dtype = DType::f64;
  models::DecoderOnlyLM m(c);
  const lm::Metrics r = lm::evaluate(m, s, 7);  // one window: predicts tokens 1..7
  BOOST_TEST(r.tokens == 7);
  BOOST_TEST(r.chars == 5);  // a, é, EOS, b, EOS (the é continuation byte and BOS cover none)
  BOOST_TEST(std::fabs(r.bpc - r.loss * 7 / std::log(2.0) / 5) < 1e-9);
  BOOST_CHECK_THROW(lm::preset("lm-huge"), Error);
}

// llama-mini: the Llama fields survive config.json, a config without them reads as the GPT
// recipe, bad values are refused by name, and its size is lm-mini's (with rope) within 1%.
BOOST_AUTO_TEST_CASE(llama_preset_config_round_trips) {
  const models::LMConfig c = lm::preset("llama-mini");
  BOOST_TEST((c.rms_norm && c.activation == nn::Activation::swiglu && !c.bias && c.kv_heads == 2 &&
              c.tied_output));
  BOOST_TEST((c.positions.kind == nn::Positions::rope));
  const models::LMConfig back = models::LMConfig::from_json(c.to_json());
  BOOST_TEST(back.to_json() == c.to_json());
  BOOST_TEST(back.parameter_count() == c.parameter_count());
  models::LMConfig mini_rope = lm::preset("lm-mini");  // as make lm trains it
  mini_rope.positions.kind = nn::Positions::rope;
  const double mini = (double)mini_rope.parameter_count();
  BOOST_TEST(std::fabs((double)c.parameter_count() / mini - 1) < 0.01, c.parameter_count()
                                                                           << " vs " << mini);
  nlohmann::json old = lm::preset("lm-mini").to_json();
  for (const char* f : {"rms_norm", "activation", "kv_heads", "bias", "tied_output"}) old.erase(f);
  const models::LMConfig gpt = models::LMConfig::from_json(old);
  BOOST_TEST((!gpt.rms_norm && gpt.activation == nn::Activation::relu && gpt.bias &&
              gpt.kv_heads == 0 && gpt.tied_output));
  auto refused = [&](const char* field, const nlohmann::json& v, const std::string& why) {
    nlohmann::json j = c.to_json();
    j[field] = v;
    BOOST_CHECK_EXCEPTION(models::LMConfig::from_json(j, "cfg.json"), Error, [&](const Error& e) {
      return names(e, std::string("cfg.json: field \"") + field + "\" " + why);
    });
  };
  refused("kv_heads", 3, "must be 0 (= heads) or divide heads 4, got 3");
  refused("kv_heads", -1, "must be 0 (= heads) or divide heads 4, got -1");
  refused("kv_heads", 8, "must be 0 (= heads) or divide heads 4, got 8");
  refused("rms_norm", "rmsnorm", "must be true or false");
  refused("activation", "geglu", "must be relu, gelu, gelu_tanh or swiglu, got 'geglu'");
  refused("bias", 1, "");
}

// A config.json written before the fields had one name ("norm": "rmsnorm" for rms_norm, "ffn"
// for activation) still loads, is written back under the new names only, and its old keys are
// still checked by name.
BOOST_AUTO_TEST_CASE(old_llama_config_keys_load) {
  const models::LMConfig c = lm::preset("llama-mini");
  nlohmann::json old = c.to_json();
  old.erase("rms_norm"), old.erase("activation");
  old["norm"] = "rmsnorm", old["ffn"] = "swiglu";
  const models::LMConfig back = models::LMConfig::from_json(old, "old/config.json");
  BOOST_TEST((back.rms_norm && back.activation == nn::Activation::swiglu));
  BOOST_TEST(back.to_json() == c.to_json());
  BOOST_TEST(!back.to_json().contains("norm"));
  BOOST_TEST(!back.to_json().contains("ffn"));
  auto refused = [&](const char* field, const nlohmann::json& v, const std::string& why) {
    nlohmann::json j = old;
    j[field] = v;
    BOOST_CHECK_EXCEPTION(
        models::LMConfig::from_json(j, "old/config.json"), Error, [&](const Error& e) {
          return names(e, std::string("old/config.json: field \"") + field + "\" " + why);
        });
  };
  refused("norm", "batchnorm", "must be layernorm or rmsnorm, got 'batchnorm'");
  refused("ffn", "geglu", "must be relu, gelu, gelu_tanh or swiglu, got 'geglu'");
}

// The Kneser-Ney baseline: a unigram by hand, every conditional distribution sums to 1, a
// repeated text becomes cheap, and its errors.
BOOST_AUTO_TEST_CASE(kneser_ney_baseline) {
  // Order 1 on {1, 1, 2}: counts 2 and 1, D = n1 / (n1 + 2 n2) = 1/3, 2 types of 3 tokens, and
  // 258 symbols below: P(1) = (2 - 1/3) / 3 + (1/3) (2/3) / 258.
  const std::vector<int64_t> tiny{1, 1, 2};
  BOOST_TEST(std::fabs(lm::KneserNey(tiny, 1).prob(tiny, 1) -
                       ((2 - 1.0 / 3) / 3 + (1.0 / 3) * (2.0 / 3) / 258)) < 1e-15);
  const std::vector<int64_t> train =
      lm::token_stream({"the cat sat on the mat", "a cat is not a hat", "the end"});
  const lm::KneserNey kn(train, 4);
  for (size_t i : {size_t(1), size_t(5), size_t(12), size_t(30)}) {
    std::vector<int64_t> s = train;
    double total = 0;
    for (int64_t w = 0; w < lm::kVocab - 1; ++w) s[i] = w, total += kn.prob(s, i);
    BOOST_TEST(std::fabs(total - 1.0) < 1e-12, "position " << i << ": " << total);
  }
  std::string rep;
  for (int i = 0; i < 200; ++i) rep += "abcd ";
  const std::vector<int64_t> seen = lm::token_stream({rep});
  const lm::Metrics m = lm::evaluate(lm::KneserNey(seen, 3), seen, 16);
  BOOST_TEST(m.bpc < 0.2, "bits/char " << m.bpc);
  BOOST_CHECK_EXCEPTION(lm::KneserNey(tiny, 0), Error,
                        [](const Error& e) { return names(e, "the order must be in [1, 7]"); });
  BOOST_CHECK_EXCEPTION(lm::KneserNey(tiny, 8), Error,
                        [](const Error& e) { return names(e, "the order must be in [1, 7]"); });
  BOOST_CHECK_EXCEPTION(lm::KneserNey({1, lm::kPAD, 2}, 2), Error, [](const Error& e) {
    return names(e, "token 258 is outside the vocabulary");
  });
  BOOST_CHECK_EXCEPTION(lm::KneserNey(tiny, 5), Error,
                        [](const Error& e) { return names(e, "a stream of 3 tokens"); });
  BOOST_CHECK_EXCEPTION(lm::evaluate(kn, tiny, 16), Error,
                        [](const Error& e) { return names(e, "shorter than one window"); });
}

// Both presets' recipes: lm-mini's (learned positions replaced by rope) and llama-mini's (rope,
// RMSNorm, SwiGLU, grouped-query attention, no biases), each trained, reloaded from its run
// directory (config.json with the Llama fields) and decoded with the KV cache.
BOOST_DATA_TEST_CASE(tiny_model_learns_a_text_and_generates_it,
                     boost::unit_test::data::make(std::vector<std::string>{"lm-mini",
                                                                           "llama-mini"}),
                     preset) {
  std::string text;
  for (int i = 0; i < 40; ++i) text += "the cat sat on the mat.\n%\n";
  const TempDir dir("lm");
  auto f = write(dir, "cats.txt", text);
  lm::TrainOptions o;
  o.text = {f.string()};
  o.loop.run_dir = dir / "run";
  o.preset = preset;
  o.positions = "rope";
  o.context = 24;
  o.batch_rows = 8;
  // Trained to a criterion, not a step count (the step at which a run gets there depends on the
  // build's and the CPU's summation order). Validation's first window is a whole document from
  // its BOS, exactly the context generation sees, so once the validation tokens' bits in all are
  // below 0.5, every one of them has p > 2^-0.5 > 0.7 and greedy decoding must follow the text
  // (the KV-cached path's rounding differences are far below that margin). 250 steps got there
  // in Release on an AMD EPYC; the cap is eight times that.
  o.loop.steps = 2000;
  o.loop.valid_every = 10;
  o.loop.stop_at = 0.005;
  o.loop.warmup = 30;
  o.loop.lr_factor = 2.0;
  o.dropout = 0.0;
  o.loop.quiet = true;
  lm::TrainResult r = lm::train(o);
  BOOST_TEST_MESSAGE("valid bpc " << r.valid.bpc << " over " << r.valid.chars
                                  << " characters after " << r.loop.last_step << " steps");
  BOOST_TEST_REQUIRE(r.loop.reached_target,
                     "validation bpc " << r.valid.bpc << " after " << r.loop.last_step << " steps");
  BOOST_TEST(r.valid.bpc * r.valid.chars < 0.5);
  lm::LoadedRun run = lm::load_run(o.loop.run_dir);
  models::DecodeOptions d;
  d.max_len = 30;
  std::vector<int64_t> prompt{lm::kBOS};
  for (int64_t t : lm::encode("the cat ")) prompt.push_back(t);
  BOOST_TEST(lm::decode(models::generate(*run.model, {prompt}, lm::kEOS, d)[0]) ==
             "sat on the mat.");
}

// A run whose weights load (checksum and all) but compute NaN: evaluate fails naming the tokens,
// the parameter holding NaN and the first op it reached (anomaly mode), where it once printed a
// loss of nan.
BOOST_AUTO_TEST_CASE(a_nan_weight_fails_evaluate_by_name) {
  std::string text;
  for (int i = 0; i < 40; ++i) text += "the cat sat on the mat.\n%\n";
  const TempDir dir("lm_nan");
  auto f = write(dir, "cats.txt", text);
  lm::TrainOptions o;
  o.text = {f.string()};
  o.loop.run_dir = dir / "run";
  o.context = 8, o.batch_rows = 2, o.loop.steps = 2, o.loop.valid_every = 2, o.loop.quiet = true;
  lm::train(o);
  const std::vector<int64_t> stream = lm::token_stream({"the cat sat on the mat."});
  BOOST_TEST(std::isfinite(lm::evaluate(*lm::load_run(o.loop.run_dir).model, stream, 8).loss));
  testing::put_nan_weight(o.loop.run_dir + "/model.safetensors", "embedding.weight");
  lm::LoadedRun run = lm::load_run(o.loop.run_dir);  // the checksum holds
  BOOST_CHECK_EXCEPTION(lm::evaluate(*run.model, stream, 8), Error, [](const Error& e) {
    return names(e,
                 "evaluate: the loss of tokens 1..24 is NaN: the model's parameter "
                 "'embedding.weight' (f32 (") &&
           names(e, "holds NaN; anomaly: input ");
  });
}

// The program's --resume continues bit-exactly: 40 steps straight equal 25 + a resumed 15.
BOOST_AUTO_TEST_CASE(resume_is_bit_exact) {
  std::string text;
  for (int i = 0; i < 30; ++i)
    text += "a rolling stone gathers no moss " + std::to_string(i) + "\n%\n";
  const TempDir dir("lm");
  auto f = write(dir, "moss.txt", text);
  auto run = [&](const std::string& name, int64_t steps, bool resume) {
    lm::TrainOptions o;
    o.text = {f.string()};
    o.loop.run_dir = dir / name;
    o.positions = "alibi";
    o.context = 16;
    o.batch_rows = 4;
    o.dropout = 0.1;  // the dropout generator's state must resume too
    o.loop.steps = steps;
    o.loop.valid_every = 10;
    o.loop.resume = resume;
    o.loop.quiet = true;
    return lm::train(o);
  };
  const lm::TrainResult whole = run("whole", 40, false);
  run("split", 25, false);
  const lm::TrainResult rest = run("split", 40, true);
  BOOST_TEST(rest.loop.first_step == 25);
  BOOST_TEST(rest.loop.losses ==
             std::vector<double>(whole.loop.losses.begin() + 25, whole.loop.losses.end()));
  BOOST_TEST(rest.valid.bpc == whole.valid.bpc);
}

BOOST_AUTO_TEST_SUITE_END()
