// Prints what graft computes for a Hugging Face Marian directory (models::load_hf_marian), for
// tests/marian_reference.py to compare with transformers:
//   marian_check DIR SRC TGT NEW [float32]
// SRC and TGT are rows of comma-separated token ids separated by ';' (SRC padded with pad_id,
// TGT the decoder inputs, starting with the decoder start). Prints "dtype <name>", one "logits"
// line per (row, position) of the teacher-forced decoder (V values), then per row "greedy" with
// NEW greedy tokens (no eos stop, no banned tokens) and "beam" with Hugging Face's beam search of
// the config's num_beams (bad_words_ids, forced_eos_token_id, length_penalty, max_length).
// "float32" loads a 16-bit file into a float32 model. Exit 2 with the error on bad input.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "graft/autograd/tape.h"
#include "graft/models/hf_marian.h"
#include "graft/nn/text/marian_tokenizer.h"
#include "graft/ops/ops.h"

using namespace graft;

namespace {

Tensor parse_rows(const std::string& s) {
  std::vector<int64_t> ids;
  int64_t rows = 0, width = -1;
  std::stringstream in(s);
  std::string row, part;
  while (std::getline(in, row, ';')) {
    std::stringstream r(row);
    int64_t n = 0;
    while (std::getline(r, part, ',')) ids.push_back(std::stoll(part)), ++n;
    if (width >= 0 && n != width) fail("marian_check: rows of different lengths in '" + s + "'");
    width = n, ++rows;
  }
  if (rows == 0 || width <= 0) fail("marian_check: no token ids in '" + s + "'");
  return from_vector(ids, {rows, width}, DType::i64);
}

void print_logits(const models::Transformer& m, const Tensor& src, const Tensor& tgt) {
  autograd::NoGrad ng;
  const Tensor l = to_dtype(m.forward(src, tgt), DType::f32);
  const std::vector<float> v = contiguous(l).to_vector<float>();
  const int64_t rows = l.shape()[0] * l.shape()[1], V = m.cfg.vocab;
  for (int64_t t = 0; t < rows; ++t) {
    std::printf("logits");
    for (int64_t j = 0; j < V; ++j) std::printf(" %.9g", v[t * V + j]);
    std::printf("\n");
  }
}

void print_rows(const char* what, const models::Sequences& out) {
  for (const auto& row : out) {
    std::printf("%s", what);
    for (int64_t id : row) std::printf(" %lld", (long long)id);
    std::printf("\n");
  }
}

int tokenize(const std::string& dir, const std::string& file) {
  const text::MarianTokenizer tok(dir);
  std::ifstream in(file);
  if (!in) fail("marian_check: cannot read '" + file + "'");
  std::string line;
  while (std::getline(in, line)) {
    const std::vector<int64_t> ids = tok.encode(line);
    std::printf("ids");
    for (int64_t id : ids) std::printf(" %lld", (long long)id);
    std::printf("\ntext %s\n", tok.decode(ids).c_str());
  }
  return 0;
}

int run(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--tokenize") return tokenize(argv[2], argv[3]);
  if (argc < 5 || argc > 6) fail("usage: marian_check DIR SRC TGT NEW [float32]");
  if (argc == 6 && std::string(argv[5]) != "float32")
    fail("marian_check: the 5th argument must be float32");
  models::HfMarian m =
      models::load_hf_marian(argv[1], argc == 6 ? std::optional<DType>(DType::f32) : std::nullopt);
  const Tensor src = parse_rows(argv[2]);
  std::printf("dtype %s\n", dtype_name(m.model->cfg.dtype));
  print_logits(*m.model, src, parse_rows(argv[3]));
  models::DecodeOptions o;
  o.max_len = std::stoll(argv[4]);
  o.stop_at_eos = false;
  print_rows("greedy", models::translate(*m.model, src, o));
  o.stop_at_eos = true;
  o.max_len = m.hf.max_length - 1;  // Hugging Face's max_length counts the decoder start
  o.beam = (int)m.hf.num_beams;
  o.hf_beam = true;
  o.length_penalty = m.hf.length_penalty;
  o.banned_ids = m.hf.bad_words;
  o.forced_eos_id = m.hf.forced_eos_id;
  print_rows("beam", models::translate(*m.model, src, o));
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
