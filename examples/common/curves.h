// Learning curves every example program draws (curves.png in its run directory), from the
// rows train::train_loop keeps: the training loss with the validation loss (when the task reports
// one, "loss") on a log axis, and the named validation metrics in a second panel.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "graft/nn/train/trainer.h"

namespace graft::plot {

// `baselines`: a flat line per named metric (a baseline's score on the same validation data,
// "baseline <name>" with its description) across the steps, so the curve shows where the model
// passes it.
struct Baseline {
  std::string name;  // "Naive Bayes", ...
  std::map<std::string, double> metrics;
};
void learning_curves(const std::string& png_path, const std::vector<train::MetricsRow>& rows,
                     const std::string& loss_label, const std::vector<std::string>& metrics,
                     const std::string& metrics_title, const Baseline& baseline = {});

}  // namespace graft::plot
