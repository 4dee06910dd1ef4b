/// @file
/// Loops that run in an OpenMP parallel region only when they are worth one. Internal: never
/// installed, included by no public header (autograd/ and ops/ use it).
#pragma once

#include <cstdint>

namespace graft::detail {

/// body(i) for i in [0, n): an OpenMP parallel loop (static schedule) when `parallel`, else a
/// plain loop on this thread. Not `#pragma omp parallel for if (...)`: with the if false, libgomp
/// still sets up a one-thread team, about 0.4 us a call (AMD EPYC Zen 4), and a tiny model decoding
/// one sentence runs about a thousand of them.
template <class F>
void parallel_for(int64_t n, bool parallel, const F& body) {
  if (!parallel) {
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) body(i);
}

/// parallel_for whose body also gets a scratch object, one per thread: make() builds it.
template <class Make, class F>
void parallel_for_scratch(int64_t n, bool parallel, const Make& make, const F& body) {
  if (!parallel) {
    auto scratch = make();
    for (int64_t i = 0; i < n; ++i) body(i, scratch);
    return;
  }
#pragma omp parallel
  {
    auto scratch = make();
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) body(i, scratch);
  }
}

}  // namespace graft::detail
