// Prints what graft computes for a Hugging Face causal LM directory (models::load_hf_causal_lm),
// for tests/hf_reference.py to compare with transformers:
//   hf_lm_check DIR IDS [NEW [float32]]
// IDS comma-separated token ids. Prints "dtype <name>", then one "logits" line per position (V
// values), then, with NEW > 0, "generated" and the greedy continuation of NEW tokens (no eos
// stop). "float32" widens a 16-bit model before running. Exit 2 with the error on bad input.
#include <cstdio>
#include <iostream>
#include <sstream>

#include "graft/autograd/tape.h"
#include "graft/models/hf.h"
#include "graft/ops/ops.h"

using namespace graft;

namespace {

std::vector<int64_t> parse_ids(const std::string& s) {
  std::vector<int64_t> ids;
  std::stringstream in(s);
  std::string part;
  while (std::getline(in, part, ',')) {
    size_t used = 0;
    const long long v = std::stoll(part, &used);
    if (used != part.size()) fail("hf_lm_check: bad token id '" + part + "'");
    ids.push_back(v);
  }
  if (ids.empty()) fail("hf_lm_check: no token ids");
  return ids;
}

void print_logits(models::DecoderOnlyLM& lm, const std::vector<int64_t>& ids) {
  autograd::NoGrad ng;
  const Tensor l =
      to_dtype(lm.forward(from_vector(ids, {1, (int64_t)ids.size()}, DType::i64)), DType::f32);
  const std::vector<float> v = contiguous(l).to_vector<float>();
  const int64_t V = lm.cfg.vocab;
  for (size_t t = 0; t < ids.size(); ++t) {
    std::printf("logits");
    for (int64_t j = 0; j < V; ++j) std::printf(" %.9g", v[t * V + j]);
    std::printf("\n");
  }
}

int run(int argc, char** argv) {
  if (argc < 3 || argc > 5) fail("usage: hf_lm_check DIR IDS [NEW [float32]]");
  models::HfCausalLM m = models::load_hf_causal_lm(argv[1]);
  if (argc == 5) {
    if (std::string(argv[4]) != "float32") fail("hf_lm_check: the 4th argument must be float32");
    m.model->to(DType::f32);
  }
  const std::vector<int64_t> ids = parse_ids(argv[2]);
  std::printf("dtype %s\n", dtype_name(m.model->cfg.dtype));
  print_logits(*m.model, ids);
  const int64_t n = argc >= 4 ? std::stoll(argv[3]) : 0;
  if (n <= 0) return 0;
  models::DecodeOptions o;
  o.max_len = n;
  o.stop_at_eos = false;
  const models::Sequences out = models::generate(*m.model, {ids}, -1, o);
  std::printf("generated");
  for (int64_t id : out[0]) std::printf(" %lld", (long long)id);
  std::printf("\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
}
