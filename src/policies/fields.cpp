#include "policies/fields.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>
#include <string_view>

#include "veloxquant/errors.h"
#include "veloxquant/registry.h"

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

namespace {

// Appends `group_fields`, each tagged with `group`.
void add_group(std::vector<FieldSpec>& fields, const char* group,
               std::initializer_list<FieldSpec> group_fields) {
  for (FieldSpec f : group_fields) {
    f.group = group;
    fields.push_back(std::move(f));
  }
}

}  // namespace

void add_common_fields(std::vector<FieldSpec>& fields) {
  add_group(fields, "common",
            {int_field("seed", 42, 0, 9007199254740991,
                       "RNG seed; layer i of a model uses seed + i"),
             enum_field("kv_dtype", "f16", {"f16", "f32", "q8_0", "q4_0"},
                        "storage type of kept K/V rows (scoring is fp32 either way); "
                        "q8_0 / q4_0: ggml's blocks of 32 channels with an fp16 scale, "
                        "as llama.cpp's KV cache types (head_dim a multiple of 32)")});
}

void add_merge_fields(std::vector<FieldSpec>& fields, const std::string& prefix) {
  const std::size_t first = fields.size();
  add_group(fields, "merge",
            {enum_field("merge", "drop", {"sim_weighted", "mean", "drop"},
                        "what happens to an evicted row: blend into the most similar "
                        "survivor (cosine-weighted or 0.5), spread evenly over a window "
                        "(mean with merge_target=window), or drop it"),
             bool_field("merge_gate", true,
                        "merge only with probability clamp(score_loser / score_target, "
                        "0, 1) (CaM's merge mask)"),
             bool_field("merge_keys", false,
                        "blend keys as well as values when merging (nearest target only)"),
             enum_field("merge_target", "nearest", {"nearest", "window"},
                        "merge target: the most cosine-similar survivor, or add v_e / m to "
                        "each of the next m kept rows (CaM's paper rule; keys untouched)"),
             int_field("merge_m", 32, 1, kMaxTokens,
                       "m: kept rows after the loser that share it (merge_target=window)"),
             enum_field("merge_attention", "cumulative", {"cumulative", "current"},
                        "what the gate compares: the method's own (cumulative) scores, or "
                        "the current query's attention")});
  for (std::size_t i = first; i < fields.size(); ++i) {
    FieldSpec& f = fields[i];
    // The names the fields had when each method declared them: <prefix>_merge, ...,
    // <prefix>_target (merge_target was `target` then).
    const std::string old = f.name == "merge_target" ? "target" : f.name;
    if (old != f.name) f.aliases.push_back(old);
    if (!prefix.empty()) f.aliases.push_back(prefix + "_" + old);
  }
}

void add_source_fields(std::vector<FieldSpec>& fields) {
  add_group(fields, "source",
            {enum_field("source", "auto", {"auto", "proxy", "attention"},
                        "scores from the attention probabilities the engine passes to "
                        "end_step (attention), from the incoming key as query (proxy, needs "
                        "only K/V), or auto: attention if the cache's first step passes "
                        "probabilities, else proxy, fixed for the cache's life"),
             enum_field("gqa_reduce", "mean", {"mean", "max", "sum"},
                        "how a KV head folds the attention of its query heads")});
}

void add_headwise_fields(std::vector<FieldSpec>& fields) {
  add_group(fields, "headwise",
            {bool_field("headwise", false,
                        "head-wise budgets (AdaKV): the layer's n_kv_heads x budget rows are "
                        "shared among its KV heads by one ranking of their scores, not "
                        "split evenly"),
             float_field("headwise_floor", 0.2, 0.0, 1.0,
                         "with headwise: each head keeps at least floor(headwise_floor x "
                         "(budget - its protected rows)) rows besides its sinks and recent "
                         "window (AdaKV's alpha)")});
}

