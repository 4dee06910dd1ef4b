// graft's side of `make bench-hf` (bench/hf_peers.sh runs it next to bench/hf_peers_llama.py):
// a Hugging Face causal LM directory timed the way llama-bench times a GGUF file.
//
//   hf_lm_bench --hf DIR [--precision fp32|bf16|int8] [--prompt 512] [--gen 128] [--repeats 3]
//   hf_lm_bench --triad        (this machine's memory bandwidth: a STREAM-like triad, GB/s)
//
// Load: load_hf_causal_lm(dir, precision) (as `lm generate --hf` does): a 16-bit file widened to
// float32 for fp32, kept for inference; int8 quantized parameter by parameter as it is read.
// Then each repeat is one greedy generate() at batch 1 without stopping at eos: a prompt of
// --prompt ids (prompt_ids(), the same ids the llama.cpp side feeds) and
// --gen + 1 new tokens. The prompt phase (pp) runs from the call to the first new token (one
// forward over the whole prompt filling the KV cache, then the first argmax); the generation phase
// (tg) from the first new token to the last: exactly --gen single-token steps, as llama.cpp's
// n_eval. Prints one line "RESULT {json}" with the medians over the repeats, the load seconds and
// the process's peak RSS (getrusage ru_maxrss).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "graft/models/decoding.h"
#include "graft/models/hf.h"
#include "graft/ops/precision.h"

using namespace graft;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  std::string dir;
  Precision precision = Precision::fp32;
  int64_t prompt = 512, gen = 128;
  int repeats = 3;
  bool triad = false;
};

int64_t positive(const std::string& flag, const std::string& v) {
  size_t used = 0;
  long long n = 0;
  try {
    n = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || n < 1 || n > 1000000)
    throw std::invalid_argument(flag + ": expected an integer in [1, 1000000], got '" + v + "'");
  return n;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--triad") {
      a.triad = true;
      continue;
    }
    if (i + 1 >= argc) throw std::invalid_argument(k + ": missing value");
    const std::string v = argv[++i];
    if (k == "--hf") a.dir = v;
    else if (k == "--precision") a.precision = parse_precision(v, "--precision");
    else if (k == "--prompt") a.prompt = positive(k, v);
    else if (k == "--gen") a.gen = positive(k, v);
    else if (k == "--repeats") a.repeats = static_cast<int>(positive(k, v));
    else
      throw std::invalid_argument("unknown option " + k +
                                  " (--hf, --precision, --prompt, --gen, "
                                  "--repeats, --triad)");
  }
  if (!a.triad && a.dir.empty()) throw std::invalid_argument("give --hf DIR (or --triad)");
  return a;
}

// The prompt both sides feed: a fixed pseudo-random walk over [1, vocab) (bench/hf_peers_llama.py
// computes the same ids).
std::vector<int64_t> prompt_ids(int64_t n, int64_t vocab) {
  std::vector<int64_t> ids(n);
  for (int64_t t = 0; t < n; ++t) ids[t] = 1 + (t * 7919 + 104729) % (vocab - 1);
  return ids;
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // KiB on Linux
}

std::string num(double v) {
  std::ostringstream os;
  os.precision(6);
  os << v;
  return os.str();
}

// The best of 6 passes of z = x + 3 y over 3 x 128 MiB of float32 (bytes moved: 3 per element x 4).
void run_triad() {
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
    best = std::min(best, seconds_since(t0));
  }
  std::cout << "RESULT {\"what\":\"triad\",\"gbs\":" << num(3.0 * n * 4 / best / 1e9)
            << ",\"check\":" << num(z[n / 2]) << "}" << std::endl;
}

struct Phases {
  double pp_s = 0, tg_s = 0;
};

// One greedy generate(): the prompt phase ends at the first new token, the generation phase at
// the last of gen + 1 (gen single-token steps after the first).
Phases time_generate(models::DecoderOnlyLM& lm, const std::vector<int64_t>& prompt, int64_t gen) {
  models::DecodeOptions o;
  o.max_len = gen + 1;
  o.stop_at_eos = false;
  Clock::time_point first, last;
  int64_t seen = 0;
  o.on_token = [&](int64_t, int64_t) { (seen++ == 0 ? first : last) = Clock::now(); };
  const auto t0 = Clock::now();
  models::generate(lm, {prompt}, -1, o);
  if (seen != gen + 1)
    throw std::runtime_error("generate gave " + std::to_string(seen) + " tokens, not " +
                             std::to_string(gen + 1));
  return {std::chrono::duration<double>(first - t0).count(),
          std::chrono::duration<double>(last - first).count()};
}

void run_model(const Args& a) {
  const auto t0 = Clock::now();
  models::HfCausalLM m = models::load_hf_causal_lm(a.dir, a.precision);
  const double load_s = seconds_since(t0);
  const std::vector<int64_t> prompt = prompt_ids(a.prompt, m.model->cfg.vocab);
  std::vector<double> pp, tg;
  for (int r = 0; r < a.repeats; ++r) {
    const Phases p = time_generate(*m.model, prompt, a.gen);
    pp.push_back(static_cast<double>(a.prompt) / p.pp_s);
    tg.push_back(static_cast<double>(a.gen) / p.tg_s);
  }
  std::cout << "RESULT {\"what\":\"hf_lm\",\"engine\":\"graft\",\"precision\":\""
            << precision_name(a.precision) << "\",\"prompt\":" << a.prompt << ",\"gen\":" << a.gen
            << ",\"repeats\":" << a.repeats << ",\"pp_tok_s\":" << num(median(pp))
            << ",\"tg_tok_s\":" << num(median(tg)) << ",\"load_s\":" << num(load_s)
            << ",\"peak_rss_mib\":" << num(peak_rss_mib()) << "}" << std::endl;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  try {
    a = parse(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "hf_lm_bench: " << e.what() << "\n";
    return 2;
  }
  try {
    if (a.triad) {
      run_triad();
      return 0;
    }
    PrecisionGuard guard(a.precision);
    run_model(a);
  } catch (const std::exception& e) {
    std::cerr << "hf_lm_bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
