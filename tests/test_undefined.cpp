// Issue 31, "no segfault from any API call": every public function and method that takes a
// Tensor gets an undefined Tensor() in each Tensor parameter in turn and must throw graft::Error
// (or, for a parameter documented as optional, accept it), never crash. The list of functions
// comes from the public headers, parsed at test time (see public_tensor_functions()), so a new
// public function without a case fails `every_public_function_taking_a_tensor_has_a_case`, as
// tests/test_gradcheck_all.cpp fails for a declared op without a record. A free function named as
// a recorded op is covered by its record (graft/testing/registry.h: each sample's inputs made
// undefined in turn, `every_record_refuses_an_undefined_input`); every other case names its
// function by SIG(), which builds the signature from the function itself (no signature is typed
// as a string).
#include <boost/core/demangle.hpp>
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <vector>

#include "graft/autograd/graph.h"
#include "graft/autograd/tape.h"
#include "graft/models/bert.h"
#include "graft/models/config_json.h"
#include "graft/models/decoder_only_lm.h"
#include "graft/models/encoder_classifier.h"
#include "graft/models/sentence_encoder.h"
#include "graft/models/transformer.h"
#include "graft/nn/attention.h"
#include "graft/nn/layers.h"
#include "graft/nn/module.h"
#include "graft/nn/positions.h"
#include "graft/nn/train/communicator.h"
#include "graft/nn/transformer.h"
#include "graft/ops/ops.h"
#include "graft/testing/op_cases.h"
#include "test_util.h"

using namespace graft;

namespace {

// ---- the functions the public headers declare ------------------------------------------------

// One declaration: "Class::name(param types)" with parameter names and defaults dropped, such as
// "where(const Tensor&, const Tensor&, const Tensor&)" or "Linear::forward(const Tensor&)".
struct Declared {
  std::string signature, header;
};

// Drops comments and preprocessor lines (with their continuations).
std::string strip(const std::string& text) {
  std::string out;
  std::istringstream in(text);
  bool continued = false;
  for (std::string line; std::getline(in, line);) {
    const size_t first = line.find_first_not_of(" \t");
    const bool directive = continued || (first != std::string::npos && line[first] == '#');
    continued = directive && !line.empty() && line.back() == '\\';
    if (directive) continue;
    out += line.substr(0, line.find("//")) + "\n";
  }
  return out;
}

// A parameter's type: its default and its name dropped, spaces normalised ("const Tensor& a = x"
// -> "const Tensor&").
std::string param_type(std::string p) {
  int depth = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    depth += p[i] == '(' || p[i] == '<' || p[i] == '{';
    depth -= p[i] == ')' || p[i] == '>' || p[i] == '}';
    if (p[i] == '=' && depth == 0) p.resize(i);
  }
  p = std::regex_replace(p, std::regex(R"(\s+)"), " ");
  p = std::regex_replace(p, std::regex(R"(\s*([&*]+))"), "$1");
  p = std::regex_replace(p, std::regex(R"(^\s+|\s+$)"), "");
  std::smatch m;
  if (std::regex_match(p, m, std::regex(R"((.*[\w>&*]) (\w+))")) && m[1] != "const") return m[1];
  return p;
}

