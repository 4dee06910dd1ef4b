#include "models/config_json.h"

namespace graft::models {

void ConfigReader::bad(const char* name, const std::string& why) const {
  fail(where_ + ": field \"" + name + "\" " + why);
}

void ConfigReader::size(const char* name, int64_t& v, int64_t max) const {
  get(name, v);
  if (v < 1 || v > max) bad(name, "must be in [1, " + std::to_string(max) + "], got " + std::to_string(v));
}

void ConfigReader::probability(const char* name, double& v) const {
  get(name, v);
  if (!(v >= 0 && v < 1)) bad(name, "must be in [0, 1), got " + std::to_string(v));
}

DType ConfigReader::dtype(const char* name) const {
  std::string s = "float32";
  get_or_keep(name, s);
  if (s != "float32" && s != "float64") bad(name, "must be float32 or float64, got '" + s + "'");
  return s == "float64" ? DType::f64 : DType::f32;
}

void ConfigReader::positions(nn::PositionOptions& p) const {
  if (j_.contains("positions")) {
    std::string kind;
    get("positions", kind);
    try {
      p.kind = nn::parse_positions(kind);
    } catch (const Error& e) {
      bad("positions", e.what());
    }
  }
  get_or_keep("rope_base", p.rope_base);
  if (!(p.rope_base > 1)) bad("rope_base", "must be > 1");
  get_or_keep("relative_buckets", p.relative_buckets);
  get_or_keep("relative_max_distance", p.relative_max_distance);
  if (p.relative_buckets < 4 || p.relative_buckets > 4096) bad("relative_buckets", "must be in [4, 4096]");
  if (p.relative_max_distance < 1 || p.relative_max_distance > (int64_t(1) << 24))
    bad("relative_max_distance", "must be in [1, 2^24]");
}

nlohmann::json positions_json(const nn::PositionOptions& p) {
  return {{"positions", nn::positions_name(p.kind)}, {"rope_base", p.rope_base},
          {"relative_buckets", p.relative_buckets}, {"relative_max_distance", p.relative_max_distance}};
}

}  // namespace graft::models
