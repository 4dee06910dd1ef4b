// nn/ layers: shapes, PyTorch-compatible names and initialisation, positional encodings.
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>

#include "graft/autograd/gradcheck.h"
#include "graft/nn/transformer.h"
#include "graft/ops/ops.h"
#include "test_util.h"

using namespace graft;
using namespace graft::nn;
using namespace graft::testing;

BOOST_AUTO_TEST_SUITE(nn_layers)

BOOST_AUTO_TEST_CASE(linear_shapes_init_and_names) {
  Generator g(1);
  Linear l(8, 3, true, DType::f32, g);
  auto named = l.named_parameters();
  BOOST_TEST(named.size() == 2u);
  BOOST_TEST(named[0].first == "weight");
  BOOST_TEST(named[1].first == "bias");
  BOOST_TEST(l.num_parameters() == 8 * 3 + 3);
  for (double w : l.weight.to_vector<double>()) BOOST_TEST(std::fabs(w) <= 1.0 / std::sqrt(8.0));
  Tensor y = l.forward(ones({2, 5, 8}));
  BOOST_TEST(y.shape() == (Shape{2, 5, 3}));
  BOOST_CHECK_THROW(l.forward(ones({2, 7})), Error);
}

BOOST_AUTO_TEST_CASE(embedding_padding_row_is_zero_and_gets_no_gradient) {
  Generator g(2);
  Embedding e(10, 4, 0, DType::f64, g);
  auto row0 = contiguous(slice(e.weight, 0, 0, 1)).to_vector<double>();
  for (double v : row0) BOOST_TEST(v == 0.0);
  Tensor ids = from_vector(std::vector<int64_t>{0, 3, 3, 0}, {2, 2}, DType::i64);
  sum(e.forward(ids)).backward();
  auto gr = e.weight.grad().to_vector<double>();
  for (int j = 0; j < 4; ++j) {
    BOOST_TEST(gr[0 * 4 + j] == 0.0);
    BOOST_TEST(gr[3 * 4 + j] == 2.0);
  }
  BOOST_CHECK_THROW(e.forward(from_vector(std::vector<int64_t>{10}, {1, 1}, DType::i64)), Error);
}

BOOST_AUTO_TEST_CASE(sinusoidal_encoding_matches_formula) {
  SinusoidalPositionalEncoding pe(50, 8, DType::f64);
  auto t = pe.table.to_vector<double>();
  for (int i : {0, 1, 7, 49})
    for (int j = 0; j < 4; ++j) {
      const double angle = i / std::pow(10000.0, 2.0 * j / 8.0);
      BOOST_TEST(std::fabs(t[i * 8 + 2 * j] - std::sin(angle)) < 1e-12);
      BOOST_TEST(std::fabs(t[i * 8 + 2 * j + 1] - std::cos(angle)) < 1e-12);
    }
  BOOST_TEST(pe.named_parameters().empty());  // a buffer, not a parameter
  Tensor x = zeros({2, 3, 8}, DType::f64);
  Tensor y = pe.forward(x, 5);  // positions 5..7
  BOOST_TEST(std::fabs(y.to_vector<double>()[0] - std::sin(5.0)) < 1e-12);
  // Past the table (issue: sinusoidal extrapolates) the rows follow the same formula.
  auto far = pe.forward(zeros({1, 48, 8}, DType::f64), 5).to_vector<double>();
  for (int i : {0, 44, 47})
    for (int j = 0; j < 4; ++j) {
      const double angle = (5 + i) / std::pow(10000.0, 2.0 * j / 8.0);
      BOOST_TEST(std::fabs(far[i * 8 + 2 * j] - std::sin(angle)) < 1e-12);
      BOOST_TEST(std::fabs(far[i * 8 + 2 * j + 1] - std::cos(angle)) < 1e-12);
    }
  BOOST_CHECK_THROW(pe.forward(zeros({1, 3, 8}, DType::f64), -1), Error);
  LearnedPositionalEncoding lp(50, 8, DType::f64);
  BOOST_CHECK_EXCEPTION(lp.forward(zeros({1, 48, 8}, DType::f64), 5), Error, [](const Error& e) {
    return std::string(e.what()).find("max_len 50") != std::string::npos;
  });
}

