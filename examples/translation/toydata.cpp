#include "examples/translation/toydata.h"

#include <array>
#include <ostream>
#include <stdexcept>
#include <unordered_set>

#include "graft/nn/train/checkpoint.h"

namespace graft::toy {
namespace {

// ---------------------------------------------------------------- lexicon ---

// Semantic classes keep sentences plausible ("eats an apple", not "eats a
// school") and pick which prepositions a place takes ("in the house" vs "on the
// table").
enum Cat : unsigned {
  ANIM = 1,
  FOOD = 2,
  TEXT = 4,
  ITEM = 8,
  ROOM = 16,     // "in"
  SURFACE = 32,  // "on", "under"
  THING = FOOD | TEXT | ITEM,
  PLACE = ROOM | SURFACE,
  ALL = ANIM | THING | PLACE,
};

enum Gender : int { M = 0, F = 1, N = 2 };  // column index into the article tables
constexpr int PL = 3;

struct Noun {
  const char *en, *en_pl, *de, *de_pl;
  Gender g;
  unsigned cat;
  bool weak = false;  // n-declension: "der Junge", "den Jungen"
};

const Noun NOUNS[] = {
    {"man", "men", "Mann", "Männer", M, ANIM},
    {"woman", "women", "Frau", "Frauen", F, ANIM},
    {"child", "children", "Kind", "Kinder", N, ANIM},
    {"boy", "boys", "Junge", "Jungen", M, ANIM, true},
    {"girl", "girls", "Mädchen", "Mädchen", N, ANIM},
    {"teacher", "teachers", "Lehrer", "Lehrer", M, ANIM},
    {"doctor", "doctors", "Arzt", "Ärzte", M, ANIM},
    {"friend", "friends", "Freund", "Freunde", M, ANIM},
    {"brother", "brothers", "Bruder", "Brüder", M, ANIM},
    {"dog", "dogs", "Hund", "Hunde", M, ANIM},
    {"cat", "cats", "Katze", "Katzen", F, ANIM},
    {"bird", "birds", "Vogel", "Vögel", M, ANIM},
    {"horse", "horses", "Pferd", "Pferde", N, ANIM},
    {"mouse", "mice", "Maus", "Mäuse", F, ANIM},
    {"apple", "apples", "Apfel", "Äpfel", M, FOOD},
    {"cake", "cakes", "Kuchen", "Kuchen", M, FOOD},
    {"egg", "eggs", "Ei", "Eier", N, FOOD},
    {"book", "books", "Buch", "Bücher", N, TEXT},
    {"letter", "letters", "Brief", "Briefe", M, TEXT},
    {"newspaper", "newspapers", "Zeitung", "Zeitungen", F, TEXT},
    {"ball", "balls", "Ball", "Bälle", M, ITEM},
    {"flower", "flowers", "Blume", "Blumen", F, ITEM},
    {"key", "keys", "Schlüssel", "Schlüssel", M, ITEM},
    {"picture", "pictures", "Bild", "Bilder", N, ITEM},
    {"cup", "cups", "Tasse", "Tassen", F, ITEM},
    {"house", "houses", "Haus", "Häuser", N, ROOM},
    {"garden", "gardens", "Garten", "Gärten", M, ROOM},
    {"car", "cars", "Auto", "Autos", N, ROOM},
    {"kitchen", "kitchens", "Küche", "Küchen", F, ROOM},
    {"school", "schools", "Schule", "Schulen", F, ROOM},
    {"table", "tables", "Tisch", "Tische", M, SURFACE},
    {"bed", "beds", "Bett", "Betten", N, SURFACE},
    {"chair", "chairs", "Stuhl", "Stühle", M, SURFACE},
    {"tree", "trees", "Baum", "Bäume", M, SURFACE},
    {"sofa", "sofas", "Sofa", "Sofas", N, SURFACE},
};

struct Adj {
  const char *en, *de;  // German stem without ending
  unsigned cat;         // nouns it may modify
};

const Adj ADJS[] = {
    {"old", "alt", ALL},
    {"young", "jung", ANIM},
    {"big", "groß", ALL},
    {"small", "klein", ALL},
    {"new", "neu", THING | PLACE},
    {"beautiful", "schön", ALL},
    {"tired", "müde", ANIM},
    {"clever", "klug", ANIM},
    {"hungry", "hungrig", ANIM},
    {"friendly", "freundlich", ANIM},
    {"red", "rot", ITEM | TEXT | PLACE},
    {"blue", "blau", ITEM | TEXT | PLACE},
    {"green", "grün", ITEM | FOOD | PLACE},
    {"black", "schwarz", ALL},
    {"white", "weiß", ALL},
};

enum class VClass : uint8_t { Trans, Ditrans, Dative, Intrans, Say };

struct Verb {
  const char *en, *en3, *en_past;
  std::array<const char*, 5> de;  // ich, du, er/sie/es, wir, sie (plural)
  const char* part;               // past participle for the Perfekt
  bool sein;                      // Perfekt auxiliary is "sein" (motion verbs)
  VClass cls;
  unsigned obj_cat;
  bool past_ok = true;
};

const Verb VERBS[] = {
    {"see",
     "sees",
     "saw",
     {"sehe", "siehst", "sieht", "sehen", "sehen"},
     "gesehen",
     false,
     VClass::Trans,
     ALL},
    // "read" is excluded from the past: English present and past coincide ("they
    // read the book"), which would give one English sentence two translations.
    {"read",
     "reads",
     "read",
     {"lese", "liest", "liest", "lesen", "lesen"},
     "gelesen",
     false,
     VClass::Trans,
     TEXT,
     false},
    {"eat",
     "eats",
     "ate",
     {"esse", "isst", "isst", "essen", "essen"},
     "gegessen",
     false,
     VClass::Trans,
     FOOD},
    {"buy",
     "buys",
     "bought",
     {"kaufe", "kaufst", "kauft", "kaufen", "kaufen"},
     "gekauft",
     false,
     VClass::Trans,
     THING | PLACE},
    {"find",
     "finds",
     "found",
     {"finde", "findest", "findet", "finden", "finden"},
     "gefunden",
     false,
     VClass::Trans,
     ANIM | THING},
    {"like",
     "likes",
     "liked",
     {"mag", "magst", "mag", "mögen", "mögen"},
     "gemocht",
     false,
     VClass::Trans,
     ALL},
    {"visit",
     "visits",
     "visited",
     {"besuche", "besuchst", "besucht", "besuchen", "besuchen"},
     "besucht",
     false,
     VClass::Trans,
     ANIM | ROOM},
    {"give",
     "gives",
     "gave",
     {"gebe", "gibst", "gibt", "geben", "geben"},
     "gegeben",
     false,
     VClass::Ditrans,
     THING},
    {"show",
     "shows",
     "showed",
     {"zeige", "zeigst", "zeigt", "zeigen", "zeigen"},
     "gezeigt",
     false,
     VClass::Ditrans,
     THING},
    {"bring",
     "brings",
     "brought",
     {"bringe", "bringst", "bringt", "bringen", "bringen"},
     "gebracht",
     false,
     VClass::Ditrans,
     THING},
    {"help",
     "helps",
     "helped",
     {"helfe", "hilfst", "hilft", "helfen", "helfen"},
     "geholfen",
     false,
     VClass::Dative,
     ANIM},
    {"thank",
     "thanks",
     "thanked",
     {"danke", "dankst", "dankt", "danken", "danken"},
     "gedankt",
     false,
     VClass::Dative,
     ANIM},
    {"sleep",
     "sleeps",
     "slept",
     {"schlafe", "schläfst", "schläft", "schlafen", "schlafen"},
     "geschlafen",
     false,
     VClass::Intrans,
     0},
    {"run",
     "runs",
     "ran",
     {"laufe", "läufst", "läuft", "laufen", "laufen"},
     "gelaufen",
     true,
     VClass::Intrans,
     0},
    {"drive",
     "drives",
     "drove",
     {"fahre", "fährst", "fährt", "fahren", "fahren"},
     "gefahren",
     true,
     VClass::Intrans,
     0},
    {"sing",
     "sings",
     "sang",
     {"singe", "singst", "singt", "singen", "singen"},
     "gesungen",
     false,
     VClass::Intrans,
     0},
    {"work",
     "works",
     "worked",
     {"arbeite", "arbeitest", "arbeitet", "arbeiten", "arbeiten"},
     "gearbeitet",
     false,
     VClass::Intrans,
     0},
    {"say",
     "says",
     "said",
     {"sage", "sagst", "sagt", "sagen", "sagen"},
     "gesagt",
     false,
     VClass::Say,
     0},
    {"think",
     "thinks",
     "thought",
     {"denke", "denkst", "denkt", "denken", "denken"},
     "gedacht",
     false,
     VClass::Say,
     0},
    {"know",
     "knows",
     "knew",
     {"weiß", "weißt", "weiß", "wissen", "wissen"},
     "gewusst",
     false,
     VClass::Say,
     0},
};

struct Prep {
  const char *en, *de;
  unsigned cat;  // nouns it may govern
};

// All take the dative here: the locatives describe position, not direction.
const Prep PREPS[] = {
    {"with", "mit", ANIM | ITEM},
    {"in", "in", ROOM},
    {"on", "auf", SURFACE},
    {"under", "unter", SURFACE},
    {"next to", "neben", ANIM | PLACE},
    {"behind", "hinter", ANIM | PLACE},
};

struct TimeAdverb {
  const char *en, *de;
  bool present_ok, past_ok;
};

const TimeAdverb TIME_ADVERBS[] = {
    {"today", "heute", true, true},         {"tomorrow", "morgen", true, false},
    {"now", "jetzt", true, false},          {"yesterday", "gestern", false, true},
    {"often", "oft", true, true},           {"sometimes", "manchmal", true, true},
    {"every day", "jeden Tag", true, true}, {"in the evening", "am Abend", true, true},
};

struct Manner {
  const char *en, *de;
};

const Manner MANNERS[] = {
    {"quickly", "schnell"}, {"slowly", "langsam"}, {"well", "gut"}, {"loudly", "laut"}};

const char* const NUM_EN[] = {"",    "",      "two",   "three", "four", "five",
                              "six", "seven", "eight", "nine",  "ten"};
const char* const NUM_DE[] = {"",      "",       "zwei", "drei", "vier", "fünf",
                              "sechs", "sieben", "acht", "neun", "zehn"};

const char* const PRON_EN[] = {"", "i", "you", "he", "she", "it", "we", "they"};
const char* const PRON_DE[] = {"", "ich", "du", "er", "sie", "es", "wir", "sie"};

const char* const CONJ_EN[] = {"", "because", "while", "if", "that"};
const char* const CONJ_DE[] = {"", "weil", "während", "wenn", "dass"};

// ------------------------------------------------------ German morphology ---

enum Case : int { NOM = 0, ACC = 1, DAT = 2 };

const char* const DEF_ART[3][4] = {
    {"der", "die", "das", "die"}, {"den", "die", "das", "die"}, {"dem", "der", "dem", "den"}};
const char* const EIN_ART[3][3] = {
    {"ein", "eine", "ein"}, {"einen", "eine", "ein"}, {"einem", "einer", "einem"}};
const char* const KEINE_PL[3] = {"keine", "keine", "keinen"};

// Weak endings follow der/die/das (and plural keine), mixed follow ein/kein,
// strong apply when no article carries the case (bare plurals, numerals).
const char* const WEAK[3][4] = {
    {"e", "e", "e", "en"}, {"en", "e", "e", "en"}, {"en", "en", "en", "en"}};
const char* const MIXED[3][3] = {{"er", "e", "es"}, {"en", "e", "es"}, {"en", "en", "en"}};
const char* const STRONG_PL[3] = {"e", "e", "en"};

std::string inflect_adj(std::string stem, std::string_view ending) {
  // "müde" + "en" -> "müden", not "müdeen".
  if (!stem.empty() && stem.back() == 'e' && !ending.empty() && ending.front() == 'e')
    ending.remove_prefix(1);
  return stem.append(ending);
}

std::string noun_form_de(const Noun& n, bool plural, Case c) {
  std::string w = plural ? n.de_pl : n.de;
  if (plural) {
    // Dative plural adds -n unless the plural already ends in -n or -s.
    if (c == DAT && w.back() != 'n' && w.back() != 's') w += 'n';
  } else if (n.weak && c != NOM) {
    w += 'n';
  }
  return w;
}

using Words = std::vector<std::string>;

int person(const NP& np) {
  switch (np.pron) {
    case Pron::I:
      return 0;
    case Pron::You:
      return 1;
    case Pron::He:
    case Pron::She:
    case Pron::It:
      return 2;
    case Pron::We:
      return 3;
    case Pron::They:
      return 4;
    case Pron::None:
      break;
  }
  return np.plural ? 4 : 2;
}

// ------------------------------------------------------------- validation ---

[[noreturn]] void bad(const std::string& what) {
  throw std::invalid_argument("toydata::render: " + what);
}

template <class T, size_t K>
void check_index(int i, const T (&)[K], const char* what) {
  if (i < 0 || static_cast<size_t>(i) >= K) bad(std::string("bad ") + what + " index");
}

void check_np(const NP& np, bool pronoun_ok) {
  if (np.pron != Pron::None) {
    if (!pronoun_ok) bad("pronouns are only supported as subjects");
    return;
  }
  check_index(np.noun, NOUNS, "noun");
  if (np.adj != -1) check_index(np.adj, ADJS, "adjective");
  if (np.det == Det::Num && (!np.plural || np.count < 2 || np.count > 10))
    bad("numeral needs plural and count 2..10");
}

void check_clause(const Clause& c) {
  check_np(c.subj, true);
  check_index(c.verb, VERBS, "verb");
  const Verb& v = VERBS[c.verb];
  const bool needs_obj =
      v.cls == VClass::Trans || v.cls == VClass::Ditrans || v.cls == VClass::Dative;
  if (needs_obj != c.obj.has_value()) bad(std::string("object mismatch for verb ") + v.en);
  if ((v.cls == VClass::Ditrans) != c.iobj.has_value())
    bad(std::string("indirect object mismatch for verb ") + v.en);
  if (c.obj) check_np(*c.obj, false);
  if (c.iobj) check_np(*c.iobj, false);
  if (c.tense == Tense::Past && !v.past_ok)
    bad(std::string("verb has no unambiguous past: ") + v.en);
}

// ---------------------------------------------------------------- English ---

void en_np(Words& w, const NP& np) {
  if (np.pron != Pron::None) {
    w.emplace_back(PRON_EN[static_cast<int>(np.pron)]);
    return;
  }
  const Noun& n = NOUNS[np.noun];
  const size_t art = w.size();
  if (np.det == Det::Def) w.emplace_back("the");
  if (np.det == Det::Num) w.emplace_back(NUM_EN[np.count]);
  if (np.adj >= 0) w.emplace_back(ADJS[np.adj].en);
  w.emplace_back(np.plural ? n.en_pl : n.en);
  if (np.det == Det::Indef && !np.plural) {
    const char first = w[art][0];
    const bool vowel = first == 'a' || first == 'e' || first == 'i' || first == 'o' || first == 'u';
    w.insert(w.begin() + static_cast<std::ptrdiff_t>(art), vowel ? "an" : "a");
  }
}

bool third_singular(const NP& s) {
  if (s.pron != Pron::None) return s.pron == Pron::He || s.pron == Pron::She || s.pron == Pron::It;
  return !s.plural;
}

void en_verb(Words& w, const Clause& c) {
  const Verb& v = VERBS[c.verb];
  const bool s3 = third_singular(c.subj);
  if (c.tense == Tense::Past) {
    if (c.negated) w.insert(w.end(), {"did", "not", v.en});
    else w.emplace_back(v.en_past);
  } else {
    if (c.negated) w.insert(w.end(), {s3 ? "does" : "do", "not", v.en});
    else w.emplace_back(s3 ? v.en3 : v.en);
  }
}

void en_clause(Words& w, const Clause& c) {
  en_np(w, c.subj);
  en_verb(w, c);
  if (c.iobj) en_np(w, *c.iobj);
  if (c.obj) en_np(w, *c.obj);
}

void en_sub(Words& w, Conj conj, const Clause& c) {
  w.emplace_back(CONJ_EN[static_cast<int>(conj)]);
  en_clause(w, c);
}

Words english(const Sentence& s) {
  Words w;
  const bool adverbial = s.conj != Conj::None && s.conj != Conj::That;
  if (adverbial && s.sub_first) {
    en_sub(w, s.conj, s.sub);
    w.emplace_back(",");
  } else if (s.time_adverb >= 0) {
    w.emplace_back(TIME_ADVERBS[s.time_adverb].en);
  }
  en_clause(w, s.main);
  if (s.manner >= 0) w.emplace_back(MANNERS[s.manner].en);
  if (s.prep >= 0) {
    w.emplace_back(PREPS[s.prep].en);
    en_np(w, s.pp);
  }
  if (s.conj != Conj::None && !(adverbial && s.sub_first)) en_sub(w, s.conj, s.sub);
  w.emplace_back(".");
  return w;
}

// ----------------------------------------------------------------- German ---

void de_np(Words& w, const NP& np, Case c, bool kein) {
  if (np.pron != Pron::None) {
    w.emplace_back(PRON_DE[static_cast<int>(np.pron)]);  // subjects only, so nominative
    return;
  }
  const Noun& n = NOUNS[np.noun];
  const int g = np.plural ? PL : n.g;
  std::string article;
  const char* ending = nullptr;
  switch (np.det) {
    case Det::Def:
      article = DEF_ART[c][g];
      ending = WEAK[c][g];
      break;
    case Det::Indef:
      if (!np.plural) {
        article = std::string(kein ? "k" : "") + EIN_ART[c][g];
        ending = MIXED[c][g];
      } else if (kein) {
        article = KEINE_PL[c];
        ending = WEAK[c][PL];
      } else {
        ending = STRONG_PL[c];
      }
      break;
    case Det::Num:
      article = NUM_DE[np.count];
      ending = STRONG_PL[c];
      break;
  }
  if (!article.empty()) w.push_back(article);
  if (np.adj >= 0) w.push_back(inflect_adj(ADJS[np.adj].de, ending));
  w.push_back(noun_form_de(n, np.plural, c));
}

void de_pp(Words& w, int prep, const NP& np) {
  Words inner;
  de_np(inner, np, DAT, false);
  const std::string p = PREPS[prep].de;
  if (p == "in" && inner.front() == "dem") {
    inner.front() = "im";  // obligatory contraction in neutral register
  } else {
    w.push_back(p);
  }
  w.insert(w.end(), inner.begin(), inner.end());
}

// Objects (dative before accusative for full NPs) and the negation. A negated
// indefinite object absorbs the negation as "kein"; otherwise "nicht" follows
// the objects and precedes manner adverbs and prepositional phrases.
void de_middle(Words& w, const Clause& c) {
  const Verb& v = VERBS[c.verb];
  const bool kein = c.negated && c.obj && c.obj->det == Det::Indef;
  if (c.iobj) de_np(w, *c.iobj, DAT, false);
  if (c.obj) de_np(w, *c.obj, v.cls == VClass::Dative ? DAT : ACC, kein);
  if (c.negated && !kein) w.emplace_back("nicht");
}

const char* de_finite(const Clause& c) {
  const Verb& v = VERBS[c.verb];
  const int p = person(c.subj);
  if (c.tense == Tense::Present) return v.de[p];
  static const char* const HABEN[] = {"habe", "hast", "hat", "haben", "haben"};
  static const char* const SEIN[] = {"bin", "bist", "ist", "sind", "sind"};
  return v.sein ? SEIN[p] : HABEN[p];
}

// Subordinate clause: verb-final, participle before the finite auxiliary.
void de_sub(Words& w, Conj conj, const Clause& c) {
  w.emplace_back(CONJ_DE[static_cast<int>(conj)]);
  de_np(w, c.subj, NOM, false);
  de_middle(w, c);
  if (c.tense == Tense::Past) w.emplace_back(VERBS[c.verb].part);
  w.emplace_back(de_finite(c));
}

Words german(const Sentence& s) {
  Words w;
  const Clause& m = s.main;
  const bool adverbial = s.conj != Conj::None && s.conj != Conj::That;
  // Verb-second: whatever fills the first position (fronted clause, time
  // adverb or subject), the finite verb comes next.
  bool subject_done = false;
  if (adverbial && s.sub_first) {
    de_sub(w, s.conj, s.sub);
    w.emplace_back(",");
  } else if (s.time_adverb >= 0) {
    w.emplace_back(TIME_ADVERBS[s.time_adverb].de);
  } else {
    de_np(w, m.subj, NOM, false);
    subject_done = true;
  }
  w.emplace_back(de_finite(m));
  if (!subject_done) de_np(w, m.subj, NOM, false);
  de_middle(w, m);
  if (s.manner >= 0) w.emplace_back(MANNERS[s.manner].de);
  if (s.prep >= 0) de_pp(w, s.prep, s.pp);
  if (m.tense == Tense::Past) w.emplace_back(VERBS[m.verb].part);
  if (s.conj != Conj::None && !(adverbial && s.sub_first)) {
    w.emplace_back(",");
    de_sub(w, s.conj, s.sub);
  }
  w.emplace_back(".");
  return w;
}

std::string join(const Words& w) {
  std::string out;
  for (const auto& t : w) {
    if (!out.empty()) out += ' ';
    out += t;
  }
  return out;
}

// -------------------------------------------------------------- generator ---

// splitmix64: tiny, well-mixed, and identical on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Unbiased draw in [0, n) by rejecting the incomplete top bucket.
  size_t below(size_t n) {
    const uint64_t bound = static_cast<uint64_t>(n);
    const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    uint64_t x;
    do x = next();
    while (x >= limit);
    return static_cast<size_t>(x % bound);
  }
  bool chance(double p) { return static_cast<double>(next() >> 11) * 0x1.0p-53 < p; }
  template <class T, size_t K>
  int pick(const T (&)[K]) {
    return static_cast<int>(below(K));
  }
  int pick(const std::vector<int>& v) { return v[below(v.size())]; }

