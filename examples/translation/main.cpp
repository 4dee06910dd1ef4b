// translate: the toy English -> German example end to end.
//   translate generate-data --out data/toy --seed 1 --train 50000 --valid 1000 --test 1000
//   translate train --data data/toy --out runs/demo --preset tiny --minutes 9
//   echo "Hello." | translate translate --hf opus-mt-en-de   (a Hugging Face Marian directory)
//   echo "the dog sees the cat ." | translate translate --run runs/demo [--beam 4] [--attention
//   a.png]
//     [--sample --temperature 0.8 --top-k 20 --top-p 0.9 --seed 1]
//   translate evaluate --run runs/demo --data data/toy/test.tsv
//   translate forward --run runs/demo --batch batch.safetensors --out outputs.safetensors
//   translate import-weights --run runs/from-torch --weights torch.safetensors
//   translate export --run runs/demo --precision int8   (writes runs/demo/model.int8.safetensors,
//     which translate and evaluate --precision int8 then load with no float32 copy of a quantized
//     weight)
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "examples/common/cli.h"
#include "examples/common/finite.h"
#include "examples/common/lines.h"
#include "examples/common/plot.h"
#include "examples/translation/interop.h"
#include "examples/translation/toydata.h"
#include "examples/translation/trainer.h"
#include "graft/models/hf_marian.h"
#include "graft/nn/text/marian_tokenizer.h"

using namespace graft;
namespace tr = graft::translation;

