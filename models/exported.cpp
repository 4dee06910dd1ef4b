#include "graft/models/exported.h"

#include <cstdlib>
#include <filesystem>
#include <set>

#include "graft/models/decoding.h"

namespace graft::models {

namespace {

constexpr const char* kFormat = "graft-export";

void check_export_precision(Precision p, const char* who) {
  if (p != Precision::int8 && p != Precision::bf16)
    fail(std::string(who) + ": there is no " + precision_name(p) +
         " export (model.safetensors is the float32 form); export int8 or bf16");
}

std::string scale_name(const std::string& weight) { return weight + "_scale"; }

// The checksum entry of a weights file's metadata (save_weights writes one).
std::string weights_checksum_of(const std::string& path) {
  const auto meta = train::read_safetensors_metadata(path);
  auto it = meta.find("checksum");
  if (it == meta.end())
    fail("export: '" + path + "' carries no checksum: not a graft weights file");
  return it->second;
}

// The names int8_linear_weights() gives, with their parameters.
std::map<std::string, Tensor> int8_weights_by_name(const nn::Module& model) {
  std::map<std::string, Tensor> out;
  for (auto& [name, w] : int8_linear_weights(model)) out.emplace(name, w);
  return out;
}

// Every int8 tensor of the file is a weight the model runs int8, and every such weight is int8.
void check_int8_names(const train::SafetensorsFile& f, const std::map<std::string, Tensor>& lin) {
  for (const auto& [name, t] : f.tensors) {
    if (t.dtype() == DType::i8 && !lin.count(name))
      fail("tensor '" + name + "' is " + describe(t) + ", but the model reads '" + name +
           "' in float32: only the weights of its linear layers are int8");
    if (t.dtype() != DType::i8 && lin.count(name))
      fail("tensor '" + name + "' is " + describe(t) +
           ": an int8 export holds the linear weight '" + name +
           "' as int8 values (i8) and scales ('" + scale_name(name) + "', f32)");
  }
}

// Installs each int8 weight from its values and scales, dropping both file tensors once done;
// returns the remaining tensors (and the int8 weights themselves) for adopt_state_dict.
nn::NamedTensors install_int8(train::SafetensorsFile& f, const std::map<std::string, Tensor>& lin) {
  std::map<std::string, size_t> at;
  for (size_t i = 0; i < f.tensors.size(); ++i) at[f.tensors[i].first] = i;
  std::set<std::string> used_scales;
  nn::NamedTensors out;
  for (auto& [name, values] : f.tensors) {
    if (!values.defined() || values.dtype() != DType::i8) continue;  // installed scales go
    auto it = at.find(scale_name(name));
    if (it == at.end())
      fail("tensor '" + scale_name(name) + "' (the scales of the int8 weight '" + name +
           "') is missing");
    Tensor& scales = f.tensors[it->second].second;
    set_weight_int8(lin.at(name), values, scales, name, scale_name(name));
    used_scales.insert(scale_name(name));
    values = scales = Tensor();  // the file's copy goes now: the file is not held twice
    out.emplace_back(name, lin.at(name));
  }
  for (auto& [name, t] : f.tensors)
    if (t.defined() && !used_scales.count(name)) out.emplace_back(name, t);
  return out;
}

// A bf16 export holds every parameter in bf16.
void check_bf16(const train::SafetensorsFile& f) {
  for (const auto& [name, t] : f.tensors)
    if (t.dtype() != DType::bf16)
      fail("tensor '" + name + "' is " + describe(t) +
           ": a bf16 export holds every parameter in bf16");
}

}  // namespace

std::string export_file_name(Precision p) {
  check_export_precision(p, "export_file_name");
  return std::string("model.") + precision_name(p) + ".safetensors";
}

nn::NamedTensors export_state_dict(const nn::Module& model, Precision p) {
  check_export_precision(p, "export_state_dict");
  nn::NamedTensors out;
  if (p == Precision::bf16) {
    for (auto& [name, t] : model.named_parameters())
      out.emplace_back(name, is_floating(t.dtype()) ? cast_copy(t, DType::bf16) : t);
    return out;
  }
  const auto lin = int8_weights_by_name(model);
  for (auto& [name, t] : model.named_parameters()) {
    if (!lin.count(name)) {
      out.emplace_back(name, t);
      continue;
    }
    const Int8Weight q = int8_weight_parts(t, name);
    out.emplace_back(name, q.values);
    out.emplace_back(scale_name(name), q.scales);
  }
  return out;
}

void save_export(const nn::Module& model, Precision p, const std::string& path,
                 const std::string& source_weights, const std::vector<std::string>& tied_files) {
  const std::string source = weights_checksum_of(source_weights);
  const auto meta = train::read_safetensors_metadata(source_weights);
  int64_t step = 0;  // the source's step, when it names one
  if (auto it = meta.find("step"); it != meta.end())
    step = std::strtoll(it->second.c_str(), nullptr, 10);
  train::save_weights(export_state_dict(model, p), path, step, kFormat, tied_files,
                      {{"precision", precision_name(p)}, {"source_checksum", source}});
}

train::SafetensorsFile load_export(const std::string& path, Precision p,
                                   const std::string& source_weights,
                                   const std::vector<std::string>& tied_files) {
  check_export_precision(p, "load_export");
  train::SafetensorsFile f = train::load_weights_file(path, "load_run", tied_files);
  const auto entry = [&](const char* key) {
    auto it = f.metadata.find(key);
    return it == f.metadata.end() ? std::string("(none)") : it->second;
  };
  const std::string where = "load_run: '" + path + "': ";
  if (entry("format") != kFormat || entry("precision") != precision_name(p))
    fail(where + (p == Precision::int8 ? "not an " : "not a ") + precision_name(p) +
         " export (its format is '" + entry("format") + "', precision '" + entry("precision") +
         "'): write it with the export command");
  std::error_code ec;
  if (std::filesystem::exists(source_weights, ec) &&
      weights_checksum_of(source_weights) != entry("source_checksum"))
    fail(where + "it was exported from other weights than '" + source_weights +
         "' holds now (trained further since?): export again");
  return f;
}

void adopt_export(nn::Module& model, train::SafetensorsFile f, Precision p) {
  check_export_precision(p, "adopt_export");
  try {
    if (p == Precision::bf16) {
      check_bf16(f);
      model.adopt_state_dict(f.tensors);
      return;
    }
    const auto lin = int8_weights_by_name(model);
    check_int8_names(f, lin);
    model.adopt_state_dict(install_int8(f, lin));
  } catch (const Error& e) {
    fail("load_run: '" + f.path + "': " + e.what());
  }
}

}  // namespace graft::models
