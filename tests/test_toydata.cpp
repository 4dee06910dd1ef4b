#include <boost/test/unit_test.hpp>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "examples/translation/toydata.h"
#include "tests/test_util.h"

using namespace graft::toy;

namespace {

NP def(const char* noun, const char* adj = nullptr, bool plural = false) {
  NP np;
  np.noun = noun_id(noun);
  np.plural = plural;
  np.det = Det::Def;
  if (adj) np.adj = adj_id(adj);
  return np;
}
NP defs(const char* noun, const char* adj = nullptr) { return def(noun, adj, true); }
NP indef(const char* noun, const char* adj = nullptr, bool plural = false) {
  NP np = def(noun, adj, plural);
  np.det = Det::Indef;
  return np;
}
NP bare(const char* noun, const char* adj = nullptr) { return indef(noun, adj, true); }
NP num(int count, const char* noun, const char* adj = nullptr) {
  NP np = def(noun, adj, true);
  np.det = Det::Num;
  np.count = count;
  return np;
}
NP pron(Pron p) {
  NP np;
  np.pron = p;
  return np;
}

Clause clause(NP subj, const char* verb, std::optional<NP> obj = std::nullopt,
              std::optional<NP> iobj = std::nullopt) {
  Clause c;
  c.subj = subj;
  c.verb = verb_id(verb);
  c.obj = obj;
  c.iobj = iobj;
  return c;
}
Clause negated(Clause c) {
  c.negated = true;
  return c;
}
Clause past(Clause c) {
  c.tense = Tense::Past;
  return c;
}

Sentence simple(Clause c) {
  Sentence s;
  s.main = c;
  return s;
}
Sentence with_pp(Clause c, const char* prep, NP np) {
  Sentence s = simple(c);
  s.prep = prep_id(prep);
  s.pp = np;
  return s;
}

void check(const Sentence& s, const std::string& en, const std::string& de) {
  const Pair p = render(s);
  BOOST_TEST(p.src == en);
  BOOST_TEST(p.tgt == de);
}

bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t len;
    uint32_t cp;
    if (c < 0x80) {
      len = 1;
      cp = c;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else return false;
    if (i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    // Reject overlong encodings, surrogates and out-of-range code points.
    static const uint32_t min_cp[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

size_t words(const std::string& s) {
  std::istringstream in(s);
  size_t n = 0;
  for (std::string w; in >> w;)
    if (w != "," && w != ".") ++n;
  return n;
}

bool contains(const std::vector<Pair>& v, const std::string& needle) {
  for (const auto& p : v)
    if ((" " + p.tgt + " ").find(needle) != std::string::npos) return true;
  return false;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(toydata)

BOOST_AUTO_TEST_CASE(lexicon_sizes) {
  const LexiconSize n = lexicon_size();
  BOOST_TEST(n.nouns >= 25u);
  BOOST_TEST(n.nouns <= 35u);
  BOOST_TEST(n.verbs >= 15u);
  BOOST_TEST(n.verbs <= 20u);
  BOOST_TEST(n.adjectives >= 10u);
  BOOST_TEST(n.adjectives <= 15u);
  BOOST_CHECK_THROW(noun_id("unicorn"), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(nominative_accusative_agreement) {
  check(simple(clause(def("man", "old"), "see", def("dog"))), "the old man sees the dog .",
        "der alte Mann sieht den Hund .");
  check(simple(clause(def("woman"), "see", indef("man", "old"))), "the woman sees an old man .",
        "die Frau sieht einen alten Mann .");
  check(simple(clause(indef("child", "small"), "find", indef("flower", "red"))),
        "a small child finds a red flower .", "ein kleines Kind findet eine rote Blume .");
  check(simple(clause(indef("dog", "hungry"), "eat", indef("egg", "green"))),
        "a hungry dog eats a green egg .", "ein hungriger Hund isst ein grünes Ei .");
  check(
      simple(clause(def("girl"), "see", def("boy"))),  // weak noun takes -n outside the nominative
      "the girl sees the boy .", "das Mädchen sieht den Jungen .");
  check(simple(clause(defs("dog", "tired"), "like", def("cake"))),  // adjective stem ending in -e
        "the tired dogs like the cake .", "die müden Hunde mögen den Kuchen .");
  check(simple(clause(def("man"), "buy", bare("book", "old"))), "the man buys old books .",
        "der Mann kauft alte Bücher .");
}

BOOST_AUTO_TEST_CASE(dative_agreement) {
  check(with_pp(clause(def("dog"), "sleep"), "with", def("man", "old")),
        "the dog sleeps with the old man .", "der Hund schläft mit dem alten Mann .");
  check(with_pp(clause(pron(Pron::He), "work"), "in", def("school", "new")),
        "he works in the new school .", "er arbeitet in der neuen Schule .");
  check(with_pp(clause(indef("child", "small"), "sleep"), "on", def("sofa", "old")),
        "a small child sleeps on the old sofa .", "ein kleines Kind schläft auf dem alten Sofa .");
  check(with_pp(clause(def("cat"), "sleep"), "in", def("garden")),  // in + dem contracts
        "the cat sleeps in the garden .", "die Katze schläft im Garten .");
  check(with_pp(clause(def("cat"), "sleep"), "behind", defs("sofa")),  // plural in -s: no dative -n
        "the cat sleeps behind the sofas .", "die Katze schläft hinter den Sofas .");
  check(with_pp(clause(def("cat"), "sleep"), "next to", indef("tree", "big", true)),
        "the cat sleeps next to big trees .", "die Katze schläft neben großen Bäumen .");
  check(simple(clause(pron(Pron::I), "help", defs("man", "old"))), "i help the old men .",
        "ich helfe den alten Männern .");
  check(simple(clause(def("woman"), "give", indef("book"), def("child"))),
        "the woman gives the child a book .", "die Frau gibt dem Kind ein Buch .");
  check(simple(clause(pron(Pron::We), "show", def("picture", "white"), indef("woman", "friendly"))),
        "we show a friendly woman the white picture .",
        "wir zeigen einer freundlichen Frau das weiße Bild .");
  check(simple(clause(def("boy"), "thank", def("boy"))), "the boy thanks the boy .",
        "der Junge dankt dem Jungen .");
}

BOOST_AUTO_TEST_CASE(numbers_and_plurals) {
  check(simple(clause(num(2, "man", "old"), "sleep")), "two old men sleep .",
        "zwei alte Männer schlafen .");
  check(simple(clause(def("child"), "eat", num(5, "apple"))), "the child eats five apples .",
        "das Kind isst fünf Äpfel .");
  check(simple(clause(def("mouse"), "bring", num(3, "key"), num(10, "child", "young"))),
        "the mouse brings ten young children three keys .",
        "die Maus bringt zehn jungen Kindern drei Schlüssel .");
  check(simple(clause(bare("bird"), "read", defs("book"))), "birds read the books .",
        "Vögel lesen die Bücher .");
}

BOOST_AUTO_TEST_CASE(conjugation) {
  const std::pair<Pron, std::string> cases[] = {{Pron::I, "ich fahre"},    {Pron::You, "du fährst"},
                                                {Pron::He, "er fährt"},    {Pron::She, "sie fährt"},
                                                {Pron::It, "es fährt"},    {Pron::We, "wir fahren"},
                                                {Pron::They, "sie fahren"}};
  for (const auto& [p, de] : cases)
    BOOST_TEST(render(simple(clause(pron(p), "drive"))).tgt == de + " .");
  check(simple(clause(pron(Pron::You), "read", def("letter"))), "you read the letter .",
        "du liest den Brief .");
  check(simple(clause(pron(Pron::She), "run")), "she runs .", "sie läuft .");
}

BOOST_AUTO_TEST_CASE(negation) {
  check(simple(negated(clause(def("man"), "see", indef("dog")))), "the man does not see a dog .",
        "der Mann sieht keinen Hund .");
  check(simple(negated(clause(def("man"), "see", def("dog")))), "the man does not see the dog .",
        "der Mann sieht den Hund nicht .");
  check(simple(negated(clause(def("man"), "buy", bare("book", "old")))),
        "the man does not buy old books .", "der Mann kauft keine alten Bücher .");
  check(simple(negated(clause(defs("woman"), "sing"))), "the women do not sing .",
        "die Frauen singen nicht .");
  check(simple(past(negated(clause(pron(Pron::We), "thank", bare("cat", "small"))))),
        "we did not thank small cats .", "wir haben keinen kleinen Katzen gedankt .");
  check(simple(negated(clause(def("woman"), "give", def("cup"), indef("child")))),
        "the woman does not give a child the cup .", "die Frau gibt einem Kind die Tasse nicht .");
  Sentence s = with_pp(negated(clause(def("dog"), "run")), "in", def("house"));
  s.manner = manner_id("quickly");
  check(s, "the dog does not run quickly in the house .", "der Hund läuft nicht schnell im Haus .");
}

BOOST_AUTO_TEST_CASE(verb_second) {
  Sentence s = simple(clause(def("man"), "see", def("dog")));
  s.time_adverb = time_adverb_id("today");
  check(s, "today the man sees the dog .", "heute sieht der Mann den Hund .");
  s.time_adverb = time_adverb_id("every day");
  s.main.subj = pron(Pron::I);
  check(s, "every day i see the dog .", "jeden Tag sehe ich den Hund .");

  Sentence p = with_pp(past(clause(pron(Pron::You), "run")), "in", def("garden"));
  p.manner = manner_id("quickly");
  p.time_adverb = time_adverb_id("yesterday");
  check(p, "yesterday you ran quickly in the garden .",
        "gestern bist du schnell im Garten gelaufen .");

  Sentence f = simple(clause(def("man"), "read", indef("book")));
  f.conj = Conj::Because;
  f.sub_first = true;
  f.sub = clause(def("dog"), "sleep");
  check(f, "because the dog sleeps , the man reads a book .",
        "weil der Hund schläft , liest der Mann ein Buch .");
}

BOOST_AUTO_TEST_CASE(verb_final) {
  Sentence s = simple(clause(def("man"), "sleep"));
  s.conj = Conj::Because;
  s.sub = clause(def("woman"), "read", indef("book"));
  check(s, "the man sleeps because the woman reads a book .",
        "der Mann schläft , weil die Frau ein Buch liest .");
  s.sub = negated(clause(def("woman"), "read", indef("book")));
  check(s, "the man sleeps because the woman does not read a book .",
        "der Mann schläft , weil die Frau kein Buch liest .");

  Sentence t = simple(clause(pron(Pron::She), "say"));
  t.conj = Conj::That;
  t.sub = clause(defs("child"), "eat", bare("apple"));
  check(t, "she says that the children eat apples .", "sie sagt , dass die Kinder Äpfel essen .");
  t.main = negated(past(clause(pron(Pron::You), "know")));
  t.sub = past(negated(clause(def("woman"), "eat", def("cake"))));
  check(t, "you did not know that the woman did not eat the cake .",
        "du hast nicht gewusst , dass die Frau den Kuchen nicht gegessen hat .");
  t.main = clause(pron(Pron::You), "know");
  t.sub = past(clause(num(4, "horse"), "drive"));
  check(t, "you know that four horses drove .", "du weißt , dass vier Pferde gefahren sind .");

  Sentence w = simple(clause(def("girl"), "sing"));
  w.conj = Conj::While;
  w.sub = clause(pron(Pron::They), "give", indef("ball"), def("dog"));
  check(w, "the girl sings while they give the dog a ball .",
        "das Mädchen singt , während sie dem Hund einen Ball geben .");
}

BOOST_AUTO_TEST_CASE(invalid_structures_rejected) {
  BOOST_CHECK_THROW(render(simple(clause(def("man"), "see"))), std::invalid_argument);
  BOOST_CHECK_THROW(render(simple(clause(def("man"), "sleep", def("dog")))), std::invalid_argument);
  BOOST_CHECK_THROW(render(simple(clause(def("man"), "give", def("ball")))), std::invalid_argument);
  BOOST_CHECK_THROW(render(simple(clause(def("man"), "say"))), std::invalid_argument);
  BOOST_CHECK_THROW(render(simple(past(clause(def("man"), "read", def("book"))))),
                    std::invalid_argument);
  NP bad_num = num(11, "dog");
  BOOST_CHECK_THROW(render(simple(clause(bad_num, "sleep"))), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(determinism) {
  const Splits a = generate(42, 500, 50, 50);
  const Splits b = generate(42, 500, 50, 50);
  const Splits c = generate(43, 500, 50, 50);
  auto same = [](const std::vector<Pair>& x, const std::vector<Pair>& y) {
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (x[i].src != y[i].src || x[i].tgt != y[i].tgt) return false;
    return true;
  };
  BOOST_TEST(same(a.train, b.train));
  BOOST_TEST(same(a.valid, b.valid));
  BOOST_TEST(same(a.test, b.test));
  BOOST_TEST(!same(a.train, c.train));
  BOOST_TEST(!same(a.test, c.test));
  // Test/valid are drawn first, so they do not move when the train size does.
  const Splits d = generate(42, 2000, 50, 50);
  BOOST_TEST(same(a.test, d.test));
  BOOST_TEST(same(a.valid, d.valid));
}

BOOST_AUTO_TEST_CASE(splits_disjoint_valid_and_functional) {
  const Splits s = generate(7, 20000, 1000, 1000);
  BOOST_TEST(s.train.size() == 20000u);
  BOOST_TEST(s.valid.size() == 1000u);
  BOOST_TEST(s.test.size() == 1000u);
  std::unordered_set<std::string> seen;
  size_t n = 0, total_words = 0;
  for (const auto* split : {&s.train, &s.valid, &s.test}) {
    for (const auto& p : *split) {
      BOOST_TEST_REQUIRE(seen.insert(p.src).second, "duplicate: " << p.src);
      BOOST_TEST_REQUIRE(!p.src.empty());
      BOOST_TEST_REQUIRE(!p.tgt.empty());
      BOOST_TEST_REQUIRE(valid_utf8(p.tgt), "bad UTF-8: " << p.tgt);
      BOOST_TEST_REQUIRE(p.src.find_first_of("\t\n") == std::string::npos);
      BOOST_TEST_REQUIRE(p.tgt.find_first_of("\t\n") == std::string::npos);
      BOOST_TEST_REQUIRE(words(p.src) >= 3u);
      BOOST_TEST_REQUIRE(words(p.src) <= 16u);
      BOOST_TEST_REQUIRE(words(p.tgt) <= 16u);
      ++n;
      total_words += words(p.src);
    }
  }
  const double mean = static_cast<double>(total_words) / static_cast<double>(n);
  BOOST_TEST(mean > 7.5);
  BOOST_TEST(mean < 10.5);

  // The mapping must be a function: the same English from another seed must
  // get the same German.
  std::unordered_map<std::string, std::string> de_of;
  for (const auto& p : s.train) de_of.emplace(p.src, p.tgt);
  const Splits other = generate(8, 20000, 0, 0);
  for (const auto& p : other.train) {
    auto it = de_of.find(p.src);
    if (it != de_of.end()) BOOST_TEST_REQUIRE(it->second == p.tgt, p.src);
  }

  // Every phenomenon shows up in a training-size sample.
  for (const char* needle :
       {" keinen ", " keine ", " kein ", " nicht ", " , weil ", " , dass ",  " , während ",
        " , wenn ", " zwei ",  " zehn ", " Männer", "Männern ", " haben ",   " ist ",
        " im ",     " heute ", " Äpfel", " läuft ", " fährt ",  " schläft ", " du "})
    BOOST_TEST(contains(s.train, needle), "missing phenomenon: '" << needle << "'");
}

BOOST_AUTO_TEST_CASE(write_tsv_roundtrip_and_error) {
  const std::vector<Pair> pairs = {{"the man sleeps .", "der Mann schläft ."},
                                   {"i run .", "ich laufe ."}};
  const graft::testing::TempDir dir("toydata");
  const std::string path = dir / "pairs.tsv";
  write_tsv(path, pairs);
  std::ifstream in(path, std::ios::binary);
  std::stringstream buf;
  buf << in.rdbuf();
  BOOST_TEST(buf.str() == "the man sleeps .\tder Mann schläft .\ni run .\tich laufe .\n");

  const std::string bad = "/nonexistent_graft_dir/x.tsv";
  try {
    write_tsv(bad, pairs);
    BOOST_FAIL("expected std::runtime_error");
  } catch (const std::runtime_error& e) {
    BOOST_TEST(std::string(e.what()).find(bad) != std::string::npos);
  }
}

BOOST_AUTO_TEST_SUITE_END()
