// Cache configuration: a method id plus that method's typed fields, and the method spec syntax.
//
// Field names are the reference library's (methods.md): method-specific fields carry the
// method's prefix (cam_budget, h2o_grace, morphkv_window, ...); the shared option groups, which
// the registry gives every method they apply to (merge, source, headwise, demote, quantize,
// seed and kv_dtype), do not. Spec strings and set() accept a key with or without the prefix,
// and a field's aliases (FieldSpec::aliases: the merge fields also answer to the names they had
// when every method declared them, cam_merge, cam_target, ...):
//
//   cam:budget=64,merge=drop   ==   cam:cam_budget=64,cam_merge=drop
//
// Spec grammar:  ID[:KEY=VALUE[,KEY=VALUE...]]   (no spaces; bool values: true/false/1/0)
//
// `budget` is a key of every method with a token budget: it names the method's budget field
// (cam_budget, h2o_budget, ...) or, for streaming_llm, which has none, sets
// stream_window_size = budget - stream_n_sink after the spec's other keys.
//
// Nothing is silently ignored: a field given a non-default value that has no effect in the
// combination given (e.g. merge_m with merge_target=nearest) is an error naming both fields.
// A field at its default value is never an error, so spec(true) always parses back.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "veloxquant/types.h"

namespace vq {

enum class FieldType { kInt, kFloat, kBool, kEnum };
VQ_API const char* to_string(FieldType type) noexcept;

// A field value: int64 for kInt, double for kFloat, bool for kBool, string for kEnum.
using FieldValue = std::variant<std::int64_t, double, bool, std::string>;

// One configurable field of a method, as the registry describes it.
struct VQ_API FieldSpec {
  std::string name;  // canonical config key, e.g. "cam_budget"
  FieldType type = FieldType::kInt;
  FieldValue default_value;
  double min = 0;                    // inclusive range for kInt / kFloat
  double max = 0;
  std::vector<std::string> choices;  // allowed values for kEnum; for a kInt that takes only
                                     // some values of its range (e.g. {"2", "4"}), the values
                                     // listed (the method's check enforces them)
  std::string doc;                   // one line
  // The shared option group the field belongs to ("merge", "source", "headwise", "demote",
  // "quantize", "common"; the registry adds these), empty for a field of the method's own.
  std::string group = {};
  // Other keys that name the field in specs, set() and get(), e.g. "cam_merge" for "merge".
  std::vector<std::string> aliases = {};

  // "[1, 1048576]", "{sim_weighted, mean, drop}", "{true, false}".
  std::string allowed_text() const;
  // Parses `text` as this field's type; throws Error(kInvalidSpec) naming the field and type.
  FieldValue parse(std::string_view text, std::string_view method) const;
};

// Canonical text of a value ("64", "0.98", "true", "drop").
VQ_API std::string value_text(const FieldValue& value);

struct MethodInfo;

class VQ_API CacheConfig {
 public:
  // The method's defaults. Throws Error(kUnknownMethod) listing the registered ids.
  explicit CacheConfig(std::string_view method = "full");

  // Parses and validates a spec string (see the grammar above). Throws Error(kInvalidSpec)
  // for syntax errors and unknown keys (listing the allowed keys), kUnknownMethod for an
  // unknown id, kInvalidConfig for out-of-range or inconsistent values.
  static CacheConfig parse(std::string_view spec);

  const std::string& method() const noexcept { return method_; }
  const MethodInfo& info() const noexcept { return *info_; }

  // Resolves a key (a field name, with or without the method prefix, or an alias) to the
  // canonical field name; returns an empty string when the method has no such field.
  std::string resolve(std::string_view key) const;
  bool has(std::string_view key) const { return !resolve(key).empty(); }

  // Typed getters; throw Error(kInvalidArgument) for an unknown key or a type mismatch.
  std::int64_t get_int(std::string_view key) const;
  double get_float(std::string_view key) const;
  bool get_bool(std::string_view key) const;
  const std::string& get_enum(std::string_view key) const;
  const FieldValue& get(std::string_view key) const;

  // Sets a field (type-checked; an int is accepted for a float field). Ranges and cross-field
  // guards are checked by validate(), which every cache constructor calls. The key "budget" on a method without a field of that name (streaming_llm) goes
  // through the method's budget setter (MethodInfo::set_budget).
  void set(std::string_view key, FieldValue value);
  // Parses `text` with the field's type, then set().
  void set_text(std::string_view key, std::string_view text);

  // Checks every field's range and the method's cross-field guards. Throws Error(kInvalidConfig)
  // "[method] field must be in RANGE, got VALUE" naming the first offending field.
  void validate() const;

  // Whether the field's value differs from the method's default (the "given" fields the
  // no-effect guards look at). Unknown keys throw Error(kInvalidArgument).
  bool is_set(std::string_view key) const;

  std::int64_t seed() const { return get_int("seed"); }
  DType kv_dtype() const;

  // Every field in registry order with its current value.
  const std::vector<std::pair<std::string, FieldValue>>& fields() const noexcept { return values_; }
  // Spec string that reproduces this config; with all_fields=false only non-default fields.
  std::string spec(bool all_fields = false) const;

  friend bool operator==(const CacheConfig& a, const CacheConfig& b) {
    return a.method_ == b.method_ && a.values_ == b.values_;
  }

 private:
  std::size_t index_of(std::string_view key) const;  // throws for unknown keys
  std::string method_;
  const MethodInfo* info_ = nullptr;
  std::vector<std::pair<std::string, FieldValue>> values_;
};

}  // namespace vq
