#include "graft/nn/train/optim.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>
#include <type_traits>

#if defined(__SSE2__)
#endif

#include "graft/autograd/half.h"
#include "graft/autograd/tape.h"
#include "graft/nn/train/checkpoint.h"

namespace graft::train {

namespace {

// Below this many elements per step the fork costs more than the loop.
constexpr int64_t kParallelMin = 1 << 15;
// Block size for the gradient norm: partial sums per block, combined in block order, make the
// result independent of how the blocks are spread over threads.
constexpr int64_t kNormBlock = 4096;

std::string num_str(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// `!(v >= 0)` also rejects NaN.
void check_nonneg(const char* op, const char* what, double v) {
  if (!(v >= 0)) fail(std::string(op) + ": " + what + " must be >= 0, got " + num_str(v));
}
void check_beta(const char* op, const char* what, double v) {
  if (!(v >= 0 && v < 1))
    fail(std::string(op) + ": " + what + " must be in [0, 1), got " + num_str(v));
}

// ---- fused update kernels ----
// Each is an orphaned `omp for ... nowait`: step() opens one parallel region and walks the
// parameters inside it, so small tensors (biases, norms) cost no fork and no barrier each.
// T is the arithmetic type and `p` the values updated in it: the parameter itself (G = T, no
// `out`), or a bf16/f16 parameter's float32 master, whose grad G is read as float32 and whose
// parameter `out` gets the updated master rounded to nearest even. The arithmetic is the same
// expression either way, so a master follows a float32 parameter's trajectory exactly.

// `out[i] = p` for a 16-bit parameter; nothing for a parameter updated in place (H = T).
template <class T, class H>
inline void store_param(H* __restrict out, int64_t i, T p) {
  if constexpr (!std::is_same_v<H, T>) out[i] = H(p);
}

template <class T, class G, class H, bool L2, int Mode>  // Mode: 0 plain, 1 momentum, 2 nesterov
void sgd_kernel(T* __restrict p, const G* __restrict g, T* __restrict buf, H* __restrict out,
                int64_t n, T lr, T momentum, T wd) {
#pragma omp for simd schedule(static) nowait
  for (int64_t i = 0; i < n; ++i) {
    T d = (T)g[i];
    if constexpr (L2) d += wd * p[i];
    if constexpr (Mode == 1) {
      buf[i] = momentum * buf[i] + d;
      d = buf[i];
    } else if constexpr (Mode == 2) {
      buf[i] = momentum * buf[i] + d;
      d += momentum * buf[i];
    }
    p[i] -= lr * d;
    store_param(out, i, p[i]);
  }
}

// The pointers of one parameter's update: what is updated in T (the parameter or its master),
// its grad, and the 16-bit parameter that receives the result (null when H = T).
template <class T, class G, class H>
struct UpdateRefs {
  T* p;
  const G* g;
  H* out;
};
template <class T, class H>
UpdateRefs<T, H, H> update_refs(const Tensor& param, const Tensor& master, const Tensor& grad) {
  if constexpr (std::is_same_v<H, T>) return {param.data<T>(), grad.data<T>(), nullptr};
  else return {master.data<T>(), grad.data<H>(), param.data<H>()};
}

template <class T, class H>
void sgd_dispatch(const Tensor& pt, const Tensor& mt, const Tensor& gt, const Tensor* buft,
                  double lr, double momentum, double wd, bool nesterov) {
  const auto r = update_refs<T, H>(pt, mt, gt);
  T* buf = buft ? buft->data<T>() : nullptr;
  const int64_t n = pt.numel();
  const int mode = momentum == 0 ? 0 : nesterov ? 2 : 1;
  const T l = (T)lr, m = (T)momentum, w = (T)wd;
  auto run = [&]<bool L2>() {
    if (mode == 0) sgd_kernel<T, H, H, L2, 0>(r.p, r.g, buf, r.out, n, l, m, w);
    else if (mode == 1) sgd_kernel<T, H, H, L2, 1>(r.p, r.g, buf, r.out, n, l, m, w);
    else sgd_kernel<T, H, H, L2, 2>(r.p, r.g, buf, r.out, n, l, m, w);
  };
  if (wd != 0) run.template operator()<true>();
  else run.template operator()<false>();
}

struct AdamScalars {
  double beta1, beta2, eps, l2, decay, step_size, bc2_sqrt;
};

// One fused pass per parameter; std::sqrt vectorises because the build uses -fno-math-errno.
template <class T, class G, class H, bool L2, bool Decoupled>
void adam_kernel(T* __restrict p, const G* __restrict g, T* __restrict m, T* __restrict v,
                 H* __restrict out, int64_t n, const AdamScalars& s) {
  const T b1 = (T)s.beta1, b2 = (T)s.beta2, omb1 = (T)(1 - s.beta1), omb2 = (T)(1 - s.beta2);
  const T eps = (T)s.eps, l2 = (T)s.l2, decay = (T)s.decay, step_size = (T)s.step_size,
          bc2_sqrt = (T)s.bc2_sqrt;
#pragma omp for simd schedule(static) nowait
  for (int64_t i = 0; i < n; ++i) {
    T d = (T)g[i];
    if constexpr (L2) d += l2 * p[i];
    const T mi = b1 * m[i] + omb1 * d;
    const T vi = b2 * v[i] + omb2 * d * d;
    m[i] = mi;
    v[i] = vi;
    T pi = p[i];
    if constexpr (Decoupled) pi *= decay;
    p[i] = pi - step_size * (mi / (std::sqrt(vi) / bc2_sqrt + eps));
    store_param(out, i, p[i]);
  }
}

template <class T, class H>
void adam_dispatch(const Tensor& pt, const Tensor& mst, const Tensor& gt, const Tensor& mt,
                   const Tensor& vt, const AdamScalars& s, bool decoupled) {
  const auto r = update_refs<T, H>(pt, mst, gt);
  T* m = mt.data<T>();
  T* v = vt.data<T>();
  const int64_t n = pt.numel();
  if (decoupled) adam_kernel<T, H, H, false, true>(r.p, r.g, m, v, r.out, n, s);
  else if (s.l2 != 0) adam_kernel<T, H, H, true, false>(r.p, r.g, m, v, r.out, n, s);
  else adam_kernel<T, H, H, false, false>(r.p, r.g, m, v, r.out, n, s);
}

// Calls f.template operator()<T, H>() for the parameter's dtype: T the arithmetic type, H the
// stored one (T itself for f32 and f64; bf16 and f16 are updated through a float32 master).
template <class F>
void by_param_dtype(DType dt, F&& f) {
  switch (dt) {
    case DType::f32:
      return f.template operator()<float, float>();
    case DType::f64:
      return f.template operator()<double, double>();
    case DType::bf16:
      return f.template operator()<float, bfloat16>();
    case DType::f16:
      return f.template operator()<float, float16>();
    case DType::i64:
    case DType::i8:
      break;
  }
  fail(std::string("optimizer: no update for a ") + dtype_short_name(dt) + " parameter");
}

template <class T>
double sum_squares(const T* __restrict x, int64_t n) {
  double s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) {
    const double xi = (double)x[i];
    s += xi * xi;
  }
  return s;
}

template <class T>
void norm_blocks(const T* g, int64_t n, double* partial) {
  const int64_t nb = (n + kNormBlock - 1) / kNormBlock;
#pragma omp for schedule(static) nowait
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t lo = b * kNormBlock;
    partial[b] = sum_squares(g + lo, std::min(kNormBlock, n - lo));
  }
}

// g *= c; a bf16 or f16 grad is scaled in float32 (C = float) and rounded once: the float32
// product of a 16-bit value and a float is exact enough (24 >= 2 * 11 + 2 bits) that rounding it
// again equals rounding the exact product.
template <class T, class C>
void scale_kernel(T* __restrict g, int64_t n, C c) {
#pragma omp for simd schedule(static) nowait
  for (int64_t i = 0; i < n; ++i) g[i] = T((C)g[i] * c);
}

// ---- JSON readers for load_state: json_field() (checkpoint.h), every miss naming the key ----

const char* const kLoadState = "load_state";

// j[key] as it is (an array or object the caller walks), or an error naming the key.
const nlohmann::json& need(const nlohmann::json& j, const char* key) {
  if (!j.is_object() || !j.contains(key))
    fail(std::string(kLoadState) + ": '" + key + "' is missing");
  return j.at(key);
}
double need_number(const nlohmann::json& j, const char* key) {
  return json_field<double>(j, key, kLoadState);
}
// A count (a step): an integer >= 0.
int64_t need_count(const nlohmann::json& j, const char* key) {
  const int64_t v = json_field<int64_t>(j, key, kLoadState);
  if (v < 0)
    fail(std::string(kLoadState) + ": '" + key + "' must be an integer >= 0, got " +
         std::to_string(v));
  return v;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Optimizer

Optimizer::Optimizer(ParamGroups groups, const char* opname) {
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string which = "group " + std::to_string(g) + " weight_decay";
    check_nonneg(opname, groups.size() == 1 ? "weight_decay" : which.c_str(),
                 groups[g].weight_decay);
    const std::string scale = "group " + std::to_string(g) + " lr_scale";
    if (!(groups[g].lr_scale >= 0) || !std::isfinite(groups[g].lr_scale))
      fail(std::string(opname) + ": " + scale + " must be a finite number >= 0, got " +
           num_str(groups[g].lr_scale));
    groups_.push_back({groups[g].weight_decay, groups[g].lr_scale});
    for (auto& np : groups[g].params) {
      params_.push_back(std::move(np));
      group_of_.push_back(g);
    }
  }
  if (params_.empty()) fail("Optimizer: got an empty parameter list");
  std::set<std::string> names;
  std::set<const TensorImpl*> impls;
  for (const auto& [name, p] : params_) {
    if (name.empty()) fail("Optimizer: a parameter has an empty name");
    if (!names.insert(name).second) fail("Optimizer: parameter name '" + name + "' appears twice");
    if (!p.defined()) fail("Optimizer: parameter '" + name + "' is an undefined tensor");
    if (!is_floating(p.dtype()))
      fail("Optimizer: parameter '" + name + "' is " + describe(p) +
           "; only float tensors (f32, f64, bf16, f16) can be optimized");
    if (!p.is_leaf())
      fail("Optimizer: parameter '" + name +
           "' is not a leaf (it was produced by an op); "
           "optimize the leaf it came from or detach() it");
    if (!p.is_contiguous())
      fail("Optimizer: parameter '" + name + "' " + describe(p) + " is not contiguous");
    if (!impls.insert(p.impl()).second)
      fail("Optimizer: parameter '" + name + "' is the same tensor as an earlier parameter");
  }
  make_masters();
}

void Optimizer::make_masters() {
  master_.assign(params_.size(), Tensor());
  for (size_t i = 0; i < params_.size(); ++i)
    if (is_half(params_[i].second.dtype())) master_[i] = cast_copy(params_[i].second, DType::f32);
  note_param_versions();
}

// A master restarts from its parameter when something else wrote the parameter (its version
// moved) or gave it other memory (Module::to, adopt_state_dict: another storage, whose version
// may equal the old one's). A parameter whose dtype changed since the optimizer was made has no
// master (or one it no longer needs): refused before any update runs.
void Optimizer::refresh_masters() {
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i].second;
    if (is_half(p.dtype()) != master_[i].defined())
      fail("optimizer: parameter '" + params_[i].first + "' is " + describe(p) +
           " but was another dtype when the optimizer was made (Module::to after it); make the "
           "optimizer after converting the model");
    if (master_[i].defined() &&
        (p.version() != master_version_[i] || master_storage_[i].lock() != p.impl()->storage))
      copy_into(master_[i], p);
  }
}

