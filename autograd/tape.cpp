#include "graft/autograd/tape.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "autograd/internal/tape_state.h"
#include "graft/autograd/graph.h"

namespace graft::autograd {

using detail::Entry;
using detail::Route;
using detail::Tape;

namespace {

thread_local Tape t_tape;

using ProfileClock = std::chrono::steady_clock;
struct Profile {
  bool on = false;
  ProfileClock::time_point last;
  std::map<std::string, OpTime> ops;
};
thread_local Profile t_profile;
thread_local bool t_grad_enabled = true;
// The order of what record() records: 1 in a forward, 1 + the entry's order while a backward
// runs under create_graph.
thread_local int t_record_order = 1;

bool anomaly_from_env() {
  const char* v = std::getenv("GRAFT_DETECT_ANOMALY");
  return v && *v && std::string(v) != "0";
}
thread_local bool t_anomaly = anomaly_from_env();
thread_local std::vector<std::string> t_scopes;
thread_local GradReadyHook t_grad_ready;
thread_local int t_keep_paths = 0;  // live KeepModulePaths objects
bool keeping_paths() { return t_anomaly || t_keep_paths > 0; }

std::string in_path(const std::string& path) {
  return path.empty() ? std::string() : " in " + path;
}

// Anomaly mode's forward check: inputs that reach a recorded op already non-finite came from
// outside the tape (data, a parameter, an op run without grad); outputs name this op.
void check_forward(const char* op, const Tensors& inputs, const Tensors& outputs) {
  for (size_t k = 0; k < inputs.size(); ++k)
    if (const char* bad = inputs[k].defined() ? nonfinite_kind(inputs[k]) : nullptr)
      fail(std::string("anomaly: input ") + std::to_string(k) + " of '" + op + "' (" +
           describe(inputs[k]) + ")" + in_path(name_scope_path()) + " holds " + bad +
           " (it was made outside the tape: data, a parameter or an op run without grad)");
  for (auto& o : outputs)
    if (const char* bad = nonfinite_kind(o))
      fail(std::string("anomaly: forward of '") + op + "' (" + describe(o) + ")" +
           in_path(name_scope_path()) + " produced " + bad);
}

// "backward of 'mul'", or, under create_graph or above the first order, "second backward of
// 'mul'": the start of every error a backward raises.
std::string backward_of(const Entry& e, bool create) {
  const std::string what = std::string("backward of '") + e.op + "'";
  return e.order > 1 || create ? ordinal(e.order) + " " + what : what;
}

void check_backward(const Entry& e, const Tensors& dins, bool create) {
  for (auto& g : dins)
    if (const char* bad = g.defined() ? nonfinite_kind(g) : nullptr)
      fail("anomaly: " + backward_of(e, create) + " (" + describe(g) + ")" + in_path(e.path) +
           " produced " + bad);
}

std::vector<OpDecl>& decls() {
  static std::vector<OpDecl> d;
  return d;
}
std::mutex& decl_mutex() {
  static std::mutex m;
  return m;
}

// The declaration of op `name`, or null.
const OpDecl* find_decl(const char* name) {
  std::lock_guard<std::mutex> lk(decl_mutex());
  for (auto& d : decls())
    if (d.name == name) return &d;
  return nullptr;
}

const TapeLink& link(const TensorImpl* t) { return TapeAccess::link(t); }
TapeLink& link(TensorImpl* t) { return TapeAccess::link(t); }

// A tensor produced by an entry of another thread's tape (see tape.h: a graph belongs to the
// thread that recorded it).
bool from_other_thread(const TensorImpl* t) {
  return link(t).index >= 0 && link(t).tape_id != t_tape.id;
}

}  // namespace

namespace detail {

uint64_t next_tape_id() {
  static std::atomic<uint64_t> next{1};
  return next++;
}

Tape& this_tape() { return t_tape; }
int& keep_paths_count() { return t_keep_paths; }

bool from_old_epoch(const TensorImpl* t) {
  return link(t).index >= 0 && link(t).epoch != t_tape.epoch;
}

void check_this_thread(const TensorImpl* t, const std::string& what) {
  if (from_other_thread(t))
    fail(what +
         " was recorded on another thread's tape; a graph belongs to the thread that "
         "recorded it: run its forward and backward() on one thread (detach() the tensor to use "
         "its value on another)");
}

// Marks (or unmarks) the storages of e's saved tensors as saved by the tape, once per storage.
void mark_saved(Entry& e, bool on) {
  if (e.marked == on) return;
  e.marked = on;
  for (size_t i = 0; i < e.saved.size(); ++i) {
    if (!e.saved[i].defined()) continue;
    Storage* s = e.saved[i].impl()->storage.get();
    bool repeat = false;  // a handful of saved tensors: a scan beats a set
    for (size_t j = 0; j < i && !repeat; ++j)
      repeat = e.saved[j].defined() && e.saved[j].impl()->storage.get() == s;
    if (repeat) continue;
    if (on) ++s->saved_by_tape;
    else --s->saved_by_tape;
  }
}

}  // namespace detail

using detail::check_this_thread;
using detail::from_old_epoch;
using detail::mark_saved;

namespace {

void free_entry(Entry& e) {
  if (e.freed) return;
  mark_saved(e, false);
  e.freed = true;
  e.saved.clear();
  e.saved.shrink_to_fit();
  e.kept.clear();
  e.kept_sources.clear();
  e.retained.clear();
  e.fn = nullptr;
  --t_tape.live;
}

void compact_if_empty() {
  if (t_tape.live == 0 && !t_tape.entries.empty()) {
    t_tape.entries.clear();
    ++t_tape.epoch;
  }
}

// `entry` names the freed entry: "the tape entry of 'mul'", or "the tape entry that produced
// this tensor" once the tape was cleared.
[[noreturn]] void already_freed(const std::string& entry) {
  fail("autograd: " + entry +
       " was already freed by an earlier backward(); run the forward again, or pass "
       "retain_graph=true to the first backward");
}
[[noreturn]] void already_freed(const char* op) {
  already_freed(std::string("the tape entry of '") + op + "'");
}

}  // namespace

namespace {
// Backward reads what the entry saved and kept: fails if a saved tensor, or a tensor a kept buffer
// was made from, was written in place since the op ran, or (under create_graph) a saved tensor is
// an untracked copy of an input (Entry::untracked_saved).
void check_saved(const Entry& e, bool create) {
  if (create && !e.untracked_saved.empty()) fail(backward_of(e, create) + ": " + e.untracked_saved);
  for (size_t s = 0; s < e.saved.size(); ++s) {
    if (e.saved[s].defined() && e.saved[s].version() != e.saved_versions[s])
      fail(backward_of(e, create) + ": saved tensor " + std::to_string(s) + " (" +
           describe(e.saved[s]) + ") was modified in place after the op ran (version " +
           std::to_string(e.saved_versions[s]) + " -> " + std::to_string(e.saved[s].version()) +
           ")");
  }
  for (size_t s = 0; s < e.kept_sources.size(); ++s) {
    const std::shared_ptr<Storage> src = e.kept_sources[s].first.lock();
    if (src && src->version != e.kept_sources[s].second)
      fail(backward_of(e, create) + ": the tensor kept buffer " + std::to_string(s) +
           " was made from was modified in place after the op ran (version " +
           std::to_string(e.kept_sources[s].second) + " -> " + std::to_string(src->version) + ")");
  }
}

}  // namespace

std::vector<SavedBytes> saved_bytes_by_op() {
  std::vector<SavedBytes> out;
  std::unordered_set<const Storage*> seen;
  for (auto& e : t_tape.entries) {
    if (e.freed) continue;
    auto it =
        std::find_if(out.begin(), out.end(), [&](const SavedBytes& s) { return s.op == e.op; });
    if (it == out.end()) it = out.insert(out.end(), SavedBytes{e.op, 0, 0});
    ++it->entries;
    for (auto& t : e.saved)
      if (t.defined() && seen.insert(t.impl()->storage.get()).second)
        it->bytes += t.impl()->storage->nbytes;
    for (auto& k : e.kept)
      if (k && seen.insert(k.get()).second) it->bytes += k->nbytes;
  }
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.bytes > b.bytes; });
  return out;
}

