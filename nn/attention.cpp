#include "graft/nn/attention.h"

#include <cmath>
#include <cstring>

#include "graft/autograd/tape.h"
#include "graft/ops/ops.h"

namespace graft::nn {

namespace {
thread_local AttentionRecorder* t_recorder = nullptr;

// Where an attention puts its weights: the caller's tensor, else `local` while a recorder
// collects, else nowhere (null: the weights are not computed).
Tensor* weights_wanted(Tensor* given, Tensor& local) {
  return given || !t_recorder ? given : &local;
}

// A dense (B, 1, n) decoding step with no tape: its heads need no copy. At one position the row
// layout (B, 1, parts, H, Dh) is each part's head layout (B, H, 1, Dh) with a row stride, and a
// dense (B, H, 1, Dh) is the merged (B, 1, H Dh); split_heads and merge_heads would copy them
// (an allocation and a copy per call, 6 per decoder layer and step). Only t of `rank` dims (3 for
// a projection, 4 for heads): any other takes split_heads / merge_heads, which refuse it by name.
bool one_position_untaped(const Tensor& t, int64_t rank) {
  return t.dim() == rank && t.shape()[rank - 2] == 1 && t.is_contiguous() &&
         !(autograd::grad_enabled() && t.requires_grad());  // needs_record({t}), no Tensors made
}

// y (B, 1, parts H Dh) -> parts views (B, H, 1, Dh) of y: split_heads' values, not copied.
Tensors heads_of_one_position(const Tensor& y, int64_t parts, int64_t heads) {
  const int64_t B = y.shape()[0], row = y.shape()[2], dh = row / (parts * heads);
  Tensors out;
  out.reserve(parts);
  for (int64_t p = 0; p < parts; ++p)
    out.push_back(
        Tensor::view_of(y, {B, heads, 1, dh}, {row, dh, row, 1}, y.offset() + p * heads * dh));
  return out;
}

// Positions [a, b) of a (B, H, capacity, Dh) cache buffer: slice(buf, 2, a, b) built directly
// (half its allocations; a decoding step takes four per layer, and append checked the bounds).
Tensor cache_positions(const Tensor& buf, int64_t a, int64_t b) {
  Shape shape = buf.shape();
  shape[2] = b - a;
  return Tensor::view_of(buf, shape, buf.strides(), buf.offset() + a * buf.strides()[2]);
}

// Whether write_positions may copy src's rows into buf with memcpy: the same dtype and B, H, Dh,
// [at, at + T) inside buf, dense rows and no bytes shared with buf (memcpy has no memmove
// semantics; copy_into has). KVCache's fields are public: a v unlike k takes copy_into's checks.
bool rows_copyable(const Tensor& buf, int64_t at, const Tensor& src) {
  const Shape &s = src.shape(), &c = buf.shape();
  return buf.is_contiguous() && src.strides()[3] == 1 && buf.dim() == 4 &&
         src.dtype() == buf.dtype() && s[0] == c[0] && s[1] == c[1] && s[3] == c[3] &&
         at + s[2] <= c[2] && !src.same_storage(buf);
}

// Writes src (B, H, T, Dh) at positions [at, at + T) of the dense cache buffer `buf` one row of
// Dh elements at a time: copy_into's values without the position view it takes (two a layer and
// step, 3 allocations each). Anything else (rows_copyable) goes through copy_into.
void write_positions(const Tensor& buf, int64_t at, const Tensor& src) {
  const Shape &s = src.shape(), &ss = src.strides(), &bs = buf.strides();
  if (!rows_copyable(buf, at, src)) return copy_into(cache_positions(buf, at, at + s[2]), src);
  const int64_t es = (int64_t)dtype_size(buf.dtype());
  char* d = static_cast<char*>(buf.raw());
  const char* p = static_cast<const char*>(src.raw());
  for (int64_t b = 0; b < s[0]; ++b)
    for (int64_t h = 0; h < s[1]; ++h)
      for (int64_t t = 0; t < s[2]; ++t)
        std::memcpy(d + (b * bs[0] + h * bs[1] + (at + t) * bs[2]) * es,
                    p + (b * ss[0] + h * ss[1] + t * ss[2]) * es, (size_t)(s[3] * es));
  buf.bump_version();
}

// out (B, H, 1, Dv) -> (B, 1, H Dv): merge_heads' values, a view when out is dense (built
// directly: reshape's checks and its tape hook cost 6 allocations a call).
Tensor merge_one_position(const Tensor& out) {
  if (!one_position_untaped(out, 4)) return merge_heads(out);
  const Shape& s = out.shape();
  return Tensor::view_of(out, {s[0], 1, s[1] * s[3]}, {s[1] * s[3], s[1] * s[3], 1}, out.offset());
}
// A decoding step of grouped-query attention (one query position sees every cached key): the
// heads / kv_heads query heads of a group are its KV head's query rows, so K and V are read as
// cached instead of repeated per query head (repeat_kv copies the whole cache every step).
bool grouped_one_query(const Tensor& q, const Tensor& k, int64_t heads,
                       const AttentionOptions& opt) {
  return q.dim() == 4 && q.shape()[2] == 1 && k.shape()[1] < heads && !opt.bias.defined() &&
         !opt.key_padding_mask.defined() && !opt.return_weights && opt.dropout == 0 &&
         !autograd::needs_record({q, k});
}

// q (B, H, 1, Dh) against k, v (B, kv_heads, Tk, Dh) -> (B, H, 1, Dh): each group's query rows
// over its own keys, no mask (the one position is the last).
Tensor attend_groups(const Tensor& q, const Tensor& k, const Tensor& v, int64_t heads) {
  const int64_t B = q.shape()[0], Dh = q.shape()[3], kv = k.shape()[1];
  const Tensor rows = reshape(q, {B, kv, heads / kv, Dh});
  const AttentionResult r = scaled_dot_product_attention(rows, k, v, AttentionOptions());
  return reshape(r.out, {B, heads, 1, Dh});
}

}  // namespace

AttentionRecorder::AttentionRecorder() : prev_(t_recorder) { t_recorder = this; }
AttentionRecorder::~AttentionRecorder() { t_recorder = prev_; }

void AttentionRecorder::note(const Tensor& weights) {
  if (t_recorder && weights.defined())
    t_recorder->weights_.emplace_back(autograd::name_scope_path(), weights);
}

Tensor AttentionRecorder::get(const std::string& path) const {
  for (auto it = weights_.rbegin(); it != weights_.rend(); ++it)
    if (it->first == path) return it->second;
  std::string known;
  for (auto& [p, w] : weights_) known += (known.empty() ? "" : ", ") + p;
  fail("AttentionRecorder: no attention weights under '" + path +
       "' (collected: " + (known.empty() ? std::string("none") : known) + ")");
}

MultiHeadAttention::MultiHeadAttention(int64_t d_, int64_t h, DType dt, Generator& gen,
                                       double dropout_p, Generator* dropout_gen, int64_t kv,
                                       bool has_bias)
    : d_model(d_),
      heads(h),
      kv_heads(kv == 0 ? h : kv),
      dropout(dropout_p),
      dropout_gen_(dropout_gen) {
  if (h <= 0 || d_model % h != 0)
    fail("MultiHeadAttention: d_model " + std::to_string(d_model) + " is not divisible by " +
         std::to_string(h) + " heads");
  if (kv_heads <= 0 || h % kv_heads != 0)
    fail("MultiHeadAttention: kv_heads " + std::to_string(kv) + " must divide heads " +
         std::to_string(h));
  if (!is_dropout_p(dropout))
    fail("MultiHeadAttention: attention dropout must be in [0, 1], got " + std::to_string(dropout));
  // nn.MultiheadAttention: xavier_uniform on the packed projection, zero biases.
  const int64_t rows = d_model + 2 * kv_heads * (d_model / heads);
  in_proj_weight = register_parameter("in_proj_weight", new_parameter({rows, d_model}, dt, [&] {
                                        Tensor w = Tensor::empty({rows, d_model}, dt);
                                        xavier_uniform_(w, gen);
                                        return w;
                                      }));
  if (has_bias)
    in_proj_bias = register_parameter("in_proj_bias",
                                      new_parameter({rows}, dt, [&] { return zeros({rows}, dt); }));
  out_proj =
      register_module("out_proj", std::make_shared<Linear>(d_model, d_model, has_bias, dt, gen));
  if (has_bias && !SkipInit::active()) fill_(out_proj->bias, 0.0);  // drawn, then zeroed as torch
}

Tensors MultiHeadAttention::project_heads(const Tensor& x, int64_t part, int64_t parts) const {
  if (kv_heads == heads) {
    const Tensor y =
        part == 0 && parts == 3
            ? linear(x, in_proj_weight, in_proj_bias)
            : linear(x, slice(in_proj_weight, 0, part * d_model, (part + parts) * d_model),
                     in_proj_bias.defined()
                         ? slice(in_proj_bias, 0, part * d_model, (part + parts) * d_model)
                         : Tensor());
    if (one_position_untaped(y, 3) && y.shape()[2] == parts * d_model)
      return heads_of_one_position(y, parts, heads);
    return split_heads(y, parts, heads);  // parts x dense (B, H, T, Dh)
  }
  // Grouped: the parts have heads, kv_heads, kv_heads heads of Dh rows each.
  const int64_t dh = d_model / heads;
  auto first_head = [&](int64_t p) { return p == 0 ? 0 : heads + (p - 1) * kv_heads; };
  const int64_t h0 = first_head(part), h1 = first_head(part + parts);
  const Tensor y =
      linear(x, slice(in_proj_weight, 0, h0 * dh, h1 * dh),
             in_proj_bias.defined() ? slice(in_proj_bias, 0, h0 * dh, h1 * dh) : Tensor());
  const Tensor all = split_heads(y, 1, h1 - h0)[0];  // (B, h1 - h0, T, Dh)
  Tensors out;
  for (int64_t p = part; p < part + parts; ++p)
    out.push_back(slice(all, 1, first_head(p) - h0, first_head(p + 1) - h0));
  return out;
}

Tensor MultiHeadAttention::repeat_kv(const Tensor& t) const {
  if (t.shape()[1] == heads) return t;
  const Shape& s =
      t.shape();  // (B, kv_heads, T, Dh) -> (B, kv_heads, G, T, Dh) -> (B, heads, T, Dh)
  return reshape(broadcast_to(unsqueeze(t, 2), {s[0], s[1], heads / s[1], s[2], s[3]}),
                 {s[0], heads, s[2], s[3]});
}

Tensor MultiHeadAttention::attend(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& key_padding_mask, bool causal, const Tensor& bias,
                                  Tensor* weights, bool steady_kv) const {
  AttentionOptions opt;
  opt.steady_kv = steady_kv;
  opt.causal = causal;
  opt.key_padding_mask = key_padding_mask;
  opt.bias = bias;
  opt.return_weights = weights != nullptr;
  if (training() && dropout > 0) {
    opt.dropout = dropout;
    opt.generator = dropout_gen_ ? dropout_gen_ : &default_generator();
  }
  if (grouped_one_query(q, k, heads, opt))
    return out_proj->forward(merge_one_position(attend_groups(q, k, v, heads)));
  AttentionResult r = scaled_dot_product_attention(q, repeat_kv(k), repeat_kv(v), opt);
  if (weights) *weights = r.weights;
  return out_proj->forward(merge_one_position(r.out));  // (B, H, T, Dh) -> (B, T, d)
}

Tensor MultiHeadAttention::forward(const Tensor& x, const Tensor& memory,
                                   const Tensor& key_padding_mask, bool causal, Tensor* weights,
                                   const AttentionPositions* pos) const {
  const auto named = scope();
  if (x.dim() != 3 || x.shape()[2] != d_model || memory.dim() != 3 ||
      memory.shape()[2] != d_model || memory.shape()[0] != x.shape()[0])
    fail("MultiHeadAttention: x " + describe(x) + " and memory " + describe(memory) +
         " must be (B, T, " + std::to_string(d_model) + ") with the same B");
  const bool self =
      x.same_storage(memory) && x.shape() == memory.shape() && x.offset() == memory.offset();
  Tensors qkv = self ? project_heads(x, 0, 3) : project_heads(x, 0, 1);
  if (!self)
    for (Tensor& t : project_heads(memory, 1, 2)) qkv.push_back(t);
  Tensor bias;
  if (self && pos) {
    qkv[0] = pos->rotate(qkv[0], 0);
    qkv[1] = pos->rotate(qkv[1], 0);
    bias = pos->bias(0, x.shape()[1], 0, x.shape()[1], x.dtype());
  }
  Tensor local;
  Tensor* w = weights_wanted(weights, local);
  Tensor out = attend(qkv[0], qkv[1], qkv[2], key_padding_mask, causal, bias, w);
  if (w) AttentionRecorder::note(*w);
  return hooked(out);
}

// Reordering beams keeps the batch size: the rows are then moved within the buffers, and only
// their filled positions (a fresh gather would copy every row's whole capacity each step).
void KVCache::select_rows(const Tensor& rows) {
  autograd::NoGrad ng;
  if (!k.defined()) return;
  if (rows.dim() == 1 && rows.numel() == k.shape()[0] && len > 0) {
    select_rows_(slice(k, 2, 0, len), rows);
    if (v.defined()) select_rows_(slice(v, 2, 0, len), rows);
    return;
  }
  k = index_select(k, 0, rows);
  if (v.defined()) v = index_select(v, 0, rows);
}

std::pair<Tensor, Tensor> KVCache::append(const Tensor& k_new, const Tensor& v_new,
                                          int64_t capacity) {
  autograd::NoGrad ng;
  const auto given = [&] {  // built only for an error message
    return "k_new " + describe(k_new) + ", v_new " + describe(v_new);
  };
  if (!k_new.defined() || !v_new.defined() || k_new.dim() != 4 || k_new.shape() != v_new.shape() ||
      k_new.dtype() != v_new.dtype())
    fail("KVCache::append: k_new and v_new must be the same (B, H, T, Dh) of one dtype, got " +
         given());
  const Shape& s = k_new.shape();
  if (!k.defined()) {
    if (capacity <= 0)
      fail("KVCache::append: capacity must be positive, got " + std::to_string(capacity));
    k = zeros({s[0], s[1], capacity, s[3]}, k_new.dtype());
    v = zeros({s[0], s[1], capacity, s[3]}, k_new.dtype());
    len = 0;
  }
  const Shape& c = k.shape();
  if (s[0] != c[0] || s[1] != c[1] || s[3] != c[3] || k_new.dtype() != k.dtype())
    fail("KVCache::append: " + given() + " do not match the cache " + describe(k) +
         " (B, H, Dh and dtype must agree)");
  if (len + s[2] > c[2])
    fail("KVCache::append: KV cache of capacity " + std::to_string(c[2]) + " is full (" +
         std::to_string(len) + " + " + std::to_string(s[2]) + " positions, " + given() + ")");
  write_positions(k, len, k_new);
  write_positions(v, len, v_new);
  len += s[2];
  return {cache_positions(k, 0, len), cache_positions(v, 0, len)};
}

Tensor MultiHeadAttention::forward_self_step(const Tensor& x, KVCache& cache, int64_t capacity,
                                             const AttentionPositions* pos) const {
  const auto named = scope();
  autograd::NoGrad ng;
  const int64_t T = x.shape()[1];
  Tensors qkv = project_heads(x, 0, 3);  // keys and values with kv_heads heads (a smaller cache)
  const int64_t start = cache.len;
  if (pos) {
    qkv[0] = pos->rotate(qkv[0], start);
    qkv[1] = pos->rotate(qkv[1], start);
  }
  const auto [k, v] = cache.append(qkv[1], qkv[2], capacity);
  const Tensor bias = pos ? pos->bias(start, T, 0, cache.len, x.dtype()) : Tensor();
  // causal aligned to the end: step t sees cached keys 0..t
  Tensor local;
  Tensor* w = weights_wanted(nullptr, local);
  Tensor out = attend(qkv[0], k, v, Tensor(), true, bias, w);
  if (w) AttentionRecorder::note(*w);
  return hooked(out);
}

void MultiHeadAttention::fill_cross_cache(const Tensor& memory, KVCache& cache) const {
  autograd::NoGrad ng;
  Tensors kv = project_heads(memory, 1, 2);
  cache.k = contiguous(kv[0]);
  cache.v = contiguous(kv[1]);
  cache.len = memory.shape()[1];
}

Tensor MultiHeadAttention::forward_cross_cached(const Tensor& x, const KVCache& cache,
                                                const Tensor& key_padding_mask, Tensor* weights,
                                                int64_t group) const {
  const auto named = scope();
  autograd::NoGrad ng;
  Tensor local;
  weights = weights_wanted(weights, local);
  if (group == 1) {
    Tensor out = attend(project_heads(x, 0, 1)[0], cache.k, cache.v, key_padding_mask, false,
                        Tensor(), weights,
                        /*steady_kv=*/true);
    if (weights) AttentionRecorder::note(*weights);
    return hooked(out);
  }
  const int64_t rows = cache.k.defined() ? cache.k.shape()[0] : 0;
  if (group < 1 || x.dim() != 3 || x.shape()[1] != 1 || x.shape()[0] != group * rows)
    fail("MultiHeadAttention: grouped cross-attention needs x (group " + std::to_string(group) +
         " x " + std::to_string(rows) + " cache rows, 1, d), got x " + describe(x));
  // The G rows of one cache row as G query positions of it: (B G, 1, d) -> (B, G, d) -> heads.
  const Tensor q = project_heads(reshape(x, {rows, group, d_model}), 0, 1)[0];
  const Tensor y =
      attend(q, cache.k, cache.v, key_padding_mask, false, Tensor(), weights, /*steady_kv=*/true);
  // (B, H, G, Tk) -> (B G, H, 1, Tk), as the ungrouped call gives them
  if (weights) {
    *weights = reshape(contiguous(permute(*weights, {0, 2, 1, 3})), {rows * group, heads, 1, -1});
    AttentionRecorder::note(*weights);
  }
  return hooked(reshape(y, {rows * group, 1, d_model}));
}

}  // namespace graft::nn
