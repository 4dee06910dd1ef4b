// Weights kept for inference in another form, their float32 values freed (internal to ops/):
// int8 keeps the quantized weight (ops/internal/int8.h), float32 the inner product's blocked
// layout (ops/matmul.cpp; graft's panels of 16 outputs in an AVX2 build, ops/internal/panels.h),
// bf16 the bf16 inner product's. One registry for all: the kept form
// replaces the weight's storage, the weight's float32 bytes go back (Storage::release, a later read
// fails naming the parameter), and every inference read of the weight, or of a slice of its rows,
// starts from the kept form.
#pragma once

#include <dnnl.hpp>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "graft/autograd/tensor.h"

namespace graft::kern {

// What replaces a weight w (OUT, IN): `data` holds its values in `dtype` (i8: the int8 form with
// its scales; f32: float32; bf16: bfloat16) laid out as `layout` describes, `tag` naming that
// layout. Several forms may share one storage (keep_blocked_f32 packs a model's weights into one
// block): the form starts `offset` bytes into it. `huge_pages`: that block asked the kernel for
// 2 MiB pages and the system gives them (transparent huge pages not "never").
struct KeptForm {
  std::shared_ptr<Storage> data;
  int64_t OUT = 0, IN = 0;
  DType dtype = DType::f32;
  uint64_t tag = 0;
  dnnl::memory::desc layout;
  size_t offset = 0;
  bool huge_pages = false;
  /// The form's first byte.
  const void* bytes() const { return static_cast<const char*>(data->data) + offset; }
};

// A weight layout of the "IN-block x OUT-block, OUT innermost" family: element (o, i) at
// (o / OB) * S0 + (i / IB) * S1 + (i % IB) * OB + o % OB (oneDNN's AB16b64a, AB8b8a, graft's
// panels (ops/internal/panels.h) with IB = 1, ...; `padded`: the last block of outputs is padded
// with zeros). Transposed rows (BA, oneDNN's pick under AVX2) are the family with IB = 1 and
// tiles of OB = 64 outputs, S0 = 64, unpadded. matmul.cpp's one-row loop reads this family.
struct OutInnermost {
  int64_t OB = 0, IB = 1, S0 = 0, S1 = 0;
  bool padded = true;
};

// d's place in that family (a float32 2-D layout), or nullopt for another layout.
std::optional<OutInnermost> out_innermost(const dnnl::memory::desc& d);

// Where element (i0, i1) of a 2-D oneDNN memory in a plain or blocked layout d lies (in elements
// from its start): the outer strides apply to each index divided by its dim's inner block, the
// inner blocks nest in the order the descriptor lists them (the last one innermost).
int64_t blocked_offset(const dnnl::memory::desc& d, int64_t i0, int64_t i1);

// Rows first + ids[0, N) of the float32 weight kept as k into out (N, k.IN) (the ids checked by
// the caller against the rows of its view, which starts at row `first`): a lookup in a table
// kept for float32 inference (keep_for_inference(fp32) keeps every embedding table).
void gather_kept_rows(const KeptForm& k, int64_t first, const int64_t* ids, int64_t N, float* out);

// Fails (the message starting with `who`, naming `name`) unless w is the whole of its storage:
// freeing a view's storage would free the rest of it.
void check_whole_storage(const Tensor& w, const std::string& who, const std::string& name);

// Makes `form` w's replacement and releases w's float32 values with the error `why` (w's storage
// keeps its version bumped, so copies derived from the float32 values are dropped at the next
// miss). Returns the bytes freed. Not while another thread reads w.
size_t replace_weight(const Tensor& w, const KeptForm& form, const std::string& why);

// Drops the forms of weights that died (replace_weight does too): their storage goes back.
void forget_dead_forms();

// The kept form of w's storage (w may be a slice of the replaced weight's rows), or null when w
// holds its values or its storage was replaced by a form of another dtype than `dtype`; valid
// while w's storage lives (no copy: every inference linear on a kept weight looks it up). A view
// of a replaced storage that is not a block of its whole rows (reshaped, cut in columns) fails
// with the storage's freed-weight error, which names the parameter.
const KeptForm* kept_form(const Tensor& w, DType dtype);

// One storage for weights read at every decoding step (a step streams them all from memory: on
// 2 MiB pages it walks 512 times fewer pages). From 2 MiB on, the bytes from `shift` on start at a
// 2 MiB boundary, and [huge_from, huge_to) of them (relative to `shift`) asked the kernel for
// 2 MiB pages where the system gives them (empty where none will). The slack around them is
// never touched but for the last page's rest (< 2 MiB).
struct HugeBlock {
  std::shared_ptr<Storage> data;
  size_t shift = 0, huge_from = 0, huge_to = 0;
  /// Byte `at` of the usable bytes.
  char* at(size_t at) const { return static_cast<char*>(data->data) + shift + at; }
};
// A HugeBlock of `total` usable bytes, the big-block cache given back first (pages it touched
// already stay 4 KiB); `who` names the caller in the overflow error. `host`: a
// Storage::host_block, for storages moved into it (its bytes count as theirs).
HugeBlock huge_block(size_t total, const std::string& who, bool host = false);

// Moves the values the inference linears read of `weights` (name, weight) into one HugeBlock,
// each storage once: a weight's own bytes, or those of the form kept for it (keep_blocked_bf16,
// quantize_for_inference), where that form has a storage of its own (keep_blocked_f32 packed its
// forms into one block already). Storage::move_into keeps every view valid. Returns the bytes
// moved (0 when fewer than 2 MiB would move: nothing is gained then).
size_t keep_together(const std::vector<std::pair<std::string, Tensor>>& weights);

// Keeps each float32 weight w (OUT, IN; contiguous, the whole of its storage) of `weights` (name,
// weight) in the layout the float32 inference inner product reads (a decoding step's), once, as
// w's replacement, and releases w's values (the error naming the name); every float32 inference
// read of w or of a slice of its rows then reads that form (ops/matmul.cpp). The forms are packed
// into one block (2 MiB pages where the system gives them). Returns the bytes freed: 0 for a
// weight kept already or where the kernel reads plain rows (nothing is held twice then).
size_t keep_blocked_f32(const std::vector<std::pair<std::string, Tensor>>& weights);

// The same for the bf16 weight w: kept once in the layout the bf16 inference inner product reads
// (ops/matmul.cpp's linear_kept_bf16 reads it at every row count), its plain bf16 values released
// (the error naming `name`). Returns the bytes freed: 0 when w was kept already, where no bf16
// kernel runs (DNNL_MAX_CPU_ISA=AVX2: the 16-bit loops read plain rows) or the kernel reads
// plain rows.
size_t keep_blocked_bf16(const Tensor& w, const std::string& name);

// How many one-row linear calls on kept float32 weights read several blocks of outputs side by
// side (ops/matmul.cpp's one_row_panels), on any thread: tests/test_fp32_keep.cpp checks they run.
uint64_t kept_f32_panel_calls();

// How many linear calls on kept bf16 weights graft's loop over the blocks (layout AB8b64a2b, up to
// 4 rows) ran, on any thread: tests/test_bf16_keep.cpp checks it runs where expected.
uint64_t kept_bf16_loop_calls();
// Whether kept bf16 weights get the layout that loop reads here: compiled with AVX512_BF16 and
// oneDNN's kernels are avx512_core_bf16 ones (not AMX's, not capped below).
bool kept_bf16_loop_expected();

}  // namespace graft::kern
