#include "examples/translation/trainer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <numeric>
#include <sstream>

#include "examples/common/curves.h"
#include "examples/common/graph_file.h"
#include "examples/common/lines.h"
#include "examples/common/train_task.h"
#include "graft/autograd/graph.h"
#include "graft/autograd/tape.h"
#include "graft/models/config_json.h"
#include "graft/models/run.h"
#include "graft/nn/train/checkpoint.h"
#include "graft/nn/train/checkpoint_dir.h"
#include "graft/nn/train/optim.h"
#include "graft/nn/train/trainer.h"
#include "graft/ops/dropout.h"
#include "graft/ops/ops.h"

namespace fs = std::filesystem;

namespace graft::translation {

namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t PAD = text::Tokenizer::PAD, BOS = text::Tokenizer::BOS,
                  EOS = text::Tokenizer::EOS;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

Tensor ids_tensor(const std::vector<int64_t>& v, int64_t rows, int64_t cols) {
  return from_vector(v, {rows, cols}, DType::i64);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Data.

std::vector<text::Pair> load_corpus(const std::string& path, text::CorpusStats& stats) {
  return text::read_tsv(path, stats);
}

std::vector<Example> encode_pairs(const text::Tokenizer& tok,
                                  const std::vector<text::Pair>& pairs) {
  std::vector<Example> out(pairs.size());
  for (size_t i = 0; i < pairs.size(); ++i) {
    auto s = tok.encode(pairs[i].src), t = tok.encode(pairs[i].tgt);
    out[i].src.assign(s.begin(), s.end());
    out[i].tgt.assign(t.begin(), t.end());
  }
  return out;
}

namespace {

// One batch of the examples `rows`: src padded to the longest source, tgt_in = BOS + target and
// tgt_out = target + EOS padded to the longest target + 1.
Batch padded_batch(const std::vector<Example>& examples, const std::vector<size_t>& rows) {
  const int64_t B = (int64_t)rows.size();
  int64_t S = 0, T = 0;
  for (size_t i : rows) {
    S = std::max(S, (int64_t)examples[i].src.size());
    T = std::max(T, (int64_t)examples[i].tgt.size() + 1);
  }
  std::vector<int64_t> src(B * S, PAD), tin(B * T, PAD), tout(B * T, PAD);
  Batch b;
  for (int64_t r = 0; r < B; ++r) {
    const auto& e = examples[rows[r]];
    std::copy(e.src.begin(), e.src.end(), src.begin() + r * S);
    tin[r * T] = BOS;
    std::copy(e.tgt.begin(), e.tgt.end(), tin.begin() + r * T + 1);
    std::copy(e.tgt.begin(), e.tgt.end(), tout.begin() + r * T);
    tout[r * T + (int64_t)e.tgt.size()] = EOS;
    b.tgt_tokens += (int64_t)e.tgt.size() + 1;
  }
  b.src = ids_tensor(src, B, S);
  b.tgt_in = ids_tensor(tin, B, T);
  b.tgt_out = ids_tensor(tout, B, T);
  return b;
}

}  // namespace

std::vector<Batch> make_batches(const std::vector<Example>& examples, int64_t max_tokens,
                                int64_t max_len, size_t* dropped) {
  if (max_tokens < 1)
    fail("make_batches: max_tokens must be >= 1, got " + std::to_string(max_tokens));
  std::vector<size_t> idx;
  size_t n_dropped = 0;
  for (size_t i = 0; i < examples.size(); ++i) {
    const auto& e = examples[i];
    if (e.src.empty() || (int64_t)e.src.size() > max_len - 1 || (int64_t)e.tgt.size() > max_len - 1)
      ++n_dropped;
    else idx.push_back(i);
  }
  if (dropped) *dropped = n_dropped;
  // Sorting by target then source length keeps both sides' padding small; stable for
  // determinism across standard libraries.
  std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
    const auto& x = examples[a];
    const auto& y = examples[b];
    if (x.tgt.size() != y.tgt.size()) return x.tgt.size() < y.tgt.size();
    return x.src.size() < y.src.size();
  });
  std::vector<Batch> batches;
  auto flush = [&](size_t begin, size_t end) {
    batches.push_back(padded_batch(examples, {idx.begin() + begin, idx.begin() + end}));
  };
  size_t begin = 0;
  int64_t T = 0;
  for (size_t k = 0; k < idx.size(); ++k) {
    const int64_t t = (int64_t)examples[idx[k]].tgt.size() + 1;
    const int64_t newT = std::max(T, t);
    if (k > begin && newT * (int64_t)(k - begin + 1) > max_tokens) {
      flush(begin, k);
      begin = k;
      T = t;
    } else {
      T = newT;
    }
  }
  if (begin < idx.size()) flush(begin, idx.size());
  return batches;
}

