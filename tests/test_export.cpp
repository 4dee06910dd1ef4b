// int8 and bf16 exports (models/exported.h, models/run.h): a run's weights saved in the form
// inference runs on load without a float32 copy of a quantized weight (Storage::peak_live_bytes of
// a base-sized model near the export's bytes, not the float32 model's), decode exactly as the model
// converted after loading (keep_for_inference), and every bad file is refused naming the file and
// the tensor.
#include <boost/test/unit_test.hpp>
#include <filesystem>
#include <fstream>
#include <functional>

#include "graft/models/exported.h"
#include "graft/models/run.h"
#include "graft/models/transformer.h"
#include "graft/nn/train/checkpoint.h"
#include "graft/ops/ops.h"
#include "tests/test_util.h"

using namespace graft;
using namespace graft::models;
using graft::testing::names;
using graft::testing::TempDir;

namespace {

TransformerConfig small_config(int64_t d = 32) {
  TransformerConfig c;
  c.vocab = 40, c.d_model = d, c.heads = 2, c.d_ff = 64, c.max_len = 32;
  c.enc_layers = c.dec_layers = 2;
  c.dropout = 0;
  c.seed = 7;
  return c;
}

// A run directory of config c's model: config.json and model.safetensors tied to it, as
// translate and graft_bench --what save_model write one. Returns the model's float32 bytes.
size_t save_run(const TempDir& dir, const TransformerConfig& c) {
  Transformer m(c);
  train::save_json(dir / "config.json", {{"model", c.to_json()}});
  train::save_weights(m.state_dict(), dir / "model.safetensors", 3, "graft-transformer",
                      {dir / "config.json"});
  size_t bytes = 0;
  for (auto& [n, t] : m.named_parameters()) bytes += (size_t)t.numel() * 4;
  return bytes;
}

// Writes the run's export at p from its model.safetensors, as `translate export` does.
void export_run(const TempDir& dir, Precision p) {
  auto lr = load_run_model<Transformer>(dir.path.string(), {}, p, RunSource::weights);
  save_export(*lr.model, p, dir / export_file_name(p), lr.weights, lr.metadata,
              {dir / "config.json"});
}

// Rewrites the run's export at p through `edit`, keeping its metadata (a fresh checksum): a file
// that is well formed but wrong inside.
void edit_export(const TempDir& dir, Precision p,
                 const std::function<void(nn::NamedTensors&)>& edit) {
  const std::string path = dir / export_file_name(p);
  train::SafetensorsFile f = train::load_safetensors(path);
  edit(f.tensors);
  train::save_weights(f.tensors, path, 3, f.metadata.at("format"), {dir / "config.json"},
                      {{"precision", f.metadata.at("precision")},
                       {"source_checksum", f.metadata.at("source_checksum")}});
}

Tensor source_ids() {
  return from_vector(std::vector<int64_t>{5, 9, 11, 3, 0, 0, 7, 8, 12, 13, 14, 3}, {2, 6});
}

// Greedy and beam outputs and the full-sequence logits of the model at p.
struct Outputs {
  Sequences greedy, beam;
  std::vector<float> logits;
};
Outputs outputs(const Transformer& m, Precision p) {
  PrecisionGuard guard(p);
  autograd::NoGrad ng;
  DecodeOptions o;
  o.max_len = 10;
  o.stop_at_eos = false;
  Outputs r;
  r.greedy = translate(m, source_ids(), o);
  o.beam = 3;
  r.beam = translate(m, source_ids(), o);
  const Tensor tgt = from_vector(std::vector<int64_t>{2, 4, 6, 2, 9, 10}, {2, 3});
  r.logits = to_dtype(m.forward(source_ids(), tgt), DType::f32).to_vector<float>();
  return r;
}

bool fails_naming(const std::function<void()>& fn, std::initializer_list<const char*> parts) {
  try {
    fn();
  } catch (const Error& e) {
    for (const char* p : parts)
      if (!names(e, p)) {
        BOOST_TEST_MESSAGE("the error was: " << e.what());
        return false;
      }
    return true;
  }
  return false;
}

// A loader of the run at dir at precision p, for fails_naming.
std::function<void()> loader(const TempDir& dir, Precision p) {
  return [&dir, p] { load_run_model<Transformer>(dir.path.string(), {}, p); };
}

Tensor& tensor_named(nn::NamedTensors& t, const std::string& name) {
  for (auto& [n, v] : t)
    if (n == name) return v;
  throw std::runtime_error("no tensor " + name);
}

const std::string w = "decoder.layers.1.linear2.weight", s = w + "_scale";

}  // namespace

BOOST_AUTO_TEST_SUITE(exported)

