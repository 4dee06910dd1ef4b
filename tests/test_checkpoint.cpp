#include <boost/test/unit_test.hpp>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "graft/autograd/tensor.h"
#include "graft/nn/train/checkpoint.h"
#include "graft/nn/train/checkpoint_dir.h"
#include "graft/nn/transformer.h"
#include "tests/test_util.h"

using namespace graft;
namespace fs = std::filesystem;

namespace {

// A fresh directory per test, removed afterwards, so tests never see each other's files.
struct TempDir {
  graft::testing::TempDir made{"ck"};
  fs::path dir = made.path;
  std::string file(const std::string& name) const { return (dir / name).string(); }
  // Names of everything in the directory: lets tests prove no temp file was left behind.
  std::vector<std::string> listing() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
};

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  BOOST_REQUIRE(out.good());
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = char((n >> (8 * i)) & 0xff);
  return s;
}

// A safetensors file from a header text and a data section, for hand-built bad inputs.
std::string st_file(const std::string& header, const std::string& data = "") {
  return le64(header.size()) + header + data;
}

// The bytes of a tensor in row-major order, gathered element by element with memcpy so the
// comparison is on bits (NaN payloads, -0.0) rather than values.
std::string tensor_bytes(const Tensor& t) {
  const size_t es = dtype_size(t.dtype());
  std::string out;
  const char* base = static_cast<const char*>(t.raw());
  for_each_offset(t.shape(), t.strides(),
                  [&](int64_t o) { out.append(base + o * int64_t(es), es); });
  return out;
}

template <class T>
T bits_to(uint64_t bits) {
  T v;
  std::memcpy(&v, &bits, sizeof(T));
  return v;
}

// Loads bytes written to a file and requires a graft::Error with the standard prefix that
// contains every one of `parts`.
void expect_load_error(const TempDir& td, const std::string& bytes,
                       const std::vector<std::string>& parts) {
  const std::string path = td.file("bad.safetensors");
  write_bytes(path, bytes);
  try {
    train::load_safetensors(path);
    BOOST_ERROR("expected a graft::Error containing '" << parts.front() << "'");
  } catch (const Error& e) {
    const std::string msg = e.what();
    const std::string prefix = "load_safetensors: '" + path + "': ";
    BOOST_TEST_CONTEXT("message: " << msg) {
      BOOST_TEST(msg.rfind(prefix, 0) == 0u);
      for (const auto& p : parts)
        BOOST_TEST(msg.find(p) != std::string::npos, "missing '" << p << "'");
    }
  }
}

std::string small_valid_file(const TempDir& td) {
  const std::string path = td.file("small.safetensors");
  train::save_safetensors(path,
                          {{"w", from_vector(std::vector<float>{1.f, 2.f, 3.f, 4.f}, {2, 2})},
                           {"step", from_vector(std::vector<int64_t>{7}, {})},
                           {"e", Tensor::empty({0}, DType::f64)}},
                          {{"k", "v"}});
  return read_bytes(path);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(checkpoint)

BOOST_AUTO_TEST_CASE(round_trip_is_bit_exact) {
  TempDir td;
  const float nan_payload = bits_to<float>(0x7fa00001u);  // signalling NaN with a payload
  Tensor f32 = from_vector(
      std::vector<float>{1.5f, -0.0f, nan_payload, std::numeric_limits<float>::infinity(),
                         std::numeric_limits<float>::denorm_min(), 3.25e-7f},
      {2, 3});
  Tensor f64 = from_vector(std::vector<double>{M_PI, -1e300, bits_to<double>(0xfff8000000000123ull),
                                               std::numeric_limits<double>::denorm_min()},
                           {4});
  Tensor i64 = from_vector(std::vector<int64_t>{std::numeric_limits<int64_t>::min(), -1, 0,
                                                std::numeric_limits<int64_t>::max(), 42, 7},
                           {3, 1, 2});
  Tensor scalar0 = from_vector(std::vector<double>{-2.5}, {});
  Tensor empty = Tensor::empty({0, 5}, DType::f32);
  // A transposed view with an offset into a bigger storage: written as its contiguous copy.
  Tensor base = arange(0.0, 24.0, 1.0, DType::f32);
  base.data<float>()[9] = nan_payload;
  Tensor view = Tensor::view_of(base, {3, 2}, {1, 4}, 5);  // rows 5..7, cols step 4
  BOOST_REQUIRE(!view.is_contiguous());

  const std::vector<std::pair<std::string, Tensor>> in = {{"enc.w", f32},  {"enc.b", f64},
                                                          {"ids", i64},    {"scale", scalar0},
                                                          {"none", empty}, {"view", view}};
  const std::string path = td.file("model.safetensors");
  train::save_safetensors(path, in);
  BOOST_TEST(td.listing() == std::vector<std::string>{"model.safetensors"});

  const std::string bytes = read_bytes(path);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(bytes[i])) << (8 * i);
  BOOST_TEST((8 + n) % 8 == 0u);  // data section is 8-byte aligned

  const auto loaded = train::load_safetensors(path);
  BOOST_TEST(loaded.metadata.empty());
  BOOST_REQUIRE_EQUAL(loaded.tensors.size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    BOOST_TEST_CONTEXT("tensor " << in[i].first) {
      const Tensor& got = loaded.tensors[i].second;
      BOOST_TEST(loaded.tensors[i].first == in[i].first);  // save order is kept
      BOOST_TEST(dtype_name(got.dtype()) == dtype_name(in[i].second.dtype()));
      BOOST_TEST(got.shape() == in[i].second.shape());
      BOOST_TEST(got.is_contiguous());
      BOOST_TEST(tensor_bytes(got) == tensor_bytes(in[i].second));
    }
  }
  BOOST_TEST(loaded.at("scale").dim() == 0);
  BOOST_TEST(loaded.at("scale").item() == -2.5);
  BOOST_TEST(loaded.at("view").to_vector<double>()[2] == 6.0);
  BOOST_TEST(std::isnan(loaded.at("view").to_vector<float>()[1]));

  // Saving what was loaded reproduces the file byte for byte.
  const std::string again = td.file("again.safetensors");
  train::save_safetensors(again, loaded.tensors);
  BOOST_TEST(read_bytes(again) == bytes);
}