// ---------------------------------------------------------------------------------------------
// Evaluation and decoding.

ForcedMetrics teacher_forced(models::Transformer& m, const std::vector<Batch>& batches) {
  nn::EvalScope es(m);
  autograd::NoGrad ng;
  double nll = 0;
  int64_t correct = 0, tokens = 0;
  for (const auto& b : batches) {
    Tensor lg = m.forward(b.src, b.tgt_in);
    const int64_t V = lg.size(-1);
    Tensor flat = reshape(lg, {-1, V});
    Tensor tgt = reshape(b.tgt_out, {-1});
    nll += cross_entropy(flat, tgt, 0.0, PAD).item() * (double)b.tgt_tokens;
    auto pred = argmax(flat, 1).to_vector<int64_t>();
    auto gold = tgt.to_vector<int64_t>();
    for (size_t i = 0; i < gold.size(); ++i)
      if (gold[i] != PAD && pred[i] == gold[i]) ++correct;
    tokens += b.tgt_tokens;
  }
  ForcedMetrics r;
  r.tokens = tokens;
  if (tokens > 0) {
    r.loss = nll / (double)tokens;
    r.ppl = std::exp(r.loss);
    r.acc = (double)correct / (double)tokens;
  }
  return r;
}

std::vector<std::string> translate_lines(models::Transformer& m, const text::Tokenizer& tok,
                                         const std::vector<std::string>& lines, int beam,
                                         int64_t max_len, size_t* truncated) {
  models::DecodeOptions o;
  o.beam = beam;
  return translate_lines(m, tok, lines, o, max_len, truncated);
}

std::vector<std::string> translate_lines(models::Transformer& m, const text::Tokenizer& tok,
                                         const std::vector<std::string>& lines,
                                         const models::DecodeOptions& opts, int64_t max_len,
                                         size_t* truncated) {
  models::check_decode_options(opts);
  const int beam = opts.beam;
  nn::EvalScope es(m);
  std::vector<std::vector<int64_t>> enc(lines.size());
  std::vector<size_t> order;  // the lines to decode: an empty one translates to an empty line
  if (truncated) *truncated = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    auto v = tok.encode(lines[i]);
    enc[i].assign(v.begin(), v.end());
    if ((int64_t)enc[i].size() > m.cfg.max_len) {
      enc[i].resize(m.cfg.max_len);
      if (truncated) ++*truncated;
    }
    if (!enc[i].empty()) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return enc[a].size() < enc[b].size(); });
  std::vector<std::string> out(lines.size());
  // Beams multiply the rows, so the chunk shrinks to keep the decoder's working set similar.
  const size_t chunk = std::max<size_t>(1, 128 / (size_t)std::max(1, beam));
  for (size_t begin = 0; begin < order.size(); begin += chunk) {
    const size_t end = std::min(order.size(), begin + chunk);
    int64_t S = 1;
    for (size_t k = begin; k < end; ++k) S = std::max(S, (int64_t)enc[order[k]].size());
    std::vector<int64_t> src((end - begin) * S, PAD);
    for (size_t k = begin; k < end; ++k) {
      auto& e = enc[order[k]];
      std::copy(e.begin(), e.end(), src.begin() + (k - begin) * S);
    }
    models::DecodeOptions o = opts;
    o.max_len = std::min(m.cfg.max_len - 1, max_len > 0 ? max_len : 2 * S + 10);
    o.seed = opts.seed + begin;  // each chunk its own stream: same seed, same output
    auto hyps = models::translate(m, ids_tensor(src, (int64_t)(end - begin), S), o);
    for (size_t k = begin; k < end; ++k) {
      std::vector<int> ids(hyps[k - begin].begin(), hyps[k - begin].end());
      out[order[k]] = tok.decode(ids);
    }
  }
  return out;
}

