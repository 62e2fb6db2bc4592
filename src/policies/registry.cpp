#include "veloxquant/registry.h"

#include <cmath>
#include <deque>
#include <mutex>

#include "base/validate.h"
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
  X(keydiff)          \
  X(lagkv)            \
  X(leverage)         \
  X(duoattention)     \
  X(qfilters)         \
  X(simlayerkv)       \
  X(criticalkv)       \
  X(criticaladakv)    \
  X(expected_attention) \
  X(think)            \
  X(finch)            \
  X(kvzip)            \
  X(random)

namespace vq {
namespace detail {

#define VQ_DECLARE_METHOD(name) MethodInfo name##_method();
VQ_METHODS(VQ_DECLARE_METHOD)
#undef VQ_DECLARE_METHOD

namespace {

[[noreturn]] void bad_entry(const std::string& id, const std::string& why) {
  throw Error(ErrorCode::kInvalidArgument,
              "register_method('" + validate::excerpt(id) + "'): " + why);
}

const FieldSpec* int_field_named(const MethodInfo& m, const std::string& name) {
  for (const FieldSpec& f : m.fields) {
    if (f.name == name && f.type == FieldType::kInt) return &f;
  }
  return nullptr;
}

// A name the spec grammar can carry as a key: a lower-case letter, then lower-case letters,
// digits and '_' ("h2o_budget"); ids may start with a digit ("4bit" is no key, but an id).
bool is_key(const std::string& s) {
  if (s.empty() || !(s[0] >= 'a' && s[0] <= 'z')) return false;
  for (char c : s) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
}

// One line of printable text (what `veloxquant list` and the docs table print as is).
bool is_printable_line(const std::string& s) {
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) return false;
  }
  return true;
}

// An enum choice as a spec value: printable, no ',' or '=' (the spec's separators), no space.
bool is_choice(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u == 0x7f || c == ',' || c == '=') return false;
  }
  return true;
}

// The method's own fields (before the registry adds the shared groups): names and aliases that
// are keys, ranges that are ordered numbers, enum choices that are distinct spec values,
// printable docs, no group (groups are the registry's).
void check_own_fields(const MethodInfo& m) {
  const std::string& id = m.id;
  for (const FieldSpec& f : m.fields) {
    const std::string shown = "field '" + validate::excerpt(f.name) + "'";
    if (f.name.empty()) bad_entry(id, "a field has no name");
    if (!is_key(f.name)) {
      bad_entry(id, shown + ": a field name must be a lower-case letter followed by lower-case "
                            "letters, digits and '_'");
    }
    for (const std::string& a : f.aliases) {
      if (!is_key(a)) {
        bad_entry(id, shown + ": alias '" + validate::excerpt(a) +
                          "' must be a lower-case letter followed by lower-case letters, digits "
                          "and '_'");
      }
    }
    if (!f.group.empty()) {
      bad_entry(id, shown + " sets group '" + validate::excerpt(f.group) +
                        "'; the shared groups are added by the registry (leave group empty)");
    }
    if (!is_printable_line(f.doc)) {
      bad_entry(id, shown + ": its doc must be one line without control characters");
    }
    if (f.type == FieldType::kInt || f.type == FieldType::kFloat) {
      // Finite (messages print the bounds; an int bound is printed as an integer) and, for an
      // int field, whole numbers a double holds exactly (|x| <= 2^53, as the seed's range).
      const double exact = 9007199254740992.0;
      const auto bound_ok = [&](double x) {
        return std::isfinite(x) &&
               (f.type == FieldType::kFloat || (x == std::floor(x) && std::fabs(x) <= exact));
      };
      if (!bound_ok(f.min) || !bound_ok(f.max) || f.min > f.max) {
        bad_entry(id, shown + ": its range " + validate::real_range_text(f.min, f.max) +
                          (f.type == FieldType::kInt
                               ? " must be whole numbers in [-2^53, 2^53], min <= max"
                               : " must be finite numbers, min <= max"));
      }
    }
    if (f.type == FieldType::kEnum && f.choices.empty()) {
      bad_entry(id, shown + " is an enum without choices");
    }
    for (std::size_t i = 0; i < f.choices.size(); ++i) {
      if (!is_choice(f.choices[i])) {
        bad_entry(id, shown + ": choice '" + validate::excerpt(f.choices[i]) +
                          "' must be non-empty, printable, without spaces, ',' or '='");
      }
      for (std::size_t j = 0; j < i; ++j) {
        if (f.choices[j] == f.choices[i]) {
          bad_entry(id, shown + " lists choice '" + f.choices[i] + "' twice");
        }
      }
    }
  }
}

// `info` with the shared option groups that apply to it (add_shared_options), checked: the id's
// and prefix's spelling, a policy (and a scorer for a scored method), the fields (names, ranges,
// choices, defaults in range), names and aliases unique and every short key (a name without
// its prefix) naming one field, the budget fields. Every entry of the registry, the library's
// and those registered at run time, is one.
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
  const bool scored = info.make_policy == nullptr || info.make_policy == &make_scored_policy;
  if (scored && !info.make_scorer) {
    bad_entry(id, "it runs on the scored policy (scored_method) but has no make_scorer");
  }
  if (!info.prefix.empty() && (!is_key(info.prefix) || info.prefix.back() == '_')) {
    bad_entry(id, "prefix '" + validate::excerpt(info.prefix) +
                      "' must be a lower-case letter followed by lower-case letters, digits and "
                      "'_', not ending in '_' (fields are named <prefix>_budget, ...)");
  }
  if (info.prefix.empty() && (!info.budget_field.empty() || scored)) {
    bad_entry(id, "the prefix is empty; a method with a token budget or a scorer needs one (its "
                  "fields and the merge options' aliases are spelled <prefix>_...)");
  }
  if (!is_printable_line(info.summary)) {
    bad_entry(id, "the summary must be one line without control characters");
  }
  if (info.make_policy == nullptr) info.make_policy = &make_scored_policy;
  check_own_fields(info);
  add_shared_options(info);
  std::vector<std::string> names;
  for (const FieldSpec& f : info.fields) {
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
  // A key without the prefix finds a field by its full name or alias first (CacheConfig::
  // resolve), so a field <prefix>_x beside a field or alias x could be set only by its full name.
  if (!info.prefix.empty()) {
    const std::string p = info.prefix + "_";
    for (const FieldSpec& f : info.fields) {
      if (f.name.rfind(p, 0) != 0) continue;
      const std::string short_key = f.name.substr(p.size());
      for (const std::string& n : names) {
        if (n == short_key) {
          bad_entry(id, "field '" + f.name + "' answers to '" + short_key +
                            "' without its prefix, which already names another field");
        }
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
  m.token_loop = true;
  return m;
}

const MethodInfo& register_method(MethodInfo info) {
  detail::Table& t = detail::table();
  // Checked whole first (an entry that is malformed and a duplicate is reported as malformed).
  MethodInfo entry = detail::completed(std::move(info));
  const std::lock_guard<std::mutex> lock(t.mutex);
  for (const auto& m : t.entries) {
    if (m.id == entry.id) {
      detail::bad_entry(entry.id, "a method with this id is already registered");
    }
  }
  t.entries.push_back(std::move(entry));
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
