#include "graft/models/config_json.h"

#include <unistd.h>

#include <cstdio>

#include "graft/autograd/text.h"
#include "graft/ops/dropout.h"

namespace graft::models {

void bad_field(const std::string& where, const char* name, const std::string& why) {
  fail(where + ": field \"" + name + "\" " + why);
}

void ConfigCheck::size(const char* name, int64_t v, int64_t max) const { range(name, v, 1, max); }

void ConfigCheck::probability(const char* name, double v) const {
  if (!is_dropout_p(v)) bad(name, "must be in [0, 1], got " + std::to_string(v));
}

void ConfigCheck::token_id(const char* name, int64_t id, int64_t vocab) const {
  if (id < 0 || id >= vocab)
    bad(name, "must be a token id in [0, vocab " + std::to_string(vocab) + "), got " +
                  std::to_string(id));
}

void ConfigCheck::heads_divide(int64_t heads, int64_t d_model) const {
  if (d_model % heads)
    bad("heads",
        "must divide d_model " + std::to_string(d_model) + ", got " + std::to_string(heads));
}

void ConfigCheck::range(const char* name, int64_t v, int64_t lo, int64_t hi) const {
  if (v < lo || v > hi)
    bad(name, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                  std::to_string(v));
}

std::string printable_value(const std::string& s) { return text::printable(s); }

nn::LayerConfig StackConfig::layer() const {
  return nn::layer_config(d_model, heads, d_ff, dropout, norm_first, dtype);
}

int64_t embedding_parameters(int64_t vocab, int64_t d_model, int64_t max_len, nn::Positions kind) {
  const int64_t table = checked_mul(vocab, d_model, "parameter count");
  if (kind != nn::Positions::learned) return table;
  return checked_add(table, checked_mul(max_len, d_model, "parameter count"), "parameter count");
}

int64_t buffer_elements(int64_t d_model, int64_t max_len, nn::Positions kind) {
  return kind == nn::Positions::sinusoidal ? checked_mul(max_len, d_model, "buffer size") : 0;
}

namespace {

// Physical memory, or the cgroup (v2) limit when it is smaller.
double memory_limit_bytes() {
  double memory = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
  if (FILE* f = std::fopen("/sys/fs/cgroup/memory.max", "r")) {
    double limit = 0;
    if (std::fscanf(f, "%lf", &limit) == 1 && limit > 0 && (memory <= 0 || limit < memory))
      memory = limit;
    std::fclose(f);  // "max" (no limit) does not parse as a number
  }
  return memory;
}

}  // namespace

double model_peak_bytes(int64_t parameters, int64_t buffers, DType dt, int copies) {
  const int64_t elements =
      checked_add(checked_mul(parameters, copies, "model size"), buffers, "model size");
  return (double)elements * (double)dtype_size(dt) + (double)buffers * (double)sizeof(double);
}

void check_model_memory(int64_t parameters, int64_t buffers, DType dt, const std::string& where,
                        int copies) {
  const double bytes = model_peak_bytes(parameters, buffers, dt, copies);
  const double memory = memory_limit_bytes();
  if (memory > 0 && bytes > memory) {
    char buf[240];
    std::snprintf(
        buf, sizeof buf,
        "%lld parameters: %.1f GiB at its peak (%s), more than this machine's %.1f GiB of memory",
        (long long)parameters, bytes / (1 << 30),
        copies == 4   ? "weights, gradients and Adam moments"
        : copies == 2 ? "the loaded weights and the model's"
                      : "weights",
        memory / (1 << 30));
    fail(where + ": the config describes a model of " + buf);
  }
}

void check_file_memory(double file_bytes, int64_t buffers, const std::string& path) {
  const double bytes = file_bytes + (double)buffers * (double)sizeof(double);
  const double memory = memory_limit_bytes();
  if (memory > 0 && bytes > memory) {
    char buf[200];
    std::snprintf(buf, sizeof buf,
                  "%.1f GiB (its tensors and buffers), more than this machine's "
                  "%.1f GiB of memory",
                  bytes / (1 << 30), memory / (1 << 30));
    fail("'" + path + "': loading it takes " + buf);
  }
}

void check_weights_count(int64_t parameters,
                         const std::vector<std::pair<std::string, Tensor>>& weights,
                         const std::string& config_path, const std::string& weights_path) {
  int64_t held = 0;
  for (auto& [name, t] : weights) held = checked_add(held, t.numel(), "weights");
  if (held != parameters)
    fail("'" + config_path + "' describes a model of " + std::to_string(parameters) +
         " parameters but '" + weights_path + "' holds " + std::to_string(held) +
         ": they do not belong together");
}

int64_t StackConfig::stack_parameters(bool final_norm) const {
  return checked_add(embedding_parameters(vocab, d_model, max_len, positions.kind),
                     nn::encoder_parameters(layer(), layers, final_norm, positions),
                     "parameter count");
}

void check_token_ids(const char* who, const Tensor& ids) {
  if (ids.dtype() != DType::i64 || ids.dim() != 2)
    fail(std::string(who) + ": token ids must be int64 (B, T), got " + describe(ids));
}

}  // namespace graft::models
