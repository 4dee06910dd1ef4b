#include "graft/nn/train/gradient_buckets.h"

#include <chrono>
#include <cstring>

namespace graft::train {

GradientBuckets::GradientBuckets(const nn::NamedTensors& params, Communicator& comm,
                                 size_t bucket_bytes, bool overlap)
    : comm_(comm), overlap_(overlap) {
  if (bucket_bytes == 0) fail("gradient buckets: the bucket size must be > 0 bytes");
  for (auto& [name, p] : params) {
    if (!p.requires_grad()) continue;  // frozen: never has a gradient
    if (p.dtype() != DType::f32 && p.dtype() != DType::f64)
      fail("gradient buckets: parameter '" + name + "' is " + describe(p) +
           "; only f32 and f64 gradients are summed");
    index_[p.impl()] = params_.size();
    params_.push_back(p);
  }
  bucket_of_.assign(params_.size(), 0);
  size_t fill = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    const Tensor& p = params_[k];
    const size_t bytes = (size_t)p.numel() * dtype_size(p.dtype());
    const bool fits = !buckets_.empty() && fill + bytes <= bucket_bytes &&
                      params_[buckets_.back().params[0]].dtype() == p.dtype();
    if (!fits) buckets_.emplace_back(), fill = 0;
    buckets_.back().params.push_back(k);
    bucket_of_[k] = buckets_.size() - 1;
    fill += bytes;
    bytes_ += bytes;
  }
  for (Bucket& b : buckets_) {
    int64_t n = 0;
    for (size_t k : b.params) n += params_[k].numel();
    // One presence flag per parameter after the gradients: how many ranks had a gradient.
    b.flat = Tensor::empty({n + (int64_t)b.params.size()}, params_[b.params[0]].dtype());
  }
}

void GradientBuckets::grad_ready(TensorImpl* leaf) {
  auto it = index_.find(leaf);
  if (it == index_.end()) return;
  ++buckets_[bucket_of_[it->second]].ready;
  // Sums start in bucket order whatever order the gradients complete in, so every rank makes
  // the same sequence of calls (MPI's rule for collectives).
  while (overlap_ && next_ < buckets_.size() &&
         buckets_[next_].ready >= buckets_[next_].params.size())
    start(buckets_[next_++]);
  comm_.progress();
}

namespace {
// The presence flags of a bucket, in its dtype: flag i is 1 when parameter i has a gradient.
double flag_at(const Tensor& flat, int64_t i) {
  return flat.dtype() == DType::f64 ? flat.data<double>()[i] : (double)flat.data<float>()[i];
}
void set_flag(Tensor& flat, int64_t i, bool present) {
  if (flat.dtype() == DType::f64) flat.data<double>()[i] = present ? 1.0 : 0.0;
  else flat.data<float>()[i] = present ? 1.0f : 0.0f;
}
}  // namespace

void GradientBuckets::start(Bucket& b) {
  char* dst = static_cast<char*>(b.flat.raw());
  const int64_t flags = b.flat.numel() - (int64_t)b.params.size();
  for (size_t j = 0; j < b.params.size(); ++j) {
    const Tensor& p = params_[b.params[j]];
    const size_t bytes = (size_t)p.numel() * dtype_size(p.dtype());
    const Tensor g = p.grad();
    if (g.defined() && g.is_contiguous()) std::memcpy(dst, g.raw(), bytes);
    else if (g.defined()) std::memcpy(dst, contiguous_copy(g).raw(), bytes);
    else std::memset(dst, 0, bytes);
    set_flag(b.flat, flags + (int64_t)j, g.defined());
    dst += bytes;
  }
  comm_.start_allreduce_sum(b.flat);
}

void GradientBuckets::finish() {
  while (next_ < buckets_.size()) start(buckets_[next_++]);
  const auto t0 = std::chrono::steady_clock::now();
  comm_.wait_all();
  wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (Bucket& b : buckets_) {
    const char* src = static_cast<const char*>(b.flat.raw());
    const int64_t flags = b.flat.numel() - (int64_t)b.params.size();
    for (size_t j = 0; j < b.params.size(); ++j) {
      Tensor& p = params_[b.params[j]];
      const size_t bytes = (size_t)p.numel() * dtype_size(p.dtype());
      // No rank had a gradient: it stays undefined, as in one process (the optimizer skips it).
      if (flag_at(b.flat, flags + (int64_t)j) == 0) {
        src += bytes;
        continue;
      }
      Tensor g = p.grad();
      if (!g.defined() || !g.is_contiguous()) {
        g = Tensor::empty(p.shape(), p.dtype());
        p.set_grad(g);
      }
      std::memcpy(g.raw(), src, bytes);
      g.bump_version();
      src += bytes;
    }
    b.ready = 0;
  }
  next_ = 0;
}

}  // namespace graft::train
