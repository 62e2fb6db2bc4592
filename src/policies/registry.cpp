#include "veloxquant/registry.h"

#include <deque>
#include <mutex>

#include "policies/fields.h"
#include "policies/methods.h"
#include "veloxquant/errors.h"

// The methods of the library, one line each, in the order `veloxquant list` shows them. Each
// name is a method file's entry point: MethodInfo <name>_method() in src/policies/methods/<file>.cpp.
#define VQ_METHODS(X) \
  X(full)             \
  X(streaming_llm)    \
  X(h2o)              \
  X(tova)             \
  X(snapkv)           \
  X(pyramidkv)        \
  X(squeeze)          \
  X(chunkkv)          \
  X(keyformer)        \
  X(morphkv)          \
  X(cam)              \
  X(kivi)             \
  X(knorm)            \
  X(keydiff)

namespace vq {
namespace detail {

#define VQ_DECLARE_METHOD(name) MethodInfo name##_method();
VQ_METHODS(VQ_DECLARE_METHOD)
#undef VQ_DECLARE_METHOD

namespace {

[[noreturn]] void bad_entry(const std::string& id, const std::string& why) {
  throw Error(ErrorCode::kInvalidArgument, "register_method('" + id + "'): " + why);
}

const FieldSpec* int_field_named(const MethodInfo& m, const std::string& name) {
  for (const FieldSpec& f : m.fields) {
    if (f.name == name && f.type == FieldType::kInt) return &f;
  }
  return nullptr;
}

// `info` with the shared option groups that apply to it (add_shared_options), checked: the id's
// spelling, a policy, every field's default in its range, names and aliases unique, the budget
// fields. Every entry of the registry, the library's and those registered at run time, is one.
MethodInfo completed(MethodInfo info) {
  const std::string id = info.id;
  if (id.empty()) bad_entry(id, "the id is empty");
  for (char c : id) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) {
      bad_entry(id, "the id must be lower-case letters, digits and '_'");
    }
  }
  if (info.make_policy == nullptr && !info.make_scorer) {
    bad_entry(id, "it needs make_policy or make_scorer");
  }
  if (info.make_policy == nullptr) info.make_policy = &make_scored_policy;
  add_shared_options(info);
  std::vector<std::string> names;
  for (const FieldSpec& f : info.fields) {
    if (f.name.empty()) bad_entry(id, "a field has no name");
    bool ok = true;
    if (f.type == FieldType::kInt) {
      const auto* v = std::get_if<std::int64_t>(&f.default_value);
      ok = v != nullptr && static_cast<double>(*v) >= f.min && static_cast<double>(*v) <= f.max;
    } else if (f.type == FieldType::kFloat) {
      const auto* v = std::get_if<double>(&f.default_value);
      ok = v != nullptr && *v >= f.min && *v <= f.max;
    } else if (f.type == FieldType::kBool) {
      ok = std::holds_alternative<bool>(f.default_value);
    } else {
      const auto* v = std::get_if<std::string>(&f.default_value);
      ok = v != nullptr;
      if (ok) {
        bool found = false;
        for (const auto& c : f.choices) found = found || c == *v;
        ok = found;
      }
    }
    if (!ok) bad_entry(id, "field " + f.name + "'s default is not one it allows");
    names.push_back(f.name);
    names.insert(names.end(), f.aliases.begin(), f.aliases.end());
  }
  for (std::size_t i = 0; i < names.size(); ++i) {
    for (std::size_t j = i + 1; j < names.size(); ++j) {
      if (names[i] == names[j]) {
        bad_entry(id, "two fields are named '" + names[i] +
                          "' (a field of the method's own named like a shared option, which "
                          "the registry adds: see MethodInfo::fields)");
      }
    }
  }
  if (!info.budget_field.empty() && int_field_named(info, info.budget_field) == nullptr) {
    bad_entry(id, "budget_field '" + info.budget_field + "' is not an int field");
  }
  if (!info.budget_offset.empty() &&
      (info.budget_field.empty() || int_field_named(info, info.budget_offset) == nullptr)) {
    bad_entry(id, "budget_offset '" + info.budget_offset +
                      "' needs a budget_field and must be an int field");
  }
  return info;
}

// Entries live in a deque (stable addresses: CacheConfig keeps a pointer to its entry); the
// vector registry() returns is a copy, rebuilt by every registration.
struct Table {
  std::mutex mutex;
  std::deque<MethodInfo> entries;
  std::vector<MethodInfo> list;
  Table() {
#define VQ_ADD_METHOD(name) entries.push_back(completed(name##_method()));
    VQ_METHODS(VQ_ADD_METHOD)
#undef VQ_ADD_METHOD
    list.assign(entries.begin(), entries.end());
  }
};

Table& table() {
  static Table t;
  return t;
}

}  // namespace