// BF16, F16 and I8 tensors are written in their own dtype and load back as the same dtype and
// bits (no widening): NaN payloads, -0, infinities, subnormals, int8's extremes, a strided view.
BOOST_AUTO_TEST_CASE(sixteen_bit_and_int8_tensors_round_trip_as_stored) {
  TempDir td;
  auto half = [](DType dt, const std::vector<uint16_t>& bits, const Shape& shape) {
    Tensor t = Tensor::empty(shape, dt);
    std::memcpy(t.raw(), bits.data(), bits.size() * 2);
    return t;
  };
  // bf16: 1, -0, a NaN with a payload, -inf, the smallest subnormal, the largest finite.
  const Tensor bf = half(DType::bf16, {0x3f80, 0x8000, 0x7fc1, 0xff80, 0x0001, 0x7f7f}, {2, 3});
  // f16: 65504, -0, a signalling NaN, inf, the smallest subnormal, 1/3 rounded.
  const Tensor h = half(DType::f16, {0x7bff, 0x8000, 0x7d01, 0x7c00, 0x0001, 0x3555}, {3, 2});
  const Tensor i8 = from_vector(std::vector<int64_t>{-128, 127, 0, -1, 5}, {5}, DType::i8);
  const Tensor hv = Tensor::view_of(h, {2, 3}, {1, 2}, 0);  // the transpose of h
  const std::vector<std::pair<std::string, Tensor>> in = {
      {"bf", bf}, {"h", h}, {"q", i8}, {"hv", hv}, {"none", Tensor::empty({0}, DType::bf16)}};
  const std::string path = td.file("half.safetensors");
  train::save_safetensors(path, in);
  const std::string bytes = read_bytes(path);
  for (const char* dt : {R"("dtype":"BF16")", R"("dtype":"F16")", R"("dtype":"I8")"})
    BOOST_TEST(bytes.find(dt) != std::string::npos, "header lacks " << dt);
  const auto loaded = train::load_safetensors(path);
  BOOST_REQUIRE_EQUAL(loaded.tensors.size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    BOOST_TEST_CONTEXT("tensor " << in[i].first) {
      const Tensor& got = loaded.tensors[i].second;
      BOOST_TEST(dtype_name(got.dtype()) == dtype_name(in[i].second.dtype()));
      BOOST_TEST(got.shape() == in[i].second.shape());
      BOOST_TEST(tensor_bytes(got) == tensor_bytes(in[i].second));
    }
  }
  BOOST_TEST(loaded.at("q").to_vector<int64_t>() == (std::vector<int64_t>{-128, 127, 0, -1, 5}));
  BOOST_TEST(loaded.at("h").to_vector<double>()[0] == 65504.0);
  BOOST_TEST(std::isnan(loaded.at("bf").to_vector<double>()[2]));
  const std::string again = td.file("again.safetensors");
  train::save_safetensors(again, loaded.tensors);
  BOOST_TEST(read_bytes(again) == bytes);
}

namespace {
// A small encoder (several weight matrices, biases and norms) in dtype dt, drawn from seed 7.
std::unique_ptr<nn::Encoder> small_encoder(DType dt) {
  nn::LayerConfig c;
  c.d_model = 16, c.heads = 2, c.d_ff = 32, c.dtype = dt;
  Generator g(7);
  return std::make_unique<nn::Encoder>(c, 2, true, g, nullptr);
}
uint64_t data_bytes(const std::string& path) {
  const std::string b = read_bytes(path);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(b[i])) << (8 * i);
  return b.size() - 8 - n;
}
}  // namespace

// A checkpoint of a bf16 model holds half the bytes of its float32 one, and loads back bit for
// bit: through load_state_dict into a bf16 model, and through adopt_state_dict into a model built
// in float32 under SkipInit, whose parameters then become the file's bf16 tensors. A float32 file
// loaded into a bf16 model rounds as Module::to does.
BOOST_AUTO_TEST_CASE(bf16_checkpoint_is_half_the_size_and_loads_back_bit_identical) {
  TempDir td;
  auto model = small_encoder(DType::f32);
  const std::string f32_file = td.file("f32.safetensors"), bf_file = td.file("bf16.safetensors");
  train::save_weights(model->state_dict(), f32_file, 1, "test");
  model->to(DType::bf16);
  train::save_weights(model->state_dict(), bf_file, 1, "test");
  BOOST_TEST(2 * data_bytes(bf_file) == data_bytes(f32_file));
  BOOST_TEST(fs::file_size(bf_file) * 10 < fs::file_size(f32_file) * 6);  // the header aside

  const auto sd = train::load_weights(bf_file, "load");
  auto same_as_saved = [&](const nn::Module& m) {
    const auto want = model->state_dict(), got = m.state_dict();
    BOOST_REQUIRE_EQUAL(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      BOOST_TEST((got[i].second.dtype() == DType::bf16), got[i].first);
      BOOST_TEST(tensor_bytes(got[i].second) == tensor_bytes(want[i].second), got[i].first);
    }
  };
  auto into_bf16 = small_encoder(DType::bf16);
  into_bf16->load_state_dict(sd);
  same_as_saved(*into_bf16);
  std::unique_ptr<nn::Encoder> adopted;
  {
    const nn::SkipInit skip;
    adopted = small_encoder(DType::f32);
  }
  adopted->adopt_state_dict(sd);  // keeps the file's dtype
  same_as_saved(*adopted);

  auto from_f32 = small_encoder(DType::bf16);
  from_f32->load_state_dict(train::load_weights(f32_file, "load"));  // converted on load
  same_as_saved(*from_f32);
}

BOOST_AUTO_TEST_CASE(metadata_round_trip_and_lookup) {
  TempDir td;
  const std::string path = td.file("m.safetensors");
  const std::map<std::string, std::string> meta = {
      {"format", "pt"},
      {"step", "1200"},
      {"note", "quotes \" and \\ and ünïcödé\nnewline"},
      {"", ""}};
  train::save_safetensors(path, {{"x", ones({2})}}, meta);
  const auto f = train::load_safetensors(path);
  BOOST_TEST(f.metadata == meta);
  BOOST_TEST(f.contains("x"));
  BOOST_TEST(!f.contains("y"));
  try {
    f.at("dec.w");
    BOOST_ERROR("expected a throw");
  } catch (const Error& e) {
    const std::string msg = e.what();
    BOOST_TEST(msg.find("'dec.w'") != std::string::npos);
    BOOST_TEST(msg.find(path) != std::string::npos);
  }

  // No tensors at all is a valid file too.
  train::save_safetensors(path, {}, {{"only", "meta"}});
  const auto g = train::load_safetensors(path);
  BOOST_TEST(g.tensors.empty());
  BOOST_TEST(g.metadata.at("only") == "meta");
}

BOOST_AUTO_TEST_CASE(save_rejects_bad_input_without_touching_disk) {
  TempDir td;
  const std::string path = td.file("s.safetensors");
  auto expect = [&](const std::vector<std::pair<std::string, Tensor>>& ts,
                    const std::string& part) {
    try {
      train::save_safetensors(path, ts);
      BOOST_ERROR("expected a throw for " << part);
    } catch (const Error& e) {
      const std::string msg = e.what();
      BOOST_TEST(msg.rfind("save_safetensors: '" + path + "': ", 0) == 0u, msg);
      BOOST_TEST(msg.find(part) != std::string::npos, msg);
    }
  };
  expect({{"a", ones({1})}, {"a", ones({2})}}, "duplicate tensor name 'a'");
  expect({{"__metadata__", ones({1})}}, "reserved");
  expect({{"u", Tensor()}}, "'u' is undefined");
  expect({{"bad\xff", ones({1})}}, "UTF-8");
  BOOST_TEST(td.listing().empty());
}

BOOST_AUTO_TEST_CASE(hand_built_files_that_are_valid) {
  TempDir td;
  const std::string path = td.file("ok.safetensors");
  // Header order differs from data order, and the header is padded with trailing spaces.
  std::string data = le64(5) + std::string("\x00\x00\x80\x3f", 4);  // i64 5, then f32 1.0
  write_bytes(path,
              st_file(R"({"b": {"dtype": "F32", "shape": [], "data_offsets": [8, 12]},)"
                      R"( "a": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]},)"
                      R"( "z": {"dtype": "F64", "shape": [0, 3], "data_offsets": [12, 12]}}   )",
                      data));
  const auto f = train::load_safetensors(path);
  BOOST_REQUIRE_EQUAL(f.tensors.size(), 3u);
  BOOST_TEST(f.tensors[0].first == "a");  // loaded in data order
  BOOST_TEST(f.at("a").to_vector<int64_t>() == std::vector<int64_t>{5});
  BOOST_TEST(f.at("b").item() == 1.0);
  BOOST_TEST(f.at("z").numel() == 0);

  write_bytes(path, st_file("{}"));
  BOOST_TEST(train::load_safetensors(path).tensors.empty());
}