void Optimizer::note_param_versions() {
  master_version_.resize(params_.size());
  master_storage_.resize(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    master_version_[i] = params_[i].second.version();
    master_storage_[i] = params_[i].second.impl()->storage;
  }
}

DType Optimizer::state_dtype(size_t i) const {
  const DType dt = params_[i].second.dtype();
  return is_half(dt) ? DType::f32 : dt;
}

int64_t Optimizer::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& [name, t] : state_tensors()) bytes += t.numel() * (int64_t)dtype_size(t.dtype());
  return bytes;
}

Optimizer::~Optimizer() = default;

const Optimizer::GroupSettings& Optimizer::group(size_t g) const {
  if (g >= groups_.size())
    fail(std::string(name()) + ": group " + std::to_string(g) + " out of range (" +
         std::to_string(groups_.size()) + " parameter groups)");
  return groups_[g];
}

size_t Optimizer::group_of(size_t i) const {
  if (i >= group_of_.size())
    fail(std::string(name()) + "::group_of: parameter " + std::to_string(i) + " out of range (" +
         std::to_string(group_of_.size()) + " parameters)");
  return group_of_[i];
}

void Optimizer::set_lr(double lr) {
  check_nonneg(name(), "lr", lr);
  lr_ = lr;
}

void Optimizer::zero_grad() {
  for (auto& [name, p] : params_) p.zero_grad();
}

