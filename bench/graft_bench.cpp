// graft side of `make bench` (bench/run.sh runs it next to bench/torch_peer.py).
//
//   graft_bench --what train  --config tiny|small|base [--warmup 2] [--steps 5]
//   graft_bench --what hvp    --config ...  (a Hessian-vector product against a training step's
//                                 forward and backward, in one process; GRAFT_PROFILE_HVP=1 adds
//                                 the per-op time of each backward on stderr)
//   graft_bench --what greedy --config ...  [--beam 4] [--batch 32]  (decode: --what greedy / beam;
//                                 --batch 1 is one sentence: ms per sentence of 32 new tokens)
//   graft_bench --what save_model --config ... --out DIR        (the decoding model as a translate
//                                 run directory: config.json + model.safetensors, no spm.model;
//                                 examples/translation/ct2_convert.py reads it for
//                                 bench/ct2_peer.py)
//   graft_bench --what export|load --model DIR --precision int8|bf16  (a save_model run's export;
//                                 file to first token: phases' ms and peak RSS;
//                                 bench/load_bench.sh)
//   graft_bench --what lm_train|lm_sample|cls_train|cls_infer [--warmup 2] [--steps 5]
//                                 (the zoo: the models `make lm` and `make classify` train)
//   graft_bench --what embed --model DIR --sentences FILE [--batch 32]  (sentence embeddings of
//               a pretrained encoder: sentences/s in batches of --batch, 1 = one at a time)
//   graft_bench --what micro                                    (op microbenchmarks)
//   graft_bench --what eltwise                                  (SiLU: oneDNN vs a user's row)
//   graft_bench --what sgemm  [--n 2048]                        (matmul peak)
//   graft_bench --what kernels                                  (the oneDNN matmul kernels here)
//   graft_bench --what stream                                   (memory bandwidth, a triad)
//   --precision bf16 (train, greedy, beam, sgemm): bf16 matmul operands (ops/precision.h)
//   --precision int8 (greedy, beam, embed, load, export): the linear layers on int8 (weights s8 per
//   output channel)
//   --ids FILE (greedy, beam): the last timed run's new ids, one line per sentence
//
// Each run prints one line "RESULT {json}" with the medians and the process's peak resident
// memory (VmHWM) read at the end. One configuration per process, so peak memory is per config.
// The workloads (shapes, data, hyper-parameters) mirror torch_peer.py exactly.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "graft/autograd/tape.h"
#include "graft/models/config_json.h"
#include "graft/models/decoder_only_lm.h"
#include "graft/models/encoder_classifier.h"
#include "graft/models/exported.h"
#include "graft/models/run.h"
#include "graft/models/sentence_encoder.h"
#include "graft/models/transformer.h"
#include "graft/nn/train/checkpoint.h"
#include "graft/nn/train/optim.h"
#include "graft/ops/ops.h"

using namespace graft;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  std::string what = "train", config = "tiny", out, ids, model, sentences;
  int warmup = 2, steps = 5, beam = 1;
  int64_t batch = 32;  // decoding rows
  int64_t n = 2048;
  Precision precision = Precision::fp32;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "graft_bench: " << k << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--what") a.what = val();
    else if (k == "--config") a.config = val();
    else if (k == "--warmup") a.warmup = std::stoi(val());
    else if (k == "--steps") a.steps = std::stoi(val());
    else if (k == "--beam") a.beam = std::stoi(val());
    else if (k == "--n") a.n = std::stoll(val());
    else if (k == "--batch") a.batch = std::stoll(val());
    else if (k == "--out") a.out = val();
    else if (k == "--ids") a.ids = val();
    else if (k == "--model") a.model = val();
    else if (k == "--sentences") a.sentences = val();
    else if (k == "--precision") a.precision = parse_precision(val(), "--precision");
    else {
      std::cerr << "graft_bench: unknown argument " << k << "\n";
      std::exit(2);
    }
  }
  return a;
}

// The three benchmark configurations of the issue (same numbers in torch_peer.py).
struct BenchConfig {
  std::string name;
  int64_t d, heads, ff, layers, vocab, batch, src_len, tgt_len;
};
BenchConfig bench_config(const std::string& name) {
  static const BenchConfig cs[] = {{"tiny", 128, 4, 512, 2, 1000, 64, 24, 24},
                                   {"small", 256, 4, 1024, 3, 8000, 64, 32, 32},
                                   {"base", 512, 8, 2048, 6, 8000, 32, 32, 32}};
  for (auto& c : cs)
    if (c.name == name) return c;
  std::cerr << "graft_bench: unknown config " << name << " (tiny, small, base)\n";
  std::exit(2);
}

constexpr int64_t PAD = 0, BOS = 2;

// Deterministic batch shared with torch_peer.py: row b holds len - (b % 4) tokens followed by
// padding; token (b, t) = 4 + (b * 131 + t * 31 + salt * 17) % (V - 4).
std::vector<int64_t> make_ids(int64_t B, int64_t L, int64_t V, int64_t salt) {
  std::vector<int64_t> ids(B * L, PAD);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = L - (b % 4);
    for (int64_t t = 0; t < len; ++t) ids[b * L + t] = 4 + (b * 131 + t * 31 + salt * 17) % (V - 4);
  }
  return ids;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Runs f warmup times, then times `steps` calls; returns the median seconds.
double time_median(int warmup, int steps, const std::function<void()>& f) {
  for (int i = 0; i < warmup; ++i) f();
  std::vector<double> ts;
  for (int i = 0; i < steps; ++i) {
    auto t0 = Clock::now();
    f();
    ts.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return median(ts);
}

double peak_rss_mib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;  // kB
  return -1;
}

// Starts a new VmHWM measurement at the current RSS (Linux: "5" to /proc/self/clear_refs), so
// that decoding's peak is told apart from loading's; false where the kernel refuses.
bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  return static_cast<bool>(f << "5" << std::flush);
}

