/// @file
/// Internal: each ops/ family file defines its register_<family>_cases(), and
/// register_op_cases() (graft/testing/op_cases.h, the one public entry, idempotent) calls each
/// exactly once.
#pragma once

#include "graft/testing/op_cases.h"

namespace graft {

/// Registers the gradcheck cases of one ops/ family file; only register_op_cases() calls them.
///@{
void register_attention_cases();
void register_dropout_cases();
void register_elementwise_cases();
void register_heads_cases();
void register_loss_cases();
void register_matmul_cases();
void register_norm_cases();
void register_reduce_cases();
void register_rope_cases();
void register_shape_cases();
void register_softmax_cases();
///@}

}  // namespace graft
