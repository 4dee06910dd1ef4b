/// @file
/// Module: a tree of named parameters and child modules, with a train/eval flag.
/// Parameter names are hierarchical ("encoder.layers.0.self_attn.in_proj_weight"), as in
/// PyTorch's state_dict, so checkpoints can move between the two frameworks.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "graft/autograd/tape.h"
#include "graft/autograd/tensor.h"

/// The modules (nn/, library graft_nn): Module, layers, attention, positional encodings, the
/// encoder and decoder stacks. Training is graft::train (nn/train/), the tokenizers graft::text.
namespace graft::nn {

/// Tensors by name, in order: parameters, buffers, a state_dict.
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Module;
/// A forward hook (Module::register_forward_hook()): called with the module's path, the module
/// and its output once its forward() has computed it; returns a tensor to use instead of the
/// output, or an undefined Tensor to keep it.
using ForwardHook =
    std::function<Tensor(const std::string& path, const Module& module, const Tensor& output)>;

/// What register_forward_hook() returns: remove() takes the hook off every module it was put on.
/// Copies share the hook; dropping the handle leaves the hook in place (as in PyTorch).
class HookHandle {
 public:
  HookHandle() = default;
  /// Stops the hook (from this call on it is never called again); removing twice is harmless.
  void remove();
  /// Whether the hook is still in place (false after remove(), and for a default handle).
  bool active() const;

 private:
  friend class Module;
  struct State {
    bool removed = false;
  };
  explicit HookHandle(std::shared_ptr<State> s) : state_(std::move(s)) {}
  std::shared_ptr<State> state_;
};

/// The base of every layer and model: a tree of named parameters, buffers and child modules,
/// with a train/eval flag. A subclass registers its parts in its constructor
/// (register_parameter(), register_buffer(), register_module()) and gives its own forward().
class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  /// Every parameter once (a tensor shared by two modules, such as tied embeddings, is listed
  /// under its first name), in registration order, with its dotted path as the name.
  NamedTensors named_parameters() const;
  /// The tensors of named_parameters(), for an optimizer or gradient clipping.
  Tensors parameters() const;
  /// Non-trainable state (such as the sinusoidal table); not saved.
  NamedTensors named_buffers() const;
  /// Total number of parameter elements (each shared tensor counted once).
  int64_t num_parameters() const;
  /// Drops the accumulated gradient of every parameter.
  void zero_grad();
  /// The parameters by name (what a checkpoint holds); see load_state_dict().
  NamedTensors state_dict() const { return named_parameters(); }
  /// Loads parameters by name, as torch.nn.Module.load_state_dict: every name and shape must
  /// match exactly (missing, unexpected or reshaped tensors are errors naming the tensor); a
  /// float tensor of another float dtype is converted into the parameter's dtype (a BF16 file
  /// into a float32 model is widened exactly; an F32 file into a bf16 model rounds to nearest
  /// even), and an integer tensor (int64, int8) for a float parameter is refused. Values are
  /// copied only after everything was checked; the parameters keep their dtype and memory.
  /// @throws graft::Error "load_state_dict: ..." for a tensor given twice, undefined, missing,
  ///         unexpected, of another shape than the model's, or an integer one for a float
  ///         parameter.
  void load_state_dict(const NamedTensors& tensors);
  /// load_state_dict() without the copy, for a model built under SkipInit: each parameter takes
  /// the given tensor's memory and dtype where that tensor is contiguous (its values are not
  /// copied), and a contiguous copy of it otherwise. So a parameter keeps the dtype it has in the
  /// file: a BF16 checkpoint adopted into a model built in float32 gives a bf16 model, and no
  /// float32 copy is ever made (an accumulated gradient is converted along). The parameter then
  /// shares its memory with the given tensor (and with every other view of it): pass tensors
  /// nothing else writes, such as a file's just loaded. Checked exactly as load_state_dict(),
  /// everything before anything is taken.
  /// @throws graft::Error "load_state_dict: ..." as load_state_dict().
  void adopt_state_dict(const NamedTensors& tensors);

