// embed: sentence embeddings from a pretrained BERT-family encoder (all-MiniLM-L6-v2 and its
// kind, a sentence-transformers directory; examples/embed/fetch_model.sh fetches one).
//   embed encode --in lines.txt --out vectors.safetensors     (one vector per line)
//   embed search --collection lines.txt --query "a sentence" [--top-k 5]
//   embed similarity "one text" "another text"
//   embed tokenize < lines.txt                                  (the token ids of each line)
// --model DIR defaults to ${XDG_CACHE_HOME:-~/.cache}/graft/all-MiniLM-L6-v2, where the fetch
// script (PREFIX/bin/graft-fetch-model once installed) puts the model by default.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "examples/common/cli.h"
#include "examples/common/finite.h"
#include "examples/common/lines.h"
#include "graft/models/sentence_encoder.h"
#include "graft/nn/train/checkpoint.h"
#include "graft/ops/ops.h"

using namespace graft;

namespace {

// The model directory without --model: the user's cache, ${XDG_CACHE_HOME:-~/.cache}/graft/
// all-MiniLM-L6-v2, the fetch script's default too, so that an installed `embed` and an installed
// graft-fetch-model agree wherever the prefix is. "" when neither variable is set.
std::string default_model_dir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg && *xdg) return std::string(xdg) + "/graft/all-MiniLM-L6-v2";
  const char* home = std::getenv("HOME");
  if (home && *home) return std::string(home) + "/.cache/graft/all-MiniLM-L6-v2";
  return {};
}

// The command that fetches the model: the installed script beside this program
// (PREFIX/bin/graft-fetch-model), else the source tree's.
std::string fetch_command() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec && std::filesystem::exists(exe.parent_path() / "graft-fetch-model", ec))
    return (exe.parent_path() / "graft-fetch-model").string();
  return "examples/embed/fetch_model.sh";
}
constexpr size_t kMaxLineBytes = size_t(1) << 20;

// The lines of a text file (one text each), every line checked for length and UTF-8 up front.
std::vector<std::string> read_lines(const std::string& path) {
  text::check_input_file("", path);
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fail("cannot open '" + path + "'");
  std::unique_ptr<FILE, int (*)(FILE*)> close(f, std::fclose);
  text::LineReader reader(f, kMaxLineBytes);
  std::vector<std::string> lines;
  std::string line;
  bool too_long = false;
  while (reader.next(line, too_long, "'" + path + "'")) {
    const std::string where = "'" + path + "' line " + std::to_string(lines.size() + 1);
    if (too_long) fail(where + " is over " + std::to_string(kMaxLineBytes) + " bytes");
    if (!text::valid_utf8(line)) fail(where + " is not valid UTF-8");
    lines.push_back(line);
  }
  if (lines.empty()) fail("'" + path + "' has no lines");
  return lines;
}

// A progress line on stderr: on a terminal every two seconds, in place; else (a log) a line every
// 30 seconds. Encodes shorter than that print none.
models::SentenceEncoder::Progress progress_line(const char* what) {
  using clock = std::chrono::steady_clock;
  auto start = std::make_shared<clock::time_point>(clock::now());
  auto last = std::make_shared<clock::time_point>(*start);
  const bool tty = isatty(2);
  return [=](int64_t done, int64_t total) {
    const auto now = clock::now();
    if (now - *last < std::chrono::seconds(tty ? 2 : 30)) return;  // short encodes print nothing
    *last = now;
    const double s = std::chrono::duration<double>(now - *start).count();
    std::fprintf(stderr, "%s%s: %lld/%lld texts, %.0f/s%s", tty ? "\r" : "", what, (long long)done,
                 (long long)total, s > 0 ? (double)done / s : 0.0, tty && done < total ? "" : "\n");
  };
}

models::SentenceEncoder load_model(const std::string& dir) {
  if (dir.empty())
    fail(
        "--model: no default directory (neither XDG_CACHE_HOME nor HOME is set): pass --model DIR");
  if (!std::filesystem::is_directory(dir))
    fail("--model '" + dir + "' is not a directory" +
         (dir == default_model_dir() ? " (the default)" : "") +
         ": fetch all-MiniLM-L6-v2 into it with '" + fetch_command() + " " + dir +
         "', or pass --model DIR");
  return models::SentenceEncoder(dir);
}