void add_quantize_fields(std::vector<FieldSpec>& fields) {
  add_demote_fields(fields);
  add_group(fields, "quantize",
            {enum_field("quantize", "none", {"none", "kivi2", "kivi4"},
                        "store kept rows KIVI-quantized (2 or 4 bits, really packed)"),
             int_field("kivi_group_size", 32, 1, 4096,
                       "KIVI group: G tokens per key channel group, G channels per value "
                       "group"),
             int_field("residual_length", 32, 0, kMaxTokens,
                       "newest rows kept unquantized (values of residual rows, keys of "
                       "residual to residual + G - 1); with quantize= the budget must be "
                       ">= residual_length + kivi_group_size")});
}

void add_demote_fields(std::vector<FieldSpec>& fields) {
  add_group(fields, "demote",
            {enum_field("demote", "none", {"none", "kivi2", "kivi4"},
                        "mixed precision: a row the method evicts is kept in a low-bit tier "
                        "(2 or 4 bits, per token) instead of dropped (MiKV); methods with a "
                        "token budget only"),
             int_field("demote_budget", -1, -1, kMaxTokens,
                       "rows the low-bit tier holds per KV head before its lowest-scored "
                       "row is dropped; -1: the token budget"),
             int_field("demote_group", 32, 1, 4096,
                       "channels per quantization group of a demoted row (keys and values; "
                       "one fp16 scale and zero per group)")});
}

void add_schedule_fields(std::vector<FieldSpec>& fields) {
  add_group(fields, "schedule",
            {int_field("compress_interval", 1, 1, kMaxTokens,
                       "evict every N tokens instead of every token: a head holds up to budget "
                       "+ N - 1 rows between evictions, and the token that brings it to budget "
                       "+ N cuts it back to the budget in one decision (kvpress's decoding "
                       "compression interval); 1: every token, the papers' rule")});
}

void add_think_fields(std::vector<FieldSpec>& fields) {
  add_group(fields, "think",
            {float_field("think", 0.0, 0.0, 1.0,
                         "ThinK: share of key channels pruned, per KV head, from the rows held "
                         "after a prefill step (S > 1), ranked by |Q_window[:, c]| |K[:, c]|; "
                         "those rows keep D - floor(think x D) channels (0: off)"),
             int_field("think_window", 32, 1, kMaxTokens,
                       "ThinK's observation window: the prefill step's last queries that rank "
                       "the key channels (their keys without queries: end_step(&probs, "
                       "&queries) passes them)")});
}

std::int64_t think_kept_channels(double ratio, std::int64_t head_dim) {
  const auto pruned =
      static_cast<std::int64_t>(std::floor(ratio * static_cast<double>(head_dim) + 1e-9));
  return head_dim - std::min(pruned, head_dim);
}

void check_think(const CacheConfig& c) {
  if (!c.has("think")) return;
  const double r = c.get_float("think");
  if (r == 0.0) {
    if (c.is_set("think_window")) {
      config_error(c, "think_window has no effect with think=0 (no key channel is pruned)");
    }
    return;
  }
  if (!(r < 1.0)) {
    config_error(c, "think must be < 1 (a pruned key keeps at least one channel), got " +
                        value_text(c.get("think")));
  }
  const std::string t = "think=" + value_text(c.get("think"));
  for (const char* f : {"quantize", "demote"}) {
    if (c.has(f) && c.get_enum(f) != "none") {
      config_error(c, t + " and " + f + "=" + c.get_enum(f) +
                          " are exclusive (both choose how rows are stored): give one");
    }
  }
  const std::string& dt = c.get_enum("kv_dtype");
  if (dt == "q8_0" || dt == "q4_0") {
    config_error(c, t + " and kv_dtype=" + dt +
                        " are exclusive (pruned keys are stored as f16 or f32 rows): give "
                        "kv_dtype=f16 or f32");
  }
}

