#include "examples/translation/interop.h"

#include "examples/common/finite.h"
#include "examples/translation/trainer.h"
#include "graft/autograd/tape.h"
#include "graft/models/config_json.h"
#include "graft/models/run.h"
#include "graft/nn/train/checkpoint.h"
#include "graft/nn/train/checkpoint_dir.h"
#include "graft/ops/ops.h"

namespace graft::translation {

namespace {

const Tensor& batch_ids(const train::SafetensorsFile& f, const char* name) {
  const Tensor& t = f.at(name);
  if (t.dtype() != DType::i64 || t.dim() != 2)
    fail("forward: '" + f.path + "': \"" + name + "\" must be int64 (rows, length), got " +
         describe(t));
  return t;
}

}  // namespace

void write_forward(const std::string& run_dir, const std::string& batch_path,
                   double label_smoothing, const std::string& out_path) {
  if (!(label_smoothing >= 0 && label_smoothing < 1))
    fail("forward: --label-smoothing must be in [0, 1)");
  train::check_output_path("forward --out", out_path,
                           run_inputs(run_dir, {{batch_path, "--batch"}}));
  LoadedRun run = load_run(run_dir);
  const models::Transformer& m = *run.model;
  const train::SafetensorsFile batch = train::load_safetensors(batch_path);
  const Tensor &src = batch_ids(batch, "src"), &tgt_in = batch_ids(batch, "tgt_in"),
               &tgt_out = batch_ids(batch, "tgt_out");
  if (tgt_in.shape() != tgt_out.shape() || src.size(0) != tgt_in.size(0))
    fail("forward: '" + batch_path + "': src " + describe(src) + ", tgt_in " + describe(tgt_in) +
         ", tgt_out " + describe(tgt_out) +
         ": the rows must agree and tgt_in and tgt_out must have one shape");
  auto loss_of = [&](const Tensor& logits) {
    return cross_entropy(reshape(logits, {-1, m.cfg.vocab}), reshape(tgt_out, {-1}),
                         label_smoothing, m.cfg.pad_id);
  };
  Tensor logits = m.forward(src, tgt_in);
  Tensor loss = loss_of(logits);
  // Nothing non-finite is written: the anomaly rerun names the first op that made it.
  auto rerun = [&] { loss_of(m.forward(src, tgt_in)); };
  cli::check_finite("forward: the logits", logits, &m, rerun);
  cli::check_finite("forward: the loss", loss, &m, rerun);
  loss.backward();
  std::vector<std::pair<std::string, Tensor>> out = {{"logits", logits.detach()},
                                                     {"loss", reshape(loss.detach(), {1})}};
  for (const auto& [name, p] : m.named_parameters()) {
    if (!p.grad().defined()) fail("forward: parameter '" + name + "' got no gradient");
    out.emplace_back("grad." + name,
                     cli::check_finite("forward: the gradient of '" + name + "'", p.grad()));
  }
  train::save_safetensors(out_path, out, {{"format", "graft-forward"}});
}

void import_weights(const std::string& run_dir, const std::string& weights_path) {
  const std::string cfg_path = run_dir + "/config.json";
  const nlohmann::json j = train::load_json(cfg_path);
  const train::RunLock lock(run_dir);  // it writes the run's model.safetensors
  const models::TransformerConfig cfg = models::TransformerConfig::from_json(
      models::model_section(j, cfg_path, "import-weights"), cfg_path);
  models::check_config_memory(cfg, cfg_path, /*copies=*/2);  // the file's tensors and the model's
  const train::SafetensorsFile w = train::load_safetensors(weights_path);
  models::check_weights_count(cfg.parameter_count(), w.tensors, cfg_path, weights_path);
  models::Transformer m(cfg);
  try {
    m.load_state_dict(w.tensors);
  } catch (const Error& e) {
    fail("import-weights: '" + weights_path + "': " + e.what());
  }
  save_model(m, run_dir + "/model.safetensors", 0, tied_files(run_dir));
}

}  // namespace graft::translation