// Refuses an output path that is a device, a FIFO, a directory, one of `inputs` or a file of
// the model (models::embedding_files(): every file loading it reads), before any work.
void check_output(const std::string& option, const std::string& path, const std::string& model_dir,
                  std::vector<train::NamedInput> inputs) {
  for (const std::string& f : models::embedding_files())
    inputs.push_back({model_dir + "/" + f, "the model's " + f});
  train::check_output_path(option, path, inputs);
}

// Each row of `e` (the embeddings of `texts`) finite: a NaN or Inf names the row's text (`name`
// and its number, counted from first + 1), the model's parameter holding NaN, and the first op
// that made it (that text's forward run again under anomaly mode).
void check_embeddings(const models::SentenceEncoder& enc, const Tensor& e,
                      const std::vector<std::string>& texts, const std::string& name,
                      size_t first = 0) {
  if (!autograd::nonfinite_kind(e)) return;
  const std::vector<double> v = e.to_vector<double>();  // exact for every float dtype
  const int64_t d = e.size(1);
  const int64_t row =
      (std::find_if(v.begin(), v.end(), [](double x) { return !std::isfinite(x); }) - v.begin()) /
      d;
  const Tensor r =
      from_vector(std::vector<double>(v.begin() + row * d, v.begin() + (row + 1) * d), {d});
  const std::string text = texts.at((size_t)row);
  cli::check_finite(
      "the embedding of " + name + " " + std::to_string(first + row + 1), r, enc.model.get(), [&] {
        const auto [x, pad] = models::pad_batch({enc.tokenize(text)}, enc.model->cfg.pad_id);
        enc.embed(x, pad);
      });
}

int cmd_encode(const std::string& model_dir, const std::string& in, const std::string& out,
               int64_t batch) {
  check_output("encode --out", out, model_dir, {{in, "--in"}});
  const models::SentenceEncoder enc = load_model(model_dir);
  const std::vector<std::string> lines = read_lines(in);
  const Tensor e = enc.encode(lines, batch, progress_line("encode"));
  check_embeddings(enc, e, lines, "'" + in + "' line");  // before anything is written
  train::save_safetensors(out, {{"embeddings", e}}, {{"model", model_dir}, {"texts", in}});
  std::printf("wrote %lld x %lld embeddings of %s to %s\n", (long long)e.size(0),
              (long long)e.size(1), in.c_str(), out.c_str());
  return 0;
}

// The index of a collection: its embeddings, tied to the collection's bytes and to every model
// file that changes an embedding (SentenceEncoder::index_ties), so an edited collection, another
// model or an edited model file is noticed and the index rebuilt.
Tensor collection_index(const models::SentenceEncoder& enc, const std::string& collection,
                        const std::vector<std::string>& texts, const std::string& index,
                        int64_t batch) {
  std::string stale;  // why an index that exists is not used
  if (std::filesystem::exists(index)) {
    try {
      train::SafetensorsFile f = train::load_safetensors(index);
      train::check_weights_checksum(f, "embed search");
      enc.check_index_ties(f.metadata, collection, index);
      nn::NamedTensors& w = f.tensors;
      if (w.size() == 1 && w[0].first == "embeddings" && w[0].second.dim() == 2 &&
          w[0].second.size(0) == (int64_t)texts.size() &&
          w[0].second.size(1) == enc.model->cfg.d_model) {
        if (!autograd::nonfinite_kind(w[0].second)) return w[0].second;
        stale = "its vectors hold NaN or Inf";
      } else {
        stale = "its vectors do not fit the collection";
      }
    } catch (const Error& e) {
      stale = e.what();
    }
  }
  const Tensor e = enc.encode(texts, batch, progress_line("index"));
  check_embeddings(enc, e, texts, "'" + collection + "' line");  // before the index is written
  const nn::NamedTensors saved = {{"embeddings", e}};
  std::map<std::string, std::string> meta = train::checksum_metadata(saved);
  meta.merge(enc.index_ties(collection));
  train::save_safetensors(index, saved, meta);
  if (stale.empty())
    std::fprintf(stderr, "embed: wrote the index of %zu texts to %s\n", texts.size(),
                 index.c_str());
  else
    std::fprintf(stderr, "embed: rebuilt the index %s of %zu texts (the old one: %s)\n",
                 index.c_str(), texts.size(), stale.c_str());
  return e;
}