BOOST_AUTO_TEST_CASE(layer_norm_module_and_dropout_modes) {
  LayerNorm ln(4);
  Tensor y = ln.forward(from_vector(std::vector<float>{1, 2, 3, 4}, {1, 4}));
  auto v = y.to_vector<double>();
  BOOST_TEST(std::fabs(v[0] + v[3]) < 1e-5);
  BOOST_TEST(std::fabs(v[3] - 3.0 / std::sqrt(5.0 + 1e-5 * 4)) < 1e-3);
  Generator g(3);
  Dropout d(0.5, &g);
  Tensor x = ones({1000});
  auto train = d.forward(x).to_vector<double>();
  int zeros_n = 0;
  for (double t : train) zeros_n += t == 0.0;
  BOOST_TEST(zeros_n > 400);
  BOOST_TEST(zeros_n < 600);
  d.eval();
  BOOST_TEST(d.forward(x).same_storage(x));  // identity in eval mode
  // One rule for p everywhere, PyTorch's: [0, 1], refused at construction; p = 1 drops all.
  Dropout all(1.0, &g);
  for (double t : all.forward(x).to_vector<double>()) BOOST_TEST(t == 0.0);
  for (double p : {-0.1, 1.5, std::nan("")})
    BOOST_CHECK_EXCEPTION(Dropout{p}, Error, [](const Error& e) {
      return std::string(e.what()).find("Dropout: p must be in [0, 1], got ") == 0;
    });
}

BOOST_AUTO_TEST_CASE(multi_head_attention_layout_and_masks) {
  Generator g(4);
  MultiHeadAttention mha(8, 2, DType::f64, g);
  auto named = mha.named_parameters();
  BOOST_TEST(named[0].first == "in_proj_weight");
  BOOST_TEST(named[0].second.shape() == (Shape{24, 8}));
  BOOST_TEST(named[1].first == "in_proj_bias");
  BOOST_TEST(named[2].first == "out_proj.weight");
  Tensor x = randn({2, 5, 8}, DType::f64, g);
  Tensor w;
  Tensor y = mha.forward(x, x, Tensor(), true, &w);
  BOOST_TEST(y.shape() == (Shape{2, 5, 8}));
  BOOST_TEST(w.shape() == (Shape{2, 2, 5, 5}));
  auto wv = w.to_vector<double>();
  for (int i = 0; i < 5; ++i)
    for (int j = i + 1; j < 5; ++j) BOOST_TEST(wv[i * 5 + j] == 0.0);  // causal
  // Cross-attention with a padded memory: padded keys get zero weight.
  Tensor mem = randn({2, 3, 8}, DType::f64, g);
  Tensor pad = from_vector(std::vector<int64_t>{0, 0, 1, 0, 0, 0}, {2, 3}, DType::i64);
  mha.forward(x, mem, pad, false, &w);
  BOOST_TEST(w.to_vector<double>()[2] == 0.0);
  BOOST_CHECK_THROW(MultiHeadAttention(10, 3, DType::f32, g), Error);
  BOOST_CHECK_THROW(mha.forward(randn({2, 5, 6}, DType::f64, g), x), Error);
}

BOOST_AUTO_TEST_CASE(encoder_layer_gradcheck_both_placements) {
  for (bool pre : {false, true}) {
    LayerConfig c;
    c.d_model = 4;
    c.heads = 2;
    c.d_ff = 6;
    c.dropout = 0.0;
    c.norm_first = pre;
    c.dtype = DType::f64;
    c.activation = pre ? Activation::gelu : Activation::relu;
    Generator g(5);
    EncoderLayer layer(c, g, nullptr);
    Tensor x = randn({2, 3, 4}, DType::f64, g);
    Tensor pad = from_vector(std::vector<int64_t>{0, 0, 1, 0, 0, 0}, {2, 3}, DType::i64);
    Tensors inputs = layer.parameters();
    GradcheckResult r = gradcheck([&](const Tensors&) { return layer.forward(x, pad); }, inputs);
    BOOST_TEST(r.ok, r.message);
  }
}

// load_state_dict checks every name, shape and dtype before it copies anything.
BOOST_AUTO_TEST_CASE(load_state_dict_checks_names_shapes_dtypes) {
  Linear a(3, 2, true, DType::f32), b(3, 2, true, DType::f32);
  b.load_state_dict(a.state_dict());
  BOOST_TEST(b.weight.to_vector<double>() == a.weight.to_vector<double>());
  auto expect = [&](NamedTensors t, const std::string& part) {
    const auto before = b.weight.to_vector<double>();
    BOOST_CHECK_EXCEPTION(b.load_state_dict(t), Error, [&](const Error& e) {
      return std::string(e.what()).find(part) != std::string::npos;
    });
    BOOST_TEST(b.weight.to_vector<double>() == before);  // nothing copied
  };
  expect({{"weight", zeros({2, 3})}}, "missing tensor 'bias'");
  expect({{"weight", zeros({2, 3})}, {"bias", zeros({2})}, {"extra", zeros({1})}},
         "unexpected tensor 'extra'");
  expect({{"weight", zeros({3, 2})}, {"bias", zeros({2})}},
         "tensor 'weight' is f32 (3, 2) but the model expects f32 (2, 3)");
  expect({{"weight", zeros({2, 3})}, {"bias", zeros({2}, DType::i64)}},
         "tensor 'bias' is i64 (2) but the model expects f32 (2)");
  // EvalScope restores the flag.
  {
    EvalScope es(b);
    BOOST_TEST(!b.training());
  }
  BOOST_TEST(b.training());
}