namespace {

int cmd_generate(const std::string& out, uint64_t seed, size_t n_train, size_t n_valid,
                 size_t n_test) {
  for (const char* split : {"/train.tsv", "/valid.tsv", "/test.tsv"})
    train::check_output_path("generate-data --out", out + split, {});
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
  if (train::world_communicator().rank() != 0) return 0;  // under mpirun rank 0 reports
  std::printf(
      "trained steps %lld..%lld in %.1f s (%.0f target tokens/s); valid loss %.4f ppl %.3f "
      "acc %.2f%% BLEU %.2f\n",
      (long long)r.first_step, (long long)r.last_step, r.train_seconds, r.tokens_per_s,
      r.last_valid.loss, r.last_valid.ppl, 100 * r.last_valid.acc, r.last_valid.bleu);
  return 0;
}

// The run's model for inference at the --precision in force: its export for that precision when
// the run has one (said on stderr), else model.safetensors.
tr::LoadedRun load_for_inference(const std::string& run) {
  auto lr = tr::load_run(run, matmul_precision());
  if (lr.weights != run + "/model.safetensors")
    std::cerr << "loaded " << lr.weights << " (the " << precision_name(matmul_precision())
              << " export: no float32 copy of a quantized weight)\n";
  return lr;
}

int cmd_export(const std::string& run, const std::string& precision) {
  const std::string out = tr::export_run(run, parse_precision(precision, "--precision"));
  std::printf("wrote %s\n", out.c_str());
  return 0;
}

// Lines translated at a time from standard input (sorted by length into batches within it).
constexpr size_t kTranslateChunk = 1024;

int cmd_translate(const std::string& run, const models::DecodeOptions& o, int64_t max_len,
                  const std::string& attention) {
  models::check_decode_options(o);  // before loading anything
  if (!attention.empty()) train::check_output_path("--attention", attention, tr::run_inputs(run));
  auto lr = load_for_inference(run);
  // Translating needs nothing else of the model: at int8 its linears' float32 weights go.
  models::keep_for_inference(*lr.model, matmul_precision());
  size_t overlong = 0, truncated = 0;
  std::string first_line, first_hyp;  // for --attention
  bool any = false;
  // In chunks of lines, each translated and printed before the next is read: memory stays
  // bounded whatever comes in (`yes | translate translate`).
  text::for_each_chunk(
      stdin, text::kHardLineCap, kTranslateChunk, "error reading standard input",
      [&](const std::vector<text::CappedLine>& chunk, size_t) {
        std::vector<std::string> lines;
        for (const text::CappedLine& l : chunk) {
          overlong += l.too_long;  // an overlong line stays an empty output line, in its place
          lines.push_back(l.text);
        }
        size_t chunk_truncated = 0;
        const auto hyps =
            tr::translate_lines(*lr.model, *lr.tok, lines, o, max_len, &chunk_truncated);
        truncated += chunk_truncated;
        for (const auto& h : hyps) std::cout << h << '\n';
        std::cout.flush();
        if (!any && !lines.empty()) first_line = lines[0], first_hyp = hyps[0], any = true;
      });
  if (overlong)
    std::cerr << "translate: " << overlong << " input line(s) over " << text::kHardLineCap
              << " bytes were not translated (empty output lines)\n";
  if (truncated)
    std::cerr << "translate: " << truncated << " input line(s) longer than the model's max_len ("
              << lr.model->cfg.max_len << " tokens) were truncated\n";
  if (!attention.empty()) {
    if (!any) throw std::runtime_error("--attention: no input sentence");
    auto a = tr::cross_attention(*lr.model, *lr.tok, first_line, first_hyp);
    plot::heatmap(attention, a.weights, a.tgt_pieces, a.src_pieces,
                  "cross-attention, last decoder layer (mean over heads)");
    std::cerr << "wrote " << attention << '\n';
  }
  return 0;
}

// Lines of a Hugging Face Marian directory translated at a time (one padded batch).
constexpr size_t kHfBatch = 32;

// The directory's generation settings (Hugging Face's generate() defaults for it) where the
// command line gave none: num_beams, length_penalty, max_length, and always its banned tokens,
// forced eos and beam scoring.
models::DecodeOptions hf_options(models::DecodeOptions o, const models::HfMarian& m,
                                 bool beam_given, bool penalty_given, int64_t max_len) {
  if (!beam_given) o.beam = (int)std::min<int64_t>(m.hf.num_beams, 64);
  if (!penalty_given) o.length_penalty = m.hf.length_penalty;
  o.hf_beam = true;
  o.banned_ids = m.hf.bad_words;
  o.forced_eos_id = m.hf.forced_eos_id;
  // The halves sinusoid table has max_position_embeddings rows, the decoder start one of them.
  o.max_len = std::min(max_len > 0 ? max_len : m.hf.max_length - 1, m.model->cfg.max_len - 1);
  return o;
}

// The lines' ids, each cut to the model's max_len (its last token kept: </s>), padded with pad.
Tensor hf_batch(const text::MarianTokenizer& tok, const std::vector<std::string>& lines,
                int64_t max_len, int64_t pad) {
  std::vector<std::vector<int64_t>> rows;
  size_t width = 1;
  for (const std::string& l : lines) {
    std::vector<int64_t> ids = tok.encode(l);
    if ((int64_t)ids.size() > max_len) ids.erase(ids.begin() + max_len - 1, ids.end() - 1);
    width = std::max(width, ids.size());
    rows.push_back(std::move(ids));
  }
  std::vector<int64_t> flat;
  for (auto& r : rows) {
    r.resize(width, pad);
    flat.insert(flat.end(), r.begin(), r.end());
  }
  return from_vector(flat, {(int64_t)rows.size(), (int64_t)width}, DType::i64);
}

int cmd_translate_hf(const std::string& dir, const models::DecodeOptions& given, int64_t max_len,
                     bool beam_given, bool penalty_given) {
  models::check_decode_options(given);  // before loading anything
  models::HfMarian m = models::load_hf_marian(dir);
  const text::MarianTokenizer tok(dir);
  const models::DecodeOptions o = hf_options(given, m, beam_given, penalty_given, max_len);
  models::keep_for_inference(*m.model, matmul_precision());
  text::for_each_chunk(stdin, text::kHardLineCap, kHfBatch, "error reading standard input",
                       [&](const std::vector<text::CappedLine>& chunk, size_t) {
                         std::vector<std::string> lines;
                         for (const text::CappedLine& l : chunk) lines.push_back(l.text);
                         const Tensor src =
                             hf_batch(tok, lines, m.model->cfg.max_len, m.model->cfg.pad_id);
                         for (const auto& ids : models::translate(*m.model, src, o))
                           std::cout << tok.decode(ids) << '\n';
                         std::cout.flush();
                       });
  return 0;
}

int cmd_evaluate(const std::string& run, const std::string& data, int beam, int samples) {
  auto lr = load_for_inference(run);
  text::CorpusStats st;
  auto pairs = tr::load_corpus(data, st);
  std::printf("%s: %s\n", data.c_str(), st.summary().c_str());
  if (pairs.empty()) throw std::runtime_error("evaluate: no usable pairs in '" + data + "'");
  // A model holding NaN decodes nothing worth a BLEU; decoding would stop at its first NaN logit
  // without naming the weight.
  if (const std::string bad = cli::nonfinite_parameter(*lr.model); !bad.empty())
    fail("evaluate: " + bad + " (--run '" + run + "')");
  // As translate: the model in the form it runs in (int8 linears, or a bf16 model).
  models::keep_for_inference(*lr.model, matmul_precision());
  auto r = tr::evaluate(*lr.model, *lr.tok, pairs, beam);
  if (r.forced.tokens > 0) {
    cli::check_finite("evaluate: the teacher-forced perplexity", r.forced.ppl, lr.model.get());
    cli::check_finite("evaluate: the teacher-forced accuracy", r.forced.acc, lr.model.get());
  }
  std::printf("%s\n", r.bleu.str().c_str());
  std::printf("signature: %s\n", r.bleu.signature.c_str());
  std::printf("baseline (copy the source): BLEU %.2f\n",
              cli::check_finite("evaluate: the baseline's BLEU", r.copy_source.score));
  const std::string decoding = beam > 1 ? "beam " + std::to_string(beam) : "greedy";
  if (r.forced.tokens > 0)
    std::printf(
        "decoding: %s; teacher-forced token accuracy %.2f%%, perplexity %.4f (%lld tokens)\n",
        decoding.c_str(), 100 * r.forced.acc, r.forced.ppl, (long long)r.forced.tokens);
  else
    std::printf("decoding: %s; no teacher-forced metrics: no pair fits the model's max_len\n",
                decoding.c_str());
  if (r.forced_dropped)
    std::printf(
        "%zu pair(s) longer than the model's max_len (%lld tokens) left out of the teacher-forced "
        "metrics\n",
        r.forced_dropped, (long long)lr.model->cfg.max_len);
  if (r.truncated)
    std::printf("%zu source(s) longer than max_len truncated for decoding\n", r.truncated);
  for (int i = 0; i < samples && i < (int)pairs.size(); ++i)
    std::printf("\nSRC: %s\nREF: %s\nHYP: %s\n", pairs[i].src.c_str(), pairs[i].tgt.c_str(),
                r.hyps[i].c_str());
  return 0;
}

// As many references as there are hypothesis lines, from the start of the TSV.
int cmd_score(const std::string& run, const std::string& data, const std::string& hyp_ids) {
  text::CorpusStats st;
  auto pairs = tr::load_corpus(data, st);
  text::check_input_file("score", hyp_ids);  // not /dev/zero, not over 1 GiB
  std::ifstream in(hyp_ids);
  if (!in) throw std::runtime_error("score: cannot open '" + hyp_ids + "'");
  const size_t n = (size_t)std::count(std::istreambuf_iterator<char>(in),
                                      std::istreambuf_iterator<char>(), '\n');
  if (n > pairs.size())
    throw std::runtime_error("score: '" + hyp_ids + "' has " + std::to_string(n) + " lines, '" +
                             data + "' only " + std::to_string(pairs.size()) + " pairs");
  std::vector<std::string> refs;
  for (size_t i = 0; i < n; ++i) refs.push_back(pairs[i].tgt);
  text::Tokenizer tok(run + "/spm.model");
  const text::BleuResult bleu = tr::bleu_of_ids(tok, hyp_ids, refs);
  cli::check_finite("score: the BLEU", bleu.score);
  std::printf("%s\n", bleu.str().c_str());
  return 0;
}

// Each subcommand: its options (kept alive by the closure that runs it) and its CLI.

cli::Command add_generate(CLI::App& app) {
  struct Args {
    std::string out;
    uint64_t seed = 1;
    size_t train = 50000, valid = 1000, test = 1000;
  };
  auto a = std::make_shared<Args>();
  auto* sub = app.add_subcommand("generate-data", "write a toy English->German corpus");
  sub->add_option("--out", a->out, "output directory")->required();
  sub->add_option("--seed", a->seed, "generator seed")->check(cli::seed_range());
  sub->add_option("--train", a->train, "training pairs")
      ->check(CLI::Range(size_t(1), size_t(1) << 24));
  sub->add_option("--valid", a->valid, "validation pairs")
      ->check(CLI::Range(size_t(1), size_t(1) << 24));
  sub->add_option("--test", a->test, "test pairs")->check(CLI::Range(size_t(1), size_t(1) << 24));
  return {sub, [a] { return cmd_generate(a->out, a->seed, a->train, a->valid, a->test); }};
}

cli::Command add_train(CLI::App& app) {
  auto o = std::make_shared<tr::TrainOptions>();
  auto* sub = app.add_subcommand("train", "train (or --resume) a model into a run directory");
  sub->add_option("--data", o->data_dir, "directory with train.tsv and valid.tsv")->required();
  sub->add_option("--out", o->loop.run_dir, "run directory")->required();
  sub->add_option("--preset", o->preset, "model preset (tiny, small, base, big)");
  sub->add_option("--batch-tokens", o->batch_tokens, "padded target tokens per batch")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 30));
  cli::add_loop_options(sub, o->loop, 4000, "valid BLEU",
                        "initialisation, dropout and batch order");
  sub->add_option("--stop-at-bleu", o->loop.stop_at,
                  "time to quality: stop at the first validation with valid BLEU >= this")
      ->check(cli::range(0.0, 100.0));
  sub->add_option("--label-smoothing", o->label_smoothing, "label smoothing epsilon")
      ->check(cli::range(0.0, 1.0));
  sub->add_option("--dropout", o->dropout, "dropout probability")->check(cli::range(0.0, 1.0));
  sub->add_flag("--pre-ln", o->pre_ln, "pre-LayerNorm blocks (default post-LN)");
  sub->add_option("--positions", o->positions,
                  "positional encoding: sinusoidal, learned, rope, alibi, relative")
      ->check(CLI::IsMember({"sinusoidal", "learned", "rope", "alibi", "relative"}));
  sub->add_option("--attention-dropout", o->attention_dropout,
                  "dropout on the attention probabilities")
      ->check(cli::range(0.0, 1.0));
  sub->add_option("--vocab", o->vocab, "SentencePiece vocabulary size")
      ->check(CLI::Range(8, 1 << 20));
  sub->add_option(
      "--dump-batches", o->dump_batches,
      "write the batches, their order and the initial weights for a peer implementation (bench)");
  sub->add_option("--graph", o->graph,
                  "also draw one training step's recorded graph into FILE (.svg/.png/.pdf via "
                  "Graphviz, or .dot)");
  sub->add_option_function<std::string>(
         "--dtype",
         [o](const std::string& s) {
           try {
             o->dtype = tr::parse_train_dtype(s, "--dtype");
           } catch (const Error& e) {
             throw CLI::ValidationError(e.what());
           }
         },
         "the weights' dtype: f32 (default), bf16 or f16 (16-bit weights and activations; the "
         "optimizer keeps float32 master weights and moments), or f64")
      ->type_name("DTYPE");
  cli::add_precision(sub);
  return {sub, [o, sub] {
            if (o->loop.steps <= 0 && o->loop.minutes <= 0)
              throw CLI::ValidationError("train: give --steps N or --minutes M");
            cli::set_auto_warmup(sub, o->loop.warmup, o->loop.steps, 4000);
            return cmd_train(*o);
          }};
}