std::vector<Tensor> Optimizer::grads_for_step(const char* opname, int64_t& total) const {
  std::vector<Tensor> grads(params_.size());
  total = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& [name, p] = params_[i];
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (g.shape() != p.shape() || g.dtype() != p.dtype())
      fail(std::string(opname) + ": grad of '" + name + "' is " + describe(g) +
           " but the parameter is " + describe(p));
    // Gradients come out of backward contiguous; a hand-set strided one costs a copy.
    grads[i] = g.is_contiguous() ? g : contiguous_copy(g);
    total += p.numel();
  }
  return grads;
}

std::vector<Tensor> Optimizer::zeros_like_params() const {
  std::vector<Tensor> out;
  out.reserve(params_.size());
  for (size_t i = 0; i < params_.size(); ++i)
    out.push_back(zeros(params_[i].second.shape(), state_dtype(i)));
  return out;
}

std::vector<std::pair<std::string, Tensor>> Optimizer::collect_state() const {
  std::vector<std::pair<std::string, Tensor>> out;
  const auto names = buffer_names();
  for (size_t i = 0; i < params_.size(); ++i) {
    for (size_t b = 0; b < names.size(); ++b)
      out.emplace_back(params_[i].first + "." + names[b], buffers(b)[i]);
    if (master_[i].defined()) out.emplace_back(params_[i].first + ".master", master_[i]);
  }
  return out;
}