void add_shared_options(MethodInfo& m) {
  if (!m.budget_field.empty()) add_merge_fields(m.fields, m.prefix);
  if (!m.budget_field.empty() && m.token_loop) add_schedule_fields(m.fields);
  if (m.scores_attention) {
    add_source_fields(m.fields);
    if (m.exact_budget) add_headwise_fields(m.fields);
  }
  if (!m.quantizes_rows) {
    add_quantize_fields(m.fields);
    add_think_fields(m.fields);
  }
  add_common_fields(m.fields);
  // shared_defaults: KEY=VALUE items, each naming a shared field (by name or alias).
  const auto bad = [&](const std::string& why) {
    throw Error(ErrorCode::kInvalidArgument, "register_method('" + m.id + "'): shared_defaults '" +
                                                 m.shared_defaults + "': " + why);
  };
  std::string_view rest = m.shared_defaults;
  while (!rest.empty()) {
    const std::size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    const std::size_t eq = item.find('=');
    if (eq == std::string_view::npos) bad("expected KEY=VALUE, got '" + std::string(item) + "'");
    const std::string_view key = item.substr(0, eq);
    FieldSpec* field = nullptr;
    for (FieldSpec& f : m.fields) {
      bool named = f.name == key;
      for (const std::string& a : f.aliases) named = named || a == key;
      if (named && !f.group.empty()) field = &f;
    }
    if (field == nullptr) bad("'" + std::string(key) + "' is no shared option of this method");
    try {
      field->default_value = field->parse(item.substr(eq + 1), m.id);
    } catch (const Error& e) {
      bad(e.what());
    }
  }
}

void check_demote(const CacheConfig& c) {
  if (!c.has("demote")) return;
  const std::string& mode = c.get_enum("demote");
  if (mode == "none") {
    for (const char* f : {"demote_budget", "demote_group"}) {
      if (c.is_set(f)) config_error(c, std::string(f) + " has no effect with demote=none");
    }
    return;
  }
  const std::string d = "demote=" + mode;
  if (!has_token_budget(c)) {
    config_error(c, d + " needs a method with a token budget (this one keeps every row, so no "
                        "row would be demoted)");
  }
  if (c.has("quantize") && c.get_enum("quantize") != "none") {
    config_error(c, d + " and quantize=" + c.get_enum("quantize") +
                        " are exclusive (quantize= packs every kept row; demote= keeps the "
                        "method's rows in fp16 and packs only the rows it evicts): give one");
  }
  if (c.has("merge") && c.get_enum("merge") != "drop") {
    config_error(c, d + " and merge=" + c.get_enum("merge") +
                        " are exclusive (a demoted row is kept, so merging it too would count "
                        "it twice): set merge=drop");
  }
}

void check_kv_dtype(const CacheConfig& c) {
  const std::string& t = c.get_enum("kv_dtype");
  if (t != "q8_0" && t != "q4_0") return;
  const std::string k = "kv_dtype=" + t;
  if (c.method() == "kivi") {
    config_error(c, k + " and kivi are exclusive (kivi packs rows its own way, with its newest "
                        "rows in kv_dtype f16 or f32): give kv_dtype=f16 or f32");
  }
  for (const char* f : {"quantize", "demote"}) {
    if (c.has(f) && c.get_enum(f) != "none") {
      config_error(c, k + " and " + f + "=" + c.get_enum(f) +
                          " are exclusive (both choose how rows are packed): give one");
    }
  }
}

void add_recent_fields(std::vector<FieldSpec>& fields, const std::string& prefix,
                       const std::string& grace_name, double ratio, const std::string& ratio_doc) {
  fields.push_back(int_field(prefix + "_" + grace_name, -1, -1, kMaxTokens,
                             "newest rows protected from eviction (the recent window); -1: "
                             "recent_ratio of the budget left after the sinks"));
  fields.push_back(float_field(prefix + "_recent_ratio", ratio, 0.0, 1.0, ratio_doc));
}

std::int64_t recent_window(const CacheConfig& c, const std::string& prefix,
                           const std::string& grace_name, const std::string& reserve_field) {
  const std::int64_t reserve = reserve_field.empty() ? 1 : c.get_int(reserve_field);
  const std::int64_t grace = c.get_int(prefix + "_" + grace_name);
  if (grace >= 0) return grace;
  const std::int64_t room =
      c.get_int(prefix + "_budget") - c.get_int(prefix + "_n_sink") - reserve + 1;
  if (room <= 0) return 0;
  return static_cast<std::int64_t>(
      std::floor(c.get_float(prefix + "_recent_ratio") * static_cast<double>(room)));
}