models::TransformerConfig model_config(const BenchConfig& b) {
  models::TransformerConfig c = models::preset(b.name, b.vocab);
  c.d_model = b.d;
  c.heads = b.heads;
  c.d_ff = b.ff;
  c.enc_layers = c.dec_layers = b.layers;
  c.dropout = 0.1;
  c.norm_first = false;  // post-LN
  c.final_norm = true;   // LayerNorm after each stack, as nn.Transformer
  c.positions.kind = nn::Positions::sinusoidal;
  c.pad_id = PAD;
  c.bos_id = BOS;
  c.eos_id = 3;
  return c;
}

void emit(const std::string& body) {
  std::cout << "RESULT {" << body << ",\"precision\":\"" << precision_name(matmul_precision())
            << "\"}" << std::endl;
}

// A string as a JSON string literal, quoted and escaped (a path may hold quotes, backslashes
// or control characters; bytes that are not UTF-8 become U+FFFD).
std::string json_str(const std::string& v) {
  return nlohmann::json(v).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string num(double v) {
  std::ostringstream os;
  os.precision(6);
  os << v;
  return os.str();
}

// The op families whose time counts as matmul work: the linear layers, and the attention and
// the output projection + loss, whose time is mostly their matmuls.
bool matmul_family(const std::string& family) {
  return family == "matmul" || family == "attention" || family == "loss";
}

// Three more steps with the per-op profile on: milliseconds per step by op family (ops/ file
// stem; "untracked" is the step's wall time outside any op: the optimizer, zeroing grads), as
// JSON fields, with the attention share and the non-matmul share (everything but
// matmul_family()) of the step. With `print`, the per-op lines go to stderr as well.
std::string profile_step(const std::function<void()>& step, bool print) {
  constexpr int n = 3;
  autograd::profile_report();  // resets
  const auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    // Restarted each step, so the optimizer's time after the last backward op is not charged to
    // the next step's first forward op but left "untracked".
    autograd::set_profiling(true);
    step();
  }
  const double wall_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / n;
  autograd::set_profiling(false);
  std::map<std::string, std::string> family_of;
  for (const auto& d : autograd::declared_ops()) family_of[d.name] = d.family;
  std::map<std::string, double> ms;
  double in_ops = 0;
  for (const auto& o : autograd::profile_report()) {
    const double m = (o.forward_s + o.backward_s) * 1e3 / n;
    ms[family_of.count(o.op) ? family_of[o.op] : "other"] += m;
    in_ops += m;
    if (print)
      std::cerr << "  " << o.op << " " << o.calls / n << " calls, forward " << o.forward_s * 1e3 / n
                << " ms, backward " << o.backward_s * 1e3 / n << " ms\n";
  }
  ms["untracked"] = std::max(0.0, wall_ms - in_ops);
  double matmul_ms = 0;
  std::string fields;
  for (const auto& [fam, m] : ms) {
    fields += (fields.empty() ? "\"" : ",\"") + fam + "\":" + num(m);
    if (matmul_family(fam)) matmul_ms += m;
  }
  return "\"profile_ms\":{" + fields + "},\"profile_step_ms\":" + num(wall_ms) +
         ",\"attention_share\":" + num(ms["attention"] / wall_ms) +
         ",\"nonmatmul_share\":" + num(1 - matmul_ms / wall_ms);
}

// The train benchmark's batch: random source ids, and a target sequence of tgt_len + 1 tokens
// (BOS first) split into input [:-1] and output [1:].
struct TrainBatch {
  Tensor src, tgt_in, tgt_out;
  int64_t target_tokens = 0;
};
TrainBatch train_batch(const BenchConfig& b) {
  TrainBatch d;
  d.src = from_vector(make_ids(b.batch, b.src_len, b.vocab, 1), {b.batch, b.src_len});
  auto tgt = make_ids(b.batch, b.tgt_len + 1, b.vocab, 2);
  std::vector<int64_t> tin, tout;
  for (int64_t r = 0; r < b.batch; ++r) {
    tgt[r * (b.tgt_len + 1)] = BOS;
    for (int64_t t = 0; t < b.tgt_len; ++t) {
      tin.push_back(tgt[r * (b.tgt_len + 1) + t]);
      tout.push_back(tgt[r * (b.tgt_len + 1) + t + 1]);
      d.target_tokens += tout.back() != PAD;
    }
  }
  d.tgt_in = from_vector(tin, {b.batch, b.tgt_len});
  d.tgt_out = from_vector(tout, {b.batch, b.tgt_len});
  return d;
}

void run_train(const Args& a) {
  const BenchConfig b = bench_config(a.config);
  models::Transformer model(model_config(b));
  model.train();
  auto params = model.named_parameters();
  train::Adam opt(params, 1e-4, 0.9, 0.98, 1e-9);
  const TrainBatch d = train_batch(b);
  const Tensor &src = d.src, &tgt_in = d.tgt_in, &tgt_out = d.tgt_out;
  const int64_t target_tokens = d.target_tokens;
  double loss_v = 0, before_bwd_mib = 0;
  auto step = [&] {
    // linear_cross_entropy inside: the (B*T, V) logits are never held.
    Tensor loss = model.loss(src, tgt_in, tgt_out, 0.1);
    before_bwd_mib = Storage::live_bytes() / 1048576.0;
    if (std::getenv("GRAFT_TAPE_REPORT")) {
      size_t total = 0;
      for (auto& r : autograd::saved_bytes_by_op()) {
        std::cerr << "  saved by " << r.op << " (" << r.entries
                  << " entries): " << r.bytes / 1048576.0 << " MiB\n";
        total += r.bytes;
      }
      std::cerr << "  tape total " << total / 1048576.0 << " MiB, live " << before_bwd_mib
                << " MiB\n";
    }
    loss.backward();
    opt.step();
    opt.zero_grad();
    loss_v = loss.item();
  };
  const double t = time_median(a.warmup, a.steps, step);
  const std::string shares = profile_step(step, std::getenv("GRAFT_PROFILE") != nullptr);
  const double weights_mib = Storage::live_bytes() / 1048576.0;
  emit("\"what\":\"train\",\"config\":\"" + b.name + "\",\"ms\":" + num(t * 1e3) + ",\"tok_s\":" +
       num(target_tokens / t) + ",\"target_tokens\":" + std::to_string(target_tokens) +
       ",\"params\":" + std::to_string(model.num_parameters()) + ",\"loss\":" + num(loss_v) +
       ",\"peak_rss_mib\":" + num(peak_rss_mib()) + ",\"live_mib\":" + num(weights_mib) +
       ",\"peak_live_mib\":" + num(Storage::peak_live_bytes() / 1048576.0) +
       ",\"before_backward_mib\":" + num(before_bwd_mib) +
       ",\"cached_mib\":" + num(Storage::cached_bytes() / 1048576.0) + "," + shares);
}