nlohmann::json Optimizer::state_json() const {
  nlohmann::json j;
  j["type"] = name();
  j["step"] = step_count_;
  j["lr"] = lr_;
  auto names = nlohmann::json::array();
  for (const auto& [n, p] : params_) names.push_back(n);
  j["params"] = names;
  auto groups = nlohmann::json::array();
  for (const auto& g : groups_)
    groups.push_back({{"params", nlohmann::json::array()},
                      {"weight_decay", g.weight_decay},
                      {"lr_scale", g.lr_scale}});
  for (size_t i = 0; i < params_.size(); ++i)
    groups[group_of_[i]]["params"].push_back(params_[i].first);
  j["param_groups"] = groups;
  return j;
}

// The saved groups' settings, checked against this optimizer's groups: the same number, each
// parameter in the same group. A state from before groups is one group with its weight_decay.
std::vector<Optimizer::GroupSettings> Optimizer::saved_groups(const nlohmann::json& j) const {
  if (!j.contains("param_groups")) {
    if (groups_.size() != 1)
      fail("load_state: the state has one parameter group but this optimizer has " +
           std::to_string(groups_.size()));
    const double wd = need_number(j, "weight_decay");
    check_nonneg("load_state", "weight_decay", wd);
    return {{wd, 1.0}};
  }
  const auto& gj = j.at("param_groups");
  if (!gj.is_array() || gj.size() != groups_.size())
    fail("load_state: 'param_groups' must be an array of " + std::to_string(groups_.size()) +
         " groups, as this optimizer has, got " + json_excerpt(gj));
  std::map<std::string, size_t> saved_group;
  std::vector<GroupSettings> out;
  for (size_t g = 0; g < gj.size(); ++g) {
    const double wd = need_number(gj[g], "weight_decay"), scale = need_number(gj[g], "lr_scale");
    check_nonneg("load_state", "weight_decay", wd);
    check_nonneg("load_state", "lr_scale", scale);
    out.push_back({wd, scale});
    const auto& names = need(gj[g], "params");
    if (!names.is_array()) fail("load_state: a group's 'params' must be an array of names");
    for (const auto& n : names)
      if (n.is_string()) saved_group[n.get<std::string>()] = g;
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    auto it = saved_group.find(params_[i].first);
    if (it == saved_group.end() || it->second != group_of_[i])
      fail("load_state: parameter '" + params_[i].first + "' is in group " +
           std::to_string(group_of_[i]) + " of this optimizer but " +
           (it == saved_group.end() ? std::string("in no group")
                                    : "in group " + std::to_string(it->second)) +
           " of the state");
  }
  return out;
}