// Under SkipInit every layer allocates its parameters without drawing or filling them: the
// generator does not move and new_parameter() counts no initialisation; sinusoidal buffers are
// still computed. Scopes nest, and afterwards layers draw exactly as before.
BOOST_AUTO_TEST_CASE(skip_init_draws_and_fills_nothing) {
  Generator g(3);
  const uint64_t state = g.state();
  const int64_t inits = initialised_parameters();
  LayerConfig c;
  c.d_model = 8, c.heads = 2, c.d_ff = 12;
  PositionOptions rel;
  rel.kind = Positions::relative;
  {
    const SkipInit skip;
    { const SkipInit inner; }
    BOOST_TEST(SkipInit::active());
    Linear l(8, 3, true, DType::f32, g);
    Embedding e(10, 4, 0, DType::f64, g);
    LayerNorm n(8, 1e-5, DType::f32);
    RMSNorm r(8, 1e-5, DType::f32);
    MultiHeadAttention mha(8, 2, DType::f32, g);
    EmbeddingPositions learned(Positions::learned, 6, 8, DType::f32, g);
    LearnedPositionalEncoding lpe(6, 8, DType::f32, g);
    EmbeddingPositions sin(Positions::sinusoidal, 6, 8, DType::f32, g);
    Encoder enc(c, 2, true, g, nullptr, rel);
    const Tensor w = zeros({4, 4});
    xavier_uniform_(w, g), uniform_(w, -1, 1, g), normal_(w, 0, 1, g);
    BOOST_TEST(g.state() == state);
    BOOST_TEST(initialised_parameters() == inits);
    BOOST_TEST(w.to_vector<float>() == std::vector<float>(16, 0.0f));
    BOOST_TEST(l.weight.shape() == (Shape{3, 8}));
    BOOST_TEST((e.weight.dtype() == DType::f64));
    BOOST_TEST(enc.num_parameters() == encoder_parameters(c, 2, true, rel));
    BOOST_TEST(sin.named_buffers()[0].second.to_vector<double>() ==
               sinusoid_table(0, 6, 8, DType::f32).to_vector<double>());
  }
  BOOST_TEST(!SkipInit::active());
  Generator fresh(3);
  Linear drawn(8, 3, true, DType::f32, g), again(8, 3, true, DType::f32, fresh);
  BOOST_TEST(drawn.weight.to_vector<float>() == again.weight.to_vector<float>());
  BOOST_TEST(initialised_parameters() == inits + 4);
}

// adopt_state_dict checks as load_state_dict does, then takes a contiguous tensor's memory (no
// copy) and copies any other; every handle on the parameter sees the new values.
BOOST_AUTO_TEST_CASE(adopt_state_dict_takes_the_tensors_memory) {
  Linear a(3, 2, true, DType::f32);
  const Tensor w = randn({2, 3}), b = transpose(randn({1, 2}), 0, 1);
  const Tensor b_view = reshape(b, {2});
  const Tensor handle = a.weight;
  a.adopt_state_dict({{"weight", w}, {"bias", b_view}});
  BOOST_TEST(handle.same_storage(w));
  BOOST_TEST(handle.to_vector<float>() == w.to_vector<float>());
  BOOST_TEST(a.bias.to_vector<float>() == b_view.to_vector<float>());
  BOOST_TEST(a.weight.requires_grad());
  const auto before = a.weight.to_vector<float>();
  for (const auto& [bad, part] : std::vector<std::pair<NamedTensors, std::string>>{
           {{{"weight", zeros({2, 3})}}, "missing tensor 'bias'"},
           {{{"weight", zeros({3, 2})}, {"bias", zeros({2})}}, "tensor 'weight' is f32 (3, 2)"},
           {{{"weight", zeros({2, 3})}, {"bias", Tensor()}}, "tensor 'bias'"}}) {
    BOOST_CHECK_EXCEPTION(a.adopt_state_dict(bad), Error, [&](const Error& e) {
      return std::string(e.what()).find(part) != std::string::npos;
    });
    BOOST_TEST(a.weight.to_vector<float>() == before);  // nothing taken
  }
}

