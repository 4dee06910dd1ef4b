#include "bleu.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string_view>
#include <unordered_map>

namespace graft::text {
namespace {

constexpr int kMaxOrder = 4;

// Decodes one UTF-8 code point at s[i]. Malformed input yields the single
// byte as a pseudo code point >= 0x80 that is not whitespace, so BLEU on
// broken text degrades gracefully instead of throwing.
char32_t decode_at(std::string_view s, size_t i, size_t& len) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  len = 1;
  if (b0 < 0x80) return b0;
  size_t n = b0 >= 0xF0 ? 4 : b0 >= 0xE0 ? 3 : b0 >= 0xC0 ? 2 : 0;
  if (n == 0 || i + n > s.size()) return 0xFFFD;
  char32_t cp = b0 & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) return 0xFFFD;
    cp = (cp << 6) | (b & 0x3F);
  }
  len = n;
  return cp;
}

// sacreBLEU splits tokens with Python's str.split()/str.strip(), whose notion
// of whitespace is str.isspace(): Unicode Zs plus the B/S/WS bidi classes.
// Matching it exactly matters for e.g. U+00A0 NO-BREAK SPACE, which is a
// token boundary in sacreBLEU but would not be for an ASCII-only split.
bool py_isspace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

std::vector<std::string> py_split(std::string_view s) {
  std::vector<std::string> out;
  std::string cur;
  for (size_t i = 0; i < s.size();) {
    size_t len;
    const char32_t c = decode_at(s, i, len);
    if (py_isspace(c)) {
      if (!cur.empty()) out.push_back(std::move(cur)), cur.clear();
    } else {
      cur.append(s.substr(i, len));
    }
    i += len;
  }
  if (!cur.empty()) out.push_back(std::move(cur));
  return out;
}

std::string py_rstrip(std::string_view s) {
  size_t end = 0;  // one past the last non-space code point
  for (size_t i = 0; i < s.size();) {
    size_t len;
    const char32_t c = decode_at(s, i, len);
    i += len;
    if (!py_isspace(c)) end = i;
  }
  return std::string(s.substr(0, end));
}

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  for (size_t hit; (hit = s.find(from, pos)) != std::string::npos; pos = hit + from.size()) {
    out.append(s, pos, hit - pos);
    out.append(to);
  }
  out.append(s, pos, std::string::npos);
  s = std::move(out);
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// Emulates Python re.sub for a two-character pattern "(A)(B)": matches are
// found left to right and do not overlap, so after a match scanning resumes
// after B. This precise semantics is what makes "a.." tokenise like sacreBLEU.
template <class A, class B, class R>
std::string sub_pair(const std::string& s, A a, B b, R repl) {
  std::string out;
  out.reserve(s.size() + s.size() / 4);
  size_t i = 0;
  while (i < s.size()) {
    if (i + 1 < s.size() && a(s[i]) && b(s[i + 1])) {
      repl(out, s[i], s[i + 1]);
      i += 2;
    } else {
      out.push_back(s[i++]);
    }
  }
  return out;
}

double my_log(double x) { return x == 0.0 ? -9999999999.0 : std::log(x); }

using NgramCounts = std::unordered_map<std::string, int>;

// Keys join tokens with ' ', which cannot occur inside a token because the
// tokens came from a whitespace split.
NgramCounts count_ngrams(const std::vector<std::string>& toks) {
  NgramCounts counts;
  for (int n = 1; n <= kMaxOrder; ++n) {
    for (size_t i = 0; i + n <= toks.size(); ++i) {
      std::string key = toks[i];
      for (int k = 1; k < n; ++k) key += ' ', key += toks[i + k];
      ++counts[key];
    }
  }
  return counts;
}

int order_of(const std::string& key) {
  return 1 + static_cast<int>(std::count(key.begin(), key.end(), ' '));
}

}  // namespace