// The per-op backward times (on stderr) of one run of `f`.
void print_backward_profile(const char* title, const std::function<void()>& f) {
  autograd::profile_report();  // resets
  autograd::set_profiling(true);
  f();
  autograd::set_profiling(false);
  std::cerr << title << ":\n";
  for (const auto& o : autograd::profile_report())
    std::cerr << "  " << o.op << " backward " << o.backward_s * 1e3 << " ms\n";
}

// GRAFT_PROFILE_HVP=1: where a plain backward, the first backward under create_graph and the
// second backward of an HVP go, per op (under create_graph an op's time includes what its
// backward records).
void profile_hvp(const std::function<Tensor()>& loss, const Tensors& params, const Tensors& v) {
  Tensor l = loss();
  print_backward_profile("plain", [&] { autograd::grad({l}, params); });
  l = loss();
  Tensors g;
  print_backward_profile("create_graph",
                         [&] { g = autograd::grad({l}, params, {}, {.create_graph = true}); });
  print_backward_profile("second", [&] { autograd::grad(g, params, v); });
}

// --what hvp: a Hessian-vector product of the training loss (the gradient g with create_graph,
// then the backward of g with upstream gradients v, v random: H v, the gradient of g . v, without
// recording the dot product) against the forward and backward of a training step, in
// one process, each with its peak of live tensor memory and the HVP's three phases;
// hvp_over_step_paired is the median of each HVP's time over the step timed just before it.
void run_hvp(const Args& a) {
  const BenchConfig b = bench_config(a.config);
  models::Transformer model(model_config(b));
  model.train();
  const TrainBatch d = train_batch(b);
  const Tensors params = model.parameters();
  Generator gen(5);
  Tensors v;
  for (const Tensor& p : params) v.push_back(randn(p.shape(), p.dtype(), gen));
  auto loss = [&] { return model.loss(d.src, d.tgt_in, d.tgt_out, 0.1); };
  double step_peak = 0, hvp_peak = 0;
  auto peak_mib = [] { return Storage::peak_live_bytes() / 1048576.0; };
  auto step = [&] {
    Storage::reset_peak_live_bytes();
    loss().backward();
    model.zero_grad();
    step_peak = peak_mib();
  };
  double phase_ms[3] = {0, 0, 0};  // the last HVP's forward, first backward (recorded), second
  auto hvp = [&] {
    Storage::reset_peak_live_bytes();
    const auto t0 = Clock::now();
    const Tensor l = loss();
    const auto t1 = Clock::now();
    const Tensors g = autograd::grad({l}, params, {}, {.create_graph = true});
    const auto t2 = Clock::now();
    autograd::grad(g, params, v);
    const auto t3 = Clock::now();
    hvp_peak = peak_mib();
    const std::chrono::duration<double, std::milli> d0 = t1 - t0, d1 = t2 - t1, d2 = t3 - t2;
    phase_ms[0] = d0.count(), phase_ms[1] = d1.count(), phase_ms[2] = d2.count();
  };
  // Steps and HVPs alternate, so a drift in the machine's speed moves both medians alike.
  std::vector<double> t_steps, t_hvps, ratios;
  for (int i = 0; i < a.warmup + a.steps; ++i) {
    const double ts = time_median(0, 1, step), th = time_median(0, 1, hvp);
    if (i < a.warmup) continue;
    t_steps.push_back(ts), t_hvps.push_back(th), ratios.push_back(th / ts);
  }
  const double t_step = median(t_steps), t_hvp = median(t_hvps);
  if (std::getenv("GRAFT_PROFILE_HVP")) profile_hvp(loss, params, v);
  emit("\"what\":\"hvp\",\"config\":\"" + b.name + "\",\"step_ms\":" + num(t_step * 1e3) +
       ",\"hvp_ms\":" + num(t_hvp * 1e3) + ",\"hvp_over_step\":" + num(t_hvp / t_step) +
       ",\"hvp_over_step_paired\":" + num(median(ratios)) +
       ",\"step_peak_live_mib\":" + num(step_peak) + ",\"hvp_peak_live_mib\":" + num(hvp_peak) +
       ",\"hvp_forward_ms\":" + num(phase_ms[0]) + ",\"hvp_first_backward_ms\":" +
       num(phase_ms[1]) + ",\"hvp_second_backward_ms\":" + num(phase_ms[2]) +
       ",\"params\":" + std::to_string(model.num_parameters()));
}

// The bytes of weights one decoding step reads: every decoder parameter and the tied output
// projection (V x d), at 2 bytes under bf16 (its matmuls read bf16 copies), else 4; of the
// cross-attention's packed projection only the query third (its keys and values are computed
// once per source).
double decoder_weight_bytes(const models::Transformer& model) {
  int64_t n = model.embedding->weight.numel();
  for (const auto& [name, p] : model.named_parameters())
    if (name.rfind("decoder.", 0) == 0)
      n += name.find("multihead_attn.in_proj") != std::string::npos ? p.numel() / 3 : p.numel();
  const Precision p = matmul_precision();
  return double(n) * (p == Precision::int8 ? 1 : p == Precision::bf16 ? 2 : 4);
}