EvalResult evaluate(models::Transformer& m, const text::Tokenizer& tok,
                    const std::vector<text::Pair>& pairs, int beam, int64_t batch_tokens) {
  EvalResult r;
  r.forced = teacher_forced(
      m, make_batches(encode_pairs(tok, pairs), batch_tokens, m.cfg.max_len, &r.forced_dropped));
  std::vector<std::string> srcs, refs;
  for (auto& p : pairs) {
    srcs.push_back(p.src);
    refs.push_back(p.tgt);
  }
  r.hyps = translate_lines(m, tok, srcs, beam, 0, &r.truncated);
  r.bleu = text::corpus_bleu(r.hyps, refs);
  r.copy_source = text::corpus_bleu(srcs, refs);
  return r;
}

Attention cross_attention(models::Transformer& m, const text::Tokenizer& tok,
                          const std::string& src, const std::string& hyp) {
  nn::EvalScope es(m);
  autograd::NoGrad ng;
  auto s = tok.encode(src), h = tok.encode(hyp);
  if (s.empty()) fail("cross_attention: empty source sentence");
  std::vector<int64_t> sid(s.begin(), s.end()), tin{BOS};
  tin.insert(tin.end(), h.begin(), h.end());
  Tensor srcT = ids_tensor(sid, 1, (int64_t)sid.size());
  Tensors cw;
  m.decode(m.encode(srcT), srcT, ids_tensor(tin, 1, (int64_t)tin.size()), &cw);
  if (cw.empty()) fail("cross_attention: the decoder returned no attention weights");
  Tensor w = mean(cw.back(), {0, 1});  // (1, H, T, S) -> (T, S)
  const int64_t T = w.size(0), S = w.size(1);
  auto v = w.to_vector<double>();
  Attention a;
  a.weights.assign(T, std::vector<double>(S));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < S; ++j) a.weights[t][j] = v[t * S + j];
  for (int id : s) a.src_pieces.push_back(tok.piece(id));
  // Row t is the attention used to predict token t: the hypothesis pieces, then EOS.
  for (int id : h) a.tgt_pieces.push_back(tok.piece(id));
  a.tgt_pieces.push_back("</s>");
  return a;
}

text::BleuResult bleu_of_ids(const text::Tokenizer& tok, const std::string& hyp_ids_file,
                             const std::vector<std::string>& refs) {
  text::check_input_file("bleu_of_ids", hyp_ids_file);
  std::ifstream in(hyp_ids_file);
  if (!in) fail("bleu_of_ids: cannot open '" + hyp_ids_file + "'");
  in.exceptions(std::ios::badbit);  // a bad_alloc in getline throws instead of ending the loop
  std::vector<std::string> hyps;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::vector<int> ids;
    int64_t id;
    while (ls >> id) {
      if (id < 0 || id >= tok.vocab_size())
        fail("bleu_of_ids: '" + hyp_ids_file + "' line " + std::to_string(hyps.size() + 1) +
             ": id " + std::to_string(id) + " outside the vocabulary (" +
             std::to_string(tok.vocab_size()) + ")");
      ids.push_back((int)id);
    }
    if (!ls.eof())
      fail("bleu_of_ids: '" + hyp_ids_file + "' line " + std::to_string(hyps.size() + 1) +
           " is not ids");
    hyps.push_back(tok.decode(ids));
  }
  if (hyps.size() != refs.size())
    fail("bleu_of_ids: '" + hyp_ids_file + "' has " + std::to_string(hyps.size()) + " lines for " +
         std::to_string(refs.size()) + " references");
  return text::corpus_bleu(hyps, refs);
}

// ---------------------------------------------------------------------------------------------
// Checkpoints.

void save_model(const models::Transformer& m, const std::string& path, int64_t step,
                const std::vector<std::string>& tied_files) {
  train::save_weights(m.state_dict(), path, step, "graft-transformer", tied_files);
}

void load_model(models::Transformer& m, const std::string& path) {
  m.load_state_dict(train::load_weights(path, "load_model"));
}

std::vector<std::string> tied_files(const std::string& run_dir) {
  return {run_dir + "/config.json", run_dir + "/spm.model"};
}

