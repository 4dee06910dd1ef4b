/// @file
/// The tape: when grad mode is on and an input requires grad, each differentiable op appends
/// one entry (its inputs' routes, the tensors its backward needs, and the backward function) to
/// the calling thread's tape. backward() walks the tape in reverse, hands each entry the
/// gradients of its outputs, and routes the returned input gradients either to the entry that
/// produced that input or, for a leaf, into its .grad.
///
/// Writing an op (docs/ops.md, "Adding an op"; the backward is a function named
/// <tt>name_backward</tt> above it):
/// @code
///   Tensor out = ...forward...;
///   if (autograd::needs_record({a, b}))
///     autograd::record("mul", {a, b}, {out}, /*saved=*/{a, b},
///       [](const autograd::Ctx& c, const Tensors& dout) -> Tensors {
///         return {dout[0] * c.saved[1], dout[0] * c.saved[0]};   // one per input
///       });
/// @endcode
/// Capture tensors through `saved` (not in the lambda) so in-place changes are detected.
///
/// Graphs and threads: each thread records on a tape of its own, and a graph belongs to the
/// thread that recorded it. Every op output remembers its tape's id (ids are never reused, so a
/// tape whose thread has exited is still told apart). backward() and graph_dot() of a tensor
/// recorded on another thread's tape, and an op given such a tensor as an input while recording,
/// throw graft::Error "... was recorded on another thread's tape ..." instead of reading this
/// thread's tape: run the forward and backward() of one graph on one thread (while it lives; a
/// thread's tape is freed when it exits), and detach() a tensor to use its value on another.
/// Leaves (parameters) may be shared by graphs on several threads, but their .grad is
/// accumulated without locking: run those backward() calls one at a time.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "graft/autograd/tensor.h"

/// The tape, grad mode, anomaly mode, profiling and the op declarations.
namespace graft::autograd {

/// Whether ops record on this thread's tape (on by default; see NoGrad).
bool grad_enabled();
/// Turns recording on or off for this thread; prefer the NoGrad guard.
void set_grad_enabled(bool on);

/// Grad mode set for a scope: restores the previous setting when it ends, so scopes nest; per
/// thread. Use its two forms, NoGrad and EnableGrad.
class GradMode {
 public:
  /// Turns grad mode on or off for this thread.
  explicit GradMode(bool on) : prev_(grad_enabled()) { set_grad_enabled(on); }
  /// Restores the grad mode in force before.
  ~GradMode() { set_grad_enabled(prev_); }
  GradMode(const GradMode&) = delete;
  GradMode& operator=(const GradMode&) = delete;

 private:
  bool prev_;
};
/// Inside a NoGrad scope no op records anything (inference, optimizer updates).
struct NoGrad : GradMode {
  NoGrad() : GradMode(false) {}  ///< turns grad mode off for this thread
};
/// Grad mode on for a scope (torch.enable_grad), whatever it was: for a computation that must
/// record even when called under NoGrad.
struct EnableGrad : GradMode {
  EnableGrad() : GradMode(true) {}  ///< turns grad mode on for this thread
};

/// Whether anomaly mode is on for this thread.
///
/// Anomaly mode: while on, every op that records checks its inputs and outputs, and every
/// backward its input gradients, for NaN/Inf, and the first offender throws an error naming the
/// op, forward or backward, the shape and the module path it was recorded under, e.g.
/// `anomaly: backward of 'sqrt' (f32 (8, 16)) in decoder.layers.1.linear1 produced Inf`.
/// Off by default (it reads every tensor once more); GRAFT_DETECT_ANOMALY=1 in the environment
/// turns it on for a whole program. Per thread, like the tape.
bool anomaly_mode();
/// Turns anomaly mode on or off for this thread; prefer the AnomalyMode guard.
void set_anomaly_mode(bool on);
/// Anomaly mode (see anomaly_mode()) for a scope: sets it, and restores the previous setting
/// when the scope ends.
class AnomalyMode {
 public:
  /// Turns anomaly mode on (or, with false, off) for this thread.
  explicit AnomalyMode(bool on = true) : prev_(anomaly_mode()) { set_anomaly_mode(on); }
  /// Restores the setting in force before.
  ~AnomalyMode() { set_anomaly_mode(prev_); }
  AnomalyMode(const AnomalyMode&) = delete;
  AnomalyMode& operator=(const AnomalyMode&) = delete;

