// The translation example's trainer: overfitting, bit-exact checkpoints, bit-exact resume, clear
// errors on damaged checkpoints, and dirty-corpus accounting. Tiny models only, so the whole file
// runs in seconds.
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "examples/translation/toydata.h"
#include "examples/translation/trainer.h"
#include "graft/autograd/tape.h"
#include "graft/nn/train/checkpoint.h"
#include "graft/nn/train/optim.h"
#include "graft/ops/ops.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;
using namespace graft;
namespace tr = graft::translation;

namespace {

using graft::testing::TempDir;

models::TransformerConfig small_config(int64_t vocab, double dropout) {
  models::TransformerConfig c;
  c.vocab = vocab;
  c.d_model = 32;
  c.heads = 2;
  c.d_ff = 64;
  c.enc_layers = c.dec_layers = 1;
  c.dropout = dropout;
  c.max_len = 32;
  return c;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A tiny generated corpus on disk, shared by the resume and checkpoint-error tests.
void write_toy_corpus(const std::string& dir) {
  fs::create_directories(dir);
  auto s = toy::generate(7, 300, 30, 1);
  toy::write_tsv(dir + "/train.tsv", s.train);
  toy::write_tsv(dir + "/valid.tsv", s.valid);
}

tr::TrainOptions tiny_options(const std::string& data, const std::string& run, int64_t steps) {
  tr::TrainOptions o;
  o.data_dir = data;
  o.loop.run_dir = run;
  o.loop.steps = steps;
  o.batch_tokens = 256;
  o.loop.warmup = 10;
  o.loop.lr_factor = 1.0;
  o.vocab = 120;
  // 15 does not divide the interruption point (20), so the uninterrupted run validates at
  // different steps than the interrupted one: validation must not disturb any RNG.
  o.loop.valid_every = 15;
  o.loop.log_every = 5;
  o.bleu_sentences = 10;
  o.loop.quiet = true;
  o.plot = false;
  o.d_model = 32;
  o.heads = 2;
  o.d_ff = 64;
  o.layers = 1;
  o.dropout = 0.1;  // on, so the dropout generator has to be restored too
  o.loop.seed = 3;
  return o;
}

std::vector<std::string> column(const std::string& csv, size_t col) {
  std::vector<std::string> out;
  std::ifstream in(csv);
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line)) {
    size_t start = 0;
    for (size_t c = 0; c < col; ++c) start = line.find(',', start) + 1;
    out.push_back(line.substr(start, line.find(',', start) - start));
  }
  return out;
}