cli::Command add_translate(CLI::App& app) {
  struct Args {
    std::string run, hf, attention;
    models::DecodeOptions opt;
    int64_t max_len = 0;
  };
  auto a = std::make_shared<Args>();
  auto* sub = app.add_subcommand("translate", "translate stdin to stdout, one sentence per line");
  auto* run = sub->add_option("--run", a->run, "run directory");
  sub->add_option("--hf", a->hf,
                  "a Hugging Face Marian (Opus-MT) directory: its model, tokenizer and "
                  "generation settings, its beam scoring")
      ->excludes(run);
  cli::add_decoding_options(sub, a->opt);
  auto* penalty =
      sub->add_option("--length-penalty", a->opt.length_penalty,
                      "beam search: the final beams ranked by score / ((5 + length) / 6)^alpha "
                      "(GNMT), with --hf by score / length^alpha; 0: by score")
          ->check(cli::range(0.0, 10.0));
  sub->add_option("--max-len", a->max_len, "maximum output pieces (default 2 * source + 10)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  sub->add_option("--attention", a->attention,
                  "PNG heatmap of the first sentence's cross-attention");
  cli::add_precision(sub, cli::PrecisionUse::inference);
  return {sub, [a, sub, penalty] {
            if (a->hf.empty() == a->run.empty()) fail("give one of --run and --hf");
            if (!a->hf.empty() && !a->attention.empty()) fail("--attention needs --run (not --hf)");
            if (!a->hf.empty())
              return cmd_translate_hf(a->hf, a->opt, a->max_len, sub->count("--beam") > 0,
                                      penalty->count() > 0);
            return cmd_translate(a->run, a->opt, a->max_len, a->attention);
          }};
}