void check_recent_window(const CacheConfig& c, const std::string& prefix,
                         const std::string& grace_name, const std::string& reserve_field) {
  const std::int64_t reserve = reserve_field.empty() ? 1 : c.get_int(reserve_field);
  const std::string g = prefix + "_" + grace_name, r = prefix + "_recent_ratio";
  const std::string b = prefix + "_budget", s = prefix + "_n_sink";
  const std::int64_t grace = c.get_int(g);
  if (grace >= 0 && c.is_set(r)) {
    config_error(c, r + " has no effect with " + g + "=" + std::to_string(grace) +
                        " (a fixed window); give one of them");
  }
  const std::int64_t window = recent_window(c, prefix, grace_name, reserve_field);
  const std::int64_t budget = c.get_int(b), n_sink = c.get_int(s);
  if (n_sink + window + reserve <= budget) return;
  const std::string derived =
      grace >= 0 ? ""
                 : " (" + g + " = -1: floor(" + r + " " + value_text(c.get(r)) + " x (" + b +
                       " - " + s + (reserve_field.empty() ? "" : " - " + reserve_field + " + 1") +
                       ")) = " + std::to_string(window) + ")";
  if (reserve_field.empty()) {
    config_error(c, s + " + " + g + " must be < " + b + " (" + std::to_string(budget) +
                        "), got " + std::to_string(n_sink) + " + " + std::to_string(window) +
                        " = " + std::to_string(n_sink + window) + derived);
  }
  config_error(c, s + " + " + g + " + " + reserve_field + " must be <= " + b + " (" +
                      std::to_string(budget) + "), got " + std::to_string(n_sink) + " + " +
                      std::to_string(window) + " + " + std::to_string(reserve) + " = " +
                      std::to_string(n_sink + window + reserve) + derived);
}

void add_mass_fields(std::vector<FieldSpec>& fields, const std::string& prefix) {
  add_recent_fields(fields, prefix, "grace", 0.5,
                    "share of the non-sink budget kept as the recent window when grace = -1 "
                    "(H2O: 0.5, recent rows and heavy hitters in equal shares)");
  fields.push_back(float_field(prefix + "_decay", 0.98, 0.0, 1.0,
                               "score <- score * decay + attention each step (H2O's paper: 1)"));
}

void check_no_effect(const CacheConfig& c) {
  auto no_effect = [&](const std::string& field, const std::string& because) {
    config_error(c, field + " has no effect with " + because);
  };
  if (c.has("merge")) {
    const std::string mode = c.get_enum("merge");
    const bool window = c.get_enum("merge_target") == "window";
    if (mode == "drop") {
      for (const char* f :
           {"merge_gate", "merge_keys", "merge_target", "merge_m", "merge_attention"}) {
        if (c.is_set(f)) no_effect(f, "merge=drop (nothing is merged)");
      }
    } else if (window) {
      if (c.get_bool("merge_keys")) {
        no_effect("merge_keys=true", "merge_target=window (the window rule never merges keys)");
      }
      if (mode == "sim_weighted") {
        no_effect("merge=sim_weighted",
                  "merge_target=window (the window rule spreads v_e / m evenly: use merge=mean)");
      }
    } else if (c.is_set("merge_m")) {
      no_effect("merge_m", "merge_target=nearest (m is the window's size)");
    }
    if (mode != "drop" && !c.get_bool("merge_gate") && c.is_set("merge_attention")) {
      no_effect("merge_attention", "merge_gate=false (no gate compares attention)");
    }
  }
  if (c.has("headwise") && !c.get_bool("headwise") && c.is_set("headwise_floor")) {
    no_effect("headwise_floor", "headwise=false (no rows are shared among heads)");
  }
  if (c.has("source") && c.has("gqa_reduce") && c.get_enum("source") == "proxy" &&
      c.is_set("gqa_reduce")) {
    no_effect("gqa_reduce", "source=proxy (no query heads are folded)");
  }
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