namespace {

// load_state: the saved "params" (a JSON array of names) are exactly `params`' names.
void check_same_params(const nlohmann::json& saved_names, const NamedParams& params) {
  if (!saved_names.is_array()) fail("load_state: 'params' must be an array of names");
  std::set<std::string> saved, mine;
  for (const auto& n : saved_names) {
    if (!n.is_string()) fail("load_state: 'params' holds a non-string " + json_excerpt(n));
    saved.insert(n.get<std::string>());
  }
  for (const auto& [n, p] : params) {
    mine.insert(n);
    if (!saved.count(n)) fail("load_state: parameter '" + n + "' has no saved state");
  }
  for (const auto& n : saved)
    if (!mine.count(n))
      fail("load_state: the state has parameter '" + n + "', which this optimizer does not");
}

// What load_state expects of one saved tensor, and the words that say whose it is.
struct ExpectedTensor {
  std::string name;
  Shape shape;
  DType dtype;
  std::string owner;  // "parameter 'w'", "the float32 master of bf16 parameter 'w'", ...
};

// The tensors state_tensors() holds for these parameters and buffer names: each buffer of its
// parameter's shape, in float32 for a bf16 or f16 parameter (which also has its float32
// "<param>.master"), else in the parameter's dtype.
std::vector<ExpectedTensor> expected_state(const NamedParams& params,
                                           const std::vector<std::string>& bufs) {
  std::vector<ExpectedTensor> out;
  for (const auto& [pname, p] : params) {
    const bool half = is_half(p.dtype());
    const std::string whose =
        std::string(dtype_short_name(p.dtype())) + " parameter '" + pname + "'";
    for (const auto& b : bufs)
      out.push_back({pname + "." + b, p.shape(), half ? DType::f32 : p.dtype(),
                     half ? "the state of " + whose : "parameter '" + pname + "'"});
    if (half) out.push_back({pname + ".master", p.shape(), DType::f32, "the master of " + whose});
  }
  return out;
}

// Why a saved tensor is not expected, when its name tells.
std::string unexpected_why(const std::string& name) {
  const std::string suffix = ".master";
  if (name.size() > suffix.size() &&
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
    return " (a master copy is kept only for a bf16 or f16 parameter, and '" +
           name.substr(0, name.size() - suffix.size()) + "' is not one)";
  return "";
}

// load_state: the saved tensors by name, checked to be exactly the `expected` ones, each of its
// shape and dtype.
std::map<std::string, const Tensor*> state_tensors_by_name(
    const std::vector<std::pair<std::string, Tensor>>& tensors,
    const std::vector<ExpectedTensor>& expected) {
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [n, t] : tensors)
    if (!by_name.emplace(n, &t).second) fail("load_state: tensor '" + n + "' appears twice");
  std::set<std::string> names;
  for (const ExpectedTensor& e : expected) {
    names.insert(e.name);
    auto it = by_name.find(e.name);
    if (it == by_name.end()) fail("load_state: missing tensor '" + e.name + "' (" + e.owner + ")");
    const Tensor& t = *it->second;
    if (!t.defined()) fail("load_state: tensor '" + e.name + "' is undefined");
    if (t.shape() != e.shape)
      fail("load_state: tensor '" + e.name + "' has shape " + shape_str(t.shape()) + " but " +
           e.owner + " is " + shape_str(e.shape));
    if (t.dtype() != e.dtype)
      fail("load_state: tensor '" + e.name + "' is " + dtype_name(t.dtype()) + " but " + e.owner +
           " is " + dtype_name(e.dtype));
  }
  for (const auto& [n, t] : tensors)
    if (!names.count(n)) fail("load_state: unexpected tensor '" + n + "'" + unexpected_why(n));
  return by_name;
}

}  // namespace

void Optimizer::load_state(const std::vector<std::pair<std::string, Tensor>>& tensors,
                           const nlohmann::json& j) {
  if (!j.is_object()) fail("load_state: expected a JSON object, got " + json_excerpt(j));
  const auto& type = need(j, "type");
  if (!type.is_string() || type.get<std::string>() != name())
    fail("load_state: the state is for optimizer " + json_excerpt(type) + " but this one is " +
         name());
  const int64_t step = need_count(j, "step");
  const double lr = need_number(j, "lr");
  check_nonneg("load_state", "lr", lr);

  check_same_params(need(j, "params"), params_);
  const std::vector<GroupSettings> groups = saved_groups(j);
  check_hyper(j);

  const auto bufs = buffer_names();
  const std::map<std::string, const Tensor*> by_name =
      state_tensors_by_name(tensors, expected_state(params_, bufs));

  // Everything checked: now apply. Copies, so the caller's tensors are never aliased.
  for (size_t b = 0; b < bufs.size(); ++b)
    for (size_t i = 0; i < params_.size(); ++i) {
      const Tensor& dst = buffers(b)[i];
      copy_into(dst, *by_name.at(params_[i].first + "." + bufs[b]));
      dst.bump_version();
    }
  for (size_t i = 0; i < params_.size(); ++i)
    if (master_[i].defined()) copy_into(master_[i], *by_name.at(params_[i].first + ".master"));
  note_param_versions();  // the loaded masters belong to the parameters as they are now
  step_count_ = step;
  lr_ = lr;
  groups_ = groups;
  load_hyper(j);
}

// ---------------------------------------------------------------------------------------------
// SGD

SGD::SGD(NamedParams params, double lr, double momentum, double weight_decay, bool nesterov)
    : SGD(ParamGroups{{std::move(params), weight_decay}}, lr, momentum, nesterov) {}

SGD::SGD(ParamGroups groups, double lr, double momentum, bool nesterov)
    : Optimizer(std::move(groups), "SGD"), momentum_(momentum), nesterov_(nesterov) {
  check_nonneg("SGD", "lr", lr);
  check_nonneg("SGD", "momentum", momentum);
  if (nesterov && momentum <= 0) fail("SGD: nesterov momentum requires momentum > 0, got 0");
  lr_ = lr;
  if (momentum_ != 0) momentum_buffer_ = zeros_like_params();
}