// One line per sentence, its new ids separated by spaces (bench/ct2_peer.py compares them).
void write_ids(const std::string& path, const std::vector<std::vector<int64_t>>& ids) {
  std::ofstream f(path);
  for (const auto& row : ids) {
    for (size_t i = 0; i < row.size(); ++i) f << (i ? " " : "") << row[i];
    f << "\n";
  }
  if (!f) fail("graft_bench: --ids '" + path + "' cannot be written");
}

// The decoding rows' sources: the first `batch` of 32 rows x 32 tokens (make_ids, salt 3; row b
// depends on b alone, so batch 1 is the batch-32 run's first sentence). ct2_peer.py builds the
// same.
constexpr int64_t kDecodeRows = 32, kDecodeSrcLen = 32, kDecodeNew = 32;

void run_decode(const Args& a) {
  const BenchConfig b = bench_config(a.config);
  models::Transformer model(model_config(b));
  model.eval();
  models::keep_for_inference(model, matmul_precision());  // as translate: int8 frees float32
  const double load_peak = peak_rss_mib();  // building the model (float32 until int8 frees it)
  const bool reset = reset_peak_rss();
  if (a.batch < 1 || a.batch > kDecodeRows)
    fail("graft_bench: --batch " + std::to_string(a.batch) + " is outside [1, " +
         std::to_string(kDecodeRows) + "]");
  const int64_t B = a.batch, S = kDecodeSrcLen, NEW = kDecodeNew;
  Tensor src = from_vector(make_ids(B, S, b.vocab, 3), {B, S});
  models::DecodeOptions o;
  o.max_len = NEW;
  o.beam = a.beam;
  o.use_cache = true;
  o.stop_at_eos = false;
  int64_t produced = 0;
  std::vector<std::vector<int64_t>> ids;
  auto f = [&] {
    ids = models::translate(model, src, o);
    produced = 0;
    for (auto& r : ids) produced += (int64_t)r.size();
  };
  // Warm-up runs decode 4 new tokens (every code path and buffer size class gets touched once);
  // the timed runs decode all 32.
  models::DecodeOptions w = o;
  w.max_len = 4;
  for (int i = 0; i < a.warmup; ++i) models::translate(model, src, w);
  const double t = time_median(0, a.steps, f);
  // The decoding steps' share: the time minus the encoder's (timed on its own, same source).
  const double t_enc = time_median(0, a.steps, [&] {
    autograd::NoGrad ng;
    model.encode(src);
  });
  const double gbs = decoder_weight_bytes(model) * NEW / (t - t_enc) / 1e9;
  if (!a.ids.empty()) write_ids(a.ids, ids);
  emit(std::string("\"what\":\"") + (a.beam > 1 ? "beam" : "greedy") + "\",\"config\":\"" + b.name +
       "\",\"beam\":" + std::to_string(a.beam) + ",\"batch\":" + std::to_string(B) +
       ",\"ms\":" + num(t * 1e3) + ",\"ms_per_sentence\":" + num(t * 1e3 / B) +
       ",\"tok_s\":" + num(B * NEW / t) + ",\"produced\":" + std::to_string(produced) +
       ",\"peak_rss_mib\":" + num(std::max(load_peak, peak_rss_mib())) + ",\"load_peak_rss_mib\":" +
       num(load_peak) + ",\"decode_peak_rss_mib\":" + num(reset ? peak_rss_mib() : -1) +
       ",\"encode_ms\":" + num(t_enc * 1e3) + ",\"weight_gbs\":" + num(gbs));
}

// The decoding model (run_decode's config and seeded weights) as a translate run directory:
// DIR/config.json ({"model": ...}) and DIR/model.safetensors tied to it, as examples/translation
// saves a run (no spm.model: the bench has no tokenizer).
void run_save_model(const Args& a) {
  if (a.out.empty()) fail("graft_bench: --what save_model needs --out DIR");
  const BenchConfig b = bench_config(a.config);
  models::Transformer model(model_config(b));
  std::filesystem::create_directories(a.out);
  const std::string cfg_path = a.out + "/config.json";
  train::save_json(cfg_path, {{"model", model.cfg.to_json()}});
  train::save_weights(model.state_dict(), a.out + "/model.safetensors", 0, "graft-transformer",
                      {cfg_path});
  emit("\"what\":\"save_model\",\"config\":\"" + b.name + "\",\"out\":" + json_str(a.out) +
       ",\"params\":" + std::to_string(model.num_parameters()));
}

// --what export: writes the run directory's (--model, as save_model writes it) export for
// --precision int8|bf16. --what load: loads the run as translate does at --precision (the export
// when there is one: no float32 copy of a quantized weight; else model.safetensors, converted by
// keep_for_inference) and decodes the first token of one sentence: the time of each phase, and the
// process's peak RSS from file to first token.
void run_load(const Args& a) {
  if (a.model.empty()) fail("graft_bench: --what " + a.what + " needs --model DIR");
  if (a.what == "export") {
    auto lr = models::load_run_model<models::Transformer>(a.model, {}, a.precision,
                                                          models::RunSource::weights);
    const std::string out = a.model + "/" + models::export_file_name(a.precision);
    models::save_export(*lr.model, a.precision, out, lr.weights, lr.metadata,
                        {a.model + "/config.json"});
    emit("\"what\":\"export\",\"out\":" + json_str(out));
    return;
  }
  const auto t0 = Clock::now();
  auto lr = models::load_run_model<models::Transformer>(a.model, {}, a.precision);
  models::keep_for_inference(*lr.model, a.precision);
  const auto t1 = Clock::now();
  const int64_t S = kDecodeSrcLen;
  const Tensor src = from_vector(make_ids(1, S, lr.model->cfg.vocab, 3), {1, S});
  models::DecodeOptions o;
  o.max_len = 1;
  o.stop_at_eos = false;
  models::translate(*lr.model, src, o);
  const auto t2 = Clock::now();
  const auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
  emit("\"what\":\"load\",\"precision\":\"" + std::string(precision_name(a.precision)) +
       "\",\"file\":" + json_str(lr.weights) + ",\"load_ms\":" + num(ms(t1 - t0)) +
       ",\"first_token_ms\":" + num(ms(t2 - t1)) + ",\"total_ms\":" + num(ms(t2 - t0)) +
       ",\"live_mib\":" + num(Storage::live_bytes() / 1048576.0) +
       ",\"peak_rss_mib\":" + num(peak_rss_mib()));
}

