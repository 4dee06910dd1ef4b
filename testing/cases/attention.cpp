// The op records of ops/attention.cpp (graft/testing/registry.h): the samples first, by op, then
// one record_<op>() per op taking them; register_attention_cases() registers them all.
#include "testing/cases/cases.h"

namespace graft {

namespace {

// The op name in its errors.
constexpr const char* kOp = "scaled_dot_product_attention";

// x = {q, k, v, [mask or bias]}; extra names what x[3] is.
enum class Extra { none, mask, bias };
Tensor attn(const Tensors& x, bool causal, Extra extra = Extra::none) {
  AttentionOptions opt;
  opt.causal = causal;
  if (extra == Extra::mask) opt.key_padding_mask = x[3];
  if (extra == Extra::bias) opt.bias = x[3];
  return scaled_dot_product_attention(x[0], x[1], x[2], opt).out;
}

Tensors qkv(DType dt, Generator& g, int64_t Tq, int64_t Tk) {
  return {case_input({2, 2, Tq, 3}, dt, g), case_input({2, 2, Tk, 3}, dt, g),
          case_input({2, 2, Tk, 2}, dt, g)};
}

void attention_dropout_samples(Samples& s) {
  // A fresh generator per call, so every forward of the gradcheck drops the same entries.
  add_sample(s, OpCase{.name = "attention/dropout_causal_bias",
                       .op = "scaled_dot_product_attention",
                       .make_inputs =
                           [](DType dt, Generator& g) {
                             Tensors x = qkv(dt, g, 3, 4);
                             x.push_back(case_input({2, 1, 4}, dt, g));
                             return x;
                           },
                       .fn =
                           [](const Tensors& x) {
                             Generator gen(9);
                             AttentionOptions opt;
                             opt.causal = true;
                             opt.bias = x[3];
                             opt.dropout = 0.3;
                             opt.generator = &gen;
                             return scaled_dot_product_attention(x[0], x[1], x[2], opt).out;
                           }});
}

// The bad inputs of scaled_dot_product_attention, each against q (2, 2, 3, 4), k (2, 2, 5, 4),
// v (2, 2, 5, 6) with one of them, the mask or the bias made wrong.
std::vector<ErrorInput> attention_error_inputs() {
  const auto call = [](const Tensor& q, const Tensor& k, const Tensor& v,
                       const AttentionOptions& opt = {}) {
    scaled_dot_product_attention(q, k, v, opt);
  };
  const Shape q{2, 2, 3, 4}, k{2, 2, 5, 4}, v{2, 2, 5, 6};
  const std::string op = std::string(kOp) + ": ";
  const std::string qkv_good = "q f32 (2, 2, 3, 4), k f32 (2, 2, 5, 4), v f32 (2, 2, 5, 6)";
  return {{"a rank-3 q",
           [=] {
             call(zeros({2, 3, 4}), zeros(k), zeros(v));
           },
           op + "q, k, v must be rank 4 (B, H, T, D), got q f32 (2, 3, 4), k f32 (2, 2, 5, 4), "
                "v f32 (2, 2, 5, 6)"},
          {"k of another head dim",
           [=] {
             call(zeros(q), zeros({2, 2, 5, 3}), zeros(v));
           },
           op + "q and k head dims differ (4 vs 3): q f32 (2, 2, 3, 4), k f32 (2, 2, 5, 3), "
                "v f32 (2, 2, 5, 6)"},
          {"v of another key count",
           [=] {
             call(zeros(q), zeros(k), zeros({2, 2, 4, 6}));
           },
           op + "k and v key counts differ (5 vs 4): q f32 (2, 2, 3, 4), k f32 (2, 2, 5, 4), "
                "v f32 (2, 2, 4, 6)"},
          {"k and v of another head count",
           [=] {
             call(zeros(q), zeros({2, 3, 5, 4}), zeros({2, 3, 5, 6}));
           },
           op + "batch and head dims (B, H) differ: q f32 (2, 2, 3, 4), k f32 (2, 3, 5, 4), "
                "v f32 (2, 3, 5, 6)"},
          {"an f64 v", [=] { call(zeros(q), zeros(k), zeros(v, DType::f64)); },
           op + "dtype mismatch, q f32 (2, 2, 3, 4), k f32 (2, 2, 5, 4), v f64 (2, 2, 5, 6)"},
          {"an int64 v", [=] { call(zeros(q), zeros(k), zeros(v, DType::i64)); },
           op + "expected a float tensor, got i64 (2, 2, 5, 6)"},
          {"a key_padding_mask of another key count",
           [=] {
             AttentionOptions opt;
             opt.key_padding_mask = zeros({2, 3});
             call(zeros(q), zeros(k), zeros(v), opt);
           },
           op + "key_padding_mask f32 (2, 3) must be (B, Tk) = (2, 5) for " + qkv_good},
          {"a bias that does not broadcast",
           [=] {
             AttentionOptions opt;
             opt.bias = zeros({2, 3, 3});
             call(zeros(q), zeros(k), zeros(v), opt);
           },
           op + "bias f32 (2, 3, 3) does not broadcast to (B, H, Tq, Tk) = (2, 2, 3, 5)"},
          {"an f64 bias",
           [=] {
             AttentionOptions opt;
             opt.bias = zeros({3, 5}, DType::f64);
             call(zeros(q), zeros(k), zeros(v), opt);
           },
           op + "bias f64 (3, 5) must have the dtype of q f32 (2, 2, 3, 4)"}};
}

void attention_mask_samples(Samples& s) {
  add_sample(s, OpCase{.name = "attention/plain",
                       .op = "scaled_dot_product_attention",
                       .make_inputs = [](DType dt, Generator& g) { return qkv(dt, g, 3, 4); },
                       .fn = [](const Tensors& x) { return attn(x, false); }});
  add_sample(s, OpCase{.name = "attention/causal_square",
                       .op = "scaled_dot_product_attention",
                       .make_inputs = [](DType dt, Generator& g) { return qkv(dt, g, 4, 4); },
                       .fn = [](const Tensors& x) { return attn(x, true); }});
  add_sample(s, OpCase{.name = "attention/causal_tq_lt_tk",
                       .op = "scaled_dot_product_attention",
                       .make_inputs = [](DType dt, Generator& g) { return qkv(dt, g, 2, 4); },
                       .fn = [](const Tensors& x) { return attn(x, true); }});
  // Batch 1 has every key masked: its outputs and gradients must be 0, not NaN.
  add_sample(
      s,
      OpCase{.name = "attention/padding_all_masked_row",
             .op = "scaled_dot_product_attention",
             .make_inputs =
                 [](DType dt, Generator& g) {
                   Tensors x = qkv(dt, g, 3, 4);
                   x.push_back(from_vector(std::vector<int64_t>{0, 0, 1, 0, 1, 1, 1, 1}, {2, 4}));
                   return x;
                 },
             .fn = [](const Tensors& x) { return attn(x, false, Extra::mask); }});
  add_sample(s, OpCase{.name = "attention/broadcast_bias",
                       .op = "scaled_dot_product_attention",
                       .make_inputs =
                           [](DType dt, Generator& g) {
                             Tensors x = qkv(dt, g, 3, 4);
                             x.push_back(case_input({1, 2, 3, 4}, dt, g));
                             return x;
                           },
                       .fn = [](const Tensors& x) { return attn(x, true, Extra::bias); }});
  // q as the (B, T, H, D) output of a projection, split into heads by a permute view.
  add_sample(s, OpCase{.name = "attention/noncontig_q",
                       .op = "scaled_dot_product_attention",
                       .make_inputs =
                           [](DType dt, Generator& g) {
                             return Tensors{case_input({2, 3, 2, 3}, dt, g),
                                            case_input({2, 2, 4, 3}, dt, g),
                                            case_input_t({2, 2, 4, 2}, dt, g)};
                           },
                       .fn =
                           [](const Tensors& x) {
                             AttentionOptions opt;
                             opt.scale = 0.7;
                             return scaled_dot_product_attention(permute(x[0], {0, 2, 1, 3}), x[1],
                                                                 x[2], opt)
                                 .out;
                           }});
}

void attention_samples(Samples& s) {
  attention_mask_samples(s);
  attention_dropout_samples(s);
}

void record_scaled_dot_product_attention(Samples& s) {
  register_op(OpRecord{.name = "scaled_dot_product_attention",
                       .family = "attention",
                       .forward = "scaled_dot_product_attention",
                       .backward = "scaled_dot_product_attention_backward",
                       .double_backward = DoubleBackward::composed,
                       .samples = take(s, "scaled_dot_product_attention"),
                       .error_inputs = attention_error_inputs(),
                       .accepts_undefined = {3},  // the mask or bias (input 3) is optional
                       .nonfinite = nan_propagates()});
}

}  // namespace

void register_attention_cases() {
  Samples s;
  attention_samples(s);
  record_scaled_dot_product_attention(s);
  check_all_taken(s, "attention");
}

}  // namespace graft
