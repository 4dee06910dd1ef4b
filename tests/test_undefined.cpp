// Issue 31, "no segfault from any API call": every public function and method that takes a
// Tensor gets an undefined Tensor() in each Tensor parameter in turn and must throw graft::Error
// (or, for a parameter documented as optional, accept it), never crash. The list of functions
// comes from the public headers, parsed at test time (see public_tensor_functions()), so a new
// public function without a case here fails `every_public_function_taking_a_tensor_has_a_case`,
// as tests/test_gradcheck_all.cpp fails for a declared op without a gradcheck case.
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
  struct Scope {
    std::string cls;  // the class name; empty for a namespace; "{}" for a body
    bool open;        // members declared here now are public
  };
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
      for (int depth = 0; pos < s.size() && (depth > 0 || (s[pos] != ';' && s[pos] != '{')); ++pos)
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
      std::string sig;
      for (auto& c : scopes)
        if (!c.cls.empty()) sig += c.cls + "::";
      sig += name + "(";
      for (size_t i = 0; i < types.size(); ++i) sig += (i ? ", " : "") + types[i];
      out.push_back({sig + ")", header});
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
std::vector<Declared> public_tensor_functions() {
  std::vector<std::string> headers;
  for (const char* dir : {"autograd", "ops", "nn", "models"})
    for (const auto& e : std::filesystem::recursive_directory_iterator(source_dir() + "/" + dir))
      if (e.path().extension() == ".h")
        headers.push_back(std::filesystem::relative(e.path(), source_dir()).string());
  std::sort(headers.begin(), headers.end());
  std::vector<Declared> out;
  for (const auto& h : headers) {
    std::ifstream in(source_dir() + "/" + h);
    std::stringstream text;
    text << in.rdbuf();
    for (auto& d : tensor_functions(h, text.str())) out.push_back(d);
  }
  return out;
}

}  // namespace
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
    {"Tensor::defined()", "the query for an undefined tensor"},
    {"Tensor::impl()", "null for an undefined tensor, documented"},
    {"Tensor::impl_ptr()", "null for an undefined tensor, documented"},
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

