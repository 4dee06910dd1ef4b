/// @file
/// Data-parallel gradient summing: the parameters' gradients go into a few flat buckets, and
/// each bucket is summed across the ranks (Communicator::start_allreduce_sum) as soon as the
/// last of its gradients is complete during backward, so the communication overlaps the rest of
/// the backward pass. train_loop() uses it when it runs on more than one rank.
///
/// @code
///   GradientBuckets sync(params, comm, 25 << 20, /*overlap=*/true);
///   {
///     autograd::GradReadyScope hook([&](TensorImpl* leaf) { sync.grad_ready(leaf); });
///     loss.backward();
///   }
///   sync.finish();  // every .grad now holds the sum over the ranks
/// @endcode
#pragma once

#include <cstddef>
#include <unordered_map>
#include <vector>

#include "graft/nn/module.h"
#include "graft/nn/train/communicator.h"

namespace graft::train {

/// Sums the gradients of a fixed list of parameters across the ranks of a Communicator.
class GradientBuckets {
 public:
  /// Buckets of at most `bucket_bytes` (a parameter larger than that gets a bucket of its own),
  /// filled in the reverse order of `params` (the order backward completes them in: the last
  /// layers first), one dtype per bucket; parameters that do not require grad are left out. With
  /// `overlap` off, finish() sums every bucket after backward instead (for measuring what the
  /// overlap gains).
  /// @throws graft::Error when bucket_bytes is 0 or a parameter is not f32 or f64.
  GradientBuckets(const nn::NamedTensors& params, Communicator& comm, size_t bucket_bytes,
                  bool overlap);

  /// For autograd::GradReadyScope: `leaf`'s gradient is complete. When that completes the next
  /// bucket in order (overlap on), it is copied together and its sum started, and so on for the
  /// complete buckets after it (in bucket order on every rank). Other leaves are ignored. One
  /// backward per finish(): a parameter the backward never reaches (unused in this forward)
  /// holds its bucket and the later ones back until finish().
  void grad_ready(TensorImpl* leaf);
  /// After backward: starts the buckets not started yet (a parameter without a gradient counts
  /// as zeros), waits for every sum, and writes the sums into the parameters' .grad. A
  /// parameter that no rank has a gradient for keeps an undefined .grad, as in one process.
  void finish();

  size_t bucket_count() const { return buckets_.size(); }  ///< the number of buckets
  size_t total_bytes() const { return bytes_; }            ///< the gradient bytes summed per step
  double wait_seconds() const { return wait_s_; }          ///< seconds finish() has waited, in all

 private:
  struct Bucket {
    std::vector<size_t> params;  // indices into params_
    Tensor flat;
    size_t ready = 0;  // gradients complete in this backward
  };
  void start(Bucket& b);

  std::vector<Tensor> params_;
  std::vector<size_t> bucket_of_;  // params_[i] lives in buckets_[bucket_of_[i]]
  std::unordered_map<TensorImpl*, size_t> index_;
  std::vector<Bucket> buckets_;
  Communicator& comm_;
  bool overlap_;
  size_t next_ = 0;  // the first bucket whose sum has not started
  size_t bytes_ = 0;
  double wait_s_ = 0;
};

}  // namespace graft::train