std::vector<train::NamedInput> run_inputs(const std::string& run_dir,
                                          std::vector<train::NamedInput> more) {
  for (const char* f :
       {"config.json", "model.safetensors", "spm.model", "spm.vocab", "train_state.safetensors",
        "metrics.csv", "model.int8.safetensors", "model.bf16.safetensors"})
    more.push_back({run_dir + "/" + f, std::string("the run's ") + f});
  return more;
}

LoadedRun load_run(const std::string& run_dir, Precision precision, models::RunSource source) {
  // The weights are tied to spm.model too: the tokenizer is checked before it is read.
  auto loaded = models::load_run_model<models::Transformer>(run_dir, {run_dir + "/spm.model"},
                                                            precision, source);
  LoadedRun r;
  r.tok = std::make_unique<text::Tokenizer>(run_dir + "/spm.model");
  if (r.tok->vocab_size() != loaded.model->cfg.vocab)
    fail("load_run: '" + run_dir + "/spm.model' has " + std::to_string(r.tok->vocab_size()) +
         " pieces but '" + run_dir + "/config.json' says vocab " +
         std::to_string(loaded.model->cfg.vocab));
  r.model = std::move(loaded.model);
  r.config = std::move(loaded.config);
  r.weights = std::move(loaded.weights);
  r.metadata = std::move(loaded.metadata);
  return r;
}

std::string export_run(const std::string& run_dir, Precision precision) {
  const std::string out = run_dir + "/" + models::export_file_name(precision);
  std::vector<train::NamedInput> inputs;
  for (const train::NamedInput& in : run_inputs(run_dir))
    if (in.path != out) inputs.push_back(in);
  train::check_output_path("export", out, inputs);
  // model.safetensors, built for the precision (float32 for int8: the quantizer reads float32);
  // the export records the checksum of the very file loaded.
  const LoadedRun lr = load_run(run_dir, precision, models::RunSource::weights);
  models::save_export(*lr.model, precision, out, lr.weights, lr.metadata, tied_files(run_dir));
  return out;
}

nlohmann::json TrainOptions::to_json() const {
  return {{"data_dir", data_dir},
          {"preset", preset},
          {"steps", loop.steps},
          {"minutes", loop.minutes},
          {"batch_tokens", batch_tokens},
          {"label_smoothing", label_smoothing},
          {"dropout", dropout},
          {"pre_ln", pre_ln},
          {"positions", positions},
          {"attention_dropout", attention_dropout},
          {"vocab", vocab},
          {"dtype", dtype_short_name(dtype)},
          {"valid_every", loop.valid_every},
          {"seed", loop.seed},
          {"recipe", train::loop_recipe(loop)}};  // the one place of lr, warmup, lr_factor, ...
}

// ---------------------------------------------------------------------------------------------
// Training.