void SGD::step() {
  autograd::NoGrad no_grad;
  int64_t total = 0;
  const std::vector<Tensor> grads = grads_for_step("SGD::step", total);
  ++step_count_;
  refresh_masters();
  const bool has_buf = !momentum_buffer_.empty();
#pragma omp parallel if (total > kParallelMin)
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!grads[i].defined()) continue;
    const Tensor& p = params_[i].second;
    const Tensor* buf = has_buf ? &momentum_buffer_[i] : nullptr;
    const GroupSettings& g = groups_[group_of_[i]];
    by_param_dtype(p.dtype(), [&]<class T, class H>() {
      sgd_dispatch<T, H>(p, master_[i], grads[i], buf, lr_ * g.lr_scale, momentum_, g.weight_decay,
                         nesterov_);
    });
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!grads[i].defined()) continue;
    params_[i].second.bump_version();
    if (has_buf) momentum_buffer_[i].bump_version();
    if (master_[i].defined()) master_[i].bump_version();
  }
  note_param_versions();
}

std::vector<std::string> SGD::buffer_names() const {
  if (momentum_buffer_.empty()) return {};
  return {"momentum_buffer"};
}
const std::vector<Tensor>& SGD::buffers(size_t) const { return momentum_buffer_; }

std::vector<std::pair<std::string, Tensor>> SGD::state_tensors() const { return collect_state(); }

nlohmann::json SGD::state_json() const {
  auto j = Optimizer::state_json();
  j["momentum"] = momentum_;
  j["nesterov"] = nesterov_;
  return j;
}

void SGD::check_hyper(const nlohmann::json& j) const {
  const double momentum = need_number(j, "momentum");
  check_nonneg("load_state", "momentum", momentum);
  const bool nesterov = json_field<bool>(j, "nesterov", kLoadState);
  if (nesterov && momentum <= 0) fail("load_state: SGD state has nesterov with momentum 0");
  // The momentum buffers exist only when momentum != 0, so that must agree.
  if ((momentum != 0) != (momentum_ != 0))
    fail("load_state: the state has SGD momentum " + num_str(momentum) + " but this SGD has " +
         num_str(momentum_) + "; one has momentum buffers and the other does not");
}

void SGD::load_hyper(const nlohmann::json& j) {
  momentum_ = j.at("momentum").get<double>();
  nesterov_ = j.at("nesterov").get<bool>();
}

// ---------------------------------------------------------------------------------------------
// Adam / AdamW

int64_t Adam::param_step(size_t i) const {
  if (i >= param_steps_.size())
    fail(std::string(name()) + "::param_step: parameter " + std::to_string(i) + " out of range (" +
         std::to_string(param_steps_.size()) + " parameters)");
  return param_steps_[i];
}

Adam::Adam(NamedParams params, double lr, double beta1, double beta2, double eps,
           double weight_decay)
    : Adam(ParamGroups{{std::move(params), weight_decay}}, lr, beta1, beta2, eps, false, "Adam") {}

Adam::Adam(ParamGroups groups, double lr, double beta1, double beta2, double eps)
    : Adam(std::move(groups), lr, beta1, beta2, eps, false, "Adam") {}

Adam::Adam(ParamGroups groups, double lr, double beta1, double beta2, double eps, bool decoupled,
           const char* opname)
    : Optimizer(std::move(groups), opname),
      beta1_(beta1),
      beta2_(beta2),
      eps_(eps),
      decoupled_(decoupled) {
  check_nonneg(opname, "lr", lr);
  check_beta(opname, "beta1", beta1);
  check_beta(opname, "beta2", beta2);
  check_nonneg(opname, "eps", eps);
  lr_ = lr;
  exp_avg_ = zeros_like_params();
  exp_avg_sq_ = zeros_like_params();
  param_steps_.assign(params_.size(), 0);
}

AdamW::AdamW(NamedParams params, double lr, double beta1, double beta2, double eps,
             double weight_decay)
    : Adam(ParamGroups{{std::move(params), weight_decay}}, lr, beta1, beta2, eps, true, "AdamW") {}

AdamW::AdamW(ParamGroups groups, double lr, double beta1, double beta2, double eps)
    : Adam(std::move(groups), lr, beta1, beta2, eps, true, "AdamW") {}