namespace {

// A header of one tensor entry: {"<name>": <body>}.
std::string entry(const std::string& name, const std::string& body) {
  return "{\"" + name + "\": " + body + "}";
}

const std::string f32x6(24, '\0');  // the data of a (2, 3) float32 tensor

}  // namespace

// Every validation error of load_safetensors is reported, one test case per part of the file.
BOOST_AUTO_TEST_CASE(safetensors_framing_and_header_errors) {
  TempDir td;
  // Framing.
  expect_load_error(td, "", {"file is 0 bytes", "too short"});
  expect_load_error(td, std::string(7, '\0'), {"file is 7 bytes", "too short"});
  expect_load_error(td, le64(100) + "{}", {"header length 100", "larger than the 2 bytes"});
  expect_load_error(td, le64(100'000'001) + "{}", {"header length 100000001", "exceeds the limit"});
  expect_load_error(td, le64(~0ull) + "{}", {"exceeds the limit"});

  // Header JSON.
  expect_load_error(td, st_file(""), {"header is not valid JSON"});
  expect_load_error(td, st_file("{\"a\": tru}"),
                    {"header is not valid JSON: parse error at line 1, column 10"});
  expect_load_error(td, st_file("{\"a\xff\": 1}"), {"header is not valid JSON"});
  expect_load_error(td, st_file("[1, 2]"), {"header is not a JSON object", "array"});
  expect_load_error(td, st_file("{} {}"), {"header is not valid JSON"});
  expect_load_error(td,
                    st_file(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
                            R"( "w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                            std::string(8, '\0')),
                    {"tensor 'w' appears twice"});
}

BOOST_AUTO_TEST_CASE(safetensors_metadata_and_entry_errors) {
  TempDir td;
  // Metadata.
  expect_load_error(td, st_file(R"({"__metadata__": [1]})"), {"__metadata__ is not a JSON object"});
  expect_load_error(td, st_file(R"({"__metadata__": {"step": 3}})"),
                    {"__metadata__ value for 'step' is not a string", "3"});

  // Entry structure.
  expect_load_error(td, st_file(entry("w", "[1]")), {"tensor 'w'", "not a JSON object"});
  expect_load_error(
      td, st_file(entry("w", R"({"shape": [1], "data_offsets": [0, 4]})"), std::string(4, 0)),
      {"tensor 'w'", "missing 'dtype'"});
  expect_load_error(
      td, st_file(entry("w", R"({"dtype": "F32", "data_offsets": [0, 4]})"), std::string(4, 0)),
      {"tensor 'w'", "missing 'shape'"});
  expect_load_error(td, st_file(entry("w", R"({"dtype": "F32", "shape": [1]})"), std::string(4, 0)),
                    {"tensor 'w'", "missing 'data_offsets'"});
  expect_load_error(
      td,
      st_file(entry("w", R"({"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "x": 1})"),
              std::string(4, 0)),
      {"tensor 'w'", "unexpected key 'x'"});
}

BOOST_AUTO_TEST_CASE(safetensors_dtype_and_shape_errors) {
  TempDir td;
  // dtype: safetensors' other dtypes are refused by name, with the list graft reads.
  for (const char* dt : {"BOOL", "U8", "I16", "F8_E4M3", "f16", "bf16"})
    expect_load_error(td,
                      st_file(entry("h", R"({"dtype": ")" + std::string(dt) +
                                             R"(", "shape": [4], "data_offsets": [0, 4]})"),
                              std::string(4, 0)),
                      {"tensor 'h'", "unsupported dtype '" + std::string(dt) +
                                         "' (supported: F32, F64, I64, BF16, F16, I8)"});
  // A byte range that is not the element count times the dtype's size, for each dtype size.
  for (const auto& [dt, need] : std::vector<std::pair<std::string, int>>{
           {"F16", 6}, {"BF16", 6}, {"I8", 3}, {"F32", 12}, {"F64", 24}, {"I64", 24}})
    expect_load_error(
        td,
        st_file(entry("h", R"({"dtype": ")" + dt + R"(", "shape": [3], "data_offsets": [0, 5]})"),
                std::string(5, 0)),
        {"tensor 'h' declares 5 bytes but shape (3) of " + dt + " needs " + std::to_string(need)});
  expect_load_error(td,
                    st_file(entry("h", R"({"dtype": 32, "shape": [1], "data_offsets": [0, 4]})"),
                            std::string(4, 0)),
                    {"tensor 'h'", "dtype is not a string"});

  // shape.
  const std::string offs = R"(, "data_offsets": [0, 24]})";
  expect_load_error(td, st_file(entry("s", R"({"dtype": "F32", "shape": 6)" + offs), f32x6),
                    {"tensor 's'", "shape is not a list"});
  expect_load_error(td, st_file(entry("s", R"({"dtype": "F32", "shape": [2, -3])" + offs), f32x6),
                    {"tensor 's'", "shape entry 1 is -3", "non-negative integer"});
  expect_load_error(td, st_file(entry("s", R"({"dtype": "F32", "shape": [2.0, 3])" + offs), f32x6),
                    {"tensor 's'", "shape entry 0 is 2.0"});
  expect_load_error(td, st_file(entry("s", R"({"dtype": "F32", "shape": ["2", 3])" + offs), f32x6),
                    {"tensor 's'", "shape entry 0"});
  expect_load_error(
      td, st_file(entry("s", R"({"dtype": "F32", "shape": [18446744073709551615])" + offs), f32x6),
      {"tensor 's'", "shape entry 0"});
  expect_load_error(
      td,
      st_file(entry("s", R"({"dtype": "F32", "shape": [4294967296, 4294967296])" + offs), f32x6),
      {"tensor 's'", "too large"});
  // A zero dimension must not hide an overflowing product of the others.
  expect_load_error(
      td,
      st_file(entry(
          "s",
          R"({"dtype": "F32", "shape": [0, 4294967296, 4294967296], "data_offsets": [0, 0]})")),
      {"tensor 's'", "too large"});
  // The element count fits int64 but the byte count does not.
  expect_load_error(
      td, st_file(entry("s", R"({"dtype": "F64", "shape": [4611686018427387904])" + offs), f32x6),
      {"tensor 's'", "byte count overflows"});
}