// The weight-read rate of decoding-shaped inference linears alone: 32 rows through 24 distinct
// 2048 x 512 weights (96 MiB in float32, past the caches, as a base decoder's 117 MB), no tape,
// each in the layout oneDNN reads fastest (reordered once, as decoding does): the most a
// decoding step's inner products reach on this machine. The best of 5 passes.
double linear32_gbs(Precision p) {
  Generator g(21);
  const int64_t rows = 32, in = 512, out = 2048, n = 24;
  std::vector<Tensor> ws;
  for (int64_t i = 0; i < n; ++i) ws.push_back(randn({out, in}, DType::f32, g, 0, 0.05));
  const Tensor x = randn({rows, in}, DType::f32, g);
  autograd::NoGrad ng;
  PrecisionGuard guard(p);
  double best = 1e30;
  for (int r = 0; r < 6; ++r) {  // the first pass makes the reordered copies
    const auto t0 = Clock::now();
    for (const Tensor& w : ws) linear(x, w);
    if (r > 0) best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  const double bytes = (double)n * out * in * (p == Precision::bf16 ? 2 : 4);
  return bytes / best / 1e9;
}

// A STREAM-like triad z = x + s y over three float arrays of 2^25 elements (128 MiB each, far
// beyond the caches) on the OpenMP threads: the best of 6 runs in GB/s, counting the two reads
// and the write of each element as STREAM does. Decoding's weight reads are measured against it.
// The same line carries linear32_gbs() in fp32 and, where oneDNN has the kernel, bf16.
void run_stream() {
  const int64_t n = int64_t(1) << 25;
  std::vector<float> x(n, 1.0f), y(n, 2.0f), z(n, 0.0f);
  float* __restrict pz = z.data();
  const float* __restrict px = x.data();
  const float* __restrict py = y.data();
  double best = 1e30;
  for (int r = 0; r < 6; ++r) {
    const auto t0 = Clock::now();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) pz[i] = px[i] + 3.0f * py[i];
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  emit("\"what\":\"stream\",\"mib\":" + num(3.0 * n * 4 / 1048576) +
       ",\"gbs\":" + num(3.0 * n * sizeof(float) / best / 1e9) + ",\"check\":" + num(z[n / 2]) +
       ",\"linear32_gbs_fp32\":" + num(linear32_gbs(Precision::fp32)) +
       (bf16_kernel_available() ? ",\"linear32_gbs_bf16\":" + num(linear32_gbs(Precision::bf16))
                                : std::string()));
}

// ---- the model zoo: the decoder-only LM of `make lm` and the classifier of `make classify` ----

// Byte-token batch shared with torch_peer.py: row b holds L - (b % short_mod) tokens followed by
// `pad`; token (b, t) = (b * 131 + t * 31 + salt * 17) % 256 (the zoo's tokens are bytes).
std::vector<int64_t> byte_ids(int64_t B, int64_t L, int64_t salt, int64_t short_mod, int64_t pad) {
  std::vector<int64_t> ids(B * L, pad);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < L - (b % short_mod); ++t)
      ids[b * L + t] = (b * 131 + t * 31 + salt * 17) % 256;
  return ids;
}

// The model `make lm` trains: examples/lm's preset lm-mini (vocab 259 = bytes + BOS, EOS, PAD
// 258), with the Makefile's --positions rope and the program's defaults (dropout 0, pre-LN,
// ReLU, tied embedding, final LayerNorm); batches of 16 rows x 128 tokens, no label smoothing.
constexpr int64_t kLMVocab = 259, kLMPad = 258, kLMRows = 16, kLMContext = 128;
models::LMConfig lm_config() {
  models::LMConfig c;
  c.vocab = kLMVocab, c.pad_id = kLMPad;
  c.d_model = 128, c.heads = 4, c.d_ff = 512, c.layers = 2, c.max_len = kLMContext;
  c.positions.kind = nn::Positions::rope;
  c.dropout = 0.0;
  return c;
}

void run_lm_train(const Args& a) {
  models::DecoderOnlyLM model(lm_config());
  model.train();
  train::Adam opt(model.named_parameters(), 1e-4, 0.9, 0.98, 1e-9);
  // Windows of 129 tokens: input = [:-1], target = [1:] (every row full, as examples/lm cuts them).
  const auto w = byte_ids(kLMRows, kLMContext + 1, 4, 1, kLMPad);
  std::vector<int64_t> in, out;
  for (int64_t r = 0; r < kLMRows; ++r)
    for (int64_t t = 0; t < kLMContext; ++t) {
      in.push_back(w[r * (kLMContext + 1) + t]);
      out.push_back(w[r * (kLMContext + 1) + t + 1]);
    }
  Tensor input = from_vector(in, {kLMRows, kLMContext}),
         target = from_vector(out, {kLMRows * kLMContext});
  double loss_v = 0;
  const double t = time_median(a.warmup, a.steps, [&] {  // the loss examples/lm trains on
    Tensor loss = cross_entropy(reshape(model.forward(input), {-1, kLMVocab}), target);
    loss.backward();
    opt.step();
    opt.zero_grad();
    loss_v = loss.item();
  });
  const int64_t tokens = kLMRows * kLMContext;
  emit("\"what\":\"lm_train\",\"config\":\"lm-mini\",\"ms\":" + num(t * 1e3) +
       ",\"tok_s\":" + num(tokens / t) + ",\"tokens\":" + std::to_string(tokens) +
       ",\"params\":" + std::to_string(model.num_parameters()) + ",\"loss\":" + num(loss_v) +
       ",\"peak_rss_mib\":" + num(peak_rss_mib()));
}

