/// @file
/// Optimizers (SGD, Adam, AdamW) with parameter groups, the learning-rate schedules (Noam,
/// warmup then cosine decay, warmup then constant), global gradient-norm clipping and optimizer
/// checkpoints. Every update follows torch.optim's formulas:
/// @code
///   SGD    g = grad + wd*p;  buf = momentum*buf + g;  g = nesterov ? g + momentum*buf : buf
///          p -= lr*g                                         (dampening 0; no momentum: p -= lr*g)
///   Adam   g = grad + wd*p;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g
///          p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)   (t counts this param's steps)
///   AdamW  p *= 1 - lr*wd, then the Adam update with no L2 term
/// @endcode
/// lr and wd are the parameter's group's: the optimizer's lr times the group's lr_scale, and the
/// group's weight_decay (torch's param_groups).
/// Each parameter is updated in one fused pass (read p, grad and the moments once, write them
/// once) inside a single OpenMP region per step. A parameter whose grad is undefined is skipped,
/// as in PyTorch: its moments and its Adam step count t stay as they were.
///
/// State is allocated when the optimizer is built (zeros), so state_tensors() always names the
/// same tensors; for SGD's dampening-0 momentum a zero buffer gives exactly PyTorch's
/// "buf = grad on the first step".
///
/// A bf16 or f16 parameter is trained by the mixed-precision recipe: the optimizer keeps a
/// float32 master copy of it ("<param>.master" in state_tensors()) and float32 moments; step()
/// reads the 16-bit grad as float32, updates the master with exactly the float32 arithmetic of a
/// float32 parameter, and writes the parameter in place as the master rounded to nearest even.
/// So the master follows the float32 trajectory of the same gradients, while updates smaller
/// than half a 16-bit ulp, which would vanish if added to the parameter itself, accumulate.
/// The master starts as the parameter's value; when something other than the optimizer writes
/// the parameter (its version changes: load_state_dict, a broadcast, fill_), the next step
/// restarts the master from the parameter's new value, so load the model before load_state().
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "graft/autograd/tensor.h"

namespace graft::train {

/// The parameters an optimizer updates, by name (such as Module::named_parameters()).
/// Leaf float tensors (f32, f64, bf16 or f16; contiguous) with unique names.
using NamedParams = std::vector<std::pair<std::string, Tensor>>;

/// Parameters that share a weight decay and a learning-rate scale (torch's param_groups).
struct ParamGroup {
  NamedParams params;       ///< the group's parameters
  double weight_decay = 0;  ///< L2 (SGD, Adam) or decoupled (AdamW) factor of this group
  double lr_scale = 1;      ///< this group's lr is the optimizer's lr times this
};
/// An optimizer's groups; a parameter is in one group only.
using ParamGroups = std::vector<ParamGroup>;

/// Whether weight decay applies by default to a parameter of this name and number of dimensions,
/// as nanoGPT decides: matrices (dim >= 2) decay; vectors and scalars (biases, norm gains) and
/// embeddings (a name containing "embed", such as "embedding.weight") do not.
bool decays_by_default(const std::string& name, int64_t dim);

/// Splits params into two groups, in their order: group 0 those that decays_by_default() (with
/// weight_decay), group 1 the others (no decay). Either may be empty.
/// @throws graft::Error "decay_groups: weight_decay must be >= 0, got ..." for a negative or NaN
///         weight_decay.
ParamGroups decay_groups(const NamedParams& params, double weight_decay);

/// The base of SGD, Adam and AdamW: the parameters and their groups, the learning rate, the step
/// count and the exact-resume state.
class Optimizer {
 public:
  virtual ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// One update of every parameter that has a grad; runs under autograd::NoGrad and bumps the
  /// version of every tensor it writes. Increments step_count() even if no param had a grad.
  /// @throws graft::Error when a grad's shape or dtype differs from its parameter's.
  virtual void step() = 0;
  /// Drops every parameter's grad (PyTorch's set_to_none=True).
  void zero_grad();

  double lr() const { return lr_; }  ///< the learning rate of the next step
  /// Sets the learning rate of the next steps (for instance from NoamSchedule).
  /// @throws graft::Error when lr is negative or NaN.
  void set_lr(double lr);
  int64_t step_count() const { return step_count_; }  ///< steps taken so far
  /// The parameters, group after group, each group's in the order given.
  const NamedParams& params() const { return params_; }
  size_t group_count() const { return groups_.size(); }  ///< the number of parameter groups
  /// Group g's weight decay and lr scale, and the group of parameter i.
  /// @throws graft::Error for g >= group_count() or i >= params().size().
  ///@{
  double group_weight_decay(size_t g) const { return group(g).weight_decay; }
  double group_lr_scale(size_t g) const { return group(g).lr_scale; }
  size_t group_of(size_t i) const;
  ///@}
  virtual const char* name() const = 0;  ///< "SGD", "Adam", "AdamW": checked on load

