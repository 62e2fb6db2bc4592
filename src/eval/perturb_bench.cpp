#include "eval/perturb_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <utility>

#include "eval/perturb.h"
#include "eval/plot.h"
#include "eval/results.h"
#include "policies/spec_budget.h"
#include "veloxquant/cache.h"
#include "veloxquant/errors.h"
#include "veloxquant/registry.h"

namespace vq::eval {

Feed parse_feed(const std::string& name) {
  if (name == "prefill") return Feed::kPrefill;
  if (name == "stream") return Feed::kStream;
  throw Error(ErrorCode::kInvalidArgument,
              "unknown feed '" + name + "'; allowed: prefill, stream");
}

const char* to_string(Feed feed) noexcept {
  return feed == Feed::kPrefill ? "prefill" : "stream";
}

namespace {

[[noreturn]] void bad_option(const std::string& message) {
  throw Error(ErrorCode::kInvalidArgument, "bench perturb: " + message);
}

void check_range(const char* flag, std::int64_t value, std::int64_t lo, std::int64_t hi) {
  if (value < lo || value > hi) {
    bad_option(fmt::format("{} must be in [{}, {}], got {}", flag, lo, hi, value));
  }
}

void check_list(const char* flag, const std::vector<std::int64_t>& values, std::int64_t lo,
                std::int64_t hi) {
  if (values.empty()) bad_option(fmt::format("{} needs at least one value", flag));
  for (std::size_t i = 0; i < values.size(); ++i) {
    check_range(flag, values[i], lo, hi);
    for (std::size_t j = 0; j < i; ++j) {
      if (values[j] == values[i]) bad_option(fmt::format("{} lists {} twice", flag, values[i]));
    }
  }
}

// The data of one sequence length for every seed, and the full-cache reference per (seed,
// storage dtype): attention outputs of every probe over every token, and the full cache itself
// (its rows identify the planted token).
class SeqData {
 public:
  SeqData(const PerturbOptions& o, std::int64_t seq) : o_(o), seq_(seq) {
    data_.reserve(static_cast<std::size_t>(o.seeds));
    for (std::int64_t s = 0; s < o.seeds; ++s) {
      data_.push_back(make_synthetic(o.geometry, o.heads, seq, o.head_dim, o.probes,
                                     static_cast<std::uint64_t>(s)));
    }
  }

  const SyntheticKV& data(std::int64_t seed) const { return data_[static_cast<std::size_t>(seed)]; }

  struct Reference {
    LayerCache full;
    std::vector<float> outputs;  // [heads][probes][head_dim]
  };

  const Reference& reference(std::int64_t seed, DType dtype) {
    const auto key = std::make_pair(seed, static_cast<int>(dtype));
    auto it = refs_.find(key);
    if (it != refs_.end()) return *it->second;
    const SyntheticKV& kv = data(seed);
    CacheConfig config("full");
    config.set("kv_dtype", std::string(vq::to_string(dtype)));
    auto ref = std::make_unique<Reference>(
        Reference{LayerCache(config, LayerShape{o_.heads, o_.head_dim, 0, 0, 1}), {}});
    ref->full.begin_step(TensorRef::f32(kv.keys.data(), 1, o_.heads, seq_, o_.head_dim),
                         TensorRef::f32(kv.values.data(), 1, o_.heads, seq_, o_.head_dim));
    ref->full.end_step();
    const std::int64_t per_head = o_.probes * o_.head_dim;
    ref->outputs.resize(static_cast<std::size_t>(o_.heads * per_head));
    for (std::int64_t h = 0; h < o_.heads; ++h) {
      attention_outputs(kv.probe(h, 0), o_.probes, o_.head_dim, ref->full.stored(0, h),
                        ref->outputs.data() + h * per_head);
    }
    return *refs_.emplace(key, std::move(ref)).first->second;
  }