// The 13a rules, in the order sacreBLEU (after mteval-v13a.pl) applies them:
//  1. Remove every "<skipped>" tag (a WMT marker for untranslated segments).
//  2. Join words hyphenated across a line break: "-\n" -> "".
//  3. Remaining "\n" -> " ".
//  4. Unescape the SGML entities &quot; &amp; &lt; &gt; -- sequentially, in
//     that order, so "&amp;lt;" ends up as "<" exactly as in the original.
//  5. Pad the line with one space on each side, then apply, each as a
//     separate global substitution:
//     a. Every ASCII char in [{-~ [-` space-& (-+ :-@ /] gets spaces around
//        it -- i.e. all ASCII punctuation/symbols except ' , - . (and
//        digits/letters are untouched).
//     b. ([^0-9])([.,]) -> "\1 \2 "  (split . or , unless preceded by a digit)
//     c. ([.,])([^0-9]) -> " \1 \2"  (split . or , unless followed by a digit)
//        Together b and c keep "3.5" and "1,000" whole but split "end.".
//     d. ([0-9])(-)     -> "\1 \2 "  (split a dash that follows a digit)
//  6. Collapse whitespace (Python str.split semantics) to single spaces.
//
// Every pattern consists of ASCII characters, and in UTF-8 ASCII bytes never
// occur inside a multi-byte sequence, so running the rules over bytes cannot
// split a character. For [^0-9], a byte-level match on the last (or first)
// byte of a multi-byte character corresponds one-to-one with Python's
// code-point match on that character, and continuation bytes can never start
// a match, so the left-to-right non-overlapping scan also agrees.
namespace {

// Rules 1-4: drop <skipped>, join dash-newline, newlines to spaces, unescape the four entities;
// then pad with a space on each side.
std::string unescape_13a(const std::string& input) {
  std::string line = input;
  replace_all(line, "<skipped>", "");
  replace_all(line, "-\n", "");
  replace_all(line, "\n", " ");
  replace_all(line, "&quot;", "\"");
  replace_all(line, "&amp;", "&");
  replace_all(line, "&lt;", "<");
  replace_all(line, "&gt;", ">");
  return " " + line + " ";
}

// Rule 5a: spaces around every ASCII symbol but ' , - . (digits and letters untouched).
std::string space_symbols(const std::string& line) {
  auto is_sym = [](char ch) {
    const auto c = static_cast<unsigned char>(ch);
    return (c >= '{' && c <= '~') || (c >= '[' && c <= '`') || (c >= ' ' && c <= '&') ||
           (c >= '(' && c <= '+') || (c >= ':' && c <= '@') || c == '/';
  };
  std::string out;
  out.reserve(line.size() * 2);
  for (char c : line) {
    if (is_sym(c)) {
      out += ' ', out += c, out += ' ';
    } else {
      out += c;
    }
  }
  return out;
}

// Rules 5b-5d: . and , split off unless between digits, and a dash after a digit.
std::string split_punctuation(std::string line) {
  auto not_digit = [](char c) { return !is_digit(c); };
  auto dot_comma = [](char c) { return c == '.' || c == ','; };
  line = sub_pair(line, not_digit, dot_comma,
                  [](std::string& o, char x, char y) { o += x, o += ' ', o += y, o += ' '; });
  line = sub_pair(line, dot_comma, not_digit,
                  [](std::string& o, char x, char y) { o += ' ', o += x, o += ' ', o += y; });
  return sub_pair(
      line, is_digit, [](char c) { return c == '-'; },
      [](std::string& o, char x, char y) { o += x, o += ' ', o += y, o += ' '; });
}

// Rule 6: whitespace collapsed to single spaces (Python str.split semantics).
std::string collapse_whitespace(const std::string& line) {
  std::string joined;
  for (const auto& tok : py_split(line)) {
    if (!joined.empty()) joined += ' ';
    joined += tok;
  }
  return joined;
}

}  // namespace

std::string tokenize_13a(const std::string& input) {
  return collapse_whitespace(split_punctuation(space_symbols(unescape_13a(input))));
}