// Grouped cross-attention (beam search's G beams per source) reads each cache row once for its
// G query rows: the same outputs and weights as the ungrouped call over a cache whose rows are
// repeated G times; a batch that is not G x the cache's, or T > 1, is refused.
BOOST_AUTO_TEST_CASE(grouped_cross_attention_equals_repeated_cache_rows) {
  Generator g(8);
  MultiHeadAttention mha(8, 2, DType::f64, g);
  const int64_t G = 3;
  const Tensor mem = randn({2, 4, 8}, DType::f64, g), x = randn({2 * G, 1, 8}, DType::f64, g);
  const Tensor pad = from_vector(std::vector<int64_t>{0, 0, 1, 0, 0, 0, 0, 1}, {2, 4}, DType::i64);
  const Tensor rep = from_vector(std::vector<int64_t>{0, 0, 0, 1, 1, 1}, {2 * G}, DType::i64);
  KVCache grouped, repeated;
  mha.fill_cross_cache(mem, grouped);
  mha.fill_cross_cache(index_select(mem, 0, rep), repeated);
  Tensor wg, wr;
  const Tensor yg = mha.forward_cross_cached(x, grouped, pad, &wg, G);
  const Tensor yr = mha.forward_cross_cached(x, repeated, index_select(pad, 0, rep), &wr);
  BOOST_TEST(yg.shape() == (Shape{2 * G, 1, 8}));
  BOOST_TEST(wg.shape() == wr.shape());
  check_same(yg, yr, 1e-12);
  check_same(wg, wr, 1e-12);
  check_same(mha.forward_cross_cached(x, grouped, pad, nullptr, G), yr,
             1e-12);  // the no-weights path
  BOOST_CHECK_EXCEPTION(mha.forward_cross_cached(x, grouped, pad, nullptr, 2), Error,
                        [](const Error& e) { return names(e, "grouped cross-attention"); });
  BOOST_CHECK_EXCEPTION(
      mha.forward_cross_cached(randn({2 * G, 2, 8}, DType::f64, g), grouped, pad, nullptr, G),
      Error, [](const Error& e) { return names(e, "grouped cross-attention"); });
}

// A decoding step's heads are views of its projection, and its merged heads a view of the
// attention's output (no split_heads / merge_heads copies when nothing records): each cached
// self- and cross-attention step equals its position of the full forward, which records (the
// parameters want gradients) and so copies the heads; a batch of 2 makes the head views strided.
BOOST_AUTO_TEST_CASE(untaped_steps_equal_the_recorded_full_pass) {
  Generator g(9);
  MultiHeadAttention mha(8, 2, DType::f64, g);
  const int64_t B = 2, T = 3;
  const Tensor x = randn({B, T, 8}, DType::f64, g), mem = randn({B, 4, 8}, DType::f64, g);
  const Tensor self_full = mha.forward(x, x, Tensor(), true);
  const Tensor cross_full = mha.forward(x, mem, Tensor(), false);
  BOOST_TEST(self_full.requires_grad());  // the full pass went through the tape
  KVCache self, cross;
  mha.fill_cross_cache(mem, cross);
  for (int64_t t = 0; t < T; ++t) {
    const Tensor xt = slice(x, 1, t, t + 1);
    check_same(mha.forward_self_step(xt, self, T), slice(self_full, 1, t, t + 1), 1e-12);
    check_same(mha.forward_cross_cached(xt, cross, Tensor()), slice(cross_full, 1, t, t + 1),
               1e-12);
  }
  // A step of another rank (here (1, 1, 1, d): its next-to-last dim is 1 too) is not one
  // position's heads: split_heads refuses it by name.
  KVCache fresh;
  BOOST_CHECK_EXCEPTION(mha.forward_self_step(randn({1, 1, 1, 8}, DType::f64, g), fresh, T), Error,
                        [](const Error& e) { return names(e, "split_heads"); });
}

// KVCache::append writes new positions straight into its buffers (rows of Dh elements) when
// their rows are dense, through copy_into otherwise: either way the cache holds the positions in
// order (equal to their concatenation), in any dtype, and each write bumps the buffers' version
// (a tape that saved a cache view sees it changed).
BOOST_AUTO_TEST_CASE(kv_cache_append_writes_positions_of_any_layout) {
  Generator g(10);
  for (DType dt : {DType::f32, DType::bf16, DType::f64}) {
    const Tensor dense = to_dtype(randn({2, 3, 2, 4}, DType::f64, g), dt);
    // (B, H, T, Dh) whose Dh elements are 2 apart: the copy_into path
    const Tensor strided = transpose(to_dtype(randn({2, 3, 4, 2}, DType::f64, g), dt), 2, 3);
    BOOST_REQUIRE(strided.strides()[3] != 1);
    // the dense path with a row stride (a step's head views of its projection)
    const Tensor rows = slice(to_dtype(randn({2, 3, 1, 8}, DType::f64, g), dt), 3, 2, 6);
    KVCache c;
    c.append(dense, affine(dense, 2.0, 0.0), 6);
    const uint64_t v0 = c.k.version();
    c.append(strided, affine(strided, 2.0, 0.0), 6);
    BOOST_TEST(c.k.version() > v0);
    const uint64_t v1 = c.k.version();
    const auto [k, v] = c.append(rows, affine(rows, 2.0, 0.0), 6);
    BOOST_TEST(c.k.version() > v1);
    BOOST_TEST(c.len == 5);
    const Tensor all = concat({dense, strided, rows}, 2);
    BOOST_TEST(k.to_vector<double>() == all.to_vector<double>());
    BOOST_TEST(v.to_vector<double>() == affine(all, 2.0, 0.0).to_vector<double>());
    const Tensor rest = slice(c.k, 2, 5, 6);  // the unwritten position stays zero
    BOOST_TEST(rest.to_vector<double>() == std::vector<double>(rest.numel(), 0.0));
  }
}