std::vector<Case> cases() {
  const auto x23 = [] { return f({2, 3}); };
  std::vector<Case> c = {
      // autograd/
      one("graph_dot(const Tensor&, const std::vector<std::pair<std::string, Tensor>>&)",
          scalar_loss, [](const Tensor& t) { autograd::graph_dot(t); }),
      one("nonfinite_kind(const Tensor&)", x23,
          [](const Tensor& t) { autograd::nonfinite_kind(t); }),
      {"backward(const Tensor&, const Tensor&, bool, bool)",
       [] {
         return Tensors{scalar_loss(), scalar(1, DType::f64)};
       },
       [](const Tensors& t) { autograd::backward(t[0], t[1], false); },
       {1}},
      {"accumulate_grad(const Tensor&, const Tensor&)",
       [] {
         return Tensors{f({2, 3}), f({2, 3})};
       },
       [](const Tensors& t) { autograd::accumulate_grad(t[0], t[1]); }},
      one("reduce_grad(const Tensor&, const Shape&)", x23,
          [](const Tensor& t) {
            autograd::reduce_grad(t, {1, 3});
          }),
      one("expand_grad(const Tensor&, const Shape&)", x23,
          [](const Tensor& t) {
            autograd::expand_grad(t, {4, 2, 3});
          }),
      one("Tensor::view_of(const Tensor&, const Shape&, const Shape&, int64_t)", x23,
          [](const Tensor& t) {
            Tensor::view_of(t, {3, 2}, {1, 3}, 0);
          }),
      one("Tensor::shape()", x23, [](const Tensor& t) { t.shape(); }),
      one("Tensor::strides()", x23, [](const Tensor& t) { t.strides(); }),
      one("Tensor::offset()", x23, [](const Tensor& t) { t.offset(); }),
      one("Tensor::dim()", x23, [](const Tensor& t) { t.dim(); }),
      one("Tensor::size(int64_t)", x23, [](const Tensor& t) { t.size(-1); }),
      one("Tensor::numel()", x23, [](const Tensor& t) { t.numel(); }),
      one("Tensor::dtype()", x23, [](const Tensor& t) { t.dtype(); }),
      one("Tensor::is_contiguous()", x23, [](const Tensor& t) { t.is_contiguous(); }),
      {"Tensor::same_storage(const Tensor&)",
       [] {
         return Tensors{f({2}), f({2})};
       },
       [](const Tensors& t) { t[0].same_storage(t[1]); }},
      one("Tensor::data()", x23, [](const Tensor& t) { t.data<float>(); }),
      one("Tensor::raw()", x23, [](const Tensor& t) { t.raw(); }),
      one(
          "Tensor::item()", [] { return f({1}); }, [](const Tensor& t) { t.item(); }),
      one("Tensor::to_vector()", x23, [](const Tensor& t) { t.to_vector<double>(); }),
      one("Tensor::requires_grad()", x23, [](const Tensor& t) { t.requires_grad(); }),
      one("Tensor::requires_grad_(bool)", x23, [](Tensor t) { t.requires_grad_(); }),
      one("Tensor::is_leaf()", x23, [](const Tensor& t) { t.is_leaf(); }),
      one("Tensor::grad()", x23, [](const Tensor& t) { t.grad(); }),
      {"Tensor::set_grad(const Tensor&)",
       [] {
         return Tensors{f({2}), f({2})};
       },
       [](const Tensors& t) { Tensor(t[0]).set_grad(t[1]); },
       {1}},
      one("Tensor::zero_grad()", x23, [](Tensor t) { t.zero_grad(); }),
      one("Tensor::retain_grad()", scalar_loss, [](const Tensor& t) { t.retain_grad(); }),
      one("retain_grad(const Tensor&)", scalar_loss,
          [](const Tensor& t) { autograd::retain_grad(t); }),
      one("Tensor::detach()", x23, [](const Tensor& t) { t.detach(); }),
      {"Tensor::backward(const Tensor&, bool, bool)",
       [] {
         return Tensors{scalar_loss(), scalar(1, DType::f64)};
       },
       [](const Tensors& t) { t[0].backward(t[1]); },
       {1}},
      one("Tensor::bump_version()", x23, [](const Tensor& t) { t.bump_version(); }),
      one("Tensor::version()", x23, [](const Tensor& t) { t.version(); }),
      one("Tensor::str(int)", x23, [](const Tensor& t) { t.str(); }),
      {"describe(const Tensor&)",
       [] { return Tensors{f({2})}; },
       [](const Tensors& t) { describe(t[0]); },
       {0}},
      one("check_defined(const Tensor&, const char*, const char*)", x23,
          [](const Tensor& t) { check_defined(t, "test", "t"); }),
      one("contiguous_copy(const Tensor&)", x23, [](const Tensor& t) { contiguous_copy(t); }),
      one("cast_copy(const Tensor&, DType)", x23,
          [](const Tensor& t) { cast_copy(t, DType::f64); }),
      {"copy_into(const Tensor&, const Tensor&)",
       [] {
         return Tensors{f({2}), f({2})};
       },
       [](const Tensors& t) { copy_into(t[0], t[1]); }},
      {"accumulate_into(const Tensor&, const Tensor&)",
       [] {
         return Tensors{f({2}), f({2})};
       },
       [](const Tensors& t) { accumulate_into(t[0], t[1]); }},
      one("fill_(const Tensor&, double)", x23, [](const Tensor& t) { fill_(t, 1); }),
      one("sum_axes(const Tensor&, const std::vector<int64_t>&, double)", x23,
          [](const Tensor& t) { sum_axes(t, {1}); }),
      one("sum_to_shape(const Tensor&, const Shape&)", x23,
          [](const Tensor& t) { sum_to_shape(t, {3}); }),
      // ops/
      {"scaled_dot_product_attention(const Tensor&, const Tensor&, const Tensor&, const "
       "AttentionOptions&)",
       [] {
         return Tensors{f({1, 2, 3, 4}), f({1, 2, 3, 4}), f({1, 2, 3, 4})};
       },
       [](const Tensors& t) { scaled_dot_product_attention(t[0], t[1], t[2]); }},
      one("dropout(const Tensor&, double, bool, Generator&)", x23,
          [](const Tensor& t) { dropout(t, 0.5, true); }),
      one("relu_dropout(const Tensor&, double, bool, Generator&)", x23,
          [](const Tensor& t) { relu_dropout(t, 0.5, true); }),
      one("unary(const UnaryOp&, const Tensor&, double, double)", x23,
          [](const Tensor& t) { unary(square_row(), t); }),
      // x or y may be undefined (the row reads the one it saves); both undefined is an error.
      {"unary_df_constant(const UnaryOp&, const Tensor&, const Tensor&, double, double)",
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
      one("affine(const Tensor&, double, double)", x23, [](const Tensor& t) { affine(t, 2, 1); }),
      one("neg(const Tensor&)", x23, [](const Tensor& t) { neg(t); }),
      one("exp(const Tensor&)", x23, [](const Tensor& t) { exp(t); }),
      one("log(const Tensor&)", x23, [](const Tensor& t) { log(t); }),
      one("sqrt(const Tensor&)", x23, [](const Tensor& t) { sqrt(t); }),
      one("pow(const Tensor&, double)", x23, [](const Tensor& t) { pow(t, 2); }),
      one("tanh(const Tensor&)", x23, [](const Tensor& t) { tanh(t); }),
      one("sigmoid(const Tensor&)", x23, [](const Tensor& t) { sigmoid(t); }),
      one("relu(const Tensor&)", x23, [](const Tensor& t) { relu(t); }),
      one("gelu(const Tensor&, bool)", x23, [](const Tensor& t) { gelu(t); }),
      one("silu(const Tensor&)", x23, [](const Tensor& t) { silu(t); }),
      one("abs(const Tensor&)", x23, [](const Tensor& t) { abs(t); }),
      one("clamp(const Tensor&, double, double)", x23, [](const Tensor& t) { clamp(t, -1, 1); }),
      one("sin(const Tensor&)", x23, [](const Tensor& t) { sin(t); }),
      one("cos(const Tensor&)", x23, [](const Tensor& t) { cos(t); }),
      one("add(const Tensor&, double)", x23, [](const Tensor& t) { add(t, 1.0); }),
      one("add(double, const Tensor&)", x23, [](const Tensor& t) { add(1.0, t); }),
      one("sub(const Tensor&, double)", x23, [](const Tensor& t) { sub(t, 1.0); }),
      one("sub(double, const Tensor&)", x23, [](const Tensor& t) { sub(1.0, t); }),
      one("mul(const Tensor&, double)", x23, [](const Tensor& t) { mul(t, 2.0); }),
      one("mul(double, const Tensor&)", x23, [](const Tensor& t) { mul(2.0, t); }),
      one("div(const Tensor&, double)", x23, [](const Tensor& t) { div(t, 2.0); }),
      {"maximum(const Tensor&, const Tensor&)",
       [] {
         return Tensors{f({2, 3}), f({3})};
       },
       [](const Tensors& t) { maximum(t[0], t[1]); }},
      {"minimum(const Tensor&, const Tensor&)",
       [] {
         return Tensors{f({2, 3}), f({3})};
       },
       [](const Tensors& t) { minimum(t[0], t[1]); }},
      // ops/custom.h
      one("broadcast_strides(const Tensor&, const Shape&)", x23,
          [](const Tensor& t) {
            kern::broadcast_strides(t, {4, 2, 3});
          }),
      one("contig(const Tensor&)", x23, [](const Tensor& t) { kern::contig(t); }),
      one("check_float(const char*, const Tensor&)", x23,
          [](const Tensor& t) { kern::check_float("test", t); }),
      {"check_same_dtype(const char*, const Tensor&, const Tensor&)",
       [] {
         return Tensors{f({2}), f({3})};
       },
       [](const Tensors& t) { kern::check_same_dtype("test", t[0], t[1]); }},
      {"matmul_into(const Tensor&, const Tensor&, const Tensor&, double, bool)",
       [] {
         return Tensors{f({2, 3}), f({3, 4}), f({2, 4})};
       },
       [](const Tensors& t) { kern::matmul_into(t[0], t[1], t[2]); }},
      {"where(const Tensor&, const Tensor&, const Tensor&)",
       [] {
         return Tensors{i64({1, 0, 1}), f({3}), f({3})};
       },
       [](const Tensors& t) { where(t[0], t[1], t[2]); }},
      {"masked_fill(const Tensor&, const Tensor&, double)",
       [] {
         return Tensors{f({3}), i64({1, 0, 1})};
       },
       [](const Tensors& t) { masked_fill(t[0], t[1], 0); }},
      one("eq(const Tensor&, double)", x23, [](const Tensor& t) { eq(t, 0); }),
      one("operator-(const Tensor&)", x23, [](const Tensor& t) { -t; }),
      one("operator+(const Tensor&, double)", x23, [](const Tensor& t) { t + 1.0; }),
      one("operator+(double, const Tensor&)", x23, [](const Tensor& t) { 1.0 + t; }),
      one("operator-(const Tensor&, double)", x23, [](const Tensor& t) { t - 1.0; }),
      one("operator-(double, const Tensor&)", x23, [](const Tensor& t) { 1.0 - t; }),
      one("operator*(const Tensor&, double)", x23, [](const Tensor& t) { t * 2.0; }),
      one("operator*(double, const Tensor&)", x23, [](const Tensor& t) { 2.0 * t; }),
      one("operator/(const Tensor&, double)", x23, [](const Tensor& t) { t / 2.0; }),
      one(
          "split_heads(const Tensor&, int64_t, int64_t)",
          [] {
            return f({1, 2, 8});
          },
          [](const Tensor& t) { split_heads(t, 2, 2); }),
      one(
          "merge_heads(const Tensor&)",
          [] {
            return f({1, 2, 2, 2});
          },
          [](const Tensor& t) { merge_heads(t); }),
      {"cross_entropy(const Tensor&, const Tensor&, double, int64_t)",
       [] {
         return Tensors{f({2, 5}), i64({1, 4})};
       },
       [](const Tensors& t) { cross_entropy(t[0], t[1]); }},
      {"linear_cross_entropy(const Tensor&, const Tensor&, const Tensor&, double, int64_t, "
       "int64_t)",
       [] {
         return Tensors{f({2, 4}), f({5, 4}), i64({1, 4})};
       },
       [](const Tensors& t) { linear_cross_entropy(t[0], t[1], t[2]); }},
      {"matmul(const Tensor&, const Tensor&)",
       [] {
         return Tensors{f({2, 3}), f({3, 4})};
       },
       [](const Tensors& t) { matmul(t[0], t[1]); }},
      {"linear(const Tensor&, const Tensor&, const Tensor&)",
       [] {
         return Tensors{f({2, 3}), f({4, 3}), f({4})};
       },
       [](const Tensors& t) { linear(t[0], t[1], t[2]); },
       {2}},
      {"layer_norm(const Tensor&, const Tensor&, const Tensor&, double)",
       [] {
         return Tensors{f({2, 4}), f({4}), f({4})};
       },
       [](const Tensors& t) { layer_norm(t[0], t[1], t[2]); },
       {1, 2}},
      {"add_layer_norm(const Tensor&, const Tensor&, const Tensor&, const Tensor&, double)",
       [] {
         return Tensors{f({2, 4}), f({2, 4}), f({4}), f({4})};
       },
       [](const Tensors& t) { add_layer_norm(t[0], t[1], t[2], t[3]); },
       {2, 3}},
      {"rms_norm(const Tensor&, const Tensor&, double)",
       [] {
         return Tensors{f({2, 4}), f({4})};
       },
       [](const Tensors& t) { rms_norm(t[0], t[1]); },
       {1}},
      one("sum(const Tensor&, const std::vector<int64_t>&, bool)", x23,
          [](const Tensor& t) { sum(t); }),
      one("mean(const Tensor&, const std::vector<int64_t>&, bool)", x23,
          [](const Tensor& t) { mean(t); }),
      one("max(const Tensor&, int64_t, bool)", x23, [](const Tensor& t) { max(t, 1); }),
      one("amax(const Tensor&, const std::vector<int64_t>&, bool)", x23,
          [](const Tensor& t) { amax(t); }),
      one("argmax(const Tensor&, int64_t)", x23, [](const Tensor& t) { argmax(t, 1); }),
      one("var(const Tensor&, const std::vector<int64_t>&, bool, int64_t)", x23,
          [](const Tensor& t) { var(t, {1}); }),
      one("sum_to(const Tensor&, const Shape&)", x23, [](const Tensor& t) { sum_to(t, {3}); }),
      {"rope(const Tensor&, const Tensor&, double)",
       [] {
         return Tensors{f({1, 3, 4}), i64({0, 1, 2})};
       },
       [](const Tensors& t) { rope(t[0], t[1]); }},
      one("reshape(const Tensor&, Shape)", x23,
          [](const Tensor& t) {
            reshape(t, {3, 2});
          }),
      one("permute(const Tensor&, const std::vector<int64_t>&)", x23,
          [](const Tensor& t) {
            permute(t, {1, 0});
          }),
      one("transpose(const Tensor&, int64_t, int64_t)", x23,
          [](const Tensor& t) { transpose(t, 0, 1); }),
      one("slice(const Tensor&, int64_t, int64_t, int64_t, int64_t)", x23,
          [](const Tensor& t) { slice(t, 1, 0, 2); }),
      one("unsqueeze(const Tensor&, int64_t)", x23, [](const Tensor& t) { unsqueeze(t, 0); }),
      one(
          "squeeze(const Tensor&, int64_t)",
          [] {
            return f({1, 3});
          },
          [](const Tensor& t) { squeeze(t, 0); }),
      one("broadcast_to(const Tensor&, const Shape&)", x23,
          [](const Tensor& t) {
            broadcast_to(t, {4, 2, 3});
          }),
      one("contiguous(const Tensor&)", x23, [](const Tensor& t) { contiguous(t); }),
      one("to_dtype(const Tensor&, DType)", x23, [](const Tensor& t) { to_dtype(t, DType::f64); }),
      one("split(const Tensor&, const std::vector<int64_t>&, int64_t)", x23,
          [](const Tensor& t) {
            split(t, {1, 2}, 1);
          }),
      {"index_select(const Tensor&, int64_t, const Tensor&)",
       [] {
         return Tensors{f({3, 2}), i64({2, 0})};
       },
       [](const Tensors& t) { index_select(t[0], 0, t[1]); }},
      {"select_rows_(const Tensor&, const Tensor&)",
       [] {
         return Tensors{f({3, 2}), i64({2, 0, 1})};
       },
       [](const Tensors& t) { select_rows_(t[0], t[1]); }},
      {"embedding(const Tensor&, const Tensor&, int64_t)",
       [] {
         return Tensors{f({5, 4}), i64({1, 3})};
       },
       [](const Tensors& t) { embedding(t[0], t[1]); }},
      one("softmax(const Tensor&, int64_t)", x23, [](const Tensor& t) { softmax(t); }),
      one("log_softmax(const Tensor&, int64_t)", x23, [](const Tensor& t) { log_softmax(t); }),
  };
  for (const char* op :
       {"add", "sub", "mul", "div", "operator+", "operator-", "operator*", "operator/"}) {
    const std::string name = op;
    c.push_back({name + "(const Tensor&, const Tensor&)",
                 [] {
                   return Tensors{f({2, 3}), f({3})};
                 },
                 [name](const Tensors& t) {
                   if (name == "add" || name == "operator+")
                     (void)(name == "add" ? add(t[0], t[1]) : t[0] + t[1]);
                   if (name == "sub" || name == "operator-")
                     (void)(name == "sub" ? sub(t[0], t[1]) : t[0] - t[1]);
                   if (name == "mul" || name == "operator*")
                     (void)(name == "mul" ? mul(t[0], t[1]) : t[0] * t[1]);
                   if (name == "div" || name == "operator/")
                     (void)(name == "div" ? div(t[0], t[1]) : t[0] / t[1]);
                 }});
  }
  // ---- ops/compare.h (issue 48: comparisons and logical ops on masks) ----
  using Binary = Tensor (*)(const Tensor&, const Tensor&);
  using WithScalar = Tensor (*)(const Tensor&, double);
  for (auto [name, op] : {std::pair<std::string, Binary>{"eq", eq},
                          {"ne", ne},
                          {"lt", lt},
                          {"le", le},
                          {"gt", gt},
                          {"ge", ge},
                          {"logical_and", logical_and},
                          {"logical_or", logical_or}})
    c.push_back({name + "(const Tensor&, const Tensor&)",
                 [] {
                   return Tensors{f({2, 3}), f({3})};
                 },
                 [op](const Tensors& t) { op(t[0], t[1]); }});
  for (auto [name, op] : {std::pair<std::string, WithScalar>{"ne", ne},
                          {"lt", lt},
                          {"le", le},
                          {"gt", gt},
                          {"ge", ge}})
    c.push_back(one(
        name + "(const Tensor&, double)",
        [] {
          return f({2, 3});
        },
        [op](const Tensor& t) { op(t, 0.5); }));
  c.push_back(one(
      "logical_not(const Tensor&)",
      [] {
        return f({2, 3});
      },
      [](const Tensor& t) { logical_not(t); }));
  // ---- end of ops/compare.h ----
  return c;
}

}  // namespace
namespace {

std::vector<Case> nn_and_model_cases() {
  using namespace graft::nn;
  using namespace graft::train;
  using namespace graft::models;
  const auto x3 = [] { return f({1, 3, 8}); };
  const auto step = [] { return f({1, 1, 8}); };
  std::vector<Case> c = {
      one(
          "KVCache::select_rows(const Tensor&)", [] { return i64({0}); },
          [](const Tensor& rows) {
            autograd::NoGrad ng;
            KVCache cache;
            mha().forward_self_step(f({1, 1, 8}), cache, 4);
            cache.select_rows(rows);
          }),
      {"KVCache::append(const Tensor&, const Tensor&, int64_t)",
       [] {
         return Tensors{f({1, 2, 1, 4}), f({1, 2, 1, 4})};
       },
       [](const Tensors& t) {
         KVCache cache;
         cache.append(t[0], t[1], 4);
       }},
      {"MultiHeadAttention::forward(const Tensor&, const Tensor&, const Tensor&, bool, Tensor*, "
       "const AttentionPositions*)",
       [] {
         return Tensors{f({1, 3, 8}), f({1, 2, 8}), no_pad(1, 2)};
       },
       [](const Tensors& t) { mha().forward(t[0], t[1], t[2]); },
       {2}},
      one("MultiHeadAttention::forward_self_step(const Tensor&, KVCache&, int64_t, const "
          "AttentionPositions*)",
          step,
          [](const Tensor& t) {
            KVCache cache;
            mha().forward_self_step(t, cache, 4);
          }),
      one(
          "MultiHeadAttention::fill_cross_cache(const Tensor&, KVCache&)",
          [] {
            return f({1, 2, 8});
          },
          [](const Tensor& t) {
            KVCache cache;
            mha().fill_cross_cache(t, cache);
          }),
      {"MultiHeadAttention::forward_cross_cached(const Tensor&, const KVCache&, const Tensor&, "
       "Tensor*, int64_t)",
       [] {
         return Tensors{f({1, 1, 8}), no_pad(1, 2)};
       },
       [](const Tensors& t) {
         KVCache cache;
         mha().fill_cross_cache(f({1, 2, 8}), cache);
         mha().forward_cross_cached(t[0], cache, t[1]);
       },
       {1}},
      one(
          "shard_of(const Tensor&, Shard)",
          [] {
            return f({4, 2});
          },
          [](const Tensor& t) {
            shard_of(t, Shard{0, 2});
          }),
      one(
          "shard_loss(const Tensor&, int64_t, int64_t)", [] { return scalar(1.0); },
          [](const Tensor& t) { shard_loss(t, 1, 2); }),
      one(
          "Linear::forward(const Tensor&)",
          [] {
            return f({2, 3});
          },
          [](const Tensor& t) { Linear(3, 4).forward(t); }),
      one(
          "Embedding::forward(const Tensor&)",
          [] {
            return i64({1, 2});
          },
          [](const Tensor& t) { Embedding(5, 4).forward(t); }),
      one(
          "LayerNorm::forward(const Tensor&)",
          [] {
            return f({2, 4});
          },
          [](const Tensor& t) { LayerNorm(4).forward(t); }),
      {"LayerNorm::forward_add(const Tensor&, const Tensor&)",
       [] {
         return Tensors{f({2, 4}), f({2, 4})};
       },
       [](const Tensors& t) { LayerNorm(4).forward_add(t[0], t[1]); }},
      one(
          "Dropout::forward(const Tensor&)",
          [] {
            return f({2, 4});
          },
          [](const Tensor& t) { Dropout(0.5).forward(t); }),
      one(
          "feed_forward(const Linear&, const Dropout&, const Linear&, Activation, const Tensor&, "
          "const Linear*)",
          [] {
            return f({2, 4});
          },
          [](const Tensor& t) {
            Linear gate(4, 6);
            feed_forward(Linear(4, 6), Dropout(0.0), Linear(6, 4), Activation::swiglu, t, &gate);
          }),
      {"add_positions(const Tensor&, const Tensor&, int64_t, bool)",
       [] {
         return Tensors{f({1, 3, 8}), sinusoid_table(0, 16, 8, DType::f32)};
       },
       [](const Tensors& t) { add_positions(t[0], t[1], 0, true); }},
      one("SinusoidalPositionalEncoding::forward(const Tensor&, int64_t)", x3,
          [](const Tensor& t) { SinusoidalPositionalEncoding(16, 8).forward(t); }),
      one("LearnedPositionalEncoding::forward(const Tensor&, int64_t)", x3,
          [](const Tensor& t) { LearnedPositionalEncoding(16, 8).forward(t); }),
      one(
          "xavier_uniform_(const Tensor&, Generator&, double)",
          [] {
            return f({3, 4});
          },
          [](const Tensor& t) { xavier_uniform_(t, gen()); }),
      one(
          "uniform_(const Tensor&, double, double, Generator&)",
          [] {
            return f({3, 4});
          },
          [](const Tensor& t) { uniform_(t, 0, 1, gen()); }),
      one(
          "normal_(const Tensor&, double, double, Generator&)",
          [] {
            return f({3, 4});
          },
          [](const Tensor& t) { normal_(t, 0, 1, gen()); }),
      one(
          "RotaryPositions::rotate(const Tensor&, int64_t)",
          [] {
            return f({1, 2, 3, 4});
          },
          [](const Tensor& t) { RotaryPositions(10000.0).rotate(t, 0); }),
      one("EmbeddingPositions::forward(const Tensor&, int64_t)", x3,
          [](const Tensor& t) {
            EmbeddingPositions(Positions::sinusoidal, 16, 8, DType::f32, gen()).forward(t);
          }),
      {"EncoderLayer::forward(const Tensor&, const Tensor&, bool, const AttentionPositions*)",
       [] {
         return Tensors{f({1, 3, 8}), no_pad(1, 3)};
       },
       [](const Tensors& t) { enc_layer().forward(t[0], t[1]); },
       {1}},
      one("EncoderLayer::forward_step(const Tensor&, KVCache&, int64_t, const AttentionPositions*)",
          step,
          [](const Tensor& t) {
            KVCache cache;
            enc_layer().forward_step(t, cache, 4);
          }),
      {"DecoderLayer::forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, Tensor*, "
       "const AttentionPositions*)",
       [] {
         return Tensors{f({1, 3, 8}), f({1, 2, 8}), no_pad(1, 3), no_pad(1, 2)};
       },
       [](const Tensors& t) { dec_layer().forward(t[0], t[1], t[2], t[3]); },
       {2, 3}},
      {"DecoderLayer::forward_step(const Tensor&, const Tensor&, const Tensor&, "
       "DecoderLayerCache&, int64_t, Tensor*, "
       "const AttentionPositions*, int64_t)",
       [] {
         return Tensors{f({1, 1, 8}), f({1, 2, 8}), no_pad(1, 2)};
       },
       [](const Tensors& t) {
         DecoderLayerCache cache;
         dec_layer().forward_step(t[0], t[1], t[2], cache, 4);
       },
       {2}},
      {"Encoder::forward(const Tensor&, const Tensor&)",
       [] {
         return Tensors{f({1, 3, 8}), no_pad(1, 3)};
       },
       [](const Tensors& t) { encoder(false).forward(t[0], t[1]); },
       {1}},
      one("Encoder::forward_step(const Tensor&, std::vector<KVCache>&, int64_t)", step,
          [](const Tensor& t) {
            std::vector<KVCache> caches;
            encoder(true).forward_step(t, caches, 4);
          }),
      {"Decoder::forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, Tensors*)",
       [] {
         return Tensors{f({1, 3, 8}), f({1, 2, 8}), no_pad(1, 3), no_pad(1, 2)};
       },
       [](const Tensors& t) { decoder().forward(t[0], t[1], t[2], t[3]); },
       {2, 3}},
      {"Decoder::forward_step(const Tensor&, const Tensor&, const Tensor&, "
       "std::vector<DecoderLayerCache>&, int64_t, "
       "Tensors*, int64_t)",
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
          "check_token_ids(const char*, const Tensor&)", [] { return ids(1, 3); },
          [](const Tensor& t) { check_token_ids("test", t); }),
      one(
          "DecoderOnlyLM::forward(const Tensor&)", [] { return ids(1, 3); },
          [](const Tensor& t) { lm().forward(t); }),
      one(
          "DecoderOnlyLM::embed(const Tensor&, int64_t)", [] { return ids(1, 3); },
          [](const Tensor& t) { lm().embed(t); }),
      one("DecoderOnlyLM::logits(const Tensor&)", x3, [](const Tensor& t) { lm().logits(t); }),
      one(
          "EncoderClassifier::forward(const Tensor&)", [] { return ids(1, 3); },
          [](const Tensor& t) { classifier().forward(t); }),
      one(
          "EncoderClassifier::ngram_ids(const Tensor&)", [] { return ids(1, 3); },
          [](const Tensor& t) { classifier().ngram_ids(t); }),
      {"BertEncoder::forward(const Tensor&, const Tensor&, const Tensor&)",
       [] {
         return Tensors{ids(1, 3), f({1, 3}), no_pad(1, 3)};
       },
       [](const Tensors& t) { bert().forward(t[0], t[1], t[2]); },
       {1, 2}},
      {"mean_pool(const Tensor&, const Tensor&)",
       [] {
         return Tensors{f({1, 3, 8}), f({1, 3})};
       },
       [](const Tensors& t) { models::mean_pool(t[0], t[1]); }},
      one(
          "l2_normalize(const Tensor&, double)",
          [] {
            return f({2, 8});
          },
          [](const Tensor& t) { models::l2_normalize(t); }),
      {"pool(const Tensor&, const Tensor&, Pooling, bool)",
       [] {
         return Tensors{f({1, 3, 8}), f({1, 3})};
       },
       [](const Tensors& t) { models::pool(t[0], t[1], models::Pooling::mean, true); }},
      {"SentenceEncoder::embed(const Tensor&, const Tensor&)",
       [] {
         return Tensors{ids(1, 3), f({1, 3})};
       },
       [](const Tensors& t) { sentence_encoder().embed(t[0], t[1]); },
       {1}},
      one(
          "Transformer::embed(const Tensor&, int64_t)", [] { return ids(1, 3); },
          [](const Tensor& t) { transformer().embed(t); }),
      one(
          "Transformer::encode(const Tensor&)", [] { return ids(1, 3); },
          [](const Tensor& t) { transformer().encode(t); }),
      {"Transformer::decode(const Tensor&, const Tensor&, const Tensor&, Tensors*)",
       [] {
         return Tensors{f({1, 4, 8}), ids(1, 4), ids(1, 3)};
       },
       [](const Tensors& t) { transformer().decode(t[0], t[1], t[2]); }},
      {"Transformer::forward(const Tensor&, const Tensor&)",
       [] {
         return Tensors{ids(1, 4), ids(1, 3)};
       },
       [](const Tensors& t) { transformer().forward(t[0], t[1]); }},
      {"Transformer::loss(const Tensor&, const Tensor&, const Tensor&, double)",
       [] {
         return Tensors{ids(1, 4), ids(1, 3), ids(1, 3)};
       },
       [](const Tensors& t) { transformer().loss(t[0], t[1], t[2]); }},
      {"Transformer::decoder_states(const Tensor&, const Tensor&, const Tensor&, Tensors*)",
       [] {
         return Tensors{f({1, 4, 8}), ids(1, 4), ids(1, 3)};
       },
       [](const Tensors& t) { transformer().decoder_states(t[0], t[1], t[2]); }},
      one("Transformer::logits(const Tensor&)", x3,
          [](const Tensor& t) { transformer().logits(t); }),
      one(
          "Transformer::pad_mask(const Tensor&)", [] { return ids(1, 3); },
          [](const Tensor& t) { transformer().pad_mask(t); }),
      one(
          "translate(const Transformer&, const Tensor&, const DecodeOptions&)",
          [] { return ids(1, 4); },
          [](const Tensor& t) { translate(transformer(), t, decode_options(1)); }),
  };
  // The base AttentionPositions adds no rotation: rotate() hands its tensor back as it is, so an
  // undefined one comes back undefined, as documented ("x itself").
  c.push_back({"AttentionPositions::rotate(const Tensor&, int64_t)",
               [] {
                 return Tensors{f({1, 2, 3, 4})};
               },
               [](const Tensors& t) { AttentionPositions().rotate(t[0], 0); },
               {0}});
  // One process has nothing to send or receive: the single-process communicator's calls are no-ops
  // for any tensor, through the base class too.
  for (const char* fn :
       {"allreduce_sum(Tensor&)", "start_allreduce_sum(Tensor&)", "broadcast(Tensor&, int)"})
    for (const char* cls : {"Communicator::", "SingleProcessCommunicator::"}) {
      const std::string name = fn;
      c.push_back({cls + name,
                   [] { return Tensors{f({2})}; },
                   [name](const Tensors& t) {
                     SingleProcessCommunicator single;
                     Communicator& comm = single;
                     Tensor x = t[0];
                     if (name[0] == 'a') comm.allreduce_sum(x);
                     else if (name[0] == 's') comm.start_allreduce_sum(x);
                     else comm.broadcast(x, 0);
                   },
                   {0}});
    }
  return c;
}

std::vector<Case> all_cases() {
  std::vector<Case> c = cases();
  for (auto& k : nn_and_model_cases()) c.push_back(std::move(k));
  return c;
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
                                         "Tensor::data()"};
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

// The walk: every function and method of the public headers that takes a Tensor has a case (or a
// reasoned entry in kExcluded), and every case names a function the headers still declare.
BOOST_AUTO_TEST_CASE(every_public_function_taking_a_tensor_has_a_case) {
  std::set<std::string> covered;
  for (auto& c : all_cases())
    BOOST_TEST(covered.insert(c.signature).second, "two cases for " << c.signature);
  std::set<std::string> declared;
  for (auto& d : public_tensor_functions()) {
    declared.insert(d.signature);
    if (!covered.count(d.signature) && !kExcluded.count(d.signature))
      BOOST_ERROR(
          d.header
          << ": " << d.signature
          << " takes a Tensor but has no undefined-tensor case in tests/test_undefined.cpp");
  }
  for (auto& sig : covered)
    BOOST_TEST(declared.count(sig) == 1u,
               "the case " << sig << " names no declaration of the public headers");
  for (auto& [sig, why] : kExcluded)
    BOOST_TEST(declared.count(sig) == 1u, "the exclusion " << sig << " names no declaration");
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