namespace {

// The graph of one training step's loss, clustered by module, drawn into `path`. The dropout
// generator is put back, so the run trains as it would without the drawing.
void draw_step_graph(models::Transformer& model, const Batch& b, double label_smoothing,
                     const std::string& path) {
  const uint64_t dropout_state = model.dropout_gen.state();
  std::string dot;
  {
    autograd::KeepModulePaths paths;
    Tensor loss = model.loss(b.src, b.tgt_in, b.tgt_out, label_smoothing);
    dot = autograd::graph_dot(loss, model.named_parameters());
  }
  autograd::clear_tape();
  model.dropout_gen.set_state(dropout_state);
  plot::write_graph(dot, path);
}

models::TransformerConfig make_config(const TrainOptions& o, int64_t vocab) {
  auto c = models::preset(o.preset, vocab);
  if (o.d_model > 0) c.d_model = o.d_model;
  if (o.heads > 0) c.heads = o.heads;
  if (o.d_ff > 0) c.d_ff = o.d_ff;
  if (o.layers > 0) c.enc_layers = c.dec_layers = o.layers;
  c.dropout = o.dropout;
  c.norm_first = o.pre_ln;
  c.positions.kind = nn::parse_positions(o.positions);
  c.attention_dropout = o.attention_dropout;
  c.seed = o.loop.seed;
  c.dtype = o.dtype;  // recorded in config.json: loading the run builds a model of this dtype
  if (c.d_model % c.heads)
    fail("train: d_model " + std::to_string(c.d_model) + " is not divisible by heads " +
         std::to_string(c.heads));
  return c;
}

// Every option that is not the loop's, before any data is read: the error names the option.
void check_train_options(const TrainOptions& o) {
  auto bad = [](const std::string& m) { fail("train: " + m); };
  if (o.batch_tokens < 1 || o.batch_tokens > (int64_t(1) << 30))
    bad("--batch-tokens must be in [1, 2^30]");
  if (!(o.label_smoothing >= 0 && o.label_smoothing <= 1))
    bad("--label-smoothing must be in [0, 1]");
  if (!is_dropout_p(o.dropout)) bad("--dropout must be in [0, 1]");
  if (!is_dropout_p(o.attention_dropout)) bad("--attention-dropout must be in [0, 1]");
  if (o.vocab < 8 || o.vocab > (1 << 20))
    bad("--vocab must be in [8, 2^20], got " + std::to_string(o.vocab));
  (void)parse_train_dtype(dtype_short_name(o.dtype), "--dtype");
  const std::vector<train::NamedInput> inputs =
      run_inputs(o.loop.run_dir, {{o.data_dir + "/train.tsv", "--data's train.tsv"},
                                  {o.data_dir + "/valid.tsv", "--data's valid.tsv"}});
  if (!o.graph.empty()) plot::check_graph_file_name(o.graph, inputs);
  if (!o.dump_batches.empty()) train::check_output_path("--dump-batches", o.dump_batches, inputs);
  if (o.bleu_sentences < 0) bad("the BLEU sentence count must be >= 0");
  for (auto [name, v] : {std::pair{"--d-model", o.d_model},
                         {"--heads", o.heads},
                         {"--d-ff", o.d_ff},
                         {"--layers", o.layers}})
    if (v < 0 || v > (int64_t(1) << 24))
      bad(std::string(name) + " must be in [0, 2^24] (0: the preset's)");
  if (o.layers > 1024) bad("--layers must be <= 1024");
  (void)models::preset(o.preset, 8);  // an unknown preset names the known ones
}

std::string batches_fingerprint(const std::vector<Batch>& batches) {
  nn::NamedTensors t;
  for (auto& b : batches) t.emplace_back("", b.tgt_out), t.emplace_back("", b.src);
  return train::weights_checksum(t);
}

}  // namespace

namespace {

// TrainOptions::dump_batches: the batches and BLEU sources now, the per-step order as training
// goes (task.loss), the initial weights beside.
using DumpFile = std::unique_ptr<FILE, int (*)(FILE*)>;

// The file at path, created or truncated, never through a symbolic link planted there (the
// dump is written for the whole run, so not through atomic_write()'s temp file).
DumpFile open_dump_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0666);
  const int err = errno;
  DumpFile f(fd >= 0 ? ::fdopen(fd, "w") : nullptr, &std::fclose);
  if (!f) {
    if (fd >= 0) ::close(fd);
    fail("train: --dump-batches: cannot write '" + path + "': " + std::strerror(err) +
         (err == ELOOP ? " (a symbolic link, which is not followed)" : ""));
  }
  return f;
}

DumpFile open_batch_dump(const TrainOptions& o, const models::Transformer& model,
                         const std::vector<Batch>& batches, const text::Tokenizer& tok,
                         const std::vector<std::string>& bleu_src) {
  if (o.loop.resume)
    fail("train: --dump-batches records a whole run from step 0; not with --resume");
  DumpFile f = open_dump_file(o.dump_batches);
  auto line = [&f](const nlohmann::json& j) { std::fprintf(f.get(), "%s\n", j.dump().c_str()); };
  auto rows = [](const Tensor& t) {
    const auto v = t.to_vector<int64_t>();
    const int64_t B = t.size(0), L = t.size(1);
    nlohmann::json j = nlohmann::json::array();
    for (int64_t r = 0; r < B; ++r)
      j.push_back(std::vector<int64_t>(v.begin() + r * L, v.begin() + (r + 1) * L));
    return j;
  };
  for (size_t i = 0; i < batches.size(); ++i)
    line({{"batch", i},
          {"src", rows(batches[i].src)},
          {"tgt_in", rows(batches[i].tgt_in)},
          {"tgt_out", rows(batches[i].tgt_out)}});
  for (const std::string& s : bleu_src) {
    auto ids = tok.encode(s);
    if ((int64_t)ids.size() > model.cfg.max_len)
      ids.resize(model.cfg.max_len);  // as translate_lines
    line({{"bleu_src", std::vector<int64_t>(ids.begin(), ids.end())}});
  }
  if (std::fflush(f.get()) != 0)
    fail("train: --dump-batches: writing '" + o.dump_batches + "' failed: " + std::strerror(errno));
  save_model(model, o.dump_batches + ".init.safetensors", 0, {});
  return f;
}

}  // namespace