 private:
  uint64_t s_;
};

std::vector<int> nouns_in(unsigned cat) {
  std::vector<int> out;
  for (size_t i = 0; i < std::size(NOUNS); ++i)
    if (NOUNS[i].cat & cat) out.push_back(static_cast<int>(i));
  return out;
}

NP gen_np(Rng& r, unsigned cat, bool allow_num) {
  NP np;
  np.noun = r.pick(nouns_in(cat));
  np.plural = r.chance(0.35);
  const double u = static_cast<double>(r.below(100)) / 100.0;
  if (!np.plural) {
    np.det = u < 0.6 ? Det::Def : Det::Indef;
  } else {
    np.det = u < 0.4 ? Det::Def : (u < 0.65 || !allow_num ? Det::Indef : Det::Num);
    if (np.det == Det::Num) np.count = 2 + static_cast<int>(r.below(9));
  }
  if (r.chance(0.4)) {
    std::vector<int> adjs;
    for (size_t i = 0; i < std::size(ADJS); ++i)
      if (ADJS[i].cat & NOUNS[np.noun].cat) adjs.push_back(static_cast<int>(i));
    np.adj = r.pick(adjs);
  }
  return np;
}

NP gen_subject(Rng& r) {
  if (r.chance(0.25)) {
    NP np;
    np.pron = static_cast<Pron>(1 + r.below(7));
    return np;
  }
  return gen_np(r, ANIM, true);
}

Clause gen_clause(Rng& r, bool allow_say, Tense tense) {
  Clause c;
  do c.verb = r.pick(VERBS);
  while ((!allow_say && VERBS[c.verb].cls == VClass::Say) ||
         (tense == Tense::Past && !VERBS[c.verb].past_ok));
  const Verb& v = VERBS[c.verb];
  c.tense = tense;
  c.negated = r.chance(0.25);
  c.subj = gen_subject(r);
  // A numeral under negation ("does not see two dogs") has no neutral German
  // word order, so negated clauses never get one on the object.
  if (v.cls == VClass::Ditrans) c.iobj = gen_np(r, ANIM, true);
  if (v.cls == VClass::Trans || v.cls == VClass::Ditrans || v.cls == VClass::Dative)
    c.obj = gen_np(r, v.obj_cat, !c.negated);
  return c;
}

Sentence gen_sentence(Rng& r) {
  Sentence s;
  const Tense tense = r.chance(0.25) ? Tense::Past : Tense::Present;
  s.main = gen_clause(r, true, tense);
  const Verb& v = VERBS[s.main.verb];
  if (v.cls == VClass::Say) {
    s.conj = Conj::That;
    s.sub = gen_clause(r, false, r.chance(0.25) ? Tense::Past : Tense::Present);
  } else if (r.chance(0.25)) {
    s.conj = static_cast<Conj>(1 + r.below(3));
    s.sub_first = r.chance(0.35);
    s.sub = gen_clause(r, false, tense);  // keep the tenses of cause and effect aligned
  }
  if (v.cls == VClass::Intrans && r.chance(0.35)) s.manner = r.pick(MANNERS);
  if (s.conj == Conj::None && v.cls != VClass::Ditrans &&
      r.chance(v.cls == VClass::Intrans ? 0.6 : 0.4)) {
    s.prep = r.pick(PREPS);
    s.pp = gen_np(r, PREPS[s.prep].cat, true);
  }
  if (!s.sub_first && r.chance(0.25)) {
    std::vector<int> ok;
    for (size_t i = 0; i < std::size(TIME_ADVERBS); ++i) {
      const auto& a = TIME_ADVERBS[i];
      if (tense == Tense::Past ? a.past_ok : a.present_ok) ok.push_back(static_cast<int>(i));
    }
    s.time_adverb = r.pick(ok);
  }
  return s;
}

size_t word_count(const std::string& s) {
  size_t n = 0;
  bool in_word = false;
  for (char ch : s) {
    if (ch == ' ') {
      in_word = false;
    } else if (!in_word) {
      in_word = true;
      if (ch != ',' && ch != '.') ++n;
    }
  }
  return n;
}

template <class T>
int find_id(const T* table, size_t n, std::string_view en, const char* what) {
  for (size_t i = 0; i < n; ++i)
    if (en == table[i].en) return static_cast<int>(i);
  throw std::invalid_argument(std::string("toydata: unknown ") + what + ": " + std::string(en));
}

}  // namespace

