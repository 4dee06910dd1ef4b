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

namespace {

template <class T>
void read_if_present(const nlohmann::json& t, const char* key, T& v, const std::string& where) {
  if (t.contains(key)) v = train::json_field<T>(t, key, where);
}

// A run from before the recipe: the top-level fields it saved; what it did not save is what such
// runs trained with (Adam, the auto schedule, no weight decay, lr 0: Noam), never the command
// line's (an --lr on resume would turn a Noam run into a constant schedule).
void apply_pre_recipe_schedule(const nlohmann::json& t, train::LoopOptions& loop,
                               const std::string& where) {
  loop.lr_factor = train::json_field<double>(t, "lr_factor", where);
  loop.warmup = train::json_field<int64_t>(t, "warmup", where);
  loop.optimizer = "adam", loop.weight_decay = 0, loop.schedule = "auto";
  loop.lr = 0, loop.min_lr = 0, loop.decay_steps = 0;
  read_if_present(t, "lr", loop.lr, where);
  read_if_present(t, "optimizer", loop.optimizer, where);
  read_if_present(t, "weight_decay", loop.weight_decay, where);
  read_if_present(t, "schedule", loop.schedule, where);
  read_if_present(t, "min_lr", loop.min_lr, where);
  read_if_present(t, "decay_steps", loop.decay_steps, where);
}

}  // namespace

void apply_saved_recipe(const nlohmann::json& train, train::LoopOptions& loop,
                        const std::string& where) {
  if (train.is_object() && train.contains("recipe"))
    train::apply_recipe(train["recipe"], loop, where + ": \"recipe\"");
  else apply_pre_recipe_schedule(train, loop, where);
}

}  // namespace graft::tasks