namespace {

// An exact continuation needs the interrupted run's schedule, batches and loss, whatever the
// command line says now; only the stopping rule and the reporting may change. Returns the run's
// config.json (empty when not resuming).
nlohmann::json apply_resumed_options(TrainOptions& o) {
  if (!o.loop.resume) return {};
  const std::string cfg_path = o.loop.run_dir + "/config.json";
  nlohmann::json saved = train::load_resume_config(o.loop.run_dir);
  const nlohmann::json t =
      saved.is_object() ? saved.value("train", nlohmann::json()) : nlohmann::json();
  const std::string where = "resume: '" + cfg_path + "': \"train\" section";
  o.batch_tokens = train::json_field<int64_t>(t, "batch_tokens", where);
  tasks::apply_saved_recipe(t, o.loop, where);
  o.label_smoothing = train::json_field<double>(t, "label_smoothing", where);
  o.loop.seed = train::json_field<uint64_t>(t, "seed", where);
  // A run from before --dtype trained in float32.
  if (t.contains("dtype"))
    o.dtype =
        parse_train_dtype(train::json_field<std::string>(t, "dtype", where), where + ": \"dtype\"");
  else o.dtype = DType::f32;
  models::model_section(saved, cfg_path, "resume");
  return saved;
}

using Say = std::function<void(const std::string&)>;

// run/spm.model, trained on the training pairs' both sides unless a resumed run has it.
void ensure_tokenizer(const TrainOptions& o, const std::vector<text::Pair>& train_pairs,
                      const Say& say) {
  const std::string spm = o.loop.run_dir + "/spm.model";
  if (o.loop.resume && fs::exists(spm)) return;
  if (o.loop.resume) fail("resume: '" + spm + "' is missing");
  std::vector<std::string> sents;
  sents.reserve(2 * train_pairs.size());
  for (auto& p : train_pairs) sents.push_back(p.src), sents.push_back(p.tgt);
  auto t0 = Clock::now();
  text::Tokenizer::train(sents, o.loop.run_dir + "/spm", o.vocab);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f", seconds_since(t0));
  // The trainer may settle on fewer pieces than requested on a small language.
  say("trained SentencePiece (" + std::to_string(text::Tokenizer(spm).vocab_size()) + " of " +
      std::to_string(o.vocab) + " requested pieces) in " + buf + " s");
}

// A split's batches; an error when none fits the model.
std::vector<Batch> batches_that_fit(const text::Tokenizer& tok,
                                    const std::vector<text::Pair>& pairs, const TrainOptions& o,
                                    int64_t max_len, const char* split, const Say& say) {
  size_t dropped = 0;
  auto batches = make_batches(encode_pairs(tok, pairs), o.batch_tokens, max_len, &dropped);
  const std::string limit =
      " (" + std::to_string(max_len - 1) + " tokens a side, the model's max_len - 1)";
  if (batches.empty())
    fail("train: none of the " + std::to_string(pairs.size()) + " pairs of '" + o.data_dir + "/" +
         split + ".tsv' fits the model" + limit +
         (std::string(split) == "valid" ? ": nothing to validate on" : ""));
  if (dropped)
    say("dropped " + std::to_string(dropped) + " " +
        (std::string(split) == "valid" ? "validation" : "training") + " pairs longer than" + limit);
  return batches;
}

// The corpus pairs (counts said), and the batches and BLEU sentences made from them.
struct TrainData {
  std::vector<text::Pair> train_pairs, valid_pairs;
  std::vector<Batch> batches, valid_batches;
  std::vector<std::string> bleu_src, bleu_ref;
};

TrainData load_pairs(const TrainOptions& o, const Say& say) {
  TrainData d;
  text::CorpusStats st_train, st_valid;
  d.train_pairs = load_corpus(o.data_dir + "/train.tsv", st_train);
  d.valid_pairs = load_corpus(o.data_dir + "/valid.tsv", st_valid);
  say("train.tsv: " + st_train.summary());
  say("valid.tsv: " + st_valid.summary());
  if (d.train_pairs.empty())
    fail("train: no usable sentence pairs in '" + o.data_dir + "/train.tsv'");
  if (d.valid_pairs.empty())
    fail("train: no usable sentence pairs in '" + o.data_dir + "/valid.tsv'");
  return d;
}

void batch_data(TrainData& d, const text::Tokenizer& tok, const TrainOptions& o, int64_t max_len,
                const Say& say) {
  d.batches = batches_that_fit(tok, d.train_pairs, o, max_len, "train", say);
  d.valid_batches = batches_that_fit(tok, d.valid_pairs, o, max_len, "valid", say);
  for (size_t i = 0; i < d.valid_pairs.size() && (int64_t)i < o.bleu_sentences; ++i)
    d.bleu_src.push_back(d.valid_pairs[i].src), d.bleu_ref.push_back(d.valid_pairs[i].tgt);
}

// What train::train_loop needs: the loss of a batch (recorded into `dump` when it is open),
// validation (teacher-forced loss, perplexity and accuracy, greedy BLEU), the weights and curves
// written at each validation.
train::TrainTask make_task(models::Transformer& model, const text::Tokenizer& tok,
                           const TrainData& d, const TrainOptions& o, FILE* dump) {
  train::TrainTask task;
  task.model = &model;
  task.batches = (int64_t)d.batches.size();
  task.loss = [&model, &d, &o, dump](int64_t i, train::Shard s) {
    const Batch& b = d.batches[(size_t)i];
    if (dump) std::fprintf(dump, "{\"step_batch\":%lld}\n", (long long)i), std::fflush(dump);
    const Tensor tgt_out = train::shard_of(b.tgt_out, s);
    const auto ids = tgt_out.to_vector<int64_t>();
    const int64_t targets =
        (int64_t)std::count_if(ids.begin(), ids.end(), [](int64_t t) { return t != PAD; });
    return train::shard_loss(model.loss(train::shard_of(b.src, s), train::shard_of(b.tgt_in, s),
                                        tgt_out, o.label_smoothing),
                             targets, b.tgt_tokens);
  };
  task.examples = [&d](int64_t i) { return d.batches[(size_t)i].src.size(0); };
  task.tokens = [&d](int64_t i) { return d.batches[(size_t)i].tgt_tokens; };
  task.metric_names = {"loss", "ppl", "acc", "bleu"};
  task.validate = [&model, &tok, &d]() -> std::map<std::string, double> {
    ForcedMetrics fm = teacher_forced(model, d.valid_batches);
    double bleu = 0;
    if (!d.bleu_src.empty())
      bleu = text::corpus_bleu(translate_lines(model, tok, d.bleu_src), d.bleu_ref).score;
    return {{"loss", fm.loss}, {"ppl", fm.ppl}, {"acc", fm.acc}, {"bleu", bleu}};
  };
  task.stop_metric = "bleu";
  task.higher_is_better = true;
  task.generators = {&model.dropout_gen};
  task.data_fingerprint = batches_fingerprint(d.batches);
  task.tied_files = tied_files(o.loop.run_dir);
  task.on_validated = [&model, &o](const train::Validated& v) {
    if (v.best)
      save_model(model, v.checkpoint.path("model.safetensors"), v.step, tied_files(o.loop.run_dir));
    if (o.plot)
      plot::learning_curves(v.checkpoint.path("curves.png"), v.rows, "label-smoothed", {"bleu"},
                            "validation BLEU (greedy)");
  };
  return task;
}

TrainResult result_of(const train::LoopResult& lr) {
  TrainResult res;
  res.first_step = lr.first_step;
  res.last_step = lr.last_step;
  res.losses = lr.losses;
  auto metric = [&](const char* n) { return lr.last_valid.count(n) ? lr.last_valid.at(n) : NAN; };
  res.last_valid = {metric("loss"), metric("ppl"), metric("acc"), metric("bleu")};
  res.tokens_per_s = lr.tokens_per_s;
  res.train_seconds = lr.train_seconds;
  res.stopped_early = lr.stopped_early;
  return res;
}

}  // namespace