Pair render(const Sentence& s) {
  check_clause(s.main);
  const VClass cls = VERBS[s.main.verb].cls;
  if ((cls == VClass::Say) != (s.conj == Conj::That))
    bad("\"that\" clauses go with say/think/know and only there");
  if (s.conj != Conj::None) check_clause(s.sub);
  if (s.sub_first && (s.conj == Conj::None || s.conj == Conj::That))
    bad("only adverbial clauses can be fronted");
  if (s.sub_first && s.time_adverb >= 0)
    bad("fronted clause and fronted adverb compete for the first position");
  if (s.time_adverb != -1) check_index(s.time_adverb, TIME_ADVERBS, "time adverb");
  if (s.manner != -1) {
    check_index(s.manner, MANNERS, "manner adverb");
    if (cls != VClass::Intrans) bad("manner adverbs only with intransitive verbs");
  }
  if (s.prep != -1) {
    check_index(s.prep, PREPS, "preposition");
    check_np(s.pp, false);
  }
  return {join(english(s)), join(german(s))};
}

Splits generate(uint64_t seed, size_t n_train, size_t n_valid, size_t n_test) {
  Rng r(seed);
  std::unordered_set<std::string> seen;
  Splits out;
  const size_t total = n_train + n_valid + n_test;
  const size_t max_attempts = 50 * total + 100000;
  size_t attempts = 0;
  for (std::vector<Pair>* split : {&out.test, &out.valid, &out.train}) {
    const size_t want = split == &out.test ? n_test : split == &out.valid ? n_valid : n_train;
    split->reserve(want);
    while (split->size() < want) {
      if (++attempts > max_attempts)
        throw std::runtime_error("toydata::generate: cannot find " + std::to_string(total) +
                                 " distinct sentences");
      Pair p = render(gen_sentence(r));
      const size_t en = word_count(p.src), de = word_count(p.tgt);
      if (en < 3 || en > 16 || de > 16) continue;  // keep the length band the model is sized for
      if (!seen.insert(p.src).second) continue;
      split->push_back(std::move(p));
    }
  }
  return out;
}