// KVCache's k and v are public: a v that does not match k (fewer positions, another dtype) or a
// k_new that is a view of the cache itself never takes the row copy (it would write past v's
// storage, copy half the bytes, or read rows it already overwrote): the checks and values of
// copy_into, as before the row copy.
BOOST_AUTO_TEST_CASE(kv_cache_append_to_a_foreign_v_keeps_copy_into_checks) {
  Generator g(12);
  const Tensor k3 = randn({1, 1, 3, 4}, DType::f32, g);
  KVCache short_v;
  short_v.k = zeros({1, 1, 8, 4});
  short_v.v = zeros({1, 1, 2, 4});
  BOOST_CHECK_THROW(short_v.append(k3, k3, 8), Error);
  KVCache half_v;
  half_v.k = zeros({1, 1, 8, 4});
  half_v.v = zeros({1, 1, 8, 4}, DType::bf16);
  half_v.append(k3, k3, 8);
  const Tensor got = slice(half_v.v, 2, 0, 3);
  BOOST_TEST(got.to_vector<double>() == to_dtype(k3, DType::bf16).to_vector<double>());
  KVCache self;
  self.append(k3, k3, 8);
  // positions 2, 3 written to 3, 4: a row copy would read position 3 after writing it
  const Tensor own = slice(self.k, 2, 2, 4), old = contiguous_copy(own);
  self.append(own, own, 8);
  BOOST_TEST(slice(self.k, 2, 3, 5).to_vector<double>() == old.to_vector<double>());
}

// A cached cross-attention step reads the source padding mask as flags, whatever its dtype and
// layout: float32 and int64 masks (read directly), float64 and a strided int64 mask (read through
// to_vector) give one result, the recorded full pass's with that mask, and not the unmasked one.
BOOST_AUTO_TEST_CASE(cross_steps_read_padding_masks_of_any_dtype) {
  Generator g(11);
  MultiHeadAttention mha(8, 2, DType::f64, g);
  const Tensor x = randn({2, 1, 8}, DType::f64, g), mem = randn({2, 4, 8}, DType::f64, g);
  const std::vector<int64_t> flags{0, 0, 1, 0, 0, 1, 1, 0};
  const Tensor pad64 = from_vector(flags, {2, 4}, DType::i64);
  const Tensor full = mha.forward(x, mem, to_dtype(pad64, DType::f64), false);
  KVCache cross;
  mha.fill_cross_cache(mem, cross);
  const Tensor t = transpose(from_vector(flags, {4, 2}, DType::i64), 0, 1);  // (2, 4), strided
  const Tensor t_full = mha.forward(x, mem, t, false);
  for (const Tensor& m : {pad64, to_dtype(pad64, DType::f32), to_dtype(pad64, DType::f64)})
    check_same(mha.forward_cross_cached(x, cross, m), full, 1e-12);
  check_same(mha.forward_cross_cached(x, cross, t), t_full, 1e-12);
  const auto unmasked = mha.forward_cross_cached(x, cross, Tensor()).to_vector<double>();
  const auto masked = full.to_vector<double>();
  double gap = 0;
  for (size_t i = 0; i < masked.size(); ++i)
    gap = std::max(gap, std::fabs(unmasked[i] - masked[i]));
  BOOST_TEST(gap > 1e-6);
}

