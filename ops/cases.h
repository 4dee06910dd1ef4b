/// @file
/// The gradcheck cases of the library's ops, registered by explicit calls (no static
/// initialisers, so the ops library works static or shared): each family file defines its
/// register_<family>_cases(), register_op_cases() calls them all once. tests/test_gradcheck_all
/// calls it and then checks every registered case.
#pragma once

namespace graft {

/// Registers the gradcheck cases of every op family (the functions below); idempotent and
/// thread-safe.
void register_op_cases();

/// Registers the gradcheck cases of one ops/ family file; register_op_cases() calls each once.
/// @throws graft::Error when the family's cases are already registered (duplicate names).
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
