// graft's side of `make bench-marian` (bench/marian_bench.sh runs it next to bench/marian_peer.py,
// CTranslate2): a Hugging Face Marian directory translating real text, timed.
//
//   marian_bench --hf DIR --text FILE [--sentences 64] [--batch 32] [--beam 1] [--max-len 32]
//                [--precision fp32|bf16|int8] [--repeats 3] [--src-ids OUT] [--ids OUT]
//
// Load: load_hf_marian (float32 unless --precision bf16), keep_for_inference. The first
// --sentences lines of FILE are tokenized with text::MarianTokenizer (the directory's source.spm
// and vocab.json, `</s>` appended; not timed). After an untimed translation of the first batch,
// each repeat translates them all, --batch at a time
// (one padded batch each): greedy (--beam 1) or Hugging Face's beam search, the directory's
// bad_words_ids banned, at most --max-len new tokens, stopping at eos, no forced eos (CTranslate2
// has none: its max_decoding_length simply ends the row). Prints one line "RESULT {json}": the
// median over the repeats of sentences/s and new tokens/s (eos not counted), the load seconds and
// peak RSS (after loading; whole process). --src-ids writes the source ids (one line of ids a
// sentence), --ids the translation ids of the last repeat, which the CTranslate2 side feeds and
// compares.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "graft/models/decoding.h"
#include "graft/models/hf_marian.h"
#include "graft/nn/text/marian_tokenizer.h"
#include "graft/ops/precision.h"

using namespace graft;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  std::string dir, text, src_ids, ids;
  Precision precision = Precision::fp32;
  int64_t sentences = 64, batch = 32, beam = 1, max_len = 32;
  int repeats = 3;
};

int64_t positive(const std::string& flag, const std::string& v) {
  size_t used = 0;
  long long n = 0;
  try {
    n = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || n < 1 || n > 100000)
    throw std::invalid_argument(flag + ": expected an integer in [1, 100000], got '" + v + "'");
  return n;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument(k + ": missing value");
    const std::string v = argv[++i];
    if (k == "--hf") a.dir = v;
    else if (k == "--text") a.text = v;
    else if (k == "--src-ids") a.src_ids = v;
    else if (k == "--ids") a.ids = v;
    else if (k == "--precision") a.precision = parse_precision(v, "--precision");
    else if (k == "--sentences") a.sentences = positive(k, v);
    else if (k == "--batch") a.batch = positive(k, v);
    else if (k == "--beam") a.beam = positive(k, v);
    else if (k == "--max-len") a.max_len = positive(k, v);
    else if (k == "--repeats") a.repeats = static_cast<int>(positive(k, v));
    else
      throw std::invalid_argument("unknown option " + k +
                                  " (--hf, --text, --sentences, --batch, --beam, --max-len, "
                                  "--precision, --repeats, --src-ids, --ids)");
  }
  if (a.dir.empty() || a.text.empty()) throw std::invalid_argument("give --hf DIR and --text FILE");
  return a;
}

// The first n non-empty lines of path.
std::vector<std::string> read_lines(const std::string& path, int64_t n) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("--text: cannot open '" + path + "'");
  std::vector<std::string> lines;
  std::string line;
  while ((int64_t)lines.size() < n && std::getline(in, line))
    if (!line.empty()) lines.push_back(line);
  if ((int64_t)lines.size() < n)
    throw std::runtime_error("--text: '" + path + "' has " + std::to_string(lines.size()) +
                             " non-empty lines, --sentences asks for " + std::to_string(n));
  return lines;
}

// Rows [begin, end) of ids as one (rows, longest) int64 batch padded with pad.
Tensor padded_batch(const models::Sequences& ids, size_t begin, size_t end, int64_t pad) {
  size_t width = 1;
  for (size_t r = begin; r < end; ++r) width = std::max(width, ids[r].size());
  std::vector<int64_t> flat;
  for (size_t r = begin; r < end; ++r) {
    flat.insert(flat.end(), ids[r].begin(), ids[r].end());
    flat.insert(flat.end(), width - ids[r].size(), pad);
  }
  return from_vector(flat, {(int64_t)(end - begin), (int64_t)width}, DType::i64);
}