// Forward hooks on a small tree: the hook sees each module once per forward with its path below
// the module it was registered on, in registration order; a returned tensor replaces the output
// (and what follows computes from it, gradients included); remove() stops it; a module
// registered under two names gets the hook once.
BOOST_AUTO_TEST_CASE(forward_hooks_on_a_module_tree) {
  struct Net : nn::Module {
    std::shared_ptr<nn::Linear> a, b;
    std::shared_ptr<nn::LayerNorm> norm;
    Net() {
      Generator g(5);
      a = register_module("a", std::make_shared<nn::Linear>(3, 4, true, DType::f64, g));
      b = register_module("b", std::make_shared<nn::Linear>(4, 2, true, DType::f64, g));
      norm = register_module("norm", std::make_shared<nn::LayerNorm>(4, 1e-5, DType::f64));
      add_module("again", a);  // shared: one hook call per forward of a
    }
    Tensor forward(const Tensor& x) const {
      return hooked(b->forward(norm->forward(a->forward(x))));
    }
  } net;
  const Tensor x = from_vector(std::vector<double>{1, -2, 0.5}, {1, 3});
  const auto plain = net.forward(x).to_vector<double>();
  std::vector<std::string> order;
  nn::HookHandle h1 =
      net.register_forward_hook([&](const std::string& p, const nn::Module&, const Tensor&) {
        order.push_back("1:" + p);
        return Tensor();
      });
  nn::HookHandle h2 =
      net.a->register_forward_hook([&](const std::string& p, const nn::Module&, const Tensor& out) {
        order.push_back("2:" + p);
        return affine(out, 2.0, 0.0);  // doubles a's output; the LayerNorm then undoes the scale
      });
  BOOST_TEST(net.forward(x).to_vector<double>().size() == 2u);
  BOOST_TEST(order == (std::vector<std::string>{"1:a", "2:", "1:norm", "1:b", "1:"}),
             std::boolalpha);
  h2.remove();
  h2.remove();  // twice is harmless
  nn::HookHandle h3 =
      net.norm->register_forward_hook([](const std::string&, const nn::Module&, const Tensor& out) {
        return zeros(out.shape(), out.dtype());
      });
  // b(0) = b's bias, and no gradient reaches a through the replaced output
  BOOST_TEST(net.forward(x).to_vector<double>() == net.b->bias.to_vector<double>());
  Tensor loss = sum(net.forward(x));
  loss.backward();
  BOOST_TEST(net.b->bias.grad().defined());
  BOOST_TEST(!net.a->weight.grad().defined());
  h3.remove();
  h1.remove();
  order.clear();
  BOOST_TEST(net.forward(x).to_vector<double>() == plain);
  BOOST_TEST(order.empty());
  BOOST_TEST(!nn::HookHandle().active());
}

// Module::to converts in place: the handles the layers hold see the new dtype, gradients too.
BOOST_AUTO_TEST_CASE(module_to_dtype_in_place) {
  nn::Linear lin(3, 2);
  const Tensor w = lin.weight;  // another handle on the same parameter
  const auto before = w.to_vector<double>();
  sum(lin.forward(ones({1, 3}))).backward();
  lin.to(DType::f64);
  BOOST_TEST((w.dtype() == DType::f64));
  BOOST_TEST(w.to_vector<double>() == before);
  BOOST_TEST((lin.weight.grad().dtype() == DType::f64));
  BOOST_TEST((lin.forward(ones({1, 3}, DType::f64)).dtype() == DType::f64));
  nn::SinusoidalPositionalEncoding pe(4, 6);
  pe.to(DType::f64);
  BOOST_TEST((pe.table.dtype() == DType::f64));  // buffers too
}

namespace {
// An embedding and an output projection tied as two parameters over one storage (the projection
// a view of the embedding's memory, as a tie made with Tensor::view_of or detach()), and a view
// of the embedding's second half as a buffer.
struct Tied : nn::Module {
  Tensor emb, proj, half;
  Tied() {
    emb = register_parameter(
        "emb", from_vector(std::vector<double>{1.5, -2, 0.1, 3, 4, 5}, {3, 2}, DType::f32));
    proj = register_parameter("proj", Tensor::view_of(emb, {3, 2}, {2, 1}, 0));
    half = register_buffer("half", Tensor::view_of(emb, {3}, {1}, 3));
  }
};
}  // namespace

// Module::to converts a storage that several tensors share once and keeps it shared: a tied
// embedding and output projection stay one memory (the old code made two tensors: twice the
// memory, and in training the two would diverge), and a view keeps its place in it.
BOOST_AUTO_TEST_CASE(module_to_keeps_shared_storage_shared) {
  for (const DType dt : {DType::bf16, DType::f64, DType::f16}) {
    Tied m;
    m.to(dt);
    BOOST_TEST((m.emb.dtype() == dt && m.proj.dtype() == dt && m.half.dtype() == dt));
    BOOST_TEST(m.emb.impl()->storage == m.proj.impl()->storage);
    BOOST_TEST(m.emb.impl()->storage == m.half.impl()->storage);
    BOOST_TEST(m.half.offset() == 3);
    BOOST_TEST(m.proj.to_vector<double>() == m.emb.to_vector<double>());
    const std::vector<double> all = m.emb.to_vector<double>();
    BOOST_TEST(m.half.to_vector<double>() == std::vector<double>(all.begin() + 3, all.end()));
    fill_(m.emb, 7.0);  // one memory: a write through one is seen by the other
    BOOST_TEST(m.proj.to_vector<double>()[0] == 7.0);
  }
}

