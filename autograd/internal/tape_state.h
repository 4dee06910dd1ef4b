/// @file
/// The tape's own state, shared by the files of autograd/ (tape.cpp records and runs backward;
/// graph.cpp draws what was recorded). Internal: never installed, included by no public header.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "graft/autograd/tape.h"

namespace graft::autograd {

/// Reads and writes a TensorImpl's place on a tape (its private TapeLink).
struct TapeAccess {
  static TapeLink& link(TensorImpl* t) { return t->tape_; }
  static const TapeLink& link(const TensorImpl* t) { return t->tape_; }
};

namespace detail {

/// Where a gradient for one input goes: the producing entry (non-leaf) or the leaf itself.
struct Route {
  int64_t index = -1;  ///< producing entry, or -1
  int slot = 0;
  std::shared_ptr<TensorImpl> leaf;  ///< set for leaves that require grad
  Shape shape;
  DType dtype = DType::f32;
  bool needs = false;
};

/// One recorded op.
struct Entry {
  const char* op = "";
  std::string path;  ///< the module path it was recorded under (anomaly mode or KeepModulePaths)
  std::vector<Route> inputs;
  std::vector<Shape> out_shapes;
  std::vector<DType> out_dtypes;
  Tensors saved;
  std::vector<uint64_t> saved_versions;
  std::vector<std::shared_ptr<Storage>> kept;
  /// The storages the kept buffers were made from, and their versions then (checked like saved).
  std::vector<std::pair<std::weak_ptr<Storage>, uint64_t>> kept_sources;
  bool marked = false;  ///< the storages of `saved` count this entry in Storage::saved_by_tape
  BackwardFn fn;
  /// retained[k]: output k asked for its gradient (Tensor::retain_grad()); empty when none did,
  /// so an entry whose outputs did not ask pays one empty() test in backward.
  std::vector<std::weak_ptr<TensorImpl>> retained;
  bool freed = false;
  int order = 1;  ///< 1 + the order of the backward that recorded it (1: recorded by a forward)
  bool double_backward = true;  ///< its op's backward is differentiable (declare_op())
  /// Why a backward under create_graph would be wrong: a saved tensor is an untracked copy or
  /// view of an input that requires grad (see untracked_saved() in tape.cpp); empty when none.
  std::string untracked_saved;
};

/// Tape ids start at 1 (0 in a TapeLink means "never recorded") and are never reused, so a
/// tensor recorded on a thread that has exited is still told apart from this thread's.
uint64_t next_tape_id();

void mark_saved(Entry& e, bool on);

/// A thread's tape.
struct Tape {
  const uint64_t id = next_tape_id();
  std::deque<Entry> entries;  ///< a deque: a backward under create_graph appends while one runs
  uint64_t epoch = 1;
  size_t live = 0;
  /// A thread that ends with entries on its tape leaves no storage counted as saved.
  ~Tape() {
    for (auto& e : entries) mark_saved(e, false);
  }
};

/// This thread's tape.
Tape& this_tape();

/// The number of live KeepModulePaths objects on this thread.
int& keep_paths_count();

/// Fails unless t's producing entry (if any) is on this thread's tape: `what` names the caller
/// and the tensor, such as "backward: the root".
void check_this_thread(const TensorImpl* t, const std::string& what);

/// Whether t was produced by an entry of an earlier epoch (the tape was cleared since).
bool from_old_epoch(const TensorImpl* t);

}  // namespace detail
}  // namespace graft::autograd
