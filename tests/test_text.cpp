// Tests for the translation example's text utilities: sacreBLEU-compatible
// BLEU, the TSV corpus reader and the SentencePiece tokenizer wrapper.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "examples/common/cli.h"
#include "examples/common/lines.h"
#include "examples/translation/bleu.h"
#include "examples/translation/corpus.h"
#include "graft/nn/text/tokenizer.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;
using namespace graft::text;

namespace {

using graft::testing::TempDir;

void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "<no exception>";
}

// Deterministic German-like sentences with umlauts and ß; enough variety that
// a 100-piece vocabulary must split words into subwords.
std::vector<std::string> german_sentences(size_t n) {
  const std::vector<std::string> subj = {"Der Bäcker",    "Die Ärztin",       "Ein Müller",
                                         "Das Mädchen",   "Der Schüler",      "Die Größe",
                                         "Unser Förster", "Die Übersetzerin", "Ein Ölhändler"};
  const std::vector<std::string> verb = {"öffnet",   "grüßt",    "überprüft", "zählt",
                                         "fährt zu", "schließt", "träumt von"};
  const std::vector<std::string> obj = {"die Tür",       "den Käse",   "das Büro",   "die Straße",
                                        "den Schlüssel", "die Brücke", "das Gemüse", "die Äpfel"};
  const std::vector<std::string> tail = {"heute.",
                                         "morgen früh.",
                                         "sehr schnell!",
                                         "um 3.5 Uhr.",
                                         "im Frühling.",
                                         "ohne Grund?",
                                         "mit Brot, Öl & Salz: gut."};
  std::vector<std::string> out;
  for (size_t i = 0; i < n; ++i) {
    out.push_back(subj[i % subj.size()] + " " + verb[(i / 3) % verb.size()] + " " +
                  obj[(i / 2) % obj.size()] + " " + tail[(i / 5) % tail.size()]);
  }
  return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(text)

// ---------------------------------------------------------------- 13a tokens

BOOST_AUTO_TEST_CASE(tokenize_13a_punctuation_and_numbers) {
  BOOST_TEST(tokenize_13a("Hello, world!") == "Hello , world !");
  BOOST_TEST(tokenize_13a("end.") == "end .");
  BOOST_TEST(tokenize_13a("3.5") == "3.5");
  BOOST_TEST(tokenize_13a("It costs 1,000.50 dollars.") == "It costs 1,000.50 dollars .");
  // The final period follows a digit but precedes a space, so it is split.
  BOOST_TEST(tokenize_13a("in 2020.") == "in 2020 .");
  BOOST_TEST(tokenize_13a("v1.2.3") == "v1.2.3");
  // A dash is split only after a digit; apostrophes are never split.
  BOOST_TEST(tokenize_13a("well-known 5-6 don't") == "well-known 5 - 6 don't");
  BOOST_TEST(tokenize_13a("(a) [b] {c} x/y \"q\" 50%") == "( a ) [ b ] { c } x / y \" q \" 50 %");
  BOOST_TEST(tokenize_13a("x.,y") == "x . , y");
  BOOST_TEST(tokenize_13a("") == "");
  BOOST_TEST(tokenize_13a("  spaced \t out  ") == "spaced out");
}

BOOST_AUTO_TEST_CASE(tokenize_13a_language_independent_rules) {
  BOOST_TEST(tokenize_13a("foo <skipped> bar") == "foo bar");
  BOOST_TEST(tokenize_13a("co-\noperate") == "cooperate");
  BOOST_TEST(tokenize_13a("line\nbreak") == "line break");
  BOOST_TEST(tokenize_13a("a&amp;b &lt;t&gt; &quot;q&quot;") == "a & b < t > \" q \"");
  // Entities are unescaped one after another, so a double escape collapses.
  BOOST_TEST(tokenize_13a("&amp;lt;") == "<");
}

BOOST_AUTO_TEST_CASE(tokenize_13a_utf8) {
  BOOST_TEST(tokenize_13a("Grüße, Herr Müller.") == "Grüße , Herr Müller .");
  BOOST_TEST(tokenize_13a("ÄÖÜ.x") == "ÄÖÜ . x");
  BOOST_TEST(tokenize_13a("Straße,Öl") == "Straße , Öl");
  // U+00A0 NO-BREAK SPACE is whitespace for Python's str.split.
  BOOST_TEST(tokenize_13a("a\xC2\xA0"
                          "b") == "a b");
  // U+00E9 and U+4E2D must come out byte-identical.
  BOOST_TEST(tokenize_13a("café 中.") == "café 中 .");
}

// ---------------------------------------------------------------------- BLEU

BOOST_AUTO_TEST_CASE(bleu_identical_is_100) {
  const std::vector<std::string> s = {"the cat sat on the mat", "Grüße aus München, Österreich."};
  const BleuResult r = corpus_bleu(s, s);
  BOOST_TEST(r.score == 100.0, boost::test_tools::tolerance(1e-9));
  for (double p : r.precisions) BOOST_TEST(p == 100.0, boost::test_tools::tolerance(1e-9));
  BOOST_TEST(r.bp == 1.0);
  BOOST_TEST(r.ratio == 1.0);
  BOOST_TEST(r.sys_len == 12u);  // 6 + "Grüße aus München , Österreich ." (6)
  BOOST_TEST(r.signature == "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.0.0-graft");
}

BOOST_AUTO_TEST_CASE(bleu_disjoint_is_0) {
  // sacreBLEU returns 0 outright when no n-gram matches, rather than the
  // small positive value "exp" smoothing would otherwise give.
  const BleuResult r = corpus_bleu({"a b c d e"}, {"v w x y z"});
  BOOST_TEST(r.score == 0.0);
  for (double p : r.precisions) BOOST_TEST(p == 0.0);
  BOOST_TEST(r.bp == 1.0);
}

BOOST_AUTO_TEST_CASE(bleu_hand_computed_with_exp_smoothing) {
  // hyp "the cat sat on the mat" vs ref "the cat is on the mat":
  //   1-grams: the x2, cat, on, mat match        -> 5/6
  //   2-grams: "the cat", "on the", "the mat"    -> 3/5
  //   3-grams: "on the mat"                      -> 1/4
  //   4-grams: none; exp smoothing, first zero order -> 1/(2*3)
  //   BP = 1 (6 vs 6).
  //   BLEU = 100 * (5/6 * 3/5 * 1/4 * 1/6)^(1/4) = 100 * (1/48)^(1/4) = 37.9918...
  const BleuResult r = corpus_bleu({"the cat sat on the mat"}, {"the cat is on the mat"});
  BOOST_TEST(r.score == 100.0 * std::pow(48.0, -0.25), boost::test_tools::tolerance(1e-6));
  BOOST_TEST(r.precisions[0] == 100.0 * 5 / 6, boost::test_tools::tolerance(1e-6));
  BOOST_TEST(r.precisions[1] == 60.0, boost::test_tools::tolerance(1e-6));
  BOOST_TEST(r.precisions[2] == 25.0, boost::test_tools::tolerance(1e-6));
  BOOST_TEST(r.precisions[3] == 100.0 / 6, boost::test_tools::tolerance(1e-6));
  BOOST_TEST(r.bp == 1.0);
  BOOST_TEST(r.str() ==
             "BLEU = 37.99 83.3/60.0/25.0/16.7 (BP = 1.000 ratio = 1.000 hyp_len = 6 ref_len = 6)");
}

BOOST_AUTO_TEST_CASE(bleu_hand_computed_corpus_with_brevity_penalty) {
  // Alone, "a b c d e" vs "a b c d e f g" matches everything: precisions 100,
  // BP = exp(1 - 7/5), BLEU = 100 * exp(-0.4) = 67.0320...
  const BleuResult alone = corpus_bleu({"a b c d e"}, {"a b c d e f g"});
  BOOST_TEST(alone.score == 100.0 * std::exp(-0.4), boost::test_tools::tolerance(1e-6));
  BOOST_TEST(alone.ratio == 5.0 / 7.0, boost::test_tools::tolerance(1e-9));

  // Corpus statistics are summed before the precisions are taken:
  //   1-grams (5+5)/(6+5) = 10/11, 2-grams (3+4)/(5+4) = 7/9,
  //   3-grams (1+3)/(4+3) = 4/7,   4-grams (0+2)/(3+2) = 2/5,
  //   sys_len 11, ref_len 13 -> BP = exp(1 - 13/11).
  //   BLEU = 100 * (10*7*4*2 / (11*9*7*5))^(1/4) * exp(1 - 13/11)
  //        = 100 * (16/99)^(1/4) * exp(-2/11) = 52.9298...
  const BleuResult r = corpus_bleu({"the cat sat on the mat", "a b c d e"},
                                   {"the cat is on the mat", "a b c d e f g"});
  const double expected = 100.0 * std::pow(16.0 / 99.0, 0.25) * std::exp(-2.0 / 11.0);
  BOOST_TEST(r.score == expected, boost::test_tools::tolerance(1e-6));
  BOOST_TEST(r.sys_len == 11u);
  BOOST_TEST(r.ref_len == 13u);
  BOOST_TEST(r.bp == std::exp(-2.0 / 11.0), boost::test_tools::tolerance(1e-9));
  BOOST_TEST(r.precisions[3] == 40.0, boost::test_tools::tolerance(1e-9));
}

BOOST_AUTO_TEST_CASE(bleu_edge_cases) {
  // Hypotheses shorter than 4 tokens have no 4-grams at all; sacreBLEU (without
  // effective order) then scores 0 even for a perfect match.
  BOOST_TEST(corpus_bleu({"a b"}, {"a b"}).score == 0.0);
  // Case-sensitive: "The" and "Cat" do not match "the" and "cat".
  const double mixed = corpus_bleu({"The Cat sat on the mat"}, {"the cat sat on the mat"}).score;
  BOOST_TEST(mixed > 0.0);
  BOOST_TEST(mixed < 100.0);
  // Tokenisation happens before matching: "mat." equals "mat ." in the ref.
  BOOST_TEST(corpus_bleu({"the cat sat on the mat."}, {"the cat sat on the mat ."}).score == 100.0,
             boost::test_tools::tolerance(1e-9));
  // Empty corpus: no statistics, score 0, no division by zero.
  const BleuResult empty = corpus_bleu({}, {});
  BOOST_TEST(empty.score == 0.0);
  BOOST_TEST(empty.ratio == 0.0);
}

BOOST_AUTO_TEST_CASE(bleu_size_mismatch_names_both_sizes) {
  const std::string msg = error_of([] { corpus_bleu({"a", "b"}, {"a", "b", "c"}); });
  BOOST_TEST(msg == "corpus_bleu: 2 hypotheses but 3 references");
  BOOST_CHECK_THROW(corpus_bleu({"a"}, {}), std::invalid_argument);
}

// -------------------------------------------------------------------- corpus

BOOST_AUTO_TEST_CASE(printable_escapes_what_a_terminal_would_act_on) {
  BOOST_TEST(printable("Grüße, 日本") == "Grüße, 日本");
  BOOST_TEST(printable("a\nb\x1b[31m\x7f") == "a\\x0Ab\\x1B[31m\\x7F");
  BOOST_TEST(printable("\xff\xfe ok") == "\\xFF\\xFE ok");
  BOOST_TEST(printable("back\\slash") == "back\\\\slash");
  BOOST_TEST(printable("\xc2\x9b"
                       "1m") ==
             "\\xC2\\x9B"
             "1m");                                                // C1 CSI
  BOOST_TEST(printable("x\xe2\x80\xaey") == "x\\xE2\\x80\\xAEy");  // right-to-left override
  BOOST_TEST(printable(std::string(300, 'a'), 10) == "aaaaaaaaaa...");
}

BOOST_AUTO_TEST_CASE(valid_utf8_cases) {
  BOOST_TEST(valid_utf8(""));
  BOOST_TEST(valid_utf8("plain ascii"));
  BOOST_TEST(valid_utf8("Grüße"));
  BOOST_TEST(valid_utf8("\xF0\x9F\x98\x80"));   // U+1F600
  BOOST_TEST(valid_utf8("\xF4\x8F\xBF\xBF"));   // U+10FFFF, the maximum
  BOOST_TEST(valid_utf8("\xED\x9F\xBF"));       // U+D7FF, just below surrogates
  BOOST_TEST(valid_utf8("\xEE\x80\x80"));       // U+E000, just above surrogates
  BOOST_TEST(!valid_utf8("\xF4\x90\x80\x80"));  // U+110000
  BOOST_TEST(!valid_utf8("\xED\xA0\x80"));      // U+D800 surrogate
  BOOST_TEST(!valid_utf8("\xC0\xAF"));          // overlong '/'
  BOOST_TEST(!valid_utf8("\xC1\xBF"));          // overlong
  BOOST_TEST(!valid_utf8("\xE0\x80\xAF"));      // overlong, 3 bytes
  BOOST_TEST(!valid_utf8("\xF0\x80\x80\xAF"));  // overlong, 4 bytes
  BOOST_TEST(!valid_utf8("\x80"));              // stray continuation
  BOOST_TEST(!valid_utf8("\xFF"));
  BOOST_TEST(!valid_utf8("\xF5\x80\x80\x80"));
  BOOST_TEST(!valid_utf8("ab\xC3"));        // truncated at end
  BOOST_TEST(!valid_utf8("\xE2\x82"));      // truncated at end
  BOOST_TEST(!valid_utf8("\xE2\x28\xA1"));  // bad continuation
}

BOOST_AUTO_TEST_CASE(read_tsv_counts_each_bad_line_kind) {
  TempDir dir;
  const fs::path file = dir.path / "corpus.tsv";
  write_file(file,
             "\xEF\xBB\xBFHallo Welt\tHello world\n"  // kept (BOM dropped)
             "Guten Morgen\tGood morning\r\n"         // kept (CRLF)
             "\n"                                     // empty
             "   \r\n"                                // empty
             "no tab here\n"                          // malformed
             "a\tb\tc\n"                              // malformed: two tabs
             "  \tonly target\n"                      // malformed: empty side
             "stray \xFF byte\tx\n"                   // bad_utf8
             "overlong \xC0\xAF\tx\n"                 // bad_utf8
             "surrogate \xED\xA0\x80\tx\n"            // bad_utf8
             "truncated \xC3\tx\n"                    // bad_utf8
                 + std::string(600, 'a') + "\t" + std::string(600, 'b') +
                 "\n"                        // too_long
                 "  Grüße \t Greetings  ");  // kept, no final newline
  CorpusStats st;
  const auto pairs = read_tsv(file.string(), st);
  BOOST_TEST(st.read == 13u);
  BOOST_TEST(st.kept == 3u);
  BOOST_TEST(st.empty == 2u);
  BOOST_TEST(st.malformed == 3u);
  BOOST_TEST(st.bad_utf8 == 4u);
  BOOST_TEST(st.too_long == 1u);
  BOOST_TEST(st.read == st.kept + st.empty + st.malformed + st.bad_utf8 + st.too_long);
  BOOST_TEST(st.summary() == "read=13 kept=3 empty=2 malformed=3 bad_utf8=4 too_long=1");
  BOOST_REQUIRE(pairs.size() == 3u);
  BOOST_TEST(pairs[0].src == "Hallo Welt");
  BOOST_TEST(pairs[0].tgt == "Hello world");
  BOOST_TEST(pairs[1].tgt == "Good morning");  // no trailing '\r'
  BOOST_TEST(pairs[2].src == "Grüße");
  BOOST_TEST(pairs[2].tgt == "Greetings");

  // A larger byte limit admits the long line; a word limit of 1 rejects the
  // two-word pairs; stats accumulate across calls.
  CorpusStats st2;
  BOOST_TEST(read_tsv(file.string(), st2, 2000).size() == 4u);
  BOOST_TEST(st2.too_long == 0u);
  BOOST_TEST(read_tsv(file.string(), st2, 2000, 1).size() == 2u);  // long a/b line + Grüße
  BOOST_TEST(st2.read == 26u);
  BOOST_TEST(st2.too_long == 2u);
}

BOOST_AUTO_TEST_CASE(read_tsv_open_failures) {
  CorpusStats st;
  BOOST_TEST(error_of([&] { read_tsv("/nonexistent/graft/x.tsv", st); }) ==
             "read_tsv: cannot open '/nonexistent/graft/x.tsv': No such file or directory");
  TempDir dir;
  BOOST_TEST(error_of([&] { read_tsv(dir.path.string(), st); }) ==
             "read_tsv: error reading '" + dir.path.string() + "': Is a directory");
  BOOST_TEST(st.read == 0u);
}

// An overlong line costs at most the cap while reading; the lines around it are intact, CRLF
// endings and NUL bytes are kept apart correctly, and a last line without "\n" is read.
BOOST_AUTO_TEST_CASE(line_reader_caps_while_reading) {
  TempDir dir;
  const std::string path = (dir.path / "lines.txt").string();
  {
    std::ofstream out(path, std::ios::binary);
    out << "short\r\n"
        << std::string(5000000, 'x') << "\n"
        << std::string("a\0b", 3) << "\n"
        << "12345\r\n"
        << "123456\n"
        << "last";
  }
  FILE* f = std::fopen(path.c_str(), "rb");
  BOOST_REQUIRE(f);
  LineReader r(f, 5);
  std::string line;
  bool too_long = false;
  std::vector<std::pair<std::string, bool>> got;
  while (r.next(line, too_long, "test")) got.emplace_back(line, too_long);
  std::fclose(f);
  const std::vector<std::pair<std::string, bool>> want = {
      {"short", false}, {"", true}, {std::string("a\0b", 3), false},
      {"12345", false}, {"", true}, {"last", false}};
  BOOST_TEST(got.size() == want.size());
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    BOOST_TEST(got[i].first == want[i].first, "line " << i);
    BOOST_TEST(got[i].second == want[i].second, "line " << i);
  }
}

