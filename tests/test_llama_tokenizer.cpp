// Tests for text::LlamaTokenizer and text::LlamaStreamDecoder (nn/text/llama_tokenizer.h) on
// SentencePiece BPE models trained here by libsentencepiece with Llama 2's settings (byte
// fallback, split digits, the dummy prefix, identity normalisation, <unk> 0, <s> 1, </s> 2): the
// BOS and EOS, the dummy prefix, digits, byte fallback, decoding without the special tokens and
// with invalid byte runs, the streaming decoder against decode() at every prefix, the settings of
// tokenizer_config.json, and the refused inputs. The check against Python's sentencepiece on
// every line of the fortune files is tests/spm_reference.sh.
#include <boost/test/unit_test.hpp>

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "graft/nn/text/llama_tokenizer.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;
using namespace graft;
using namespace graft::text;
using graft::testing::names;
using graft::testing::TempDir;

namespace {

using Ids = std::vector<int64_t>;

class Lines : public sentencepiece::SentenceIterator {
 public:
  explicit Lines(const std::vector<std::string>& v) : v_(v) {}
  bool done() const override { return i_ >= v_.size(); }
  void Next() override { ++i_; }
  const std::string& value() const override { return v_[i_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>& v_;
  size_t i_ = 0;
};

std::vector<std::string> corpus() {
  std::vector<std::string> lines;
  const char* words[] = {"the",   "quick", "brown",  "fox", "jumps", "over", "lazy", "dog",
                         "Hello", "world", "tokens", "in",  "2024",  "and",  "1999", "café"};
  for (int i = 0; i < 300; ++i) {
    std::string line;
    for (int k = 0; k < 8; ++k) line += std::string(k ? " " : "") + words[(i * 7 + k * 3) % 16];
    lines.push_back(line + (i % 3 ? "." : "  twice  spaced"));
  }
  return lines;
}

// A Llama-2-style model (remove_extra_whitespaces false), or with SentencePiece's default
// remove_extra_whitespaces true when `squeeze`, plus `extra` options; written to
// DIR/tokenizer.model.
std::string train_model(const fs::path& dir, bool squeeze = false,
                        const std::unordered_map<std::string, std::string>& extra = {}) {
  std::unordered_map<std::string, std::string> args = {
      {"model_type", "bpe"},
      {"vocab_size", "400"},
      {"byte_fallback", "true"},
      {"split_digits", "true"},
      {"add_dummy_prefix", "true"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", squeeze ? "true" : "false"},
      {"character_coverage", "1.0"},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      {"hard_vocab_limit", "false"},
      {"num_threads", "1"},
      {"minloglevel", "2"}};
  args.insert(extra.begin(), extra.end());
  const std::vector<std::string> lines = corpus();
  Lines it(lines);
  std::string proto;
  const auto status = sentencepiece::SentencePieceTrainer::Train(args, &it, &proto);
  BOOST_REQUIRE_MESSAGE(status.ok(), status.ToString());
  const std::string path = (dir / "tokenizer.model").string();
  std::ofstream(path, std::ios::binary) << proto;
  return path;
}

void write(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// The streaming decoder's text after each id: a prefix of decode(ids[0..n)), and with what a copy
// of the decoder still holds, all of it.
void check_stream(const LlamaTokenizer& tok, const Ids& ids) {
  LlamaStreamDecoder stream(tok);
  std::string printed;
  for (size_t n = 1; n <= ids.size(); ++n) {
    printed += stream.push(ids[n - 1]);
    const std::string want = tok.decode(Ids(ids.begin(), ids.begin() + n));
    BOOST_TEST(want.compare(0, printed.size(), printed) == 0);
    LlamaStreamDecoder rest = stream;
    BOOST_TEST(printed + rest.finish() == want);
    BOOST_TEST(stream.pending_bytes() <= 3u);
  }
}

const std::vector<std::string> kTexts = {"Hello world",
                                         " Hello world",
                                         "  two leading",
                                         "a  b   c",
                                         "trailing  ",
                                         "2024 and 1999",
                                         "x1y22z333",
                                         "caf\xc3\xa9 \xf0\x9f\x98\x80 \xe6\xbc\xa2\xe5\xad\x97!",
                                         "\xe2\x82\xac\n\t end",
                                         "",
                                         " ",
                                         "\xf0\x9f\x98\x80",
                                         "\xe2\x96\x81 literal mark"};

struct Model {
  TempDir dir{"llama_tok"};
  std::string path = train_model(dir.path);
  LlamaTokenizer tok{path};
};

Model& model() {
  static Model m;
  return m;
}

int64_t byte_id(const LlamaTokenizer& tok, int b) {
  char name[8];
  std::snprintf(name, sizeof name, "<0x%02X>", b);
  for (int64_t id = 0; id < tok.vocab_size(); ++id)
    if (tok.piece(id) == name) return id;
  BOOST_FAIL("no byte piece " << name);
  return -1;
}

}  // namespace

BOOST_AUTO_TEST_CASE(bos_first_and_ids_of_the_model) {
  const LlamaTokenizer& tok = model().tok;
  BOOST_TEST(tok.unk_id() == 0);
  BOOST_TEST(tok.bos_id() == 1);
  BOOST_TEST(tok.eos_id() == 2);
  BOOST_TEST(tok.adds_bos());
  BOOST_TEST(!tok.adds_eos());
  const Ids ids = tok.encode("Hello world");
  BOOST_REQUIRE(ids.size() >= 2u);
  BOOST_TEST(ids[0] == 1);
  BOOST_TEST(ids.back() != 2);
  BOOST_TEST(tok.encode("") == Ids{1});
  const LlamaTokenizer both(model().path, /*add_bos=*/true, /*add_eos=*/true);
  Ids want = ids;
  want.push_back(2);
  BOOST_TEST(both.encode("Hello world") == want);
  const LlamaTokenizer neither(model().path, false, false);
  BOOST_TEST(neither.encode("Hello world") == Ids(ids.begin() + 1, ids.end()));
}

BOOST_AUTO_TEST_CASE(dummy_prefix_and_spaces_round_trip) {
  const LlamaTokenizer& tok = model().tok;
  BOOST_TEST(tok.strips_first_space());
  const Ids ids = tok.encode("Hello");
  BOOST_TEST(tok.piece(ids[1]).rfind("\xe2\x96\x81", 0) == 0u);  // "▁" before the first word
  BOOST_TEST(tok.encode(" Hello") != ids);
  for (const std::string& t : kTexts)
    if (t.find("\xe2\x96\x81") == std::string::npos) BOOST_TEST(tok.decode(tok.encode(t)) == t);
  // "▁" in the text is SentencePiece's space already: it comes back as a space.
  BOOST_TEST(tok.decode(tok.encode("\xe2\x96\x81 literal mark")) == "  literal mark");
}

BOOST_AUTO_TEST_CASE(digits_split_one_a_piece) {
  const LlamaTokenizer& tok = model().tok;
  const Ids ids = tok.encode("2024 1999 x333");
  int digits = 0;
  for (size_t i = 1; i < ids.size(); ++i) {
    int in_piece = 0;
    for (char c : tok.decode({ids[i]})) in_piece += c >= '0' && c <= '9';
    BOOST_TEST(in_piece <= 1, tok.piece(ids[i]));
    digits += in_piece;
  }
  BOOST_TEST(digits == 11);
}

BOOST_AUTO_TEST_CASE(byte_fallback_round_trips_characters_outside_the_vocabulary) {
  const LlamaTokenizer& tok = model().tok;
  const std::string text = "\xf0\x9f\x98\x80\xe6\xbc\xa2";  // an emoji and a CJK character
  const Ids ids = tok.encode(text);
  int bytes = 0;
  for (int64_t id : ids) bytes += tok.is_byte(id);
  BOOST_TEST(bytes == 7);
  BOOST_TEST(tok.decode(ids) == text);
}

BOOST_AUTO_TEST_CASE(decode_leaves_out_special_tokens) {
  const LlamaTokenizer& tok = model().tok;
  const Ids ids = tok.encode("Hello world");
  Ids with = ids;
  with.insert(with.begin() + 2, {tok.eos_id(), tok.unk_id(), tok.bos_id()});
  with.push_back(tok.eos_id());
  BOOST_TEST(tok.decode(with) == "Hello world");
  BOOST_TEST(tok.is_special(tok.unk_id()));
  BOOST_TEST(!tok.is_special(ids[1]));
  // A special token first: the next piece's "▁" is still the prefix and dropped.
  BOOST_TEST(tok.decode({tok.bos_id(), ids[1]}) == "Hello");
}

BOOST_AUTO_TEST_CASE(invalid_byte_runs_give_one_replacement_per_byte) {
  const LlamaTokenizer& tok = model().tok;
  const std::string fffd = "\xef\xbf\xbd";
  const int64_t e2 = byte_id(tok, 0xE2), x82 = byte_id(tok, 0x82), xac = byte_id(tok, 0xAC);
  const int64_t hello = tok.encode("Hello")[1];
  BOOST_TEST(tok.decode({e2, x82, xac}) == "\xe2\x82\xac");
  BOOST_TEST(tok.decode({e2, x82, hello}) == fffd + fffd + " Hello");
  BOOST_TEST(tok.decode({x82, e2}) == fffd + fffd);
  BOOST_TEST(tok.decode({byte_id(tok, 0xC0), byte_id(tok, 0x80)}) == fffd + fffd);  // overlong
  BOOST_TEST(tok.decode({byte_id(tok, 0xED), byte_id(tok, 0xA0), byte_id(tok, 0x80)}) ==
             fffd + fffd + fffd);  // a surrogate
}

BOOST_AUTO_TEST_CASE(stream_equals_decode_at_every_prefix) {
  const LlamaTokenizer& tok = model().tok;
  for (const std::string& t : kTexts) check_stream(tok, tok.encode(t));
  // Random ids, bytes and specials among them: invalid and interrupted byte runs.
  std::mt19937 rng(7);
  std::uniform_int_distribution<int64_t> any(0, tok.vocab_size() - 1), bytes(0xC0, 0xF4);
  for (int row = 0; row < 200; ++row) {
    Ids ids;
    for (int k = 0; k < 12; ++k) {
      const int kind = (int)(rng() % 4);
      ids.push_back(kind == 0   ? byte_id(tok, (int)bytes(rng))
                    : kind == 1 ? byte_id(tok, 0x80 + (int)(rng() % 64))
                                : any(rng));
    }
    check_stream(tok, ids);
  }
}

BOOST_AUTO_TEST_CASE(stream_continues_a_prompt_with_its_space) {
  const LlamaTokenizer& tok = model().tok;
  const Ids all = tok.encode("Hello world");
  LlamaStreamDecoder stream(tok);
  const std::string prompt = stream.push(all[0]) + stream.push(all[1]);
  std::string rest;
  for (size_t i = 2; i < all.size(); ++i) rest += stream.push(all[i]);
  BOOST_TEST(prompt == "Hello");
  BOOST_TEST(rest + stream.finish() == " world");
}

BOOST_AUTO_TEST_CASE(remove_extra_whitespaces_model_streams_as_it_decodes) {
  TempDir dir("llama_tok_squeeze");
  const LlamaTokenizer tok(train_model(dir.path, /*squeeze=*/true));
  for (const std::string& t : kTexts) check_stream(tok, tok.encode(t));
  std::mt19937 rng(11);
  std::uniform_int_distribution<int64_t> any(0, tok.vocab_size() - 1);
  for (int row = 0; row < 100; ++row) {
    Ids ids;
    for (int k = 0; k < 8; ++k) ids.push_back(any(rng));
    check_stream(tok, ids);
  }
}

BOOST_AUTO_TEST_CASE(hf_dir_reads_tokenizer_config_and_checks_vocab_size) {
  TempDir dir("llama_tok_dir");
  train_model(dir.path);
  BOOST_TEST(LlamaTokenizer::from_hf_dir(dir.path.string()).adds_bos());
  write(dir.path / "tokenizer_config.json", R"({"add_bos_token": false, "add_eos_token": true})");
  write(dir.path / "config.json", R"({"vocab_size": 32000})");
  const LlamaTokenizer tok = LlamaTokenizer::from_hf_dir(dir.path.string());
  BOOST_TEST(!tok.adds_bos());
  BOOST_TEST(tok.adds_eos());
  BOOST_TEST(tok.encode("Hello").back() == tok.eos_id());
  write(dir.path / "config.json", R"({"vocab_size": 300})");
  BOOST_CHECK_EXCEPTION(LlamaTokenizer::from_hf_dir(dir.path.string()), Error, [&](const Error& e) {
    return names(e, "more than the vocab_size 300 of '" + (dir.path / "config.json").string());
  });
  write(dir.path / "config.json", R"({"vocab_size": "many"})");
  BOOST_CHECK_EXCEPTION(LlamaTokenizer::from_hf_dir(dir.path.string()), Error,
                        [](const Error& e) { return names(e, "'vocab_size' is \"many\""); });
  write(dir.path / "config.json", "{}");
  write(dir.path / "tokenizer_config.json", R"({"add_bos_token": "yes"})");
  BOOST_CHECK_EXCEPTION(LlamaTokenizer::from_hf_dir(dir.path.string()), Error, [](const Error& e) {
    return names(e, "tokenizer_config.json': 'add_bos_token' is \"yes\", not true or false");
  });
  write(dir.path / "tokenizer_config.json", "[1]");
  BOOST_CHECK_EXCEPTION(LlamaTokenizer::from_hf_dir(dir.path.string()), Error,
                        [](const Error& e) { return names(e, "is not a JSON object"); });
}

BOOST_AUTO_TEST_CASE(refused_files_and_ids) {
  TempDir dir("llama_tok_bad");
  const std::string missing = (dir.path / "tokenizer.model").string();
  BOOST_CHECK_EXCEPTION(LlamaTokenizer{missing}, Error, [&](const Error& e) {
    return names(e, "'" + missing + "' does not exist");
  });
  write(dir.path / "tokenizer.model", "{\"not\": \"a model\"}");
  BOOST_CHECK_EXCEPTION(LlamaTokenizer{missing}, Error,
                        [](const Error& e) { return names(e, "is not a SentencePiece model"); });
  BOOST_CHECK_EXCEPTION(LlamaTokenizer{"/dev/zero"}, Error,
                        [](const Error& e) { return names(e, "not a regular file"); });
  // A denormaliser ("o" decoded as "0"): decoding no longer follows the pieces.
  write(dir.path / "denormalize.tsv", "6F\t30\n");
  train_model(dir.path, false,
              {{"denormalization_rule_tsv", (dir.path / "denormalize.tsv").string()}});
  BOOST_CHECK_EXCEPTION(LlamaTokenizer{missing}, Error,
                        [](const Error& e) { return names(e, "(a denormaliser): not supported"); });
  const LlamaTokenizer& tok = model().tok;
  const std::string past = "LlamaTokenizer::decode: id " + std::to_string(tok.vocab_size());
  BOOST_CHECK_EXCEPTION(tok.decode({5, tok.vocab_size()}), Error,
                        [&](const Error& e) { return names(e, past); });
  LlamaStreamDecoder stream(tok);
  BOOST_CHECK_EXCEPTION(stream.push(-1), Error, [](const Error& e) { return names(e, "id -1"); });
  BOOST_CHECK_EXCEPTION(tok.encode("bad \xff byte"), Error,
                        [](const Error& e) { return names(e, "not valid UTF-8 at byte 4"); });
}