// The top_k texts of the collection for each query, printed as each chunk of queries is encoded.
void print_results(const std::vector<std::string>& queries, const std::vector<float>& scores,
                   const std::vector<std::string>& texts, int64_t top_k) {
  const int64_t n = (int64_t)texts.size(), k = std::min<int64_t>(top_k, n);
  for (size_t i = 0; i < queries.size(); ++i) {
    std::vector<int64_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    const float* s = scores.data() + i * n;
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [s](int64_t a, int64_t b) { return s[a] > s[b] || (s[a] == s[b] && a < b); });
    std::printf("query: %s\n", queries[i].c_str());
    for (int64_t r = 0; r < k; ++r)
      std::printf("  %.4f  %s\n", s[order[r]], texts[order[r]].c_str());
  }
  std::fflush(stdout);
}

// The queries' cosines with every text of the index (`normed`: its rows L2-normalised), each
// checked finite; `name` + number names a query in errors.
std::vector<float> query_scores(const models::SentenceEncoder& enc, const Tensor& normed,
                                const std::vector<std::string>& queries, int64_t batch,
                                const std::string& name, size_t first = 0) {
  const Tensor qe = enc.encode(queries, batch);
  check_embeddings(enc, qe, queries, name, first);
  // Cosines: normalised here too, for a model whose directory has no Normalize module.
  const Tensor scores = matmul(models::l2_normalize(qe), transpose(normed, 0, 1));
  return cli::check_finite("search: the scores", scores).to_vector<float>();
}

int cmd_search(const std::string& model_dir, const std::string& collection, std::string index,
               std::vector<std::string> queries, int64_t top_k, int64_t batch) {
  if (index.empty()) index = collection + ".index.safetensors";
  check_output("search --index", index, model_dir, {{collection, "--collection"}});
  const models::SentenceEncoder enc = load_model(model_dir);
  const std::vector<std::string> texts = read_lines(collection);
  // A model holding NaN would write an index of NaN vectors, used by every later search.
  if (const std::string bad = cli::nonfinite_parameter(*enc.model); !bad.empty())
    fail("search: " + bad + " (--model '" + model_dir + "'): its index would hold NaN");
  const Tensor e = collection_index(enc, collection, texts, index, batch);
  const Tensor normed = models::l2_normalize(e);
  if (!queries.empty()) {
    print_results(queries, query_scores(enc, normed, queries, batch, "--query"), texts, top_k);
    return 0;
  }
  // One query per stdin line, in chunks of `batch`: memory stays bounded whatever comes in.
  auto search_chunk = [&](const std::vector<text::CappedLine>& lines, size_t before) {
    std::vector<std::string> chunk;
    for (size_t i = 0; i < lines.size(); ++i) {
      const std::string where = "search: stdin line " + std::to_string(before + i + 1);
      if (lines[i].too_long) fail(where + " is over " + std::to_string(kMaxLineBytes) + " bytes");
      if (!text::valid_utf8(lines[i].text)) fail(where + " is not valid UTF-8");
      chunk.push_back(lines[i].text);
    }
    print_results(chunk, query_scores(enc, normed, chunk, batch, "stdin line", before), texts,
                  top_k);
  };
  text::for_each_chunk(stdin, kMaxLineBytes, (size_t)batch, "search: standard input", search_chunk);
  return 0;
}

int cmd_similarity(const std::string& model_dir, const std::string& a, const std::string& b) {
  const models::SentenceEncoder enc = load_model(model_dir);
  const Tensor raw = enc.encode({a, b});
  check_embeddings(enc, raw, {a, b}, "text");
  const Tensor e = models::l2_normalize(raw);
  const std::vector<float> v = e.to_vector<float>();
  const int64_t d = e.size(1);
  double cos = 0;
  for (int64_t j = 0; j < d; ++j) cos += (double)v[j] * v[d + j];
  std::printf("%.4f\n", cli::check_finite("similarity: the cosine", cos));
  return 0;
}

