#include "eval/report/pareto.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "eval/model/model_eval_internal.h"
#include "eval/report/plot.h"
#include "veloxquant/registry.h"

namespace vq::eval {

std::vector<std::optional<std::size_t>> best_per_ratio(
    const std::vector<ParetoCandidate>& candidates, const std::vector<double>& ratios,
    ParetoCriterion criterion) {
  auto better = [criterion](const ParetoCandidate& c, const ParetoCandidate& b) {
    if (criterion == ParetoCriterion::kKl) return c.kl < b.kl || (c.kl == b.kl && c.ppl < b.ppl);
    return c.ppl < b.ppl || (c.ppl == b.ppl && c.kl < b.kl);
  };
  std::vector<std::optional<std::size_t>> out;
  for (const double r : ratios) {
    std::optional<std::size_t> best;
    for (std::size_t i = 0; i < candidates.size(); ++i) {
      const ParetoCandidate& c = candidates[i];
      if (!(c.ratio >= r)) continue;
      if (!best) {
        best = i;
        continue;
      }
      if (better(c, candidates[*best])) best = i;
    }
    out.push_back(best);
  }
  return out;
}

std::vector<std::optional<std::size_t>> best_rows_per_ratio(const ModelEvalResult& r,
                                                            ParetoCriterion criterion) {
  std::vector<ParetoCandidate> cands;
  std::vector<std::size_t> index;  // candidate -> row
  for (std::size_t i = 0; i < r.rows.size(); ++i) {
    const ModelEvalRow& row = r.rows[i];
    if (row.is_reference) continue;
    cands.push_back({row.compression_ratio, row.summary.ppl, row.summary.kl_mean});
    index.push_back(i);
  }
  std::vector<std::optional<std::size_t>> out = best_per_ratio(cands, r.options.ratios, criterion);
  for (auto& o : out) {
    if (o) o = index[*o];
  }
  return out;
}

namespace {

double reference_ppl(const ModelEvalResult& r) {
  for (const ModelEvalRow& row : r.rows) {
    if (row.is_reference) return row.summary.ppl;
  }
  return 0;
}

std::string row_budget(const ModelEvalRow& row) {
  return has_token_budget(row.config) ? std::to_string(token_budget(row.config)) : "-";
}

nlohmann::json interval_json(const Interval& i) { return nlohmann::json::array({i.lo, i.hi}); }

// The row measuring `series` at target ratio `ratio` (equal-memory rows), if any.
std::optional<std::size_t> row_of(const ModelEvalResult& r, const std::string& series,
                                  double ratio) {
  for (std::size_t i = 0; i < r.rows.size(); ++i) {
    const ModelEvalRow& row = r.rows[i];
    if (!row.is_reference && row.series == series && row.target_ratio == ratio) return i;
  }
  return std::nullopt;
}

// Windows mode: the best row's intervals and the rows indistinguishable from it.
void add_best_window_fields(const ModelEvalResult& r, std::size_t best, double ratio,
                            nlohmann::json& e) {
  const RowStats& s = *r.rows[best].stats;
  e["ppl_ci"] = interval_json(s.ppl);
  e["ppl_change_pct_ci"] = interval_json(s.delta_ppl_pct_ci);
  const PairedBootstrap boot = result_bootstrap(r);
  const std::vector<double> b = window_nll(r.rows[best]);
  nlohmann::json same = nlohmann::json::array();
  for (const std::size_t i : indistinguishable_rows(r, best, ratio)) {
    const Interval d = boot.paired_difference(window_nll(r.rows[i]), b);
    same.push_back({{"row", i},
                    {"method", r.rows[i].config.spec()},
                    {"series", r.rows[i].series},
                    {"ppl_change_pct", r.rows[i].stats->delta_ppl_pct},
                    {"vs_best_pct_ci", interval_json({ppl_change_pct(d.lo), ppl_change_pct(d.hi)})}});
  }
  e["indistinguishable"] = same;
}

}  // namespace

std::vector<std::size_t> indistinguishable_rows(const ModelEvalResult& r, std::size_t best,
                                               double ratio) {
  const PairedBootstrap boot = result_bootstrap(r);
  const std::vector<double> b = window_nll(r.rows[best]);
  std::vector<std::size_t> out;
  std::vector<std::string> seen = {r.rows[best].config.spec(true)};
  for (std::size_t i = 0; i < r.rows.size(); ++i) {
    const ModelEvalRow& row = r.rows[i];
    if (row.is_reference || !(row.compression_ratio >= ratio)) continue;
    const std::string spec = row.config.spec(true);
    if (std::find(seen.begin(), seen.end(), spec) != seen.end()) continue;
    seen.push_back(spec);
    if (boot.paired_difference(window_nll(row), b).contains(0.0)) out.push_back(i);
  }
  return out;
}

nlohmann::json best_per_ratio_json(const ModelEvalResult& r, ParetoCriterion criterion) {
  const double ref = reference_ppl(r);
  const auto best = best_rows_per_ratio(r, criterion);
  nlohmann::json out = nlohmann::json::array();
  for (std::size_t k = 0; k < best.size(); ++k) {
    nlohmann::json e = {{"ratio", r.options.ratios[k]}};
    if (!best[k]) {
      for (const char* key : {"row", "method", "series", "budget", "ratio_reached", "ppl",
                              "kl_mean", "ppl_change_pct"})
        e[key] = nullptr;
    } else {
      const ModelEvalRow& row = r.rows[*best[k]];
      e["row"] = *best[k];
      e["method"] = row.config.spec();
      e["series"] = row.series;
      e["budget"] = has_token_budget(row.config) ? nlohmann::json(token_budget(row.config))
                                                 : nlohmann::json(nullptr);
      e["ratio_reached"] = row.compression_ratio;
      e["ppl"] = row.summary.ppl;
      e["kl_mean"] = row.summary.kl_mean;
      e["ppl_change_pct"] = ref > 0 ? 100.0 * (row.summary.ppl / ref - 1.0) : 0.0;
      if (row.stats && criterion == ParetoCriterion::kPerplexity)
        add_best_window_fields(r, *best[k], r.options.ratios[k], e);
    }
    out.push_back(e);
  }
  return out;
}

nlohmann::json selected_per_ratio_json(const ModelEvalResult& r) {
  nlohmann::json out = nlohmann::json::array();
  for (const SelectedConfig& sel : r.selected) {
    nlohmann::json e = {{"ratio", sel.ratio},
                        {"series", sel.series.empty() ? nlohmann::json() : nlohmann::json(sel.series)},
                        {"chosen_on", r.selected_text}};
    const auto i = sel.series.empty() ? std::nullopt : row_of(r, sel.series, sel.ratio);
    if (!i || !r.rows[*i].stats) {
      e["row"] = nullptr;  // not chosen, or not run at this ratio here
      out.push_back(e);
      continue;
    }
    const ModelEvalRow& row = r.rows[*i];
    const RowStats& s = *row.stats;
    e["row"] = *i;
    e["method"] = row.config.spec();
    e["ratio_reached"] = row.compression_ratio;
    e["ratio_met"] = row.ratio_met;
    e["ppl"] = row.summary.ppl;
    e["ppl_ci"] = interval_json(s.ppl);
    e["ppl_change_pct"] = s.delta_ppl_pct;
    e["ppl_change_pct_ci"] = interval_json(s.delta_ppl_pct_ci);
    out.push_back(e);
  }
  return out;
}

namespace {

std::string best_table(const ModelEvalResult& r, ParetoCriterion criterion) {
  const double ref = reference_ppl(r);
  const bool windowed = r.windowed() && criterion == ParetoCriterion::kPerplexity;
  const auto best = best_rows_per_ratio(r, criterion);
  std::string out = criterion == ParetoCriterion::kPerplexity
                        ? fmt::format("best configuration per ratio, lowest perplexity (reference "
                                      "perplexity {:.4f}):\n",
                                      ref)
                        : "\nclosest to the reference per ratio, lowest KL:\n";
  out += fmt::format("{:>6} {:<52} {:>6} {:>8} {:>9} {:>8} {:>8}{}\n", "ratio", "configuration",
                     "budget", "reached", "ppl", "vs full", "KL",
                     windowed ? fmt::format(" {:>19} {:>7}", "vs full 95% CI", "~best") : "");
  for (std::size_t k = 0; k < best.size(); ++k) {
    const std::string asked = fmt::format("{:g}x", r.options.ratios[k]);
    if (!best[k]) {
      out += fmt::format("{:>6} {:<52}\n", asked, "(no configuration reached this ratio)");
      continue;
    }
    const ModelEvalRow& row = r.rows[*best[k]];
    std::string extra;
    if (windowed) {
      const Interval& ci = row.stats->delta_ppl_pct_ci;
      extra = fmt::format(" {:>19} {:>7}", fmt::format("[{:+.2f}, {:+.2f}]%", ci.lo, ci.hi),
                          indistinguishable_rows(r, *best[k], r.options.ratios[k]).size());
    }
    out += fmt::format("{:>6} {:<52} {:>6} {:>8.2f} {:>9.4f} {:>7.2f}% {:>8.4f}{}\n", asked,
                       row.series, row_budget(row), row.compression_ratio, row.summary.ppl,
                       ref > 0 ? 100.0 * (row.summary.ppl / ref - 1.0) : 0.0, row.summary.kl_mean,
                       extra);
  }
  if (windowed) {
    out += "~best = other configurations reaching the ratio whose paired difference to the best "
           "has a 95% interval containing 0 (statistically indistinguishable)\n";
  }
  return out;
}

std::string selected_table(const ModelEvalResult& r) {
  std::string out = fmt::format(
      "\nchosen on {} (--select-from), measured here:\n{:>6} {:<52} {:>9} {:>8} {:>19}\n",
      r.selected_text, "ratio", "configuration", "ppl", "vs full", "vs full 95% CI");
  for (const SelectedConfig& sel : r.selected) {
    const auto i = sel.series.empty() ? std::nullopt : row_of(r, sel.series, sel.ratio);
    const std::string asked = fmt::format("{:g}x", sel.ratio);
    if (!i || !r.rows[*i].stats) {
      out += fmt::format("{:>6} {:<52}\n", asked,
                         sel.series.empty() ? "(none chosen)" : sel.series + " (not run here)");
      continue;
    }
    const RowStats& s = *r.rows[*i].stats;
    out += fmt::format("{:>6} {:<52} {:>9.4f} {:>7.2f}% {:>19}\n", asked, sel.series,
                       r.rows[*i].summary.ppl, s.delta_ppl_pct,
                       fmt::format("[{:+.2f}, {:+.2f}]%", s.delta_ppl_pct_ci.lo,
                                   s.delta_ppl_pct_ci.hi));
  }
  return out;
}

}  // namespace

std::string best_per_ratio_table(const ModelEvalResult& r) {
  std::string out = best_table(r, ParetoCriterion::kPerplexity) + best_table(r, ParetoCriterion::kKl);
  if (!r.selected.empty()) out += selected_table(r);
  return out;
}
namespace {

// A point of the Pareto plot: the ratio reached, perplexity and KL with their 95% intervals in
// windows mode (lo = hi = the value otherwise: no bar).
struct Point {
  double x, ppl, kl;
  Interval ppl_ci, kl_ci;
};

Point point_of(const ModelEvalRow& row) {
  Point p{row.compression_ratio, row.summary.ppl, row.summary.kl_mean, {}, {}};
  p.ppl_ci = row.stats ? row.stats->ppl : Interval{p.ppl, p.ppl};
  p.kl_ci = row.stats ? row.stats->kl : Interval{p.kl, p.kl};
  return p;
}

// Points per series, sorted by the ratio reached; a row repeated for two asked ratios (the same
// setting) is drawn once.
std::vector<std::pair<std::string, std::vector<Point>>> pareto_series(const ModelEvalResult& r) {
  std::vector<std::pair<std::string, std::vector<Point>>> series;
  for (const ModelEvalRow& row : r.rows) {
    if (row.is_reference) continue;
    auto it = std::find_if(series.begin(), series.end(),
                           [&](const auto& s) { return s.first == row.series; });
    if (it == series.end()) {
      series.push_back({row.series, {}});
      it = series.end() - 1;
    }
    const Point p = point_of(row);
    const bool dup = std::any_of(it->second.begin(), it->second.end(),
                                 [&](const Point& q) { return q.x == p.x && q.ppl == p.ppl; });
    if (!dup && p.x > 0) it->second.push_back(p);
  }
  return series;
}

void add_series(Panel& ppl, Panel& kl, const std::string& label, std::vector<Point> pts,
                bool highlight, bool bars) {
  std::stable_sort(pts.begin(), pts.end(), [](const Point& a, const Point& b) { return a.x < b.x; });
  Series sp{label, {}, {}, {}, false, highlight, {}};
  Series sk{label, {}, {}, {}, false, highlight, {}};
  for (const Point& p : pts) {
    sp.x.push_back(p.x);
    sp.y.push_back(p.ppl);
    if (bars) sp.y_lo_hi.push_back({p.ppl_ci.lo, p.ppl_ci.hi});
    if (p.kl > 0) {  // no log-axis point for KL = 0
      sk.x.push_back(p.x);
      sk.y.push_back(p.kl);
      if (bars) sk.y_lo_hi.push_back({p.kl_ci.lo, p.kl_ci.hi});
    }
  }
  ppl.series.push_back(std::move(sp));
  kl.series.push_back(std::move(sk));
}

}  // namespace

std::string pareto_plot(const ModelEvalResult& r) {
  const std::string x_label = "compression ratio reached (full fp16 bytes / kept bytes)";
  Panel ppl{"perplexity", x_label, "perplexity", true, true, {}};
  Panel kl{"KL(reference || method) per token (log)", x_label, "nats", true, true, {}};
  double lo = 2, hi = 32;
  for (const double x : r.options.ratios) {
    lo = std::min(lo, x);
    hi = std::max(hi, x);
  }
  const double ref = reference_ppl(r);
  if (ref > 0) ppl.series.push_back({"full (reference)", {lo, hi}, {ref, ref}, {}, true, false, {}});
  const bool bars = r.windowed();
  for (auto& [label, pts] : pareto_series(r)) add_series(ppl, kl, label, pts, false, bars);
  std::vector<Point> best_pts;
  for (const auto& b : best_rows_per_ratio(r)) {
    if (b) best_pts.push_back(point_of(r.rows[*b]));
  }
  if (!best_pts.empty()) add_series(ppl, kl, "best configuration per ratio", best_pts, true, bars);
  const std::string title =
      "Quality per byte on " + r.options.model + ", " + r.options.text +
      (bars ? fmt::format(" ({} windows of {} tokens; bars: 95% bootstrap intervals)",
                          r.window_ids.size(), r.n_tokens)
            : " (first " + std::to_string(r.n_tokens) + " tokens)");
  return line_plot_svg(title, {ppl, kl}, 2);
}

}  // namespace vq::eval
