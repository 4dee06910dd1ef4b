// Tests for text::WordPiece (nn/text/wordpiece.h): BERT's normalisation, pre-tokenization and
// WordPiece on a small hand-made vocabulary, its errors, and ids that Hugging Face `tokenizers`
// 0.23.3 gives with all-MiniLM-L6-v2's tokenizer.json (where BUILD/pretrained has it). The check
// on every line of the fortune files is tests/wordpiece_reference.sh.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "graft/nn/text/wordpiece.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;
using namespace graft;
using namespace graft::text;
using graft::testing::TempDir;

namespace {

using Ids = std::vector<int64_t>;
using Words = std::vector<std::string>;

const std::vector<std::string> kVocab = {
    "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un",   "##aff", "##able", "aff",
    "able",  "hello", "world", ",",     "!",      "cafe", "caf",   "##é",    "日",
    "本",    "ab",    "c",     "d",     "##ef",   "x",    "##x"};

WordPiece small(WordPieceOptions o = {}) { return WordPiece(kVocab, o); }

// The ids of tokens of kVocab.
Ids ids_of(const std::vector<std::string>& tokens) {
  Ids ids;
  for (const std::string& t : tokens) ids.push_back(small().id(t));
  return ids;
}

void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
}

std::string vocab_txt(const std::vector<std::string>& tokens) {
  std::string s;
  for (const std::string& t : tokens) s += t + "\n";
  return s;
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

const fs::path kModel = fs::path(GRAFT_BUILD_DIR) / "pretrained" / "all-MiniLM-L6-v2";

boost::test_tools::assertion_result model_present(boost::unit_test::test_unit_id) {
  boost::test_tools::assertion_result r(fs::exists(kModel / "tokenizer.json"));
  r.message() << "no " << kModel.string() << " (examples/embed/fetch_model.sh fetches it)";
  return r;
}

}  // namespace

