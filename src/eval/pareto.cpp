#include "eval/pareto.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "eval/model_eval.h"
#include "eval/plot.h"
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

}  // namespace

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
    }
    out.push_back(e);
  }
  return out;
}

std::string best_per_ratio_table(const ModelEvalResult& r) {
  const double ref = reference_ppl(r);
  std::string out;
  for (const ParetoCriterion criterion : {ParetoCriterion::kPerplexity, ParetoCriterion::kKl}) {
    const auto best = best_rows_per_ratio(r, criterion);
    out += criterion == ParetoCriterion::kPerplexity
               ? fmt::format(
                     "best configuration per ratio, lowest perplexity (reference "
                     "perplexity {:.4f}):\n",
                     ref)
               : "\nclosest to the reference per ratio, lowest KL:\n";
    out += fmt::format("{:>6} {:<52} {:>6} {:>8} {:>9} {:>8} {:>8}\n", "ratio", "configuration",
                       "budget", "reached", "ppl", "vs full", "KL");
    for (std::size_t k = 0; k < best.size(); ++k) {
      const std::string asked = fmt::format("{:g}x", r.options.ratios[k]);
      if (!best[k]) {
        out += fmt::format("{:>6} {:<52}\n", asked, "(no configuration reached this ratio)");
        continue;
      }
      const ModelEvalRow& row = r.rows[*best[k]];
      out +=
          fmt::format("{:>6} {:<52} {:>6} {:>8.2f} {:>9.4f} {:>7.2f}% {:>8.4f}\n", asked,
                      row.series, row_budget(row), row.compression_ratio, row.summary.ppl,
                      ref > 0 ? 100.0 * (row.summary.ppl / ref - 1.0) : 0.0, row.summary.kl_mean);
    }
  }
  return out;
}

std::string pareto_plot(const ModelEvalResult& r) {
  Panel ppl{"perplexity", "compression ratio reached (full fp16 bytes / kept bytes)",
            "perplexity", true,
            true,         {}};
  Panel kl{"KL(reference || method) per token (log)",
           "compression ratio reached (full fp16 bytes / kept bytes)",
           "nats",
           true,
           true,
           {}};
  double lo = 2, hi = 32;
  for (const double x : r.options.ratios) {
    lo = std::min(lo, x);
    hi = std::max(hi, x);
  }
  // Points per series, sorted by the ratio reached; a row repeated for two asked ratios (the
  // same setting) is drawn once.
  struct Point {
    double x, ppl, kl;
  };
  std::vector<std::pair<std::string, std::vector<Point>>> series;
  double ref = 0;
  for (const ModelEvalRow& row : r.rows) {
    if (row.is_reference) {
      ref = row.summary.ppl;
      continue;
    }
    auto it = std::find_if(series.begin(), series.end(),
                           [&](const auto& s) { return s.first == row.series; });
    if (it == series.end()) {
      series.push_back({row.series, {}});
      it = series.end() - 1;
    }
    const Point p{row.compression_ratio, row.summary.ppl, row.summary.kl_mean};
    const bool dup = std::any_of(it->second.begin(), it->second.end(),
                                 [&](const Point& q) { return q.x == p.x && q.ppl == p.ppl; });
    if (!dup && p.x > 0) it->second.push_back(p);
  }
  auto add = [&](const std::string& label, std::vector<Point> pts, bool highlight) {
    std::stable_sort(pts.begin(), pts.end(),
                     [](const Point& a, const Point& b) { return a.x < b.x; });
    Series sp{label, {}, {}, {}, false, highlight};
    Series sk{label, {}, {}, {}, false, highlight};
    for (const Point& p : pts) {
      sp.x.push_back(p.x);
      sp.y.push_back(p.ppl);
      if (p.kl > 0) {  // no log-axis point for KL = 0
        sk.x.push_back(p.x);
        sk.y.push_back(p.kl);
      }
    }
    ppl.series.push_back(std::move(sp));
    kl.series.push_back(std::move(sk));
  };
  if (ref > 0) ppl.series.push_back({"full (reference)", {lo, hi}, {ref, ref}, {}, true, false});
  for (auto& [label, pts] : series) add(label, pts, false);
  std::vector<Point> best_pts;
  for (const auto& b : best_rows_per_ratio(r)) {
    if (!b) continue;
    const ModelEvalRow& row = r.rows[*b];
    best_pts.push_back({row.compression_ratio, row.summary.ppl, row.summary.kl_mean});
  }
  if (!best_pts.empty()) add("best configuration per ratio", best_pts, true);
  const std::string title = "Quality per byte on " + r.options.model + ", " + r.options.text +
                            " (first " + std::to_string(r.n_tokens) + " tokens)";
  return line_plot_svg(title, {ppl, kl}, 2);
}

}  // namespace vq::eval
