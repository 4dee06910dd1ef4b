// Module: a tree of named parameters and child modules, with a train/eval flag.
// Parameter names are hierarchical ("encoder.layers.0.self_attn.in_proj_weight"), as in
// PyTorch's state_dict, so checkpoints can move between the two frameworks.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "graft/autograd/tape.h"
#include "graft/autograd/tensor.h"

namespace graft::nn {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Every parameter once (a tensor shared by two modules, e.g. tied embeddings, is listed
  // under its first name), in registration order.
  NamedTensors named_parameters() const;
  Tensors parameters() const;
  // Non-trainable state (e.g. the sinusoidal table); not saved.
  NamedTensors named_buffers() const;
  int64_t num_parameters() const;
  void zero_grad();
  // The parameters by name (what a checkpoint holds), and loading them back: every name, shape
  // and dtype must match exactly (missing, unexpected, reshaped or retyped tensors are errors
  // naming the tensor); values are copied only after everything was checked.
  NamedTensors state_dict() const { return named_parameters(); }
  void load_state_dict(const NamedTensors& tensors);

  void train(bool on = true);
  void eval() { train(false); }
  bool training() const { return training_; }

  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const {
    return children_;
  }
  // register_module for code outside the class (a stack registering a shared part).
  template <class M>
  std::shared_ptr<M> add_module(const std::string& name, std::shared_ptr<M> m) {
    return register_module(name, m);
  }

 protected:
  Tensor& register_parameter(const std::string& name, Tensor t);
  Tensor& register_buffer(const std::string& name, Tensor t);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    children_.emplace_back(name, m);
    if (m && m->scope_name_.empty()) m->scope_name_ = name;  // a shared part keeps its first name
    return m;
  }
  // Pushes this module's name (as registered in its parent) for the ops its forward records, so
  // anomaly errors name the module path; free while anomaly mode is off. Forwards start with
  //   const auto s = scope();
  autograd::NameScope scope() const { return autograd::NameScope(scope_name_); }

 private:
  void collect(const std::string& prefix, NamedTensors& out, bool buffers,
               std::vector<const TensorImpl*>& seen) const;
  std::vector<std::pair<std::string, Tensor>> params_, buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::string scope_name_;
  bool training_ = true;
};

// Puts a module in eval mode for a scope and restores its train/eval flag afterwards.
class EvalScope {
 public:
  explicit EvalScope(Module& m) : m_(m), was_(m.training()) { m.eval(); }
  ~EvalScope() { m_.train(was_); }
  EvalScope(const EvalScope&) = delete;
  EvalScope& operator=(const EvalScope&) = delete;

 private:
  Module& m_;
  bool was_;
};

// Initialisers (in place, no tape), drawing from the given generator.
void xavier_uniform_(const Tensor& w, Generator& gen, double gain = 1.0);
void uniform_(const Tensor& w, double lo, double hi, Generator& gen);
void normal_(const Tensor& w, double mean, double std, Generator& gen);

}  // namespace graft::nn
