// What the family record files share, and register_op_cases().
#include "testing/cases/cases.h"

#include <mutex>

namespace graft {

void add_sample(Samples& s, OpCase c) {
  const std::string op = c.op;
  s[op].push_back(std::move(c));
}

std::vector<OpCase> take(Samples& s, const std::string& op) {
  auto it = s.find(op);
  if (it == s.end()) return {};
  std::vector<OpCase> out = std::move(it->second);
  s.erase(it);
  return out;
}

void check_all_taken(const Samples& s, const std::string& family) {
  if (!s.empty()) fail(family + ": samples of op '" + s.begin()->first + "' have no record");
}

std::vector<ErrorInput> joined(std::initializer_list<std::vector<ErrorInput>> lists) {
  std::vector<ErrorInput> out;
  for (const auto& l : lists) out.insert(out.end(), l.begin(), l.end());
  return out;
}

ErrorInput freed_graph_error(const std::string& op, Shape in_shape,
                             std::function<Tensor(const Tensor&)> forward) {
  return {"a second backward through the gradient's graph, freed by the first",
          [in_shape, forward] {
            Generator g(3);
            Tensor z = case_input(in_shape, DType::f64, g);
            Tensor y = forward(z);
            Tensor v = case_input(y.shape(), DType::f64, g);
            Tensor dz = autograd::grad({y}, {z}, {v}, {.create_graph = true})[0];
            Tensor first = sum(dz), second = sum(dz);
            first.backward();
            second.backward();
          },
          "autograd: the tape entry of '" + op + "' was already freed by an earlier backward()"};
}

void register_op_cases() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_autograd_cases();
    register_attention_cases();
    register_dropout_cases();
    register_elementwise_cases();
    register_heads_cases();
    register_loss_cases();
    register_matmul_cases();
    register_norm_cases();
    register_reduce_cases();
    register_rope_cases();
    register_shape_cases();
    register_softmax_cases();
  });
}

}  // namespace graft
