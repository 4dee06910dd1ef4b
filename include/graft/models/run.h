/// @file
/// Loading a trained model from a run directory (config.json + model.safetensors), written once
/// for the three model families and used by every program.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "graft/models/config_json.h"
#include "graft/models/exported.h"
#include "graft/nn/train/checkpoint.h"

namespace graft::models {

/// The "model" section of a run's config.json.
/// @throws graft::Error naming `who` and `config_path` when the section is missing.
inline const nlohmann::json& model_section(const nlohmann::json& config,
                                           const std::string& config_path, const std::string& who) {
  if (!config.is_object() || !config.contains("model"))
    fail(who + ": '" + config_path + "' has no \"model\" section");
  return config["model"];
}

/// A model loaded from a run directory, and the run's whole config.json (for the fields a
/// program keeps beside the model: labels, the training context, ...).
template <class Model>
struct LoadedModel {
  std::unique_ptr<Model> model;  ///< in eval mode
  nlohmann::json config;         ///< run_dir/config.json as read
  std::string weights;           ///< the weights file it was loaded from
};

/// Loads a trained model and its config from a run directory.
///
/// Loads run_dir/config.json and run_dir/model.safetensors into a Model (Transformer,
/// DecoderOnlyLM or EncoderClassifier), in the order that keeps a bad directory from costing
/// anything: the config's "model" section, then the weights (checksum, and the fingerprints of
/// config.json and of `more_tied_files`, e.g. the tokenizer), then their count against the
/// config and the config against memory; only then is the model built.
/// @throws graft::Error naming the file and field at fault.
template <class Model>
LoadedModel<Model> load_run_model(const std::string& run_dir,
                                  const std::vector<std::string>& more_tied_files = {}) {
  using Config = std::remove_cvref_t<decltype(std::declval<Model&>().cfg)>;
  const std::string cfg_path = run_dir + "/config.json";
  LoadedModel<Model> r;
  r.config = train::load_json(cfg_path);
  const Config c = Config::from_json(model_section(r.config, cfg_path, "load_run"), cfg_path);
  std::vector<std::string> tied{cfg_path};
  tied.insert(tied.end(), more_tied_files.begin(), more_tied_files.end());
  auto weights = load_run_weights(c, cfg_path, run_dir + "/model.safetensors", tied);
  r.model = std::make_unique<Model>(c);
  r.model->load_state_dict(weights);
  r.model->eval();
  r.weights = run_dir + "/model.safetensors";
  return r;
}

/// load_run_model() for inference at precision `p`: where run_dir holds an export for p
/// (export_file_name(p), written by save_export()), the model is built without memory
/// (nn::SkipInit(nn::SkipInit::Memory::none)) and given the export's tensors (adopt_export()), so
/// no float32 copy of a weight is ever made: a bf16 model, or one whose linear weights are int8
/// already (keep_for_inference(model, p) then has nothing left to convert). Otherwise (fp32, or
/// no export) load_run_model(run_dir, more_tied_files). LoadedModel::weights names the file read.
/// @throws graft::Error naming the file and tensor at fault (see load_export(), adopt_export()).
template <class Model>
LoadedModel<Model> load_run_model(const std::string& run_dir,
                                  const std::vector<std::string>& more_tied_files, Precision p) {
  if (p == Precision::fp32) return load_run_model<Model>(run_dir, more_tied_files);
  const std::string path = run_dir + "/" + export_file_name(p);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return load_run_model<Model>(run_dir, more_tied_files);
  using Config = std::remove_cvref_t<decltype(std::declval<Model&>().cfg)>;
  const std::string cfg_path = run_dir + "/config.json";
  LoadedModel<Model> r;
  r.config = train::load_json(cfg_path);
  const Config c = Config::from_json(model_section(r.config, cfg_path, "load_run"), cfg_path);
  std::vector<std::string> tied{cfg_path};
  tied.insert(tied.end(), more_tied_files.begin(), more_tied_files.end());
  train::SafetensorsFile f = load_export(path, p, run_dir + "/model.safetensors", tied);
  check_config_memory(c, cfg_path, /*copies=*/1);  // the file's tensors become the model's
  {
    const nn::SkipInit no_memory(nn::SkipInit::Memory::none);
    r.model = std::make_unique<Model>(c);
  }
  adopt_export(*r.model, std::move(f), p);
  r.model->eval();
  r.weights = path;
  return r;
}

}  // namespace graft::models