cli::Command add_evaluate(CLI::App& app) {
  struct Args {
    std::string run, data;
    int beam = 1, samples = 5;
  };
  auto a = std::make_shared<Args>();
  auto* sub = app.add_subcommand("evaluate", "BLEU, token accuracy and perplexity on a TSV file");
  sub->add_option("--run", a->run, "run directory")->required();
  sub->add_option("--data", a->data, "source<TAB>reference file")->required();
  sub->add_option("--beam", a->beam, "beam size (1: greedy)")->check(CLI::Range(1, 64));
  sub->add_option("--samples", a->samples, "sample translations to print")
      ->check(CLI::Range(0, 1 << 20));
  cli::add_precision(sub, cli::PrecisionUse::inference);
  return {sub, [a] { return cmd_evaluate(a->run, a->data, a->beam, a->samples); }};
}

cli::Command add_score(CLI::App& app) {
  struct Args {
    std::string run, data, hyp_ids;
  };
  auto a = std::make_shared<Args>();
  auto* sub = app.add_subcommand(
      "score",
      "BLEU of hypotheses given as token ids (a line of ids per sentence), decoded with a run's "
      "SentencePiece model, against the first references of a TSV");
  sub->add_option("--run", a->run, "run directory (its spm.model)")->required();
  sub->add_option("--data", a->data, "source<TAB>reference file")->required();
  sub->add_option("--hyp-ids", a->hyp_ids, "hypothesis ids, one sentence per line")->required();
  return {sub, [a] { return cmd_score(a->run, a->data, a->hyp_ids); }};
}

