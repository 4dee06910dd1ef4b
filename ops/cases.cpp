#include "ops/internal/cases.h"

#include <mutex>

namespace graft {

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
