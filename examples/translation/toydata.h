// Toy English -> German parallel corpus.
//
// Sentences are produced from an abstract structure (Sentence) that is rendered
// into both languages, so the English -> German mapping is a function: every
// English sentence has exactly one German translation.  The German renderer does
// the real work (gender/number/case agreement, adjective declension, kein/nicht,
// verb-second and verb-final order, Perfekt for English simple past), which is
// what makes this a translation task rather than a word-substitution task.
//
// Conventions: everything lowercase except German nouns; punctuation ("," and
// ".") is a separate whitespace-delimited token; German uses UTF-8 umlauts and ß.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace graft::toy {

struct Pair {
  std::string src, tgt;  // English, German
};

struct Splits {
  std::vector<Pair> train, valid, test;
};

// Subject pronouns; English "you" is always rendered as singular informal "du".
enum class Pron : uint8_t { None, I, You, He, She, It, We, They };

// Indef + plural is a bare plural ("dogs" / "Hunde"); Num uses NP::count (2..10).
enum class Det : uint8_t { Def, Indef, Num };

// English simple past is rendered as German Perfekt (the usual spoken past).
enum class Tense : uint8_t { Present, Past };

enum class Conj : uint8_t { None, Because, While, If, That };

// Noun phrase. Either a pronoun (pron != None, subjects only) or a lexicon noun.
struct NP {
  Pron pron = Pron::None;
  int noun = -1;  // index from noun_id()
  bool plural = false;
  Det det = Det::Def;
  int count = 0;  // only for Det::Num
  int adj = -1;   // index from adj_id(), -1 = none
};

struct Clause {
  NP subj;
  int verb = -1;           // index from verb_id()
  std::optional<NP> iobj;  // dative indirect object (give/show/bring)
  std::optional<NP> obj;   // accusative object, or dative for help/thank
  bool negated = false;
  Tense tense = Tense::Present;
};

struct Sentence {
  Clause main;
  int time_adverb = -1;  // fronted, triggers verb-second inversion
  int manner = -1;       // manner adverb, intransitive main verbs only
  int prep = -1;         // optional prepositional phrase (dative) ...
  NP pp;                 // ... and its noun phrase
  Conj conj = Conj::None;
  bool sub_first = false;  // adverbial clause fronted: "because ..., the man ..."
  Clause sub;              // used when conj != None
};

// Renders a structure in both languages. Throws std::invalid_argument when the
// structure is inconsistent (e.g. a transitive verb without object).
Pair render(const Sentence& s);

// Deterministic for a given seed (own splitmix64 generator, so the output does not
// depend on the standard library). English sentences are unique across all
// splits. The test split is drawn first, then valid, then train, so changing
// n_train does not change valid/test. Throws std::runtime_error if the grammar
// cannot supply that many distinct sentences.
Splits generate(uint64_t seed, size_t n_train, size_t n_valid, size_t n_test);

// Writes "src<TAB>tgt\n" lines through train::atomic_write; throws graft::Error naming the path
// on I/O failure.
void write_tsv(const std::string& path, const std::vector<Pair>& pairs);

// Lexicon lookups by English lemma (noun singular, verb base form, "next to",
// "every day", ...). Throw std::invalid_argument for unknown words.
int noun_id(std::string_view en);
int verb_id(std::string_view en);
int adj_id(std::string_view en);
int prep_id(std::string_view en);
int time_adverb_id(std::string_view en);
int manner_id(std::string_view en);

struct LexiconSize {
  size_t nouns, verbs, adjectives, prepositions, time_adverbs, manner_adverbs, numbers;
};
LexiconSize lexicon_size();

}  // namespace graft::toy