void set_budget_fields(CacheConfig& config, std::int64_t budget) {
  const MethodInfo& m = config.info();
  if (m.budget_offset.empty()) {
    config.set(m.budget_field, budget);
    return;
  }
  const std::int64_t offset = config.get_int(m.budget_offset);
  if (offset < 0) {
    // The offset field is out of its range (validate() says so later); the window cannot be
    // derived from it, and budget - offset could overflow.
    config_error(config, "budget " + std::to_string(budget) + " cannot be split: " +
                             m.budget_offset + " is " + std::to_string(offset) +
                             ", it must be >= 0");
  }
  if (budget <= offset) {
    config_error(config, "budget " + std::to_string(budget) +
                             " leaves no room for the window: it must be > " + m.budget_offset +
                             " (" + std::to_string(offset) + ")");
  }
  config.set(m.budget_field, budget - offset);
}

void check_sink_below_budget(const CacheConfig& config) {
  const std::string& p = config.info().prefix;
  require_less(config, p + "_n_sink", p + "_budget");
}

void check_recent_family(const CacheConfig& config) {
  check_sink_below_budget(config);
  const std::string& p = config.info().prefix;
  check_recent_window(config, p, config.has(p + "_recent") ? "recent" : "grace",
                      config.has(p + "_chunk_size") ? p + "_chunk_size" : "");
}

}  // namespace detail

const std::vector<MethodInfo>& registry() { return detail::table().list; }

const MethodInfo& find_method(std::string_view id) {
  for (const auto& m : detail::table().entries) {
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

MethodInfo scored_method(std::string id, std::string prefix, std::string summary,
                         std::function<RowScorer(const CacheConfig& config)> make_scorer,
                         std::int64_t default_budget) {
  MethodInfo m;
  m.id = std::move(id);
  m.prefix = std::move(prefix);
  m.summary = std::move(summary);
  m.disposition = "drop (merge optional)";
  m.budget_type = "uniform";
  m.fields = {
      detail::int_field(m.prefix + "_budget", default_budget, 1, detail::kMaxTokens,
                        "rows kept per KV head, sinks included"),
      detail::int_field(m.prefix + "_n_sink", 4, 0, detail::kMaxTokens,
                        "leading rows never evicted"),
  };
  m.budget_field = m.prefix + "_budget";
  m.check = &detail::check_sink_below_budget;
  m.make_scorer = std::move(make_scorer);
  m.make_policy = &detail::make_scored_policy;
  return m;
}

const MethodInfo& register_method(MethodInfo info) {
  detail::Table& t = detail::table();
  const std::lock_guard<std::mutex> lock(t.mutex);
  for (const auto& m : t.entries) {
    if (m.id == info.id) detail::bad_entry(info.id, "a method with this id is already registered");
  }
  t.entries.push_back(detail::completed(std::move(info)));
  t.list.push_back(t.entries.back());
  return t.entries.back();
}

bool has_token_budget(const CacheConfig& config) { return !config.info().budget_field.empty(); }

std::int64_t token_budget(const CacheConfig& config) {
  if (!has_token_budget(config)) {
    throw Error(ErrorCode::kInvalidConfig,
                "[" + config.method() + "] this method has no token budget");
  }
  const MethodInfo& m = config.info();
  const std::int64_t field = config.get_int(m.budget_field);
  const std::int64_t offset = m.budget_offset.empty() ? 0 : config.get_int(m.budget_offset);
  std::int64_t total = 0;
  if (__builtin_add_overflow(field, offset, &total)) {
    detail::config_error(config, m.budget_field + " (" + std::to_string(field) + ") + " +
                             m.budget_offset + " (" + std::to_string(offset) +
                             ") does not fit a 64-bit token budget");
  }
  return total;
}

CacheConfig with_token_budget(const CacheConfig& config, std::int64_t budget) {
  if (!has_token_budget(config)) {
    throw Error(ErrorCode::kInvalidConfig,
                "[" + config.method() + "] this method has no token budget to set");
  }
  CacheConfig out = config;
  detail::set_budget_fields(out, budget);
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
