// Fuzz target: any bytes as a config.json, read as each model family's config and sized. Must
// either give a config whose sizes are in range or throw graft::Error (never build a model).
#include <cstdint>
#include <string>

#include "graft/models/decoder_only_lm.h"
#include "graft/models/encoder_classifier.h"
#include "graft/models/transformer.h"
#include "graft/nn/train/checkpoint.h"

using namespace graft;

template <class Config>
void try_family(const nlohmann::json& j) {
  try {
    const Config c = Config::from_json(j, "fuzz.json");
    if (c.d_model < 1 || c.heads < 1 || c.d_model % c.heads != 0) __builtin_trap();
    models::check_config_memory(c, "fuzz.json");
  } catch (const Error&) {
  }
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json j;
  try {
    j = train::parse_json(std::string(reinterpret_cast<const char*>(data), size), "fuzz.json", 32);
  } catch (const Error&) {
    return 0;
  }
  try_family<models::TransformerConfig>(j);
  try_family<models::LMConfig>(j);
  try_family<models::ClassifierConfig>(j);
  if (j.is_object() && j.contains("model")) try_family<models::TransformerConfig>(j["model"]);
  return 0;
}
