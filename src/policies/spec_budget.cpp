#include "policies/spec_budget.h"

#include <set>

#include "veloxquant/errors.h"
#include "veloxquant/registry.h"

namespace vq {
namespace {

// The canonical fields that carry a method's budget: those with_token_budget changes when the
// budget moves off the default (one step up, or down at the top of the range).
std::set<std::string> budget_fields(const CacheConfig& defaults) {
  std::set<std::string> out;
  const std::int64_t b = token_budget(defaults);
  for (const std::int64_t other : {b + 1, b - 1}) {
    try {
      const CacheConfig moved = with_token_budget(defaults, other);
      for (std::size_t i = 0; i < moved.fields().size(); ++i) {
        if (!(moved.fields()[i].second == defaults.fields()[i].second))
          out.insert(moved.fields()[i].first);
      }
      if (!out.empty()) break;
    } catch (const Error&) {
      // this direction is outside the method's range: try the other
    }
  }
  return out;
}

}  // namespace

bool spec_writes_budget(std::string_view spec) {
  const CacheConfig parsed = CacheConfig::parse(spec);  // reports syntax and range errors
  if (!has_token_budget(parsed)) return false;
  const std::size_t colon = spec.find(':');
  if (colon == std::string_view::npos) return false;
  const std::set<std::string> fields = budget_fields(CacheConfig(parsed.method()));
  std::string_view rest = spec.substr(colon + 1);
  while (!rest.empty()) {
    const std::size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    const std::string_view key = item.substr(0, item.find('='));
    if (key == "budget" || fields.count(parsed.resolve(key)) > 0) return true;
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return false;
}

CacheConfig config_with_flag_budget(std::string_view spec, std::optional<std::int64_t> flag_value,
                                    std::optional<std::int64_t> flag_default,
                                    std::string_view flag_name) {
  CacheConfig config = CacheConfig::parse(spec);
  if (!has_token_budget(config)) return config;
  const std::string flag(flag_name);
  if (spec_writes_budget(spec)) {
    const std::int64_t written = token_budget(config);
    if (flag_value && *flag_value != written) {
      throw Error(ErrorCode::kInvalidArgument,
                  flag + " " + std::to_string(*flag_value) + " contradicts budget " +
                      std::to_string(written) + " written in the spec '" + std::string(spec) +
                      "'; drop one of them");
    }
    return config;
  }
  const std::optional<std::int64_t> budget = flag_value ? flag_value : flag_default;
  if (!budget) return config;
  try {
    return with_token_budget(config, *budget);
  } catch (const Error& e) {
    throw Error(ErrorCode::kInvalidArgument,
                flag + " " + std::to_string(*budget) + (flag_value ? "" : " (its default)") +
                    " does not fit the spec '" + std::string(spec) + "': " + e.what());
  }
}

}  // namespace vq