// for_each_chunk: every line once, in order, in chunks of at most `chunk` lines, an overlong line
// flagged and not kept, and nothing else held: `< /dev/zero` (one endless line) is read in
// bounded memory and ends as one too-long line.
BOOST_AUTO_TEST_CASE(for_each_chunk_bounds_what_it_holds) {
  TempDir dir;
  const std::string path = (dir.path / "lines.txt").string();
  write_file(path, "a\nbb\n" + std::string(100, 'x') + "\nc\nd\ne");
  FILE* f = std::fopen(path.c_str(), "rb");
  BOOST_REQUIRE(f);
  std::vector<std::string> got;
  std::vector<size_t> starts, sizes;
  for_each_chunk(f, 10, 2, "test", [&](const std::vector<CappedLine>& lines, size_t before) {
    starts.push_back(before);
    sizes.push_back(lines.size());
    for (const CappedLine& l : lines) got.push_back(l.too_long ? "<long>" : l.text);
  });
  std::fclose(f);
  BOOST_TEST(got == (std::vector<std::string>{"a", "bb", "<long>", "c", "d", "e"}));
  BOOST_TEST(starts == (std::vector<size_t>{0, 2, 4}));
  BOOST_TEST(sizes == (std::vector<size_t>{2, 2, 2}));
  // 20 MB of zero bytes without a newline, as `head -c 20M /dev/zero` gives: one line, too long.
  FILE* zero = std::fopen("/dev/zero", "rb");
  BOOST_REQUIRE(zero);
  FILE* bounded = std::fopen(path.c_str(), "w+b");
  BOOST_REQUIRE(bounded);
  std::vector<char> block(1 << 20);
  for (int i = 0; i < 20; ++i) {
    BOOST_REQUIRE(std::fread(block.data(), 1, block.size(), zero) == block.size());
    BOOST_REQUIRE(std::fwrite(block.data(), 1, block.size(), bounded) == block.size());
  }
  std::fclose(zero);
  std::rewind(bounded);
  size_t lines = 0, long_lines = 0;
  for_each_chunk(bounded, 1 << 16, 256, "test", [&](const std::vector<CappedLine>& c, size_t) {
    for (const CappedLine& l : c) {
      ++lines;
      long_lines += l.too_long && l.text.empty();
    }
  });
  std::fclose(bounded);
  BOOST_TEST(lines == 1u);
  BOOST_TEST(long_lines == 1u);
}

