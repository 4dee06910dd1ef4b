/// @file
/// Loading a trained model from a run directory (config.json + model.safetensors), written once
/// for the three model families and used by every program.
#pragma once

#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "graft/models/config_json.h"
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
  return r;
}

}  // namespace graft::models
