#include "hf_files.h"

#include <filesystem>
#include <set>

#include "graft/autograd/tape.h"
#include "graft/autograd/text.h"
#include "graft/ops/ops.h"

namespace graft::models::hf {

namespace {

std::string strip_prefix(const std::string& name, const Reading& r) {
  for (const std::string& p : r.prefixes)
    if (name.size() > p.size() && name.rfind(p, 0) == 0) return name.substr(p.size());
  return name;
}

void add_file(FileTensors& out, const std::string& path, const Reading& r) {
  for (const train::SafetensorsEntry& e : train::inspect_safetensors(path).tensors) {
    const std::string n = strip_prefix(e.name, r);
    if (r.ignorable && r.ignorable(n)) continue;
    if (!is_floating(e.dtype))
      fail(r.who + ": '" + path + "': tensor '" + text::printable(e.name) + "' is " +
           dtype_name(e.dtype) + ", not a float weight");
    auto [it, fresh] = out.emplace(n, FileTensor{e, path});
    if (!fresh)
      fail(r.who + ": '" + path + "': tensor '" + text::printable(e.name) + "' is also in '" +
           it->second.file + "' as '" + text::printable(it->second.entry.name) +
           "' (with or without the model prefix); keep one of them");
  }
}

// The shard files model.safetensors.index.json names, each a regular file in dir.
std::vector<std::string> shard_files(const std::string& dir, const std::string& index,
                                     const Reading& r) {
  const nlohmann::json j = train::load_json(index);
  if (!j.contains("weight_map") || !j["weight_map"].is_object())
    fail(r.who + ": '" + index + "': field \"weight_map\" is missing or not an object");
  std::set<std::string> files;
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string())
      fail(r.who + ": '" + index + "': weight_map[\"" + text::printable(name) +
           "\"] is not a file name");
    const std::string f = file.get<std::string>();
    if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
      fail(r.who + ": '" + index + "': weight_map[\"" + text::printable(name) + "\"]: shard '" +
           text::printable(f) + "' is not a file name in the directory");
    files.insert(f);
  }
  std::vector<std::string> paths;
  for (const std::string& f : files) {
    const std::string p = dir + "/" + f;
    std::error_code ec;
    if (!std::filesystem::is_regular_file(p, ec))
      fail(r.who + ": '" + index + "' names shard '" + p + "', which is " +
           (std::filesystem::exists(p, ec) ? "not a regular file" : "missing"));
    paths.push_back(p);
  }
  return paths;
}

[[noreturn]] void missing(const std::string& dir, const Param& p, size_t k, const Reading& r) {
  fail(r.who + ": '" + dir + "': tensor '" + p.hf[k] + "' is missing (graft's '" + p.graft + "')");
}

Tensor source(const train::SafetensorsFile& f, const FileTensor& t, const Param& p, DType dtype) {
  Tensor x = to_dtype(f.at(t.entry.name), dtype);
  return p.transpose ? contiguous(transpose(x, 0, 1)) : x;
}

}  // namespace

FileTensors inspect_hf_tensors(const std::string& dir, const Reading& r) {
  const std::string single = dir + "/model.safetensors",
                    index = dir + "/model.safetensors.index.json";
  std::error_code ec;
  FileTensors out;
  if (std::filesystem::exists(index, ec)) {
    for (const std::string& p : shard_files(dir, index, r)) add_file(out, p, r);
  } else if (std::filesystem::exists(single, ec)) {
    add_file(out, single, r);
  } else {
    fail(r.who + ": '" + dir + "' holds neither model.safetensors nor " +
         "model.safetensors.index.json");
  }
  return out;
}

void check_params(const FileTensors& file, const std::vector<Param>& params, const Reading& r,
                  const std::string& dir) {
  std::set<std::string> unused;
  for (const auto& [n, t] : file) unused.insert(n);
  for (const Param& p : params)
    for (size_t k = 0; k < p.hf.size(); ++k) {
      auto it = file.find(p.hf[k]);
      if (it == file.end()) missing(dir, p, k, r);
      if (it->second.entry.shape != p.shapes.at(k))
        fail(r.who + ": '" + it->second.file + "': tensor '" + it->second.entry.name +
             "' has shape " + shape_str(it->second.entry.shape) + ", the config needs " +
             shape_str(p.shapes[k]));
      unused.erase(p.hf[k]);
    }
  if (!unused.empty()) {
    const FileTensor& t = file.at(*unused.begin());
    fail(r.who + ": '" + t.file + "': unexpected tensor '" + text::printable(t.entry.name) + "'");
  }
}

DType common_dtype(const FileTensors& file) {
  std::set<DType> seen;
  for (const auto& [n, t] : file) seen.insert(t.entry.dtype);
  return seen.size() == 1 ? *seen.begin() : DType::f32;
}

namespace {

// Parameter p built from its loaded sources (`loaded`: file path -> its read tensors).
Tensor build_param(const FileTensors& file, const Param& p, DType dtype,
                   const std::map<std::string, train::SafetensorsFile>& loaded) {
  if (p.hf.empty()) return zeros(p.shapes.at(0), dtype);
  Tensors parts;
  for (const std::string& h : p.hf) {
    const FileTensor& t = file.at(h);
    parts.push_back(source(loaded.at(t.file), t, p, dtype));
  }
  return parts.size() == 1 ? parts[0] : concat(parts, 0);
}

// The files holding the sources of `params` and, per file, their stored names.
std::map<std::string, std::set<std::string>> sources_by_file(const FileTensors& file,
                                                             const std::vector<Param>& params) {
  std::map<std::string, std::set<std::string>> wanted;
  for (const Param& p : params)
    for (const std::string& h : p.hf) wanted[file.at(h).file].insert(file.at(h).entry.name);
  return wanted;
}

// Reads the stored tensors `wanted` names (file -> names), each file once.
std::map<std::string, train::SafetensorsFile> read_sources(
    const std::map<std::string, std::set<std::string>>& wanted) {
  std::map<std::string, train::SafetensorsFile> loaded;
  for (const auto& [path, names] : wanted)
    loaded.emplace(path, train::load_safetensors(
                             path, [&](const std::string& n) { return names.count(n) > 0; }));
  return loaded;
}

}  // namespace

nn::NamedTensors load_params(const FileTensors& file, const std::vector<Param>& params,
                             DType dtype) {
  const auto loaded = read_sources(sources_by_file(file, params));
  nn::NamedTensors out;
  for (const Param& p : params) out.emplace_back(p.graft, build_param(file, p, dtype, loaded));
  return out;
}

void for_each_param(const FileTensors& file, const std::vector<Param>& params, DType dtype,
                    const std::function<void(const std::string&, Tensor)>& take) {
  for (const Param& p : params) {
    Tensor t;
    {
      const auto loaded = read_sources(sources_by_file(file, {p}));
      t = build_param(file, p, dtype, loaded);
    }  // the sources go before `take` runs: one parameter's tensors in memory at a time
    take(p.graft, std::move(t));
  }
}

}  // namespace graft::models::hf
