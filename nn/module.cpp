#include "graft/nn/module.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "graft/autograd/tape.h"

namespace graft::nn {

Tensor& Module::register_parameter(const std::string& name, Tensor t) {
  if (t.defined() && !t.requires_grad()) t.requires_grad_();
  params_.emplace_back(name, std::move(t));
  return params_.back().second;
}

Tensor& Module::register_buffer(const std::string& name, Tensor t) {
  buffers_.emplace_back(name, std::move(t));
  return buffers_.back().second;
}

void Module::collect(const std::string& prefix, NamedTensors& out, bool buffers,
                     std::vector<const TensorImpl*>& seen) const {
  for (auto& [n, t] : buffers ? buffers_ : params_) {
    if (!t.defined()) continue;
    if (std::find(seen.begin(), seen.end(), t.impl()) != seen.end()) continue;
    seen.push_back(t.impl());
    out.emplace_back(prefix + n, t);
  }
  for (auto& [n, c] : children_) c->collect(prefix + n + ".", out, buffers, seen);
}

NamedTensors Module::named_parameters() const {
  NamedTensors out;
  std::vector<const TensorImpl*> seen;
  collect("", out, false, seen);
  return out;
}

NamedTensors Module::named_buffers() const {
  NamedTensors out;
  std::vector<const TensorImpl*> seen;
  collect("", out, true, seen);
  return out;
}

Tensors Module::parameters() const {
  Tensors out;
  for (auto& [n, t] : named_parameters()) out.push_back(t);
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (auto& [name, t] : named_parameters()) n += t.numel();
  return n;
}

void Module::zero_grad() {
  for (auto& t : parameters()) t.zero_grad();
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, c] : children_) c->train(on);
}

namespace {
// Points t's own state at `c`'s memory and dtype, so every handle on t (a tied weight, a layer's
// member) sees the change; a gradient follows into the new dtype, as PyTorch converts .grad.
void take_memory(const Tensor& t, const Tensor& c) {
  TensorImpl& s = *t.impl();
  const DType from = s.dtype;
  s.storage = c.impl()->storage;
  s.offset = c.offset();
  s.strides = c.strides();
  s.dtype = c.dtype();
  if (s.grad && from != c.dtype()) s.grad = cast_copy(Tensor(s.grad), c.dtype()).impl_ptr();
}

// The whole of t's storage as a flat tensor of t's dtype.
Tensor whole_storage(const Tensor& t) {
  const int64_t n = (int64_t)(t.impl()->storage->nbytes / dtype_size(t.dtype()));
  return Tensor::view_of(t, {n}, {1}, 0);
}

// t's whole storage converted to dt; a failure (a parameter never given memory) names t's path.
Tensor converted_storage(const std::string& name, const Tensor& t, DType dt) {
  try {
    return cast_copy(whole_storage(t), dt);
  } catch (const Error& e) {
    fail("Module::to(" + std::string(dtype_name(dt)) + "): '" + name + "': " + e.what());
  }
}

// Converts floating leaves to `dt` in place of their state (rounding to nearest even into bf16
// and f16); integer tensors stay as they are. Tensors sharing a storage are converted together:
// the storage once (whole: a view keeps its offset and strides in it), so they share the new one.
void convert_in_place(const NamedTensors& tensors, DType dt) {
  std::map<const Storage*, Tensor> converted;  // old storage -> its whole converted copy
  for (const auto& [name, t] : tensors) {
    if (!is_floating(t.dtype()) || t.dtype() == dt) continue;
    const Storage* from = t.impl()->storage.get();
    auto it = converted.find(from);
    if (it == converted.end()) it = converted.emplace(from, converted_storage(name, t, dt)).first;
    take_memory(t, Tensor::view_of(it->second, t.shape(), t.strides(), t.offset()));
  }
}
}  // namespace

Module& Module::to(DType dt) {
  if (!is_floating(dt))
    fail(std::string("Module::to: a module converts to a float dtype (float32, float64, bfloat16 "
                     "or float16), not ") +
         dtype_name(dt));
  autograd::NoGrad ng;
  NamedTensors all = named_parameters();
  for (auto& nt : named_buffers()) all.push_back(nt);
  convert_in_place(all, dt);
  return *this;
}

void HookHandle::remove() {
  if (state_) state_->removed = true;
}
bool HookHandle::active() const { return state_ && !state_->removed; }

// A module reachable twice (registered under two parents) gets the hook once, under its first path.
void Module::add_hook(const std::string& path, const Hook& h) {
  std::erase_if(hooks_, [](const Hook& k) { return k.state->removed; });
  for (const Hook& k : hooks_)
    if (k.state == h.state) return;
  hooks_.push_back({path, h.fn, h.state});
  for (auto& [n, c] : children_) c->add_hook(path.empty() ? n : path + "." + n, h);
}

HookHandle Module::register_forward_hook(ForwardHook hook) {
  if (!hook) fail("register_forward_hook: the hook is an empty function");
  const Hook h{"", std::make_shared<const ForwardHook>(std::move(hook)),
               std::make_shared<HookHandle::State>()};
  add_hook("", h);
  return HookHandle(h.state);
}