void Adam::step() {
  autograd::NoGrad no_grad;
  int64_t total = 0;
  const std::vector<Tensor> grads =
      grads_for_step(decoupled_ ? "AdamW::step" : "Adam::step", total);
  ++step_count_;
  // Per-parameter scalars: the bias corrections follow each parameter's own step count.
  std::vector<AdamScalars> scal(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!grads[i].defined()) continue;
    const double t = (double)++param_steps_[i];
    const double bc1 = 1 - std::pow(beta1_, t), bc2 = 1 - std::pow(beta2_, t);
    const GroupSettings& g = groups_[group_of_[i]];
    const double lr = lr_ * g.lr_scale;
    scal[i] = {beta1_,
               beta2_,
               eps_,
               decoupled_ ? 0.0 : g.weight_decay,
               decoupled_ ? 1 - lr * g.weight_decay : 1.0,
               lr / bc1,
               std::sqrt(bc2)};
  }
  refresh_masters();
#pragma omp parallel if (total > kParallelMin)
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!grads[i].defined()) continue;
    const Tensor& p = params_[i].second;
    by_param_dtype(p.dtype(), [&]<class T, class H>() {
      adam_dispatch<T, H>(p, master_[i], grads[i], exp_avg_[i], exp_avg_sq_[i], scal[i],
                          decoupled_);
    });
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!grads[i].defined()) continue;
    params_[i].second.bump_version();
    exp_avg_[i].bump_version();
    exp_avg_sq_[i].bump_version();
    if (master_[i].defined()) master_[i].bump_version();
  }
  note_param_versions();
}

std::vector<std::string> Adam::buffer_names() const { return {"exp_avg", "exp_avg_sq"}; }
const std::vector<Tensor>& Adam::buffers(size_t which) const {
  return which == 0 ? exp_avg_ : exp_avg_sq_;
}

std::vector<std::pair<std::string, Tensor>> Adam::state_tensors() const { return collect_state(); }

nlohmann::json Adam::state_json() const {
  auto j = Optimizer::state_json();
  j["beta1"] = beta1_;
  j["beta2"] = beta2_;
  j["eps"] = eps_;
  auto steps = nlohmann::json::object();
  for (size_t i = 0; i < params_.size(); ++i) steps[params_[i].first] = param_steps_[i];
  j["param_steps"] = steps;
  return j;
}

void Adam::check_hyper(const nlohmann::json& j) const {
  check_beta("load_state", "beta1", need_number(j, "beta1"));
  check_beta("load_state", "beta2", need_number(j, "beta2"));
  check_nonneg("load_state", "eps", need_number(j, "eps"));
  const int64_t step = need_count(j, "step");
  const auto& steps = need(j, "param_steps");
  if (!steps.is_object()) fail("load_state: 'param_steps' must be an object");
  for (const auto& [pname, p] : params_) {
    if (!steps.contains(pname)) fail("load_state: 'param_steps' has no entry for '" + pname + "'");
    const auto& v = steps.at(pname);
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > step)
      fail("load_state: 'param_steps' of '" + pname + "' must be an integer in [0, " +
           std::to_string(step) + "], got " + json_excerpt(v));
  }
}

void Adam::load_hyper(const nlohmann::json& j) {
  beta1_ = j.at("beta1").get<double>();
  beta2_ = j.at("beta2").get<double>();
  eps_ = j.at("eps").get<double>();
  const auto& steps = j.at("param_steps");
  for (size_t i = 0; i < params_.size(); ++i)
    param_steps_[i] = steps.at(params_[i].first).get<int64_t>();
}

// ---------------------------------------------------------------------------------------------
// Schedules, clipping, checkpoints

double NoamSchedule::lr(int64_t step) const {
  if (step < 1) fail("NoamSchedule: step must be >= 1, got " + std::to_string(step));
  if (d_model < 1) fail("NoamSchedule: d_model must be >= 1, got " + std::to_string(d_model));
  if (warmup < 1) fail("NoamSchedule: warmup must be >= 1, got " + std::to_string(warmup));
  check_nonneg("NoamSchedule", "factor", factor);
  const double s = (double)step;
  return factor / std::sqrt((double)d_model) *
         std::min(1 / std::sqrt(s), s * std::pow((double)warmup, -1.5));
}

Schedule Schedule::noam(double factor, int64_t d_model, int64_t warmup) {
  if (d_model < 1) fail("Schedule: d_model must be >= 1, got " + std::to_string(d_model));
  if (warmup < 1) fail("Schedule: the Noam warmup must be >= 1, got " + std::to_string(warmup));
  if (!std::isfinite(factor)) fail("Schedule: factor must be finite, got " + num_str(factor));
  check_nonneg("Schedule", "factor", factor);
  Schedule s;
  s.kind_ = "noam", s.factor_ = factor, s.d_model_ = d_model, s.warmup_ = warmup;
  return s;
}