 private:
  const PerturbOptions& o_;
  std::int64_t seq_;
  std::vector<SyntheticKV> data_;
  std::map<std::pair<std::int64_t, int>, std::unique_ptr<Reference>> refs_;
};

double mean_of(const std::vector<double>& x) {
  double s = 0;
  for (double v : x) s += v;
  return x.empty() ? 0.0 : s / static_cast<double>(x.size());
}

double sample_std(const std::vector<double>& x) {
  if (x.size() < 2) return 0.0;
  const double m = mean_of(x);
  double s = 0;
  for (double v : x) s += (v - m) * (v - m);
  return std::sqrt(s / static_cast<double>(x.size() - 1));
}

// True when `kept` still holds the planted token: a row at its position, or a row whose stored
// key is the planted key bit for bit. A merge gives the target the larger position of the two
// rows, so a planted row that absorbed a later row (values-only merge) keeps its key but not
// its position; a row at the planted position may have absorbed earlier rows. Either way the
// row survived eviction, and the perturbation shows what merging did to its value. Quantized
// storage keeps positions, so the position test covers it.
bool holds_planted(const HeadRows& kept, const HeadRows& full, std::int64_t planted,
                   std::int64_t head_dim) {
  const std::size_t es = dtype_size(full.dtype);
  const std::size_t bytes = static_cast<std::size_t>(head_dim) * es;
  const char* planted_key =
      static_cast<const char*>(full.keys) + static_cast<std::size_t>(planted * full.row_stride) * es;
  for (std::int64_t i = 0; i < kept.n_rows; ++i) {
    if (kept.positions[i] == planted) return true;
    if (kept.packed != nullptr || kept.dtype != full.dtype) continue;  // no fp16 key to compare
    const char* key = static_cast<const char*>(kept.keys) +
                      static_cast<std::size_t>(i * kept.row_stride) * es;
    if (std::memcmp(key, planted_key, bytes) == 0) return true;
  }
  return false;
}

PerturbMeasure measure_in(const PerturbOptions& o, SeqData& seq_data, const PerturbCase& c) {
  const std::int64_t H = o.heads, D = o.head_dim, S = c.seq, P = o.probes;
  PerturbMeasure m;
  std::vector<double> late, survival, kept_tokens, kept_bytes, full_bytes, ratio, merges,
      evictions, us;
  for (std::int64_t seed = 0; seed < o.seeds; ++seed) {
    const SyntheticKV& kv = seq_data.data(seed);
    const auto& ref = seq_data.reference(seed, c.config.kv_dtype());
    LayerCache cache(c.config, LayerShape{H, D, 0, 0, 1});
    const TensorRef all_k = TensorRef::f32(kv.keys.data(), 1, H, S, D);
    const TensorRef all_v = TensorRef::f32(kv.values.data(), 1, H, S, D);
    const auto t0 = std::chrono::steady_clock::now();
    if (o.feed == Feed::kPrefill) {
      cache.begin_step(all_k, all_v);
      cache.end_step();
    } else {
      TensorRef k = all_k, v = all_v;
      k.shape[2] = v.shape[2] = 1;
      for (std::int64_t t = 0; t < S; ++t) {
        k.data = kv.keys.data() + t * D;
        v.data = kv.values.data() + t * D;
        cache.begin_step(k, v);
        cache.end_step();
      }
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    us.push_back(seconds * 1e6 / static_cast<double>(S));

    double pert = 0, late_share = 0, survived = 0, rows = 0;
    for (std::int64_t h = 0; h < H; ++h) {
      const HeadRows kept = cache.stored(0, h);
      pert += perturbation_vs(kv.probe(h, 0), P, D, ref.outputs.data() + h * P * D, kept);
      rows += static_cast<double>(kept.n_rows);
      if (kv.late_start >= 0 && kept.n_rows > 0) {
        std::int64_t n_late = 0;
        for (std::int64_t i = 0; i < kept.n_rows; ++i) n_late += kept.positions[i] >= kv.late_start;
        late_share += static_cast<double>(n_late) / static_cast<double>(kept.n_rows);
      }
      if (kv.planted_pos >= 0) {
        survived += holds_planted(kept, ref.full.stored(0, h), kv.planted_pos, D) ? 1.0 : 0.0;
      }
    }
    const double hd = static_cast<double>(H);
    m.perturbation.push_back(pert / hd);
    late.push_back(late_share / hd);
    survival.push_back(survived / hd);
    kept_tokens.push_back(rows / hd);
    const CacheStats st = cache.stats();
    kept_bytes.push_back(static_cast<double>(st.kept_bytes));
    full_bytes.push_back(static_cast<double>(st.full_bytes));
    ratio.push_back(st.compression_ratio);
    merges.push_back(static_cast<double>(st.merges));
    evictions.push_back(static_cast<double>(st.evictions));
  }
  m.perturbation_mean = mean_of(m.perturbation);
  m.perturbation_std = sample_std(m.perturbation);
  m.kept_tokens = mean_of(kept_tokens);
  m.kept_bytes = mean_of(kept_bytes);
  m.full_bytes = mean_of(full_bytes);
  m.compression_ratio = mean_of(ratio);
  m.merges = mean_of(merges);
  m.evictions = mean_of(evictions);
  if (o.geometry == Geometry::kShift || o.geometry == Geometry::kStable) {
    m.late_topic_fraction = mean_of(late);
  }
  if (o.geometry == Geometry::kPlanted) m.planted_survival = mean_of(survival);
  m.time_per_token_us = mean_of(us);
  return m;
}

// A double that is a whole number in int64 range as a JSON integer, otherwise as a double.
nlohmann::json number(double v) {
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 9.0e15) {
    return nlohmann::json(static_cast<std::int64_t>(v));
  }
  return nlohmann::json(v);
}

nlohmann::json optional_number(const std::optional<double>& v) {
  return v ? number(*v) : nlohmann::json();
}

nlohmann::json row_json(const PerturbOptions& o, const PerturbCase& c, const PerturbMeasure& m) {
  nlohmann::json row = method_json(c.config);
  row["method_arg"] = c.method_arg;
  row["seq"] = c.seq;
  row["geometry"] = to_string(o.geometry);
  row["feed"] = to_string(o.feed);
  row["seeds"] = o.seeds;
  row["perturbation_mean"] = m.perturbation_mean;
  row["perturbation_std"] = m.perturbation_std;
  row["perturbation_per_seed"] = m.perturbation;
  row["late_topic_fraction"] = optional_number(m.late_topic_fraction);
  row["planted_survival"] = optional_number(m.planted_survival);
  row["kept_tokens"] = number(m.kept_tokens);
  row["kept_bytes"] = number(m.kept_bytes);
  row["full_bytes"] = number(m.full_bytes);
  row["compression_ratio"] = m.compression_ratio;
  row["merges"] = number(m.merges);
  row["evictions"] = number(m.evictions);
  row["time_per_token_us"] = m.time_per_token_us;
  return row;
}

}  // namespace

double perturb_bytes(const PerturbOptions& o) {
  // Every seed's K/V of one sequence length is held at once (fp32), plus the full-cache
  // references (up to fp32 again): 16 bytes per element at most; and every seed's probes
  // (fp32). The sizes are range-checked by plan_perturb, so this is far from overflow.
  const std::int64_t max_seq = o.seqs.empty() ? 0 : *std::max_element(o.seqs.begin(), o.seqs.end());
  const auto d = [](std::int64_t v) { return static_cast<double>(v); };
  return d(o.seeds) * d(o.heads) * d(o.head_dim) * (16.0 * d(max_seq) + 4.0 * d(o.probes));
}

std::vector<PerturbCase> plan_perturb(const PerturbOptions& o) {
  if (o.methods.empty()) bad_option("needs at least one --method SPEC");
  check_list("--seq", o.seqs, kMinSyntheticTokens, kMaxBenchTokens);
  check_list("--budget", o.budgets, 1, kMaxBenchTokens);
  check_range("--heads", o.heads, 1, kMaxBenchHeads);
  check_range("--head-dim", o.head_dim, 1, kMaxBenchHeadDim);
  check_range("--probes", o.probes, 1, kMaxBenchProbes);
  check_range("--seeds", o.seeds, 1, kMaxBenchSeeds);
  const std::int64_t max_seq = *std::max_element(o.seqs.begin(), o.seqs.end());
  const double bytes = perturb_bytes(o);
  if (bytes > static_cast<double>(kMaxBenchBytes)) {
    bad_option(fmt::format(
        "--seeds {} x --heads {} x (--seq {} + --probes {}) x --head-dim {} needs about {:.1f} "
        "GiB of synthetic K/V at once; the limit is {} GiB (use fewer seeds, probes or a "
        "shorter sequence)",
        o.seeds, o.heads, max_seq, o.probes, o.head_dim, bytes / (1 << 30), kMaxBenchBytes >> 30));
  }

  // Parse every spec and apply every budget first, so a bad one fails before anything runs.
  struct Method {
    std::string arg;
    std::vector<CacheConfig> configs;  // one per budget, or the config itself without a budget
  };
  std::vector<Method> methods;
  for (const std::string& spec : o.methods) {
    CacheConfig config;
    try {
      config = CacheConfig::parse(spec);
    } catch (const Error& e) {
      throw Error(e.code(), "bench perturb: --method '" + spec + "': " + e.what());
    }
    Method m{spec, {}};
    if (!has_token_budget(config)) {
      m.configs.push_back(config);
    } else if (spec_writes_budget(spec)) {
      // The spec's own budget wins over --budget's default; an explicit --budget list other
      // than that one budget contradicts it (policies/spec_budget.h).
      const std::int64_t written = token_budget(config);
      if (o.budgets_given && (o.budgets.size() != 1 || o.budgets[0] != written)) {
        std::string list;
        for (const std::int64_t b : o.budgets) list += (list.empty() ? "" : ",") + std::to_string(b);
        throw Error(ErrorCode::kInvalidArgument,
                    "bench perturb: --budget " + list + " contradicts budget " +
                        std::to_string(written) + " written in the spec '" + spec +
                        "'; drop one of them");
      }
      m.configs.push_back(config);
    } else {
      for (const std::int64_t budget : o.budgets) {
        try {
          m.configs.push_back(with_token_budget(config, budget));
        } catch (const Error& e) {
          throw Error(ErrorCode::kInvalidConfig,
                      fmt::format("bench perturb: --budget {} does not fit --method '{}': {}",
                                  budget, spec, e.what()));
        }
      }
    }
    methods.push_back(std::move(m));
  }
  // Two specs name the same configuration (also when they differ only in their budget, which
  // --budget overrides): their rows would be duplicates.
  for (std::size_t i = 0; i < methods.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      for (const CacheConfig& a : methods[i].configs) {
        for (const CacheConfig& b : methods[j].configs) {
          if (a == b) {
            bad_option("--method '" + methods[i].arg + "' and --method '" + methods[j].arg +
                       "' give the same configuration (" + a.spec() + ")");
          }
        }
      }
    }
  }
  std::vector<PerturbCase> cases;
  for (const std::int64_t seq : o.seqs) {
    for (const Method& m : methods) {
      for (const CacheConfig& config : m.configs) cases.push_back(PerturbCase{m.arg, config, seq});
    }
  }
  return cases;
}