std::string ordinal(int n) {
  static const char* const names[] = {"first", "second", "third", "fourth"};
  return n >= 1 && n <= 4 ? names[n - 1] : "order-" + std::to_string(n);
}

bool can_overwrite(const Ctx& c, size_t i) {
  if (!c.last_use || i >= c.saved.size() || !c.saved[i].defined()) return false;
  const Tensor& t = c.saved[i];
  return t.impl_ptr().use_count() == 1 && t.impl()->storage.use_count() == 1;
}

void set_profiling(bool on) {
  t_profile.on = on;
  t_profile.last = ProfileClock::now();
}

std::vector<OpTime> profile_report() {
  std::vector<OpTime> out;
  for (auto& [name, o] : t_profile.ops) {
    out.push_back(o);
    out.back().op = name;
  }
  std::sort(out.begin(), out.end(), [](const OpTime& a, const OpTime& b) {
    return a.forward_s + a.backward_s > b.forward_s + b.backward_s;
  });
  t_profile.ops.clear();
  return out;
}

bool grad_enabled() { return t_grad_enabled; }

bool anomaly_mode() { return t_anomaly; }
void set_anomaly_mode(bool on) { t_anomaly = on; }

NameScope::NameScope(const std::string& name) {
  if (!keeping_paths() || name.empty()) return;
  t_scopes.push_back(name);
  pushed_ = true;
}
NameScope::~NameScope() {
  if (pushed_) t_scopes.pop_back();
}

std::string name_scope_path() {
  std::string p;
  for (auto& s : t_scopes) p += (p.empty() ? "" : ".") + s;
  return p;
}

namespace {
template <class T>
const char* nonfinite_in(const T* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(p[i])) return std::isnan(p[i]) ? "NaN" : "Inf";
  return nullptr;
}
}  // namespace

const char* nonfinite_kind(const Tensor& t) {
  if (!is_floating(t.dtype())) return nullptr;
  // bf16 and f16 are read as float32 (a NaN or inf stays one; finite values stay finite).
  if (is_half(t.dtype())) return nonfinite_kind(cast_copy(t, DType::f32));
  const Tensor c = t.is_contiguous() ? t : contiguous_copy(t);
  if (c.dtype() == DType::f32) return nonfinite_in(static_cast<const float*>(c.raw()), c.numel());
  return nonfinite_in(static_cast<const double*>(c.raw()), c.numel());
}
void set_grad_enabled(bool on) { t_grad_enabled = on; }

bool declare_op(const char* name, const char* family, bool double_backward) {
  std::lock_guard<std::mutex> lk(decl_mutex());
  for (auto& d : decls())
    if (d.name == name) return true;
  decls().push_back({name, family, double_backward});
  return true;
}

const std::vector<OpDecl>& declared_ops() { return decls(); }

