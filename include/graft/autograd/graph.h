/// @file
/// A picture of the recorded graph: the tape entries behind a tensor as Graphviz DOT.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "graft/autograd/tensor.h"

namespace graft::autograd {

/// While one is alive, every op recorded on this thread keeps the module path it ran under (the
/// names Module::scope() pushes, joined with '.'), so graph_dot() can group its nodes by module.
/// Anomaly mode keeps the paths too. Nests; per thread, like the tape.
class KeepModulePaths {
 public:
  KeepModulePaths();
  ~KeepModulePaths();
  KeepModulePaths(const KeepModulePaths&) = delete;
  KeepModulePaths& operator=(const KeepModulePaths&) = delete;
};

/// The graph recorded behind `t` as Graphviz DOT (`dot -Tsvg` renders it): one box per tape
/// entry that `t` depends on (its op name, and the dtype and shape of each output), grouped into
/// nested clusters by the module path it was recorded under (when a KeepModulePaths was alive),
/// one ellipse per leaf that requires grad, named from `leaf_names` (such as a module's
/// named_parameters()) or "leaf" otherwise, and an edge from each input to its op.
/// Entries already run by backward() are drawn as well; the graph of a tensor that no op
/// recorded is its leaf alone.
/// @throws graft::Error when `t` is undefined, was recorded on another thread's tape, or its
///         entry belongs to a tape cleared since.
std::string graph_dot(const Tensor& t,
                      const std::vector<std::pair<std::string, Tensor>>& leaf_names = {});

}  // namespace graft::autograd