 private:
  bool prev_;
};

/// A module's name pushed for the ops it records (Module::scope()); the pushed names, joined
/// with '.', are the path anomaly errors and graph_dot() name. Does nothing unless anomaly mode
/// is on or a KeepModulePaths is alive, so module code pays one flag test per forward.
class NameScope {
 public:
  /// Pushes `name` (an empty name pushes nothing).
  explicit NameScope(const std::string& name);
  /// Pops what the constructor pushed.
  ~NameScope();
  NameScope(const NameScope&) = delete;
  NameScope& operator=(const NameScope&) = delete;

 private:
  bool pushed_ = false;
};
/// The names pushed on this thread, joined with '.', such as "decoder.layers.1.linear1"; "" at the
/// top level.
std::string name_scope_path();

/// "NaN", "Inf" or nullptr: the first kind of non-finite value in a floating tensor (nullptr
/// for an int64 tensor).
const char* nonfinite_kind(const Tensor& t);

/// What a backward function receives besides the output gradients.
struct Ctx {
  /// The tensors record() was given to save; checked against in-place modification before
  /// backward runs.
  Tensors saved;
  /// The private buffers record() was given to keep (KeptBuffer::buffer, in that order), such as
  /// the bfloat16 copy of an activation an op multiplies with again in backward.
  std::vector<std::shared_ptr<Storage>> kept;
  std::vector<bool> needs;  ///< needs[i]: input i wants a gradient (skip the work otherwise)
  bool last_use = false;    ///< the entry is freed after this backward (no retain_graph)
  /// The backward runs under create_graph: grad mode is on and the gradients it returns must be
  /// built from recorded ops (differentiable in dout and in the saved tensors), so they can be
  /// differentiated again. A backward whose fast path is a raw kernel takes its composed path
  /// here (see docs/autograd.md, "Higher-order gradients").
  bool create_graph = false;
  /// Which derivative this backward computes: 1 for an op recorded by a forward, 2 for an op
  /// recorded by a first backward under create_graph, and so on.
  int order = 1;
};

/// "first", "second", "third", "fourth", then "order-5" and so on: how errors name the
/// derivative a backward computes (Ctx::order), as in "second backward of 'mul'".
std::string ordinal(int order);

/// True when a backward may write into its saved tensor saved[i]: this is the entry's last
/// backward and nothing else (no user handle, no view, no other entry) holds that storage.
/// Lets a backward hand out a gradient in the buffer of an activation it no longer needs.
bool can_overwrite(const Ctx& c, size_t i);
/// An op's backward: given the Ctx and the gradients of the op's outputs (dout), the gradients
/// of its inputs.
///
/// Returns one gradient per input (an undefined Tensor for "none"), each of the input's dtype and
/// either of its shape or of a shape it broadcasts to (the tape then sums it down to the input's
/// shape, so ops never call sum_to themselves). dout has one defined contiguous gradient per
/// output (zeros where no gradient arrived). A backward returns fresh gradients (or dout itself);
/// the tape accumulates them, copying before it writes into a buffer it does not own.
using BackwardFn = std::function<Tensors(const Ctx&, const Tensors& dout)>;

/// True when grad mode is on and some input requires grad.
bool needs_record(const Tensors& inputs);
/// Appends an entry to this thread's tape; marks the outputs as requiring grad and produced by
/// it. `op` must be a string literal declared with GRAFT_DECLARE_OP; `saved` are the tensors
/// `fn` reads (their versions are remembered, see Ctx::saved).
/// @throws graft::Error when `op` was never declared, an input was recorded on another thread's
///         tape (see the file comment), or (in anomaly mode) an input or output holds NaN or Inf.
void record(const char* op, const Tensors& inputs, const Tensors& outputs, Tensors saved,
            BackwardFn fn);
/// A private buffer an op keeps for its backward in place of a saved tensor (Ctx::kept): made
/// from `source` (a bf16 copy of an input, a bit mask of an output). The tape holds the buffer,
/// frees it with the entry and counts it in saved_bytes_by_op(); it does not keep `source` alive,
/// but backward fails, as for a saved tensor, when `source` was modified in place after the op
/// ran while it lives.
struct KeptBuffer {
  std::shared_ptr<Storage> buffer;  ///< the op's own memory
  Tensor source;                    ///< what it was made from (held weakly by the tape)
};
/// record() for an op that also keeps private buffers for its backward (see KeptBuffer).
void record(const char* op, const Tensors& inputs, const Tensors& outputs, Tensors saved,
            const std::vector<KeptBuffer>& kept, BackwardFn fn);

/// Reverse-mode pass from `root`: seeds it with `grad` (ones for a one-element root when `grad`
/// is undefined), runs every entry `root` depends on in reverse, and accumulates into the .grad
/// of each leaf that requires grad. Without `retain_graph` each entry is freed once its backward
/// has run, so memory falls during the pass. With `create_graph` the backward is recorded (the
/// .grad it leaves is itself on the tape and can be differentiated again) and the graph is kept
/// (retain_graph is implied). Tensor::backward() calls it.
/// @throws graft::Error when `root` is undefined, was recorded on another thread's tape (see the
///         file comment), or does not require grad, `grad` is missing
///         for a non-scalar root or does not match its shape and dtype, a saved tensor was
///         modified in place after its op ran, an entry was already freed by an earlier
///         backward (run the forward again, or pass retain_graph), a backward returned the wrong
///         number or shape of gradients, or (in anomaly mode) a gradient holds NaN or Inf.
void backward(const Tensor& root, const Tensor& grad, bool retain_graph, bool create_graph = false);

/// Options of grad(), as torch.autograd.grad's.
struct GradOptions {
  /// Record the backward itself, so the gradients returned can be differentiated again (a
  /// Hessian-vector product, a gradient penalty); implies retain_graph.
  bool create_graph = false;
  /// Keep the graph's entries after the pass, for another backward or grad() through them.
  bool retain_graph = false;
  /// An input no gradient reaches gets an undefined tensor instead of an error.
  bool allow_unused = false;
};
/// The gradients of `outputs` with respect to `inputs` (leaves or intermediate tensors), one per
/// input, as torch.autograd.grad: each output k is seeded with grad_outputs[k] (ones for a
/// one-element output when grad_outputs is empty or holds an undefined tensor there). Only the
/// entries between the outputs and the inputs run, and no .grad is touched. With create_graph
/// the gradients are recorded on the tape (they require grad when anything they depend on
/// does), to any order.
/// @throws graft::Error for no outputs or inputs, an output or input that is undefined, does not
///         require grad or was recorded on another thread's tape, grad_outputs of the wrong count,
///         shape or dtype, an input no gradient reaches (unless allow_unused), and whatever
///         backward() throws (the errors name the op and, under create_graph or above the first
///         order, which backward: "second backward of 'mul': ...").
Tensors grad(const Tensors& outputs, const Tensors& inputs, const Tensors& grad_outputs = {},
             const GradOptions& options = {});

/// For an op author: the gradients of a fused op under create_graph, from its forward written
/// with recorded ops. Runs `forward(inputs)` (recording), then a pass from its outputs seeded with
/// `dout` that stops at `inputs` (each is an independent variable here, even when one was computed
/// from another) and records what it computes, so the result can be differentiated again. One
/// gradient per input: undefined where needs[k] is false, the input does not require grad, or
/// no gradient reaches it.
/// @code
///   if (c.create_graph)   // in the backward of an op saved as {x, w}
///     return autograd::differentiate([](const Tensors& in) { return Tensors{composed_op(in[0],
///     in[1])}; },
///                                    c.saved, dout, c.needs);
/// @endcode
/// @throws graft::Error when grad mode is off (it belongs in a backward under create_graph), the
///         forward returns a different number of outputs than dout has, and what the forward or
///         the pass throws.
Tensors differentiate(const std::function<Tensors(const Tensors&)>& forward, const Tensors& inputs,
                      const Tensors& dout, const std::vector<bool>& needs);

/// The ops the engine itself records under create_graph (family "autograd", gradchecked like any
/// op), each recorded only when grad mode is on and its input requires grad:
/// accumulate_grad(a, b) is a + b (a gradient arriving twice), reduce_grad(g, shape) sums g down
/// to `shape` (the input of a broadcasting op), expand_grad(g, shape) copies g out to the
/// contiguous `shape` it broadcasts to (reduce_grad's backward; with g's own shape, a
/// contiguous copy).
/// @throws graft::Error for undefined or non-float tensors, shapes or dtypes that differ
///         (accumulate_grad) or do not broadcast.
///@{
Tensor accumulate_grad(const Tensor& a, const Tensor& b);
Tensor reduce_grad(const Tensor& g, const Shape& shape);
Tensor expand_grad(const Tensor& g, const Shape& shape);
///@}

/// Called by backward() once a leaf's gradient is complete: every entry that routes a gradient
/// to the leaf has run (the earliest of them in tape order). Data-parallel training starts
/// summing a parameter's gradient across ranks then, while backward goes on with the rest.
/// Leaves that no entry behind the root uses are not reported.
using GradReadyHook = std::function<void(TensorImpl* leaf)>;
/// Installs a GradReadyHook for this thread's backward() calls while the scope lives (scopes
/// nest: the previous hook comes back when it ends).
class GradReadyScope {
 public:
  /// Installs `hook` (an empty function installs none).
  explicit GradReadyScope(GradReadyHook hook);
  /// Restores the hook in force before.
  ~GradReadyScope();
  GradReadyScope(const GradReadyScope&) = delete;
  GradReadyScope& operator=(const GradReadyScope&) = delete;

