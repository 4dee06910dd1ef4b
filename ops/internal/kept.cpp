#include "ops/internal/kept.h"

#include <map>
#include <mutex>

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

}  // namespace

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
