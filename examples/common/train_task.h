// What the lm and classify programs' training tasks (train::TrainTask) share: batches of rows
// trained by cross-entropy and sharded by rows across ranks, and at each validation the best
// weights saved beside the run's config.json and the learning curves drawn.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "graft/nn/module.h"
#include "graft/nn/train/checkpoint.h"
#include "graft/nn/train/trainer.h"
#include "graft/ops/loss.h"
#include "graft/ops/shape.h"

namespace graft::tasks {

// Sets task's model, batches, loss, examples, tokens, generators and data_fingerprint for
// `batches` (a Batch has Tensor members `input` and `target` named by the member pointers, and
// int64_t `tokens`): batch i's loss is the mean cross-entropy of model.forward(input) (logits,
// classes last) against target (one class per logit row), each rank given its shard of the
// rows. The fingerprint covers the inputs. `batches` and `model` outlive the task.
template <class Model, class Batch>
void set_row_batches(train::TrainTask& task, Model& model, const std::vector<Batch>& batches,
                     Tensor Batch::*input, Tensor Batch::*target) {
  task.model = &model;
  task.generators = {&model.dropout_gen};
  task.batches = (int64_t)batches.size();
  task.loss = [&model, &batches, input, target](int64_t i, train::Shard s) {
    const Batch& b = batches[(size_t)i];
    const Tensor x = train::shard_of(b.*input, s);
    const Tensor logits = model.forward(x);
    const Tensor mean = cross_entropy(reshape(logits, {-1, logits.shape().back()}),
                                      reshape(train::shard_of(b.*target, s), {-1}));
    return train::shard_loss(mean, x.size(0), (b.*input).size(0));
  };
  task.examples = [&batches, input](int64_t i) { return (batches[(size_t)i].*input).size(0); };
  task.tokens = [&batches](int64_t i) { return batches[(size_t)i].tokens; };
  std::vector<std::pair<std::string, Tensor>> fp;
  for (const Batch& b : batches) fp.emplace_back("", b.*input);
  task.data_fingerprint = train::weights_checksum(fp);
}

// Sets task's tied_files to `tied` and its on_validated: the best validated weights into the
// checkpoint's model.safetensors (tagged `format`, tied to those files), then `draw(v)` (the
// curves) unless it is empty. `model` outlives the task.
void save_best_and_draw(train::TrainTask& task, const nn::Module& model, const std::string& format,
                        const std::vector<std::string>& tied,
                        std::function<void(const train::Validated&)> draw);

// On --resume, the optimizer and schedule a run saved in its config.json "train" section
// `train` (named `where` in errors): its "recipe" (train::loop_recipe(), the one place a run writes
// lr, warmup, lr_factor and the rest; train::apply_recipe()), and only that. A run written before
// the recipe (graft < 0.5; translate < 0.6) kept them at the top level: "lr_factor" and "warmup"
// (required), "lr", "optimizer", "weight_decay", "schedule", "min_lr", "decay_steps" (optional:
// Adam and the auto schedule, the only ones then).
// @throws graft::Error naming `where` and the field for a missing or mistyped value.
void apply_saved_recipe(const nlohmann::json& train, train::LoopOptions& loop,
                        const std::string& where);

}  // namespace graft::tasks