DType parse_train_dtype(const std::string& name, const std::string& what) {
  DType dt;
  try {
    dt = parse_dtype(name, what);
  } catch (const Error&) {
    fail(what + ": unknown dtype '" + name + "' (f32, bf16, f16 or f64, or their long names)");
  }
  if (!is_floating(dt))
    fail(what + ": '" + name + "' is an integer dtype; the weights must be f32, f64, bf16 or f16");
  return dt;
}

namespace {
// The model of config c, initialised in float32 and then rounded once into c.dtype (the optimizer
// keeps float32 masters of bf16/f16 weights).
std::unique_ptr<models::Transformer> initialised_model(const models::TransformerConfig& c) {
  models::TransformerConfig f32 = c;
  f32.dtype = DType::f32;
  auto model = std::make_unique<models::Transformer>(f32);
  if (c.dtype != DType::f32) model->to(c.dtype);
  model->cfg.dtype = c.dtype;
  return model;
}
}  // namespace

namespace {

// Training memory is estimated in float32 whatever the dtype: a bf16 run holds bf16 weights and
// gradients but a float32 master copy and two float32 moments (16 bytes a parameter, what 4
// float32 copies cost), and the model is initialized in float32 before its conversion.
void check_training_memory(models::TransformerConfig c, const std::string& where) {
  c.dtype = DType::f32;
  models::check_config_memory(c, where, /*copies=*/4);
}

}  // namespace

