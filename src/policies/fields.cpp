#include "policies/fields.h"

#include <string>

#include "veloxquant/errors.h"

namespace vq::detail {

FieldSpec int_field(std::string name, std::int64_t def, std::int64_t min, std::int64_t max,
                    std::string doc) {
  FieldSpec f;
  f.name = std::move(name);
  f.type = FieldType::kInt;
  f.default_value = def;
  f.min = static_cast<double>(min);
  f.max = static_cast<double>(max);
  f.doc = std::move(doc);
  return f;
}

FieldSpec float_field(std::string name, double def, double min, double max, std::string doc) {
  FieldSpec f;
  f.name = std::move(name);
  f.type = FieldType::kFloat;
  f.default_value = def;
  f.min = min;
  f.max = max;
  f.doc = std::move(doc);
  return f;
}

FieldSpec bool_field(std::string name, bool def, std::string doc) {
  FieldSpec f;
  f.name = std::move(name);
  f.type = FieldType::kBool;
  f.default_value = def;
  f.doc = std::move(doc);
  return f;
}

FieldSpec enum_field(std::string name, std::string def, std::vector<std::string> choices,
                     std::string doc) {
  FieldSpec f;
  f.name = std::move(name);
  f.type = FieldType::kEnum;
  f.default_value = std::move(def);
  f.choices = std::move(choices);
  f.doc = std::move(doc);
  return f;
}

void add_common_fields(std::vector<FieldSpec>& fields) {
  fields.push_back(int_field("seed", 42, 0, 9007199254740991,
                             "RNG seed; layer i of a model uses seed + i"));
  fields.push_back(enum_field("kv_dtype", "f16", {"f16", "f32"},
                              "storage type of kept K/V rows (scoring is fp32 either way)"));
}

void add_merge_fields(std::vector<FieldSpec>& fields, const std::string& prefix,
                      const std::string& default_mode) {
  fields.push_back(enum_field(prefix + "_merge", default_mode, {"sim_weighted", "mean", "drop"},
                              "what happens to an evicted row: blend into the most similar "
                              "survivor (cosine-weighted or 0.5), or drop it"));
  fields.push_back(bool_field(prefix + "_merge_gate", true,
                              "merge only with probability clamp(score_loser / score_target, "
                              "0, 1) (CaM's merge mask)"));
  fields.push_back(bool_field(prefix + "_merge_keys", false,
                              "blend keys as well as values when merging (nearest target only)"));
  fields.push_back(enum_field(prefix + "_target", "nearest", {"nearest", "window"},
                              "merge target: the most cosine-similar survivor, or add v_e / m to "
                              "each of the next m kept rows (CaM's paper rule; keys untouched)"));
  fields.push_back(int_field(prefix + "_merge_m", 32, 1, kMaxTokens,
                             "m: kept rows after the loser that share it (target=window)"));
  fields.push_back(enum_field(prefix + "_merge_attention", "cumulative", {"cumulative", "current"},
                              "what the gate compares: the method's own (cumulative) scores, or "
                              "the current query's attention"));
}

void add_source_fields(std::vector<FieldSpec>& fields) {
  fields.push_back(enum_field("source", "proxy", {"proxy", "attention"},
                              "scores from the incoming key as query (needs only K/V) or from the "
                              "attention probabilities the engine passes to end_step"));
  fields.push_back(enum_field("gqa_reduce", "mean", {"mean", "max", "sum"},
                              "how a KV head folds the attention of its query heads"));
}

void add_quantize_fields(std::vector<FieldSpec>& fields) {
  fields.push_back(enum_field("quantize", "none", {"none", "kivi2", "kivi4"},
                              "store kept rows KIVI-quantized (2 or 4 bits, really packed)"));
  fields.push_back(int_field("kivi_group_size", 32, 1, 4096,
                             "KIVI group: G tokens per key channel group, G channels per value "
                             "group"));
  fields.push_back(int_field("residual_length", 32, 0, kMaxTokens,
                             "newest rows kept unquantized (the tail holds residual to "
                             "residual + G - 1 rows); with quantize= the budget must be >= "
                             "residual_length + kivi_group_size"));
}

void add_mass_fields(std::vector<FieldSpec>& fields, const std::string& prefix) {
  fields.push_back(int_field(prefix + "_grace", 0, 0, kMaxTokens,
                             "newest rows protected from eviction (0: the paper's rule)"));
  fields.push_back(float_field(prefix + "_decay", 1.0, 0.0, 1.0,
                               "score <- score * decay + attention each step (1: the paper's rule)"));
}

void config_error(const CacheConfig& config, const std::string& message) {
  throw Error(ErrorCode::kInvalidConfig, "[" + config.method() + "] " + message);
}

void require_less(const CacheConfig& config, std::string_view a, std::string_view b) {
  const std::int64_t va = config.get_int(a), vb = config.get_int(b);
  if (!(va < vb)) {
    config_error(config, std::string(a) + " must be < " + std::string(b) + " (" +
                             std::to_string(vb) + "), got " + std::to_string(va));
  }
}

void require_sum_less(const CacheConfig& config, std::string_view a, std::string_view b,
                      std::string_view c) {
  const std::int64_t va = config.get_int(a), vb = config.get_int(b), vc = config.get_int(c);
  if (!(va + vb < vc)) {
    config_error(config, std::string(a) + " + " + std::string(b) + " must be < " +
                             std::string(c) + " (" + std::to_string(vc) + "), got " +
                             std::to_string(va) + " + " + std::to_string(vb) + " = " +
                             std::to_string(va + vb));
  }
}

void require_at_most(const CacheConfig& config, std::string_view a, std::string_view b) {
  const std::int64_t va = config.get_int(a), vb = config.get_int(b);
  if (!(va <= vb)) {
    config_error(config, std::string(a) + " must be <= " + std::string(b) + " (" +
                             std::to_string(vb) + "), got " + std::to_string(va));
  }
}

}  // namespace vq::detail
