#include "ops/internal/dnnl_utils.h"

#include <algorithm>
#include <optional>

namespace graft::onednn {

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

dnnl::stream& stream() {
  // One stream per thread: oneDNN streams are not meant to be shared between threads.
  thread_local dnnl::stream s(engine());
  return s;
}

dnnl::memory::data_type data_type(DType dt) {
  using t = dnnl::memory::data_type;
  switch (dt) {
    case DType::f32:
      return t::f32;
    case DType::bf16:
      return t::bf16;
    case DType::f16:
      return t::f16;
    default:
      return t::undef;
  }
}

Shape canonical_strides(const Shape& shape, const Shape& strides) {
  Shape st = strides;
  for (size_t d = shape.size(); d-- > 0;)
    if (shape[d] == 1)
      st[d] = d + 1 < shape.size() ? st[d + 1] * std::max<int64_t>(shape[d + 1], 1) : 1;
  return st;
}

dnnl::memory::desc md(const Shape& shape, const Shape& strides, dnnl::memory::data_type dt) {
  if (shape.empty()) return dnnl::memory::desc({1}, dt, dims{1});
  const Shape st = canonical_strides(shape, strides);
  return dnnl::memory::desc(dims(shape.begin(), shape.end()), dt, dims(st.begin(), st.end()));
}

dnnl::memory::desc md(const Tensor& t) { return md(t.shape(), t.strides()); }

dnnl::memory::desc md_contiguous(const Shape& shape) {
  return md(shape, contiguous_strides(shape));
}

dnnl::memory mem(const dnnl::memory::desc& d, const Tensor& t) {
  return dnnl::memory(d, engine(), t.raw());
}

dnnl::memory mem(const dnnl::memory::desc& d, void* data) {
  return dnnl::memory(d, engine(), data);
}

dnnl::memory mem(const Tensor& t) { return mem(md(t), t); }

uint64_t layout_tag(const dnnl::memory::desc& d) {
  const auto& b = d.data.format_desc.blocking;
  uint64_t h = 0x51ed;
  auto mixin = [&](int64_t v) { h = mix64(h ^ (uint64_t)v); };
  mixin((int64_t)d.data.data_type);
  for (int i = 0; i < d.data.ndims; ++i) mixin(d.data.dims[i]), mixin(b.strides[i]);
  for (int i = 0; i < b.inner_nblks; ++i) mixin(b.inner_blks[i]), mixin(b.inner_idxs[i]);
  return h | (uint64_t(1) << 63);  // apart from the bf16 copies' tags
}

bool usable(const Tensor& t) {
  if (t.dtype() != DType::f32 || t.dim() > 12 || t.numel() == 0) return false;
  for (int64_t i = 0; i < t.dim(); ++i)
    if (t.strides()[i] == 0 && t.shape()[i] != 1) return false;
  return true;
}

Tensor operand(const Tensor& t) { return usable(t) ? t : contiguous_copy(t); }

dnnl::primitive_attr user_scratchpad(dnnl::primitive_attr attr) {
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

dnnl::memory::desc scratchpad_md(const dnnl::primitive& prim) {
  const dnnl_memory_desc_t* d =
      dnnl_primitive_desc_query_md(prim.get_primitive_desc(), dnnl_query_scratchpad_md, 0);
  return d ? dnnl::memory::desc(*d) : dnnl::memory::desc();
}

namespace {
// Points mems' entry for argument `arg` at data (made on first use).
void bind(std::unordered_map<int, dnnl::memory>& mems, int arg, const dnnl::memory::desc& md,
          void* data) {
  auto it = mems.find(arg);
  if (it == mems.end()) mems.emplace(arg, dnnl::memory(md, engine(), data));
  else it->second.set_data_handle(data);
}
}  // namespace

void detail::run(const dnnl::primitive& prim, std::unordered_map<int, dnnl::memory>& mems,
                 std::initializer_list<Arg> args, const dnnl::memory::desc& scratchpad) {
  const size_t scratch_bytes = scratchpad.get_size();
  size_t n = scratch_bytes > 0;
  for (const Arg& a : args) n += a.data != nullptr;
  if (mems.size() != n) mems.clear();  // a caller that varies its arguments
  for (const Arg& a : args)
    if (a.data) bind(mems, a.arg, a.md, const_cast<void*>(a.data));
  // Freed when the run is over: a cached primitive holds no memory between runs.
  std::optional<Storage> scratch;
  if (scratch_bytes > 0) {
    scratch.emplace(scratch_bytes);
    bind(mems, DNNL_ARG_SCRATCHPAD, scratchpad, scratch->data);
  }
  prim.execute(stream(), mems);
  stream().wait();
}

void append_geometry(Key& key, const Tensor& t) {
  key.push_back(t.dim());
  key.insert(key.end(), t.shape().begin(), t.shape().end());
  key.insert(key.end(), t.strides().begin(), t.strides().end());
}

}  // namespace graft::onednn
