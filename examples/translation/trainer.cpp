#include "examples/translation/trainer.h"

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

#include "autograd/tape.h"
#include "examples/translation/plot.h"
#include "nn/checkpoint.h"
#include "nn/optim.h"
#include "ops/ops.h"

namespace fs = std::filesystem;

namespace graft::translation {

namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t PAD = text::Tokenizer::PAD, BOS = text::Tokenizer::BOS, EOS = text::Tokenizer::EOS;
constexpr const char* kStateVersion = "graft-translate-state-1";

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

uint64_t double_bits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
}
double bits_double(uint64_t u) {
  double d;
  std::memcpy(&d, &u, 8);
  return d;
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

std::vector<Example> encode_pairs(const text::Tokenizer& tok, const std::vector<text::Pair>& pairs) {
  std::vector<Example> out(pairs.size());
  for (size_t i = 0; i < pairs.size(); ++i) {
    auto s = tok.encode(pairs[i].src), t = tok.encode(pairs[i].tgt);
    out[i].src.assign(s.begin(), s.end());
    out[i].tgt.assign(t.begin(), t.end());
  }
  return out;
}

std::vector<Batch> make_batches(const std::vector<Example>& examples, int64_t max_tokens,
                                int64_t max_len, size_t* dropped) {
  if (max_tokens < 1) fail("make_batches: max_tokens must be >= 1, got " + std::to_string(max_tokens));
  std::vector<size_t> idx;
  size_t n_dropped = 0;
  for (size_t i = 0; i < examples.size(); ++i) {
    const auto& e = examples[i];
    if (e.src.empty() || (int64_t)e.src.size() > max_len - 1 || (int64_t)e.tgt.size() > max_len - 1)
      ++n_dropped;
    else
      idx.push_back(i);
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
    const int64_t B = (int64_t)(end - begin);
    int64_t S = 0, T = 0;
    for (size_t k = begin; k < end; ++k) {
      S = std::max(S, (int64_t)examples[idx[k]].src.size());
      T = std::max(T, (int64_t)examples[idx[k]].tgt.size() + 1);
    }
    std::vector<int64_t> src(B * S, PAD), tin(B * T, PAD), tout(B * T, PAD);
    Batch b;
    for (int64_t r = 0; r < B; ++r) {
      const auto& e = examples[idx[begin + r]];
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
    batches.push_back(std::move(b));
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

std::vector<int64_t> shuffled_order(int64_t n, Generator& gen) {
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  for (int64_t i = n - 1; i > 0; --i) std::swap(order[i], order[gen.below((uint64_t)i + 1)]);
  return order;
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
                                         int64_t max_len) {
  models::DecodeOptions o;
  o.beam = beam;
  return translate_lines(m, tok, lines, o, max_len);
}

std::vector<std::string> translate_lines(models::Transformer& m, const text::Tokenizer& tok,
                                         const std::vector<std::string>& lines,
                                         const models::DecodeOptions& opts, int64_t max_len) {
  models::check_decode_options(opts);
  const int beam = opts.beam;
  nn::EvalScope es(m);
  std::vector<std::vector<int64_t>> enc(lines.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    auto v = tok.encode(lines[i]);
    enc[i].assign(v.begin(), v.end());
    if ((int64_t)enc[i].size() > m.cfg.max_len) enc[i].resize(m.cfg.max_len);
  }
  std::vector<size_t> order(lines.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return enc[a].size() < enc[b].size(); });
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
  r.forced = teacher_forced(m, make_batches(encode_pairs(tok, pairs), batch_tokens, m.cfg.max_len));
  std::vector<std::string> srcs, refs;
  for (auto& p : pairs) {
    srcs.push_back(p.src);
    refs.push_back(p.tgt);
  }
  r.hyps = translate_lines(m, tok, srcs, beam);
  r.bleu = text::corpus_bleu(r.hyps, refs);
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

// ---------------------------------------------------------------------------------------------
// Checkpoints.

void save_model(const models::Transformer& m, const std::string& path, int64_t step) {
  auto sd = m.state_dict();
  nn::save_safetensors(path, sd, {{"format", "graft-transformer"}, {"step", std::to_string(step)},
                                  {"checksum", nn::weights_checksum(sd)}});
}

namespace {

void verify_checksum(const nn::SafetensorsFile& f, const nn::NamedTensors& tensors, const char* who) {
  auto it = f.metadata.find("checksum");
  if (it == f.metadata.end())
    fail(std::string(who) + ": '" + f.path + "': no checksum in the metadata; not a graft checkpoint");
  if (it->second != nn::weights_checksum(tensors))
    fail(std::string(who) + ": '" + f.path + "': checksum mismatch (stored " + it->second +
         ", computed " + nn::weights_checksum(tensors) + "): the checkpoint is corrupted");
}

}  // namespace

void load_model(models::Transformer& m, const std::string& path) {
  nn::SafetensorsFile f = nn::load_safetensors(path);
  verify_checksum(f, f.tensors, "load_model");
  m.load_state_dict(f.tensors);
}

LoadedRun load_run(const std::string& run_dir) {
  LoadedRun r;
  r.config = nn::load_json(run_dir + "/config.json");
  if (!r.config.contains("model"))
    fail("load_run: '" + run_dir + "/config.json' has no \"model\" section");
  r.tok = std::make_unique<text::Tokenizer>(run_dir + "/spm.model");
  auto cfg = models::TransformerConfig::from_json(r.config["model"]);
  r.model = std::make_unique<models::Transformer>(cfg);
  load_model(*r.model, run_dir + "/model.safetensors");
  r.model->eval();
  return r;
}

nlohmann::json TrainOptions::to_json() const {
  return {{"data_dir", data_dir}, {"preset", preset}, {"steps", steps}, {"minutes", minutes},
          {"batch_tokens", batch_tokens}, {"lr_factor", lr_factor}, {"warmup", warmup},
          {"lr", lr}, {"label_smoothing", label_smoothing}, {"dropout", dropout},
          {"pre_ln", pre_ln}, {"positions", positions}, {"attention_dropout", attention_dropout},
          {"vocab", vocab}, {"valid_every", valid_every}, {"seed", seed}};
}

// ---------------------------------------------------------------------------------------------
// Training.

namespace {

struct MetricsRow {
  int64_t step = 0;
  double train_loss = NAN, lr = NAN, tps = NAN, vloss = NAN, vppl = NAN, vacc = NAN, vbleu = NAN;
};

std::string fmt_num(double v) {
  if (!std::isfinite(v)) return "";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

void write_metrics(const std::string& path, const std::vector<MetricsRow>& rows) {
  nn::atomic_write(path, [&](std::ostream& os) {
    os << "step,train_loss,lr,tokens_per_s,valid_loss,valid_ppl,valid_acc,valid_bleu\n";
    for (auto& r : rows)
      os << r.step << ',' << fmt_num(r.train_loss) << ',' << fmt_num(r.lr) << ',' << fmt_num(r.tps)
         << ',' << fmt_num(r.vloss) << ',' << fmt_num(r.vppl) << ',' << fmt_num(r.vacc) << ','
         << fmt_num(r.vbleu) << '\n';
  });
}

// Rows up to `last_step` of an earlier run, so a resumed run's CSV has no rows from steps that
// are about to be redone.
std::vector<MetricsRow> read_metrics(const std::string& path, int64_t last_step) {
  std::vector<MetricsRow> rows;
  std::ifstream in(path);
  std::string line;
  if (!std::getline(in, line)) return rows;
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    std::stringstream ss(line);
    std::string cell;
    while (std::getline(ss, cell, ',')) f.push_back(cell);
    while (f.size() < 8) f.push_back("");
    auto num = [](const std::string& s) { return s.empty() ? NAN : std::stod(s); };
    MetricsRow r;
    try {
      r.step = std::stoll(f[0]);
      r.train_loss = num(f[1]), r.lr = num(f[2]), r.tps = num(f[3]), r.vloss = num(f[4]);
      r.vppl = num(f[5]), r.vacc = num(f[6]), r.vbleu = num(f[7]);
    } catch (const std::exception&) {
      continue;
    }
    if (r.step <= last_step) rows.push_back(r);
  }
  return rows;
}

void plot_curves(const std::string& path, const std::vector<MetricsRow>& rows) {
  plot::Series tl{"train loss (label-smoothed)", {}, {}}, vl{"valid NLL", {}, {}}, bl{"valid BLEU", {}, {}};
  for (auto& r : rows) {
    if (std::isfinite(r.train_loss)) tl.x.push_back((double)r.step), tl.y.push_back(r.train_loss);
    if (std::isfinite(r.vloss)) vl.x.push_back((double)r.step), vl.y.push_back(r.vloss);
    if (std::isfinite(r.vbleu)) bl.x.push_back((double)r.step), bl.y.push_back(r.vbleu);
  }
  plot::Panel loss{"loss", "step", "cross-entropy (nats/token)", {tl, vl}, true};
  plot::Panel bleu{"validation BLEU (greedy)", "step", "BLEU", {bl}, false};
  plot::line_chart(path, {loss, bleu});
}

std::string fmt_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  char buf[32];
  const long t = (long)(s + 0.5);
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%ld:%02ld", t / 60, t % 60);
  return buf;
}

// Everything besides tensors that an exact resume needs.
struct LoopState {
  int64_t step = 0, epoch = 0, pos = 0;
  std::vector<int64_t> order;  // this epoch's batch order
  Generator batch_gen;
  double elapsed = 0;          // training seconds before this call
  double acc_loss = 0;         // loss sum / count since the last metrics row
  int64_t acc_n = 0;
};

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
  c.seed = o.seed;
  if (c.d_model % c.heads)
    fail("train: d_model " + std::to_string(c.d_model) + " is not divisible by heads " + std::to_string(c.heads));
  return c;
}

std::string batches_fingerprint(const std::vector<Batch>& batches) {
  nn::NamedTensors t;
  for (auto& b : batches) t.emplace_back("", b.tgt_out), t.emplace_back("", b.src);
  return nn::weights_checksum(t);
}

void save_train_state(const std::string& path, const models::Transformer& m, const nn::Adam& opt,
                      const LoopState& s, const std::string& data_fp) {
  nn::NamedTensors tensors;
  for (auto& [n, t] : m.state_dict()) tensors.emplace_back("model." + n, t);
  for (auto& [n, t] : opt.state_tensors()) tensors.emplace_back("optim." + n, t);
  nlohmann::json j = {{"version", kStateVersion},
                      {"step", s.step},
                      {"epoch", s.epoch},
                      {"pos", s.pos},
                      {"order", s.order},
                      {"batch_gen", s.batch_gen.state()},
                      {"dropout_gen", m.dropout_gen.state()},
                      {"default_gen", default_generator().state()},
                      {"elapsed_bits", double_bits(s.elapsed)},
                      {"acc_loss_bits", double_bits(s.acc_loss)},
                      {"acc_n", s.acc_n},
                      {"data_fingerprint", data_fp}};
  nn::save_safetensors(path, tensors, {{"trainer", j.dump()}, {"optimizer", opt.state_json().dump()},
                                       {"checksum", nn::weights_checksum(tensors)}});
}

void load_train_state(const std::string& path, models::Transformer& m, nn::Adam& opt,
                      LoopState& s, const std::string& data_fp, int64_t n_batches) {
  if (!fs::exists(path))
    fail("resume: no training state at '" + path + "' (nothing to resume; drop --resume to start fresh)");
  nn::SafetensorsFile f;
  try {
    f = nn::load_safetensors(path);
  } catch (const std::exception& e) {
    fail(std::string("resume: the checkpoint is truncated or corrupted: ") + e.what());
  }
  verify_checksum(f, f.tensors, "resume");
  nlohmann::json j, oj;
  try {
    j = nlohmann::json::parse(f.metadata.at("trainer"));
    oj = nlohmann::json::parse(f.metadata.at("optimizer"));
  } catch (const std::exception& e) {
    fail("resume: '" + path + "': bad trainer/optimizer metadata: " + e.what());
  }
  if (j.value("version", std::string()) != kStateVersion)
    fail("resume: '" + path + "': unknown state version '" + j.value("version", std::string()) + "'");
  if (j.at("data_fingerprint").get<std::string>() != data_fp)
    fail("resume: '" + path + "': the training data or batching differs from the interrupted run "
         "(data, --batch-tokens and spm.model must be unchanged)");
  nn::NamedTensors model_t, optim_t;
  for (auto& [n, t] : f.tensors) {
    if (n.rfind("model.", 0) == 0) model_t.emplace_back(n.substr(6), t);
    else if (n.rfind("optim.", 0) == 0) optim_t.emplace_back(n.substr(6), t);
    else fail("resume: '" + path + "': unexpected tensor '" + n + "'");
  }
  LoopState ns;
  ns.step = j.at("step").get<int64_t>();
  ns.epoch = j.at("epoch").get<int64_t>();
  ns.pos = j.at("pos").get<int64_t>();
  ns.order = j.at("order").get<std::vector<int64_t>>();
  ns.batch_gen.set_state(j.at("batch_gen").get<uint64_t>());
  ns.elapsed = bits_double(j.at("elapsed_bits").get<uint64_t>());
  ns.acc_loss = bits_double(j.at("acc_loss_bits").get<uint64_t>());
  ns.acc_n = j.at("acc_n").get<int64_t>();
  if ((int64_t)ns.order.size() != n_batches || ns.pos < 0 || ns.pos > n_batches)
    fail("resume: '" + path + "': batch order does not match the " + std::to_string(n_batches) + " batches");
  m.load_state_dict(model_t);
  opt.load_state(optim_t, oj);
  if (opt.step_count() != ns.step)
    fail("resume: '" + path + "': optimizer is at step " + std::to_string(opt.step_count()) +
         " but the trainer at step " + std::to_string(ns.step));
  m.dropout_gen.set_state(j.at("dropout_gen").get<uint64_t>());
  default_generator().set_state(j.at("default_gen").get<uint64_t>());
  s = std::move(ns);
}

}  // namespace

TrainResult train(const TrainOptions& opts) {
  TrainOptions o = opts;
  nlohmann::json saved;
  if (o.resume) {
    if (!fs::exists(o.run_dir + "/config.json"))
      fail("resume: '" + o.run_dir + "/config.json' is missing (nothing to resume; drop --resume to start fresh)");
    saved = nn::load_json(o.run_dir + "/config.json");
    // An exact continuation needs the interrupted run's schedule, batches and loss, whatever
    // the command line says now; only the stopping rule and the reporting may change.
    try {
      const auto& t = saved.at("train");
      o.batch_tokens = t.at("batch_tokens").get<int64_t>();
      o.lr_factor = t.at("lr_factor").get<double>();
      o.warmup = t.at("warmup").get<int64_t>();
      o.lr = t.at("lr").get<double>();
      o.label_smoothing = t.at("label_smoothing").get<double>();
      o.seed = t.at("seed").get<uint64_t>();
    } catch (const nlohmann::json::exception& e) {
      fail("resume: '" + o.run_dir + "/config.json': bad \"train\" section: " + e.what());
    }
  }
  if (o.steps <= 0 && o.minutes <= 0) fail("train: give --steps or --minutes");
  if (o.valid_every < 1 || o.log_every < 1) fail("train: --valid-every and log interval must be >= 1");
  const std::string run = o.run_dir;
  fs::create_directories(run);
  const bool tty = !o.quiet && isatty(2);
  auto say = [&](const std::string& s) {
    if (!o.quiet) std::cerr << s << std::endl;
  };

  text::CorpusStats st_train, st_valid;
  auto train_pairs = load_corpus(o.data_dir + "/train.tsv", st_train);
  auto valid_pairs = load_corpus(o.data_dir + "/valid.tsv", st_valid);
  say("train.tsv: " + st_train.summary());
  say("valid.tsv: " + st_valid.summary());
  if (train_pairs.empty()) fail("train: no usable sentence pairs in '" + o.data_dir + "/train.tsv'");

  const std::string spm = run + "/spm.model";
  if (!(o.resume && fs::exists(spm))) {
    if (o.resume) fail("resume: '" + spm + "' is missing");
    std::vector<std::string> sents;
    sents.reserve(2 * train_pairs.size());
    for (auto& p : train_pairs) sents.push_back(p.src), sents.push_back(p.tgt);
    auto t0 = Clock::now();
    text::Tokenizer::train(sents, run + "/spm", o.vocab);
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.1f", seconds_since(t0));
    // The trainer may settle on fewer pieces than requested on a small language.
    say("trained SentencePiece (" + std::to_string(text::Tokenizer(spm).vocab_size()) + " of " +
        std::to_string(o.vocab) + " requested pieces) in " + buf + " s");
  }
  text::Tokenizer tok(spm);

  models::TransformerConfig cfg;
  if (o.resume) {
    cfg = models::TransformerConfig::from_json(saved.at("model"));
  } else {
    cfg = make_config(o, tok.vocab_size());
    nn::save_json(run + "/config.json", {{"model", cfg.to_json()}, {"train", o.to_json()}});
  }
  models::Transformer model(cfg);
  model.train();

  size_t dropped = 0;
  auto batches = make_batches(encode_pairs(tok, train_pairs), o.batch_tokens, cfg.max_len, &dropped);
  auto valid_batches = make_batches(encode_pairs(tok, valid_pairs), o.batch_tokens, cfg.max_len);
  if (dropped) say("dropped " + std::to_string(dropped) + " training pairs longer than the model's max_len");
  std::vector<std::string> bleu_src, bleu_ref;
  for (size_t i = 0; i < valid_pairs.size() && (int64_t)i < o.bleu_sentences; ++i)
    bleu_src.push_back(valid_pairs[i].src), bleu_ref.push_back(valid_pairs[i].tgt);
  const std::string data_fp = batches_fingerprint(batches);
  const int64_t nb = (int64_t)batches.size();
  {
    std::ostringstream os;
    os << "model: " << model.num_parameters() << " parameters (d " << cfg.d_model << ", " << cfg.heads
       << " heads, ff " << cfg.d_ff << ", " << cfg.enc_layers << "+" << cfg.dec_layers << " layers, vocab "
       << cfg.vocab << "); " << nb << " batches of <= " << o.batch_tokens << " target tokens";
    say(os.str());
  }

  auto params = model.named_parameters();
  nn::Adam opt(params, o.lr > 0 ? o.lr : 1e-3, 0.9, 0.98, 1e-9);
  const nn::NoamSchedule noam{o.lr_factor, cfg.d_model, o.warmup};

  LoopState s;
  s.batch_gen = Generator(o.seed * 0x2545F4914F6CDD1Dull + 17);
  std::vector<MetricsRow> rows;
  const std::string state_path = run + "/train_state.safetensors";
  if (o.resume) {
    load_train_state(state_path, model, opt, s, data_fp, nb);
    rows = read_metrics(run + "/metrics.csv", s.step);
    say("resumed at step " + std::to_string(s.step) + " (epoch " + std::to_string(s.epoch) + ", batch " +
        std::to_string(s.pos) + "/" + std::to_string(nb) + ")");
  } else {
    manual_seed(o.seed);
    s.order = shuffled_order(nb, s.batch_gen);
  }

  TrainResult res;
  res.first_step = s.step;
  const auto t_start = Clock::now();
  auto elapsed = [&] { return s.elapsed + seconds_since(t_start); };
  auto done = [&] {
    return (o.steps > 0 && s.step >= o.steps) || (o.minutes > 0 && elapsed() >= o.minutes * 60.0);
  };

  int64_t tok_total = 0, tok_interval = 0;
  auto t_interval = Clock::now(), t_draw = Clock::now();
  double lr = 0, last_tps = 0;
  int64_t last_valid_step = -1;
  double valid_seconds = 0;

  auto validate_and_save = [&]() {
    const auto t0 = Clock::now();
    ForcedMetrics fm = teacher_forced(model, valid_batches);
    ValidMetrics vm{fm.loss, fm.ppl, fm.acc, 0};
    if (!bleu_src.empty()) vm.bleu = text::corpus_bleu(translate_lines(model, tok, bleu_src), bleu_ref).score;
    res.last_valid = vm;
    MetricsRow r;
    r.step = s.step;
    if (!rows.empty() && rows.back().step == s.step) {
      r = rows.back();
      rows.pop_back();
    }
    r.vloss = vm.loss, r.vppl = vm.ppl, r.vacc = vm.acc, r.vbleu = vm.bleu;
    rows.push_back(r);
    save_model(model, run + "/model.safetensors", s.step);
    LoopState snap = s;
    snap.elapsed = elapsed();
    save_train_state(state_path, model, opt, snap, data_fp);
    write_metrics(run + "/metrics.csv", rows);
    if (o.plot) plot_curves(run + "/curves.png", rows);
    last_valid_step = s.step;
    char buf[200];
    std::snprintf(buf, sizeof buf, "step %lld  valid loss %.4f  ppl %.3f  acc %.2f%%  BLEU %.2f  (%.1f s)",
                  (long long)s.step, vm.loss, vm.ppl, 100 * vm.acc, vm.bleu, seconds_since(t0));
    if (tty) std::cerr << "\r\033[K";
    say(buf);
    // Validation time is not training throughput.
    t_interval = Clock::now();
    tok_interval = 0;
    valid_seconds += seconds_since(t0);
  };

  while (!done()) {
    if (s.pos == nb) {
      ++s.epoch;
      s.pos = 0;
      s.order = shuffled_order(nb, s.batch_gen);
    }
    const Batch& b = batches[(size_t)s.order[(size_t)s.pos++]];
    lr = o.lr > 0 ? o.lr : noam.lr(s.step + 1);
    opt.set_lr(lr);
    Tensor loss = model.loss(b.src, b.tgt_in, b.tgt_out, o.label_smoothing);
    loss.backward();
    const double norm = nn::clip_grad_norm(params, 1.0);
    // A non-finite gradient would poison the Adam moments for good; skipping the update keeps
    // the run alive and deterministic.
    if (std::isfinite(norm)) opt.step();
    opt.zero_grad();
    ++s.step;
    const double lv = loss.item();
    res.losses.push_back(lv);
    s.acc_loss += lv;
    ++s.acc_n;
    tok_total += b.tgt_tokens;
    tok_interval += b.tgt_tokens;

    const bool log_row = s.step % o.log_every == 0;
    if (log_row) {
      last_tps = (double)tok_interval / std::max(1e-9, seconds_since(t_interval));
      rows.push_back({s.step, s.acc_loss / (double)s.acc_n, lr, last_tps, NAN, NAN, NAN, NAN});
      s.acc_loss = 0;
      s.acc_n = 0;
      t_interval = Clock::now();
      tok_interval = 0;
    }
    if (!o.quiet && (tty ? seconds_since(t_draw) > 0.2 : log_row)) {
      t_draw = Clock::now();
      const double tps = last_tps > 0 ? last_tps
                                      : (double)tok_interval / std::max(1e-9, seconds_since(t_interval));
      double eta = NAN;
      const double per_step = seconds_since(t_start) / (double)(s.step - res.first_step);
      if (o.steps > 0) eta = per_step * (double)(o.steps - s.step);
      if (o.minutes > 0) eta = std::isfinite(eta) ? std::min(eta, o.minutes * 60 - elapsed()) : o.minutes * 60 - elapsed();
      char buf[200];
      std::snprintf(buf, sizeof buf, "step %6lld  ep %lld  loss %.4f  lr %.2e  %6.0f tok/s  ETA %s",
                    (long long)s.step, (long long)s.epoch, lv, lr, tps, fmt_duration(eta).c_str());
      if (tty) std::cerr << "\r\033[K" << buf << std::flush;
      else std::cerr << buf << std::endl;
    }
    if (s.step % o.valid_every == 0) validate_and_save();
  }
  if (last_valid_step != s.step) validate_and_save();
  if (!o.quiet) {
    if (tty) std::cerr << "\n";
  }
  res.last_step = s.step;
  res.train_seconds = seconds_since(t_start);
  res.tokens_per_s = (double)tok_total / std::max(1e-9, res.train_seconds - valid_seconds);
  return res;
}

}  // namespace graft::translation