// SkipInit(Memory::none): the parameters have their shapes and dtypes but no memory (live bytes
// do not grow with the model), reading one fails naming why, and adopt_state_dict gives each its
// tensor's memory.
BOOST_AUTO_TEST_CASE(skip_init_without_memory_allocates_nothing) {
  Generator g(3);
  const size_t live = Storage::live_bytes();
  std::unique_ptr<Linear> l;
  {
    const SkipInit none(SkipInit::Memory::none);
    l = std::make_unique<Linear>(512, 1024, true, DType::f32, g);
  }
  BOOST_TEST(Storage::live_bytes() - live < size_t(4096));
  BOOST_TEST((l->weight.shape() == Shape{1024, 512} && l->weight.dtype() == DType::f32));
  BOOST_CHECK_EXCEPTION(l->weight.to_vector<float>(), Error, [](const Error& e) {
    return names(e, "built without memory") && names(e, "(1024, 512)");
  });
  BOOST_CHECK_EXCEPTION(l->to(DType::bf16), Error, [](const Error& e) {
    return names(e, "Module::to(bfloat16): 'weight'") && names(e, "built without memory");
  });
  const Tensor w = cast_copy(ones({1024, 512}), DType::bf16), b = zeros({1024});
  l->adopt_state_dict({{"weight", w}, {"bias", b}});
  BOOST_TEST((l->weight.dtype() == DType::bf16 && l->weight.impl()->storage == w.impl()->storage));
  BOOST_TEST(l->weight.requires_grad());
  {
    const SkipInit outer(SkipInit::Memory::none);
    { const SkipInit inner; }  // an inner scope restores the outer's kind
    Linear l2(4, 4, false, DType::f32, g);
    BOOST_TEST(!l2.weight.impl()->storage->data);
  }
}

namespace {
// Same dtype, shape and bits (so -0 against 0 and NaN against NaN compare as stored).
bool same_values(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const Tensor x = contiguous_copy(a), y = contiguous_copy(b);
  return std::memcmp(x.raw(), y.raw(), size_t(x.numel()) * dtype_size(x.dtype())) == 0;
}

// A parameter holding rounding edges, a float buffer and an int64 buffer: what Module::to must
// convert (the first two) and leave alone (the last).
struct Edges : nn::Module {
  Tensor w, table, ids;
  explicit Edges(DType dt) {
    // 1 + 2^-8 and 1 + 3 * 2^-8 are bf16 ties (to 1 and 1 + 2^-6); 65520 overflows float16.
    w = register_parameter(
        "w", from_vector(std::vector<double>{1 + 0x1p-8, 1 + 3 * 0x1p-8, -0.0, 65520.0, 0.1,
                                             std::numeric_limits<double>::infinity()},
                         {2, 3}, dt));
    table = register_buffer("table", from_vector(std::vector<double>{0.5, -3}, {2}, dt));
    ids = register_buffer("ids", from_vector(std::vector<int64_t>{(1ll << 53) + 1, -7}, {2}));
  }
};
}  // namespace