// The parameters of a list, split at top-level commas.
std::vector<std::string> split_params(const std::string& list) {
  std::vector<std::string> out;
  std::string cur;
  int depth = 0;
  for (char c : list) {
    depth += c == '(' || c == '<' || c == '{';
    depth -= c == ')' || c == '>' || c == '}';
    if (c == ',' && depth == 0) {
      out.push_back(param_type(cur));
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (cur.find_first_not_of(" \t\n") != std::string::npos) out.push_back(param_type(cur));
  return out;
}

// Where the header scan is: a namespace, a class or a body.
struct Scope {
  std::string cls;  // the class name; empty for a namespace; "{}" for a body
  bool open;        // members declared here now are public
};

// "Class::name(types)" for a declaration inside `scopes`.
std::string scan_signature(const std::vector<Scope>& scopes, const std::string& name,
                           const std::vector<std::string>& types) {
  std::string sig;
  for (auto& c : scopes)
    if (!c.cls.empty()) sig += c.cls + "::";
  sig += name + "(";
  for (size_t i = 0; i < types.size(); ++i) sig += (i ? ", " : "") + types[i];
  return sig + ")";
}

// The declarations of one header that take a Tensor: a parameter of type Tensor, Tensor& or
// const Tensor& (not Tensor* nor Tensors: those are outputs or lists), or any public method of
// class Tensor itself (its object is the Tensor). The scan is a simple one, documented here so
// its limits are known: it walks the text (comments and preprocessor lines removed) for
// `namespace N {`, `class|struct Name ... {`, `public:`/`protected:`/`private:`, braces, and
// `name(` (or `operator<symbols>(`); a `name(` directly inside a namespace or class body, with
// its parenthesised list balanced, is a declaration. Bodies (any other brace) are skipped, and
// so are members under private: or protected:, constructors and destructors.
std::vector<Declared> tensor_functions(const std::string& header, const std::string& text) {
  static const std::regex token(
      R"(\bnamespace\s+[\w:]*\s*\{|\b(class|struct)\s+(\w+)(\s+final)?(\s*:[^;{]*)?\s*\{|\b(public|protected|private)\s*:|\{|\}|;|\b(operator\s*[^\s\w(]+|~?\w+)\s*\()");
  static const std::regex tensor_param(R"((const )?Tensor&?)");
  std::vector<Scope> scopes;
  std::vector<Declared> out;
  const std::string s = strip(text);
  size_t pos = 0, statement = 0;  // where the scan is, where the current declaration began
  for (std::smatch m; std::regex_search(s.cbegin() + (std::ptrdiff_t)pos, s.cend(), m, token);) {
    const size_t at = pos + (size_t)m.position(), after = at + (size_t)m.length();
    const std::string g = m.str();
    pos = after;
    if (g.rfind("namespace", 0) == 0) {
      scopes.push_back({"", true});
    } else if (m[2].matched) {
      scopes.push_back({m.str(2), m.str(1) == "struct"});
    } else if (m[5].matched) {
      if (!scopes.empty()) scopes.back().open = m.str(5) == "public";
    } else if (g == "{") {
      scopes.push_back({"{}", false});
    } else if (g == "}") {
      if (!scopes.empty()) scopes.pop_back();
    } else if (g != ";") {
      size_t end = after;  // just past the balanced parameter list
      for (int depth = 1; depth > 0 && end < s.size(); ++end)
        depth += s[end] == '(' ? 1 : s[end] == ')' ? -1 : 0;
      // The rest of the declaration (qualifiers, a constructor's initialisers) up to its ';' or
      // body.
      pos = end;
      // A call inside an initialiser list ends at the list's ')' or '}' (depth below 0 or a '}'),
      // which the loop above must still see.
      for (int depth = 0; pos < s.size() && depth >= 0 &&
                          (depth > 0 || (s[pos] != ';' && s[pos] != '{' && s[pos] != '}'));
           ++pos)
        depth += s[pos] == '(' ? 1 : s[pos] == ')' ? -1 : 0;
      const std::string name = m.str(6), params = s.substr(after, end - 1 - after);
      const std::string prefix = s.substr(statement, at - statement);
      const bool in_body =
          std::any_of(scopes.begin(), scopes.end(), [](const Scope& c) { return c.cls == "{}"; });
      const bool hidden = std::any_of(scopes.begin(), scopes.end(),
                                      [](const Scope& c) { return !c.cls.empty() && !c.open; });
      const std::string owner = scopes.empty() ? "" : scopes.back().cls;
      if (in_body || hidden || name == owner || name == "~" + owner) continue;
      const std::vector<std::string> types = split_params(params);
      const bool takes = std::any_of(types.begin(), types.end(), [](const std::string& t) {
        return std::regex_match(t, tensor_param);
      });
      if (!takes && !(owner == "Tensor" && prefix.find("static") == std::string::npos)) continue;
      out.push_back({scan_signature(scopes, name, types), header});
      continue;
    }
    statement = after;  // a declaration starts after a brace, a semicolon or an access label
  }
  return out;
}

// The directory of the public headers: include/graft/ of the source tree (tests/CMakeLists.txt
// sets GRAFT_SOURCE_DIR).
std::string source_dir() { return GRAFT_SOURCE_DIR "/include/graft"; }

// Every public header: the .h files under include/graft/'s autograd/, ops/, nn/ and models/ (the
// internal headers are not there: they stay beside their sources, see CMakeLists.txt).
std::vector<std::string> public_headers() {
  std::vector<std::string> headers;
  for (const char* dir : {"autograd", "ops", "nn", "models"})
    for (const auto& e : std::filesystem::recursive_directory_iterator(source_dir() + "/" + dir))
      if (e.path().extension() == ".h")
        headers.push_back(std::filesystem::relative(e.path(), source_dir()).string());
  std::sort(headers.begin(), headers.end());
  return headers;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<Declared> public_tensor_functions() {
  std::vector<Declared> out;
  for (const auto& h : public_headers())
    for (auto& d : tensor_functions(h, read_file(source_dir() + "/" + h))) out.push_back(d);
  return out;
}

}  // namespace
namespace {

// ---- signatures from the code
// --------------------------------------------------------------------

// A type's text as the headers spell it and the scan keeps it, from the compiler's (demangled)
// name: namespaces, allocators and std::string's spelling dropped, long as int64_t.
std::string spelled(std::string t) {
  static const std::vector<std::pair<std::regex, std::string>> rules = {
      {std::regex(
           R"(std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> ?>)"),
       "std::string"},
      {std::regex(R"(, std::allocator<[^<>]*(<[^<>]*(<[^<>]*>)?[^<>]*>)?[^<>]*>)"), ""},
      {std::regex(R"(\b(graft|nn|train|models|autograd|kern|text)::)"), ""},
      {std::regex(R"(\bunsigned long\b)"), "size_t"},
      {std::regex(R"(\blong\b)"), "int64_t"},
      {std::regex(R"( >)"), ">"}};
  for (int pass = 0; pass < 2; ++pass)
    for (const auto& [re, with] : rules) t = std::regex_replace(t, re, with);
  return t;
}

// The text of parameter type T: "const Tensor&", "Tensor*", "int64_t".
template <class T>
std::string type_text() {
  using Bare = std::remove_cv_t<std::remove_pointer_t<std::remove_reference_t<T>>>;
  constexpr bool is_const = std::is_const_v<std::remove_pointer_t<std::remove_reference_t<T>>>;
  std::string t = spelled(boost::core::demangle(typeid(Bare).name()));
  if (is_const) t = "const " + t;
  if (std::is_pointer_v<std::remove_reference_t<T>>) t += "*";
  if (std::is_lvalue_reference_v<T>) t += "&";
  return t;
}

// A signature with the headers' aliases spelled out (Shape, Tensors), so that the scan's text
// and the compiler's compare equal.
std::string key(const std::string& sig) {
  std::string k = std::regex_replace(sig, std::regex(R"(\bShape\b)"), "std::vector<int64_t>");
  return std::regex_replace(k, std::regex(R"(\bTensors\b)"), "std::vector<Tensor>");
}

// "Linear::forward" from "nn::Linear::forward": the namespaces (lower-case parts) and template
// arguments dropped, as the scan names a declaration by its classes.
std::string declared_name(std::string name) {
  name = std::regex_replace(name, std::regex(R"(<[^<>]*>)"), "");
  return std::regex_replace(name, std::regex(R"(\b[a-z][a-z0-9_]*::)"), "");
}

template <class... P>
std::string parameter_list() {
  std::string out;
  ((out += (out.empty() ? "" : ", ") + type_text<P>()), ...);
  return "(" + out + ")";
}

// The signature of a function or member function, from its pointer's type.
template <class R, class... P>
std::string signature_of(const char* name, R (*)(P...)) {
  return declared_name(name) + parameter_list<P...>();
}
template <class R, class C, class... P>
std::string signature_of(const char* name, R (C::*)(P...)) {
  return declared_name(name) + parameter_list<P...>();
}
template <class R, class C, class... P>
std::string signature_of(const char* name, R (C::*)(P...) const) {
  return declared_name(name) + parameter_list<P...>();
}

// The overload of a function or member taking exactly P... (the compiler refuses a list no
// declaration has).
template <class... P>
struct Overload {
  template <class R>
  static auto of(R (*f)(P...)) {
    return f;
  }
  template <class R, class C>
  static auto of(R (C::*f)(P...)) {
    return f;
  }
  template <class R, class C>
  static auto of(R (C::*f)(P...) const) {
    return f;
  }
};

}  // namespace

// SIG(name, parameter types...): the declaration's signature as the header scan writes it,
// built from the function itself (its stringified name and its parameters' demangled types).
#define SIG(fn, ...) signature_of(#fn, Overload<__VA_ARGS__>::of(&fn))

namespace {

// ---- the cases ----------------------------------------------------------------------------------

// One public function: valid arguments for its Tensor parameters (in declaration order; slot 0 is
// the object for a method of Tensor), and a call with them. The runner calls it once as is (it
// must succeed, so the case is known to reach the function), then once per slot with that
// argument undefined: graft::Error, unless the slot is in `accepts` (a parameter documented as
// optional, or as accepting any tensor), where the call must succeed.
struct Case {
  std::string signature;
  std::function<Tensors()> args;
  std::function<void(const Tensors&)> call;
  std::set<size_t> accepts = {};
};

// Public functions for which an undefined tensor is the point, not an error (no case needed).
const std::map<std::string, std::string> kExcluded = {
    {SIG(Tensor::defined), "the query for an undefined tensor"},
    {SIG(Tensor::impl), "null for an undefined tensor, documented"},
    {SIG(Tensor::impl_ptr), "null for an undefined tensor, documented"},
    {"Tensor(const std::string&, const Module&, const Tensor&)",
     "nn::ForwardHook's function type (nn/module.h), not a function: the hook is the caller's"},
};

Generator& gen() {
  static Generator g(31);
  return g;
}
Tensor f(const Shape& s) { return randn(s, DType::f32, gen()); }
Tensor leaf(const Shape& s) { return randn(s, DType::f64, gen()).requires_grad_(); }
Tensor i64(const std::vector<int64_t>& v) {
  return from_vector(v, {(int64_t)v.size()}, DType::i64);
}
Tensor ids(int64_t b, int64_t t) {  // token ids in [3, 16): no pad, bos or eos
  std::vector<int64_t> v;
  for (int64_t i = 0; i < b * t; ++i) v.push_back(3 + (int64_t)gen().below(13));
  return from_vector(v, {b, t}, DType::i64);
}
Tensor no_pad(int64_t b, int64_t t) { return zeros({b, t}, DType::i64); }
Tensor scalar_loss() { return sum(mul(leaf({2}), leaf({2}))); }

// Small layers and models, built once (d 8, 2 heads, vocab 16, no dropout).
nn::LayerConfig layer() { return nn::layer_config(8, 2, 16, 0.0, false, DType::f32); }
const nn::MultiHeadAttention& mha() {
  static nn::MultiHeadAttention m(8, 2, DType::f32, gen());
  return m;
}
const nn::EncoderLayer& enc_layer() {
  static nn::EncoderLayer m(layer(), gen(), nullptr);
  return m;
}
const nn::DecoderLayer& dec_layer() {
  static nn::DecoderLayer m(layer(), gen(), nullptr);
  return m;
}
const nn::Encoder& encoder(bool causal) {
  static nn::Encoder bidirectional(layer(), 1, true, gen(), nullptr, {}, false);
  static nn::Encoder causal_stack(layer(), 1, true, gen(), nullptr, {}, true);
  return causal ? causal_stack : bidirectional;
}
const nn::Decoder& decoder() {
  static nn::Decoder m(layer(), 1, true, gen(), nullptr);
  return m;
}
const models::Transformer& transformer() {
  static models::Transformer m([] {
    models::TransformerConfig c;
    c.vocab = 16, c.d_model = 8, c.heads = 2, c.d_ff = 16, c.enc_layers = 1, c.dec_layers = 1;
    c.max_len = 16, c.dropout = 0.0;
    return c;
  }());
  return m;
}
template <class Config>
Config stack_config() {
  Config c;
  c.vocab = 16, c.d_model = 8, c.heads = 2, c.d_ff = 16, c.layers = 1, c.max_len = 16,
  c.dropout = 0.0;
  return c;
}
const models::DecoderOnlyLM& lm() {
  static models::DecoderOnlyLM m(stack_config<models::LMConfig>());
  return m;
}
const models::EncoderClassifier& classifier() {
  static models::EncoderClassifier m([] {
    auto c = stack_config<models::ClassifierConfig>();
    c.ngram_buckets = 8, c.ngram_max = 3;
    return c;
  }());
  return m;
}
const models::BertEncoder& bert() {
  static models::BertEncoder m([] {
    models::BertConfig c;
    c.vocab = 16, c.d_model = 8, c.heads = 2, c.d_ff = 16, c.layers = 1, c.max_len = 8;
    return c;
  }());
  return m;
}
// A SentenceEncoder over bert()'s weights, from a directory written once (save_hf_bert, vocab.txt).
const models::SentenceEncoder& sentence_encoder() {
  static const testing::TempDir dir("undefined_bert");
  static const models::SentenceEncoder e([] {
    models::save_hf_bert(bert(), dir.path.string());
    std::ofstream(dir / "vocab.txt")
        << "[PAD]\n[UNK]\n[CLS]\n[SEP]\na\nb\nc\nd\ne\nf\ng\nh\ni\nj\nk\nl\n";
    return dir.path.string();
  }());
  return e;
}
models::DecodeOptions decode_options(int beam) {
  models::DecodeOptions o;
  o.max_len = 3, o.beam = beam;
  return o;
}
UnaryOp square_row() {
  return UnaryOp{.name = "test_undefined_square",
                 .f = [](double x, double, double) { return x * x; },
                 .df = [](double x, double, double, double) { return 2 * x; }};
}

// A case whose only Tensor argument is `make()`.
Case one(std::string sig, std::function<Tensor()> make, std::function<void(const Tensor&)> call) {
  return {std::move(sig), [make] { return Tensors{make()}; },
          [call](const Tensors& t) { call(t[0]); }};
}

// The common arguments: a (2, 3) matrix, a (1, 3, 8) sequence, one decoding step.
Tensor x23() { return f({2, 3}); }
Tensor x3() { return f({1, 3, 8}); }
Tensor step() { return f({1, 1, 8}); }

std::vector<Case> autograd_and_tensor_cases() {
  return {// autograd/
          one(SIG(autograd::graph_dot, const Tensor&,
                  const std::vector<std::pair<std::string, Tensor>>&),
              scalar_loss, [](const Tensor& t) { autograd::graph_dot(t); }),
          one(SIG(autograd::nonfinite_kind, const Tensor&), x23,
              [](const Tensor& t) { autograd::nonfinite_kind(t); }),
          {SIG(autograd::backward, const Tensor&, const Tensor&, bool, bool),
           [] {
             return Tensors{scalar_loss(), scalar(1, DType::f64)};
           },
           [](const Tensors& t) { autograd::backward(t[0], t[1], false); },
           {1}},
          one(SIG(Tensor::view_of, const Tensor&, const Shape&, const Shape&, int64_t), x23,
              [](const Tensor& t) {
                Tensor::view_of(t, {3, 2}, {1, 3}, 0);
              }),
          one(SIG(Tensor::shape), x23, [](const Tensor& t) { t.shape(); }),
          one(SIG(Tensor::strides), x23, [](const Tensor& t) { t.strides(); }),
          one(SIG(Tensor::offset), x23, [](const Tensor& t) { t.offset(); }),
          one(SIG(Tensor::dim), x23, [](const Tensor& t) { t.dim(); }),
          one(SIG(Tensor::size, int64_t), x23, [](const Tensor& t) { t.size(-1); }),
          one(SIG(Tensor::numel), x23, [](const Tensor& t) { t.numel(); }),
          one(SIG(Tensor::dtype), x23, [](const Tensor& t) { t.dtype(); }),
          one(SIG(Tensor::is_contiguous), x23, [](const Tensor& t) { t.is_contiguous(); }),
          {SIG(Tensor::same_storage, const Tensor&),
           [] {
             return Tensors{f({2}), f({2})};
           },
           [](const Tensors& t) { t[0].same_storage(t[1]); }},
          one(SIG(Tensor::data<float>), x23, [](const Tensor& t) { t.data<float>(); }),
          one(SIG(Tensor::raw), x23, [](const Tensor& t) { t.raw(); }),
          one(
              SIG(Tensor::item), [] { return f({1}); }, [](const Tensor& t) { t.item(); }),
          one(SIG(Tensor::to_vector<double>), x23, [](const Tensor& t) { t.to_vector<double>(); }),
          one(SIG(Tensor::requires_grad), x23, [](const Tensor& t) { t.requires_grad(); }),
          one(SIG(Tensor::requires_grad_, bool), x23, [](Tensor t) { t.requires_grad_(); }),
          one(SIG(Tensor::is_leaf), x23, [](const Tensor& t) { t.is_leaf(); }),
          one(SIG(Tensor::grad), x23, [](const Tensor& t) { t.grad(); }),
          {SIG(Tensor::set_grad, const Tensor&),
           [] {
             return Tensors{f({2}), f({2})};
           },
           [](const Tensors& t) { Tensor(t[0]).set_grad(t[1]); },
           {1}},
          one(SIG(Tensor::zero_grad), x23, [](Tensor t) { t.zero_grad(); }),
          one(SIG(Tensor::retain_grad), scalar_loss, [](const Tensor& t) { t.retain_grad(); }),
          one(SIG(autograd::retain_grad, const Tensor&), scalar_loss,
              [](const Tensor& t) { autograd::retain_grad(t); }),
          one(SIG(Tensor::detach), x23, [](const Tensor& t) { t.detach(); })};
}

// The int8 weight forms of a linear (ops/precision.h): a weight's parts, and a weight set from
// them.
std::vector<Case> int8_weight_cases() {
  return {one(SIG(int8_weight_parts, const Tensor&, const std::string&), x23,
              [](const Tensor& t) { int8_weight_parts(t, "test.weight"); }),
          {SIG(set_weight_int8, const Tensor&, const Tensor&, const Tensor&, const std::string&,
               const std::string&),
           [] {
             return Tensors{f({2, 3}), zeros({2, 3}, DType::i8), ones({2})};
           },
           [](const Tensors& t) { set_weight_int8(t[0], t[1], t[2], "w", "w_scale"); }},
          {SIG(quantize_weight_int8_from, const Tensor&, const Tensor&, const std::string&),
           [] {
             return Tensors{f({2, 3}), f({2, 3})};
           },
           [](const Tensors& t) { quantize_weight_int8_from(t[0], t[1], "w"); }}};
}

std::vector<Case> tensor_and_copy_cases() {
  return {
      {SIG(Tensor::backward, const Tensor&, bool, bool),
       [] {
         return Tensors{scalar_loss(), scalar(1, DType::f64)};
       },
       [](const Tensors& t) { t[0].backward(t[1]); },
       {1}},
      one(SIG(Tensor::bump_version), x23, [](const Tensor& t) { t.bump_version(); }),
      one(SIG(Tensor::version), x23, [](const Tensor& t) { t.version(); }),
      one(SIG(Tensor::str, int), x23, [](const Tensor& t) { t.str(); }),
      {SIG(describe, const Tensor&),
       [] { return Tensors{f({2})}; },
       [](const Tensors& t) { describe(t[0]); },
       {0}},
      one(SIG(check_defined, const Tensor&, const char*, const char*), x23,
          [](const Tensor& t) { check_defined(t, "test", "t"); }),
      one(SIG(contiguous_copy, const Tensor&), x23, [](const Tensor& t) { contiguous_copy(t); }),
      one(SIG(cast_copy, const Tensor&, DType), x23,
          [](const Tensor& t) { cast_copy(t, DType::f64); }),
      one(SIG(quantize_weight_int8, const Tensor&, const std::string&), x23,
          [](const Tensor& t) { quantize_weight_int8(t, "test.weight"); }),
      one(SIG(keep_weight_fp32, const Tensor&, const std::string&), x23,
          [](const Tensor& t) { keep_weight_fp32(t, "test.weight"); }),
      one(
          SIG(keep_weight_bf16, const Tensor&, const std::string&),
          [] { return cast_copy(x23(), DType::bf16); },
          [](const Tensor& t) { keep_weight_bf16(t, "test.weight"); }),
      {SIG(copy_into, const Tensor&, const Tensor&),
       [] {
         return Tensors{f({2}), f({2})};
       },
       [](const Tensors& t) { copy_into(t[0], t[1]); }},
      {SIG(accumulate_into, const Tensor&, const Tensor&),
       [] {
         return Tensors{f({2}), f({2})};
       },
       [](const Tensors& t) { accumulate_into(t[0], t[1]); }},
      one(SIG(fill_, const Tensor&, double), x23, [](const Tensor& t) { fill_(t, 1); }),
      one(SIG(sum_axes, const Tensor&, const std::vector<int64_t>&, double), x23,
          [](const Tensor& t) { sum_axes(t, {1}); }),
      one(SIG(sum_to_shape, const Tensor&, const Shape&), x23,
          [](const Tensor& t) { sum_to_shape(t, {3}); }),
      one(SIG(unary, const UnaryOp&, const Tensor&, double, double), x23,
          [](const Tensor& t) { unary(square_row(), t); }),
      // x or y may be undefined (the row reads the one it saves); both undefined is an error.
      {SIG(unary_df_constant, const UnaryOp&, const Tensor&, const Tensor&, double, double),
       [] {
         return Tensors{f({2, 3}), f({2, 3})};
       },
       [](const Tensors& t) {
         const UnaryOp relu_like{.name = "relu_like", .df = [](double x, double, double, double) {
                                   return x > 0 ? 1.0 : 0.0;
                                 }};
         unary_df_constant(relu_like, t[0], t[1], 0, 0);
       },
       {0, 1}},
      one(SIG(neg, const Tensor&), x23, [](const Tensor& t) { neg(t); })};
}

std::vector<Case> kernel_and_operator_cases() {
  return {// ops/custom.h
          one(SIG(kern::broadcast_strides, const Tensor&, const Shape&), x23,
              [](const Tensor& t) {
                kern::broadcast_strides(t, {4, 2, 3});
              }),
          one(SIG(kern::contig, const Tensor&), x23, [](const Tensor& t) { kern::contig(t); }),
          one(SIG(kern::check_float, const char*, const Tensor&), x23,
              [](const Tensor& t) { kern::check_float("test", t); }),
          {SIG(kern::check_same_dtype, const char*, const Tensor&, const Tensor&),
           [] {
             return Tensors{f({2}), f({3})};
           },
           [](const Tensors& t) { kern::check_same_dtype("test", t[0], t[1]); }},
          {SIG(kern::matmul_into, const Tensor&, const Tensor&, const Tensor&, double, bool),
           [] {
             return Tensors{f({2, 3}), f({3, 4}), f({2, 4})};
           },
           [](const Tensors& t) { kern::matmul_into(t[0], t[1], t[2]); }},
          one(SIG(eq, const Tensor&, double), x23, [](const Tensor& t) { eq(t, 0); }),
          one(SIG(operator-, const Tensor&), x23, [](const Tensor& t) { -t; }),
          one(SIG(operator+, const Tensor&, double), x23, [](const Tensor& t) { t + 1.0; }),
          one(SIG(operator+, double, const Tensor&), x23, [](const Tensor& t) { 1.0 + t; }),
          one(SIG(operator-, const Tensor&, double), x23, [](const Tensor& t) { t - 1.0; }),
          one(SIG(operator-, double, const Tensor&), x23, [](const Tensor& t) { 1.0 - t; }),
          one(SIG(operator*, const Tensor&, double), x23, [](const Tensor& t) { t * 2.0; }),
          one(SIG(operator*, double, const Tensor&), x23, [](const Tensor& t) { 2.0 * t; }),
          one(SIG(operator/, const Tensor&, double), x23, [](const Tensor& t) { t / 2.0; }),
          one(SIG(argmax, const Tensor&, int64_t), x23, [](const Tensor& t) { argmax(t, 1); }),
          one(SIG(transpose, const Tensor&, int64_t, int64_t), x23,
              [](const Tensor& t) { transpose(t, 0, 1); }),
          {SIG(select_rows_, const Tensor&, const Tensor&),
           [] {
             return Tensors{f({3, 2}), i64({2, 0, 1})};
           },
           [](const Tensors& t) { select_rows_(t[0], t[1]); }}};
}

std::vector<Case> binary_operator_cases() {
  std::vector<Case> c;
  // The binary operators: add, sub, mul and div's own functions are covered by their records.
  const auto pair = [] { return Tensors{f({2, 3}), f({3})}; };
  c.push_back(
      {SIG(operator+, const Tensor&, const Tensor&), pair, [](const Tensors& t) { t[0] + t[1]; }});
  c.push_back(
      {SIG(operator-, const Tensor&, const Tensor&), pair, [](const Tensors& t) { t[0] - t[1]; }});
  c.push_back(
      {SIG(operator*, const Tensor&, const Tensor&), pair, [](const Tensors& t) { t[0] * t[1]; }});
  c.push_back(
      {SIG(operator/, const Tensor&, const Tensor&), pair, [](const Tensors& t) { t[0] / t[1]; }});

  return c;
}

// ops/compare.h: comparisons and logical ops on masks (not differentiable, so no records).
std::vector<Case> compare_cases() {
  const auto pair = [] { return Tensors{f({2, 3}), f({3})}; };
  const auto binary = [&](std::string sig, Tensor (*op)(const Tensor&, const Tensor&)) {
    return Case{std::move(sig), pair, [op](const Tensors& t) { op(t[0], t[1]); }};
  };
  const auto scalar = [](std::string sig, Tensor (*op)(const Tensor&, double)) {
    return one(std::move(sig), x23, [op](const Tensor& t) { op(t, 0.5); });
  };
  using B = Tensor (*)(const Tensor&, const Tensor&);
  using S = Tensor (*)(const Tensor&, double);
  return {binary(SIG(eq, const Tensor&, const Tensor&), B(eq)),
          binary(SIG(ne, const Tensor&, const Tensor&), B(ne)),
          binary(SIG(lt, const Tensor&, const Tensor&), B(lt)),
          binary(SIG(le, const Tensor&, const Tensor&), B(le)),
          binary(SIG(gt, const Tensor&, const Tensor&), B(gt)),
          binary(SIG(ge, const Tensor&, const Tensor&), B(ge)),
          binary(SIG(logical_and, const Tensor&, const Tensor&), logical_and),
          binary(SIG(logical_or, const Tensor&, const Tensor&), logical_or),
          scalar(SIG(ne, const Tensor&, double), S(ne)),
          scalar(SIG(lt, const Tensor&, double), S(lt)),
          scalar(SIG(le, const Tensor&, double), S(le)),
          scalar(SIG(gt, const Tensor&, double), S(gt)),
          scalar(SIG(ge, const Tensor&, double), S(ge)),
          one(SIG(logical_not, const Tensor&), x23, [](const Tensor& t) { logical_not(t); })};
}

}  // namespace
namespace {

std::vector<Case> attention_module_cases() {
  using namespace graft::nn;
  using namespace graft::train;
  using namespace graft::models;
  return {one(
              SIG(KVCache::select_rows, const Tensor&), [] { return i64({0}); },
              [](const Tensor& rows) {
                autograd::NoGrad ng;
                KVCache cache;
                mha().forward_self_step(f({1, 1, 8}), cache, 4);
                cache.select_rows(rows);
              }),
          {SIG(KVCache::append, const Tensor&, const Tensor&, int64_t),
           [] {
             return Tensors{f({1, 2, 1, 4}), f({1, 2, 1, 4})};
           },
           [](const Tensors& t) {
             KVCache cache;
             cache.append(t[0], t[1], 4);
           }},
          {SIG(MultiHeadAttention::forward, const Tensor&, const Tensor&, const Tensor&, bool,
               Tensor*, const AttentionPositions*),
           [] {
             return Tensors{f({1, 3, 8}), f({1, 2, 8}), no_pad(1, 2)};
           },
           [](const Tensors& t) { mha().forward(t[0], t[1], t[2]); },
           {2}},
          one(SIG(MultiHeadAttention::forward_self_step, const Tensor&, KVCache&, int64_t,
                  const AttentionPositions*),
              step,
              [](const Tensor& t) {
                KVCache cache;
                mha().forward_self_step(t, cache, 4);
              }),
          one(
              SIG(MultiHeadAttention::fill_cross_cache, const Tensor&, KVCache&),
              [] {
                return f({1, 2, 8});
              },
              [](const Tensor& t) {
                KVCache cache;
                mha().fill_cross_cache(t, cache);
              }),
          {SIG(MultiHeadAttention::forward_cross_cached, const Tensor&, const KVCache&,
               const Tensor&, Tensor*, int64_t),
           [] {
             return Tensors{f({1, 1, 8}), no_pad(1, 2)};
           },
           [](const Tensors& t) {
             KVCache cache;
             mha().fill_cross_cache(f({1, 2, 8}), cache);
             mha().forward_cross_cached(t[0], cache, t[1]);
           },
           {1}}};
}

std::vector<Case> layer_cases() {
  using namespace graft::nn;
  using namespace graft::train;
  using namespace graft::models;
  return {one(
              SIG(shard_of, const Tensor&, Shard),
              [] {
                return f({4, 2});
              },
              [](const Tensor& t) {
                shard_of(t, Shard{0, 2});
              }),
          one(
              SIG(shard_loss, const Tensor&, int64_t, int64_t), [] { return scalar(1.0); },
              [](const Tensor& t) { shard_loss(t, 1, 2); }),
          one(
              SIG(Linear::forward, const Tensor&),
              [] {
                return f({2, 3});
              },
              [](const Tensor& t) { Linear(3, 4).forward(t); }),
          one(
              SIG(Embedding::forward, const Tensor&),
              [] {
                return i64({1, 2});
              },
              [](const Tensor& t) { Embedding(5, 4).forward(t); }),
          one(
              SIG(LayerNorm::forward, const Tensor&),
              [] {
                return f({2, 4});
              },
              [](const Tensor& t) { LayerNorm(4).forward(t); }),
          {SIG(LayerNorm::forward_add, const Tensor&, const Tensor&),
           [] {
             return Tensors{f({2, 4}), f({2, 4})};
           },
           [](const Tensors& t) { LayerNorm(4).forward_add(t[0], t[1]); }},
          one(
              SIG(Dropout::forward, const Tensor&),
              [] {
                return f({2, 4});
              },
              [](const Tensor& t) { Dropout(0.5).forward(t); }),
          one(
              SIG(feed_forward, const Linear&, const Dropout&, const Linear&, Activation,
                  const Tensor&, const Linear*),
              [] {
                return f({2, 4});
              },
              [](const Tensor& t) {
                Linear gate(4, 6);
                feed_forward(Linear(4, 6), Dropout(0.0), Linear(6, 4), Activation::swiglu, t,
                             &gate);
              })};
}

std::vector<Case> position_and_encoder_layer_cases() {
  using namespace graft::nn;
  using namespace graft::train;
  using namespace graft::models;
  return {
      {SIG(add_positions, const Tensor&, const Tensor&, int64_t, bool),
       [] {
         return Tensors{f({1, 3, 8}), sinusoid_table(0, 16, 8, DType::f32)};
       },
       [](const Tensors& t) { add_positions(t[0], t[1], 0, true); }},
      one(SIG(SinusoidalPositionalEncoding::forward, const Tensor&, int64_t), x3,
          [](const Tensor& t) { SinusoidalPositionalEncoding(16, 8).forward(t); }),
      one(SIG(LearnedPositionalEncoding::forward, const Tensor&, int64_t), x3,
          [](const Tensor& t) { LearnedPositionalEncoding(16, 8).forward(t); }),
      one(
          SIG(xavier_uniform_, const Tensor&, Generator&, double),
          [] {
            return f({3, 4});
          },
          [](const Tensor& t) { xavier_uniform_(t, gen()); }),
      one(
          SIG(uniform_, const Tensor&, double, double, Generator&),
          [] {
            return f({3, 4});
          },
          [](const Tensor& t) { uniform_(t, 0, 1, gen()); }),
      one(
          SIG(normal_, const Tensor&, double, double, Generator&),
          [] {
            return f({3, 4});
          },
          [](const Tensor& t) { normal_(t, 0, 1, gen()); }),
      one(
          SIG(RotaryPositions::rotate, const Tensor&, int64_t),
          [] {
            return f({1, 2, 3, 4});
          },
          [](const Tensor& t) { RotaryPositions(10000.0).rotate(t, 0); }),
      one(SIG(EmbeddingPositions::forward, const Tensor&, int64_t), x3,
          [](const Tensor& t) {
            EmbeddingPositions(Positions::sinusoidal, 16, 8, DType::f32, gen()).forward(t);
          }),
      {SIG(EncoderLayer::forward, const Tensor&, const Tensor&, bool, const AttentionPositions*),
       [] {
         return Tensors{f({1, 3, 8}), no_pad(1, 3)};
       },
       [](const Tensors& t) { enc_layer().forward(t[0], t[1]); },
       {1}},
      one(SIG(EncoderLayer::forward_step, const Tensor&, KVCache&, int64_t,
              const AttentionPositions*),
          step, [](const Tensor& t) {
            KVCache cache;
            enc_layer().forward_step(t, cache, 4);
          })};
}

std::vector<Case> stack_cases() {
  using namespace graft::nn;
  using namespace graft::train;
  using namespace graft::models;
  return {
      {SIG(DecoderLayer::forward, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
           Tensor*, const AttentionPositions*),
       [] {
         return Tensors{f({1, 3, 8}), f({1, 2, 8}), no_pad(1, 3), no_pad(1, 2)};
       },
       [](const Tensors& t) { dec_layer().forward(t[0], t[1], t[2], t[3]); },
       {2, 3}},
      {SIG(DecoderLayer::forward_step, const Tensor&, const Tensor&, const Tensor&,
           DecoderLayerCache&, int64_t, Tensor*, const AttentionPositions*, int64_t),
       [] {
         return Tensors{f({1, 1, 8}), f({1, 2, 8}), no_pad(1, 2)};
       },
       [](const Tensors& t) {
         DecoderLayerCache cache;
         dec_layer().forward_step(t[0], t[1], t[2], cache, 4);
       },
       {2}},
      {SIG(Encoder::forward, const Tensor&, const Tensor&),
       [] {
         return Tensors{f({1, 3, 8}), no_pad(1, 3)};
       },
       [](const Tensors& t) { encoder(false).forward(t[0], t[1]); },
       {1}},
      one(SIG(Encoder::forward_step, const Tensor&, std::vector<KVCache>&, int64_t), step,
          [](const Tensor& t) {
            std::vector<KVCache> caches;
            encoder(true).forward_step(t, caches, 4);
          }),
      {SIG(Decoder::forward, const Tensor&, const Tensor&, const Tensor&, const Tensor&, Tensors*),
       [] {
         return Tensors{f({1, 3, 8}), f({1, 2, 8}), no_pad(1, 3), no_pad(1, 2)};
       },
       [](const Tensors& t) { decoder().forward(t[0], t[1], t[2], t[3]); },
       {2, 3}},
      {SIG(Decoder::forward_step, const Tensor&, const Tensor&, const Tensor&,
           std::vector<DecoderLayerCache>&, int64_t, Tensors*, int64_t),
       [] {
         return Tensors{f({1, 1, 8}), f({1, 2, 8}), no_pad(1, 2)};
       },
       [](const Tensors& t) {
         std::vector<DecoderLayerCache> caches;
         decoder().forward_step(t[0], t[1], t[2], caches, 4);
       },
       {2}},
      // models/
      one(
          SIG(check_token_ids, const char*, const Tensor&), [] { return ids(1, 3); },
          [](const Tensor& t) { check_token_ids("test", t); }),
      one(
          SIG(DecoderOnlyLM::forward, const Tensor&), [] { return ids(1, 3); },
          [](const Tensor& t) { lm().forward(t); })};
}

std::vector<Case> model_cases() {
  using namespace graft::nn;
  using namespace graft::train;
  using namespace graft::models;
  return {
      one(
          SIG(DecoderOnlyLM::embed, const Tensor&, int64_t), [] { return ids(1, 3); },
          [](const Tensor& t) { lm().embed(t); }),
      one(SIG(DecoderOnlyLM::logits, const Tensor&), x3, [](const Tensor& t) { lm().logits(t); }),
      one(
          SIG(EncoderClassifier::forward, const Tensor&), [] { return ids(1, 3); },
          [](const Tensor& t) { classifier().forward(t); }),
      one(
          SIG(EncoderClassifier::ngram_ids, const Tensor&), [] { return ids(1, 3); },
          [](const Tensor& t) { classifier().ngram_ids(t); }),
      {SIG(BertEncoder::forward, const Tensor&, const Tensor&, const Tensor&),
       [] {
         return Tensors{ids(1, 3), f({1, 3}), no_pad(1, 3)};
       },
       [](const Tensors& t) { bert().forward(t[0], t[1], t[2]); },
       {1, 2}},
      {SIG(models::mean_pool, const Tensor&, const Tensor&),
       [] {
         return Tensors{f({1, 3, 8}), f({1, 3})};
       },
       [](const Tensors& t) { models::mean_pool(t[0], t[1]); }},
      one(
          SIG(models::l2_normalize, const Tensor&, double),
          [] {
            return f({2, 8});
          },
          [](const Tensor& t) { models::l2_normalize(t); }),
      {SIG(models::pool, const Tensor&, const Tensor&, Pooling, bool),
       [] {
         return Tensors{f({1, 3, 8}), f({1, 3})};
       },
       [](const Tensors& t) { models::pool(t[0], t[1], models::Pooling::mean, true); }},
      {SIG(SentenceEncoder::embed, const Tensor&, const Tensor&),
       [] {
         return Tensors{ids(1, 3), f({1, 3})};
       },
       [](const Tensors& t) { sentence_encoder().embed(t[0], t[1]); },
       {1}},
      one(
          SIG(Transformer::embed, const Tensor&, int64_t), [] { return ids(1, 3); },
          [](const Tensor& t) { transformer().embed(t); }),
      one(
          SIG(Transformer::encode, const Tensor&), [] { return ids(1, 3); },
          [](const Tensor& t) { transformer().encode(t); }),
      {SIG(Transformer::decode, const Tensor&, const Tensor&, const Tensor&, Tensors*),
       [] {
         return Tensors{f({1, 4, 8}), ids(1, 4), ids(1, 3)};
       },
       [](const Tensors& t) { transformer().decode(t[0], t[1], t[2]); }}};
}

std::vector<Case> transformer_cases() {
  using namespace graft::nn;
  using namespace graft::train;
  using namespace graft::models;
  return {{SIG(Transformer::forward, const Tensor&, const Tensor&),
           [] {
             return Tensors{ids(1, 4), ids(1, 3)};
           },
           [](const Tensors& t) { transformer().forward(t[0], t[1]); }},
          {SIG(Transformer::loss, const Tensor&, const Tensor&, const Tensor&, double),
           [] {
             return Tensors{ids(1, 4), ids(1, 3), ids(1, 3)};
           },
           [](const Tensors& t) { transformer().loss(t[0], t[1], t[2]); }},
          {SIG(Transformer::decoder_states, const Tensor&, const Tensor&, const Tensor&, Tensors*),
           [] {
             return Tensors{f({1, 4, 8}), ids(1, 4), ids(1, 3)};
           },
           [](const Tensors& t) { transformer().decoder_states(t[0], t[1], t[2]); }},
          one(SIG(Transformer::logits, const Tensor&), x3,
              [](const Tensor& t) { transformer().logits(t); }),
          one(
              SIG(Transformer::pad_mask, const Tensor&), [] { return ids(1, 3); },
              [](const Tensor& t) { transformer().pad_mask(t); }),
          one(
              SIG(translate, const Transformer&, const Tensor&, const DecodeOptions&),
              [] { return ids(1, 4); },
              [](const Tensor& t) { translate(transformer(), t, decode_options(1)); })};
}

std::vector<Case> positions_and_communicator_cases() {
  using namespace graft::nn;
  using namespace graft::train;
  using namespace graft::models;
  std::vector<Case> c;
  // The base AttentionPositions adds no rotation: rotate() hands its tensor back as it is, so an
  // undefined one comes back undefined, as documented ("x itself").
  c.push_back({SIG(AttentionPositions::rotate, const Tensor&, int64_t),
               [] {
                 return Tensors{f({1, 2, 3, 4})};
               },
               [](const Tensors& t) { AttentionPositions().rotate(t[0], 0); },
               {0}});
  // One process has nothing to send or receive: the single-process communicator's calls are no-ops
  // for any tensor, through the base class too.
  const auto two = [] { return Tensors{f({2})}; };
  const auto allreduce = [](const Tensors& t) {
    SingleProcessCommunicator single;
    Tensor x = t[0];
    static_cast<Communicator&>(single).allreduce_sum(x);
  };
  const auto start = [](const Tensors& t) {
    SingleProcessCommunicator single;
    Tensor x = t[0];
    static_cast<Communicator&>(single).start_allreduce_sum(x);
  };
  const auto broadcast = [](const Tensors& t) {
    SingleProcessCommunicator single;
    Tensor x = t[0];
    static_cast<Communicator&>(single).broadcast(x, 0);
  };
  c.push_back({SIG(Communicator::allreduce_sum, Tensor&), two, allreduce, {0}});
  c.push_back({SIG(SingleProcessCommunicator::allreduce_sum, Tensor&), two, allreduce, {0}});
  c.push_back({SIG(Communicator::start_allreduce_sum, Tensor&), two, start, {0}});
  c.push_back({SIG(SingleProcessCommunicator::start_allreduce_sum, Tensor&), two, start, {0}});
  c.push_back({SIG(Communicator::broadcast, Tensor&, int), two, broadcast, {0}});
  c.push_back({SIG(SingleProcessCommunicator::broadcast, Tensor&, int), two, broadcast, {0}});

  return c;
}

std::vector<Case> all_cases() {
  std::vector<Case> all;
  for (const std::vector<Case>& part :
       {autograd_and_tensor_cases(), tensor_and_copy_cases(), int8_weight_cases(),
        kernel_and_operator_cases(), binary_operator_cases(), compare_cases(),
        attention_module_cases(), layer_cases(), position_and_encoder_layer_cases(), stack_cases(),
        model_cases(), transformer_cases(), positions_and_communicator_cases()})
    all.insert(all.end(), part.begin(), part.end());
  return all;
}

// The names a record covers: every recorded op's name and forward.
std::set<std::string> recorded_functions() {
  register_op_cases();
  std::set<std::string> out;
  for (const OpRecord& r : registered_records()) {
    out.insert(r.name);
    out.insert(r.forward);
  }
  return out;
}

// Every name the public headers declare a function under ("add", "Tensor::dtype"), whether
// or not it takes a Tensor.
std::set<std::string> public_function_names() {
  std::set<std::string> out;
  static const std::regex call(R"(\b(~?[A-Za-z_]\w*)\s*\()");
  for (const std::string& h : public_headers()) {
    const std::string text = strip(read_file(source_dir() + "/" + h));
    for (std::sregex_iterator it(text.begin(), text.end(), call), end; it != end; ++it)
      out.insert(it->str(1));
  }
  for (auto& d : public_tensor_functions())
    out.insert(d.signature.substr(0, d.signature.find('(')));
  return out;
}

// Whether m is op r's own error: it starts with the op's name or its forward ("add: ..."), or,
// where the sample calls another public function on its inputs first (a permute to make a view),
// with that function's name; never with a method's ("Tensor::shape: called on an undefined
// tensor" is what an op that checked nothing raises).
bool names_a_function(const std::string& m, const OpRecord& r) {
  const std::string head = m.substr(0, m.find(": "));
  if (head == r.name || head == r.forward) return true;
  static const std::set<std::string> names = public_function_names();
  return head.find("::") == std::string::npos && names.count(head);
}

// What is wrong when sample c of record r gets an undefined tensor in each input slot in turn.
std::vector<std::string> undefined_input_complaints(const OpRecord& r, const OpCase& c) {
  std::vector<std::string> bad;
  Generator g(5);
  const size_t slots = c.make_inputs(DType::f64, g).size();
  for (size_t i = 0; i < slots; ++i) {
    Generator gi(5);
    Tensors x = c.make_inputs(DType::f64, gi);
    x[i] = Tensor();
    const std::string where = c.name + ", input " + std::to_string(i) + " undefined: ";
    const bool accepted = std::find(r.accepts_undefined.begin(), r.accepts_undefined.end(), i) !=
                          r.accepts_undefined.end();
    try {
      c.fn(x);
      if (!accepted) bad.push_back(where + "no error");
    } catch (const Error& e) {
      const std::string m = e.what();
      if (accepted) bad.push_back(where + "the record accepts it, but: " + m);
      else if (!names_a_function(m, r))
        bad.push_back(where + "the error names neither '" + r.name +
                      "' nor a public function: " + m);
    }
    autograd::clear_tape();
  }
  return bad;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(undefined_tests)

// The scan finds what it should in a header of known content, so an empty walk cannot pass.
BOOST_AUTO_TEST_CASE(header_scan_finds_declarations_of_every_form) {
  const std::string text = R"(
#define MACRO(x) \
  int not_a_decl(const Tensor& t)
namespace graft {
/// A comment naming fake(const Tensor& t).
Tensor free_fn(const Tensor& x,
               const Tensor& b = Tensor(), Generator& g = default_generator());
inline Tensor operator+(double c, const Tensor& a) { return affine(a, 1.0, c); }
Tensor no_tensor(const Tensors& xs, Tensor* out);
class Thing : public Base {
 public:
  explicit Thing(const Tensor& t) : t_(t) {}
  Tensor forward(const Tensor& x) const;
  static void helper(Tensor&);
 private:
  Tensor hidden(const Tensor& x) const;
};
struct Tensor {
  Tensor() = default;
  static Tensor view_of(const Tensor& base, const Shape& shape);
  bool defined() const { return impl_ != nullptr; }
  template <class T>
  T* data() const;
};
template <class C>
int table() {
  const Fields more = {
      field(member(&C::x), "doc"),
  };
  return 0;
}
Tensor after_table(const Tensor& x);
}
)";
  std::vector<std::string> got;
  for (auto& d : tensor_functions("x.h", text)) got.push_back(d.signature);
  const std::vector<std::string> want = {"free_fn(const Tensor&, const Tensor&, Generator&)",
                                         "operator+(double, const Tensor&)",
                                         "Thing::forward(const Tensor&)",
                                         "Thing::helper(Tensor&)",
                                         "Tensor::view_of(const Tensor&, const Shape&)",
                                         "Tensor::defined()",
                                         "Tensor::data()",
                                         "after_table(const Tensor&)"};
  BOOST_TEST(got == want, boost::test_tools::per_element());
  // And the real headers: many functions, among them the ones issue 31 found crashing.
  std::set<std::string> found;
  for (auto& d : public_tensor_functions()) found.insert(d.signature);
  BOOST_TEST(found.size() > 100u);
  for (const char* sig :
       {"where(const Tensor&, const Tensor&, const Tensor&)", "Tensor::item()",
        "copy_into(const Tensor&, const Tensor&)", "Linear::forward(const Tensor&)"})
    BOOST_TEST(found.count(sig) == 1u, sig);
}

// SIG() spells a signature as the scan does: namespaces, aliases and allocators dropped, the
// overload picked by its parameters, a template member by its name.
BOOST_AUTO_TEST_CASE(sig_spells_what_the_scan_finds) {
  BOOST_TEST(SIG(nn::Linear::forward, const Tensor&) == "Linear::forward(const Tensor&)");
  BOOST_TEST(SIG(add, double, const Tensor&) == "add(double, const Tensor&)");
  BOOST_TEST(SIG(Tensor::data<float>) == "Tensor::data()");
  BOOST_TEST(
      SIG(autograd::graph_dot, const Tensor&, const std::vector<std::pair<std::string, Tensor>>&) ==
      "graph_dot(const Tensor&, const std::vector<std::pair<std::string, Tensor>>&)");
  BOOST_TEST(key(SIG(sum_to, const Tensor&, const Shape&)) ==
             key("sum_to(const Tensor&, const Shape&)"));
}

// The walk: every function and method of the public headers that takes a Tensor is covered: a
// free function named as a recorded op (OpRecord::name or forward) by that op's record (the
// check below), any other by a case here (or a reasoned entry in kExcluded); every case names a
// function the headers still declare, and every record's forward is a declared function.
BOOST_AUTO_TEST_CASE(every_public_function_taking_a_tensor_has_a_case) {
  std::set<std::string> covered, excluded;
  for (auto& c : all_cases())
    BOOST_TEST(covered.insert(key(c.signature)).second, "two cases for " << c.signature);
  for (auto& [sig, why] : kExcluded) excluded.insert(key(sig));
  const std::set<std::string> recorded = recorded_functions();
  std::set<std::string> declared;
  for (auto& d : public_tensor_functions()) {
    declared.insert(key(d.signature));
    const std::string name = d.signature.substr(0, d.signature.find('('));
    if (recorded.count(name)) continue;
    if (!covered.count(key(d.signature)) && !excluded.count(key(d.signature)))
      BOOST_ERROR(d.header << ": " << d.signature
                           << " takes a Tensor but has no undefined-tensor case in "
                              "tests/test_undefined.cpp and no op record");
  }
  for (auto& sig : covered)
    BOOST_TEST(declared.count(sig) == 1u,
               "the case " << sig << " names no declaration of the public headers");
  for (auto& sig : excluded)
    BOOST_TEST(declared.count(sig) == 1u, "the exclusion " << sig << " names no declaration");
  const std::set<std::string> names = public_function_names();
  for (const OpRecord& r : registered_records())
    BOOST_TEST(names.count(r.forward) == 1u,
               "op '" << r.name << "': its forward '" << r.forward << "' is no public function");
}

// Every library record's backward is a function of the library's sources (or "composite").
BOOST_AUTO_TEST_CASE(every_record_names_a_backward_of_the_library) {
  std::string sources;
  for (const char* dir : {"autograd", "ops"})
    for (const auto& e :
         std::filesystem::directory_iterator(GRAFT_SOURCE_DIR "/" + std::string(dir)))
      if (e.path().extension() == ".cpp") sources += read_file(e.path().string());
  register_op_cases();
  for (const OpRecord& r : registered_records())
    BOOST_TEST((r.backward == "composite" ||
                std::regex_search(sources, std::regex("\\b" + r.backward + "\\("))),
               "op '" << r.name << "': no function " << r.backward << "() in autograd/ or ops/");
}

// Derived from the op records: each Tensor input of each sample, undefined in turn, gives a
// graft::Error naming the op (or its forward), or succeeds where the record accepts it
// (OpRecord::accepts_undefined).
BOOST_AUTO_TEST_CASE(every_record_refuses_an_undefined_input) {
  register_op_cases();
  for (const OpRecord& r : registered_records())
    for (const OpCase& c : r.samples)
      for (const std::string& m : undefined_input_complaints(r, c)) BOOST_ERROR(m);
  autograd::clear_tape();
}

// Each case: the valid call succeeds; with each Tensor argument undefined in turn, graft::Error
// (never a crash, never another exception), or success where the slot accepts an undefined one.
BOOST_AUTO_TEST_CASE(every_case_refuses_an_undefined_tensor_in_each_slot) {
  for (const Case& c : all_cases()) {
    BOOST_TEST_CONTEXT(c.signature) {
      BOOST_CHECK_NO_THROW(c.call(c.args()));
      const size_t slots = c.args().size();
      for (size_t i = 0; i < slots; ++i) {
        BOOST_TEST_CONTEXT("argument " << i << " undefined") {
          Tensors a = c.args();
          a[i] = Tensor();
          if (c.accepts.count(i)) BOOST_CHECK_NO_THROW(c.call(a));
          else BOOST_CHECK_THROW(c.call(a), Error);
        }
      }
    }
  }
  autograd::clear_tape();
}

// load_state_dict takes its tensors in a list (not a Tensor parameter, so not in the walk): an
// undefined value names the tensor; nothing is copied.
BOOST_AUTO_TEST_CASE(load_state_dict_refuses_an_undefined_value) {
  nn::Linear lin(3, 2);
  nn::NamedTensors sd = lin.state_dict();
  const std::vector<double> before = lin.weight.to_vector<double>();
  sd[1].second = Tensor();
  BOOST_CHECK_EXCEPTION(lin.load_state_dict(sd), Error, [](const Error& e) {
    return graft::testing::names(e, "load_state_dict: tensor 'bias' is an undefined tensor");
  });
  sd[0].second = zeros({2, 3});
  BOOST_CHECK_THROW(lin.load_state_dict(sd), Error);
  BOOST_TEST(lin.weight.to_vector<double>() == before);
}

BOOST_AUTO_TEST_SUITE_END()