BOOST_AUTO_TEST_CASE(safetensors_data_offsets_errors) {
  TempDir td;
  // data_offsets.
  const std::string pre = R"({"dtype": "F32", "shape": [2, 3], "data_offsets": )";
  expect_load_error(td, st_file(entry("o", pre + "24}"), f32x6),
                    {"tensor 'o'", "data_offsets must be a list of two"});
  expect_load_error(td, st_file(entry("o", pre + "[0, 24, 48]}"), f32x6),
                    {"tensor 'o'", "list of two"});
  expect_load_error(td, st_file(entry("o", pre + "[0]}"), f32x6), {"tensor 'o'", "list of two"});
  expect_load_error(td, st_file(entry("o", pre + "[0, 24.0]}"), f32x6),
                    {"tensor 'o'", "not non-negative integers"});
  expect_load_error(td, st_file(entry("o", pre + "[-4, 20]}"), f32x6),
                    {"tensor 'o'", "not non-negative integers"});
  expect_load_error(td, st_file(entry("o", pre + "[24, 0]}"), f32x6),
                    {"tensor 'o'", "begin 24 is after end 0"});
  expect_load_error(td, st_file(entry("o", pre + "[0, 48]}"), f32x6),
                    {"tensor 'o'", "end 48 is past the end of the 24-byte data section"});
  expect_load_error(td, st_file(entry("enc.w", pre + "[0, 20]}"), std::string(20, 0)),
                    {"tensor 'enc.w' declares 20 bytes but shape (2, 3) of F32 needs 24"});
  expect_load_error(td,
                    st_file(entry("i", R"({"dtype": "I64", "shape": [], "data_offsets": [0, 4]})"),
                            std::string(4, 0)),
                    {"tensor 'i' declares 4 bytes but shape () of I64 needs 8"});
}

BOOST_AUTO_TEST_CASE(safetensors_region_layout_errors) {
  TempDir td;
  // Region layout.
  const std::string two = R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
                          R"( "b": {"dtype": "F32", "shape": [1], "data_offsets": )";
  expect_load_error(td, st_file(two + "[8, 12]}}", std::string(12, 0)),
                    {"tensor 'b' starts at byte 8", "previous tensor 'a' ends at byte 4", "gap"});
  expect_load_error(td, st_file(two + "[2, 6]}}", std::string(6, 0)),
                    {"tensor 'b' starts at byte 2", "tensor 'a' ends at byte 4", "overlap"});
  expect_load_error(td, st_file(two + "[0, 4]}}", std::string(4, 0)), {"overlap"});
  expect_load_error(td,
                    st_file(entry("c", R"({"dtype": "F32", "shape": [1], "data_offsets": [4, 8]})"),
                            std::string(8, 0)),
                    {"tensor 'c' starts at byte 4", "data section starts at byte 0", "gap"});
  expect_load_error(td, st_file(two + "[4, 8]}}", std::string(9, 0)),
                    {"trailing data", "cover 8 bytes of the 9-byte data section"});
  expect_load_error(td, st_file("{}", "x"), {"trailing data", "cover 0 bytes of the 1-byte"});
}

BOOST_AUTO_TEST_CASE(safetensors_unreadable_files) {
  TempDir td;
  // Not a readable regular file.
  expect_load_error(td, "", {"too short"});
  try {
    train::load_safetensors(td.file("missing.safetensors"));
    BOOST_ERROR("expected a throw");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()).find("missing.safetensors': cannot open") != std::string::npos,
               e.what());
  }
  try {
    train::load_safetensors(td.dir.string());
    BOOST_ERROR("expected a throw");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()).find("not a regular file") != std::string::npos, e.what());
  }
}

BOOST_AUTO_TEST_CASE(every_truncation_is_an_error) {
  TempDir td;
  const std::string bytes = small_valid_file(td);
  const std::string path = td.file("cut.safetensors");
  BOOST_TEST_MESSAGE("valid file is " << bytes.size() << " bytes");
  for (size_t len = 0; len < bytes.size(); ++len) {
    write_bytes(path, bytes.substr(0, len));
    try {
      train::load_safetensors(path);
      BOOST_ERROR("prefix of " << len << " bytes loaded");
    } catch (const Error&) {
    } catch (const std::exception& e) {
      BOOST_ERROR("prefix of " << len << " bytes threw a non-graft error: " << e.what());
    }
  }
  write_bytes(path, bytes);
  BOOST_TEST(train::load_safetensors(path).tensors.size() == 3u);
}

BOOST_AUTO_TEST_CASE(random_header_corruption_never_crashes) {
  TempDir td;
  const std::string bytes = small_valid_file(td);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(bytes[i])) << (8 * i);
  const std::string path = td.file("fuzz.safetensors");
  // Bytes that change JSON structure rather than just the text inside a string.
  const std::string interesting = "{}[]\",:-.0123456789eE \\";
  Generator gen(1234);
  int loaded = 0, rejected = 0;
  for (int trial = 0; trial < 400; ++trial) {
    std::string b = bytes;
    const int flips = 1 + int(gen.below(4));
    for (int k = 0; k < flips; ++k) {
      // Mostly inside the JSON, sometimes the length field.
      const size_t pos = gen.below(10) == 0 ? gen.below(8) : 8 + gen.below(n);
      b[pos] = gen.below(2) ? char(gen.below(256)) : interesting[gen.below(interesting.size())];
    }
    write_bytes(path, b);
    try {
      const auto f = train::load_safetensors(path);
      ++loaded;
      for (const auto& [name, t] : f.tensors) BOOST_TEST(t.numel() >= 0);
    } catch (const Error&) {
      ++rejected;
    } catch (const std::exception& e) {
      BOOST_ERROR("trial " << trial << " threw a non-graft error: " << e.what());
    }
  }
  BOOST_TEST_MESSAGE("corruption: " << loaded << " loaded, " << rejected << " rejected");
  BOOST_TEST(rejected > 0);
}

BOOST_AUTO_TEST_CASE(atomic_write_keeps_the_old_file_when_the_writer_throws) {
  TempDir td;
  const std::string path = td.file("state.json");
  write_bytes(path, "old content");
  try {
    train::atomic_write(path, [](std::ostream& os) {
      os << std::string(100000, 'x');  // enough that some of it reaches the temp file
      throw std::runtime_error("writer failed midway");
    });
    BOOST_ERROR("expected a throw");
  } catch (const std::runtime_error& e) {
    BOOST_TEST(std::string(e.what()) == "writer failed midway");  // rethrown unchanged
  }
  BOOST_TEST(read_bytes(path) == "old content");
  BOOST_TEST(td.listing() == std::vector<std::string>{"state.json"});

  train::atomic_write(path, [](std::ostream& os) { os << "new content"; });
  BOOST_TEST(read_bytes(path) == "new content");
  BOOST_TEST(td.listing() == std::vector<std::string>{"state.json"});

  // A failed safetensors save leaves the previous checkpoint loadable.
  const std::string ck = td.file("ck.safetensors");
  train::save_safetensors(ck, {{"w", ones({3})}});
  const std::string before = read_bytes(ck);
  BOOST_CHECK_THROW(train::save_safetensors(ck, {{"w", ones({3})}, {"w", ones({3})}}), Error);
  BOOST_TEST(read_bytes(ck) == before);
}

BOOST_AUTO_TEST_CASE(atomic_write_failures_name_the_path) {
  TempDir td;
  const std::string nowhere = td.file("no/such/dir/ck.safetensors");
  auto expect = [&](const std::function<void()>& f, const std::string& path) {
    try {
      f();
      BOOST_ERROR("expected a throw for " << path);
    } catch (const Error& e) {
      BOOST_TEST(std::string(e.what()).find("'" + path + "'") != std::string::npos, e.what());
    }
  };
  expect([&] { train::atomic_write(nowhere, [](std::ostream& os) { os << "x"; }); }, nowhere);
  expect([&] { train::save_safetensors(nowhere, {{"w", ones({1})}}); }, nowhere);
  expect([&] { train::save_json(nowhere, {{"a", 1}}); }, nowhere);

  // The rename fails when the target is a directory: the temp file must still be cleaned up.
  const std::string as_dir = td.file("occupied");
  fs::create_directory(as_dir);
  expect([&] { train::atomic_write(as_dir, [](std::ostream& os) { os << "x"; }); }, as_dir);
  BOOST_TEST(td.listing() == std::vector<std::string>{"occupied"});
}