  /// Sets training mode (dropout active) on this module and every descendant; false = eval().
  void train(bool on = true);
  /// Evaluation mode (dropout off) for this module and every descendant: train(false).
  void eval() { train(false); }
  /// Whether this module is in training mode (the default).
  bool training() const { return training_; }

  /// Converts every floating parameter and buffer of this module and its descendants to `dt`
  /// (any direction among float32, float64, bfloat16 and float16; into bf16 and f16 rounding to
  /// nearest even, NaN and infinities kept, float16 overflow to infinity), in place: the tensors
  /// keep their identity (every handle a layer holds sees the new dtype), parameters still
  /// require grad, so the module trains and runs as before at the new precision. An accumulated
  /// gradient is converted with its parameter, as PyTorch's .grad is. Integer buffers (int64,
  /// int8) stay as they are. Make optimizers after it (their state has the old dtype). As
  /// torch.nn.Module.to(dtype); returns *this. Tensors that share a storage (a weight tied to
  /// another parameter or buffer, views of one tensor) still share one after: their storage is
  /// converted once and each keeps its place in it.
  /// @throws graft::Error "Module::to: ..." when `dt` is not a float dtype (int64, int8).
  Module& to(DType dt);

  /// Registers `hook` on this module and on every module below it (those registered by now):
  /// after each of their forwards, `hook(path, module, output)` runs, and a defined tensor it
  /// returns replaces the output. `path` is the module's dotted name below this one, as in
  /// named_parameters() ("encoder.layers.0.linear2"; "" for this module itself). Hooks run in
  /// the order they were registered. These forwards call them on what they return: Linear,
  /// Embedding, LayerNorm (forward_add too), Dropout, Sinusoidal/LearnedPositionalEncoding,
  /// MultiHeadAttention, EncoderLayer, DecoderLayer, Encoder and Decoder, cached decoding steps
  /// included (a transformer layer's FFN output is its "linear2" output). A module whose
  /// forward does not call hooked() never runs them. As torch.nn.Module.register_forward_hook,
  /// on a whole subtree.
  /// @throws graft::Error when `hook` is an empty function.
  HookHandle register_forward_hook(ForwardHook hook);

  /// The direct children with the names they were registered under, in order.
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const {
    return children_;
  }
  /// register_module for code outside the class (a stack registering a shared part).
  /// Returns `m`.
  template <class M>
  std::shared_ptr<M> add_module(const std::string& name, std::shared_ptr<M> m) {
    return register_module(name, m);
  }

 protected:
  /// Registers a parameter (marking it as requiring grad) under `name`; returns a reference to
  /// the stored handle. An undefined tensor is kept but listed nowhere.
  Tensor& register_parameter(const std::string& name, Tensor t);
  /// Registers a buffer: non-trainable state, listed by named_buffers(), not saved.
  Tensor& register_buffer(const std::string& name, Tensor t);
  /// Registers a child module under `name` (its parameters become "name.<param>"); returns `m`.
  /// A module registered under two parents keeps its first name in anomaly paths.
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    children_.emplace_back(name, m);
    if (m && m->scope_name_.empty()) m->scope_name_ = name;  // a shared part keeps its first name
    return m;
  }
  /// Pushes this module's name (as registered in its parent) for the ops its forward records, so
  /// anomaly errors name the module path; free while anomaly mode is off. Forwards start with
  /// `const auto s = scope();`.
  autograd::NameScope scope() const { return autograd::NameScope(scope_name_); }
  /// Runs the forward hooks on this module's `output` (see register_forward_hook()) and returns
  /// the output to use; one empty() test when there are none. Forwards end with
  /// `return hooked(out);`.
  Tensor hooked(Tensor output) const;

 private:
  std::vector<std::pair<Tensor, const Tensor*>> checked_sources(const NamedTensors& tensors) const;
  void collect(const std::string& prefix, NamedTensors& out, bool buffers,
               std::vector<const TensorImpl*>& seen) const;
  std::vector<std::pair<std::string, Tensor>> params_, buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::string scope_name_;
  bool training_ = true;
  struct Hook {
    std::string path;
    std::shared_ptr<const ForwardHook> fn;
    std::shared_ptr<HookHandle::State> state;
  };
  void add_hook(const std::string& path, const Hook& h);
  std::vector<Hook> hooks_;
};