PerturbMeasure measure_case(const PerturbOptions& options, const PerturbCase& c) {
  SeqData data(options, c.seq);
  return measure_in(options, data, c);
}

nlohmann::json perturb_settings_json(const PerturbOptions& o) {
  nlohmann::json s;
  s["methods"] = o.methods;
  s["seq"] = o.seqs;
  s["budget"] = o.budgets;
  s["heads"] = o.heads;
  s["head_dim"] = o.head_dim;
  s["probes"] = o.probes;
  s["seeds"] = o.seeds;
  s["data_seeds"] = fmt::format("0..{}", o.seeds - 1);
  s["geometry"] = to_string(o.geometry);
  s["geometry_doc"] = describe(o.geometry);
  s["feed"] = to_string(o.feed);
  s["metric"] =
      "perturbation = mean over KV heads and probes of 1 - cos(o_full, o_kept), o = softmax(q "
      "K^T / sqrt(D)) V in fp32; o_full over a full cache with the method's kv_dtype; mean and "
      "sample std over data seeds; the caches keep their own config seed";
  return s;
}

nlohmann::json run_perturb(const PerturbOptions& options, const std::string& command,
                           const PerturbProgress& progress) {
  const std::vector<PerturbCase> cases = plan_perturb(options);
  nlohmann::json doc = results_envelope("perturb", command, perturb_settings_json(options));
  std::size_t done = 0;
  for (const std::int64_t seq : options.seqs) {
    SeqData data(options, seq);
    for (const PerturbCase& c : cases) {
      if (c.seq != seq) continue;
      const auto t0 = std::chrono::steady_clock::now();
      const PerturbMeasure m = measure_in(options, data, c);
      doc["rows"].push_back(row_json(options, c, m));
      ++done;
      if (progress) {
        progress(done, cases.size(), c, m,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
    }
  }
  return doc;
}

namespace {

void require_perturb(const nlohmann::json& doc) {
  if (!doc.is_object() || doc.value("schema", "") != kResultsSchema ||
      doc.value("kind", "") != "perturb" || !doc.contains("rows") || !doc["rows"].is_array() ||
      !doc.contains("settings")) {
    throw Error(ErrorCode::kInvalidArgument,
                std::string("not a perturb result document (expected schema '") + kResultsSchema +
                    "' and kind 'perturb')");
  }
}

double num_or(const nlohmann::json& j, const char* key, double fallback) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>() : fallback;
}

// Series labels in the order the rows first name them.
std::vector<std::string> method_args(const nlohmann::json& rows) {
  std::vector<std::string> out;
  for (const auto& r : rows) {
    const std::string a = r.at("method_arg").get<std::string>();
    if (std::find(out.begin(), out.end(), a) == out.end()) out.push_back(a);
  }
  return out;
}

std::vector<std::int64_t> seqs_of(const nlohmann::json& rows) {
  std::vector<std::int64_t> out;
  for (const auto& r : rows) {
    const auto s = r.at("seq").get<std::int64_t>();
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::int64_t> budgets_of(const nlohmann::json& rows) {
  std::vector<std::int64_t> out;
  for (const auto& r : rows) {
    if (!r.at("budget").is_number()) continue;
    const auto b = r.at("budget").get<std::int64_t>();
    if (std::find(out.begin(), out.end(), b) == out.end()) out.push_back(b);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Whether a row's method disposes of evicted rows by merging (a `*_merge` field other than
// drop), and whether it does so with its gate off.
bool merges_rows(const nlohmann::json& row) {
  if (!row.contains("params") || !row["params"].is_object()) return false;
  for (const auto& [key, value] : row["params"].items()) {
    const std::string suffix = "_merge";
    if (key.size() >= suffix.size() &&
        key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0 &&
        value.is_string() && value != "drop") {
      return true;
    }
  }
  return false;
}

bool ungated_merge(const nlohmann::json& row) {
  if (!merges_rows(row)) return false;
  for (const auto& [key, value] : row["params"].items()) {
    const std::string suffix = "_merge_gate";
    if (key.size() >= suffix.size() &&
        key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0 && value == false) {
      return true;
    }
  }
  return false;
}

// Rows of one method at one sequence length, by budget (a budget-less row under every budget).
std::vector<const nlohmann::json*> rows_for(const nlohmann::json& rows, const std::string& arg,
                                            std::int64_t seq) {
  std::vector<const nlohmann::json*> out;
  for (const auto& r : rows) {
    if (r.at("method_arg") == arg && r.at("seq").get<std::int64_t>() == seq) out.push_back(&r);
  }
  return out;
}

}  // namespace

std::string perturb_plot_svg(const nlohmann::json& doc) {
  require_perturb(doc);
  const nlohmann::json& rows = doc["rows"];
  const nlohmann::json& st = doc["settings"];
  const std::string geometry = st.value("geometry", "?");
  const char* extra_key = geometry == "planted" ? "planted_survival"
                          : geometry == "shift" || geometry == "stable" ? "late_topic_fraction"
                                                                         : nullptr;
  const char* extra_label = geometry == "planted" ? "planted token survival"
                                                  : "late-topic fraction of kept rows";
  const std::vector<std::int64_t> budgets = budgets_of(rows);
  // Methods without a budget that are lossless everywhere (full) would only pin the y axis at
  // 0; they are left out of the figure and named in its title.
  std::vector<std::string> series_args, lossless;
  for (const std::string& arg : method_args(rows)) {
    bool budgetless = true, zero = true;
    for (const auto& r : rows) {
      if (r.at("method_arg") != arg) continue;
      budgetless = budgetless && !r.at("budget").is_number();
      zero = zero && num_or(r, "perturbation_mean", 1.0) == 0.0;
    }
    (budgetless && zero ? lossless : series_args).push_back(arg);
  }
  std::vector<Panel> panels, extra;
  for (const std::int64_t seq : seqs_of(rows)) {
    Panel p{fmt::format("seq {}", seq), "token budget", "perturbation (1 - cos)", false, false,
            {}};
    Panel e{fmt::format("seq {}", seq), "token budget", extra_label, false, false, {}};
    for (const std::string& arg : series_args) {
      Series s{arg, {}, {}, {}, false}, se{arg, {}, {}, {}, false};
      for (const nlohmann::json* r : rows_for(rows, arg, seq)) {
        if (ungated_merge(*r)) s.dashed = se.dashed = true;
        const double y = num_or(*r, "perturbation_mean", std::nan(""));
        const double err = num_or(*r, "perturbation_std", 0.0);
        const double ye = extra_key ? num_or(*r, extra_key, std::nan("")) : 0.0;
        if ((*r)["budget"].is_number()) {
          const double x = (*r)["budget"].get<double>();
          s.x.push_back(x), s.y.push_back(y), s.y_err.push_back(err);
          se.x.push_back(x), se.y.push_back(ye);
        } else {  // no budget: a flat dashed line across the sweep's budgets
          s.dashed = se.dashed = true;
          for (const std::int64_t b : budgets) {
            s.x.push_back(static_cast<double>(b)), s.y.push_back(y), s.y_err.push_back(err);
            se.x.push_back(static_cast<double>(b)), se.y.push_back(ye);
          }
        }
      }
      if (s.x.empty()) continue;
      p.series.push_back(std::move(s));
      e.series.push_back(std::move(se));
    }
    panels.push_back(std::move(p));
    if (extra_key) extra.push_back(std::move(e));
  }
  const int columns = static_cast<int>(panels.size());
  for (auto& e : extra) panels.push_back(std::move(e));
  std::string title = fmt::format(
      "bench perturb: geometry {}, feed {}, {} KV heads x {}, {} probes, {} seeds (bars: std over "
      "seeds; dashed: merging with the gate off, or no budget)",
      geometry, st.value("feed", "?"), st.value("heads", 0), st.value("head_dim", 0),
      st.value("probes", 0), st.value("seeds", 0));
  if (!lossless.empty()) {
    std::string names;
    for (const auto& n : lossless) names += (names.empty() ? "" : ", ") + n;
    title += "; not drawn (perturbation 0): " + names;
  }
  return line_plot_svg(title, panels, columns);
}

std::string perturb_markdown(const std::vector<nlohmann::json>& docs) {
  std::string out;
  for (const nlohmann::json& doc : docs) {
    require_perturb(doc);
    const nlohmann::json& rows = doc["rows"];
    const nlohmann::json& st = doc["settings"];
    const std::string geometry = st.value("geometry", "?");
    // Columns: every (seq, budget) pair, by seq then budget.
    std::vector<std::pair<std::int64_t, std::int64_t>> cols;
    const std::vector<std::int64_t> budgets = budgets_of(rows);
    for (const std::int64_t seq : seqs_of(rows)) {
      for (const std::int64_t b : budgets) cols.emplace_back(seq, b);
    }
    auto table = [&](const nlohmann::json& trows, const std::string& caption, auto cell) {
      out += caption + "\n\n| method |";
      for (const auto& [seq, b] : cols) out += fmt::format(" {} / {} |", seq, b);
      out += "\n| --- |";
      for (std::size_t i = 0; i < cols.size(); ++i) out += " ---: |";
      out += "\n";
      for (const std::string& arg : method_args(trows)) {
        out += "| `" + arg + "` |";
        for (const auto& [seq, b] : cols) {
          const nlohmann::json* hit = nullptr;
          for (const nlohmann::json* r : rows_for(trows, arg, seq)) {
            if (!(*r)["budget"].is_number() || (*r)["budget"].get<std::int64_t>() == b) hit = r;
          }
          out += " " + (hit ? cell(*hit) : std::string("-")) + " |";
        }
        out += "\n";
      }
      out += "\n";
    };
    const std::string setup = fmt::format(
        "geometry `{}`, feed {}, {} KV heads x head_dim {}, {} probes, {} data seeds; columns are "
        "seq / budget",
        geometry, st.value("feed", "?"), st.value("heads", 0), st.value("head_dim", 0),
        st.value("probes", 0), st.value("seeds", 0));
    table(rows, "**Perturbation** (mean ± std over seeds, lower is better), " + setup + ":",
          [](const nlohmann::json& r) {
            return fmt::format("{:.3f} ± {:.3f}", num_or(r, "perturbation_mean", 0.0),
                               num_or(r, "perturbation_std", 0.0));
          });
    // The methods that merge: how many of the rows they evicted they merged.
    nlohmann::json merging = nlohmann::json::array();
    for (const auto& r : rows) {
      if (merges_rows(r)) merging.push_back(r);
    }
    if (!merging.empty()) {
      table(merging,
            "**Merges** per run (rows merged into a survivor / rows evicted, all KV heads, mean "
            "over seeds) of the methods with a merge disposition, geometry `" + geometry + "`:",
            [](const nlohmann::json& r) {
              return fmt::format("{:g} / {:g}", num_or(r, "merges", 0.0),
                                 num_or(r, "evictions", 0.0));
            });
    }
    if (geometry == "shift" || geometry == "stable") {
      table(rows, "**Late-topic fraction** (share of kept rows at positions >= 0.7 seq), geometry `" +
                geometry + "`:",
            [](const nlohmann::json& r) {
              return fmt::format("{:.3f}", num_or(r, "late_topic_fraction", 0.0));
            });
    }
    if (geometry == "planted") {
      table(rows, "**Planted token survival** (share of seed x head runs that keep it), geometry "
            "`planted`:",
            [](const nlohmann::json& r) {
              return fmt::format("{:.3f}", num_or(r, "planted_survival", 0.0));
            });
    }
  }
  return out;
}

}  // namespace vq::eval