// The export loads to exactly the model keep_for_inference makes of the float32 one: the same
// greedy and beam outputs and the same logits bit for bit; an int8 export's linear weights hold
// no float32 bytes, a bf16 export's model is bf16; and without the export the float32 file loads.
BOOST_AUTO_TEST_CASE(exports_decode_as_the_model_converted_after_loading) {
  TempDir dir("export_same");
  save_run(dir, small_config());
  for (const Precision p : {Precision::int8, Precision::bf16}) {
    auto converted = load_run_model<Transformer>(dir.path.string());
    keep_for_inference(*converted.model, p);
    BOOST_TEST(load_run_model<Transformer>(dir.path.string(), {}, p).weights ==
               dir / "model.safetensors");  // no export yet
    export_run(dir, p);
    auto loaded = load_run_model<Transformer>(dir.path.string(), {}, p);
    BOOST_TEST(loaded.weights == dir / export_file_name(p));
    BOOST_TEST(keep_for_inference(*loaded.model, p) == size_t(0));  // nothing left to convert
    for (auto& [name, w] : int8_linear_weights(*loaded.model))
      BOOST_TEST((p == Precision::bf16 ? w.dtype() == DType::bf16 : !w.impl()->storage->data),
                 name);
    const Outputs a = outputs(*converted.model, p), b = outputs(*loaded.model, p);
    BOOST_TEST(a.greedy == b.greedy);
    BOOST_TEST(a.beam == b.beam);
    BOOST_TEST(a.logits == b.logits);
  }
}

// A base-sized model (d 512, FFN 2048, 6 + 6 layers): loading its int8 export allocates about the
// export's bytes (int8 linear weights, their scales, the float32 embedding and norms), never a
// float32 copy of a weight; its bf16 export about half the float32 model. Convert-after-load
// peaks at the float32 model.
BOOST_AUTO_TEST_CASE(loading_an_export_never_allocates_the_float32_model) {
  TempDir dir("export_peak");
  TransformerConfig c = small_config(512);
  c.heads = 8, c.d_ff = 2048, c.enc_layers = c.dec_layers = 6, c.vocab = 1000;
  const size_t f32_bytes = save_run(dir, c);
  for (const Precision p : {Precision::int8, Precision::bf16}) {
    export_run(dir, p);
    const size_t file = std::filesystem::file_size(dir / export_file_name(p));
    const size_t before = Storage::live_bytes();
    Storage::reset_peak_live_bytes();
    {
      auto loaded = load_run_model<Transformer>(dir.path.string(), {}, p);
      keep_for_inference(*loaded.model, p);
    }
    const size_t peak = Storage::peak_live_bytes() - before;
    BOOST_TEST_MESSAGE(precision_name(p) << ": export " << file << " bytes, loading peaked at "
                                         << peak << ", the float32 model is " << f32_bytes);
    BOOST_TEST(peak < file + file / 10 + (size_t(4) << 20));
    BOOST_TEST(peak < f32_bytes * (p == Precision::int8 ? 35 : 55) / 100);
  }
  Storage::reset_peak_live_bytes();
  const size_t before = Storage::live_bytes();
  {
    auto converted = load_run_model<Transformer>(dir.path.string());
    keep_for_inference(*converted.model, Precision::int8);
  }
  BOOST_TEST(Storage::peak_live_bytes() - before >= f32_bytes);  // what the export avoids
}

// Every bad tensor of an export is refused naming the file and the tensor.
BOOST_AUTO_TEST_CASE(bad_export_tensors_name_the_file_and_tensor) {
  TempDir dir("export_bad");
  save_run(dir, small_config());
  const std::string int8 = dir / "model.int8.safetensors";
  const auto load = [&](Precision p) { return loader(dir, p); };
  const auto at = tensor_named;
  export_run(dir, Precision::int8);
  edit_export(dir, Precision::int8, [&](auto& t) { at(t, w) = to_dtype(at(t, w), DType::f32); });
  BOOST_TEST(
      fails_naming(load(Precision::int8),
                   {int8.c_str(), "'decoder.layers.1.linear2.weight' is f32", "as int8 values"}));
  export_run(dir, Precision::int8);
  edit_export(dir, Precision::int8, [&](auto& t) { at(t, s) = zeros({3}); });
  BOOST_TEST(
      fails_naming(load(Precision::int8), {int8.c_str(), s.c_str(), "is f32 (3)", "f32 (32)"}));
  export_run(dir, Precision::int8);
  edit_export(dir, Precision::int8,
              [&](auto& t) { std::erase_if(t, [&](auto& e) { return e.first == s; }); });
  BOOST_TEST(fails_naming(load(Precision::int8), {int8.c_str(), s.c_str(), "is missing"}));
  export_run(dir, Precision::int8);
  edit_export(dir, Precision::int8, [&](auto& t) {
    at(t, "embedding.weight") = zeros({40, 32}, DType::i8);
    t.emplace_back("embedding.weight_scale", ones({40}));
  });
  BOOST_TEST(fails_naming(load(Precision::int8),
                          {int8.c_str(), "'embedding.weight' is i8", "in float32"}));
  export_run(dir, Precision::int8);
  edit_export(dir, Precision::int8, [&](auto& t) { fill_(at(t, w), -128.0); });
  BOOST_TEST(fails_naming(load(Precision::int8), {int8.c_str(), w.c_str(), "-128"}));
  export_run(dir, Precision::int8);
  edit_export(dir, Precision::int8, [&](auto& t) { at(t, s) = neg(ones({32})); });
  BOOST_TEST(fails_naming(load(Precision::int8), {int8.c_str(), s.c_str(), "finite and >= 0"}));
  // An int8 export keeps the other parameters in the model's dtype.
  const std::string bias = "decoder.layers.1.linear2.bias";
  export_run(dir, Precision::int8);
  edit_export(dir, Precision::int8,
              [&](auto& t) { at(t, bias) = to_dtype(at(t, bias), DType::bf16); });
  BOOST_TEST(fails_naming(load(Precision::int8),
                          {int8.c_str(), ("'" + bias + "' is bf16").c_str(), "float32"}));
  // A bf16 export with a float32 tensor, and one under the int8 name.
  export_run(dir, Precision::bf16);
  edit_export(dir, Precision::bf16, [&](auto& t) { at(t, w) = to_dtype(at(t, w), DType::f32); });
  BOOST_TEST(fails_naming(load(Precision::bf16),
                          {"model.bf16.safetensors", w.c_str(), "every parameter in bf16"}));
}

