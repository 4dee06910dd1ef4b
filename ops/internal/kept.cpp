#include "ops/internal/kept.h"

#include <fstream>
#include <map>
#include <mutex>
#include <set>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "ops/internal/kernels.h"

namespace graft::kern {

namespace {

struct Replaced {
  std::weak_ptr<Storage> source;
  KeptForm form;
};
std::mutex replaced_mutex;
std::map<const Storage*, Replaced>& replaced() {
  static auto* m = new std::map<const Storage*, Replaced>;  // never destroyed, as the caches
  return *m;
}

#if defined(__linux__)
// Whether the system backs memory that asks for them (madvise) with 2 MiB pages: transparent huge
// pages not set to "never" (nor missing).
bool huge_pages_given() {
  static const bool given = [] {
    std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string line;
    return std::getline(f, line) && line.find("[never]") == std::string::npos;
  }();
  return given;
}

// Asks for 2 MiB pages over the whole 2 MiB pages inside [p, p + n) (memory not touched yet);
// the byte range [from, to) of them relative to p that will have them, empty where none will.
std::pair<size_t, size_t> ask_huge_pages(void* p, size_t n) {
  constexpr uintptr_t kHuge = uintptr_t(2) << 20;
  const uintptr_t at = reinterpret_cast<uintptr_t>(p), a = (at + kHuge - 1) & ~(kHuge - 1),
                  e = (at + n) & ~(kHuge - 1);
  if (e <= a || !huge_pages_given() || madvise(reinterpret_cast<void*>(a), e - a, MADV_HUGEPAGE))
    return {0, 0};
  return {a - at, e - at};
}
#else
std::pair<size_t, size_t> ask_huge_pages(void*, size_t) { return {0, 0}; }
#endif

// The storage holding what the inference linears read of w: w's own, or its kept form's when
// that form has a storage of its own (null otherwise: a packed block, or none).
std::shared_ptr<Storage> values_storage(const Tensor& w, std::map<const Storage*, int>& users) {
  const std::shared_ptr<Storage>& src = w.impl()->storage;
  if (src->data) return src;
  std::lock_guard<std::mutex> lock(replaced_mutex);
  auto it = replaced().find(src.get());
  if (it == replaced().end() || it->second.source.expired()) return nullptr;
  const std::shared_ptr<Storage>& form = it->second.form.data;
  return ++users[form.get()] == 1 ? form : nullptr;
}

}  // namespace

HugeBlock huge_block(size_t total, const std::string& who, bool host) {
  Storage::release_cached();
  constexpr size_t kHuge = size_t(2) << 20;
  const size_t slack = total >= kHuge ? 2 * kHuge : 0;
  if (total > SIZE_MAX - slack) fail(who + ": the weights' bytes overflow");
  HugeBlock b;
  b.data = host ? Storage::host_block(total + slack) : std::make_shared<Storage>(total + slack);
  b.shift = slack ? (kHuge - reinterpret_cast<uintptr_t>(b.data->data) % kHuge) % kHuge : 0;
  std::tie(b.huge_from, b.huge_to) =
      ask_huge_pages(b.at(0), slack ? (total + kHuge - 1) / kHuge * kHuge : total);
  return b;
}

size_t keep_together(const std::vector<std::pair<std::string, Tensor>>& weights) {
  std::map<const Storage*, int> users;  // forms met: one met twice is a packed block
  std::vector<std::shared_ptr<Storage>> moving;
  std::set<const Storage*> seen;
  for (const auto& [name, w] : weights) {
    auto s = values_storage(w, users);
    if (s && !s->host && seen.insert(s.get()).second) moving.push_back(s);
  }
  std::erase_if(moving, [&](const auto& s) { return users.count(s.get()) && users[s.get()] > 1; });
  size_t total = 0;
  std::vector<size_t> at;
  for (const auto& s : moving) {
    at.push_back((total + 63) / 64 * 64);
    if (at.back() < total || s->nbytes > SIZE_MAX - at.back())
      fail("keep_together: the weights' bytes overflow");
    total = at.back() + s->nbytes;
  }
  if (total < (size_t(2) << 20)) return 0;
  const HugeBlock block = huge_block(total, "keep_together", /*host=*/true);
  for (size_t i = 0; i < moving.size(); ++i) moving[i]->move_into(block.data, block.shift + at[i]);
  return total;
}

void check_whole_storage(const Tensor& w, const std::string& who, const std::string& name) {
  const std::shared_ptr<Storage>& src = w.impl()->storage;
  if (w.offset() != 0 || (size_t)w.numel() * dtype_size(w.dtype()) != src->nbytes)
    fail(who + ": " + name + " " + describe(w) + " is a view of a larger storage; freeing its " +
         dtype_name(w.dtype()) + " values would free the rest");
}

void forget_dead_forms() {
  std::lock_guard<std::mutex> lock(replaced_mutex);
  std::erase_if(replaced(), [](const auto& kv) { return kv.second.source.expired(); });
}

size_t replace_weight(const Tensor& w, const KeptForm& form, const std::string& why) {
  const std::shared_ptr<Storage>& src = w.impl()->storage;
  const size_t freed = src->data ? src->nbytes : 0;  // none for a model built without memory
  ++src->version;  // copies made from the float32 values before are dropped at the next miss
  forget_dead_forms();
  {
    std::lock_guard<std::mutex> lock(replaced_mutex);
    replaced()[src.get()] = Replaced{src, form};
  }
  src->release(why);
  return freed;
}

std::optional<OutInnermost> out_innermost(const dnnl::memory::desc& d) {
  const auto& m = d.data;
  if (m.format_kind != dnnl_blocked || m.ndims != 2 || m.data_type != dnnl_f32) return std::nullopt;
  const auto& bl = m.format_desc.blocking;
  OutInnermost f{0, 1, bl.strides[0], bl.strides[1]};
  if (bl.inner_nblks == 0 && bl.strides[0] == 1) f = {64, 1, 64, bl.strides[1], false};
  else if (bl.inner_nblks == 1 && bl.inner_idxs[0] == 0) f.OB = bl.inner_blks[0];
  else if (bl.inner_nblks == 2 && bl.inner_idxs[0] == 1 && bl.inner_idxs[1] == 0)
    f.IB = bl.inner_blks[0], f.OB = bl.inner_blks[1];
  else return std::nullopt;
  return f;
}

int64_t blocked_offset(const dnnl::memory::desc& d, int64_t i0, int64_t i1) {
  const auto& b = d.data.format_desc.blocking;
  const int64_t pos[2] = {i0, i1};
  int64_t block[2] = {1, 1};
  for (int i = 0; i < b.inner_nblks; ++i) block[b.inner_idxs[i]] *= b.inner_blks[i];
  int64_t off = d.data.offset0, inner = 0, within[2] = {1, 1};
  for (int i = 0; i < 2; ++i) off += pos[i] / block[i] * b.strides[i];
  for (int i = b.inner_nblks - 1, step = 1; i >= 0; step *= (int)b.inner_blks[i], --i) {
    const int dim = b.inner_idxs[i];
    inner += (pos[dim] % block[dim]) / within[dim] % b.inner_blks[i] * step;
    within[dim] *= b.inner_blks[i];
  }
  return off + inner;
}

void gather_kept_rows(const KeptForm& k, int64_t first, const int64_t* ids, int64_t N, float* out) {
  if (k.dtype != DType::f32 || k.layout.data.format_kind != dnnl_blocked)
    fail("embedding: the table's kept form (layout tag " + std::to_string(k.tag) +
         ") is not a float32 blocked layout");
  const float* w = static_cast<const float*>(k.bytes());
  const int64_t IN = k.IN;
#pragma omp parallel for schedule(static) if (N * IN >= 65536)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < IN; ++i)
      out[n * IN + i] = w[blocked_offset(k.layout, first + ids[n], i)];
}

const KeptForm* kept_form(const Tensor& w, DType dtype) {
  const std::shared_ptr<Storage>& src = w.impl()->storage;
  if (src->data) return nullptr;
  std::lock_guard<std::mutex> lock(replaced_mutex);
  auto it = replaced().find(src.get());
  // The entry's source is src itself (not a dead storage at the same address): the same owner.
  const auto& source = it == replaced().end() ? std::weak_ptr<Storage>() : it->second.source;
  if (it == replaced().end() || source.owner_before(src) || src.owner_before(source) ||
      it->second.form.dtype != dtype)
    return nullptr;
  const KeptForm& f = it->second.form;
  // Only whole rows of the kept weight are in the form: a reshaped or column-cut view of its
  // storage is not (its float32 values are gone, so the freed-weight error names it).
  if (w.dim() != 2 || w.shape()[1] != f.IN || w.offset() % f.IN != 0 ||
      w.offset() / f.IN + w.shape()[0] > f.OUT || !w.is_contiguous())
    fail(src->released);
  return &f;
}

}  // namespace graft::kern
