// Tests for text::ByteLevelBPE (nn/text/bpe.h) on small tokenizer.json files written here: the
// byte table, the merge order, ignore_merges, added tokens, NFC, the pre-tokenizers' whitespace,
// the template, decoding and streaming, and every refused field. The check against `tokenizers`
// on every line of the fortune files is tests/bpe_reference.sh.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "graft/nn/text/bpe.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;
using namespace graft;
using namespace graft::text;
using graft::testing::TempDir;
using nlohmann::json;

namespace {

using Ids = std::vector<int64_t>;

// GPT-2's bytes_to_unicode, written out again: printable Latin-1 bytes stand for themselves,
// the other 68 for U+0100 onwards in byte order.
std::string byte_char(int b) {
  int next = 0x100, c = b;
  for (int x = 0; x <= b; ++x) {
    const bool itself = (x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE;
    if (x == b && !itself) c = next;
    if (!itself) ++next;
  }
  std::string s;
  if (c < 0x80) s += (char)c;
  else s += (char)(0xC0 | (c >> 6)), s += (char)(0x80 | (c & 0x3F));
  return s;
}

// A GPT-2 style tokenizer.json: the 256 byte tokens (id = byte), no merges yet.
json gpt2_doc() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  json model = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", false},
                {"vocab", vocab},
                {"merges", json::array()}};
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer",
           {{"type", "ByteLevel"},
            {"add_prefix_space", false},
            {"trim_offsets", true},
            {"use_regex", true}}},
          {"post_processor", {{"type", "ByteLevel"}, {"trim_offsets", false}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", model}};
}

// Appends the merge (a, b), adding a + b to the vocabulary when new.
void add_merge(json& doc, const std::string& a, const std::string& b) {
  json& vocab = doc["model"]["vocab"];
  doc["model"]["merges"].push_back({a, b});
  if (!vocab.contains(a + b)) vocab[a + b] = vocab.size();
}

json added_token(int64_t id, const std::string& content, bool special) {
  return {{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", special}};
}

// Adds an added token with the next id and returns that id.
int64_t add_token(json& doc, json token) {
  const int64_t id = (int64_t)doc["model"]["vocab"].size() + (int64_t)doc["added_tokens"].size();
  token["id"] = id;
  doc["added_tokens"].push_back(token);
  return id;
}

ByteLevelBPE load(const json& doc) {
  TempDir dir("bpe");
  std::ofstream(dir / "tokenizer.json") << doc.dump();
  return ByteLevelBPE::from_tokenizer_json(dir / "tokenizer.json");
}

template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no graft::Error>";
}

std::string load_error(const json& doc) {
  return error_of([&] { load(doc); });
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

Ids ids_of(const ByteLevelBPE& bpe, const std::vector<std::string>& tokens) {
  Ids ids;
  for (const std::string& t : tokens) ids.push_back(bpe.token_to_id(t).value_or(-1));
  return ids;
}

std::string bytes(std::initializer_list<int> values) {
  std::string s;
  for (const int v : values) s.push_back((char)v);
  return s;
}

}  // namespace

BOOST_AUTO_TEST_CASE(byte_table_maps_every_byte_as_gpt2_does) {
  const ByteLevelBPE bpe = load(gpt2_doc());
  BOOST_TEST(bpe.vocab_size() == 256);
  BOOST_TEST(bpe.id_to_token(0x00) == "\u0100");
  BOOST_TEST(bpe.id_to_token(0x20) == "\u0120");  // Ġ
  BOOST_TEST(bpe.id_to_token(0x7F) == "\u0121");
  BOOST_TEST(bpe.id_to_token(0xA0) == "\u0142");
  BOOST_TEST(bpe.id_to_token(0xAD) == "\u0143");
  BOOST_TEST(bpe.id_to_token(0xFF) == "\u00FF");
  BOOST_TEST(bpe.id_to_token('A') == "A");
  BOOST_TEST(bpe.encode(std::string(1, '\0'), false) == Ids{0x00},
             boost::test_tools::per_element());
  BOOST_TEST(bpe.encode("\x7F", false) == Ids{0x7F}, boost::test_tools::per_element());
  // U+00A0, U+00AD, U+00FF are two bytes each.
  BOOST_TEST(
      bpe.encode("a\u00A0\u00AD\u00FF", false) == (Ids{'a', 0xC2, 0xA0, 0xC2, 0xAD, 0xC3, 0xBF}),
      boost::test_tools::per_element());
  std::string all;
  Ids every;
  for (int b = 0; b < 256; ++b) all.push_back((char)b), every.push_back(b);
  BOOST_TEST(bpe.decode(every) == utf8_lossy(all));
  for (int b = 0; b < 256; ++b) BOOST_TEST(bpe.token_bytes(b) == std::string(1, (char)b));
}

BOOST_AUTO_TEST_CASE(merges_apply_lowest_rank_first_and_leftmost_among_equals) {
  json doc = gpt2_doc();
  add_merge(doc, "a", "b");
  add_merge(doc, "b", "c");
  const ByteLevelBPE ab_first = load(doc);
  BOOST_TEST(ab_first.encode("abc", false) == ids_of(ab_first, {"ab", "c"}),
             boost::test_tools::per_element());
  json reversed = gpt2_doc();
  add_merge(reversed, "b", "c");
  add_merge(reversed, "a", "b");
  const ByteLevelBPE bc_first = load(reversed);
  BOOST_TEST(bc_first.encode("abc", false) == ids_of(bc_first, {"a", "bc"}),
             boost::test_tools::per_element());
  json aa = gpt2_doc();
  add_merge(aa, "a", "a");
  add_merge(aa, "aa", "aa");
  const ByteLevelBPE a = load(aa);
  BOOST_TEST(a.encode("aaa", false) == ids_of(a, {"aa", "a"}), boost::test_tools::per_element());
  BOOST_TEST(a.encode("aaaaa", false) == ids_of(a, {"aaaa", "a"}),
             boost::test_tools::per_element());
  // Words are merged apart: the space starts the next word's token (Ġ).
  add_merge(aa, "\u0120", "a");
  const ByteLevelBPE spaced = load(aa);
  BOOST_TEST(spaced.encode("aa a", false) == ids_of(spaced, {"aa", "\u0120a"}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(merges_read_as_strings_or_pairs_alike) {
  json pairs = gpt2_doc();
  add_merge(pairs, "h", "e");
  add_merge(pairs, "l", "l");
  add_merge(pairs, "he", "ll");
  json strings = pairs;
  for (json& m : strings["model"]["merges"])
    m = m[0].get<std::string>() + " " + m[1].get<std::string>();
  BOOST_TEST(strings["model"]["merges"][2] == "he ll");
  const Ids expected = ids_of(load(pairs), {"hell", "o"});
  BOOST_TEST(load(pairs).encode("hello", false) == expected, boost::test_tools::per_element());
  BOOST_TEST(load(strings).encode("hello", false) == expected, boost::test_tools::per_element());
}

// 100 000 bytes of one word: the queue of pairs keeps it O(n log n), not O(n^2).
BOOST_AUTO_TEST_CASE(a_long_word_merges_in_one_pass_of_the_queue) {
  json doc = gpt2_doc();
  std::string piece = "a";
  for (int k = 0; k < 4; ++k) add_merge(doc, piece, piece), piece += piece;  // up to a^16
  const ByteLevelBPE bpe = load(doc);
  const Ids ids = bpe.encode(std::string(100000, 'a'), false);
  BOOST_TEST(ids.size() == 6250u);
  BOOST_TEST(std::count(ids.begin(), ids.end(), *bpe.token_to_id(std::string(16, 'a'))) == 6250);
  BOOST_TEST(bpe.encode(std::string(100001, 'a'), false).size() == 6251u);
}

BOOST_AUTO_TEST_CASE(ignore_merges_takes_a_word_in_the_vocabulary_whole) {
  json doc = gpt2_doc();
  add_merge(doc, "a", "b");
  doc["model"]["vocab"]["abc"] = doc["model"]["vocab"].size();  // no merge makes it
  const ByteLevelBPE merging = load(doc);
  BOOST_TEST(merging.encode("abc", false) == ids_of(merging, {"ab", "c"}),
             boost::test_tools::per_element());
  doc["model"]["ignore_merges"] = true;
  const ByteLevelBPE whole = load(doc);
  BOOST_TEST(whole.encode("abc", false) == ids_of(whole, {"abc"}),
             boost::test_tools::per_element());
  BOOST_TEST(whole.encode("abcd", false) == ids_of(whole, {"ab", "c", "d"}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(added_tokens_split_first_with_strip_and_word_rules) {
  json doc = gpt2_doc();
  const int64_t eos = add_token(doc, added_token(0, "<|endoftext|>", true));
  json mask = added_token(0, "<mask>", true);
  mask["lstrip"] = true;
  const int64_t m = add_token(doc, mask);
  json right = added_token(0, "<r>", false);
  right["rstrip"] = true;
  const int64_t r = add_token(doc, right);
  json word = added_token(0, "xy", false);
  word["single_word"] = true;
  const int64_t xy = add_token(doc, word);
  const int64_t longer = add_token(doc, added_token(0, "<|endoftext|>!", false));
  const ByteLevelBPE bpe = load(doc);
  BOOST_TEST(bpe.encode("a<|endoftext|>b", false) == (Ids{'a', eos, 'b'}),
             boost::test_tools::per_element());
  BOOST_TEST(bpe.encode("<|endoftext|>!", false) == Ids{longer}, boost::test_tools::per_element());
  BOOST_TEST(bpe.encode("a  <mask>b", false) == (Ids{'a', m, 'b'}),
             boost::test_tools::per_element());
  BOOST_TEST(bpe.encode("a<r> \t b", false) == (Ids{'a', r, 'b'}),
             boost::test_tools::per_element());
  BOOST_TEST(bpe.encode("a xy b", false) == (Ids{'a', ' ', xy, ' ', 'b'}),
             boost::test_tools::per_element());
  BOOST_TEST(bpe.encode("axy", false) == (Ids{'a', 'x', 'y'}), boost::test_tools::per_element());
  BOOST_TEST(bpe.special_ids() == (Ids{eos, m}), boost::test_tools::per_element());
  BOOST_TEST(bpe.decode({'a', eos, 'b', xy}) == "a<|endoftext|>bxy");
  BOOST_TEST(bpe.decode({'a', eos, 'b', xy}, true) == "abxy");
  BOOST_TEST(bpe.vocab_size() == longer + 1);
  BOOST_TEST(*bpe.token_to_id("<mask>") == m);
}

BOOST_AUTO_TEST_CASE(nfc_normalises_text_and_normalised_added_tokens) {
  json doc = gpt2_doc();
  doc["normalizer"] = {{"type", "Sequence"}, {"normalizers", json::array({{{"type", "NFC"}}})}};
  json accented = added_token(0, "e\u0301!", false);  // decomposed in the file
  accented["normalized"] = true;
  const int64_t e = add_token(doc, accented);
  const ByteLevelBPE bpe = load(doc);
  BOOST_TEST(bpe.encode("cafe\u0301", false) == bpe.encode("caf\u00E9", false),
             boost::test_tools::per_element());
  BOOST_TEST(bpe.encode("caf\u00E9", false) == (Ids{'c', 'a', 'f', 0xC3, 0xA9}),
             boost::test_tools::per_element());
  BOOST_TEST(bpe.encode("x\u00E9!", false) == (Ids{'x', e}), boost::test_tools::per_element());
  BOOST_TEST(bpe.encode("xe\u0301!", false) == (Ids{'x', e}), boost::test_tools::per_element());
}

// \x0B and \x85 are whitespace to tokenizers (Oniguruma's \s is White_Space): each one of a run
// before a word is its own piece, so the merge of two never applies there.
BOOST_AUTO_TEST_CASE(vertical_tab_and_next_line_are_whitespace_to_the_regex) {
  for (const bool split : {false, true}) {
    json doc = gpt2_doc();
    add_merge(doc, byte_char(0x0B), byte_char(0x0B));
    add_merge(doc, byte_char(0xC2), byte_char(0x85));
    add_merge(doc, byte_char(0xC2) + byte_char(0x85), byte_char(0xC2) + byte_char(0x85));
    if (split) {
      const std::string cl100k =
          R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
      doc["pre_tokenizer"] = {
          {"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"},
             {"pattern", {{"Regex", cl100k}}},
             {"behavior", "Isolated"},
             {"invert", false}},
            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
    }
    const ByteLevelBPE bpe = load(doc);
    const int64_t vt = 0x0B, vt2 = *bpe.token_to_id(byte_char(0x0B) + byte_char(0x0B));
    const int64_t nel = *bpe.token_to_id(byte_char(0xC2) + byte_char(0x85));
    BOOST_TEST(bpe.encode("a\x0B\x0B"
                          "b",
                          false) == (Ids{'a', vt, vt, 'b'}),
               boost::test_tools::per_element());
    BOOST_TEST(bpe.encode("a\u0085\u0085"
                          "b",
                          false) == (Ids{'a', nel, nel, 'b'}),
               boost::test_tools::per_element());
    BOOST_TEST(bpe.encode("a\x0B\x0B", false) == (Ids{'a', vt2}), boost::test_tools::per_element());
  }
}

BOOST_AUTO_TEST_CASE(gpt2_regex_splits_contractions_numbers_and_prefix_space) {
  json doc = gpt2_doc();
  add_merge(doc, "'", "s");
  add_merge(doc, "\u0120", "1");
  const ByteLevelBPE bpe = load(doc);
  BOOST_TEST(bpe.encode("it's 1", false) == ids_of(bpe, {"i", "t", "'s", "\u01201"}),
             boost::test_tools::per_element());
  doc["pre_tokenizer"]["add_prefix_space"] = true;
  const ByteLevelBPE prefixed = load(doc);
  BOOST_TEST(prefixed.encode("1", false) == ids_of(prefixed, {"\u01201"}),
             boost::test_tools::per_element());
  BOOST_TEST(prefixed.encode(" 1", false) == ids_of(prefixed, {"\u01201"}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(template_adds_bos_with_special_tokens) {
  json doc = gpt2_doc();
  const int64_t bos = add_token(doc, added_token(0, "<|begin_of_text|>", true));
  const int64_t eot = add_token(doc, added_token(0, "<|eot|>", true));
  json special = {
      {"<|begin_of_text|>",
       {{"id", "<|begin_of_text|>"}, {"ids", {bos}}, {"tokens", {"<|begin_of_text|>"}}}},
      {"<|eot|>", {{"id", "<|eot|>"}, {"ids", {eot}}, {"tokens", {"<|eot|>"}}}}};
  json tmpl = {{"type", "TemplateProcessing"},
               {"single",
                {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                 {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                 {{"SpecialToken", {{"id", "<|eot|>"}, {"type_id", 0}}}}}},
               {"pair", json::array()},
               {"special_tokens", special}};
  doc["post_processor"] = {{"type", "Sequence"}, {"processors", {{{"type", "ByteLevel"}}, tmpl}}};
  const ByteLevelBPE bpe = load(doc);
  BOOST_TEST(bpe.encode("hi") == (Ids{bos, 'h', 'i', eot}), boost::test_tools::per_element());
  BOOST_TEST(bpe.encode("hi", false) == (Ids{'h', 'i'}), boost::test_tools::per_element());
  BOOST_TEST(bpe.encode("") == (Ids{bos, eot}), boost::test_tools::per_element());
  BOOST_TEST(*bpe.bos_id() == bos);
  BOOST_TEST(bpe.decode(bpe.encode("hi"), true) == "hi");
  BOOST_TEST(!load(gpt2_doc()).bos_id());
}

BOOST_AUTO_TEST_CASE(decode_is_lossy_utf8_and_round_trips_text) {
  json doc = gpt2_doc();
  add_merge(doc, "\u0120", "w");
  const ByteLevelBPE bpe = load(doc);
  for (const std::string text :
       {"hello world", "\u00E9t\u00E9 \u20AC5 \U0001F600", " \t\r x  ", ""})
    BOOST_TEST(bpe.decode(bpe.encode(text)) == text);
  BOOST_TEST(bpe.decode({0xC3}) == "\uFFFD");
  BOOST_TEST(bpe.decode({0xE2, 0x82, 'a'}) == "\uFFFDa");              // one maximal subpart
  BOOST_TEST(bpe.decode({0xF0, 0x80, 'a'}) == "\uFFFD\uFFFDa");        // 80 cannot follow F0
  BOOST_TEST(bpe.decode({0xED, 0xA0, 0x80}) == "\uFFFD\uFFFD\uFFFD");  // a surrogate
  BOOST_TEST(utf8_lossy(bytes({0xFF, 'a', 0xC3, 0xA9})) == "\uFFFDa\u00E9");
  BOOST_TEST(contains(error_of([&] { bpe.decode({100000}); }), "the id 100000 has no token"));
  BOOST_TEST(contains(error_of([&] { bpe.id_to_token(-1); }), "the id -1 has no token"));
  BOOST_TEST(!bpe.token_to_id("nope"));
}

BOOST_AUTO_TEST_CASE(stream_decoder_holds_back_a_split_character) {
  json doc = gpt2_doc();
  const int64_t eos = add_token(doc, added_token(0, "<|endoftext|>", true));
  const ByteLevelBPE bpe = load(doc);
  BPEStreamDecoder stream(bpe, true);
  BOOST_TEST(stream.push('a') == "a");
  BOOST_TEST(stream.push(0xE2) == "");  // € is E2 82 AC
  BOOST_TEST(stream.pending_bytes() == 1u);
  BOOST_TEST(stream.push(0x82) == "");
  BOOST_TEST(stream.push(eos) == "");  // skipped
  BOOST_TEST(stream.push(0xAC) == "\u20AC");
  BOOST_TEST(stream.push(0xFF) == "\uFFFD");  // never valid: out at once
  BOOST_TEST(stream.push(0xE2) == "");
  BOOST_TEST(stream.push('b') == "\uFFFDb");
  BOOST_TEST(stream.push(0xF0) == "");
  BOOST_TEST(stream.finish() == "\uFFFD");
  BOOST_TEST(stream.pending_bytes() == 0u);
  // Pushed one at a time, any ids give decode's text.
  const Ids ids = {'x', 0xF0, 0x9F, 0x98, 0x80, 0xC3, 0xE2, 0x82, 'y', eos, 0xED, 0xA0, 0xC3};
  BPEStreamDecoder all(bpe);
  std::string text;
  for (const int64_t id : ids) text += all.push(id);
  BOOST_TEST(text + all.finish() == bpe.decode(ids));
}

BOOST_AUTO_TEST_CASE(invalid_utf8_text_names_the_byte) {
  const ByteLevelBPE bpe = load(gpt2_doc());
  BOOST_TEST(error_of([&] { bpe.encode("abc\xC3(", false); }) ==
             "ByteLevelBPE: the text is not valid UTF-8 at byte 3 (\\xC3()");
  BOOST_TEST(contains(error_of([&] { bpe.encode("\xED\xA0\x80"); }), "at byte 0"));
}

BOOST_AUTO_TEST_CASE(model_fields_it_does_not_do_are_refused_by_path) {
  auto refused = [](const char* key, json value) {
    json doc = gpt2_doc();
    doc["model"][key] = value;
    return load_error(doc);
  };
  BOOST_TEST(
      contains(refused("type", "WordPiece"), "model.type \"WordPiece\" is not supported (BPE)"));
  BOOST_TEST(contains(refused("dropout", 0.1), "model.dropout 0.1 is not supported"));
  BOOST_TEST(refused("dropout", 0.0) == "<no graft::Error>");
  BOOST_TEST(contains(refused("continuing_subword_prefix", "##"),
                      "model.continuing_subword_prefix \"##\""));
  BOOST_TEST(contains(refused("end_of_word_suffix", "</w>"), "model.end_of_word_suffix \"</w>\""));
  BOOST_TEST(contains(refused("byte_fallback", true), "model.byte_fallback true is not supported"));
  BOOST_TEST(contains(refused("ignore_merges", 1), "model.ignore_merges must be true or false"));
  BOOST_TEST(contains(refused("vocab", json::array()), "model.vocab must be an object"));
  BOOST_TEST(contains(refused("merges", "a b"), "model.merges must be a list"));
  json untyped = gpt2_doc();
  untyped["model"].erase("type");
  BOOST_TEST(contains(load_error(untyped), "model.type null is not supported (BPE)"));
  json no_model = gpt2_doc();
  no_model.erase("model");
  BOOST_TEST(contains(load_error(no_model), "model.type null is not supported (BPE)"));
  json missing_byte = gpt2_doc();
  missing_byte["model"]["vocab"].erase("A");
  BOOST_TEST(
      contains(load_error(missing_byte), "model.vocab has no token \"A\" for the byte 0x41"));
  json twice = gpt2_doc();
  twice["model"]["vocab"]["zz"] = 5;
  BOOST_TEST(contains(load_error(twice), "has the id 5 of"));
  json negative = gpt2_doc();
  negative["model"]["vocab"]["zz"] = -1;
  BOOST_TEST(contains(load_error(negative), "model.vocab[\"zz\"] must be a non-negative id"));
}

BOOST_AUTO_TEST_CASE(merges_outside_the_vocabulary_are_refused_naming_them) {
  json doc = gpt2_doc();
  add_merge(doc, "a", "b");
  json left = doc;
  left["model"]["merges"].push_back({"xyz", "b"});
  BOOST_TEST(
      contains(load_error(left),
               "model.merges[1] (\"xyz\", \"b\"): its left part \"xyz\" is not in model.vocab"));
  json right = doc;
  right["model"]["merges"].push_back({"a", "q!"});
  BOOST_TEST(contains(load_error(right), "its right part \"q!\""));
  json result = doc;
  result["model"]["merges"].push_back({"b", "a"});  // "ba" is not in the vocabulary
  BOOST_TEST(contains(load_error(result), "model.merges[1] (\"b\", \"a\"): its result \"ba\""));
  json spaces = doc;
  spaces["model"]["merges"].push_back("a b c");
  BOOST_TEST(contains(load_error(spaces), "model.merges[1] \"a b c\" is not two tokens"));
  json single = doc;
  single["model"]["merges"].push_back({"a"});
  BOOST_TEST(contains(load_error(single), "model.merges[1] must be \"a b\" or [\"a\", \"b\"]"));
}

BOOST_AUTO_TEST_CASE(pipeline_types_it_does_not_do_are_refused_by_path) {
  auto with = [](const char* key, json value) {
    json doc = gpt2_doc();
    doc[key] = value;
    return load_error(doc);
  };
  BOOST_TEST(contains(with("normalizer", {{"type", "Lowercase"}}),
                      "normalizer.type \"Lowercase\" is not supported"));
  BOOST_TEST(contains(
      with("normalizer",
           {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "Strip"}}}}}),
      "normalizer.normalizers[1].type \"Strip\""));
  BOOST_TEST(
      contains(with("pre_tokenizer", {{"type", "Metaspace"}}), "pre_tokenizer.type \"Metaspace\""));
  BOOST_TEST(contains(with("pre_tokenizer", nullptr), "pre_tokenizer.type null is not supported"));
  json split = {{"type", "Split"},
                {"pattern", {{"Regex", "\\s+"}}},
                {"behavior", "Isolated"},
                {"invert", false}};
  json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
  auto sequence = [](json a, json b) {
    return json{{"type", "Sequence"}, {"pretokenizers", {a, b}}};
  };
  json removed = split;
  removed["behavior"] = "Removed";
  BOOST_TEST(
      contains(with("pre_tokenizer", sequence(removed, byte_level)),
               "pre_tokenizer.pretokenizers[0].behavior \"Removed\" is not supported (Isolated)"));
  json inverted = split;
  inverted["invert"] = true;
  BOOST_TEST(contains(with("pre_tokenizer", sequence(inverted, byte_level)),
                      "pre_tokenizer.pretokenizers[0].invert true"));
  json bad_regex = split;
  bad_regex["pattern"] = {{"Regex", "(a"}};
  BOOST_TEST(contains(with("pre_tokenizer", sequence(bad_regex, byte_level)),
                      "pre_tokenizer.pretokenizers[0].pattern.Regex \"(a\" is not a regular "
                      "expression ICU accepts"));
  json no_pattern = split;
  no_pattern["pattern"] = "x";
  BOOST_TEST(contains(with("pre_tokenizer", sequence(no_pattern, byte_level)),
                      "pre_tokenizer.pretokenizers[0].pattern must be"));
  BOOST_TEST(contains(with("pre_tokenizer", split), "pre_tokenizer does not end with a ByteLevel"));
  BOOST_TEST(contains(with("pre_tokenizer", sequence(byte_level, split)),
                      "pre_tokenizer.pretokenizers[1] follows the ByteLevel"));
  BOOST_TEST(contains(with("post_processor", {{"type", "RobertaProcessing"}}),
                      "post_processor.type \"RobertaProcessing\""));
  BOOST_TEST(contains(with("decoder", {{"type", "WordPiece"}}),
                      "decoder.type \"WordPiece\" is not supported (ByteLevel)"));
  BOOST_TEST(contains(with("decoder", nullptr), "decoder.type null"));
  BOOST_TEST(contains(with("truncation", {{"max_length", 8}}),
                      "truncation {\"max_length\":8} is not supported"));
  BOOST_TEST(
      contains(with("padding", {{"strategy", {{"Fixed", 8}}}}), "padding.strategy {\"Fixed\":8}"));
  BOOST_TEST(with("padding", {{"strategy", "BatchLongest"}, {"pad_to_multiple_of", nullptr}}) ==
             "<no graft::Error>");
}

BOOST_AUTO_TEST_CASE(split_with_a_literal_string_isolates_it) {
  json doc = gpt2_doc();
  add_merge(doc, "a", "b");
  doc["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"},
         {"pattern", {{"String", "b+"}}},
         {"behavior", "Isolated"},
         {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  const ByteLevelBPE bpe = load(doc);
  BOOST_TEST(bpe.encode("ab+ab", false) == (Ids{'a', 'b', '+', *bpe.token_to_id("ab")}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(templates_and_added_tokens_it_cannot_read_are_refused_by_path) {
  json doc = gpt2_doc();
  add_token(doc, added_token(0, "<s>", true));
  auto with_single = [&](json single) {
    json d = doc;
    d["post_processor"] = {
        {"type", "TemplateProcessing"},
        {"single", single},
        {"special_tokens",
         {{"<s>", {{"id", "<s>"}, {"ids", {256}}}}, {"<x>", {{"id", "<x>"}, {"ids", {999}}}}}}};
    return load_error(d);
  };
  json a = {{"Sequence", {{"id", "A"}, {"type_id", 0}}}};
  json b = {{"Sequence", {{"id", "B"}, {"type_id", 0}}}};
  json s = {{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}};
  json x = {{"SpecialToken", {{"id", "<x>"}, {"type_id", 0}}}};
  BOOST_TEST(with_single({s, a}) == "<no graft::Error>");
  BOOST_TEST(
      contains(with_single({s}), "post_processor.single has no {\"Sequence\": {\"id\": \"A\"}}"));
  BOOST_TEST(contains(with_single({a, b}), "post_processor.single[1] {\"Sequence\":{\"id\":\"B\""));
  BOOST_TEST(contains(
      with_single({x, a}),
      "post_processor.single[0] names special_tokens[\"<x>\"], whose id 999 has no token"));
  json clash = gpt2_doc();
  clash["added_tokens"].push_back(added_token(7, "A", true));  // "A" is 65
  BOOST_TEST(contains(load_error(clash),
                      "added_tokens[0].id 7 of \"A\" is not its id 65 in the vocabulary"));
  json taken = gpt2_doc();
  taken["added_tokens"].push_back(added_token(65, "<s>", true));
  BOOST_TEST(contains(load_error(taken), "added_tokens[0].id 65 of \"<s>\" is the id of \"A\""));
  json empty = gpt2_doc();
  empty["added_tokens"].push_back(added_token(300, "", true));
  BOOST_TEST(contains(load_error(empty), "added_tokens[0].content must be a non-empty string"));
  json flag = gpt2_doc();
  json token = added_token(300, "<s>", true);
  token["lstrip"] = "yes";
  flag["added_tokens"].push_back(token);
  BOOST_TEST(contains(load_error(flag), "added_tokens[0].lstrip must be true or false"));
}

BOOST_AUTO_TEST_CASE(files_that_are_not_tokenizer_json_are_refused) {
  TempDir dir("bpe");
  const std::string missing = dir / "missing.json";
  BOOST_TEST(error_of([&] { ByteLevelBPE::from_tokenizer_json(missing); }) ==
             "ByteLevelBPE: '" + missing + "': no such file");
  const std::string broken = dir / "broken.json";
  std::ofstream(broken) << "{\"model\": ";
  BOOST_TEST(contains(error_of([&] { ByteLevelBPE::from_tokenizer_json(broken); }),
                      "ByteLevelBPE: '" + broken + "'"));
  const std::string list = dir / "list.json";
  std::ofstream(list) << "[1, 2]";
  BOOST_TEST(error_of([&] { ByteLevelBPE::from_tokenizer_json(list); }) ==
             "ByteLevelBPE: '" + list + "': not a JSON object");
  // Refused by its size before a byte is read (a sparse file costs no disk).
  const std::string huge = dir / "huge.json";
  std::ofstream(huge) << "{}";
  fs::resize_file(huge, ByteLevelBPE::kMaxFileBytes + 1);
  BOOST_TEST(
      contains(error_of([&] { ByteLevelBPE::from_tokenizer_json(huge); }), "over the limit of"));
  BOOST_TEST(error_of([&] { ByteLevelBPE::from_tokenizer_json(dir.path.string()); }) ==
             "ByteLevelBPE: '" + dir.path.string() + "': not a regular file");
}

// The added tokens are found leftmost, then longest, as a plain scan that tries every token at
// every byte finds them, overlapping tokens included (the automaton's pass must agree with it).
BOOST_AUTO_TEST_CASE(added_tokens_match_leftmost_longest_as_a_plain_scan) {
  const std::vector<std::string> tokens = {"ab", "abcd", "bc", "cda", "ea", "bcdab", "dd"};
  json doc = gpt2_doc();
  std::vector<int64_t> token_ids;
  for (const std::string& t : tokens) token_ids.push_back(add_token(doc, added_token(0, t, false)));
  const ByteLevelBPE bpe = load(doc);
  uint32_t state = 12345;
  for (int round = 0; round < 200; ++round) {
    std::string text;
    for (int k = 0; k < 60; ++k) {
      state = state * 1664525u + 1013904223u;
      text.push_back("abcde"[(state >> 16) % 5]);
    }
    Ids expected;  // no merges: text outside the added tokens is one id per byte
    for (size_t i = 0; i < text.size();) {
      size_t best = tokens.size();
      for (size_t t = 0; t < tokens.size(); ++t)
        if (text.compare(i, tokens[t].size(), tokens[t]) == 0 &&
            (best == tokens.size() || tokens[t].size() > tokens[best].size()))
          best = t;
      if (best == tokens.size()) {
        expected.push_back((unsigned char)text[i++]);
      } else {
        expected.push_back(token_ids[best]);
        i += tokens[best].size();
      }
    }
    BOOST_TEST(bpe.encode(text, false) == expected, boost::test_tools::per_element());
  }
}