Tensor Module::hooked(Tensor output) const {
  if (hooks_.empty()) [[likely]]
    return output;
  for (const Hook& h : hooks_) {
    if (h.state->removed) continue;
    Tensor r = (*h.fn)(h.path, *this, output);
    if (r.defined()) output = std::move(r);
  }
  return output;
}

namespace {
thread_local bool t_skip_init = false;
thread_local SkipInit::Memory t_memory = SkipInit::Memory::uninitialised;
thread_local int64_t t_initialised = 0;

// A tensor of `shape` and `dt` whose storage holds no bytes (released before it ever had any):
// reading it fails with the reason until adopt_state_dict() or set_weight_int8() gives it values.
Tensor without_memory(const Shape& shape, DType dt) {
  auto storage = std::make_shared<Storage>(0);
  storage->release(
      "a parameter " + shape_str(shape) +
      " of a model built without memory (nn::SkipInit(Memory::none)) that was never given its "
      "values (adopt_state_dict, set_weight_int8)");
  storage->nbytes = (size_t)shape_numel(shape) * dtype_size(dt);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->dtype = dt;
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  return Tensor(impl);
}
}  // namespace

SkipInit::SkipInit(Memory memory) : was_(t_skip_init), was_memory_(t_memory) {
  t_skip_init = true;
  t_memory = memory;
}
SkipInit::~SkipInit() {
  t_skip_init = was_;
  t_memory = was_memory_;
}
bool SkipInit::active() { return t_skip_init; }

Tensor new_parameter(const Shape& shape, DType dt, const std::function<Tensor()>& init) {
  if (t_skip_init)
    return t_memory == SkipInit::Memory::none ? without_memory(shape, dt)
                                              : Tensor::empty(shape, dt);
  ++t_initialised;
  return init();
}

int64_t initialised_parameters() { return t_initialised; }

void uniform_(const Tensor& w, double lo, double hi, Generator& gen) {
  if (t_skip_init) return;
  copy_into(w, rand(w.shape(), w.dtype(), gen, lo, hi));
}

void normal_(const Tensor& w, double mean, double std, Generator& gen) {
  if (t_skip_init) return;
  copy_into(w, randn(w.shape(), w.dtype(), gen, mean, std));
}

void xavier_uniform_(const Tensor& w, Generator& gen, double gain) {
  if (w.dim() < 2) fail("xavier_uniform_: needs rank >= 2, got " + describe(w));
  if (t_skip_init) return;
  int64_t receptive = 1;
  for (int64_t i = 2; i < w.dim(); ++i) receptive *= w.shape()[i];
  const double fan_in = (double)w.shape()[1] * receptive,
               fan_out = (double)w.shape()[0] * receptive;
  const double a = gain * std::sqrt(6.0 / (fan_in + fan_out));
  uniform_(w, -a, a, gen);
}

// Each parameter with the tensor given for it, after checking that the names and shapes match
// exactly and the dtypes are both float (converted on load) or the same.
std::vector<std::pair<Tensor, const Tensor*>> Module::checked_sources(
    const NamedTensors& tensors) const {
  const NamedTensors params = named_parameters();
  std::map<std::string, const Tensor*> given;  // by name: a file of 10^5 tensors stays fast
  for (auto& [name, t] : tensors) {
    check_defined(t, "load_state_dict", ("tensor '" + name + "'").c_str());
    if (!given.emplace(name, &t).second) fail("load_state_dict: tensor '" + name + "' given twice");
  }
  std::vector<std::pair<Tensor, const Tensor*>> out;
  for (auto& [name, p] : params) {
    auto it = given.find(name);
    if (it == given.end()) fail("load_state_dict: missing tensor '" + name + "'");
    const Tensor& t = *it->second;
    if (t.shape() != p.shape())
      fail("load_state_dict: tensor '" + name + "' is " + describe(t) + " but the model expects " +
           describe(p));
    if (t.dtype() != p.dtype() && !(is_floating(t.dtype()) && is_floating(p.dtype())))
      fail("load_state_dict: tensor '" + name + "' is " + describe(t) + " but the model expects " +
           describe(p) + " (only float dtypes convert into each other on load)");
    out.emplace_back(p, &t);
  }
  if (given.size() != params.size()) {
    for (auto& [name, t] : params) given.erase(name);
    fail("load_state_dict: unexpected tensor '" + given.begin()->first + "'");
  }
  return out;
}

void Module::load_state_dict(const NamedTensors& tensors) {
  const auto sources = checked_sources(tensors);
  autograd::NoGrad ng;
  for (auto& [p, t] : sources) copy_into(p, *t);  // converts into the parameter's dtype
}

void Module::adopt_state_dict(const NamedTensors& tensors) {
  const auto sources = checked_sources(tensors);
  autograd::NoGrad ng;
  // The parameter takes the given tensor's memory and dtype (a contiguous copy of a strided one).
  for (auto& [p, t] : sources) take_memory(p, t->is_contiguous() ? *t : contiguous_copy(*t));
}

}  // namespace graft::nn
