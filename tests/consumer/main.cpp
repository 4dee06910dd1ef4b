// An outside program against the installed graft: it trains a small model a few steps, defines
// an op of its own and gradchecks it, and loads and decodes with a checkpoint written by the
// installed `translate` program, and trains a SentencePiece tokenizer. Exit 0 only when all of it
// worked.
//   consumer RUN_DIR      (RUN_DIR: a `translate train --out RUN_DIR` run)
#include <graft/graft.h>
#include <graft/nn/text/tokenizer.h>
#include <graft/testing/registry.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

using namespace graft;

namespace {

int failures = 0;
void check(bool ok, const std::string& what) {
  std::printf("%s: %s\n", ok ? "ok" : "FAILED", what.c_str());
  failures += !ok;
}

// ---- an op of our own: cube(x) = x^3, dx = 3 x^2 dout -------------------------------------------

GRAFT_DECLARE_OP("consumer_cube", "consumer");

Tensor cube_backward(const Tensor& x, const Tensor& dout) {
  return mul(dout, affine(mul(x, x), 3.0, 0.0));
}

// cube: y = x^3 elementwise; x (...) -> y (...)
Tensor cube(const Tensor& x) {
  Tensor y;
  {
    autograd::NoGrad ng;  // the forward from existing ops, recorded below as one entry
    y = mul(mul(x, x), x);
  }
  if (autograd::needs_record({x}))
    autograd::record("consumer_cube", {x}, {y}, {x},
                     [](const autograd::Ctx& c, const Tensors& dout) {
                       return Tensors{cube_backward(c.saved[0], dout[0])};
                     });
  return y;
}

// cube's record in graft::testing's registry: a sample, a bad input and the checks derived
// from them.
void custom_op_gradchecks() {
  register_op({.name = "consumer_cube",
               .family = "consumer",
               .forward = "cube",
               .backward = "cube_backward",
               .double_backward = DoubleBackward::composed,
               .samples = {{.name = "consumer_cube/transposed",
                            .make_inputs =
                                [](DType dt, Generator& g) {
                                  return Tensors{case_input_t({3, 4}, dt, g)};
                                },
                            .fn = [](const Tensors& in) { return cube(in[0]); }}},
               .error_inputs = {{"an undefined tensor", [] { cube(Tensor()); },
                                 "mul: got an undefined tensor"}},
               .nonfinite = nan_propagates()});
  const OpRecord& r = registered_record("consumer_cube");
  check(missing_fields(r).empty(), "the consumer's op record has every field");
  check(check_error_input(r.error_inputs[0]).empty(), "the consumer's bad input raises its error");
  Generator g(3);
  GradcheckResult grad = gradcheck(r.samples[0].fn, r.samples[0].make_inputs(DType::f64, g));
  check(grad.ok,
        "the consumer's own op passes gradcheck in float64" + (grad.ok ? "" : ": " + grad.message));
}

// ---- a small model trained a few steps ----------------------------------------------------------

void small_model_trains() {
  models::LMConfig c;
  c.vocab = 12, c.d_model = 16, c.heads = 2, c.d_ff = 32, c.layers = 1, c.max_len = 16,
  c.dropout = 0.0;
  models::DecoderOnlyLM lm(c);
  train::Adam opt(lm.named_parameters(), 1e-2);
  const std::vector<int64_t> seq = {1, 4, 5, 6, 7, 8, 9, 10, 11};
  Tensor in = from_vector(std::vector<int64_t>(seq.begin(), seq.end() - 1), {1, 8}, DType::i64);
  Tensor target = from_vector(std::vector<int64_t>(seq.begin() + 1, seq.end()), {8}, DType::i64);
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    opt.zero_grad();
    Tensor loss = cross_entropy(reshape(lm.forward(in), {8, c.vocab}), target);
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item();
  }
  std::printf("decoder-only LM: loss %.4f -> %.4f in 30 Adam steps\n", first, last);
  check(std::isfinite(last) && last < 0.5 * first,
        "a small model trains through the installed library");
}

// ---- a checkpoint written by the installed translate --------------------------------------------

void translate_checkpoint_loads(const std::string& run) {
  const std::string cfg_path = run + "/config.json";
  const nlohmann::json j = train::load_json(cfg_path);
  const models::TransformerConfig cfg =
      models::TransformerConfig::from_json(j.at("model"), cfg_path);
  auto weights = models::load_run_weights(cfg, cfg_path, run + "/model.safetensors",
                                          {cfg_path, run + "/spm.model"});
  models::Transformer m(cfg);
  m.load_state_dict(weights);
  m.eval();
  Tensor src = from_vector(std::vector<int64_t>{10, 11, 12, 13, cfg.eos_id}, {1, 5}, DType::i64);
  models::DecodeOptions o;
  o.max_len = 8;
  const models::Sequences out = models::translate(m, src, o);
  bool in_vocab = out.size() == 1 && !out[0].empty();
  for (int64_t t : out.at(0)) in_vocab = in_vocab && t >= 0 && t < cfg.vocab;
  std::printf("translate checkpoint: %lld parameters, greedy output of %zu tokens\n",
              (long long)m.num_parameters(), out.at(0).size());
  check(in_vocab, "a checkpoint written by the installed translate loads and decodes");
}

// ---- a tokenizer trained from a few sentences
// ----------------------------------------------------

void tokenizer_trains(const std::string& run) {
  const std::vector<std::string> sents = {
      "the cat sat on the mat", "the dog sat on the log", "a cat and a dog",
      "the mat and the log",    "der Hund und die Katze", "die Katze sitzt auf der Matte"};
  text::Tokenizer::train(sents, run + "/consumer_spm", 40);
  const text::Tokenizer tok(run + "/consumer_spm.model");
  const std::vector<int> ids = tok.encode("the cat sat on the log");
  std::printf("tokenizer: %d pieces, \"the cat sat on the log\" -> %zu ids\n", tok.vocab_size(),
              ids.size());
  check(!ids.empty() && tok.decode(ids) == "the cat sat on the log",
        "a tokenizer trains, encodes and decodes");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer RUN_DIR\n");
    return 2;
  }
  try {
    std::printf("graft %s (graft/version.h), package %s\n", GRAFT_VERSION_STRING, PACKAGE_VERSION);
    check(std::string(GRAFT_VERSION_STRING) == PACKAGE_VERSION,
          "graft/version.h agrees with the package's version");
    custom_op_gradchecks();
    small_model_trains();
    translate_checkpoint_loads(argv[1]);
    tokenizer_trains(argv[1]);
  } catch (const std::exception& e) {
    std::printf("FAILED: %s\n", e.what());
    return 1;
  }
  return failures ? 1 : 0;
}
