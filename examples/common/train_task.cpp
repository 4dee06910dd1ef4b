#include "examples/common/train_task.h"

namespace graft::tasks {

void save_best_and_draw(train::TrainTask& task, const nn::Module& model, const std::string& format,
                        const std::vector<std::string>& tied,
                        std::function<void(const train::Validated&)> draw) {
  task.tied_files = tied;
  task.on_validated = [&model, format, tied, draw = std::move(draw)](const train::Validated& v) {
    if (v.best)
      train::save_weights(model.state_dict(), v.checkpoint.path("model.safetensors"), v.step,
                          format, tied);
    if (draw) draw(v);
  };
}

}  // namespace graft::tasks
