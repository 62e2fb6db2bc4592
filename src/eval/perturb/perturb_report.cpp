// `bench perturb`'s result file and its renderers: the SVG figure and the markdown tables
// (eval/perturb/perturb_bench.h).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "eval/perturb/perturb_bench.h"
#include "eval/report/plot.h"
#include "eval/report/results.h"
#include "veloxquant/errors.h"

namespace vq::eval {

namespace {

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

nlohmann::json perturb_json(const PerturbOptions& options, const std::vector<PerturbRow>& rows,
                            const std::string& command) {
  nlohmann::json doc = results_envelope("perturb", command, perturb_settings_json(options));
  for (const PerturbRow& r : rows) doc["rows"].push_back(row_json(options, r.c, r.measure));
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

// Whether a params key is the shared option `name` or its per-method spelling `<prefix>_name`
// (result files written while every method declared the merge fields under its prefix).
bool is_option(const std::string& key, const std::string& name) {
  return key == name || key.ends_with("_" + name);
}

// Whether a row's method disposes of evicted rows by merging (`merge` other than drop), and
// whether it does so with its gate off.
bool merges_rows(const nlohmann::json& row) {
  if (!row.contains("params") || !row["params"].is_object()) return false;
  for (const auto& [key, value] : row["params"].items()) {
    if (is_option(key, "merge") && value.is_string() && value != "drop") return true;
  }
  return false;
}

bool ungated_merge(const nlohmann::json& row) {
  if (!merges_rows(row)) return false;
  for (const auto& [key, value] : row["params"].items()) {
    if (is_option(key, "merge_gate") && value == false) return true;
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

namespace {

using Columns = std::vector<std::pair<std::int64_t, std::int64_t>>;  // (seq, budget)
using Cell = std::string (*)(const nlohmann::json& row);

// One markdown table: a method per row, a (seq, budget) per column (a budget-less row fills
// every budget's column).
std::string markdown_table(const nlohmann::json& rows, const Columns& cols,
                           const std::string& caption, Cell cell) {
  std::string out = caption + "\n\n| method |";
  for (const auto& [seq, b] : cols) out += fmt::format(" {} / {} |", seq, b);
  out += "\n| --- |";
  for (std::size_t i = 0; i < cols.size(); ++i) out += " ---: |";
  out += "\n";
  for (const std::string& arg : method_args(rows)) {
    out += "| `" + arg + "` |";
    for (const auto& [seq, b] : cols) {
      const nlohmann::json* hit = nullptr;
      for (const nlohmann::json* r : rows_for(rows, arg, seq)) {
        if (!(*r)["budget"].is_number() || (*r)["budget"].get<std::int64_t>() == b) hit = r;
      }
      out += " " + (hit ? cell(*hit) : std::string("-")) + " |";
    }
    out += "\n";
  }
  return out + "\n";
}

std::string perturbation_cell(const nlohmann::json& r) {
  return fmt::format("{:.3f} ± {:.3f}", num_or(r, "perturbation_mean", 0.0),
                     num_or(r, "perturbation_std", 0.0));
}
std::string merges_cell(const nlohmann::json& r) {
  return fmt::format("{:g} / {:g}", num_or(r, "merges", 0.0), num_or(r, "evictions", 0.0));
}
std::string late_cell(const nlohmann::json& r) {
  return fmt::format("{:.3f}", num_or(r, "late_topic_fraction", 0.0));
}
std::string survival_cell(const nlohmann::json& r) {
  return fmt::format("{:.3f}", num_or(r, "planted_survival", 0.0));
}

// The tables of one perturb result document.
std::string document_markdown(const nlohmann::json& doc) {
  require_perturb(doc);
  const nlohmann::json& rows = doc["rows"];
  const nlohmann::json& st = doc["settings"];
  const std::string geometry = st.value("geometry", "?");
  // Columns: every (seq, budget) pair, by seq then budget.
  Columns cols;
  const std::vector<std::int64_t> budgets = budgets_of(rows);
  for (const std::int64_t seq : seqs_of(rows)) {
    for (const std::int64_t b : budgets) cols.emplace_back(seq, b);
  }
  const std::string setup = fmt::format(
      "geometry `{}`, feed {}, {} KV heads x head_dim {}, {} probes, {} data seeds; columns are "
      "seq / budget",
      geometry, st.value("feed", "?"), st.value("heads", 0), st.value("head_dim", 0),
      st.value("probes", 0), st.value("seeds", 0));
  std::string out = markdown_table(
      rows, cols, "**Perturbation** (mean ± std over seeds, lower is better), " + setup + ":",
      perturbation_cell);
  // The methods that merge: how many of the rows they evicted they merged.
  nlohmann::json merging = nlohmann::json::array();
  for (const auto& r : rows) {
    if (merges_rows(r)) merging.push_back(r);
  }
  if (!merging.empty()) {
    out += markdown_table(merging, cols,
                          "**Merges** per run (rows merged into a survivor / rows evicted, all KV "
                          "heads, mean over seeds) of the methods with a merge disposition, "
                          "geometry `" + geometry + "`:",
                          merges_cell);
  }
  if (geometry == "shift" || geometry == "stable") {
    out += markdown_table(rows, cols,
                          "**Late-topic fraction** (share of kept rows at positions >= 0.7 seq), "
                          "geometry `" + geometry + "`:",
                          late_cell);
  }
  if (geometry == "planted") {
    out += markdown_table(rows, cols,
                          "**Planted token survival** (share of seed x head runs that keep it), "
                          "geometry `planted`:",
                          survival_cell);
  }
  return out;
}

}  // namespace

std::string perturb_markdown(const std::vector<nlohmann::json>& docs) {
  std::string out;
  for (const nlohmann::json& doc : docs) out += document_markdown(doc);
  return out;
}

}  // namespace vq::eval