// Sampling at temperature 1 (no top-k / top-p) with the KV cache: 32 prompts of 32 bytes, 64 new
// tokens each, no early stop; the prompts' forward pass is inside the timing.
void run_lm_sample(const Args& a) {
  models::DecoderOnlyLM model(lm_config());
  const int64_t B = 32, P = 32, NEW = 64;
  const auto flat = byte_ids(B, P, 5, 1, kLMPad);
  std::vector<std::vector<int64_t>> prompts;
  for (int64_t b = 0; b < B; ++b)
    prompts.emplace_back(flat.begin() + b * P, flat.begin() + (b + 1) * P);
  models::DecodeOptions o;
  o.max_len = NEW;
  o.sample = true;
  o.stop_at_eos = false;
  o.use_cache = true;
  o.seed = 1;
  int64_t produced = 0;
  models::DecodeOptions w = o;  // warm-up runs: 4 new tokens, as run_decode's
  w.max_len = 4;
  for (int i = 0; i < a.warmup; ++i) models::generate(model, prompts, -1, w);
  const double t = time_median(0, a.steps, [&] {
    produced = 0;
    for (auto& r : models::generate(model, prompts, -1, o)) produced += (int64_t)r.size();
  });
  emit("\"what\":\"lm_sample\",\"config\":\"lm-mini\",\"ms\":" + num(t * 1e3) +
       ",\"tok_s\":" + num(B * NEW / t) + ",\"produced\":" + std::to_string(produced) +
       ",\"params\":" + std::to_string(model.num_parameters()) +
       ",\"peak_rss_mib\":" + num(peak_rss_mib()));
}

// The model `make classify` trains: examples/classify's defaults (d 64, 4 heads, FFN 128, 2
// layers, post-LN without a final LayerNorm, sinusoidal positions, ReLU, dropout 0.3, byte
// 2..5-gram inputs hashed into 262,144 rows, 8 languages, PAD 256, max_len 160). One batch of
// 512 lines (--batch-rows 512) of 64 - (b % 8) bytes, near the training lines' median of 57.
constexpr int64_t kClsPad = 256, kClsRows = 512, kClsLen = 64, kClsClasses = 8;
models::ClassifierConfig cls_config() {
  models::ClassifierConfig c;
  c.vocab = 257, c.pad_id = kClsPad, c.classes = kClsClasses, c.max_len = 160;
  c.d_model = 64, c.heads = 4, c.d_ff = 128, c.layers = 2;
  c.dropout = 0.3;
  c.ngram_buckets = 262144, c.ngram_max = 5;
  c.positions.kind = nn::Positions::sinusoidal;
  return c;
}

int64_t count_not(const std::vector<int64_t>& v, int64_t pad) {
  return (int64_t)std::count_if(v.begin(), v.end(), [pad](int64_t x) { return x != pad; });
}

void run_cls_train(const Args& a) {
  models::EncoderClassifier model(cls_config());
  model.train();
  train::Adam opt(model.named_parameters(), 1e-4, 0.9, 0.98, 1e-9);  // dense, n-gram table included
  const auto ids_v = byte_ids(kClsRows, kClsLen, 6, 8, kClsPad);
  std::vector<int64_t> labels_v(kClsRows);
  for (int64_t b = 0; b < kClsRows; ++b) labels_v[b] = b % kClsClasses;
  Tensor ids = from_vector(ids_v, {kClsRows, kClsLen}), labels = from_vector(labels_v, {kClsRows});
  double loss_v = 0;
  const double t = time_median(a.warmup, a.steps, [&] {  // the loss examples/classify trains on
    Tensor loss = cross_entropy(model.forward(ids), labels);
    loss.backward();
    opt.step();
    opt.zero_grad();
    loss_v = loss.item();
  });
  const int64_t tokens = count_not(ids_v, kClsPad);
  emit("\"what\":\"cls_train\",\"config\":\"classify\",\"ms\":" + num(t * 1e3) +
       ",\"tok_s\":" + num(tokens / t) + ",\"tokens\":" + std::to_string(tokens) +
       ",\"params\":" + std::to_string(model.num_parameters()) + ",\"loss\":" + num(loss_v) +
       ",\"peak_rss_mib\":" + num(peak_rss_mib()));
}

// Inference over the same 512 lines in batches of 64 rows (as classify evaluate batches), eval
// mode, no tape; a timed run classifies all 512.
void run_cls_infer(const Args& a) {
  models::EncoderClassifier model(cls_config());
  model.eval();
  autograd::NoGrad ng;
  const int64_t R = 64;
  const auto ids_v = byte_ids(kClsRows, kClsLen, 6, 8, kClsPad);
  std::vector<Tensor> batches;
  for (int64_t r = 0; r < kClsRows; r += R)
    batches.push_back(from_vector(
        std::vector<int64_t>(ids_v.begin() + r * kClsLen, ids_v.begin() + (r + R) * kClsLen),
        {R, kClsLen}));
  int64_t predicted = 0;
  const double t = time_median(a.warmup, a.steps, [&] {
    predicted = 0;
    for (auto& b : batches)
      predicted += (int64_t)argmax(model.forward(b), -1).to_vector<int64_t>().size();
  });
  const int64_t tokens = count_not(ids_v, kClsPad);
  emit("\"what\":\"cls_infer\",\"config\":\"classify\",\"ms\":" + num(t * 1e3) +
       ",\"tok_s\":" + num(tokens / t) + ",\"tokens\":" + std::to_string(tokens) +
       ",\"predicted\":" + std::to_string(predicted) + ",\"params\":" +
       std::to_string(model.num_parameters()) + ",\"peak_rss_mib\":" + num(peak_rss_mib()));
}