// --collective-timeout: NaN once passed CLI11's check and aborted the program in the setter's
// exception (SIGABRT), and 1e10 s overflowed the watchdog's deadline; both, and what is past
// 10^6 s, are usage errors now (exit code 2), and a value in range sets the communicator's.
BOOST_AUTO_TEST_CASE(collective_timeout_flag_is_range_checked) {
  graft::train::Communicator& world = graft::train::world_communicator();
  const double saved = world.collective_timeout();
  auto parse = [](const std::string& value) {
    CLI::App app;
    double bucket_mb = 25;
    bool overlap = true;
    graft::cli::add_data_parallel_options(app.add_subcommand("train"), bucket_mb, overlap);
    std::vector<std::string> args = {"prog", "train", "--collective-timeout", value};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    return graft::cli::parse(app, (int)argv.size(), argv.data());
  };
  for (const char* bad : {"nan", "-nan", "inf", "-1", "1e10", "1000001", "ten"})
    BOOST_TEST(parse(bad) == 2, bad);
  BOOST_TEST(world.collective_timeout() == saved);
  BOOST_TEST(parse("1e6") == -1);
  BOOST_TEST(world.collective_timeout() == 1e6);
  BOOST_TEST(parse("0") == -1);
  BOOST_TEST(world.collective_timeout() == 0.0);
  world.set_collective_timeout(saved);
}