  /// Exact-resume state: the optimizer's per-parameter buffers. The tensors are
  /// "<param name>.<buffer>" (float32 for a bf16 or f16 parameter, whose float32 master copy is
  /// "<param name>.master") and alias the live buffers (save them before the next step).
  virtual std::vector<std::pair<std::string, Tensor>> state_tensors() const = 0;
  /// The bytes of the optimizer's own state: the moments or momentum buffers and the float32
  /// masters of bf16 and f16 parameters (AdamW: 8 per element of a float32 parameter, 12 of a
  /// bf16 one). The parameters and their grads are not counted.
  int64_t state_bytes() const;
  /// Exact-resume state: the type, step count, lr, the hyper-parameters, the parameter names and
  /// the groups ("param_groups": each group's parameter names, weight_decay and lr_scale).
  virtual nlohmann::json state_json() const;
  /// Restores state saved by an optimizer of the same type over parameters with the same names,
  /// shapes and dtypes; the saved lr and hyper-parameters replace the current ones (as
  /// torch's load_state_dict does), the groups' weight decays and lr scales included; each
  /// parameter must be in the same group as when saved (a state without "param_groups", from
  /// before groups, is one group with its "weight_decay"). A bf16 or f16 parameter's master
  /// comes from the state, so load the parameters first: a parameter written after load_state()
  /// restarts its master from its own rounded value. Everything is validated before anything is
  /// changed, and every problem is a graft::Error starting "load_state: ".
  /// @throws graft::Error "load_state: ..." for another optimizer type, other parameter names or
  ///         groups, a missing, unexpected, reshaped or retyped tensor (a master that is missing
  ///         or not float32 of the parameter's shape included), or a missing or malformed
  ///         field.
  virtual void load_state(const std::vector<std::pair<std::string, Tensor>>& tensors,
                          const nlohmann::json& j);

 protected:
  /// Takes the parameter groups; opname ("SGD", ...) names the errors about their settings.
  /// @throws graft::Error "Optimizer: ..." when there is no parameter, a name is empty or
  ///         repeated, or a parameter is undefined, not float, not a leaf, not contiguous, or the
  ///         same tensor as an earlier one; "<opname>: ..." for a negative or NaN weight_decay or
  ///         lr_scale of a group.
  Optimizer(ParamGroups groups, const char* opname);
  /// The buffer suffixes this optimizer keeps per parameter ("exp_avg", ...), in order.
  virtual std::vector<std::string> buffer_names() const = 0;
  /// The live buffers for one suffix, one per parameter (same order as params()).
  virtual const std::vector<Tensor>& buffers(size_t which) const = 0;
  /// Reads and validates the hyper-parameters from j (throws before changing anything)...
  virtual void check_hyper(const nlohmann::json& j) const = 0;
  /// ...and applies them once everything has been validated.
  virtual void load_hyper(const nlohmann::json& j) = 0;

  /// The grads of all params as contiguous tensors (undefined where a param has none), checked
  /// against their params; `total` gets the number of elements that will be updated.
  /// @throws graft::Error "<opname>: grad of '<name>' is ... but the parameter is ..." for a
  ///         grad of another shape or dtype.
  std::vector<Tensor> grads_for_step(const char* opname, int64_t& total) const;
  /// Zeros shaped like every parameter, each of state_dtype().
  std::vector<Tensor> zeros_like_params() const;
  /// The dtype of parameter i's moments and master: float32 for a bf16 or f16 parameter, else
  /// the parameter's own.
  DType state_dtype(size_t i) const;
  /// Before an update: restarts the master of every bf16 or f16 parameter that something other
  /// than the optimizer wrote since (its version moved) from the parameter's value.
  void refresh_masters();
  /// After an update: notes every parameter's version, the one its master now matches.
  void note_param_versions();
  /// state_tensors() built from buffer_names() and buffers().
  std::vector<std::pair<std::string, Tensor>> collect_state() const;

  /// A group's settings (its parameters are those whose group_of_ is its index).
  struct GroupSettings {
    double weight_decay;  ///< as ParamGroup::weight_decay
    double lr_scale;      ///< as ParamGroup::lr_scale
  };
  /// The groups' settings saved in j, checked against this optimizer's groups (same count, each
  /// parameter in the same group); a state without "param_groups" is one group.
  /// @throws graft::Error "load_state: ..." when they differ or a field is missing or malformed.
  std::vector<GroupSettings> saved_groups(const nlohmann::json& j) const;
  /// groups_[g]; @throws graft::Error naming g and the group count when g is out of range.
  const GroupSettings& group(size_t g) const;
  NamedParams params_;                 ///< the parameters, group after group
  std::vector<GroupSettings> groups_;  ///< the groups' settings
  std::vector<size_t> group_of_;       ///< the group of each parameter
  double lr_ = 0;                      ///< the learning rate of the next step
  int64_t step_count_ = 0;             ///< steps taken so far
  /// The float32 master copy of each bf16 or f16 parameter (undefined for f32 and f64 ones).
  std::vector<Tensor> master_;
  std::vector<uint64_t> master_version_;  ///< each parameter's version its master matches
  /// each parameter's storage its master matches (Module::to gives a parameter another one)
  std::vector<std::weak_ptr<Storage>> master_storage_;