// --what embed: a pretrained sentence encoder (models::SentenceEncoder) over the lines of
// --sentences, in batches of --batch sorted by length (1: each sentence alone, the latency of a
// single query); a timed run embeds them all. GRAFT_PROFILE=1: the per-op forward profile of one
// pass over the first 64 sentences, with the tape on.
void run_embed(const Args& a) {
  if (a.model.empty() || a.sentences.empty())
    fail("graft_bench: --what embed needs --model DIR and --sentences FILE");
  const models::SentenceEncoder enc(a.model);
  std::vector<std::string> lines;
  std::ifstream in(a.sentences);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  if (lines.empty()) fail("graft_bench: no sentences in " + a.sentences);
  std::vector<std::vector<int64_t>> ids;
  int64_t tokens = 0;
  for (const auto& l : lines) ids.push_back(enc.tokenize(l)), tokens += (int64_t)ids.back().size();
  if (std::getenv("GRAFT_PROFILE")) {
    const std::vector<std::vector<int64_t>> head(ids.begin(),
                                                 ids.begin() + std::min<size_t>(64, ids.size()));
    const auto [x, pad] = models::pad_batch(head, enc.model->cfg.pad_id);
    const std::string p = profile_step([&] { enc.embed(x, pad); }, true);
    std::cerr << p << "\n";
  }
  const double t = time_median(a.warmup, a.steps, [&] { enc.encode_ids(ids, a.batch); });
  emit("\"what\":\"embed\",\"batch\":" + std::to_string(a.batch) +
       ",\"sentences\":" + std::to_string(lines.size()) + ",\"tokens\":" + std::to_string(tokens) +
       ",\"ms\":" + num(t * 1e3) + ",\"sent_s\":" + num((double)lines.size() / t) + ",\"params\":" +
       std::to_string(enc.model->num_parameters()) + ",\"peak_rss_mib\":" + num(peak_rss_mib()));
}

void run_sgemm(const Args& a) {
  autograd::NoGrad ng;
  const int64_t n = a.n;
  Generator g(7);
  Tensor x = randn({n, n}, DType::f32, g), y = randn({n, n}, DType::f32, g);
  const double t = time_median(std::max(a.warmup, 2), std::max(a.steps, 5), [&] { matmul(x, y); });
  emit("\"what\":\"sgemm\",\"n\":" + std::to_string(n) + ",\"ms\":" + num(t * 1e3) +
       ",\"gflops\":" + num(2.0 * n * n * n / t / 1e9));
}

void run_kernels() {
  emit("\"what\":\"kernels\",\"f32\":\"" + matmul_kernel_name(Precision::fp32) + "\",\"bf16\":\"" +
       matmul_kernel_name(Precision::bf16) +
       "\",\"bf16_available\":" + (bf16_kernel_available() ? "true" : "false"));
}

// Forward + backward of one op against a random upstream gradient; the leaf grads are dropped
// before each call so every call does the same work.
double fwd_bwd(const Args& a, Tensors leaves, const std::function<Tensor()>& fwd,
               const Tensor& upstream) {
  return time_median(std::max(a.warmup, 2), std::max(a.steps, 7), [&] {
    for (auto& l : leaves) l.zero_grad();
    Tensor y = fwd();
    if (upstream.defined()) y.backward(upstream);
    else y.backward();
  });
}

void run_micro(const Args& a) {
  Generator g(11);
  std::ostringstream os;
  auto row = [&](const std::string& name, const std::string& shape, double t, double amount,
                 const char* unit) {
    if (os.tellp() > 0) os << ",";
    os << "{\"op\":\"" << name << "\",\"shape\":\"" << shape << "\",\"ms\":" << num(t * 1e3)
       << ",\"value\":" << num(amount / t / 1e9) << ",\"unit\":\"" << unit << "\"}";
  };
  {  // linear: x (4096, 512) -> (4096, 2048); 6 M N K FLOPs (forward 2MNK, backward dx + dW 4MNK)
    const int64_t M = 4096, K = 512, N = 2048;
    Tensor x = randn({M, K}, DType::f32, g).requires_grad_();
    Tensor w = randn({N, K}, DType::f32, g, 0, 0.05).requires_grad_();
    Tensor bias = randn({N}, DType::f32, g).requires_grad_();
    Tensor up = randn({M, N}, DType::f32, g);
    double t = fwd_bwd(
        a, {x, w, bias}, [&] { return linear(x, w, bias); }, up);
    row("linear", "x 4096x512, W 2048x512", t, 6.0 * M * N * K, "GFLOP/s");
  }
  {  // attention: (B 32, H 8, T 128, D 64); 12 B H T^2 D FLOPs (forward 4, backward 8)
    const int64_t B = 32, H = 8, T = 128, D = 64;
    Tensor q = randn({B, H, T, D}, DType::f32, g).requires_grad_();
    Tensor k = randn({B, H, T, D}, DType::f32, g).requires_grad_();
    Tensor v = randn({B, H, T, D}, DType::f32, g).requires_grad_();
    Tensor up = randn({B, H, T, D}, DType::f32, g);
    double t = fwd_bwd(
        a, {q, k, v}, [&] { return scaled_dot_product_attention(q, k, v).out; }, up);
    row("attention", "q,k,v 32x8x128x64", t, 12.0 * B * H * T * T * D, "GFLOP/s");
  }
  {  // layer_norm: (8192, 512); bytes = 5 N * 4 (fwd read x, write y; bwd read x, dy, write dx)
    const int64_t R = 8192, C = 512;
    Tensor x = randn({R, C}, DType::f32, g).requires_grad_();
    Tensor w = randn({C}, DType::f32, g).requires_grad_();
    Tensor bb = randn({C}, DType::f32, g).requires_grad_();
    Tensor up = randn({R, C}, DType::f32, g);
    double t = fwd_bwd(
        a, {x, w, bb}, [&] { return layer_norm(x, w, bb, 1e-5); }, up);
    row("layer_norm", "8192x512", t, 5.0 * R * C * 4, "GB/s");
  }
  {  // softmax: (32768, 128); bytes = 5 N * 4 (fwd read x, write y; bwd read y, dy, write dx)
    const int64_t R = 32768, C = 128;
    Tensor x = randn({R, C}, DType::f32, g).requires_grad_();
    Tensor up = randn({R, C}, DType::f32, g);
    double t = fwd_bwd(
        a, {x}, [&] { return softmax(x, -1); }, up);
    row("softmax", "32768x128", t, 5.0 * R * C * 4, "GB/s");
  }
  {  // cross-entropy: logits (2048, 8000), smoothing 0.1, ignore pad; bytes = 3 N * 4
    // (fwd read logits; bwd read logits, write dlogits)
    const int64_t N = 2048, V = 8000;
    Tensor x = randn({N, V}, DType::f32, g).requires_grad_();
    std::vector<int64_t> tv(N);
    for (int64_t i = 0; i < N; ++i) tv[i] = i % 16 == 0 ? PAD : 1 + (i * 7919) % (V - 1);
    Tensor tgt = from_vector(tv, {N});
    double t = fwd_bwd(
        a, {x}, [&] { return cross_entropy(x, tgt, 0.1, PAD); }, Tensor());
    row("cross_entropy", "2048x8000", t, 3.0 * N * V * 4, "GB/s");
  }
  emit("\"what\":\"micro\",\"ops\":[" + os.str() + "]");
}