BOOST_AUTO_TEST_CASE(json_round_trip_and_errors) {
  TempDir td;
  const std::string path = td.file("cfg.json");
  const nlohmann::json j = {{"lr", 3e-4}, {"layers", {1, 2, 3}}, {"name", "tiny"}, {"step", 1200}};
  train::save_json(path, j);
  BOOST_TEST(train::load_json(path) == j);
  BOOST_TEST(td.listing() == std::vector<std::string>{"cfg.json"});

  write_bytes(path, "{\n  \"lr\": 3e-4,\n  \"layers\": [1, 2,]\n}\n");
  try {
    train::load_json(path);
    BOOST_ERROR("expected a throw");
  } catch (const Error& e) {
    const std::string msg = e.what();
    BOOST_TEST(msg.rfind("load_json: '" + path + "': ", 0) == 0u, msg);
    BOOST_TEST(msg.find("line 3, column") != std::string::npos, msg);
  }
  BOOST_CHECK_THROW(train::load_json(td.file("absent.json")), Error);
  BOOST_CHECK_THROW(train::save_json(path, nlohmann::json("bad\xff")), Error);
}

// The header's structure is checked before nlohmann builds anything: a deeply nested header
// (which overflowed the parser's stack) and one with too many entries are refused by name, and
// 200,000 tiny entries load in linear time.
BOOST_AUTO_TEST_CASE(header_structure_limits) {
  TempDir td;
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  expect_load_error(td, st_file(deep), {"header: JSON nested more than 3 levels deep"});
  expect_load_error(
      td, st_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[[1]],\"data_offsets\":[0,4]}}", "abcd"),
      {"nested more than 3 levels"});
  // Brackets inside strings do not count.
  const std::string path = td.file("names.safetensors");
  train::save_safetensors(path, {{"[[[{{{", from_vector(std::vector<float>{1.f}, {1})}},
                          {{"k", "]]]}}"}});
  BOOST_TEST(train::load_safetensors(path).contains("[[[{{{"));

  std::string many = "{";
  const int n = 200000;
  for (int i = 0; i < n; ++i)
    many += (i ? ",\"t" : "\"t") + std::to_string(i) +
            "\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}";
  many += "}";
  write_bytes(td.file("many.safetensors"), st_file(many));
  const auto t0 = std::chrono::steady_clock::now();
  const auto f = train::load_safetensors(td.file("many.safetensors"));
  BOOST_TEST(f.tensors.size() == size_t(n));
  BOOST_TEST(f.tensors[1].first == "t1");  // header order kept for equal (empty) regions
  // Not a timing target: minutes (the old quadratic parse) versus well under one second.
  BOOST_TEST(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 30.0);
}

BOOST_AUTO_TEST_CASE(json_text_checks) {
  BOOST_CHECK_EXCEPTION(train::parse_json(std::string(50, '[') + std::string(50, ']'), "cfg", 32),
                        Error, [](const Error& e) {
                          return std::string(e.what()).find("cfg: JSON nested more than 32") == 0;
                        });
  BOOST_CHECK_EXCEPTION(train::check_json_text("[1,2,3]", 4, 2, "x"), Error, [](const Error& e) {
    return std::string(e.what()) == "x: more than 2 entries";
  });
  BOOST_CHECK_NO_THROW(
      train::check_json_text("[\"\\\"[[[[\"]", 1, 10, "x"));  // an escaped quote in a string
  BOOST_TEST(train::json_excerpt(nlohmann::json(std::string(200, 'a'))).size() == 80u);
  TempDir td;
  write_bytes(td.file("big.json"), "[" + std::string(17 << 20, ' ') + "]");
  BOOST_CHECK_EXCEPTION(train::load_json(td.file("big.json")), Error, [](const Error& e) {
    return std::string(e.what()).find("more than the 16777216") != std::string::npos;
  });
}

// Weights carry fingerprints of their run's side files: an edited or swapped config or
// tokenizer is named on load.
BOOST_AUTO_TEST_CASE(tied_files_are_fingerprinted) {
  TempDir td;
  const std::string cfg = td.file("config.json"), tok = td.file("spm.model"),
                    w = td.file("model.safetensors");
  write_bytes(cfg, "{\"heads\": 4}\n");
  write_bytes(tok, "tokenizer bytes");
  const std::vector<std::pair<std::string, Tensor>> sd = {
      {"w", from_vector(std::vector<float>{1.f, 2.f}, {2})}};
  train::save_weights(sd, w, 3, "test", {cfg, tok});
  BOOST_TEST(train::load_weights(w, "load", {cfg, tok}).size() == 1u);
  write_bytes(cfg, "{\"heads\": 8}\n");
  BOOST_CHECK_EXCEPTION(train::load_weights(w, "load", {cfg, tok}), Error, [&](const Error& e) {
    return std::string(e.what()) == "load: '" + cfg + "' does not match the weights in '" + w +
                                        "': it was edited or comes from another run";
  });
  write_bytes(cfg, "{\"heads\": 4}\n");
  write_bytes(tok, "another run's tokenizer");
  BOOST_CHECK_EXCEPTION(train::load_weights(w, "load", {cfg, tok}), Error, [&](const Error& e) {
    return std::string(e.what()).find("'" + tok + "' does not match") != std::string::npos;
  });
  train::save_weights(sd, w, 3, "test");  // no fingerprints
  BOOST_CHECK_EXCEPTION(train::load_weights(w, "load", {cfg}), Error, [&](const Error& e) {
    return std::string(e.what()).find("carries no fingerprint of") != std::string::npos;
  });
}

// The checksum covers the dtype: the same bytes relabelled from F64 to I64 in the header are
// caught. A file written before graft 0.6 (no checksum_version; its checksum without the dtype)
// still loads, and an unknown checksum_version is refused by name.
BOOST_AUTO_TEST_CASE(weights_checksum_covers_dtype) {
  TempDir td;
  const std::string w = td.file("model.safetensors"), bad = td.file("relabelled.safetensors");
  const std::vector<double> values{1.0, 2.0};
  train::save_weights({{"w", from_vector(values, {2}, DType::f64)}}, w, 3, "test");
  train::SafetensorsFile f = train::load_safetensors(w);
  BOOST_TEST(f.metadata.at("checksum_version") == "2");
  std::vector<int64_t> same_bytes(2);
  std::memcpy(same_bytes.data(), values.data(), 16);
  train::save_safetensors(bad, {{"w", from_vector(same_bytes, {2})}}, f.metadata);
  BOOST_CHECK_EXCEPTION(train::load_weights(bad, "load"), Error, [&](const Error& e) {
    return std::string(e.what()).find("load: '" + bad + "': checksum mismatch (stored ") == 0;
  });
  // What graft 0.5 wrote for these tensors: its checksum over name, shape and bytes.
  std::map<std::string, std::string> old_meta = {
      {"format", "test"}, {"step", "3"}, {"checksum", "71008a61f36223b3"}};
  train::save_safetensors(bad, f.tensors, old_meta);
  BOOST_TEST(train::load_weights(bad, "load")[0].second.to_vector<double>() == values);
  old_meta["checksum_version"] = "3";
  train::save_safetensors(bad, f.tensors, old_meta);
  BOOST_CHECK_EXCEPTION(train::load_weights(bad, "load"), Error, [&](const Error& e) {
    return std::string(e.what()) == "load: '" + bad +
                                        "': unknown checksum_version '3' (this graft writes "
                                        "and reads 2)";
  });
}

