#include "examples/common/curves.h"

#include <cmath>

#include "examples/common/plot.h"

namespace graft::plot {

void learning_curves(const std::string& png_path, const std::vector<train::MetricsRow>& rows,
                     const std::string& loss_label, const std::vector<std::string>& metrics,
                     const std::string& metrics_title, const Baseline& baseline) {
  Series train{"train loss (" + loss_label + ")", {}, {}}, valid{"valid loss", {}, {}};
  std::vector<Series> ms;
  for (auto& m : metrics) ms.push_back({"valid " + m, {}, {}});
  for (auto& r : rows) {
    if (std::isfinite(r.train_loss))
      train.x.push_back((double)r.step), train.y.push_back(r.train_loss);
    if (r.valid.count("loss"))
      valid.x.push_back((double)r.step), valid.y.push_back(r.valid.at("loss"));
    for (size_t i = 0; i < metrics.size(); ++i)
      if (r.valid.count(metrics[i]))
        ms[i].x.push_back((double)r.step), ms[i].y.push_back(r.valid.at(metrics[i]));
  }
  if (!rows.empty())
    for (auto& m : metrics)
      if (auto it = baseline.metrics.find(m); it != baseline.metrics.end())
        ms.push_back({baseline.name + " " + m,
                      {(double)rows.front().step, (double)rows.back().step},
                      {it->second, it->second}});
  std::vector<Series> loss{train};
  if (!valid.x.empty()) loss.push_back(valid);
  line_chart(png_path, {Panel{"loss", "step", "loss", loss, true},
                        Panel{metrics_title, "step", "", ms, false}});
}

}  // namespace graft::plot