// SiLU written by a user as table rows (ops/elementwise.h), to compare with the library's silu
// (oneDNN swish): one from a generic formula (unary_row: vectorised float32 loops), one from
// float64 function pointers only (each float32 element goes through the float64 functions).
constexpr auto user_silu_f = [](auto x, auto, auto) { return x / (1 + kern::exp(-x)); };
constexpr auto user_silu_df = [](auto x, auto, auto, auto) {
  const auto s = 1 / (1 + kern::exp(-x));
  return s * (1 + x * (1 - s));
};
const UnaryOp kUserSilu =
    unary_row<user_silu_f, user_silu_df>({.name = "user_silu", .family = "bench"});
const UnaryOp kUserSiluF64{.name = "user_silu_f64",
                           .f = [](double x, double, double) { return x / (1 + std::exp(-x)); },
                           .df =
                               [](double x, double, double, double) {
                                 const double s = 1 / (1 + std::exp(-x));
                                 return s * (1 + x * (1 - s));
                               },
                           .family = "bench"};

// SiLU forward + backward on a (1024, 344) float32 tensor (a SwiGLU hidden layer's size), each
// way in the same run: median ms of 51 calls.
void run_eltwise(const Args& a) {
  Generator g(11);
  const int64_t R = 1024, C = 344;
  Tensor x = randn({R, C}, DType::f32, g).requires_grad_();
  Tensor up = randn({R, C}, DType::f32, g);
  const std::pair<const char*, std::function<Tensor()>> ways[] = {
      {"silu (oneDNN swish)", [&] { return silu(x); }},
      {"row, unary_row (vectorised float32 loop)", [&] { return unary(kUserSilu, x); }},
      {"row, float64 functions only", [&] { return unary(kUserSiluF64, x); }},
      {"x * sigmoid(x)", [&] { return mul(x, sigmoid(x)); }},
  };
  std::ostringstream os;
  for (const auto& [name, fwd] : ways) {
    const double t = time_median(std::max(a.warmup, 5), std::max(a.steps, 51), [&] {
      x.zero_grad();
      fwd().backward(up);
    });
    if (os.tellp() > 0) os << ",";
    os << "{\"way\":\"" << name << "\",\"ms\":" << num(t * 1e3) << "}";
  }
  emit("\"what\":\"eltwise\",\"op\":\"silu fwd+bwd 1024x344 f32\",\"ways\":[" + os.str() + "]");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Args a = parse(argc, argv);
    if (a.precision == Precision::bf16 && !bf16_kernel_available()) {
      std::cerr << "graft_bench: " << bf16_unavailable_reason("--precision") << "\n";
      return 3;
    }
    if (a.precision == Precision::int8) {
      if (a.what != "greedy" && a.what != "beam" && a.what != "embed" && a.what != "load" &&
          a.what != "export") {
        std::cerr
            << "graft_bench: --precision int8 is for inference: --what greedy, beam, embed, load "
               "or export, not "
            << a.what << "\n";
        return 2;
      }
    }
    PrecisionGuard guard(a.precision, Bf16Path::onednn);
    if (a.what == "train") run_train(a);
    else if (a.what == "hvp") run_hvp(a);
    else if (a.what == "greedy") run_decode(a);
    else if (a.what == "beam") {
      if (a.beam <= 1) a.beam = 4;
      run_decode(a);
    } else if (a.what == "lm_train") run_lm_train(a);
    else if (a.what == "lm_sample") run_lm_sample(a);
    else if (a.what == "cls_train") run_cls_train(a);
    else if (a.what == "cls_infer") run_cls_infer(a);
    else if (a.what == "embed") run_embed(a);
    else if (a.what == "micro") run_micro(a);
    else if (a.what == "eltwise") run_eltwise(a);
    else if (a.what == "sgemm") run_sgemm(a);
    else if (a.what == "kernels") run_kernels();
    else if (a.what == "save_model") run_save_model(a);
    else if (a.what == "load" || a.what == "export") run_load(a);
    else if (a.what == "stream") run_stream();
    else {
      std::cerr << "graft_bench: unknown --what " << a.what
                << " (train, greedy, beam, save_model, lm_train, lm_sample, cls_train, cls_infer, "
                   "micro, eltwise, sgemm, kernels, stream)\n";
      return 2;
    }
  } catch (const std::exception& e) {
    std::cerr << "graft_bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