// An export under the wrong name, of another run or of weights trained since is refused naming
// the file and the file it does not match.
BOOST_AUTO_TEST_CASE(exports_of_another_model_are_refused) {
  TempDir dir("export_other_model");
  save_run(dir, small_config());
  const std::string int8 = dir / "model.int8.safetensors";
  const auto load = [&](Precision p) { return loader(dir, p); };
  export_run(dir, Precision::bf16);
  std::filesystem::copy_file(dir / "model.bf16.safetensors", int8,
                             std::filesystem::copy_options::overwrite_existing);
  BOOST_TEST(fails_naming(load(Precision::int8), {int8.c_str(), "not an int8 export"}));
  {  // refused from its header, before its bytes are read and checksummed
    std::fstream f(int8, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x5a');
  }
  BOOST_TEST(fails_naming(load(Precision::int8), {int8.c_str(), "not an int8 export"}));
  // An export of another model: of weights trained further, and of another config.
  export_run(dir, Precision::int8);
  TempDir other("export_other");
  save_run(other, small_config(48));
  export_run(other, Precision::int8);
  std::filesystem::copy_file(other / "model.int8.safetensors", int8,
                             std::filesystem::copy_options::overwrite_existing);
  BOOST_TEST(fails_naming(load(Precision::int8), {int8.c_str(), "config.json", "does not match"}));
  export_run(dir, Precision::int8);
  TransformerConfig retrained = small_config();
  retrained.seed = 8;
  Transformer m(retrained);
  train::save_weights(m.state_dict(), dir / "model.safetensors", 4, "graft-transformer",
                      {dir / "config.json"});
  BOOST_TEST(fails_naming(load(Precision::int8),
                          {int8.c_str(), "exported from other weights", "model.safetensors"}));
}

// An export records the checksum of the file its model was loaded from: a checkpoint written
// between loading and exporting makes the export stale, and it is refused.
BOOST_AUTO_TEST_CASE(an_export_records_the_weights_it_was_made_from) {
  TempDir dir("export_stale");
  save_run(dir, small_config());
  auto lr = load_run_model<Transformer>(dir.path.string(), {}, Precision::int8, RunSource::weights);
  TransformerConfig retrained = small_config();
  retrained.seed = 8;
  train::save_weights(Transformer(retrained).state_dict(), dir / "model.safetensors", 4,
                      "graft-transformer", {dir / "config.json"});
  save_export(*lr.model, Precision::int8, dir / "model.int8.safetensors", lr.weights, lr.metadata,
              {dir / "config.json"});
  BOOST_TEST(fails_naming(loader(dir, Precision::int8), {"exported from other weights"}));
  // The source's metadata is checked: its checksum present, its step a count.
  const auto save = [&](std::map<std::string, std::string> meta) {
    return [&lr, &dir, meta] {
      save_export(*lr.model, Precision::int8, dir / "x.safetensors", "src.safetensors", meta, {});
    };
  };
  BOOST_TEST(fails_naming(save({{"step", "3"}}), {"export: 'src.safetensors'", "no checksum"}));
  BOOST_TEST(fails_naming(save({{"checksum", "1"}, {"step", "3x"}}),
                          {"'src.safetensors'", "\"step\" is '3x'"}));
  BOOST_TEST(!std::filesystem::exists(dir / "x.safetensors"));
}

// Loading an export checks its size against memory before reading it.
BOOST_AUTO_TEST_CASE(an_export_larger_than_memory_is_refused_first) {
  BOOST_TEST(fails_naming([] { check_file_memory(1e19, 0, "big.safetensors"); },
                          {"'big.safetensors'", "loading it takes", "of memory"}));
  check_file_memory(1 << 20, 100, "small.safetensors");
}

BOOST_AUTO_TEST_SUITE_END()