BOOST_AUTO_TEST_CASE(lowercases_and_splits_punctuation) {
  const WordPiece wp = small();
  BOOST_TEST(wp.basic_tokenize("HeLLo,WORLD!") == (Words{"hello", ",", "world", "!"}),
             boost::test_tools::per_element());
  BOOST_TEST(wp.encode("Hello, World!") == ids_of({"hello", ",", "world", "!"}),
             boost::test_tools::per_element());
  // ASCII symbols count as punctuation, Unicode's P* too (« » ¿ —), but not Unicode's symbols (∑).
  BOOST_TEST(wp.basic_tokenize("a$b^c«d»¿e—f∑g") ==
                 (Words{"a", "$", "b", "^", "c", "«", "d", "»", "¿", "e", "—", "f∑g"}),
             boost::test_tools::per_element());
  // Full lowercasing: İ is i and a combining dot (kept: accents are stripped before lowercasing).
  WordPieceOptions keep;
  keep.strip_accents = false;
  BOOST_TEST(small(keep).basic_tokenize("İSTANBUL ΣΑΣ") == (Words{"i\xCC\x87stanbul", "σασ"}),
             boost::test_tools::per_element());
  WordPieceOptions cased;
  cased.lowercase = false;
  BOOST_TEST(small(cased).basic_tokenize("Hello Café") == (Words{"Hello", "Café"}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(strips_accents_unless_told) {
  BOOST_TEST(small().encode("Café") == ids_of({"cafe"}), boost::test_tools::per_element());
  BOOST_TEST(small().basic_tokenize("naïve déjà") == (Words{"naive", "deja"}),
             boost::test_tools::per_element());
  WordPieceOptions keep;
  keep.strip_accents = false;  // lowercase stays on
  BOOST_TEST(small(keep).encode("CAFÉ") == ids_of({"caf", "##é"}),
             boost::test_tools::per_element());
  WordPieceOptions strip_cased;
  strip_cased.lowercase = false;
  strip_cased.strip_accents = true;
  BOOST_TEST(small(strip_cased).basic_tokenize("Café") == (Words{"Cafe"}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(spaces_cjk_ideographs) {
  BOOST_TEST(small().basic_tokenize("日本語のカナ") == (Words{"日", "本", "語", "のカナ"}),
             boost::test_tools::per_element());
  BOOST_TEST(small().encode("日本") == ids_of({"日", "本"}), boost::test_tools::per_element());
  WordPieceOptions off;
  off.handle_chinese_chars = false;
  BOOST_TEST(small(off).basic_tokenize("日本") == (Words{"日本"}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(cleans_control_characters_and_whitespace) {
  // \x01, U+200B (a format character), NUL and U+FFFD go; tab, newline, U+00A0 and U+3000 are
  // spaces.
  const std::string text = std::string("a\x01") + "b\tc\n\xC2\xA0" + "d\xE2\x80\x8B" + "e" +
                           std::string(1, '\0') + "f\xEF\xBF\xBDg\xE3\x80\x80x";
  BOOST_TEST(small().basic_tokenize(text) == (Words{"ab", "c", "defg", "x"}),
             boost::test_tools::per_element());
  BOOST_TEST(small().normalize("A\rB\x7F") == "a b");
  WordPieceOptions raw;
  raw.clean_text = false;
  BOOST_TEST(small(raw).basic_tokenize("a\x01"
                                       "b c") == (Words{"a\x01"
                                                        "b",
                                                        "c"}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(greedy_longest_match_with_continuing_pieces) {
  const WordPiece wp = small();
  BOOST_TEST(wp.encode("unaffable") == ids_of({"un", "##aff", "##able"}),
             boost::test_tools::per_element());
  BOOST_TEST(wp.encode("affable def") == ids_of({"aff", "##able", "d", "##ef"}),
             boost::test_tools::per_element());
  // One piece with no match makes the whole word unknown; the next word is tokenized again.
  BOOST_TEST(wp.encode("unaffablez hello") == ids_of({"[UNK]", "hello"}),
             boost::test_tools::per_element());
  BOOST_TEST(wp.encode("zzz") == ids_of({"[UNK]"}), boost::test_tools::per_element());
  // More code points than max_input_chars_per_word: unknown, however well it would split.
  WordPieceOptions shorter;
  shorter.max_input_chars_per_word = 5;
  BOOST_TEST(
      small(shorter).encode("xxxxx xxxxxx") == ids_of({"x", "##x", "##x", "##x", "##x", "[UNK]"}),
      boost::test_tools::per_element());
  BOOST_TEST(wp.encode(std::string(100, 'x')).size() == 100u);
  BOOST_TEST(wp.encode(std::string(101, 'x')) == ids_of({"[UNK]"}),
             boost::test_tools::per_element());
  BOOST_TEST(wp.encode(" \t ").empty());
}

BOOST_AUTO_TEST_CASE(added_tokens_are_matched_whole_in_the_raw_text) {
  const WordPiece wp = small();
  BOOST_TEST(wp.encode("hello[SEP]world [MASK]") == ids_of({"hello", "[SEP]", "world", "[MASK]"}),
             boost::test_tools::per_element());
  // Only as written: lowercase is not the token.
  BOOST_TEST(wp.basic_tokenize("[sep]") == (Words{"[", "sep", "]"}),
             boost::test_tools::per_element());
  WordPieceOptions none;
  none.added_tokens = std::vector<std::string>{};
  BOOST_TEST(small(none).basic_tokenize("[SEP]") == (Words{"[", "sep", "]"}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(encode_with_specials_truncates_the_pieces) {
  const WordPiece wp = small();
  const int64_t cls = wp.cls_id(), sep = wp.sep_id();
  BOOST_TEST(wp.encode_with_specials("unaffable hello", 100) == (Ids{cls, 5, 6, 7, 10, sep}),
             boost::test_tools::per_element());
  BOOST_TEST(wp.encode_with_specials("unaffable hello", 4) == (Ids{cls, 5, 6, sep}),
             boost::test_tools::per_element());
  BOOST_TEST(wp.encode_with_specials("unaffable hello", 2) == (Ids{cls, sep}),
             boost::test_tools::per_element());
  BOOST_TEST(wp.encode_with_specials("", 8) == (Ids{cls, sep}), boost::test_tools::per_element());
  BOOST_TEST(error_of([&] { wp.encode_with_specials("hello", 1); }).find("max_len 1") !=
             std::string::npos);
}

BOOST_AUTO_TEST_CASE(ids_and_tokens) {
  const WordPiece wp = small();
  BOOST_TEST(wp.size() == (int64_t)kVocab.size());
  BOOST_TEST(wp.pad_id() == 0);
  BOOST_TEST(wp.unk_id() == 1);
  BOOST_TEST(wp.cls_id() == 2);
  BOOST_TEST(wp.sep_id() == 3);
  BOOST_TEST(wp.id("##aff") == 6);
  BOOST_TEST(wp.token(6) == "##aff");
  BOOST_TEST(error_of([&] { wp.id("zebra"); }).find("\"zebra\" is not in the vocabulary") !=
             std::string::npos);
  BOOST_TEST(error_of([&] { wp.token(25); }).find("the id 25 is outside [0, 25)") !=
             std::string::npos);
  BOOST_TEST(error_of([&] { wp.token(-1); }).find("the id -1") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(invalid_utf8_names_the_byte) {
  const WordPiece wp = small();
  const std::string m = error_of([&] {
    wp.encode(
        "abc\xFF"
        "def");
  });
  BOOST_TEST(m.find("not valid UTF-8 at byte 3") != std::string::npos, m);
  BOOST_TEST(error_of([&] { wp.basic_tokenize("\xED\xA0\x80"); }).find("at byte 0") !=
             std::string::npos);  // a surrogate
  BOOST_TEST(error_of([&] { wp.encode("ab\xC3"); }).find("at byte 2") !=
             std::string::npos);  // cut short
  BOOST_TEST(error_of([&] { wp.normalize("\xC0\xAF"); }).find("at byte 0") !=
             std::string::npos);  // overlong
}

BOOST_AUTO_TEST_CASE(vocabulary_errors_name_the_cause) {
  std::vector<std::string> no_unk = kVocab;
  no_unk.erase(no_unk.begin() + 1);
  BOOST_TEST(error_of([&] { WordPiece(no_unk, {}); }) ==
             "WordPiece: the vocabulary has no unknown token \"[UNK]\"");
  std::vector<std::string> no_sep = kVocab;
  no_sep.erase(no_sep.begin() + 3);
  BOOST_TEST(error_of([&] { WordPiece(no_sep, {}); }).find("no separator token \"[SEP]\"") !=
             std::string::npos);
  std::vector<std::string> twice = kVocab;
  twice.push_back("hello");
  BOOST_TEST(error_of([&] {
               WordPiece(twice, {});
             }).find("\"hello\" is repeated (ids 10 and 25)") != std::string::npos);
  std::vector<std::string> empty = kVocab;
  empty.push_back("");
  BOOST_TEST(error_of([&] { WordPiece(empty, {}); }).find("the token of id 25 is empty") !=
             std::string::npos);
  WordPieceOptions added;
  added.added_tokens = std::vector<std::string>{"<mask>"};
  BOOST_TEST(error_of([&] { small(added); }).find("no added token \"<mask>\"") !=
             std::string::npos);
}

BOOST_AUTO_TEST_CASE(vocab_txt_and_its_errors) {
  TempDir dir("wordpiece");
  const fs::path good = dir.path / "vocab.txt";
  write_file(good, vocab_txt(kVocab));
  const WordPiece wp = WordPiece::from_vocab_txt(good.string(), {});
  BOOST_TEST(wp.size() == (int64_t)kVocab.size());
  BOOST_TEST(wp.encode("Unaffable") == ids_of({"un", "##aff", "##able"}),
             boost::test_tools::per_element());

  std::vector<std::string> no_unk = kVocab;
  no_unk.erase(no_unk.begin() + 1);
  const fs::path bad = dir.path / "no_unk.txt";
  write_file(bad, vocab_txt(no_unk));
  BOOST_TEST(error_of([&] { WordPiece::from_vocab_txt(bad.string(), {}); }) ==
             "WordPiece: '" + bad.string() + "': the vocabulary has no unknown token \"[UNK]\"");
  const fs::path twice = dir.path / "twice.txt";
  write_file(twice, vocab_txt(kVocab) + "hello\n");
  BOOST_TEST(error_of([&] {
               WordPiece::from_vocab_txt(twice.string(), {});
             }).find("line 26: the token \"hello\" is repeated (first on line 11)") !=
             std::string::npos);
  const fs::path missing = dir.path / "missing.txt";
  const std::string m = error_of([&] { WordPiece::from_vocab_txt(missing.string(), {}); });
  BOOST_TEST(m == "WordPiece: '" + missing.string() + "': no such file");
}

BOOST_AUTO_TEST_CASE(from_directory_reads_tokenizer_config_beside_vocab_txt) {
  TempDir dir("wordpiece");
  BOOST_TEST(error_of([&] { WordPiece::from_directory(dir.path.string()); }) ==
             "WordPiece: '" + dir.path.string() +
                 "': neither tokenizer.json nor vocab.txt is there");
  write_file(dir.path / "vocab.txt", vocab_txt(kVocab));
  BOOST_TEST(WordPiece::from_directory(dir.path.string()).encode("CAFÉ") == ids_of({"cafe"}),
             boost::test_tools::per_element());
  write_file(dir.path / "tokenizer_config.json",
             R"({"do_lower_case": true, "strip_accents": false, "tokenize_chinese_chars": false,
                 "unk_token": {"content": "[UNK]"}, "mask_token": "[MASK]"})");
  const WordPiece wp = WordPiece::from_directory(dir.path.string());
  BOOST_TEST(!wp.options().strip_accents.value());
  BOOST_TEST(!wp.options().handle_chinese_chars);
  BOOST_TEST(wp.encode("CAFÉ [MASK]") == ids_of({"caf", "##é", "[MASK]"}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(tokenizer_json_and_its_errors) {
  TempDir dir("wordpiece");
  auto tokenizer_json = [&](const std::string& model_type, const std::string& normalizer) {
    std::string vocab;
    for (size_t i = 0; i < kVocab.size(); ++i)
      vocab += (i ? ", \"" : "\"") + kVocab[i] + "\": " + std::to_string(i);
    return R"({"normalizer": )" + normalizer + R"(, "pre_tokenizer": {"type": "BertPreTokenizer"},
      "added_tokens": [{"id": 3, "content": "[SEP]", "special": true, "normalized": false}],
      "model": {"type": ")" +
           model_type + R"(", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                "max_input_chars_per_word": 100, "vocab": {)" +
           vocab + "}}}";
  };
  const fs::path good = dir.path / "tokenizer.json";
  write_file(good,
             tokenizer_json("WordPiece", R"({"type": "BertNormalizer", "lowercase": false})"));
  const WordPiece wp = WordPiece::from_tokenizer_json(good.string());
  BOOST_TEST(!wp.options().lowercase);
  BOOST_TEST(wp.basic_tokenize("Hello [SEP] [MASK]") == (Words{"Hello", "[SEP]", "[", "MASK", "]"}),
             boost::test_tools::per_element());
  BOOST_TEST(WordPiece::from_directory(dir.path.string()).size() == (int64_t)kVocab.size());

  const fs::path bpe = dir.path / "bpe.json";
  write_file(bpe, tokenizer_json("BPE", "null"));
  BOOST_TEST(error_of([&] { WordPiece::from_tokenizer_json(bpe.string()); }) ==
             "WordPiece: '" + bpe.string() + "': model type \"BPE\" is not WordPiece");
  const fs::path nfc = dir.path / "nfc.json";
  write_file(nfc, tokenizer_json("WordPiece", R"({"type": "NFC"})"));
  BOOST_TEST(error_of([&] {
               WordPiece::from_tokenizer_json(nfc.string());
             }).find("normalizer type \"NFC\" is not BertNormalizer") != std::string::npos);
  const fs::path broken = dir.path / "broken.json";
  write_file(broken, "{\"model\": ");
  BOOST_TEST(error_of([&] {
               WordPiece::from_tokenizer_json(broken.string());
             }).find("not valid JSON") != std::string::npos);
  const fs::path missing = dir.path / "missing.json";
  BOOST_TEST(error_of([&] { WordPiece::from_tokenizer_json(missing.string()); }) ==
             "WordPiece: '" + missing.string() + "': no such file");
}

// The added tokens are found leftmost, then longest, as a plain scan that tries every token at
// every byte finds them, overlapping tokens included.
BOOST_AUTO_TEST_CASE(added_tokens_match_leftmost_longest_as_a_plain_scan) {
  const std::vector<std::string> added = {"ab", "abc", "bcd", "c", "b", "cdab"};
  std::vector<std::string> vocab = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "a", "d"};
  for (const std::string& t : added)
    if (std::find(vocab.begin(), vocab.end(), t) == vocab.end()) vocab.push_back(t);
  WordPieceOptions o;
  o.added_tokens = added;
  const WordPiece wp(vocab, o);
  uint64_t state = 12345;
  for (int n = 0; n < 500; ++n) {
    std::string text;
    for (int k = 0; k < 24; ++k) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      text += "abcd "[(state >> 33) % 5];
    }
    Words want;
    std::string word;
    auto flush = [&] {
      if (!word.empty()) want.push_back(word);
      word.clear();
    };
    for (size_t i = 0; i < text.size();) {
      size_t best = 0;
      for (const std::string& t : added)
        if (text.compare(i, t.size(), t) == 0) best = std::max(best, t.size());
      if (best > 0) {
        flush();
        want.push_back(text.substr(i, best));
        i += best;
      } else {
        if (text[i] == ' ') flush();
        else word += text[i];
        ++i;
      }
    }
    flush();
    BOOST_TEST(wp.basic_tokenize(text) == want, "text \"" << text << "\"");
  }
}

// Issue 47: 100,000 added tokens made every byte try every token. Now the work per byte is
// bounded whatever their number: at most 2 automaton steps per byte, and the short words
// between them a few trie steps each.
BOOST_AUTO_TEST_CASE(many_added_tokens_cost_a_bounded_number_of_steps_per_byte) {
  std::vector<std::string> vocab = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "<", ">", "t"};
  for (char d = '0'; d <= '9'; ++d) vocab.push_back(std::string("##") + d);
  std::vector<std::string> added;
  for (int i = 0; i < 10000; ++i) {
    std::string t = std::to_string(10000 + i);
    added.push_back("<t" + t.substr(1) + ">");
    vocab.push_back(added.back());
  }
  WordPieceOptions o;
  o.added_tokens = added;
  const WordPiece wp(vocab, o);
  std::string text;
  while (text.size() < 100000) text += "<t0042> <t004 <t9999><t999";
  int64_t steps = 0;
  const Ids ids = wp.encode(text, steps);
  BOOST_TEST(steps <= 5 * (int64_t)text.size());
  BOOST_TEST(std::count(ids.begin(), ids.end(), wp.id("<t0042>")) ==
             std::count(ids.begin(), ids.end(), wp.id("<t9999>")));
  BOOST_TEST(ids == wp.encode(text), boost::test_tools::per_element());
}

// Issue 47: with a raised max_input_chars_per_word a long word cost the longest token's length
// in lookups at every piece, each hashing up to that many bytes (a 30 kB word beside a 3000-byte
// token: 22 s). Now a word costs at most 3 steps a byte (5 with the added-token scan), whatever
// its length and the longest token.
BOOST_AUTO_TEST_CASE(a_long_word_costs_a_bounded_number_of_steps_per_byte) {
  const std::string long_token(1000, 'q');
  const std::vector<std::string> vocab = {"[PAD]", "[UNK]", "[CLS]",    "[SEP]",
                                          "a",     "##a",   "aaaab",    "##aaaab",
                                          "b",     "##b",   long_token, "##" + long_token};
  WordPieceOptions o;
  o.max_input_chars_per_word = 1000000;
  const WordPiece wp(vocab, o);
  for (const size_t n : {size_t(1000), size_t(100000)}) {
    const std::string word = std::string(n, 'a') + "b";
    int64_t steps = 0;
    const Ids ids = wp.encode(word, steps);
    BOOST_TEST(steps <= 5 * (int64_t)word.size());
    BOOST_TEST_REQUIRE(ids.size() == n - 3);
    BOOST_TEST(ids.front() == wp.id("a"));
    BOOST_TEST(std::count(ids.begin(), ids.end(), wp.id("##a")) == (int64_t)n - 5);
    BOOST_TEST(ids.back() == wp.id("##aaaab"));
  }
  int64_t steps = 0;  // a word made of the long token
  const std::string qs(2000, 'q');
  const Ids long_ids = wp.encode(qs, steps);
  BOOST_TEST(long_ids == (Ids{wp.id(long_token), wp.id("##" + long_token)}),
             boost::test_tools::per_element());
  BOOST_TEST(steps <= 5 * (int64_t)qs.size());
  // A word that follows a long token for all but its last byte at every piece, which is then
  // "##a": greedy matching piece by piece (a trie walk from each piece's start) would cost the
  // token's length at every byte.
  const std::string almost = std::string(999, 'a') + "b";
  const WordPiece adversarial(
      {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "a", "##a", almost, "##" + almost}, o);
  const std::string as(100000, 'a');
  steps = 0;
  const Ids as_ids = adversarial.encode(as, steps);
  BOOST_TEST(steps <= 5 * (int64_t)as.size());
  BOOST_TEST_REQUIRE(as_ids.size() == as.size());
  BOOST_TEST(std::count(as_ids.begin(), as_ids.end(), adversarial.id("##a")) ==
             (int64_t)as.size() - 1);
}

// Normalisation may lengthen the text (NFD makes a 3-byte Hangul syllable 3 jamo of 3 bytes):
// the bound is 2 steps per byte of the text and 3 per byte of its normalised words, and NFD
// lengthens UTF-8 at most 3 times (Unicode's UAX #15), so the cost stays linear in the input.
BOOST_AUTO_TEST_CASE(text_that_normalisation_lengthens_costs_steps_per_normalised_byte) {
  const std::string han = "\xed\x95\x9c", guk = "\xea\xb5\xad";  // two Hangul syllables
  const WordPiece probe({"[PAD]", "[UNK]", "[CLS]", "[SEP]", "a"}, {});
  const std::string han_nfd = probe.normalize(han);
  BOOST_TEST_REQUIRE(han_nfd.size() == 9u);  // lowercasing implies NFD, as BERT's uncased
  WordPieceOptions o;
  o.max_input_chars_per_word = 1000000;
  const WordPiece wp({"[PAD]", "[UNK]", "[CLS]", "[SEP]", han_nfd, "##" + han_nfd}, o);
  std::string text;
  for (int i = 0; i < 20000; ++i) text += (i % 7 == 6 ? " " : (i % 3 ? han : guk));
  int64_t steps = 0;
  const Ids ids = wp.encode(text, steps);
  const int64_t normalised = (int64_t)wp.normalize(text).size();
  BOOST_TEST(normalised <= 3 * (int64_t)text.size());
  BOOST_TEST(steps <= 2 * (int64_t)text.size() + 3 * normalised);
  BOOST_TEST(!ids.empty());
}

// Issue 47: tokenizer.json numbers are integers in range, not converted as nlohmann would
// (1e300 with undefined behaviour, 2.5 truncated to 2).
BOOST_AUTO_TEST_CASE(tokenizer_json_numbers_must_be_integers_in_range) {
  TempDir dir("wordpiece_numbers");
  const fs::path path = dir.path / "tokenizer.json";
  auto with = [&](const std::string& max_chars, const std::string& unk_id,
                  const std::string& sep_id) {
    write_file(path, R"({"normalizer": null, "pre_tokenizer": {"type": "BertPreTokenizer"},
      "added_tokens": [{"id": )" +
                         sep_id + R"(, "content": "[SEP]"}],
      "model": {"type": "WordPiece", "unk_token": "[UNK]", "max_input_chars_per_word": )" +
                         max_chars + R"(, "vocab": {"[PAD]": 0, "[UNK]": )" + unk_id +
                         R"(, "[CLS]": 2, "[SEP]": 3}}})");
    return error_of([&] { WordPiece::from_tokenizer_json(path.string()); });
  };
  const std::string where = "WordPiece: '" + path.string() + "': ";
  BOOST_TEST(with("100", "1", "3") == "<no graft::Error>");
  BOOST_TEST(with("2.5", "1", "3") ==
             where + "\"max_input_chars_per_word\" must be an integer, got 2.5");
  BOOST_TEST(with("1e300", "1", "3") ==
             where + "\"max_input_chars_per_word\" must be an integer, got 1e+300");
  BOOST_TEST(with("100", "1.0", "3") == where + "the id of \"[UNK]\" must be an integer, got 1.0");
  BOOST_TEST(with("100", "18446744073709551615", "3") ==
             where + "the id of \"[UNK]\" must be an integer, got 18446744073709551615");
  BOOST_TEST(with("100", "1", "3.5") == where + "\"id\" must be an integer, got 3.5");
  BOOST_TEST(with("100", "1", "-1e300") == where + "\"id\" must be an integer, got -1e+300");
}

// Ids that `tokenizers` 0.23.3 gives (Tokenizer.from_file(tokenizer.json), no truncation, no
// padding).
BOOST_AUTO_TEST_CASE(pretrained_minilm_ids_as_tokenizers_gives_them,
                     *boost::unit_test::precondition(model_present)) {
  const WordPiece wp = WordPiece::from_directory(kModel.string());
  BOOST_TEST(wp.size() == 30522);
  const int64_t all = 1000;
  auto check = [&](const std::string& text, const Ids& want) {
    BOOST_TEST_CONTEXT(text) {
      BOOST_TEST(wp.encode_with_specials(text, all) == want, boost::test_tools::per_element());
    }
  };
  check("Hello, world!", {101, 7592, 1010, 2088, 999, 102});
  check("Café déjà vu — naïve façade", {101, 7668, 2139, 3900, 24728, 1517, 15743, 8508, 102});
  check("The unaffable tokenizer's [SEP] and [sep] [MASK]",
        {101, 1996, 14477, 20961, 3468, 19204, 17629, 1005, 1055, 102, 1998, 1031, 19802, 1033, 103,
         102});
  check("日本語のテキスト", {101, 1864, 1876, 1950, 1671, 30239, 30227, 30233, 30240, 102});
  check("İstanbul ΣΟΦΙΑ straße", {101, 9960, 1173, 29730, 29736, 27432, 2358, 27807, 102});
  check(std::string("a\xC2\xAD"
                    "b\xE2\x80\x8B"
                    "c\xC2\xA0"
                    "d\te") +
            std::string(1, '\0') + "f\xEF\xBF\xBDg",
        {101, 5925, 1040, 1041, 2546, 2290, 102});
  check("🥰 emoji ∑ x²", {101, 100, 7861, 29147, 2072, 100, 1060, 10701, 102});
  check("supercalifragilisticexpialidocious",
        {101, 3565, 9289, 10128, 29181, 24411, 4588, 10288, 19312, 21273, 10085, 6313, 102});
  check(std::string(101, 'x'), {101, 100, 102});
  check("a[CLS]b", {101, 1037, 101, 1038, 102});
  check("", {101, 102});
  BOOST_TEST(wp.encode_with_specials("Hello, world!", 4) == (Ids{101, 7592, 1010, 102}),
             boost::test_tools::per_element());
}