 private:
  /// The masters of the bf16 and f16 parameters, copied from them.
  void make_masters();
};

/// Stochastic gradient descent with optional momentum (dampening 0), Nesterov momentum and L2
/// weight decay, as torch.optim.SGD.
class SGD : public Optimizer {
 public:
  /// SGD over `params`; the state "<param>.momentum_buffer" exists only when momentum != 0.
  /// @throws graft::Error for a negative lr, momentum or weight_decay, nesterov without
  ///         momentum, or bad parameters (see Optimizer).
  SGD(NamedParams params, double lr, double momentum = 0, double weight_decay = 0,
      bool nesterov = false);
  /// SGD over parameter groups, each with its weight decay and lr scale.
  /// @throws graft::Error as the other constructor, and for a group's negative weight_decay or
  ///         lr_scale.
  SGD(ParamGroups groups, double lr, double momentum = 0, bool nesterov = false);
  void step() override;                                ///< one SGD update (see Optimizer::step())
  const char* name() const override { return "SGD"; }  ///< "SGD"
  /// The momentum buffers (none without momentum).
  std::vector<std::pair<std::string, Tensor>> state_tensors() const override;
  nlohmann::json state_json() const override;  ///< adds momentum and nesterov

  double momentum() const { return momentum_; }                  ///< the momentum factor (0: none)
  double weight_decay() const { return group_weight_decay(0); }  ///< group 0's L2 factor
  bool nesterov() const { return nesterov_; }                    ///< Nesterov momentum

 protected:
  std::vector<std::string> buffer_names() const override;           ///< {"momentum_buffer"} or none
  const std::vector<Tensor>& buffers(size_t which) const override;  ///< the momentum buffers
  /// Checks the saved momentum and nesterov; momentum must keep the buffers' existence (zero
  /// stays zero, non-zero stays non-zero).
  void check_hyper(const nlohmann::json& j) const override;
  void load_hyper(const nlohmann::json& j) override;  ///< applies the checked hyper-parameters

 private:
  double momentum_;
  bool nesterov_;
  std::vector<Tensor> momentum_buffer_;  // empty when momentum == 0
};

/// Adam (Kingma and Ba) with bias correction and optional L2 weight decay, as torch.optim.Adam;
/// per-parameter step counts, so a parameter without a grad does not age.
class Adam : public Optimizer {
 public:
  /// Adam over `params`; the state is "<param>.exp_avg" and "<param>.exp_avg_sq".
  /// @throws graft::Error "Adam: ..." for a negative lr, eps or weight_decay, a beta outside
  ///         [0, 1), or bad parameters (see Optimizer).
  Adam(NamedParams params, double lr = 1e-3, double beta1 = 0.9, double beta2 = 0.999,
       double eps = 1e-8, double weight_decay = 0);
  /// Adam over parameter groups, each with its L2 factor and lr scale.
  /// @throws graft::Error as the other constructor.
  Adam(ParamGroups groups, double lr, double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-8);
  void step() override;  ///< one Adam (or AdamW) update (see Optimizer::step())
  const char* name() const override { return "Adam"; }  ///< "Adam"
  /// The two moments of each parameter.
  std::vector<std::pair<std::string, Tensor>> state_tensors() const override;
  /// Optimizer::state_json() plus betas, eps and the per-parameter steps.
  nlohmann::json state_json() const override;

  double beta1() const { return beta1_; }  ///< decay of the first moment
  double beta2() const { return beta2_; }  ///< decay of the second moment
  double eps() const { return eps_; }      ///< added to the denominator
  /// Group 0's L2 (Adam) or decoupled (AdamW) factor.
  double weight_decay() const { return group_weight_decay(0); }
  /// Steps taken by parameter i (fewer than step_count() if it sometimes had no grad).
  /// @throws graft::Error when i >= params().size().
  int64_t param_step(size_t i) const;