// A write that runs out of space (here: a file-size limit, which fails writes like a full disk
// does) fails with an error naming the file, keeps the previous file whole and leaves no temp.
BOOST_AUTO_TEST_CASE(out_of_space_during_a_save_keeps_the_old_file) {
  TempDir td;
  const std::string path = td.file("w.safetensors");
  train::save_safetensors(path, {{"w", from_vector(std::vector<float>{1.f, 2.f}, {2})}});
  const std::string before = read_bytes(path);
  rlimit old{};
  BOOST_REQUIRE(getrlimit(RLIMIT_FSIZE, &old) == 0);
  auto* prev = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = old;
  small.rlim_cur = 4096;
  BOOST_REQUIRE(setrlimit(RLIMIT_FSIZE, &small) == 0);
  std::string msg;
  try {
    train::save_safetensors(path, {{"w", zeros({1 << 18})}});
  } catch (const Error& e) {
    msg = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, prev);
  BOOST_TEST(msg.find("atomic_write: '" + path + "'") != std::string::npos, msg);
  BOOST_TEST(msg.find("File too large") != std::string::npos, msg);
  BOOST_TEST(read_bytes(path) == before);
  BOOST_TEST(td.listing() == std::vector<std::string>{"w.safetensors"});
}

// JSON from outside is read as exactly its type: no float becomes an integer (a float beyond the
// range would be undefined behaviour in the conversion), no negative becomes unsigned.
BOOST_AUTO_TEST_CASE(typed_json_reads) {
  using nlohmann::json;
  BOOST_TEST(train::json_complaint<int64_t>(json(-3)).empty());
  BOOST_TEST(train::json_complaint<int64_t>(json(2.5)) == "must be an integer, got 2.5");
  BOOST_TEST(train::json_complaint<uint64_t>(json(4.6e23)) ==
             "must be a non-negative integer, got 4.6e+23");
  BOOST_TEST(train::json_complaint<uint64_t>(json(-1)) == "must be a non-negative integer, got -1");
  BOOST_TEST(train::json_complaint<int64_t>(json(uint64_t(1) << 63)) ==
             "must be an integer, got 9223372036854775808");
  BOOST_TEST(train::json_complaint<int>(json(int64_t(1) << 40)) ==
             "must be an integer, got 1099511627776");
  BOOST_TEST(train::json_complaint<std::vector<int64_t>>(json::parse("[1, \"a\"]")) ==
             "entry 1 must be an integer, got \"a\"");
  BOOST_TEST(train::json_complaint<double>(json("3")) == "must be a number, got \"3\"");
  BOOST_CHECK_EXCEPTION(
      train::json_field<int64_t>(json::object(), "step", "state"), Error,
      [](const Error& e) { return std::string(e.what()) == "state: 'step' is missing"; });
}

// A checkpoint's files become visible together, through run/<name> links, only at commit();
// a file not written again is carried over; an unfinished checkpoint changes nothing.
BOOST_AUTO_TEST_CASE(checkpoint_directories_commit_as_one_unit) {
  TempDir td;
  const std::string run = td.dir.string();
  BOOST_TEST(train::current_checkpoint(run).empty());
  {
    train::CheckpointCommit c(run, 3);
    write_bytes(c.path("a.txt"), "a3");
    write_bytes(c.path("b.txt"), "b3");
    BOOST_TEST(!fs::exists(td.dir / "a.txt"));  // not before the commit
    c.commit();
  }
  BOOST_TEST(read_bytes(td.file("a.txt")) == "a3");
  BOOST_TEST(train::current_checkpoint(run) == (td.dir / "ckpt-00000003").string());
  {
    train::CheckpointCommit c(run, 6);
    write_bytes(c.path("a.txt"), "a6");
    c.commit();  // b.txt carried over
  }
  BOOST_TEST(read_bytes(td.file("a.txt")) == "a6");
  BOOST_TEST(read_bytes(td.file("b.txt")) == "b3");
  BOOST_TEST(!fs::exists(td.dir / "ckpt-00000003"));  // the previous one is gone
  {
    train::CheckpointCommit c(run, 9);
    write_bytes(c.path("a.txt"), "a9");  // an error before commit(): nothing changes
  }
  BOOST_TEST(read_bytes(td.file("a.txt")) == "a6");
  BOOST_TEST(!fs::exists(td.dir / "ckpt-00000009"));
  {
    train::CheckpointCommit c(run, 6);  // the current checkpoint's step again: another directory
    write_bytes(c.path("a.txt"), "a6 again");
    c.commit();
  }
  BOOST_TEST(read_bytes(td.file("a.txt")) == "a6 again");
  BOOST_TEST(train::current_checkpoint(run) == (td.dir / "ckpt-00000006.1").string());
  train::CheckpointCommit c(run, 12);
  for (const char* bad : {"", "x/y", "..", "checkpoint", "ckpt-1"})
    BOOST_CHECK_EXCEPTION(c.path(bad), Error, [](const Error& e) {
      return graft::testing::names(e, "is not a plain file name");
    });
}

// What a killed commit leaves is removed by the next run; a pointer that does not point at a
// checkpoint of its run is an error naming it.
BOOST_AUTO_TEST_CASE(clean_checkpoints_and_damaged_pointers) {
  TempDir td;
  const std::string run = td.dir.string();
  {
    train::CheckpointCommit c(run, 3);
    write_bytes(c.path("a.txt"), "a3");
    c.commit();
  }
  fs::create_directories(td.dir / "ckpt-00000006");
  fs::create_symlink("ckpt-00000006", td.dir / "checkpoint.graft-new-link");
  BOOST_TEST(train::clean_checkpoints(run, true) == 2);
  BOOST_TEST(read_bytes(td.file("a.txt")) == "a3");
  BOOST_TEST(train::clean_checkpoints(run, false) == 2);  // the pointer and ckpt-00000003
  BOOST_TEST(train::current_checkpoint(run).empty());
  fs::create_symlink("/etc", td.dir / "checkpoint");
  BOOST_CHECK_EXCEPTION(train::current_checkpoint(run), Error, [](const Error& e) {
    return graft::testing::names(e, "not at a checkpoint directory of its run");
  });
  fs::remove(td.dir / "checkpoint");
  fs::create_symlink("ckpt-00000042", td.dir / "checkpoint");
  BOOST_CHECK_EXCEPTION(train::current_checkpoint(run), Error, [](const Error& e) {
    return graft::testing::names(e, "which is missing");
  });
}

