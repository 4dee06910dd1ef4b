// oneDNN glue: one CPU engine and stream for the process, and memory descriptors that describe a
// graft tensor in place (its real strides, so transposed views need no copy). Only ops/ may
// include this header.
#pragma once

#include <dnnl.hpp>

#include "autograd/tensor.h"

namespace graft::onednn {

dnnl::engine& engine();
dnnl::stream& stream();

using dims = dnnl::memory::dims;
// Describes an f32 tensor with its own strides; rank 0 is described as (1).
dnnl::memory::desc md(const Tensor& t);
dnnl::memory::desc md(const Shape& shape, const Shape& strides);
dnnl::memory::desc md_contiguous(const Shape& shape);
// Wraps the tensor's data pointer (no copy).
dnnl::memory mem(const Tensor& t);
dnnl::memory mem(const dnnl::memory::desc& d, const Tensor& t);

// True when the tensor can be handed to a oneDNN primitive: f32, 1..12 dims, non-empty, and
// no zero strides (oneDNN cannot describe broadcast views).
bool usable(const Tensor& t);

}  // namespace graft::onednn