cli::Command add_forward(CLI::App& app) {
  struct Args {
    std::string run, batch, out;
    double label_smoothing = 0.1;
  };
  auto a = std::make_shared<Args>();
  auto* sub =
      app.add_subcommand("forward",
                         "a run's logits, loss and parameter gradients on one batch of ids "
                         "(safetensors in and out), to compare with another implementation");
  sub->add_option("--run", a->run, "run directory")->required();
  sub->add_option("--batch", a->batch, "safetensors file with int64 src, tgt_in, tgt_out")
      ->required();
  sub->add_option("--out", a->out,
                  "safetensors file to write logits, loss and grad.<parameter> into")
      ->required();
  sub->add_option("--label-smoothing", a->label_smoothing, "label smoothing of the loss")
      ->check(cli::range(0.0, 0.99));
  return {sub, [a] { return tr::write_forward(a->run, a->batch, a->label_smoothing, a->out), 0; }};
}

cli::Command add_import_weights(CLI::App& app) {
  struct Args {
    std::string run, weights;
  };
  auto a = std::make_shared<Args>();
  auto* sub = app.add_subcommand("import-weights",
                                 "write a run's model.safetensors from plain safetensors weights "
                                 "under graft's names (e.g. saved from PyTorch)");
  sub->add_option("--run", a->run, "run directory with config.json and spm.model")->required();
  sub->add_option("--weights", a->weights, "safetensors file with every parameter, float32")
      ->required();
  return {sub, [a] {
            // --weights may be the run's own model.safetensors: it is read whole before the write.
            train::check_output_path("import-weights", a->run + "/model.safetensors", {});
            return tr::import_weights(a->run, a->weights), 0;
          }};
}

cli::Command add_export(CLI::App& app) {
  struct Args {
    std::string run, precision;
  };
  auto a = std::make_shared<Args>();
  auto* sub = app.add_subcommand(
      "export",
      "write a run's weights in the form inference runs on (model.int8.safetensors: int8 linear "
      "weights and their scales; model.bf16.safetensors: bf16), which translate and evaluate "
      "--precision int8|bf16 then load with no float32 copy of a quantized weight");
  sub->add_option("--run", a->run, "run directory")->required();
  sub->add_option("--precision", a->precision, "int8 or bf16")
      ->required()
      ->check(CLI::IsMember({"int8", "bf16"}));
  return {sub, [a] { return cmd_export(a->run, a->precision); }};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"graft toy translation: generate data, train a Transformer, translate, evaluate"};
  app.require_subcommand(1);
  cli::show_defaults(app);
  const std::vector<cli::Command> commands = {
      add_generate(app), add_train(app),   add_translate(app),      add_evaluate(app),
      add_score(app),    add_forward(app), add_import_weights(app), add_export(app)};
  return cli::run_commands(app, commands, argc, argv);
}