// ----------------------------------------------------------------- tokenizer

BOOST_AUTO_TEST_CASE(tokenizer_train_and_round_trip) {
  TempDir dir;
  const auto sents = german_sentences(200);
  const std::string prefix = (dir.path / "spm").string();
  Tokenizer::train(sents, prefix, 100);
  BOOST_TEST(fs::exists(prefix + ".model"));
  BOOST_TEST(fs::exists(prefix + ".vocab"));

  const Tokenizer tok(prefix + ".model");
  BOOST_TEST(tok.vocab_size() > 4);
  BOOST_TEST(tok.vocab_size() <= 100);
  BOOST_TEST(tok.piece(Tokenizer::PAD) == "<pad>");
  BOOST_TEST(tok.piece(Tokenizer::UNK) == "<unk>");
  BOOST_TEST(tok.piece(Tokenizer::BOS) == "<s>");
  BOOST_TEST(tok.piece(Tokenizer::EOS) == "</s>");

  // Training sentences plus an unseen recombination of known characters.
  std::vector<std::string> probes = {sents[0], sents[17], sents[199],
                                     "Die Bäckerin grüßt über die Brücke: Öl, Käse & Äpfel!"};
  for (const auto& s : probes) {
    const auto ids = tok.encode(s);
    BOOST_TEST(!ids.empty());
    for (int id : ids) {
      BOOST_TEST(id != Tokenizer::BOS);
      BOOST_TEST(id != Tokenizer::EOS);
      BOOST_TEST(id != Tokenizer::PAD);
    }
    BOOST_TEST(tok.decode(ids) == s);
    // Decoder output typically arrives framed and padded.
    std::vector<int> framed = {Tokenizer::BOS};
    framed.insert(framed.end(), ids.begin(), ids.end());
    framed.insert(framed.end(), {Tokenizer::EOS, Tokenizer::PAD, Tokenizer::PAD});
    BOOST_TEST(tok.decode(framed) == s);
  }
  // character_coverage=1.0: every umlaut seen in training is a known piece.
  for (int id : tok.encode("ä ö ü Ä Ö Ü ß")) BOOST_TEST(id != Tokenizer::UNK);
  BOOST_TEST(tok.encode("").empty());
  BOOST_TEST(tok.decode({}) == "");
  BOOST_CHECK_EXCEPTION(tok.decode({tok.vocab_size()}), graft::Error, [](const graft::Error& e) {
    return std::string(e.what()).find("Tokenizer::decode: id ") == 0;
  });
  BOOST_CHECK_EXCEPTION(tok.piece(-1), graft::Error, [](const graft::Error& e) {
    return std::string(e.what()).find("Tokenizer::piece: id -1 outside vocabulary of ") == 0;
  });
}

