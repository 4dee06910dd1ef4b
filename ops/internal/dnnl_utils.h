// oneDNN glue: one CPU engine and stream for the process, and memory descriptors that describe a
// graft tensor in place (its real strides, so transposed views need no copy). Only ops/ may
// include this header.
#pragma once

#include <dnnl.hpp>
#include <initializer_list>
#include <map>
#include <unordered_map>
#include <vector>

#include "graft/autograd/tensor.h"

namespace graft::onednn {

dnnl::engine& engine();
dnnl::stream& stream();

using dims = dnnl::memory::dims;
// oneDNN's element type for a graft dtype: f32, bf16 or f16 (undef for the others).
dnnl::memory::data_type data_type(DType dt);
// Describes an f32 tensor with its own strides; rank 0 is described as (1).
dnnl::memory::desc md(const Tensor& t);
dnnl::memory::desc md(const Shape& shape, const Shape& strides,
                      dnnl::memory::data_type dt = dnnl::memory::data_type::f32);
dnnl::memory::desc md_contiguous(const Shape& shape);
// The strides with every size-1 dim given the stride a dense layout would give it: its stride is
// meaningless, and any other value there (0 from a broadcast, 1 from a padded shape, whatever a
// view left) makes oneDNN see a permuted layout and pick its reference kernel.
Shape canonical_strides(const Shape& shape, const Shape& strides);
// Wraps the tensor's data pointer (no copy).
dnnl::memory mem(const Tensor& t);
dnnl::memory mem(const dnnl::memory::desc& d, const Tensor& t);
dnnl::memory mem(const dnnl::memory::desc& d, void* data);

// A number naming a weights layout (data type, dims, strides, blocks; top bit set), the tag of a
// weight's copy in that layout (kern::derived_copy), so each layout gets its own copy.
uint64_t layout_tag(const dnnl::memory::desc& d);

// True when the tensor can be handed to a oneDNN primitive: f32, 1..12 dims, non-empty, and
// no zero strides (oneDNN cannot describe broadcast views).
bool usable(const Tensor& t);
// t itself when usable, else a contiguous copy (oneDNN cannot describe stride-0 dims).
Tensor operand(const Tensor& t);

// Attributes for every primitive graft builds: the scratchpad in user mode, so run() hands it a
// block for the run's duration. Debian's oneDNN 2.6 is built with DNNL_ENABLE_CONCURRENT_EXEC,
// where a primitive in library mode allocates its own scratchpad when it is made and holds it as
// long as it lives: every cached primitive of every shape kept its buffer (a bf16 matmul with a
// bf16 output keeps its float32 accumulator, 1 MiB for a 512 x 512 weight gradient), 96 MiB of
// glibc heap after 8 steps of bf16 base training, growing with each new batch shape.
dnnl::primitive_attr user_scratchpad(dnnl::primitive_attr attr = {});
// The scratchpad a primitive made with user_scratchpad() needs at each run (zero bytes for none).
dnnl::memory::desc scratchpad_md(const dnnl::primitive& prim);

// Per-thread cache of built primitives, keyed by the problem (dims, strides, flags). oneDNN's own
// cache only saves the primitive; the primitive descriptor is still built (malloc-heavy
// implementation dispatch) on every call, measured at about 40% of a 64x64x64 matmul.
using Key = std::vector<int64_t>;
template <class Prim>
struct Cached {
  Prim prim;
  std::vector<dnnl::memory::desc> mds;  // in the order the caller executes them
  bool dense_copy = false;              // operands must be made dense first (see kern::bmm)
  uint64_t weights_tag = 0;  // layout_tag() of its weights' kernel layout, where it has one
  // The memory objects run() hands the primitive, one per argument: made on the first run and
  // pointed at each later run's data (making them each run cost 7% of a one-sentence decoding
  // step of the tiny Transformer: oneDNN allocates each with posix_memalign).
  mutable std::unordered_map<int, dnnl::memory> args{};
  dnnl::memory::desc scratchpad{};  // scratchpad_md(prim), set by cached()
};

// One argument of a primitive run: which one (DNNL_ARG_*), its descriptor and its data (null:
// the primitive runs without this argument, as an undefined bias).
struct Arg {
  int arg;
  const dnnl::memory::desc& md;
  const void* data;
};
namespace detail {
// Runs prim on args through the memory objects in mems (made there when missing) and waits; a
// scratchpad of `scratchpad`'s size (none when zero) comes from Storage for this run only. Only
// run(Cached) calls it, with the scratchpad cached() queried from the primitive: a primitive in
// user scratchpad mode run without its scratchpad would hand oneDNN a null pointer.
void run(const dnnl::primitive& prim, std::unordered_map<int, dnnl::memory>& mems,
         std::initializer_list<Arg> args, const dnnl::memory::desc& scratchpad);
}  // namespace detail
// Runs a primitive made by cached() on args and waits (its scratchpad, if any, from Storage).
template <class Prim>
void run(const Cached<Prim>& c, std::initializer_list<Arg> args) {
  detail::run(c.prim, c.args, args, c.scratchpad);
}
// A key's entries for a tensor's geometry: rank, shape and strides.
void append_geometry(Key& key, const Tensor& t);
template <class Prim, class Make>
const Cached<Prim>& cached(const Key& key, Make&& make) {
  thread_local std::map<Key, Cached<Prim>> cache;
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  // Training loops use a few dozen shapes; a bound keeps a shape-varying caller from leaking.
  if (cache.size() >= 512) cache.clear();
  Cached<Prim>& c = cache.emplace(key, make()).first->second;
  c.scratchpad = scratchpad_md(c.prim);
  return c;
}

}  // namespace graft::onednn