bool needs_record(const Tensors& inputs) {
  if (!t_grad_enabled) return false;
  for (auto& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

void record(const char* op, const Tensors& inputs, const Tensors& outputs, Tensors saved,
            BackwardFn fn) {
  record(op, inputs, outputs, std::move(saved), std::vector<KeptBuffer>{}, std::move(fn));
}

namespace {
// Whether declared op `op` has a double backward (declare_op()). Op names are string literals:
// the pointers already checked are remembered, so the hot path is one hash lookup instead of a
// locked scan of every declared name.
bool declared_double_backward(const char* op) {
  thread_local std::unordered_map<const char*, bool> checked;
  auto known = checked.find(op);
  if (known != checked.end()) return known->second;
  const OpDecl* d = find_decl(op);
  if (!d) fail(std::string("record: op '") + op + "' was never declared with GRAFT_DECLARE_OP");
  return checked.emplace(op, d->double_backward).first->second;
}
}  // namespace

namespace {
// Whether a saved tensor on the graph holds `storage`: an op that saves input k itself beside a
// copy of it (for a fast path) reads the input under create_graph.
bool saved_on_graph(const Tensors& saved, const Storage* storage) {
  for (const Tensor& t : saved)
    if (t.defined() && t.requires_grad() && t.impl()->storage.get() == storage) return true;
  return false;
}

// Whether storage `st` is a copy made off the tape (Storage::copied_from) of `source`, directly
// or through other copies.
bool copied_from(const Storage& st, const Storage* source) {
  for (const std::weak_ptr<Storage>& w : st.copied_from)
    if (w.lock().get() == source) return true;
  return false;
}

// What goes wrong under create_graph when an op saves, instead of input k (which requires grad),
// an untracked copy of it (kern::contig, contiguous_copy, cast_copy) or an untracked view of its
// storage: the backward reads values off the graph, so the second derivative through them is
// lost, silently. "" when no saved tensor is such a copy or view, or the input is saved too.
std::string untracked_saved(const Tensors& inputs, const Tensors& saved) {
  for (size_t s = 0; s < saved.size(); ++s) {
    if (!saved[s].defined() || saved[s].requires_grad()) continue;
    const Storage* st = saved[s].impl()->storage.get();
    for (size_t k = 0; k < inputs.size(); ++k) {
      const Tensor& x = inputs[k];
      if (!x.defined() || !x.requires_grad()) continue;
      const Storage* xs = x.impl()->storage.get();
      const bool copy = copied_from(*st, xs), view = st == xs;
      if ((!copy && !view) || saved_on_graph(saved, xs)) continue;
      const std::string how =
          copy ? std::string("copy of input ") + std::to_string(k) + " (" + st->copied_by + ")"
               : "view of input " + std::to_string(k);
      return "saved tensor " + std::to_string(s) + " is an untracked " + how +
             "; under create_graph its second derivative would be lost: save the input (or a "
             "recorded op of it)";
    }
  }
  return {};
}
// The entry keeps `saved` for its backward: their versions (checked against in-place writes),
// and whether one is an untracked copy of an input (refused under create_graph).
void keep_saved(Entry& e, const Tensors& inputs, Tensors saved) {
  for (auto& s : saved) e.saved_versions.push_back(s.defined() ? s.version() : 0);
  if (e.double_backward) e.untracked_saved = untracked_saved(inputs, saved);
  e.saved = std::move(saved);
  mark_saved(e, true);
}
}  // namespace

void record(const char* op, const Tensors& inputs, const Tensors& outputs, Tensors saved,
            const std::vector<KeptBuffer>& kept, BackwardFn fn) {
  const bool double_backward = declared_double_backward(op);
  if (t_anomaly) check_forward(op, inputs, outputs);
  Entry e;
  e.op = op;
  e.order = t_record_order;
  e.double_backward = double_backward;
  if (keeping_paths()) e.path = name_scope_path();
  for (auto& t : inputs) {
    Route r;
    if (t.defined()) {
      TensorImpl* ti = t.impl();
      r.shape = t.shape();
      r.dtype = t.dtype();
      r.needs = ti->requires_grad;
      if (link(ti).index >= 0) {
        check_this_thread(ti, std::string("record: input ") + std::to_string(e.inputs.size()) +
                                  " of '" + op + "'");
        if (from_old_epoch(ti))
          already_freed(std::string("the tape entry that produced input ") +
                        std::to_string(e.inputs.size()) + " of '" + op + "'");
        r.index = link(ti).index;
        r.slot = link(ti).slot;
      } else if (ti->requires_grad) {
        r.leaf = t.impl_ptr();
      }
    }
    e.inputs.push_back(std::move(r));
  }
  keep_saved(e, inputs, std::move(saved));
  for (const KeptBuffer& k : kept) {
    e.kept.push_back(k.buffer);
    const auto& src = k.source.impl()->storage;
    e.kept_sources.emplace_back(src, src->version);
  }
  e.fn = std::move(fn);
  const int64_t index = (int64_t)t_tape.entries.size();
  int slot = 0;
  for (auto& o : outputs) {
    e.out_shapes.push_back(o.shape());
    e.out_dtypes.push_back(o.dtype());
    TensorImpl* oi = o.impl();
    oi->requires_grad = is_floating(o.dtype());
    link(oi).index = index;
    link(oi).tape_id = t_tape.id;
    link(oi).epoch = t_tape.epoch;
    link(oi).slot = slot++;
  }
  t_tape.entries.push_back(std::move(e));
  ++t_tape.live;
  if (t_profile.on) {
    const auto now = ProfileClock::now();
    OpTime& o = t_profile.ops[op];
    ++o.calls;
    o.forward_s += std::chrono::duration<double>(now - t_profile.last).count();
    t_profile.last = now;
  }
}

namespace {

// A gradient being summed: `owned` says the buffer is ours, so a later arrival may be added into
// it in place (a backward may hand the same buffer to several inputs: add passes dout through).
struct Grad {
  Tensor sum;
  bool owned = false;
};

// One reverse pass over the entries [bottom, top]. backward() fills leaves' .grad; grad()
// captures the gradients of its inputs (targets) and runs only the entries between them and the
// outputs; differentiate() (an op's backward under create_graph) also stops at its targets. The
// gradients arriving at each entry's outputs belong to the pass, so a pass may run inside
// another's backward.
struct Pass {
  bool retain = false, create = false;
  int64_t top = -1, bottom = 0;
  size_t first_new = 0;  // entries recorded by this pass (create_graph) start here
  bool capture = false, stop_at_targets = false;
  std::unordered_map<const TensorImpl*, size_t> leaf_target;
  std::map<std::pair<int64_t, int>, size_t> entry_target;  // (entry, slot) of a non-leaf input
  std::vector<char> relevant;  // capture: entry bottom + i leads to a target
  std::vector<Grad> captured;
  std::vector<std::vector<Grad>> pending;  // per entry from bottom: the gradients of its outputs
  std::vector<std::vector<TensorImpl*>> ready_at;

  std::vector<Grad>& pending_of(int64_t i) {
    std::vector<Grad>& g = pending[(size_t)(i - bottom)];
    if (g.empty()) g.resize(t_tape.entries[i].out_shapes.size());
    return g;
  }
  bool is_relevant(int64_t i) const { return i >= bottom && relevant[(size_t)(i - bottom)]; }
};

// sum += g. Under create_graph the sum is recorded; otherwise it is accumulated in place, into a
// copy first when the buffer is not ours.
void add_gradient(Grad& s, const Tensor& g, bool create) {
  if (!s.sum.defined()) {
    s.sum = g;
    s.owned = false;
  } else if (create) {
    s.sum = accumulate_grad(s.sum, g);
    s.owned = false;
  } else {
    if (!s.owned) {
      s.sum = contiguous_copy(s.sum);
      s.owned = true;
    }
    accumulate_into(s.sum, g);
  }
}

// A gradient nobody else holds (one handle, one view of a whole contiguous storage) can become a
// leaf's .grad as is, without a copy.
bool sole_owner(const Tensor& g) {
  const TensorImpl* t = g.impl();
  return g.impl_ptr().use_count() == 1 && t->storage.use_count() == 1 && t->offset == 0 &&
         g.is_contiguous() && t->storage->nbytes == (size_t)g.numel() * dtype_size(g.dtype());
}

// .grad += g (a leaf's, or a retain_grad() output's). Under create_graph it keeps g's graph, in a
// buffer of its own (the same gradient may reach two leaves: add hands dout to both). A .grad on a
// graph is never added to in place (its entries may have saved it): the sum is a new tensor.
void add_to_grad(std::shared_ptr<TensorImpl>& grad, const Tensor& g, bool create, bool may_keep) {
  if (!grad && create) {
    grad = (sole_owner(g) ? g : expand_grad(g, g.shape())).impl_ptr();
  } else if (!grad) {
    grad = may_keep && sole_owner(g) ? g.impl_ptr() : contiguous_copy(g).impl_ptr();
  } else if (create) {
    grad = accumulate_grad(Tensor(grad), g).impl_ptr();
  } else if (grad->requires_grad) {
    Tensor sum = contiguous_copy(Tensor(grad));
    accumulate_into(sum, g);
    grad = sum.impl_ptr();
  } else {
    accumulate_into(Tensor(grad), g);
  }
}

// Hands gradient g to where its input came from: the producing entry's pending gradient, the
// leaf's .grad (backward()) or the captured gradient of a target (grad()).
void route_gradient(Pass& p, const Route& r, const Tensor& g) {
  if (r.index >= 0) {
    add_gradient(p.pending_of(r.index)[r.slot], g, p.create);
  } else if (r.leaf && p.capture) {
    auto it = p.leaf_target.find(r.leaf.get());
    if (it != p.leaf_target.end()) add_gradient(p.captured[it->second], g, p.create);
  } else if (r.leaf) {
    add_to_grad(r.leaf->grad, g, p.create, true);
  }
}

// ready_at[i]: the leaves whose earliest use is entry i, so their gradient is complete once
// entry i has run (or been passed over). In tape order, so every rank of a data-parallel job
// sees the same sequence.
std::vector<std::vector<TensorImpl*>> leaves_ready_at(int64_t top) {
  std::unordered_map<TensorImpl*, int64_t> first;
  std::vector<TensorImpl*> order;
  for (int64_t i = 0; i <= top; ++i)
    for (const Route& r : t_tape.entries[i].inputs)
      if (r.leaf && r.needs && first.emplace(r.leaf.get(), i).second) order.push_back(r.leaf.get());
  std::vector<std::vector<TensorImpl*>> ready_at((size_t)top + 1);
  for (TensorImpl* leaf : order) ready_at[(size_t)first[leaf]].push_back(leaf);
  return ready_at;
}

void fire_ready(const Pass& p, int64_t i) {
  if (p.ready_at.empty()) return;
  for (TensorImpl* leaf : p.ready_at[(size_t)i]) t_grad_ready(leaf);
}

// Adds the complete gradients of e's outputs that called retain_grad() to their .grad (the pending
// gradients, before the entry's backward runs; an output that no gradient reached gets none).
void keep_retained(const Entry& e, const std::vector<Grad>& pend, bool create) {
  for (size_t k = 0; k < e.retained.size(); ++k) {
    const std::shared_ptr<TensorImpl> t = e.retained[k].lock();
    if (t && pend[k].sum.defined()) add_to_grad(t->grad, pend[k].sum, create, false);
  }
}

// grad(): the complete gradients of the targets that entry i produced, taken before it runs (and,
// when the pass stops at targets, taken away).
void capture_outputs(Pass& p, int64_t i, std::vector<Grad>& pend) {
  for (size_t k = 0; k < pend.size(); ++k) {
    auto it = p.entry_target.find({i, (int)k});
    if (it == p.entry_target.end() || !pend[k].sum.defined()) continue;
    add_gradient(p.captured[it->second], pend[k].sum, p.create);
    if (p.stop_at_targets) pend[k] = Grad();
  }
}

bool is_target(const Pass& p, const Route& r) {
  return r.leaf ? p.leaf_target.count(r.leaf.get()) > 0
                : p.entry_target.count({r.index, r.slot}) > 0;
}

// Whether route r can carry a gradient the pass wants: every one for backward(); for grad(), one
// that reaches a target (directly, or through an entry that leads to one, unless the pass stops
// at targets and r is one).
bool wanted(const Pass& p, const Route& r) {
  if (!r.needs) return false;
  if (!p.capture) return true;
  if (is_target(p, r)) return true;
  return r.index >= 0 && p.is_relevant(r.index);
}

// The pending gradients of an entry made whole: zeros where none arrived, contiguous (a recorded
// copy under create_graph, so the copy stays on the graph).
Tensors take_pending(const Entry& e, std::vector<Grad>& pend, bool create) {
  Tensors dout(pend.size());
  for (size_t k = 0; k < pend.size(); ++k) {
    Tensor& d = dout[k];
    d = std::move(pend[k].sum);
    if (!d.defined()) d = zeros(e.out_shapes[k], e.out_dtypes[k]);
    else if (!d.is_contiguous()) d = create ? expand_grad(d, d.shape()) : contiguous_copy(d);
  }
  pend.clear();
  return dout;
}

// An op declared without a double backward, run under create_graph: its gradients (computed
// without recording) become the outputs of an entry whose backward is the error, so asking for
// the next derivative names the op and the order.
void record_no_double_backward(const Entry& e, const Tensors& dout, const Tensors& saved,
                               Tensors& dins) {
  Tensors from;
  for (const Tensor& d : dout)
    if (d.requires_grad()) from.push_back(d);
  for (const Tensor& s : saved)
    if (s.defined() && s.requires_grad()) from.push_back(s);
  Tensors outs;
  for (Tensor& g : dins) {
    if (!g.defined() || !is_floating(g.dtype())) continue;
    g = Tensor::view_of(g, g.shape(), g.strides(), g.offset());  // a fresh handle of its own
    outs.push_back(g);
  }
  if (from.empty() || outs.empty()) return;
  const std::string msg =
      ordinal(t_record_order) + " backward of '" + e.op + "': '" + e.op +
      "' was declared without a double backward (GRAFT_DECLARE_OP_ONCE_DIFFERENTIABLE); "
      "its gradients cannot be differentiated again";
  record(e.op, from, outs, {}, [msg](const Ctx&, const Tensors&) -> Tensors { fail(msg); });
}

// Sets the order of what record() records for a scope (see t_record_order).
struct RecordOrder {
  int prev;
  explicit RecordOrder(int order) : prev(t_record_order) { t_record_order = order; }
  ~RecordOrder() { t_record_order = prev; }
};

// Runs entry i's backward on its pending gradients and routes what it returns.
void run_entry(Pass& p, int64_t i, std::vector<Grad>& pend) {
  Entry& e = t_tape.entries[i];  // a deque: stays valid while the backward records new entries
  // What this entry's backward records, and the engine's sums and copies of its gradients under
  // create_graph, are the next derivative.
  const RecordOrder order(e.order + 1);
  if (e.freed) already_freed(e.op);
  check_saved(e, p.create);
  if (!e.retained.empty()) keep_retained(e, pend, p.create);
  Tensors dout = take_pending(e, pend, p.create);
  Ctx ctx;
  ctx.last_use = !p.retain;
  ctx.create_graph = p.create;
  ctx.order = e.order;
  // On the last use the entry gives its saved tensors away (see can_overwrite).
  if (p.retain) {
    ctx.saved = e.saved;
  } else {
    mark_saved(e, false);
    ctx.saved = std::move(e.saved);
  }
  ctx.kept = e.kept;
  for (auto& r : e.inputs) ctx.needs.push_back(wanted(p, r));
  const auto t0 = t_profile.on ? ProfileClock::now() : ProfileClock::time_point();
  Tensors dins;
  if (p.create && !e.double_backward) {
    {
      NoGrad ng;
      dins = e.fn(ctx, dout);
    }
    record_no_double_backward(e, dout, ctx.saved, dins);
  } else {
    dins = e.fn(ctx, dout);
  }
  if (t_profile.on) {
    t_profile.ops[e.op].backward_s +=
        std::chrono::duration<double>(ProfileClock::now() - t0).count();
    t_profile.last = ProfileClock::now();
  }
  if (t_anomaly) check_backward(e, dins, p.create);
  ctx.saved.clear();  // a gradient handed out in a saved buffer is then held by dins alone
  dout.clear();
  // Without retain_graph the entry's saved activations go as soon as its backward has run,
  // so memory falls during backward instead of peaking with every gradient on top.
  if (!p.retain) free_entry(e);
  if (dins.size() != e.inputs.size())
    fail(backward_of(e, p.create) + ": returned " + std::to_string(dins.size()) +
         " gradients for " + std::to_string(e.inputs.size()) + " inputs");
  for (size_t k = 0; k < dins.size(); ++k) {
    const Route& r = e.inputs[k];
    Tensor& g = dins[k];
    if (!ctx.needs[k] || !g.defined()) continue;
    // A gradient of a shape the input was broadcast to is summed back here, once for every
    // op (add, mul, where, the attention bias...); any other mismatch is a bug in the op.
    if (g.dtype() != r.dtype || !broadcasts_to(r.shape, g.shape()))
      fail(backward_of(e, p.create) + ": gradient for input " + std::to_string(k) + " is " +
           describe(g) + " but the input is " + describe(r.dtype, r.shape));
    if (g.shape() != r.shape) g = p.create ? reduce_grad(g, r.shape) : sum_to_shape(g, r.shape);
    route_gradient(p, r, g);
  }
}

void run_backward(Pass& p) {
  for (int64_t i = p.top; i >= p.bottom; --i) {
    std::vector<Grad>& pend = p.pending[(size_t)(i - p.bottom)];
    bool any = false;
    for (auto& g : pend) any |= g.sum.defined();
    if (any && p.capture) {
      capture_outputs(p, i, pend);
      any = false;
      for (auto& g : pend) any |= g.sum.defined();
      if (!p.is_relevant(i)) any = false;
    }
    if (any) run_entry(p, i, pend);
    pend = std::vector<Grad>();
    fire_ready(p, i);
  }
}

// Frees the entries a pass ran through (all of [bottom, top] when it failed, since it leaves
// half-routed gradients behind) and, on failure, the entries it recorded.
void free_after(const Pass& p, bool failed) {
  if (failed)
    for (size_t i = t_tape.entries.size(); i-- > p.first_new;) free_entry(t_tape.entries[i]);
  if (failed || !p.retain)
    for (int64_t i = p.top; i >= p.bottom; --i) free_entry(t_tape.entries[i]);
  compact_if_empty();
}

// Seeds the pending gradient of a non-leaf output.
void seed(Pass& p, const Tensor& out, const Tensor& g) {
  add_gradient(p.pending_of(link(out.impl()).index)[link(out.impl()).slot], g, p.create);
}

// The gradient an output is seeded with: `g`, or ones for a one-element output. `caller` and
// `name` ("backward", "root") name them in errors.
Tensor seed_for(const Tensor& out, const Tensor& g, const std::string& caller,
                const std::string& name) {
  if (!g.defined()) {
    if (out.numel() != 1)
      fail(caller + ": " + name + " " + describe(out) +
           " is not a scalar; pass an upstream gradient of the same shape");
    return full(out.shape(), 1.0, out.dtype());
  }
  if (g.shape() != out.shape() || g.dtype() != out.dtype())
    fail(caller + ": upstream gradient " + describe(g) + " does not match " + name + " " +
         describe(out));
  return g;
}

// Fails unless `t` is an op output whose graph is still there, or a leaf.
void check_live(const TensorImpl* t, const std::string& what) {
  check_this_thread(t, what);
  if (link(t).index < 0) return;
  if (from_old_epoch(t)) already_freed(what + ": the tape entry that produced it");
  if (t_tape.entries[link(t).index].freed) already_freed(t_tape.entries[link(t).index].op);
}

// Runs a pass, freeing what it must when it ends or fails. Grad mode is on under create_graph
// (the backward records), off otherwise.
void run_pass(Pass& p) {
  p.first_new = t_tape.entries.size();
  p.pending.resize((size_t)(p.top - p.bottom + 1));
  const bool prev = t_grad_enabled;
  t_grad_enabled = p.create;
  try {
    run_backward(p);
  } catch (...) {
    t_grad_enabled = prev;
    free_after(p, true);
    throw;
  }
  t_grad_enabled = prev;
  free_after(p, false);
}

}  // namespace

void backward(const Tensor& root, const Tensor& grad, bool retain_graph, bool create_graph) {
  if (!root.defined()) fail("backward: called on an undefined tensor");
  if (!root.requires_grad())
    fail("backward: tensor " + describe(root) +
         " does not require grad (no input of the ops that made it requires grad)");
  const Tensor g = seed_for(root, grad, "backward", "root");
  TensorImpl* ri = root.impl();
  check_live(ri, "backward: the root " + describe(root));
  if (link(ri).index < 0) {  // a leaf: its gradient is the seed itself
    add_to_grad(ri->grad, g, create_graph, false);
    return;
  }
  Pass p;
  p.create = create_graph;
  p.retain = retain_graph || create_graph;
  p.top = link(ri).index;
  if (t_grad_ready) p.ready_at = leaves_ready_at(p.top);
  p.pending.resize((size_t)p.top + 1);
  seed(p, root, g);
  run_pass(p);
}

namespace {

// grad() and differentiate(): checks the inputs and marks them as the pass's targets; the
// entries in [bottom, top] that lead to one become relevant. An input given twice is a target
// once, at its first position.
void mark_targets(Pass& p, const Tensors& inputs, const char* caller) {
  for (size_t k = 0; k < inputs.size(); ++k) {
    const std::string what = std::string(caller) + ": input " + std::to_string(k);
    if (!inputs[k].defined()) fail(what + " is an undefined tensor");
    if (!inputs[k].requires_grad())
      fail(what + " " + describe(inputs[k]) + " does not require grad");
    check_live(inputs[k].impl(), what);
    const TensorImpl* t = inputs[k].impl();
    if (link(t).index < 0) p.leaf_target.emplace(t, k);
    else p.entry_target.emplace(std::make_pair(link(t).index, link(t).slot), k);
  }
  p.captured.assign(inputs.size(), Grad());
  if (p.top < 0) return;
  p.relevant.assign((size_t)(p.top - p.bottom + 1), 0);
  for (int64_t i = p.bottom; i <= p.top; ++i)
    for (const Route& r : t_tape.entries[i].inputs)
      if (wanted(p, r)) {
        p.relevant[(size_t)(i - p.bottom)] = 1;
        break;
      }
}

// Seeds the outputs of a capturing pass and runs it; returns the captured gradients, one per
// input (undefined where none arrived).
Tensors run_capture(Pass& p, const Tensors& outputs, const Tensors& seeds, const Tensors& inputs) {
  if (p.top >= 0) p.pending.resize((size_t)(p.top - p.bottom + 1));
  for (size_t k = 0; k < outputs.size(); ++k) {
    const TensorImpl* t = outputs[k].impl();
    // An output that is itself an input: its seed is (part of) that input's gradient, and a pass
    // that stops at targets goes no further with it.
    const auto leaf = p.leaf_target.find(t);
    const auto entry = link(t).index >= 0 ? p.entry_target.find({link(t).index, link(t).slot})
                                          : p.entry_target.end();
    if (p.stop_at_targets && entry != p.entry_target.end())
      add_gradient(p.captured[entry->second], seeds[k], p.create);
    else if (link(t).index >= 0) seed(p, outputs[k], seeds[k]);
    else if (leaf != p.leaf_target.end())
      add_gradient(p.captured[leaf->second], seeds[k], p.create);
  }
  if (p.top >= 0) run_pass(p);
  Tensors out(inputs.size());
  for (size_t k = 0; k < inputs.size(); ++k) {
    out[k] = p.captured[k].sum;
    if (out[k].defined() && !p.create && !p.captured[k].owned) out[k] = contiguous_copy(out[k]);
  }
  return out;
}

}  // namespace

Tensors grad(const Tensors& outputs, const Tensors& inputs, const Tensors& grad_outputs,
             const GradOptions& opt) {
  if (outputs.empty()) fail("grad: no outputs given");
  if (inputs.empty()) fail("grad: no inputs given");
  if (!grad_outputs.empty() && grad_outputs.size() != outputs.size())
    fail("grad: " + std::to_string(grad_outputs.size()) + " grad_outputs for " +
         std::to_string(outputs.size()) + " outputs");
  Pass p;
  p.capture = true;
  p.create = opt.create_graph;
  p.retain = opt.retain_graph || opt.create_graph;
  Tensors seeds;
  for (size_t k = 0; k < outputs.size(); ++k) {
    const std::string what = "grad: output " + std::to_string(k);
    if (!outputs[k].defined()) fail(what + " is an undefined tensor");
    if (!outputs[k].requires_grad())
      fail(what + " " + describe(outputs[k]) +
           " does not require grad (no input of the ops that made it requires grad)");
    check_live(outputs[k].impl(), what);
    seeds.push_back(seed_for(outputs[k], grad_outputs.empty() ? Tensor() : grad_outputs[k], "grad",
                             "output " + std::to_string(k)));
    p.top = std::max(p.top, link(outputs[k].impl()).index);
  }
  mark_targets(p, inputs, "grad");
  Tensors out = run_capture(p, outputs, seeds, inputs);
  for (size_t k = 0; k < inputs.size(); ++k) {
    for (size_t j = 0; j < k && !out[k].defined();
         ++j)  // an input given twice gets one gradient at both
      if (inputs[j].impl() == inputs[k].impl()) out[k] = out[j];
    if (!out[k].defined() && !opt.allow_unused)
      fail("grad: input " + std::to_string(k) + " " + describe(inputs[k]) +
           " is not reached from the outputs (pass allow_unused to get an undefined gradient)");
  }
  return out;
}

Tensors differentiate(const std::function<Tensors(const Tensors&)>& forward, const Tensors& inputs,
                      const Tensors& dout, const std::vector<bool>& needs) {
  if (!t_grad_enabled)
    fail("differentiate: called with grad mode off (it belongs in a backward under create_graph)");
  Tensors targets;
  std::vector<size_t> at;
  for (size_t k = 0; k < inputs.size(); ++k)
    if (k < needs.size() && needs[k] && inputs[k].defined() && inputs[k].requires_grad()) {
      targets.push_back(inputs[k]);
      at.push_back(k);
    }
  Tensors result(inputs.size());
  if (targets.empty()) return result;
  const size_t first = t_tape.entries.size();
  const Tensors outs = forward(inputs);
  if (outs.size() != dout.size())
    fail("differentiate: the forward returned " + std::to_string(outs.size()) + " outputs for " +
         std::to_string(dout.size()) + " gradients");
  Pass p;
  p.capture = true;
  p.stop_at_targets = true;
  p.create = true;
  p.retain = true;
  p.bottom = (int64_t)first;
  for (const Tensor& t : targets)
    if (link(t.impl()).index >= 0) p.bottom = std::min(p.bottom, link(t.impl()).index);
  // The outputs the forward recorded, and any that is one of the inputs returned as is.
  auto is_input = [&](const Tensor& o) {
    for (const Tensor& t : targets)
      if (t.impl() == o.impl()) return true;
    return false;
  };
  Tensors seeds, seeded;
  for (size_t k = 0; k < outs.size(); ++k) {
    if (!outs[k].defined() || !outs[k].requires_grad()) continue;
    const int64_t at_index = link(outs[k].impl()).index;
    const bool recorded = at_index >= 0 && (size_t)at_index >= first;
    if (!recorded && !is_input(outs[k])) continue;
    seeded.push_back(outs[k]);
    seeds.push_back(dout[k]);
    if (recorded) p.top = std::max(p.top, at_index);
  }
  if (seeded.empty()) return result;
  if (p.top < 0) p.bottom = 0;  // nothing recorded: no pass, the inputs' seeds are all
  mark_targets(p, targets, "differentiate");
  const Tensors got = run_capture(p, seeded, seeds, targets);
  for (size_t j = 0; j < at.size(); ++j) result[at[j]] = got[j];
  return result;
}

// ---- the engine's own ops (create_graph) ------------------------------------------------------

GRAFT_DECLARE_OP("accumulate_grad", "autograd");
GRAFT_DECLARE_OP("reduce_grad", "autograd");
GRAFT_DECLARE_OP("expand_grad", "autograd");

namespace {
void check_grad_arg(const char* op, const Tensor& t) {
  check_defined(t, op, "the gradient");
  if (!is_floating(t.dtype()))
    fail(std::string(op) + ": expected a float tensor, got " + describe(t));
}
}  // namespace

// accumulate_grad: a + b, both of one shape and dtype; da = db = dout.
Tensor accumulate_grad(const Tensor& a, const Tensor& b) {
  check_grad_arg("accumulate_grad", a);
  check_grad_arg("accumulate_grad", b);
  if (a.shape() != b.shape() || a.dtype() != b.dtype())
    fail("accumulate_grad: " + describe(a) + " + " + describe(b) + ": shapes or dtypes differ");
  Tensor out = contiguous_copy(a);
  accumulate_into(out, b);
  if (needs_record({a, b}))
    record("accumulate_grad", {a, b}, {out}, {}, [](const Ctx&, const Tensors& dout) {
      return Tensors{dout[0], dout[0]};
    });
  return out;
}

// reduce_grad: g summed down to `shape`; dg = dout expanded back to g's shape.
Tensor reduce_grad(const Tensor& g, const Shape& shape) {
  check_grad_arg("reduce_grad", g);
  if (!broadcasts_to(shape, g.shape()))
    fail("reduce_grad: cannot reduce " + describe(g) + " to shape " + shape_str(shape));
  Tensor out = g.shape() == shape ? contiguous_copy(g) : sum_to_shape(g, shape);
  if (needs_record({g}))
    record("reduce_grad", {g}, {out}, {}, [from = g.shape()](const Ctx&, const Tensors& dout) {
      return Tensors{expand_grad(dout[0], from)};
    });
  return out;
}

// expand_grad: g copied out to the contiguous `shape` it broadcasts to; dg = dout summed back.
Tensor expand_grad(const Tensor& g, const Shape& shape) {
  check_grad_arg("expand_grad", g);
  if (!broadcasts_to(g.shape(), shape))
    fail("expand_grad: cannot broadcast " + describe(g) + " to shape " + shape_str(shape));
  Shape strides(shape.size(), 0);
  const size_t lead = shape.size() - g.shape().size();
  for (size_t d = 0; d < g.shape().size(); ++d)
    strides[lead + d] = g.shape()[d] == 1 && shape[lead + d] != 1 ? 0 : g.strides()[d];
  Tensor out = contiguous_copy(Tensor::view_of(g, shape, strides, g.offset()));
  if (needs_record({g}))
    record("expand_grad", {g}, {out}, {}, [from = g.shape()](const Ctx&, const Tensors& dout) {
      return Tensors{reduce_grad(dout[0], from)};
    });
  return out;
}

size_t tape_size() { return t_tape.live; }

void retain_grad(const Tensor& t) {
  check_defined(t, "retain_grad", "the tensor");
  TensorImpl* ti = t.impl();
  if (link(ti).index < 0) {
    if (!ti->requires_grad)
      fail("retain_grad: tensor " + describe(t) +
           " does not require grad (a leaf needs requires_grad_() first)");
    return;  // a leaf that requires grad keeps its gradient anyway
  }
  check_this_thread(ti, "retain_grad: the tensor " + describe(t));
  if (from_old_epoch(ti) || t_tape.entries[link(ti).index].freed)
    fail("retain_grad: the tape entry that produced " + describe(t) +
         " was already freed by a backward()");
  Entry& e = t_tape.entries[link(ti).index];
  if (e.retained.empty()) e.retained.resize(e.out_shapes.size());
  e.retained[link(ti).slot] = t.impl_ptr();
}

GradReadyScope::GradReadyScope(GradReadyHook hook) : prev_(std::move(t_grad_ready)) {
  t_grad_ready = std::move(hook);
}
GradReadyScope::~GradReadyScope() { t_grad_ready = std::move(prev_); }

void clear_tape() {
  for (auto& e : t_tape.entries) free_entry(e);
  compact_if_empty();
}

}  // namespace graft::autograd