BOOST_AUTO_TEST_CASE(tokenizer_training_is_deterministic) {
  TempDir dir;
  const auto sents = german_sentences(200);
  const std::string a = (dir.path / "a").string(), b = (dir.path / "b").string();
  Tokenizer::train(sents, a, 100);
  Tokenizer::train(sents, b, 100);
  // The .model embeds the trainer options, including the differing prefix,
  // so compare the learned vocabulary (pieces and scores) instead.
  BOOST_TEST((read_file(a + ".vocab") == read_file(b + ".vocab")));
  BOOST_TEST(!read_file(a + ".vocab").empty());

  // BPE works too and is likewise lossless on its training data.
  const std::string c = (dir.path / "bpe").string();
  Tokenizer::train(sents, c, 100, Tokenizer::ModelType::Bpe);
  const Tokenizer bpe(c + ".model");
  BOOST_TEST(bpe.decode(bpe.encode(sents[42])) == sents[42]);
}

BOOST_AUTO_TEST_CASE(tokenizer_errors) {
  const std::string msg = error_of([] { Tokenizer t("/nonexistent/graft/spm.model"); });
  BOOST_TEST(msg.find("'/nonexistent/graft/spm.model'") != std::string::npos, msg);
  TempDir dir;
  BOOST_CHECK_EXCEPTION(Tokenizer::train({}, dir / "unused", 100), graft::Error,
                        [](const graft::Error& e) {
                          return std::string(e.what()) == "Tokenizer::train: no sentences";
                        });
  BOOST_CHECK_EXCEPTION(Tokenizer::train({"x"}, dir / "unused", 4), graft::Error,
                        [](const graft::Error& e) {
                          return std::string(e.what()).find("Tokenizer::train: vocab_size 4") == 0;
                        });
  const std::string bad_prefix = (dir.path / "missing_dir" / "spm").string();
  BOOST_CHECK_THROW(Tokenizer::train(german_sentences(20), bad_prefix, 50), graft::Error);
}

BOOST_AUTO_TEST_SUITE_END()