// Issue 47: a temp file is created exclusively and never followed through a link planted under
// the name the write would use (graft 0.6 opened "<path>.tmp.<pid>" with fopen "w", and
// overwrote whatever a planted link there pointed at).
BOOST_AUTO_TEST_CASE(atomic_write_never_writes_through_a_planted_link) {
  TempDir td;
  const std::string victim = td.file("victim"), path = td.file("config.json");
  write_bytes(victim, "precious");
  fs::create_symlink(victim, path + ".tmp." + std::to_string(::getpid()));
  train::atomic_write(path, [](std::ostream& os) { os << "new"; });
  BOOST_TEST(read_bytes(victim) == "precious");
  BOOST_TEST(read_bytes(path) == "new");
  // A link planted at the target itself is replaced, not written through.
  fs::remove(path);
  fs::create_symlink(victim, path);
  train::atomic_write(path, [](std::ostream& os) { os << "newer"; });
  BOOST_TEST(read_bytes(victim) == "precious");
  BOOST_TEST(!fs::is_symlink(path));
  BOOST_TEST(read_bytes(path) == "newer");
  // Two temp files of one path never share a name, and each is a fresh regular file.
  std::string a, b;
  const int fa = train::create_temp_file(path, a, "test"),
            fb = train::create_temp_file(path, b, "test");
  BOOST_TEST(fa >= 0);
  BOOST_TEST(fb >= 0);
  BOOST_TEST(a != b);
  BOOST_TEST(a.rfind(path + ".tmp." + std::to_string(::getpid()) + ".", 0) == 0u);
  ::close(fa), ::close(fb);
  fs::remove(a), fs::remove(b);
  BOOST_CHECK_EXCEPTION(
      train::create_temp_file(td.file("missing/x"), a, "test"), Error,
      [](const Error& e) { return graft::testing::names(e, "cannot create the temporary file"); });
}

// atomic_copy (a tokenizer copied into a run) replaces a link planted at its destination
// instead of writing through it, as fs::copy_file(overwrite_existing) did; empty files copy too.
BOOST_AUTO_TEST_CASE(atomic_copy_never_writes_through_a_planted_link) {
  TempDir td;
  const std::string victim = td.file("victim"), src = td.file("vocab.txt"), dst = td.file("copy");
  write_bytes(victim, "precious");
  std::string big(200000, 'x');
  for (size_t i = 0; i < big.size(); ++i) big[i] = char('a' + i % 26);
  write_bytes(src, big);
  fs::create_symlink(victim, dst);
  train::atomic_copy(src, dst);
  BOOST_TEST(read_bytes(victim) == "precious");
  BOOST_TEST(!fs::is_symlink(dst));
  BOOST_TEST(read_bytes(dst) == big);
  write_bytes(src, "");
  train::atomic_copy(src, dst);
  BOOST_TEST(read_bytes(dst) == "");
  BOOST_CHECK_EXCEPTION(train::atomic_copy(td.file("none"), dst), Error, [&](const Error& e) {
    return graft::testing::names(e, "atomic_copy: '" + td.file("none") + "': cannot open");
  });
}

// The temp files of a process that no longer runs are removed, in the names create_temp_file
// makes and in graft 0.6's; a running process's and other files stay.
BOOST_AUTO_TEST_CASE(stale_temp_files_of_dead_processes_are_removed) {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  BOOST_REQUIRE(child > 0);
  int status = 0;
  BOOST_REQUIRE(::waitpid(child, &status, 0) == child);
  TempDir td;
  const std::string dead = std::to_string(child), alive = std::to_string(::getpid());
  for (const std::string& name : std::vector<std::string>{
           "a.tmp." + dead + ".Ab3dE9", "a.tmp." + dead, "g.svg.tmp." + dead + ".dot",
           "a.tmp." + alive + ".Ab3dE9", "a.tmp.x", "a.tmp." + dead + ".a-b", "plain"})
    write_bytes(td.file(name), "x");
  BOOST_TEST(train::remove_stale_temp_files(td.dir.string()) == 3);
  std::vector<std::string> kept = {"a.tmp." + alive + ".Ab3dE9", "a.tmp." + dead + ".a-b",
                                   "a.tmp.x", "plain"};
  std::sort(kept.begin(), kept.end());
  BOOST_TEST(td.listing() == kept, boost::test_tools::per_element());
}

