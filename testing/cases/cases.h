/// @file
/// Internal to graft_testing: what the per-family record files (testing/cases/<family>.cpp) share.
/// Each file builds its samples into a Samples map, then declares one OpRecord per op
/// (record_<op>()) that takes that op's samples; register_op_cases() (graft/testing/op_cases.h,
/// idempotent) calls each file's register_<family>_cases() exactly once (explicit calls: no
/// static initialisers, so the libraries work static or shared).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "graft/ops/ops.h"
#include "graft/testing/op_cases.h"

namespace graft {

/// The samples of one family's ops while its records are built, by op name.
using Samples = std::map<std::string, std::vector<OpCase>>;

/// Adds `c` to the samples of op c.op.
void add_sample(Samples& s, OpCase c);
/// Removes and returns the samples of `op` (none: an empty list, which the record check reports).
std::vector<OpCase> take(Samples& s, const std::string& op);
/// Fails when a sample was built for an op that got no record.
/// @throws graft::Error "<family>: samples of op '<op>' have no record".
void check_all_taken(const Samples& s, const std::string& family);
/// The concatenation of lists of bad inputs.
std::vector<ErrorInput> joined(std::initializer_list<std::vector<ErrorInput>> lists);
/// The bad input of an op that a backward records under create_graph (such as slice_backward):
/// two sums of the gradient of `forward` at a leaf of `in_shape` (taken with create_graph, for an
/// upstream gradient that requires grad), differentiated one after the other without
/// retain_graph: the second reaches op's entry, freed by the first, an error naming it.
ErrorInput freed_graph_error(const std::string& op, Shape in_shape,
                             std::function<Tensor(const Tensor&)> forward);

/// Registers the records of one family; only register_op_cases() calls them.
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