// Through train::atomic_write: a file or link planted in the output directory is replaced, never
// written through, and a failed write leaves what was there.
void write_tsv(const std::string& path, const std::vector<Pair>& pairs) {
  train::atomic_write(path, [&](std::ostream& os) {
    for (const auto& p : pairs) os << p.src << '\t' << p.tgt << '\n';
  });
}

int noun_id(std::string_view en) { return find_id(NOUNS, std::size(NOUNS), en, "noun"); }
int verb_id(std::string_view en) { return find_id(VERBS, std::size(VERBS), en, "verb"); }
int adj_id(std::string_view en) { return find_id(ADJS, std::size(ADJS), en, "adjective"); }
int prep_id(std::string_view en) { return find_id(PREPS, std::size(PREPS), en, "preposition"); }
int time_adverb_id(std::string_view en) {
  return find_id(TIME_ADVERBS, std::size(TIME_ADVERBS), en, "time adverb");
}
int manner_id(std::string_view en) {
  return find_id(MANNERS, std::size(MANNERS), en, "manner adverb");
}

LexiconSize lexicon_size() {
  return {std::size(NOUNS),        std::size(VERBS),   std::size(ADJS),      std::size(PREPS),
          std::size(TIME_ADVERBS), std::size(MANNERS), std::size(NUM_EN) - 2};
}

}  // namespace graft::toy