void write_ids(const std::string& path, const models::Sequences& rows) {
  std::ofstream out(path);
  for (const auto& r : rows) {
    for (size_t i = 0; i < r.size(); ++i) out << (i ? " " : "") << r[i];
    out << '\n';
  }
  if (!out) throw std::runtime_error("cannot write '" + path + "'");
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

// The decoding: greedy or Hugging Face's beam search, pad (bad_words_ids) banned, no forced eos.
models::DecodeOptions options(const Args& a, const models::HfMarian& m) {
  models::DecodeOptions o;
  o.beam = static_cast<int>(a.beam);
  o.hf_beam = true;
  o.length_penalty = m.hf.length_penalty;
  o.banned_ids = m.hf.bad_words;
  o.max_len = a.max_len;
  models::check_decode_options(o);
  return o;
}

// All sources translated, a.batch at a time.
models::Sequences translate_all(const models::HfMarian& m, const models::Sequences& src,
                                const models::DecodeOptions& o, int64_t batch) {
  models::Sequences out;
  for (size_t b = 0; b < src.size(); b += batch) {
    const size_t e = std::min(src.size(), b + static_cast<size_t>(batch));
    for (auto& ids : models::translate(*m.model, padded_batch(src, b, e, m.model->cfg.pad_id), o))
      out.push_back(std::move(ids));
  }
  return out;
}

void run(const Args& a) {
  const auto t0 = Clock::now();
  models::HfMarian m = a.precision == Precision::bf16 ? models::load_hf_marian(a.dir)
                                                      : models::load_hf_marian(a.dir, DType::f32);
  models::keep_for_inference(*m.model, a.precision);
  const double load_s = seconds_since(t0), load_rss = peak_rss_mib();
  const text::MarianTokenizer tok(a.dir);
  models::Sequences src;
  for (const std::string& line : read_lines(a.text, a.sentences)) src.push_back(tok.encode(line));
  const models::DecodeOptions o = options(a, m);
  const size_t first = std::min(src.size(), static_cast<size_t>(a.batch));
  translate_all(m, models::Sequences(src.begin(), src.begin() + first), o, a.batch);  // warm-up
  std::vector<double> sent_s, tok_s;
  models::Sequences out;
  int64_t produced = 0;
  for (int r = 0; r < a.repeats; ++r) {
    const auto t = Clock::now();
    out = translate_all(m, src, o, a.batch);
    const double s = seconds_since(t);
    produced = 0;
    for (const auto& ids : out) produced += static_cast<int64_t>(ids.size());
    sent_s.push_back(static_cast<double>(src.size()) / s);
    tok_s.push_back(static_cast<double>(produced) / s);
  }
  if (!a.src_ids.empty()) write_ids(a.src_ids, src);
  if (!a.ids.empty()) write_ids(a.ids, out);
  std::cout << "RESULT {\"what\": \"" << (a.beam == 1 ? "greedy" : "beam") << "\", \"engine\": "
            << "\"graft\", \"precision\": \"" << precision_name(a.precision)
            << "\", \"batch\": " << a.batch << ", \"beam\": " << a.beam
            << ", \"sentences\": " << src.size() << ", \"max_len\": " << a.max_len
            << ", \"repeats\": " << a.repeats << ", \"sent_s\": " << num(median(sent_s))
            << ", \"tok_s\": " << num(median(tok_s)) << ", \"produced\": " << produced
            << ", \"load_s\": " << num(load_s) << ", \"load_peak_rss_mib\": " << num(load_rss)
            << ", \"peak_rss_mib\": " << num(peak_rss_mib()) << "}" << std::endl;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  try {
    a = parse(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "marian_bench: " << e.what() << "\n";
    return 2;
  }
  try {
    PrecisionGuard guard(a.precision);
    run(a);
  } catch (const std::exception& e) {
    std::cerr << "marian_bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