bool message_has(const std::exception& e, const std::string& what) {
  BOOST_TEST_MESSAGE("error: " << e.what());
  return std::string(e.what()).find(what) != std::string::npos;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(translation)

BOOST_AUTO_TEST_CASE(batches_are_teacher_forced_and_within_budget) {
  std::vector<tr::Example> ex = {{{5, 6, 7}, {8, 9}}, {{5}, {8, 9, 10, 11}}, {{6, 7}, {9}}};
  auto batches = tr::make_batches(ex, 10, 32);
  int64_t rows = 0;
  for (auto& b : batches) {
    BOOST_TEST(b.tgt_in.numel() <= 10);
    rows += b.src.size(0);
  }
  BOOST_TEST(rows == 3);
  // The shortest target comes first: (6 7) -> (9).
  auto& b = batches[0];
  BOOST_TEST(b.tgt_in.to_vector<int64_t>()[0] == text::Tokenizer::BOS);
  const auto tin = b.tgt_in.to_vector<int64_t>(), tout = b.tgt_out.to_vector<int64_t>();
  BOOST_TEST(tin[1] == 9);
  BOOST_TEST(tout[0] == 9);
  BOOST_TEST(tout[1] == text::Tokenizer::EOS);
}

BOOST_AUTO_TEST_CASE(overfits_one_batch) {
  std::vector<tr::Example> ex;
  Generator g(11);
  for (int i = 0; i < 8; ++i) {
    tr::Example e;
    for (int k = 0; k < 5 + i % 3; ++k) e.src.push_back(4 + (int64_t)g.below(20));
    for (int k = 0; k < 4 + i % 4; ++k) e.tgt.push_back(4 + (int64_t)g.below(20));
    ex.push_back(e);
  }
  auto batches = tr::make_batches(ex, 1000, 32);
  BOOST_REQUIRE(batches.size() == 1u);
  auto& b = batches[0];
  models::Transformer m(small_config(24, 0.0));
  auto params = m.named_parameters();
  train::Adam opt(params, 3e-3, 0.9, 0.98, 1e-9);
  double loss_v = 1e9;
  int step = 0;
  for (; step < 400 && loss_v >= 0.05; ++step) {
    Tensor lg = m.forward(b.src, b.tgt_in);
    Tensor loss =
        cross_entropy(reshape(lg, {-1, 24}), reshape(b.tgt_out, {-1}), 0.0, text::Tokenizer::PAD);
    loss.backward();
    train::clip_grad_norm(params, 1.0);
    opt.step();
    opt.zero_grad();
    loss_v = loss.item();
  }
  BOOST_TEST_MESSAGE("loss " << loss_v << " after " << step << " steps");
  BOOST_TEST(loss_v < 0.05);
  auto fm = tr::teacher_forced(m, batches);
  BOOST_TEST(fm.acc == 1.0);
}

BOOST_AUTO_TEST_CASE(checkpoint_round_trip_is_bit_exact) {
  TempDir dir("ckpt");
  auto cfg = small_config(30, 0.1);
  models::Transformer a(cfg);
  cfg.seed = 99;
  models::Transformer b(cfg);
  tr::save_model(a, dir / "a.safetensors", 5);
  tr::load_model(b, dir / "a.safetensors");
  auto pa = a.named_parameters(), pb = b.named_parameters();
  BOOST_REQUIRE(pa.size() == pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    auto va = pa[i].second.to_vector<float>(), vb = pb[i].second.to_vector<float>();
    BOOST_TEST(std::memcmp(va.data(), vb.data(), va.size() * sizeof(float)) == 0, pa[i].first);
  }
  a.eval();
  b.eval();
  Tensor src = from_vector(std::vector<int64_t>{5, 6, 7, 8, 9, 10}, {2, 3}, DType::i64);
  Tensor tin = from_vector(std::vector<int64_t>{2, 11, 12, 2, 13, 0}, {2, 3}, DType::i64);
  auto oa = a.forward(src, tin).to_vector<float>(), ob = b.forward(src, tin).to_vector<float>();
  BOOST_TEST(std::memcmp(oa.data(), ob.data(), oa.size() * sizeof(float)) == 0);
  tr::save_model(b, dir / "b.safetensors", 5);
  BOOST_TEST((read_bytes(dir / "a.safetensors") == read_bytes(dir / "b.safetensors")));
}

BOOST_AUTO_TEST_CASE(interrupted_and_resumed_run_matches_exactly) {
  TempDir dir("resume");
  write_toy_corpus(dir / "data");
  const int64_t N = 40;
  auto full = tr::train(tiny_options(dir / "data", dir / "full", N));
  BOOST_REQUIRE(full.losses.size() == (size_t)N);

  auto first = tr::train(tiny_options(dir / "data", dir / "split", N / 2));
  auto o = tiny_options(dir / "data", dir / "split", N);
  o.loop.resume = true;
  auto second = tr::train(o);
  BOOST_TEST(second.first_step == N / 2);
  std::vector<double> joined = first.losses;
  joined.insert(joined.end(), second.losses.begin(), second.losses.end());
  BOOST_REQUIRE(joined.size() == full.losses.size());
  for (size_t i = 0; i < joined.size(); ++i)
    BOOST_TEST(std::memcmp(&joined[i], &full.losses[i], sizeof(double)) == 0,
               "step " << i + 1 << ": " << joined[i] << " vs " << full.losses[i]);
  // The same weights bit for bit (the files' metadata differ: each run's config.json says its
  // own step budget, and the weights carry its fingerprint).
  BOOST_TEST(train::weights_checksum(train::load_weights(dir / "full/model.safetensors", "test")) ==
             train::weights_checksum(train::load_weights(dir / "split/model.safetensors", "test")));
  // The curves agree too: same steps, same train_loss cells.
  auto sa = column(dir / "full/metrics.csv", 1), sb = column(dir / "split/metrics.csv", 1);
  auto ka = column(dir / "full/metrics.csv", 0), kb = column(dir / "split/metrics.csv", 0);
  std::vector<std::string> la, lb;
  for (size_t i = 0; i < ka.size(); ++i)
    if (!sa[i].empty()) la.push_back(ka[i] + ":" + sa[i]);
  for (size_t i = 0; i < kb.size(); ++i)
    if (!sb[i].empty()) lb.push_back(kb[i] + ":" + sb[i]);
  BOOST_TEST(la == lb, boost::test_tools::per_element());
}

// --graph draws one training step's graph (clustered by module, every parameter named) and
// leaves the run as it would be without it: the same losses bit for bit (dropout is on).
BOOST_AUTO_TEST_CASE(graph_of_a_step_leaves_the_run_unchanged) {
  TempDir dir("graph");
  write_toy_corpus(dir / "data");
  auto plain = tr::train(tiny_options(dir / "data", dir / "plain", 6));
  auto o = tiny_options(dir / "data", dir / "drawn", 6);
  o.graph = dir / "step.dot";
  auto drawn = tr::train(o);
  BOOST_TEST(drawn.losses == plain.losses);
  const std::string dot = read_bytes(dir / "step.dot");
  BOOST_TEST(dot.rfind("digraph graft {", 0) == 0u);
  BOOST_TEST(dot.find("label=\"decoder\"") != std::string::npos);
  BOOST_TEST(dot.find("label=\"encoder.layers.0.self_attn.in_proj_weight\\n") != std::string::npos);
  o.graph = dir / "step.txt";
  BOOST_CHECK_EXCEPTION(tr::train(o), Error, [](const Error& e) {
    return message_has(e, "must end in .dot, .svg, .png or .pdf");
  });
}

BOOST_AUTO_TEST_CASE(damaged_checkpoints_give_clear_errors) {
  TempDir dir("damaged");
  write_toy_corpus(dir / "data");
  tr::train(tiny_options(dir / "data", dir / "run", 4));
  const std::string state = dir / "run/train_state.safetensors";
  const std::string good = read_bytes(state);
  auto resume = tiny_options(dir / "data", dir / "run", 8);
  resume.loop.resume = true;

  {  // cut off mid-data, as a crash during a non-atomic copy would leave it
    std::ofstream(state, std::ios::binary | std::ios::trunc)
        .write(good.data(), (std::streamsize)good.size() / 2);
    BOOST_CHECK_EXCEPTION(tr::train(resume), std::exception, [](const std::exception& e) {
      return message_has(e, "truncated or corrupted");
    });
  }
  {  // one flipped bit in the tensor data: structurally valid, caught by the checksum
    std::string bad = good;
    bad[bad.size() - 100] ^= 0x10;
    std::ofstream(state, std::ios::binary | std::ios::trunc)
        .write(bad.data(), (std::streamsize)bad.size());
    BOOST_CHECK_EXCEPTION(tr::train(resume), std::exception, [](const std::exception& e) {
      return message_has(e, "checksum mismatch");
    });
  }
  {  // garbage in the JSON header
    std::string bad = good;
    bad[10] = '#';
    std::ofstream(state, std::ios::binary | std::ios::trunc)
        .write(bad.data(), (std::streamsize)bad.size());
    BOOST_CHECK_EXCEPTION(tr::train(resume), std::exception, [](const std::exception& e) {
      return message_has(e, "truncated or corrupted");
    });
  }
  {  // the weights for inference are checked the same way
    std::string w = read_bytes(dir / "run/model.safetensors");
    w[w.size() - 4] ^= 0x01;
    std::ofstream(dir / "run/model.safetensors", std::ios::binary | std::ios::trunc)
        .write(w.data(), (std::streamsize)w.size());
    BOOST_CHECK_EXCEPTION(tr::load_run(dir / "run"), std::exception, [](const std::exception& e) {
      return message_has(e, "checksum mismatch");
    });
  }
  {  // the intact state resumes
    std::ofstream(state, std::ios::binary | std::ios::trunc)
        .write(good.data(), (std::streamsize)good.size());
    auto r = tr::train(resume);
    BOOST_TEST(r.first_step == 4);
    BOOST_TEST(r.last_step == 8);
  }
}

BOOST_AUTO_TEST_CASE(bad_corpus_lines_are_skipped_and_counted) {
  TempDir dir("corpus");
  {
    std::ofstream f(dir / "train.tsv", std::ios::binary);
    f << "the dog runs .\tder Hund läuft .\n"
      << "\n"                               // empty
      << "no tab on this line\n"            // malformed
      << "a\tb\tc\n"                        // malformed: two tabs
      << "   \t der Hund\n"                 // malformed: empty source
      << "bad \xff\xfe utf8\tschlecht\n"    // bad UTF-8
      << std::string(1200, 'x') << "\ty\n"  // too long
      << "the cat sleeps .\r\n"             // malformed (CRLF, no tab)
      << "the cat sleeps .\tdie Katze schläft .\r\n";
  }
  text::CorpusStats st;
  auto pairs = tr::load_corpus(dir / "train.tsv", st);
  BOOST_TEST(pairs.size() == 2u);
  BOOST_TEST(st.read == 9u);
  BOOST_TEST(st.kept == 2u);
  BOOST_TEST(st.empty == 1u);
  BOOST_TEST(st.malformed == 4u);
  BOOST_TEST(st.bad_utf8 == 1u);
  BOOST_TEST(st.too_long == 1u);
  BOOST_TEST(pairs[1].tgt == "die Katze schläft .");
  BOOST_CHECK_EXCEPTION(tr::load_corpus(dir / "missing.tsv", st), std::exception,
                        [](const std::exception& e) { return message_has(e, "cannot open"); });
  // /dev/zero has no newline and no end: refused before reading (it once never returned).
  fs::create_symlink("/dev/zero", dir / "zero.tsv");
  BOOST_CHECK_EXCEPTION(tr::load_corpus(dir / "zero.tsv", st), Error, [](const Error& e) {
    return testing::names(e, "zero.tsv' is not a regular file");
  });
}

// The tokenizer is trained deterministically: the same sentences give the same spm.model and
// spm.vocab, byte for byte, wherever they are written (SentencePiece keeps its options in the
// model, the output prefix too, so two runs into two directories once wrote different files).
BOOST_AUTO_TEST_CASE(tokenizer_files_are_reproducible_byte_for_byte) {
  TempDir dir("spm");
  const auto splits = toy::generate(3, 400, 1, 1);
  std::vector<std::string> sents;
  for (auto& p : splits.train) sents.push_back(p.src), sents.push_back(p.tgt);
  fs::create_directories(dir / "a"), fs::create_directories(dir / "b");
  text::Tokenizer::train(sents, dir / "a/spm", 150);
  text::Tokenizer::train(sents, dir / "b/spm", 150);
  for (const char* ext : {".model", ".vocab"}) {
    const std::string a = read_bytes(dir / ("a/spm" + std::string(ext)));
    BOOST_TEST(!a.empty());
    BOOST_TEST((a == read_bytes(dir / ("b/spm" + std::string(ext)))), ext);
  }
  const text::Tokenizer tok(dir / "a/spm.model");
  BOOST_TEST(tok.decode(tok.encode(sents[5])) == sents[5]);
  BOOST_TEST(read_bytes(dir / "a/spm.vocab").rfind("<pad>\t0\n<unk>\t0\n", 0) == 0u);
}

// A run directory's parts belong together: an edited config.json or another run's spm.model is
// named on load. Empty input lines translate to empty lines, overlong ones are cut and counted.
BOOST_AUTO_TEST_CASE(run_directory_is_tied_and_odd_inputs_are_handled) {
  TempDir dir("tied");
  write_toy_corpus(dir / "data");
  tr::train(tiny_options(dir / "data", dir / "run", 4));
  auto run = tr::load_run(dir / "run");
  std::string long_line;
  for (int i = 0; i < 400; ++i) long_line += "the dog ";
  size_t truncated = 0;
  auto out = tr::translate_lines(*run.model, *run.tok, {"", "  \t ", "the dog runs .", long_line},
                                 1, 0, &truncated);
  BOOST_REQUIRE(out.size() == 4u);
  BOOST_TEST(out[0] == "");
  BOOST_TEST(out[1] == "");
  BOOST_TEST(truncated == 1u);
  // The copy-source baseline scores each source as its own hypothesis.
  BOOST_TEST(
      tr::evaluate(*run.model, *run.tok, {{"the dog runs .", "the dog runs ."}}).copy_source.score >
      99.999);
  BOOST_TEST(tr::evaluate(*run.model, *run.tok, {{"the dog runs .", "der Hund rennt ."}})
                 .copy_source.score < 20.0);

  const std::string cfg = dir / "run/config.json";
  const std::string original = read_bytes(cfg);
  std::string edited = original;
  const std::string heads = "\"heads\": 2";
  BOOST_REQUIRE(edited.find(heads) != std::string::npos);
  edited.replace(edited.find(heads), heads.size(), "\"heads\": 4");
  std::ofstream(cfg, std::ios::binary | std::ios::trunc) << edited;
  BOOST_CHECK_EXCEPTION(tr::load_run(dir / "run"), std::exception, [&](const std::exception& e) {
    return message_has(e, "'" + cfg + "' does not match the weights");
  });
  std::ofstream(cfg, std::ios::binary | std::ios::trunc) << original;
  tr::TrainOptions other = tiny_options(dir / "data", dir / "other", 2);
  other.vocab = 100;  // the same data and vocabulary would give the same spm.model, byte for byte
  tr::train(other);
  BOOST_REQUIRE(read_bytes(dir / "other/spm.model") != read_bytes(dir / "run/spm.model"));
  fs::copy_file(dir / "other/spm.model", dir / "run/spm.model",
                fs::copy_options::overwrite_existing);
  BOOST_CHECK_EXCEPTION(tr::load_run(dir / "run"), std::exception, [&](const std::exception& e) {
    return message_has(e, "spm.model' does not match the weights");
  });
}

// A corpus none of whose pairs fits the model stops with an error, not a crash.
BOOST_AUTO_TEST_CASE(corpus_longer_than_max_len_everywhere) {
  TempDir dir("toolong");
  fs::create_directories(dir / "data");
  for (const char* split : {"train.tsv", "valid.tsv"}) {
    std::ofstream f(dir / (std::string("data/") + split));
    // 450 pseudo-random letters a side: within the reader's 1000 bytes, but far more than the
    // 255 tokens the model takes (a 40-piece vocabulary cannot merge much).
    uint32_t x = 12345;
    for (int k = 0; k < 40; ++k) {
      std::string a, b;
      for (int i = 0; i < 450; ++i) {
        x = x * 1664525u + 1013904223u;
        a += char('a' + (x >> 24) % 26);
        b += char('a' + (x >> 16) % 26);
      }
      f << a << '\t' << b << '\n';
    }
  }
  auto o = tiny_options(dir / "data", dir / "run", 4);
  o.vocab = 40;
  BOOST_CHECK_EXCEPTION(tr::train(o), std::exception, [](const std::exception& e) {
    return message_has(e, "pairs of") && message_has(e, "train.tsv' fits the model");
  });
}

// A `--dtype bf16` run records bfloat16 in config.json's model section (it said float32), so
// loading the run builds a bf16 model holding the trained bf16 weights; its exports (translate
// export) load in their own forms and translate as the converted model does.
BOOST_AUTO_TEST_CASE(bf16_run_records_its_dtype_and_exports_load) {
  TempDir dir("bf16_run");
  write_toy_corpus(dir / "data");
  tr::TrainOptions o = tiny_options(dir / "data", dir / "run", 3);
  o.dtype = DType::bf16;
  tr::train(o);
  const auto cfg = train::load_json(dir / "run/config.json");
  BOOST_TEST(cfg["model"]["dtype"].get<std::string>() == "bfloat16");
  auto lr = tr::load_run(dir / "run");
  for (auto& [n, t] : lr.model->named_parameters()) BOOST_TEST((t.dtype() == DType::bf16), n);
  BOOST_TEST((lr.model->cfg.dtype == DType::bf16));
  {
    // The bf16 run runs int8 too (built in float32 for the quantizer), converted or exported,
    // with the same output.
    auto bf_converted = tr::load_run(dir / "run", Precision::int8);
    models::keep_for_inference(*bf_converted.model, Precision::int8);
    BOOST_TEST(tr::export_run(dir / "run", Precision::int8) == dir / "run/model.int8.safetensors");
    auto bf_exported = tr::load_run(dir / "run", Precision::int8);
    BOOST_TEST(bf_exported.weights == dir / "run/model.int8.safetensors");
    PrecisionGuard guard(Precision::int8);
    const std::vector<std::string> lines = {"the dog sees the cat ."};
    BOOST_TEST(tr::translate_lines(*bf_converted.model, *bf_converted.tok, lines, 2) ==
               tr::translate_lines(*bf_exported.model, *bf_exported.tok, lines, 2));
  }
  // A float32 run exported to int8 translates as the run converted after loading.
  tr::train(tiny_options(dir / "data", dir / "f32", 3));
  const std::string out = tr::export_run(dir / "f32", Precision::int8);
  BOOST_TEST(out == dir / "f32/model.int8.safetensors");
  auto converted = tr::load_run(dir / "f32");
  models::keep_for_inference(*converted.model, Precision::int8);
  auto exported = tr::load_run(dir / "f32", Precision::int8);
  BOOST_TEST(exported.weights == out);
  PrecisionGuard guard(Precision::int8);
  const std::vector<std::string> lines = {"the dog sees the cat .", "a man reads a book ."};
  BOOST_TEST(tr::translate_lines(*converted.model, *converted.tok, lines, 2) ==
             tr::translate_lines(*exported.model, *exported.tok, lines, 2));
}

BOOST_AUTO_TEST_SUITE_END()
