// A toy training task for the library loop, shared by test_trainer and the train-state fuzz
// target: y = 2 x + 1 on `batches` batches of 4 points, a Linear(1, 1) in float64, mean squared
// error; validation reports the mean of the batch losses as "mse".
#pragma once

#include <map>
#include <string>
#include <vector>

#include "graft/nn/layers.h"
#include "graft/nn/train/trainer.h"
#include "graft/ops/ops.h"

namespace graft::testing {

struct ToyTask {
  nn::Linear model{1, 1, true, DType::f64, default_generator()};
  std::vector<Tensor> xs, ys;
  train::TrainTask task;
  explicit ToyTask(uint64_t seed, int batches = 8) {
    Generator g(seed);
    for (int b = 0; b < batches; ++b) {
      Tensor x = rand({4, 1}, DType::f64, g, -1, 1);
      xs.push_back(x);
      ys.push_back(affine(x, 2.0, 1.0));
    }
    task.model = &model;
    task.batches = batches;
    task.loss = [this](int64_t i, train::Shard s) {
      Tensor d = sub(model.forward(train::shard_of(xs[i], s)), train::shard_of(ys[i], s));
      const auto [first, last] = train::shard_rows(4, s);
      return train::shard_loss(mean(mul(d, d)), last - first, 4);
    };
    task.examples = [](int64_t) { return int64_t(4); };
    task.tokens = [](int64_t) { return int64_t(4); };
    task.metric_names = {"mse"};
    task.validate = [this]() -> std::map<std::string, double> {
      double s = 0;
      for (int64_t i = 0; i < task.batches; ++i) s += task.loss(i, {}).item();
      return {{"mse", s / (double)task.batches}};
    };
    task.stop_metric = "mse";
  }
};

}  // namespace graft::testing