// Issue 47: check_output_path refuses, by name, an output that is no file to write or is one of
// the command's inputs, and lets a new file, a regular file or a dangling link through.
BOOST_AUTO_TEST_CASE(output_paths_that_are_not_files_or_are_inputs_are_refused) {
  TempDir td;
  auto refused = [](const std::string& path, const std::vector<train::NamedInput>& inputs,
                    const std::string& why) {
    BOOST_CHECK_EXCEPTION(train::check_output_path("cmd --out", path, inputs), Error,
                          [&](const Error& e) {
                            return graft::testing::names(e, "cmd --out: '" + path + "' is " + why);
                          });
  };
  const std::string dir = td.file("d"), fifo = td.file("fifo"), in = td.file("in.txt");
  fs::create_directory(dir);
  BOOST_REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  write_bytes(in, "input");
  refused(dir, {}, "a directory, not a file to write");
  refused(fifo, {}, "a FIFO (named pipe), not a file to write");
  refused("/dev/null", {}, "a device, not a file to write");
  fs::create_symlink("/dev/full", td.file("full"));
  refused(td.file("full"), {}, "a symbolic link to a device, not a file to write");
  fs::create_symlink(dir, td.file("to_dir"));
  refused(td.file("to_dir"), {}, "a symbolic link to a directory");
  fs::create_symlink(fifo, td.file("to_fifo"));
  refused(td.file("to_fifo"), {}, "a symbolic link to a FIFO");
  const int sock = ::socket(AF_UNIX, SOCK_STREAM, 0);
  BOOST_REQUIRE(sock >= 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string sock_path = td.file("sock");
  BOOST_REQUIRE(sock_path.size() < sizeof(addr.sun_path));
  std::copy(sock_path.begin(), sock_path.end(), addr.sun_path);
  BOOST_REQUIRE(::bind(sock, (sockaddr*)&addr, sizeof(addr)) == 0);
  refused(sock_path, {}, "a socket, not a file to write");
  ::close(sock);
  // The same file as an input: by name, through a hard link, a symbolic link, another spelling.
  const std::string same = "the same file as --collection ('" + in + "'), which this command reads";
  refused(in, {{"", "--unset"}, {in, "--collection"}}, same);
  fs::create_hard_link(in, td.file("hard"));
  refused(td.file("hard"), {{in, "--collection"}}, same);
  fs::create_symlink(in, td.file("soft"));
  refused(td.file("soft"), {{in, "--collection"}}, same);
  const std::string dotted = (td.dir / "d" / ".." / "in.txt").string();
  refused(dotted, {{in, "--collection"}}, same);
  refused(in, {{in, ""}}, "the same file as the input ('" + in + "')");
  // Two spellings of one file that does not exist yet.
  refused(td.file("new.txt"), {{(td.dir / "." / "new.txt").string(), "--index"}},
          "the same file as --index");
  BOOST_CHECK_NO_THROW(train::check_output_path("cmd", td.file("new.txt"), {{in, "--collection"}}));
  write_bytes(td.file("old.txt"), "old");
  BOOST_CHECK_NO_THROW(train::check_output_path("cmd", td.file("old.txt"), {{in, "--collection"}}));
  fs::create_symlink(td.file("nowhere"), td.file("dangling"));
  BOOST_CHECK_NO_THROW(
      train::check_output_path("cmd", td.file("dangling"), {{in, "--collection"}}));
  BOOST_CHECK_EXCEPTION(train::check_output_path("cmd", "", {}), Error, [](const Error& e) {
    return graft::testing::names(e, "cmd: the output path is empty");
  });
}

// Issue 47: a checkpoint directory of the run that is a symbolic link (to a directory outside
// the run), or that holds one, is refused: graft 0.6 hard-linked its files into the next
// checkpoint.
BOOST_AUTO_TEST_CASE(symbolic_links_in_checkpoints_are_refused) {
  TempDir td, outside;
  const std::string run = td.dir.string();
  write_bytes(outside.file("secret"), "not the run's");
  fs::create_symlink(outside.dir, td.dir / "ckpt-00000003");
  fs::create_symlink("ckpt-00000003", td.dir / "checkpoint");
  auto is_link_error = [](const Error& e) {
    return graft::testing::names(e, "ckpt-00000003' is a symbolic link, not a checkpoint");
  };
  BOOST_CHECK_EXCEPTION(train::current_checkpoint(run), Error, is_link_error);
  BOOST_CHECK_EXCEPTION(
      {
        train::CheckpointCommit c(run, 6);
        c.commit();
      },
      Error, is_link_error);
  BOOST_TEST(!fs::exists(td.dir / "secret"));
  BOOST_TEST(!fs::exists(td.dir / "ckpt-00000006"));
  // A link inside a real checkpoint directory is not carried over either.
  fs::remove(td.dir / "checkpoint");
  fs::remove(td.dir / "ckpt-00000003");
  {
    train::CheckpointCommit c(run, 3);
    write_bytes(c.path("a.txt"), "a3");
    c.commit();
  }
  fs::create_symlink(outside.file("secret"), td.dir / "ckpt-00000003" / "evil");
  train::CheckpointCommit c(run, 6);
  BOOST_CHECK_EXCEPTION(c.commit(), Error, [](const Error& e) {
    return graft::testing::names(e, "evil' is not a regular file");
  });
  BOOST_TEST(train::current_checkpoint(run) == (td.dir / "ckpt-00000003").string());
  BOOST_TEST(read_bytes(td.file("a.txt")) == "a3");
}

// Issue 47: a commit is either current and complete or the previous one is. A second commit()
// is refused (graft 0.6 removed the directory the pointer named), and two commits of one step
// made at once write directories of their own (graft 0.6's second removed the first's files).
BOOST_AUTO_TEST_CASE(commits_never_remove_the_current_checkpoint) {
  TempDir td;
  const std::string run = td.dir.string();
  {
    train::CheckpointCommit c(run, 3);
    write_bytes(c.path("a.txt"), "a3");
    c.commit();
    BOOST_CHECK_EXCEPTION(c.commit(), Error, [](const Error& e) {
      return graft::testing::names(e, "ckpt-00000003' was committed already");
    });
  }
  BOOST_TEST(train::current_checkpoint(run) == (td.dir / "ckpt-00000003").string());
  BOOST_TEST(read_bytes(td.file("a.txt")) == "a3");
  {
    train::CheckpointCommit first(run, 5), second(run, 5);
    write_bytes(first.path("a.txt"), "a5 first");
    write_bytes(second.path("b.txt"), "b5 second");
    first.commit();
    BOOST_TEST(read_bytes(td.file("a.txt")) == "a5 first");
    second.commit();
  }
  BOOST_TEST(train::current_checkpoint(run) == (td.dir / "ckpt-00000005.1").string());
  BOOST_TEST(read_bytes(td.file("a.txt")) == "a5 first");  // carried over from the first
  BOOST_TEST(read_bytes(td.file("b.txt")) == "b5 second");
  BOOST_TEST(!fs::exists(td.dir / "ckpt-00000005"));
}

// Issue 47, one writer per run: a second RunLock fails at once naming the run and the holder's
// pid; a run this process locked until exit counts as held; a link planted as the lock file is
// refused; what is left (writer.lock) is no checkpoint leftover.
BOOST_AUTO_TEST_CASE(one_writer_per_run) {
  TempDir td;
  const std::string run = td.dir.string();
  {
    const train::RunLock first(run);
    BOOST_CHECK_EXCEPTION(train::RunLock second(run), Error, [&](const Error& e) {
      return graft::testing::names(e, "run directory '" + run + "' is being written by process " +
                                          std::to_string(::getpid()) + " (it holds '" + run +
                                          "/writer.lock'): one writer per run");
    });
  }
  { const train::RunLock again(run); }  // released with its holder
  {  // a holder that is not graft (flock(1), say) beside the pid of an earlier, dead writer
    const pid_t dead = ::fork();
    if (dead == 0) ::_exit(0);
    BOOST_REQUIRE(dead > 0);
    BOOST_REQUIRE(::waitpid(dead, nullptr, 0) == dead);
    write_bytes(td.file("writer.lock"), std::to_string(dead) + "\n");
    const int fd = ::open(td.file("writer.lock").c_str(), O_RDONLY | O_CLOEXEC);
    BOOST_REQUIRE(fd >= 0);
    BOOST_REQUIRE(::flock(fd, LOCK_EX) == 0);
    BOOST_CHECK_EXCEPTION(train::RunLock second(run), Error, [&](const Error& e) {
      return graft::testing::names(e,
                                   "'" + run + "' is being written by another process (it holds");
    });
    ::close(fd);
  }
  BOOST_TEST(train::clean_checkpoints(run, false) == 0);
  BOOST_TEST(td.listing() == std::vector<std::string>{"writer.lock"});
  const std::string held = td.file("held");
  train::lock_run_until_exit(held);  // creates it
  train::lock_run_until_exit(held);
  { const train::RunLock nested(held); }
  BOOST_TEST(fs::is_directory(held));
  TempDir other;
  fs::create_symlink(td.file("victim"), other.dir / "writer.lock");
  BOOST_CHECK_EXCEPTION(train::RunLock planted(other.dir.string()), Error, [](const Error& e) {
    return graft::testing::names(e, "cannot open its lock file");
  });
  BOOST_TEST(!fs::exists(td.file("victim")));
  // A hard link to a file outside the run, planted as the lock file, is refused, not truncated.
  TempDir linked;
  write_bytes(td.file("precious"), "precious");
  fs::create_hard_link(td.file("precious"), linked.dir / "writer.lock");
  BOOST_CHECK_EXCEPTION(train::RunLock planted(linked.dir.string()), Error, [](const Error& e) {
    return graft::testing::names(e, "is not a plain file of the run (a hard link");
  });
  BOOST_TEST(read_bytes(td.file("precious")) == "precious");
  train::CheckpointCommit c(run, 1);
  BOOST_CHECK_EXCEPTION(c.path("writer.lock"), Error, [](const Error& e) {
    return graft::testing::names(e, "is not a plain file name");
  });
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_CASE(headers_are_inspected_and_tensors_loaded_selectively) {
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  train::save_safetensors(
      path, {{"a", ones({2, 3})}, {"b", zeros({4}, DType::bf16)}, {"c", ones({1})}}, {{"k", "v"}});
  const train::SafetensorsHeader h = train::inspect_safetensors(path);
  BOOST_TEST(h.tensors.size() == 3u);
  BOOST_TEST(h.tensors[1].name == "b");
  BOOST_TEST((h.tensors[1].dtype == DType::bf16));
  BOOST_TEST((h.tensors[0].shape == Shape{2, 3}));
  BOOST_TEST(h.tensors[0].bytes == 24u);
  BOOST_TEST(h.metadata.at("k") == "v");
  const train::SafetensorsFile f =
      train::load_safetensors(path, [](const std::string& n) { return n != "b"; });
  BOOST_TEST(f.tensors.size() == 2u);
  BOOST_TEST(!f.contains("b"));
  BOOST_TEST(f.at("c").item() == 1.0);  // read from its own offset after the skipped one
}
