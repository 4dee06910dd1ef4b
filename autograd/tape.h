// The tape: when grad mode is on and an input requires grad, each differentiable op appends
// one entry (its inputs' routes, the tensors its backward needs, and the backward function) to
// the calling thread's tape. backward() walks the tape in reverse, hands each entry the
// gradients of its outputs, and routes the returned input gradients either to the entry that
// produced that input or, for a leaf, into its .grad.
//
// Writing an op (see README "Adding an op"):
//   Tensor out = ...forward...;
//   if (autograd::needs_record({a, b}))
//     autograd::record("mul", {a, b}, {out}, /*saved=*/{a, b},
//       [](const autograd::Ctx& c, const Tensors& dout) -> Tensors {
//         return {dout[0] * c.saved[1], dout[0] * c.saved[0]};   // one per input
//       });
// Capture tensors through `saved` (not in the lambda) so in-place changes are detected.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "graft/autograd/tensor.h"

namespace graft::autograd {

bool grad_enabled();
void set_grad_enabled(bool on);

// Inside a NoGrad scope no op records anything (inference, optimizer updates).
class NoGrad {
 public:
  NoGrad() : prev_(grad_enabled()) { set_grad_enabled(false); }
  ~NoGrad() { set_grad_enabled(prev_); }
  NoGrad(const NoGrad&) = delete;
  NoGrad& operator=(const NoGrad&) = delete;

 private:
  bool prev_;
};

// Anomaly mode: while on, every op that records checks its inputs and outputs, and every
// backward its input gradients, for NaN/Inf, and the first offender throws an error naming the
// op, forward or backward, the shape and the module path it was recorded under, e.g.
//   anomaly: backward of 'sqrt' (f32 (8, 16)) in decoder.layers.1.linear1 produced Inf
// Off by default (it reads every tensor once more); GRAFT_DETECT_ANOMALY=1 in the environment
// turns it on for a whole program. Per thread, like the tape.
bool anomaly_mode();
void set_anomaly_mode(bool on);
class AnomalyMode {
 public:
  explicit AnomalyMode(bool on = true) : prev_(anomaly_mode()) { set_anomaly_mode(on); }
  ~AnomalyMode() { set_anomaly_mode(prev_); }
  AnomalyMode(const AnomalyMode&) = delete;
  AnomalyMode& operator=(const AnomalyMode&) = delete;

 private:
  bool prev_;
};

// A module's name pushed for the ops it records (Module::scope()); the pushed names, joined
// with '.', are the path anomaly errors name. Does nothing while anomaly mode is off, so
// module code pays one flag test per forward.
class NameScope {
 public:
  explicit NameScope(const std::string& name);
  ~NameScope();
  NameScope(const NameScope&) = delete;
  NameScope& operator=(const NameScope&) = delete;

 private:
  bool pushed_ = false;
};
std::string name_scope_path();  // "" at the top level

// "NaN", "Inf" or nullptr: the first kind of non-finite value in a floating tensor.
const char* nonfinite_kind(const Tensor& t);

struct Ctx {
  Tensors saved;            // checked against in-place modification before backward runs
  std::vector<bool> needs;  // needs[i]: input i wants a gradient (skip the work otherwise)
  bool last_use = false;    // the entry is freed after this backward (no retain_graph)
};

// True when a backward may write into its saved tensor saved[i]: this is the entry's last
// backward and nothing else (no user handle, no view, no other entry) holds that storage.
// Lets a backward hand out a gradient in the buffer of an activation it no longer needs.
bool can_overwrite(const Ctx& c, size_t i);
// Returns one gradient per input (an undefined Tensor for "none"), each of the input's dtype and
// either of its shape or of a shape it broadcasts to (the tape then sums it down to the input's
// shape, so ops never call sum_to themselves). dout has one defined contiguous gradient per
// output (zeros where no gradient arrived). A backward returns fresh gradients (or dout itself);
// the tape accumulates them, copying before it writes into a buffer it does not own.
using BackwardFn = std::function<Tensors(const Ctx&, const Tensors& dout)>;

// True when grad mode is on and some input requires grad.
bool needs_record(const Tensors& inputs);
// Appends an entry; marks the outputs as requiring grad and produced by it.
void record(const char* op, const Tensors& inputs, const Tensors& outputs, Tensors saved,
            BackwardFn fn);

void backward(const Tensor& root, const Tensor& grad, bool retain_graph);

// Number of live (not yet freed) entries on this thread's tape.
size_t tape_size();
// Frees every entry without running backward (e.g. after an evaluation that forgot NoGrad).
void clear_tape();

// Memory the live tape keeps alive through saved tensors, per op name: each storage is counted
// once, under the first entry (in tape order) that saves it. For finding what a model's
// activations cost (bench/graft_bench --what train prints it with GRAFT_TAPE_REPORT=1).
struct SavedBytes {
  std::string op;
  size_t entries = 0, bytes = 0;
};
std::vector<SavedBytes> saved_bytes_by_op();

// A rough per-op time profile of this thread, off by default. Forward: the time from the
// previous record() to this op's record() (ops that record nothing are folded into the next one
// that does); backward: each entry's backward function. For finding where a step goes
// (bench/graft_bench --what train prints it with GRAFT_PROFILE=1).
struct OpTime {
  std::string op;
  size_t calls = 0;
  double forward_s = 0, backward_s = 0;
};
void set_profiling(bool on);
std::vector<OpTime> profile_report();  // sorted by total time; also resets the counters

// Every op that records must be declared once (GRAFT_DECLARE_OP) so the gradcheck-all test
// can fail when an op has no gradcheck case.
bool declare_op(const char* name, const char* family);
struct OpDecl {
  std::string name, family;
};
const std::vector<OpDecl>& declared_ops();

}  // namespace graft::autograd

#define GRAFT_CONCAT_INNER(a, b) a##b
#define GRAFT_CONCAT(a, b) GRAFT_CONCAT_INNER(a, b)
#define GRAFT_DECLARE_OP(name, family)                          \
  [[maybe_unused]] static const bool GRAFT_CONCAT(graft_op_decl_, __COUNTER__) = \
      ::graft::autograd::declare_op(name, family)