Schedule Schedule::cosine(double lr, double min_lr, int64_t warmup, int64_t total) {
  Schedule s = constant(lr, warmup);
  if (!(min_lr >= 0 && min_lr <= lr))
    fail("Schedule: min_lr must be in [0, lr = " + num_str(lr) + "], got " + num_str(min_lr));
  if (total <= warmup)
    fail("Schedule: the cosine decay needs more steps (" + std::to_string(total) +
         ") than warmup steps (" + std::to_string(warmup) + ")");
  s.kind_ = "cosine", s.min_lr_ = min_lr, s.total_ = total;
  return s;
}

Schedule Schedule::constant(double lr, int64_t warmup) {
  if (!std::isfinite(lr)) fail("Schedule: lr must be finite, got " + num_str(lr));
  check_nonneg("Schedule", "lr", lr);
  if (warmup < 0) fail("Schedule: warmup must be >= 0, got " + std::to_string(warmup));
  Schedule s;
  s.kind_ = "constant", s.lr_ = lr, s.min_lr_ = lr, s.warmup_ = warmup;
  return s;
}

double Schedule::lr(int64_t step) const {
  if (step < 1) fail("Schedule: step must be >= 1, got " + std::to_string(step));
  if (kind_ == "noam") return NoamSchedule{factor_, d_model_, warmup_}.lr(step);
  if (step <= warmup_) return lr_ * (double)step / (double)warmup_;
  if (kind_ == "constant" || step >= total_) return kind_ == "constant" ? lr_ : min_lr_;
  const double progress = (double)(step - warmup_) / (double)(total_ - warmup_);
  return min_lr_ + (lr_ - min_lr_) * 0.5 * (1 + std::cos(M_PI * progress));
}

nlohmann::json Schedule::to_json() const {
  if (kind_ == "noam")
    return {{"schedule", kind_}, {"factor", factor_}, {"d_model", d_model_}, {"warmup", warmup_}};
  nlohmann::json j = {{"schedule", kind_}, {"lr", lr_}, {"warmup", warmup_}};
  if (kind_ == "cosine") j["min_lr"] = min_lr_, j["total"] = total_;
  return j;
}

bool decays_by_default(const std::string& name, int64_t dim) {
  return dim >= 2 && name.find("embed") == std::string::npos;
}

ParamGroups decay_groups(const NamedParams& params, double weight_decay) {
  check_nonneg("decay_groups", "weight_decay", weight_decay);
  ParamGroups g{{{}, weight_decay}, {{}, 0.0}};
  for (const auto& [name, p] : params)
    g[p.defined() && decays_by_default(name, p.dim()) ? 0 : 1].params.emplace_back(name, p);
  return g;
}

double clip_grad_norm(const NamedParams& params, double max_norm) {
  check_nonneg("clip_grad_norm", "max_norm", max_norm);
  autograd::NoGrad no_grad;
  const size_t np = params.size();
  std::vector<Tensor> grads(np);
  std::vector<int64_t> first_block(np + 1, 0);
  int64_t total = 0;
  for (size_t i = 0; i < np; ++i) {
    const auto& [name, p] = params[i];
    first_block[i + 1] = first_block[i];
    if (!p.defined()) continue;
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (!is_floating(g.dtype()))
      fail("clip_grad_norm: grad of '" + name + "' is " + describe(g) + ", not a float tensor");
    if (!g.is_contiguous()) {  // scaled in place below, so the contiguous copy becomes the grad
      g = contiguous_copy(g);
      Tensor(p).set_grad(g);
    }
    grads[i] = g;
    total += g.numel();
    first_block[i + 1] += (g.numel() + kNormBlock - 1) / kNormBlock;
  }
  std::vector<double> partial(first_block[np]);
#pragma omp parallel if (total > kParallelMin)
  for (size_t i = 0; i < np; ++i) {
    if (!grads[i].defined()) continue;
    double* out = partial.data() + first_block[i];
    by_param_dtype(grads[i].dtype(), [&]<class T, class H>() {
      norm_blocks(grads[i].data<H>(), grads[i].numel(), out);
    });
  }
  double sumsq = 0;
  for (double s : partial) sumsq += s;
  const double norm = std::sqrt(sumsq);
  if (!std::isfinite(norm)) return norm;
  const double coef = max_norm / (norm + 1e-6);
  if (coef >= 1) return norm;
#pragma omp parallel if (total > kParallelMin)
  for (size_t i = 0; i < np; ++i) {
    if (!grads[i].defined()) continue;
    by_param_dtype(grads[i].dtype(), [&]<class T, class H>() {
      scale_kernel(grads[i].data<H>(), grads[i].numel(), (T)coef);
    });
  }
  for (const Tensor& g : grads)
    if (g.defined()) g.bump_version();
  return norm;
}

}  // namespace graft::train
