#include "graft/models/exported.h"

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <set>

#include "graft/models/config_json.h"
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

// The checksum entry of a weights file's metadata (save_weights writes one); `who` names the
// caller (export, load_run) in the error.
std::string checksum_entry(const std::map<std::string, std::string>& meta, const std::string& path,
                           const char* who) {
  auto it = meta.find("checksum");
  if (it == meta.end())
    fail(std::string(who) + ": '" + path + "' carries no checksum: not a graft weights file");
  return it->second;
}

// The "step" entry of a weights file's metadata, 0 when it has none.
int64_t step_entry(const std::map<std::string, std::string>& meta, const std::string& path) {
  auto it = meta.find("step");
  if (it == meta.end()) return 0;
  const std::string& v = it->second;
  char* end = nullptr;
  errno = 0;
  const long long step = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno == ERANGE || step < 0)
    fail("export: '" + path + "': its metadata field \"step\" is '" + v +
         "', not a step count (a non-negative integer)");
  return step;
}

// The names int8_linear_weights() gives, with their parameters.
std::map<std::string, Tensor> int8_weights_by_name(const nn::Module& model) {
  std::map<std::string, Tensor> out;
  for (auto& [name, w] : int8_linear_weights(model)) out.emplace(name, w);
  return out;
}

// A tensor of an int8 export that is neither an int8 weight nor its scales has its parameter's
// dtype (adopt_state_dict takes the tensor as it is).
void check_kept_dtype(const std::string& name, const Tensor& t,
                      const std::map<std::string, Tensor>& params) {
  auto it = params.find(name);
  if (t.dtype() == DType::i8 || it == params.end() || t.dtype() == it->second.dtype()) return;
  fail("tensor '" + name + "' is " + describe(t) + ", but the model's parameter '" + name +
       "' is " + dtype_name(it->second.dtype()) + ": an int8 export keeps it as the model has it");
}

// Every int8 tensor of the file is a weight the model runs int8, and every such weight is int8;
// every other tensor has its parameter's dtype.
void check_int8_names(const train::SafetensorsFile& f, const std::map<std::string, Tensor>& lin,
                      const std::map<std::string, Tensor>& params) {
  for (const auto& [name, t] : f.tensors) {
    check_kept_dtype(name, t, params);
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
                 const std::string& source_weights,
                 const std::map<std::string, std::string>& source_metadata,
                 const std::vector<std::string>& tied_files) {
  const std::string source = checksum_entry(source_metadata, source_weights, "export");
  const int64_t step = step_entry(source_metadata, source_weights);
  train::save_weights(export_state_dict(model, p), path, step, kFormat, tied_files,
                      {{"precision", precision_name(p)}, {"source_checksum", source}});
}

train::SafetensorsFile load_export(const std::string& path, Precision p,
                                   const std::string& source_weights,
                                   const std::vector<std::string>& tied_files, int64_t buffers) {
  check_export_precision(p, "load_export");
  // The header alone says whether this is the export asked for and what it costs: both are
  // checked before the whole file is read and checksummed.
  const auto meta = train::read_safetensors_metadata(path);
  const auto entry = [&](const char* key) {
    auto it = meta.find(key);
    return it == meta.end() ? std::string("(none)") : it->second;
  };
  const std::string where = "load_run: '" + path + "': ";
  if (entry("format") != kFormat || entry("precision") != precision_name(p))
    fail(where + (p == Precision::int8 ? "not an " : "not a ") + precision_name(p) +
         " export (its format is '" + entry("format") + "', precision '" + entry("precision") +
         "'): write it with the export command");
  check_file_memory((double)std::filesystem::file_size(path), buffers, path);
  train::SafetensorsFile f = train::load_weights_file(path, "load_run", tied_files);
  std::error_code ec;
  if (std::filesystem::exists(source_weights, ec) &&
      checksum_entry(train::read_safetensors_metadata(source_weights), source_weights,
                     "load_run") != entry("source_checksum"))
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
    std::map<std::string, Tensor> params;
    for (auto& [name, t] : model.named_parameters()) params.emplace(name, t);
    check_int8_names(f, lin, params);
    model.adopt_state_dict(install_int8(f, lin));
    // The file keeps the embedding tables float32; int8 inference reads them int8, as
    // keep_for_inference(int8) makes them.
    for (const auto& [name, table] : embedding_tables(model)) quantize_weight_int8(table, name);
  } catch (const Error& e) {
    fail("load_run: '" + f.path + "': " + e.what());
  }
}

}  // namespace graft::models
