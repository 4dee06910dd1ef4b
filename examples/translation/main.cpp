// translate: the toy English -> German example end to end.
//   translate generate-data --out data/toy --seed 1 --train 50000 --valid 1000 --test 1000
//   translate train --data data/toy --out runs/demo --preset tiny --minutes 9
//   echo "the dog sees the cat ." | translate translate --run runs/demo [--beam 4] [--attention a.png]
//     [--sample --temperature 0.8 --top-k 20 --top-p 0.9 --seed 1]
//   translate evaluate --run runs/demo --data data/toy/test.tsv
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>

#include <CLI/CLI.hpp>

#include "examples/common/cli.h"
#include "examples/common/lines.h"
#include "examples/common/plot.h"
#include "examples/translation/toydata.h"
#include "examples/translation/trainer.h"

using namespace graft;
namespace tr = graft::translation;

namespace {

int cmd_generate(const std::string& out, uint64_t seed, size_t n_train, size_t n_valid, size_t n_test) {
  std::filesystem::create_directories(out);
  auto splits = toy::generate(seed, n_train, n_valid, n_test);
  toy::write_tsv(out + "/train.tsv", splits.train);
  toy::write_tsv(out + "/valid.tsv", splits.valid);
  toy::write_tsv(out + "/test.tsv", splits.test);
  std::printf("wrote %zu / %zu / %zu pairs to %s/{train,valid,test}.tsv\n", splits.train.size(),
              splits.valid.size(), splits.test.size(), out.c_str());
  return 0;
}

int cmd_train(const tr::TrainOptions& o) {
  auto r = tr::train(o);
  std::printf("trained steps %lld..%lld in %.1f s (%.0f target tokens/s); valid loss %.4f ppl %.3f "
              "acc %.2f%% BLEU %.2f\n",
              (long long)r.first_step, (long long)r.last_step, r.train_seconds, r.tokens_per_s,
              r.last_valid.loss, r.last_valid.ppl, 100 * r.last_valid.acc, r.last_valid.bleu);
  return 0;
}

int cmd_translate(const std::string& run, const models::DecodeOptions& o, int64_t max_len,
                  const std::string& attention) {
  models::check_decode_options(o);  // before loading anything
  auto lr = tr::load_run(run);
  std::vector<std::string> lines;
  size_t overlong = 0, truncated = 0;
  text::LineReader reader(stdin, text::kHardLineCap);
  bool too_long = false;
  for (std::string line; reader.next(line, too_long, "error reading standard input");) {
    overlong += too_long;  // an overlong line stays an empty output line, in its place
    lines.push_back(too_long ? std::string() : line);
  }
  auto hyps = tr::translate_lines(*lr.model, *lr.tok, lines, o, max_len, &truncated);
  for (auto& h : hyps) std::cout << h << '\n';
  std::cout.flush();
  if (overlong)
    std::cerr << "translate: " << overlong << " input line(s) over " << text::kHardLineCap
              << " bytes were not translated (empty output lines)\n";
  if (truncated)
    std::cerr << "translate: " << truncated << " input line(s) longer than the model's max_len ("
              << lr.model->cfg.max_len << " tokens) were truncated\n";
  if (!attention.empty()) {
    if (lines.empty()) throw std::runtime_error("--attention: no input sentence");
    auto a = tr::cross_attention(*lr.model, *lr.tok, lines[0], hyps[0]);
    plot::heatmap(attention, a.weights, a.tgt_pieces, a.src_pieces,
                  "cross-attention, last decoder layer (mean over heads)");
    std::cerr << "wrote " << attention << '\n';
  }
  return 0;
}

int cmd_evaluate(const std::string& run, const std::string& data, int beam, int samples) {
  auto lr = tr::load_run(run);
  text::CorpusStats st;
  auto pairs = tr::load_corpus(data, st);
  std::printf("%s: %s\n", data.c_str(), st.summary().c_str());
  if (pairs.empty()) throw std::runtime_error("evaluate: no usable pairs in '" + data + "'");
  auto r = tr::evaluate(*lr.model, *lr.tok, pairs, beam);
  std::printf("%s\n", r.bleu.str().c_str());
  std::printf("signature: %s\n", r.bleu.signature.c_str());
  const std::string decoding = beam > 1 ? "beam " + std::to_string(beam) : "greedy";
  if (r.forced.tokens > 0)
    std::printf("decoding: %s; teacher-forced token accuracy %.2f%%, perplexity %.4f (%lld tokens)\n",
                decoding.c_str(), 100 * r.forced.acc, r.forced.ppl, (long long)r.forced.tokens);
  else
    std::printf("decoding: %s; no teacher-forced metrics: no pair fits the model's max_len\n", decoding.c_str());
  if (r.forced_dropped)
    std::printf("%zu pair(s) longer than the model's max_len (%lld tokens) left out of the teacher-forced metrics\n",
                r.forced_dropped, (long long)lr.model->cfg.max_len);
  if (r.truncated)
    std::printf("%zu source(s) longer than max_len truncated for decoding\n", r.truncated);
  for (int i = 0; i < samples && i < (int)pairs.size(); ++i)
    std::printf("\nSRC: %s\nREF: %s\nHYP: %s\n", pairs[i].src.c_str(), pairs[i].tgt.c_str(), r.hyps[i].c_str());
  return 0;
}

// As many references as there are hypothesis lines, from the start of the TSV.
int cmd_score(const std::string& run, const std::string& data, const std::string& hyp_ids) {
  text::CorpusStats st;
  auto pairs = tr::load_corpus(data, st);
  std::ifstream in(hyp_ids);
  if (!in) throw std::runtime_error("score: cannot open '" + hyp_ids + "'");
  const size_t n = (size_t)std::count(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>(), '\n');
  if (n > pairs.size())
    throw std::runtime_error("score: '" + hyp_ids + "' has " + std::to_string(n) + " lines, '" + data +
                             "' only " + std::to_string(pairs.size()) + " pairs");
  std::vector<std::string> refs;
  for (size_t i = 0; i < n; ++i) refs.push_back(pairs[i].tgt);
  text::Tokenizer tok(run + "/spm.model");
  std::printf("%s\n", tr::bleu_of_ids(tok, hyp_ids, refs).str().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"graft toy translation: generate data, train a Transformer, translate, evaluate"};
  app.require_subcommand(1);

  auto* gen = app.add_subcommand("generate-data", "write a toy English->German corpus");
  std::string g_out;
  uint64_t g_seed = 1;
  size_t g_train = 50000, g_valid = 1000, g_test = 1000;
  gen->add_option("--out", g_out, "output directory")->required();
  gen->add_option("--seed", g_seed, "generator seed")
      ->check(cli::seed_range());
  gen->add_option("--train", g_train, "training pairs")->check(CLI::Range(size_t(1), size_t(1) << 24));
  gen->add_option("--valid", g_valid, "validation pairs")->check(CLI::Range(size_t(1), size_t(1) << 24));
  gen->add_option("--test", g_test, "test pairs")->check(CLI::Range(size_t(1), size_t(1) << 24));

  auto* trn = app.add_subcommand("train", "train (or --resume) a model into a run directory");
  tr::TrainOptions o;
  trn->add_option("--data", o.data_dir, "directory with train.tsv and valid.tsv")->required();
  trn->add_option("--out", o.run_dir, "run directory")->required();
  trn->add_option("--preset", o.preset, "model preset (tiny, small, base, big)");
  auto* steps = trn->add_option("--steps", o.steps, "training steps")->check(CLI::Range(int64_t(1), int64_t(1) << 40));
  auto* minutes = trn->add_option("--minutes", o.minutes, "training time budget (total over resumes)")
                      ->check(CLI::Range(0.01, 1e6));
  trn->add_option("--batch-tokens", o.batch_tokens, "padded target tokens per batch")->check(CLI::Range(int64_t(1), int64_t(1) << 30));
  trn->add_option("--lr-factor", o.lr_factor, "Noam schedule factor")->check(CLI::Range(1e-6, 1e3));
  trn->add_option("--warmup", o.warmup, "Noam warmup steps")->check(CLI::Range(int64_t(1), int64_t(1) << 30));
  trn->add_option("--lr", o.lr, "constant learning rate (replaces the Noam schedule)")->check(CLI::Range(0.0, 10.0));
  trn->add_option("--label-smoothing", o.label_smoothing, "label smoothing epsilon")->check(CLI::Range(0.0, 0.99));
  trn->add_option("--dropout", o.dropout, "dropout probability")->check(CLI::Range(0.0, 0.99));
  trn->add_flag("--pre-ln", o.pre_ln, "pre-LayerNorm blocks (default post-LN)");
  trn->add_option("--positions", o.positions, "positional encoding: sinusoidal, learned, rope, alibi, relative")
      ->check(CLI::IsMember({"sinusoidal", "learned", "rope", "alibi", "relative"}));
  trn->add_option("--attention-dropout", o.attention_dropout, "dropout on the attention probabilities")
      ->check(CLI::Range(0.0, 0.99));
  trn->add_option("--vocab", o.vocab, "SentencePiece vocabulary size")->check(CLI::Range(8, 1 << 20));
  trn->add_option("--valid-every", o.valid_every, "validate and checkpoint every N steps")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 30));
  trn->add_option("--log-every", o.log_every, "metrics row / non-TTY progress line every N steps")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 30));
  trn->add_option("--seed", o.seed, "seed for initialisation, dropout and batch order")
      ->check(cli::seed_range());
  trn->add_option("--patience", o.patience,
                  "early stopping: stop after N validations without a better valid BLEU (0: off)")
      ->check(CLI::NonNegativeNumber);
  trn->add_option("--min-delta", o.min_delta, "early stopping: a valid BLEU counts as better only above the best + this")
      ->check(CLI::NonNegativeNumber);
  trn->add_option("--stop-at-bleu", o.stop_at_bleu,
                  "time to quality: stop at the first validation with valid BLEU >= this")
      ->check(CLI::Range(0.0, 100.0));
  trn->add_option("--dump-batches", o.dump_batches,
                  "write the batches, their order and the initial weights for a peer implementation (bench)");
  trn->add_flag("--resume", o.resume, "continue the run in --out exactly where it stopped");
  cli::add_detect_anomaly(trn);
  steps->excludes(minutes);
  minutes->excludes(steps);

  auto* tl = app.add_subcommand("translate", "translate stdin to stdout, one sentence per line");
  std::string t_run, t_att;
  models::DecodeOptions t_opt;
  int64_t t_max = 0;
  tl->add_option("--run", t_run, "run directory")->required();
  tl->add_option("--beam", t_opt.beam, "beam size (1: greedy)")->check(CLI::Range(1, 64));
  tl->add_flag("--sample", t_opt.sample, "sample each token (with --temperature, --top-k, --top-p, --seed)");
  tl->add_option("--temperature", t_opt.sampling.temperature, "sampling temperature (> 0)");
  tl->add_option("--top-k", t_opt.sampling.top_k, "sample among the k most likely tokens (0: all)");
  tl->add_option("--top-p", t_opt.sampling.top_p, "sample from the nucleus of probability p, in (0, 1]");
  tl->add_option("--seed", t_opt.seed, "sampling seed (same seed, same output)")
      ->check(cli::seed_range());
  tl->add_option("--max-len", t_max, "maximum output pieces (default 2 * source + 10)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  tl->add_option("--attention", t_att, "PNG heatmap of the first sentence's cross-attention");

  auto* ev = app.add_subcommand("evaluate", "BLEU, token accuracy and perplexity on a TSV file");
  std::string e_run, e_data;
  int e_beam = 1, e_samples = 5;
  ev->add_option("--run", e_run, "run directory")->required();
  ev->add_option("--data", e_data, "source<TAB>reference file")->required();
  ev->add_option("--beam", e_beam, "beam size (1: greedy)")->check(CLI::Range(1, 64));
  ev->add_option("--samples", e_samples, "sample translations to print")->check(CLI::Range(0, 1 << 20));

  cli::add_precision(trn);
  cli::add_precision(tl);
  cli::add_precision(ev);
  auto* sc = app.add_subcommand(
      "score", "BLEU of hypotheses given as token ids (a line of ids per sentence), decoded with a run's SentencePiece model, against the first references of a TSV");
  std::string s_run, s_data, s_hyp;
  sc->add_option("--run", s_run, "run directory (its spm.model)")->required();
  sc->add_option("--data", s_data, "source<TAB>reference file")->required();
  sc->add_option("--hyp-ids", s_hyp, "hypothesis ids, one sentence per line")->required();

  if (const int rc = cli::parse(app, argc, argv); rc >= 0) return rc;
  PrecisionGuard precision(cli::precision_choice());
  try {
    if (*gen) return cmd_generate(g_out, g_seed, g_train, g_valid, g_test);
    if (*trn) {
      if (o.steps <= 0 && o.minutes <= 0) throw CLI::ValidationError("train: give --steps N or --minutes M");
      return cmd_train(o);
    }
    if (*tl) return cmd_translate(t_run, t_opt, t_max, t_att);
    if (*ev) return cmd_evaluate(e_run, e_data, e_beam, e_samples);
    if (*sc) return cmd_score(s_run, s_data, s_hyp);
  } catch (const CLI::Error& e) {
    std::cerr << "translate: " << cli::error_line(e) << '\n';
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "translate: " << cli::error_line(e) << '\n';
    return 2;
  }
  return 0;
}