namespace {

// The corpus's clipped n-gram matches and n-gram totals of each order, and its lengths.
struct MatchCounts {
  std::array<size_t, kMaxOrder> correct{}, total{};
  size_t sys_len = 0, ref_len = 0;
};

MatchCounts count_matches(const std::vector<std::string>& hyps,
                          const std::vector<std::string>& refs) {
  MatchCounts m;
  for (size_t s = 0; s < hyps.size(); ++s) {
    // sacreBLEU rstrips before tokenising; that is observable: a trailing
    // "word-\n" keeps its dash because the newline is gone before rule 2.
    const auto h = py_split(tokenize_13a(py_rstrip(hyps[s])));
    const auto r = py_split(tokenize_13a(py_rstrip(refs[s])));
    m.sys_len += h.size();
    m.ref_len += r.size();
    const NgramCounts hc = count_ngrams(h), rc = count_ngrams(r);
    for (const auto& [key, cnt] : hc) {
      const int n = order_of(key);
      const auto it = rc.find(key);
      if (it != rc.end()) m.correct[n - 1] += static_cast<size_t>(std::min(cnt, it->second));
    }
    for (int n = 1; n <= kMaxOrder; ++n) {
      if (h.size() >= static_cast<size_t>(n)) m.total[n - 1] += h.size() - n + 1;
    }
  }
  return m;
}

}  // namespace

BleuResult corpus_bleu(const std::vector<std::string>& hyps, const std::vector<std::string>& refs) {
  if (hyps.size() != refs.size()) {
    throw std::invalid_argument("corpus_bleu: " + std::to_string(hyps.size()) + " hypotheses but " +
                                std::to_string(refs.size()) + " references");
  }
  const MatchCounts m = count_matches(hyps, refs);
  const auto& correct = m.correct;
  const auto& total = m.total;
  const size_t sys_len = m.sys_len, ref_len = m.ref_len;

  BleuResult res;
  res.sys_len = sys_len;
  res.ref_len = ref_len;
  res.ratio = ref_len ? static_cast<double>(sys_len) / static_cast<double>(ref_len) : 0.0;
  res.signature = "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.0.0-graft";
  if (sys_len < ref_len) {
    res.bp = sys_len > 0
                 ? std::exp(1.0 - static_cast<double>(ref_len) / static_cast<double>(sys_len))
                 : 0.0;
  } else {
    res.bp = 1.0;
  }

  // sacreBLEU returns 0 outright when nothing matches; otherwise the "exp"
  // smoothing below would give a disjoint corpus a small positive score.
  if (std::all_of(correct.begin(), correct.end(), [](size_t c) { return c == 0; })) {
    res.score = 0.0;
    return res;
  }

  // "exp" smoothing (mteval-v13a / Chen & Cherry method 3): the k-th order
  // with zero matches gets precision 1 / (2^k * total). An order with no
  // n-grams at all (every hypothesis shorter than n) ends the loop and keeps
  // precision 0, which drives the score to 0 via my_log, as in sacreBLEU.
  double smooth = 1.0;
  for (int n = 0; n < kMaxOrder; ++n) {
    if (total[n] == 0) break;
    if (correct[n] == 0) {
      smooth *= 2.0;
      res.precisions[n] = 100.0 / (smooth * static_cast<double>(total[n]));
    } else {
      res.precisions[n] = 100.0 * static_cast<double>(correct[n]) / static_cast<double>(total[n]);
    }
  }
  double log_sum = 0.0;
  for (double p : res.precisions) log_sum += my_log(p);
  res.score = res.bp * std::exp(log_sum / kMaxOrder);
  return res;
}

std::string BleuResult::str() const {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "BLEU = %.2f %.1f/%.1f/%.1f/%.1f (BP = %.3f ratio = %.3f "
                "hyp_len = %zu ref_len = %zu)",
                score, precisions[0], precisions[1], precisions[2], precisions[3], bp, ratio,
                sys_len, ref_len);
  return buf;
}

}  // namespace graft::text