// Module::to in every direction among float32, float64, bfloat16 and float16: parameters, float
// buffers and gradients hold exactly what cast_copy gives (round to nearest even), the handles
// layers hold see it, int64 buffers keep their values, and an integer target is refused.
BOOST_AUTO_TEST_CASE(module_to_every_float_direction) {
  const std::vector<DType> dts = {DType::f32, DType::f64, DType::bf16, DType::f16};
  for (DType a : dts)
    for (DType b : dts) {
      BOOST_TEST_CONTEXT(dtype_name(a) << " -> " << dtype_name(b)) {
        Edges m(a);
        const Tensor handle = m.w;
        m.w.set_grad(full({2, 3}, 1 + 0x1p-8, a));
        const Tensor w0 = cast_copy(m.w, a), t0 = cast_copy(m.table, a);
        m.to(b);
        BOOST_TEST((handle.dtype() == b));
        BOOST_TEST(handle.requires_grad());
        BOOST_TEST((m.table.dtype() == b));
        BOOST_TEST(same_values(handle, cast_copy(w0, b)));
        BOOST_TEST(same_values(m.table, cast_copy(t0, b)));
        BOOST_TEST((handle.grad().dtype() == b));
        BOOST_TEST(same_values(handle.grad(), cast_copy(full({2, 3}, 1 + 0x1p-8, a), b)));
        BOOST_TEST((m.ids.dtype() == DType::i64));
        BOOST_TEST(m.ids.to_vector<int64_t>() == (std::vector<int64_t>{(1ll << 53) + 1, -7}));
      }
    }
  // The rounding itself, against values worked out by hand.
  Edges m(DType::f64);
  m.to(DType::bf16);
  const auto bf = m.w.to_vector<double>();
  BOOST_TEST(bf[0] == 1.0);            // tie to even: down
  BOOST_TEST(bf[1] == 1 + 0x1p-6);     // tie to even: up
  BOOST_TEST(std::signbit(bf[2]));     // -0 stays -0
  BOOST_TEST(bf[3] == 65536.0);        // bf16 has float32's range
  BOOST_TEST(bf[4] == 0.10009765625);  // 0.1 to 8 significant bits
  m.to(DType::f16);
  BOOST_TEST(m.w.to_vector<double>()[3] == std::numeric_limits<double>::infinity());
  for (DType bad : {DType::i64, DType::i8}) {
    BOOST_CHECK_EXCEPTION(m.to(bad), Error, [&](const Error& e) {
      return std::string(e.what()) ==
             std::string(
                 "Module::to: a module converts to a float dtype (float32, float64, "
                 "bfloat16 or float16), not ") +
                 dtype_name(bad);
    });
    BOOST_TEST((m.w.dtype() == DType::f16));  // nothing changed
  }
}

// load_state_dict converts a float tensor of another dtype into the parameter's dtype (as
// PyTorch's copy_ does); adopt_state_dict keeps the given dtype; an integer tensor for a float
// parameter is refused by both, before anything changes.
BOOST_AUTO_TEST_CASE(loading_another_float_dtype_converts_or_adopts) {
  const Tensor w = from_vector(std::vector<double>{1 + 0x1p-8, 1 + 3 * 0x1p-8, -2, 0.1, 7, 1e-3},
                               {2, 3}, DType::f64);
  const Tensor b = from_vector(std::vector<double>{0.5, -0.25}, {2}, DType::bf16);
  Linear into_bf16(3, 2, true, DType::bf16);
  into_bf16.load_state_dict({{"weight", w}, {"bias", b}});
  BOOST_TEST((into_bf16.weight.dtype() == DType::bf16));  // the parameter keeps its dtype
  BOOST_TEST(same_values(into_bf16.weight, cast_copy(w, DType::bf16)));
  BOOST_TEST(into_bf16.weight.to_vector<double>()[0] == 1.0);  // rounded to nearest even
  Linear into_f32(3, 2, true, DType::f32);
  into_f32.load_state_dict({{"weight", cast_copy(w, DType::bf16)}, {"bias", b}});
  BOOST_TEST((into_f32.weight.dtype() == DType::f32));
  BOOST_TEST(same_values(into_f32.weight, cast_copy(cast_copy(w, DType::bf16), DType::f32)));

  Linear adopted(3, 2, true, DType::f32);
  const Tensor handle = adopted.weight;
  const Tensor wb = cast_copy(w, DType::bf16);
  const Tensor strided = Tensor::view_of(
      from_vector(std::vector<double>{0.5, 9, -0.25}, {3}, DType::f16), {2}, {2}, 0);
  adopted.adopt_state_dict({{"weight", wb}, {"bias", strided}});
  BOOST_TEST((handle.dtype() == DType::bf16));  // the file's dtype, in the file's memory
  BOOST_TEST(handle.same_storage(wb));
  BOOST_TEST((adopted.bias.dtype() == DType::f16));
  BOOST_TEST(adopted.bias.to_vector<double>() == (std::vector<double>{0.5, -0.25}));
  BOOST_TEST(adopted.weight.requires_grad());

  const NamedTensors int8_weight = {{"weight", zeros({2, 3}, DType::i8)}, {"bias", b}};
  const std::string why =
      "load_state_dict: tensor 'weight' is i8 (2, 3) but the model expects f32 (2, 3) (only "
      "float dtypes convert into each other on load)";
  auto refused = [&](const std::function<void()>& f) {
    BOOST_CHECK_EXCEPTION(f(), Error, [&](const Error& e) { return e.what() == why; });
  };
  refused([&] { into_f32.load_state_dict(int8_weight); });
  Linear fresh(3, 2, true, DType::f32);
  refused([&] { fresh.adopt_state_dict(int8_weight); });
  BOOST_TEST((fresh.weight.dtype() == DType::f32));
  BOOST_TEST((fresh.bias.dtype() == DType::f32));
}

BOOST_AUTO_TEST_SUITE_END()