 protected:
  /// The shared constructor: decoupled selects AdamW's decay, opname names the errors.
  Adam(ParamGroups groups, double lr, double beta1, double beta2, double eps, bool decoupled,
       const char* opname);
  std::vector<std::string> buffer_names() const override;           ///< {"exp_avg", "exp_avg_sq"}
  const std::vector<Tensor>& buffers(size_t which) const override;  ///< the first or second moments
  /// Checks the saved betas, eps and per-parameter steps.
  void check_hyper(const nlohmann::json& j) const override;
  void load_hyper(const nlohmann::json& j) override;  ///< applies the checked hyper-parameters

 private:
  double beta1_, beta2_, eps_;
  bool decoupled_;  // AdamW: decay the weights directly instead of adding wd*p to the grad
  std::vector<Tensor> exp_avg_, exp_avg_sq_;
  std::vector<int64_t> param_steps_;
};

/// AdamW (Loshchilov and Hutter): Adam with decoupled weight decay (p *= 1 - lr*wd before the
/// update), as torch.optim.AdamW.
class AdamW : public Adam {
 public:
  /// AdamW over `params`, torch's defaults (weight_decay 1e-2).
  /// @throws graft::Error "AdamW: ..." for the same bad values as Adam.
  AdamW(NamedParams params, double lr = 1e-3, double beta1 = 0.9, double beta2 = 0.999,
        double eps = 1e-8, double weight_decay = 1e-2);
  /// AdamW over parameter groups (decay_groups() gives nanoGPT's split), each with its decoupled
  /// weight decay and lr scale.
  /// @throws graft::Error as the other constructor.
  AdamW(ParamGroups groups, double lr, double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-8);
  const char* name() const override { return "AdamW"; }  ///< "AdamW"
};

/// Noam (Vaswani et al.): lr = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5),
/// rising linearly for `warmup` steps, peaking at step == warmup, then decaying as step^-0.5.
/// Steps count from 1: call opt.set_lr(noam.lr(opt.step_count() + 1)) before each opt.step().
struct NoamSchedule {
  double factor;  ///< scales the whole curve
  /// The model width and the number of warm-up steps.
  ///@{
  int64_t d_model, warmup;
  ///@}
  /// The learning rate of step `step` (from 1).
  /// @throws graft::Error unless step >= 1, d_model >= 1, warmup >= 1 and factor >= 0.
  double lr(int64_t step) const;
};

/// A learning-rate schedule: the lr of each step (from 1), one of
/// @code
///   noam      NoamSchedule{factor, d_model, warmup}
///   cosine    lr * s/warmup while s <= warmup, then
///             min_lr + (lr - min_lr) * (1 + cos(pi * (s - warmup) / (total - warmup))) / 2,
///             min_lr from step `total` on (nanoGPT's warmup and cosine decay)
///   constant  lr * min(1, s/warmup) (warmup 0: lr from the first step)
/// @endcode
/// Call opt.set_lr(schedule.lr(opt.step_count() + 1)) before each opt.step().
class Schedule {
 public:
  /// The Noam schedule (see NoamSchedule).
  /// @throws graft::Error "Schedule: ..." unless factor >= 0, d_model >= 1 and warmup >= 1.
  static Schedule noam(double factor, int64_t d_model, int64_t warmup);
  /// Linear warmup to lr over `warmup` steps, then cosine decay to min_lr at step `total`.
  /// @throws graft::Error "Schedule: ..." unless 0 <= min_lr <= lr (finite), warmup >= 0 and
  ///         total > warmup.
  static Schedule cosine(double lr, double min_lr, int64_t warmup, int64_t total);
  /// Linear warmup to lr over `warmup` steps (0: none), then lr.
  /// @throws graft::Error "Schedule: ..." unless lr >= 0 (finite) and warmup >= 0.
  static Schedule constant(double lr, int64_t warmup = 0);

  /// The learning rate of step `step` (from 1).
  /// @throws graft::Error "Schedule: step must be >= 1, got ..." for step < 1.
  double lr(int64_t step) const;
  /// "noam", "cosine" or "constant" and its numbers: what a resumed run must match.
  nlohmann::json to_json() const;

 private:
  Schedule() = default;
  std::string kind_;
  double lr_ = 0, min_lr_ = 0, factor_ = 0;
  int64_t d_model_ = 0, warmup_ = 0, total_ = 0;
};

/// Scales every grad by max_norm / (norm + 1e-6) when that is below 1 (torch's
/// clip_grad_norm_), where norm is the L2 norm over all grads together, and returns that norm.
/// Params without a grad are skipped. The norm is summed in double over fixed blocks of 4096
/// elements combined in order, so it does not depend on the thread count. bf16 and f16 grads are
/// read as float32 and scaled in float32, each product rounded once to the grad's dtype. A
/// non-finite norm is returned with the grads left untouched (torch would scale them to NaN): check
/// the result to skip the step.
/// @throws graft::Error when max_norm is negative or NaN, or a grad is not float.
double clip_grad_norm(const NamedParams& params, double max_norm);

}  // namespace graft::train
