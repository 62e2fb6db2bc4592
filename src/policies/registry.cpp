#include "veloxquant/registry.h"

#include "policies/methods.h"
#include "veloxquant/errors.h"

namespace vq {

const std::vector<MethodInfo>& registry() {
  // The explicit table: one line per method, in the order `veloxquant list` shows them.
  static const std::vector<MethodInfo> methods = {
      detail::full_method(),      detail::streaming_llm_method(), detail::h2o_method(),
      detail::tova_method(),      detail::snapkv_method(),        detail::pyramidkv_method(),
      detail::squeeze_method(),   detail::chunkkv_method(),       detail::keyformer_method(),
      detail::morphkv_method(),   detail::cam_method(),           detail::kivi_method(),
      detail::knorm_method(),     detail::keydiff_method(),
  };
  return methods;
}

const MethodInfo& find_method(std::string_view id) {
  for (const auto& m : registry()) {
    if (m.id == id) return m;
  }
  std::string known;
  for (const auto& m : registry()) known += (known.empty() ? "" : ", ") + m.id;
  throw Error(ErrorCode::kUnknownMethod,
              "unknown method '" + std::string(id) + "'; known methods: " + known);
}

std::vector<std::string> method_ids() {
  std::vector<std::string> ids;
  for (const auto& m : registry()) ids.push_back(m.id);
  return ids;
}

bool has_token_budget(const CacheConfig& config) { return config.info().get_budget != nullptr; }

std::int64_t token_budget(const CacheConfig& config) {
  if (!has_token_budget(config)) {
    throw Error(ErrorCode::kInvalidConfig,
                "[" + config.method() + "] this method has no token budget");
  }
  return config.info().get_budget(config);
}

CacheConfig with_token_budget(const CacheConfig& config, std::int64_t budget) {
  if (!has_token_budget(config)) {
    throw Error(ErrorCode::kInvalidConfig,
                "[" + config.method() + "] this method has no token budget to set");
  }
  CacheConfig out = config;
  out.info().set_budget(out, budget);
  out.validate();
  return out;
}

std::string method_table_markdown() {
  std::string s =
      "| id | disposition | score signal | budget | paper | paper configuration | deviations "
      "from the paper |\n"
      "| --- | --- | --- | --- | --- | --- | --- |\n";
  for (const auto& m : registry()) {
    s += "| `" + m.id + "` | " + m.disposition + " | " + m.score_signal + " | " + m.budget_type +
         " | " + m.paper + " | " + (m.paper_config.empty() ? "-" : m.paper_config) + " | " +
         m.deviations + " |\n";
  }
  return s;
}

}  // namespace vq
