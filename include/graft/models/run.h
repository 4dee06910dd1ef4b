/// @file
/// Loading a trained model from a run directory (config.json + model.safetensors), written once
/// for the three model families and used by every program.
#pragma once

#include <filesystem>
#include <map>
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
  /// The `__metadata__` of that file as loaded (its checksum, step, ...): what an export made
  /// from this model records, never a later re-read of a file a checkpoint may have replaced.
  std::map<std::string, std::string> metadata;
};

/// Which file load_run_model() reads at an int8 or bf16 precision.
enum class RunSource {
  export_if_present,  ///< the run's export for the precision when it has one, else the weights
  weights,            ///< model.safetensors always (what an export is made from)
};

/// A run directory's config.json read for Model: the whole file, the model's config and the
/// files its weights are tied to (config.json, then the caller's, e.g. the tokenizer).
template <class Model>
struct RunConfig {
  nlohmann::json json;                                          ///< config.json as read
  std::remove_cvref_t<decltype(std::declval<Model&>().cfg)> c;  ///< its "model" section
  std::string path;                                             ///< run_dir/config.json
  std::vector<std::string> tied;  ///< config.json, then more_tied_files
};

/// Reads run_dir/config.json's "model" section for Model (see RunConfig), for running at `p`:
/// for int8 the model is built in float32 whatever dtype it was trained in, because the int8
/// quantizer reads float32 weights and an int8 export keeps the other parameters in float32.
/// @throws graft::Error naming config.json and the field at fault.
template <class Model>
RunConfig<Model> read_run_config(const std::string& run_dir,
                                 const std::vector<std::string>& more_tied_files, Precision p) {
  using Config = decltype(RunConfig<Model>::c);
  RunConfig<Model> r;
  r.path = run_dir + "/config.json";
  r.json = train::load_json(r.path);
  r.c = Config::from_json(model_section(r.json, r.path, "load_run"), r.path);
  if (p == Precision::int8) r.c.dtype = DType::f32;
  r.tied = {r.path};
  r.tied.insert(r.tied.end(), more_tied_files.begin(), more_tied_files.end());
  return r;
}

/// Loads run_dir/model.safetensors for running at precision `p`: as load_run_model(run_dir,
/// more_tied_files), except that for int8 the model is built in float32 (read_run_config(); a
/// bf16 file widens through load_state_dict).
/// @throws graft::Error as load_run_model().
template <class Model>
LoadedModel<Model> load_run_weights_model(const std::string& run_dir,
                                          const std::vector<std::string>& more_tied_files,
                                          Precision p) {
  RunConfig<Model> rc = read_run_config<Model>(run_dir, more_tied_files, p);
  LoadedModel<Model> r;
  r.weights = run_dir + "/model.safetensors";
  train::SafetensorsFile f = load_run_weights_file(rc.c, rc.path, r.weights, rc.tied);
  r.model = std::make_unique<Model>(rc.c);
  r.model->load_state_dict(f.tensors);
  r.model->eval();
  r.config = std::move(rc.json);
  r.metadata = std::move(f.metadata);
  return r;
}

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
  return load_run_weights_model<Model>(run_dir, more_tied_files, Precision::fp32);
}

/// load_run_model() for inference at precision `p`: where run_dir holds an export for p
/// (export_file_name(p), written by save_export()) and `source` allows it, the model is built
/// without memory (nn::SkipInit(nn::SkipInit::Memory::none)) and given the export's tensors
/// (adopt_export()), so no float32 copy of a quantized weight is made: a bf16 model, or one whose
/// linear weights are int8 already (keep_for_inference(model, p) then leaves the weights as they
/// are). Otherwise load_run_weights_model(run_dir, more_tied_files, p). LoadedModel::weights
/// names the file read.
/// @throws graft::Error naming the file and tensor at fault (see load_export(), adopt_export()).
template <class Model>
LoadedModel<Model> load_run_model(const std::string& run_dir,
                                  const std::vector<std::string>& more_tied_files, Precision p,
                                  RunSource source = RunSource::export_if_present) {
  const std::string path = p == Precision::fp32 ? "" : run_dir + "/" + export_file_name(p);
  std::error_code ec;
  if (path.empty() || source == RunSource::weights || !std::filesystem::exists(path, ec))
    return load_run_weights_model<Model>(run_dir, more_tied_files, p);
  RunConfig<Model> rc = read_run_config<Model>(run_dir, more_tied_files, p);
  train::SafetensorsFile f =
      load_export(path, p, run_dir + "/model.safetensors", rc.tied,
                  buffer_elements(rc.c.d_model, rc.c.max_len, rc.c.positions.kind));
  LoadedModel<Model> r;
  {
    const nn::SkipInit no_memory(nn::SkipInit::Memory::none);
    r.model = std::make_unique<Model>(rc.c);
  }
  r.metadata = f.metadata;
  adopt_export(*r.model, std::move(f), p);
  r.model->eval();
  r.config = std::move(rc.json);
  r.weights = path;
  return r;
}

}  // namespace graft::models