 private:
  GradReadyHook prev_;
};

/// Asks backward() to keep the gradient of a non-leaf `t` in its .grad (Tensor::retain_grad()):
/// each later backward() through the entry that produced `t` adds dL/dt to t.grad(), as for a
/// leaf. Nothing for a leaf that requires grad (its gradient is kept anyway).
/// @throws graft::Error "retain_grad: ..." when `t` is undefined, is a leaf that does not require
///         grad, was recorded on another thread's tape, or its entry was already freed.
void retain_grad(const Tensor& t);

/// Number of live (not yet freed) entries on this thread's tape.
size_t tape_size();
/// Frees every entry without running backward (after an evaluation that forgot NoGrad, say).
/// Tensors recorded before it can no longer be differentiated.
void clear_tape();

/// Memory the live tape keeps alive through saved tensors, for one op name (see
/// saved_bytes_by_op()).
struct SavedBytes {
  std::string op;  ///< the op name
  /// How many live entries of the op there are, and the bytes of the storages they save.
  ///@{
  size_t entries = 0, bytes = 0;
  ///@}
};
/// Memory the live tape keeps alive through saved tensors, per op name, most bytes first: each
/// storage is counted once, under the first entry (in tape order) that saves it. For finding
/// what a model's activations cost (bench/graft_bench --what train prints it with
/// GRAFT_TAPE_REPORT=1).
std::vector<SavedBytes> saved_bytes_by_op();

/// One op's line of profile_report().
///
/// A rough per-op time profile of this thread, off by default. Forward: the time from the
/// previous record() to this op's record() (ops that record nothing are folded into the next one
/// that does); backward: each entry's backward function. For finding where a step goes
/// (bench/graft_bench --what train prints it with GRAFT_PROFILE=1).
struct OpTime {
  std::string op;    ///< the op name
  size_t calls = 0;  ///< forward calls that recorded
  /// Seconds spent in the forward and in the backward of the op.
  ///@{
  double forward_s = 0, backward_s = 0;
  ///@}
};
/// Starts (or stops) the per-op profile of this thread; see OpTime.
void set_profiling(bool on);
/// The profile so far, one OpTime per op, sorted by total time; also resets the counters.
std::vector<OpTime> profile_report();

/// Declares op `name` of `family` (the ops/ file stem); always returns true, so it can
/// initialise a static (GRAFT_DECLARE_OP). Declaring a name twice is harmless.
///
/// Every op that records must be declared once (GRAFT_DECLARE_OP) so the gradcheck-all test
/// can fail when an op has no gradcheck case.
///
/// `double_backward` false declares an op whose backward is not differentiable (its gradients
/// are constants even under create_graph): differentiating them again is an error naming the op
/// ("second backward of 'x': ... declared without a double backward"), and gradgradcheck
/// expects that error instead of a check.
bool declare_op(const char* name, const char* family, bool double_backward = true);
/// One declared op.
struct OpDecl {
  /// The op name and its family.
  ///@{
  std::string name, family;
  ///@}
  bool double_backward = true;  ///< its backward can be differentiated (see declare_op())
};
/// Every op declared so far, in declaration order.
const std::vector<OpDecl>& declared_ops();

}  // namespace graft::autograd

#define GRAFT_CONCAT_INNER(a, b) a##b
#define GRAFT_CONCAT(a, b) GRAFT_CONCAT_INNER(a, b)
/// Declares an op at namespace scope in its .cpp file: `GRAFT_DECLARE_OP("mul", "elementwise");`
/// (see declare_op()); record() refuses an op that was never declared.
#define GRAFT_DECLARE_OP(name, family)                                           \
  [[maybe_unused]] static const bool GRAFT_CONCAT(graft_op_decl_, __COUNTER__) = \
      ::graft::autograd::declare_op(name, family)
/// Declares an op whose backward has no derivative of its own (see declare_op()).
#define GRAFT_DECLARE_OP_ONCE_DIFFERENTIABLE(name, family)                       \
  [[maybe_unused]] static const bool GRAFT_CONCAT(graft_op_decl_, __COUNTER__) = \
      ::graft::autograd::declare_op(name, family, false)