/// Puts a module in eval mode for a scope and restores its train/eval flag afterwards.
class EvalScope {
 public:
  /// Puts `m` (and its descendants) in eval mode.
  explicit EvalScope(Module& m) : m_(m), was_(m.training()) { m.eval(); }
  /// Restores the flag `m` had before.
  ~EvalScope() { m_.train(was_); }
  EvalScope(const EvalScope&) = delete;
  EvalScope& operator=(const EvalScope&) = delete;

 private:
  Module& m_;
  bool was_;
};

/// While one is alive on a thread, the modules built on that thread leave their parameters
/// uninitialised: new_parameter() allocates them (Tensor::empty) without drawing or filling
/// them, and xavier_uniform_(), uniform_() and normal_() leave their tensor as it is. For a model
/// whose every parameter is loaded right after (adopt_state_dict(), load_state_dict(), which
/// refuse a missing one): building it then costs no random draws and no pass over the weights,
/// and its generators are not advanced. Buffers (the sinusoidal table) are computed as always,
/// since no checkpoint holds them. Scopes nest; each restores the state it found.
/// With Memory::none the parameters get no memory at all: each is a tensor of its shape and dtype
/// whose values do not exist (any read fails naming why), until adopt_state_dict() gives it a
/// tensor's memory or set_weight_int8() its int8 form; loading a 16-bit or int8 file then never
/// allocates the float32 model (models/run.h, load_run_model with a precision).
class SkipInit {
 public:
  /// What the parameters built under it hold.
  enum class Memory {
    uninitialised,  ///< memory of their size, not filled (Tensor::empty)
    none,           ///< no memory: to be given by adopt_state_dict() or set_weight_int8()
  };
  /// Skips initialisation on this thread until destroyed.
  explicit SkipInit(Memory memory = Memory::uninitialised);
  /// Restores the state the constructor found.
  ~SkipInit();
  SkipInit(const SkipInit&) = delete;
  SkipInit& operator=(const SkipInit&) = delete;
  /// Whether a SkipInit is alive on this thread.
  static bool active();

 private:
  bool was_;
  Memory was_memory_;
};

/// A new parameter of `shape` and `dt`: what `init` returns (a fresh tensor of that shape and
/// dtype), or uninitialised memory while a SkipInit is alive (no memory at all under
/// SkipInit(SkipInit::Memory::none)), in which case `init` is not called.
/// Every layer constructor makes its parameters through it.
Tensor new_parameter(const Shape& shape, DType dt, const std::function<Tensor()>& init);

/// How many parameters new_parameter() has initialised (called `init` for) on this thread so
/// far: a test of a loader checks that it initialises none.
int64_t initialised_parameters();

// Initialisers (in place, no tape), drawing from the given generator; no-ops under SkipInit.
/// Xavier/Glorot uniform init, in place, no tape: U(-a, a) with
/// a = gain * sqrt(6 / (fan_in + fan_out)), as torch.nn.init.xavier_uniform_.
/// @throws graft::Error when w has fewer than 2 dims.
void xavier_uniform_(const Tensor& w, Generator& gen, double gain = 1.0);
/// Fills w with U(lo, hi) drawn from gen, in place, no tape.
void uniform_(const Tensor& w, double lo, double hi, Generator& gen);
/// Fills w with N(mean, std^2) drawn from gen, in place, no tape.
void normal_(const Tensor& w, double mean, double std, Generator& gen);

}  // namespace graft::nn