TrainResult train(const TrainOptions& opts) {
  TrainOptions o = opts;
  const nlohmann::json saved = apply_resumed_options(o);
  train::check_loop_options(o.loop);  // before the data and SentencePiece work
  check_train_options(o);
  models::TransformerConfig cfg;
  if (o.loop.resume) {
    cfg = models::TransformerConfig::from_json(saved.at("model"), o.loop.run_dir + "/config.json");
    check_training_memory(cfg, o.loop.run_dir + "/config.json");
  } else {
    check_training_memory(make_config(o, o.vocab), "train");  // the vocabulary can only shrink
  }
  // Noam's width, and the one the saved recipe names.
  o.loop.d_model = o.loop.resume ? cfg.d_model : make_config(o, o.vocab).d_model;
  // Under mpirun rank 0 alone writes the run's files and talks; the others wait for them.
  train::Communicator& comm = train::world_communicator();
  const bool rank0 = comm.rank() == 0;
  const Say say = [&o, rank0](const std::string& s) {
    if (!o.loop.quiet && rank0) std::cerr << s << std::endl;
  };

  TrainData d = load_pairs(o, say);
  train::on_rank0(comm, [&] {
    train::lock_run_until_exit(o.loop.run_dir);  // also creates it
    ensure_tokenizer(o, d.train_pairs, say);
    if (!o.loop.resume)
      train::save_json(
          o.loop.run_dir + "/config.json",
          {{"model",
            make_config(o, text::Tokenizer(o.loop.run_dir + "/spm.model").vocab_size()).to_json()},
           {"train", o.to_json()}});
  });
  const text::Tokenizer tok(o.loop.run_dir + "/spm.model");
  if (!o.loop.resume) cfg = make_config(o, tok.vocab_size());
  cfg.dtype = o.dtype;  // a run from before config.json recorded it says float32 there
  const std::unique_ptr<models::Transformer> owned = initialised_model(cfg);
  models::Transformer& model = *owned;
  model.train();
  batch_data(d, tok, o, cfg.max_len, say);
  {
    std::ostringstream os;
    os << "model: " << model.num_parameters() << " parameters (d " << cfg.d_model << ", "
       << cfg.heads << " heads, ff " << cfg.d_ff << ", " << cfg.enc_layers << "+" << cfg.dec_layers
       << " layers, vocab " << cfg.vocab << ", " << dtype_short_name(o.dtype) << "); "
       << d.batches.size() << " batches of <= " << o.batch_tokens << " target tokens";
    say(os.str());
  }
  DumpFile dump(nullptr, &std::fclose);
  train::on_rank0(comm, [&] {
    if (!o.graph.empty()) draw_step_graph(model, d.batches[0], o.label_smoothing, o.graph);
    if (!o.dump_batches.empty()) dump = open_batch_dump(o, model, d.batches, tok, d.bleu_src);
  });
  train::TrainTask task = make_task(model, tok, d, o, dump.get());
  task.run_config = nlohmann::json{{"model", cfg.to_json()}, {"train", o.to_json()}}.dump();
  return result_of(train::train_loop(task, o.loop));
}

}  // namespace graft::translation