int cmd_tokenize(const std::string& model_dir, int64_t max_len) {
  const text::WordPiece tok = text::WordPiece::from_directory(model_dir);
  auto tokenize_chunk = [&](const std::vector<text::CappedLine>& lines, size_t before) {
    for (size_t k = 0; k < lines.size(); ++k) {
      const std::string where = "tokenize: stdin line " + std::to_string(before + k + 1);
      if (lines[k].too_long) fail(where + " is over " + std::to_string(kMaxLineBytes) + " bytes");
      if (!text::valid_utf8(lines[k].text)) fail(where + " is not valid UTF-8");
      const std::vector<int64_t> ids = tok.encode_with_specials(lines[k].text, max_len);
      for (size_t i = 0; i < ids.size(); ++i) std::printf(i ? " %lld" : "%lld", (long long)ids[i]);
      std::printf("\n");
    }
  };
  text::for_each_chunk(stdin, kMaxLineBytes, 256, "tokenize: standard input", tokenize_chunk);
  return 0;
}

// Each subcommand: its options (kept alive by the closure that runs it) and its CLI.

void add_model_option(CLI::App* sub, std::string& dir) {
  sub->add_option("--model", dir,
                  "sentence-transformers directory (config.json, model.safetensors, tokenizer)");
}

cli::Command add_encode(CLI::App& app) {
  struct Args {
    std::string model = default_model_dir(), in, out;
    int64_t batch = 32;
  };
  auto a = std::make_shared<Args>();
  auto* sub =
      app.add_subcommand("encode", "embed each line of a text file into a safetensors file");
  add_model_option(sub, a->model);
  sub->add_option("--in", a->in, "text file, one text per line")->required();
  sub->add_option("--out", a->out, "output safetensors file (tensor \"embeddings\", N x d)")
      ->required();
  sub->add_option("--batch", a->batch, "texts per batch (sorted by length)")
      ->check(CLI::Range(1, 4096));
  cli::add_precision(sub, cli::PrecisionUse::inference);
  return {sub, [a] { return cmd_encode(a->model, a->in, a->out, a->batch); }};
}

cli::Command add_search(CLI::App& app) {
  struct Args {
    std::string model = default_model_dir(), collection, index;
    std::vector<std::string> queries;
    int64_t top_k = 5, batch = 32;
  };
  auto a = std::make_shared<Args>();
  auto* sub = app.add_subcommand(
      "search", "the texts of a collection most like each query (cosine), with scores");
  add_model_option(sub, a->model);
  sub->add_option("--collection", a->collection, "text file, one text per line")->required();
  sub->add_option("--index", a->index,
                  "the collection's index, built once (default: <collection>.index.safetensors)");
  sub->add_option("--query", a->queries, "a query (repeatable; none: one per stdin line)");
  sub->add_option("--top-k", a->top_k, "results per query")->check(CLI::Range(1, 1000));
  sub->add_option("--batch", a->batch, "texts per batch while indexing")
      ->check(CLI::Range(1, 4096));
  cli::add_precision(sub, cli::PrecisionUse::inference);
  return {sub, [a] {
            return cmd_search(a->model, a->collection, a->index, a->queries, a->top_k, a->batch);
          }};
}

cli::Command add_similarity(CLI::App& app) {
  struct Args {
    std::string model = default_model_dir(), a, b;
  };
  auto a = std::make_shared<Args>();
  auto* sub = app.add_subcommand("similarity", "the cosine of two texts' embeddings");
  add_model_option(sub, a->model);
  sub->add_option("a", a->a, "first text")->required();
  sub->add_option("b", a->b, "second text")->required();
  cli::add_precision(sub, cli::PrecisionUse::inference);
  return {sub, [a] { return cmd_similarity(a->model, a->a, a->b); }};
}

cli::Command add_tokenize(CLI::App& app) {
  struct Args {
    std::string model = default_model_dir();
    int64_t max_len = 512;
  };
  auto a = std::make_shared<Args>();
  auto* sub = app.add_subcommand("tokenize", "the token ids ([CLS] ... [SEP]) of each stdin line");
  add_model_option(sub, a->model);
  sub->add_option("--max-len", a->max_len, "ids per line at most")
      ->check(CLI::Range(int64_t(2), int64_t(1) << 30));
  return {sub, [a] { return cmd_tokenize(a->model, a->max_len); }};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "graft sentence embeddings from a pretrained BERT-family encoder: encode, search, "
      "similarity"};
  app.require_subcommand(1);
  cli::show_defaults(app);
  const std::vector<cli::Command> commands = {add_encode(app), add_search(app), add_similarity(app),
                                              add_tokenize(app)};
  return cli::run_commands(app, commands, argc, argv);
}
