// Rendering `veloxquant eval` rows: the result file, the terminal table, the per-token file and
// the SVG (the equal-memory views are in pareto.cpp).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "eval/model/model_eval_internal.h"
#include "eval/report/pareto.h"
#include "eval/report/plot.h"
#include "eval/report/results.h"
#include "veloxquant/registry.h"

namespace vq::eval {

namespace {

nlohmann::json interval_json(const Interval& i) { return nlohmann::json::array({i.lo, i.hi}); }

nlohmann::json texts_json(const ModelEvalResult& r) {
  nlohmann::json t = nlohmann::json::array({r.options.text});
  for (const std::string& s : r.options.more_texts) t.push_back(s);
  return t;
}

// Windows mode: where the windows lie and how the intervals are made.
void add_window_settings(const ModelEvalResult& r, nlohmann::json& s) {
  s["texts"] = texts_json(r);
  s["windows"] = r.options.windows;
  s["windows_total"] = r.window_ids.size();
  s["window_stride"] = r.windows.size() > 1 ? r.windows[1].start - r.windows[0].start : 0;
  nlohmann::json list = nlohmann::json::array();
  for (const WindowInfo& w : r.windows)
    list.push_back({{"text", w.text}, {"index", w.index}, {"start_token", w.start}});
  s["window_list"] = list;
  s["bootstrap"] = {
      {"samples", r.options.bootstrap_samples},
      {"seed", r.options.bootstrap_seed},
      {"level", PairedBootstrap::kLevel},
      {"method",
       "paired percentile bootstrap over windows (the same resampled windows for every row); "
       "NumPy 'linear' quantiles; indices from CounterRng(seed, 0, 0): index j of resample b = "
       "floor(uniform(b * N + j) * N) (eval/report/bootstrap.h, docs/quality.md)"}};
  if (!r.options.select_from.empty()) {
    s["select_from"] = r.options.select_from;
    s["selected_on_text"] = r.selected_text;
  }
}

nlohmann::json settings_json(const ModelEvalResult& r) {
  nlohmann::json settings = {
      {"model", r.options.model},
      {"model_format", r.model_format},
      {"model_config", r.model_config},
      {"tokenizer", r.tokenizer_path},
      {"text", r.options.text},
      {"tokens", r.n_tokens},
      {"prefill", r.options.prefill},
      {"n_predictions", r.n_tokens - 1},
      {"scored_from", r.scored_from},
      {"n_scored", r.n_tokens - 1 - r.scored_from},
      {"budgets",
       r.options.ratios.empty() ? nlohmann::json(r.options.budgets) : nlohmann::json(nullptr)},
      {"ratios",
       r.options.ratios.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.options.ratios)},
      {"rows_at_end", r.n_tokens - 1},
      {"methods", r.options.methods.empty() ? method_ids() : r.options.methods},
      {"reference", r.options.reference},
      {"teacher_forced", true},
  };
  if (r.windowed()) add_window_settings(r, settings);
  return settings;
}

// Windows mode: per-window values, means' intervals and the paired difference to the reference.
void add_window_fields(const ModelEvalRow& row, nlohmann::json& x) {
  nlohmann::json list = nlohmann::json::array();
  for (const WindowRun& w : row.windows) {
    list.push_back({{"nll_mean", w.summary.nll_mean},
                    {"ppl", w.summary.ppl},
                    {"kl_mean", w.summary.kl_mean},
                    {"top1_agreement", w.summary.top1_agreement},
                    {"kept_bytes", w.cache.kept_bytes},
                    {"compression_ratio", w.cache.compression_ratio},
                    {"time_per_token_ms", w.time_per_token_ms}});
  }
  x["windows"] = list;
  const RowStats& s = *row.stats;
  x["ci"] = {{"nll_mean", interval_json(s.nll)},
             {"ppl", interval_json(s.ppl)},
             {"kl_mean", interval_json(s.kl)},
             {"top1_agreement", interval_json(s.top1)}};
  x["delta_nll"] = s.delta_nll;
  x["delta_nll_ci"] = interval_json(s.delta_nll_ci);
  x["ppl_change_pct"] = s.delta_ppl_pct;
  x["ppl_change_pct_ci"] = interval_json(s.delta_ppl_pct_ci);
}

nlohmann::json row_json(const ModelEvalResult& r, const ModelEvalRow& row) {
  nlohmann::json x = method_json(row.config);
  x["reference"] = row.is_reference;
  x["nll_mean"] = row.summary.nll_mean;
  x["ppl"] = row.summary.ppl;
  x["kl_mean"] = row.summary.kl_mean;
  x["top1_agreement"] = row.summary.top1_agreement;
  x["kept_tokens"] = row.kept_tokens;
  x["kept_bytes"] = row.kept_bytes;
  x["resident_bytes"] = row.resident_bytes;
  x["full_bytes"] = row.full_bytes;
  x["compression_ratio"] = row.compression_ratio;
  x["evictions"] = row.evictions;
  x["merges"] = row.merges;
  x["keeps_all"] = row.keeps_all;
  x["score_source"] = row.score_source;
  x["n_predictions"] = row.summary.n_predictions;
  x["text"] = r.options.more_texts.empty() ? nlohmann::json(r.options.text) : texts_json(r);
  x["tokens"] = r.n_tokens;
  x["prefill"] = r.options.prefill;
  x["time_per_token_ms"] = row.time_per_token_ms;
  if (row.reconstruction_ms > 0) {  // kvzip's reconstruction pass against the prefill
    x["prefill_ms"] = row.prefill_ms;
    x["reconstruction_ms"] = row.reconstruction_ms;
  }
  if (!r.options.ratios.empty() && !row.is_reference) {
    x["target_ratio"] = row.target_ratio;
    x["ratio_reached"] = row.compression_ratio;
    x["ratio_met"] = row.ratio_met;
    x["ratio_note"] = row.ratio_note;
    x["solver_runs"] = row.solver_runs;
  }
  if (row.stats) add_window_fields(row, x);
  return x;
}

nlohmann::json skipped_json(const ModelEvalResult& r) {
  nlohmann::json skipped = nlohmann::json::array();
  for (const ModelEvalSkip& s : r.skipped) {
    nlohmann::json e = {{"method", s.method}, {"budget", s.budget}, {"reason", s.reason}};
    if (s.ratio > 0) {
      e["budget"] = nullptr;
      e["ratio"] = s.ratio;
    }
    skipped.push_back(e);
  }
  return skipped;
}

std::string kl_text(double kl) {
  // KL below the table's precision but not zero is shown in scientific notation.
  return kl > 0 && kl < 5e-5 ? fmt::format("{:8.1e}", kl) : fmt::format("{:8.4f}", kl);
}

std::string row_budget(const ModelEvalRow& row) {
  return has_token_budget(row.config) ? std::to_string(token_budget(row.config)) : "-";
}

std::string table_heading(const ModelEvalResult& r) {
  const std::int64_t n_scored = r.n_tokens - 1 - r.scored_from;
  std::string where = fmt::format("{}", r.options.text);
  for (const std::string& t : r.options.more_texts) where += ", " + t;
  if (r.windowed()) {
    where += fmt::format(": {} windows of {} tokens ({} per text)", r.window_ids.size(),
                         r.n_tokens, r.options.windows);
  }
  if (r.scored_from > 0) {
    return fmt::format("{} ({}), {}: {} {} tokens, the first {} as one prefill, then {} decoded "
                       "predictions (scored)\n\n",
                       r.options.model, r.model_format, where, r.windowed() ? "each" : "first",
                       r.n_tokens, r.options.prefill, n_scored);
  }
  return fmt::format("{} ({}), {}: {} {} tokens, {} predictions, one token per step\n\n",
                     r.options.model, r.model_format, where, r.windowed() ? "each" : "first",
                     r.n_tokens, n_scored);
}

// The quality columns: point values, or (windows mode) means with their 95% intervals.
std::string quality_header(bool windowed) {
  if (!windowed) return fmt::format("{:>9} {:>7} {:>8} {:>6}", "ppl", "nll", "KL", "top1");
  return fmt::format("{:>9} {:>19} {:>8} {:>19} {:>8} {:>6}", "ppl", "ppl 95% CI", "vs full",
                     "vs full 95% CI", "KL", "top1");
}

std::string quality_cells(const ModelEvalRow& row) {
  if (!row.stats) {
    return fmt::format("{:>9.4f} {:>7.4f} {} {:>6.3f}", row.summary.ppl, row.summary.nll_mean,
                       kl_text(row.summary.kl_mean), row.summary.top1_agreement);
  }
  const RowStats& s = *row.stats;
  return fmt::format("{:>9.4f} {:>19} {:>7.2f}% {:>19} {} {:>6.3f}", row.summary.ppl,
                     fmt::format("[{:.4f}, {:.4f}]", s.ppl.lo, s.ppl.hi), s.delta_ppl_pct,
                     fmt::format("[{:+.2f}, {:+.2f}]%", s.delta_ppl_pct_ci.lo,
                                 s.delta_ppl_pct_ci.hi),
                     kl_text(row.summary.kl_mean), row.summary.top1_agreement);
}

std::string table_legend(const ModelEvalResult& r, bool any_keeps_all) {
  const std::int64_t n_scored = r.n_tokens - 1 - r.scored_from;
  std::string out = fmt::format(
      "\nppl = exp(mean NLL) over the {} scored predictions{}; KL = mean KL(reference || method) "
      "per token in nats; top1 = share of positions whose argmax matches the reference; "
      "kept/head = mean rows per KV head per layer after each step; kept bytes (payload) / "
      "resident (every byte the cache keeps) / ratio (full_bytes / kept_bytes) at the end of the "
      "text{}.{}\n",
      n_scored, r.windowed() ? " of each window, averaged over windows" : "",
      r.windowed() ? " (the largest bytes, smallest ratio over windows)" : "",
      any_keeps_all ? " keeps all = nothing evicted, merged or quantized in this scenario "
                      "(no compression)."
                    : "");
  if (r.windowed()) {
    out += fmt::format(
        "95% CI = percentile interval of a paired bootstrap over the {} windows ({} resamples, "
        "seed {}); vs full = the perplexity's change against the reference, 100 (exp(mean "
        "paired NLL difference) - 1).\n",
        r.window_ids.size(), r.options.bootstrap_samples, r.options.bootstrap_seed);
  }
  return out;
}

}  // namespace

nlohmann::json model_eval_json(const ModelEvalResult& r, const std::string& command) {
  nlohmann::json j = results_envelope("eval", command, settings_json(r));
  for (const ModelEvalRow& row : r.rows) j["rows"].push_back(row_json(r, row));
  j["skipped"] = skipped_json(r);
  if (!r.options.ratios.empty()) {
    j["best_per_ratio"] = best_per_ratio_json(r, ParetoCriterion::kPerplexity);
    j["closest_per_ratio"] = best_per_ratio_json(r, ParetoCriterion::kKl);
    if (!r.selected.empty()) j["selected_per_ratio"] = selected_per_ratio_json(r);
  }
  return j;
}

std::string model_eval_table(const ModelEvalResult& r) {
  std::string out = table_heading(r);
  const bool by_ratio = !r.options.ratios.empty();
  out += fmt::format("{:<40} {}{:>6} {} {:>9} {:>10} {:>10} {:>9} {:>8}\n", "method",
                     by_ratio ? "target " : "", "budget", quality_header(r.windowed()),
                     "kept/head", "kept bytes", "resident", "ratio", "ms/tok");
  std::string notes;
  bool any_keeps_all = false;
  for (const ModelEvalRow& row : r.rows) {
    // A run that held every row did not compress: say so instead of a ratio of 1 (or below).
    std::string ratio = row.keeps_all ? "keeps all" : fmt::format("{:.2f}", row.compression_ratio);
    std::string target;
    if (by_ratio) {
      target = row.is_reference ? fmt::format("{:>6} ", "-")
                                : fmt::format("{:>5}x ", fmt::format("{:g}", row.target_ratio));
      if (!row.is_reference && !row.ratio_met) {
        ratio += "*";
        notes += fmt::format("* {} at {:g}x: {}\n", row.series, row.target_ratio, row.ratio_note);
      }
    }
    any_keeps_all = any_keeps_all || row.keeps_all;
    out += fmt::format("{:<40} {}{:>6} {} {:>9.1f} {:>10} {:>10} {:>9} {:>8.4f}\n",
                       row.series + (row.is_reference ? " (reference)" : ""), target,
                       row_budget(row), quality_cells(row), row.kept_tokens, row.kept_bytes,
                       row.resident_bytes, ratio, row.time_per_token_ms);
    if (row.reconstruction_ms > 0) {
      notes += fmt::format("{}: reconstruction pass {:.2f} ms against the prefill's {:.2f} ms "
                           "(in ms/tok)\n",
                           row.series, row.reconstruction_ms, row.prefill_ms);
    }
  }
  out += notes;
  for (const ModelEvalSkip& s : r.skipped) {
    if (s.ratio > 0) {
      out += fmt::format("skipped {} at ratio {:g}: {}\n", s.method, s.ratio, s.reason);
    } else {
      out += fmt::format("skipped {} at budget {}: {}\n", s.method, s.budget, s.reason);
    }
  }
  out += table_legend(r, any_keeps_all);
  if (by_ratio) {
    out += fmt::format(
        "target = the compression ratio asked for (--ratio), reached when full_bytes / kept_bytes "
        "at the end of the text (after the last of the {} rows read) is at least it; * = not "
        "reached (see the note).\n\n",
        r.n_tokens - 1);
    out += best_per_ratio_table(r);
  }
  return out;
}

std::string model_eval_per_token(const ModelEvalResult& r) {
  const bool windowed = r.windowed();
  std::string out = std::string(windowed ? "window\t" : "") +
                    "run\tmethod\tbudget\tposition\ttoken\tnext_token\tscored\tnll\n";
  for (std::size_t i = 0; i < r.rows.size(); ++i) {
    const ModelEvalRow& row = r.rows[i];
    const std::string spec = row.config.spec();
    const std::string budget = row_budget(row);
    for (std::size_t w = 0; w < row.windows.size(); ++w) {
      const std::vector<std::int32_t>& ids = r.window_ids[w];
      const std::vector<double>& nll = row.windows[w].nll;
      const std::string lead = windowed ? fmt::format("{}\t", w) : "";
      for (std::size_t p = 0; p < nll.size(); ++p) {
        // %.17g: the double round-trips exactly.
        out += fmt::format("{}{}\t{}\t{}\t{}\t{}\t{}\t{}\t{:.17g}\n", lead, i, spec, budget, p,
                           ids[p], ids[p + 1],
                           static_cast<std::int64_t>(p) >= r.scored_from ? 1 : 0, nll[p]);
      }
    }
  }
  return out;
}

std::string model_eval_plot(const ModelEvalResult& r) {
  if (!r.options.ratios.empty()) return pareto_plot(r);
  Panel ppl{"perplexity", "budget (rows per KV head)", "perplexity", true, true, {}};
  Panel kl{"KL(reference || method) per token (log)",
           "budget (rows per KV head)",
           "nats",
           true,
           true,
           {}};
  const double lo =
      static_cast<double>(*std::min_element(r.options.budgets.begin(), r.options.budgets.end()));
  const double hi =
      static_cast<double>(*std::max_element(r.options.budgets.begin(), r.options.budgets.end()));
  // One series per method, in table order; methods without a budget (the reference) are
  // dashed horizontal lines. Windows mode: bars from the 95% intervals.
  auto series_in = [](Panel& p, const std::string& label, bool dashed) -> Series& {
    for (Series& s : p.series) {
      if (s.label == label) return s;
    }
    p.series.push_back({label, {}, {}, {}, dashed});
    return p.series.back();
  };
  for (const ModelEvalRow& row : r.rows) {
    const bool flat = row.is_reference || !has_token_budget(row.config);
    const std::string label = row.series + (row.is_reference ? " (reference)" : "");
    const std::vector<double> xs =
        flat ? std::vector<double>{lo, hi}
             : std::vector<double>{static_cast<double>(token_budget(row.config))};
    Series& sp = series_in(ppl, label, flat);
    for (const double x : xs) {
      sp.x.push_back(x);
      sp.y.push_back(row.summary.ppl);
      if (row.stats) sp.y_lo_hi.push_back({row.stats->ppl.lo, row.stats->ppl.hi});
    }
    if (row.summary.kl_mean > 0) {  // KL = 0 (the reference, nothing evicted) has no log-axis point
      Series& sk = series_in(kl, label, flat);
      for (const double x : xs) {
        sk.x.push_back(x);
        sk.y.push_back(row.summary.kl_mean);
        if (row.stats) sk.y_lo_hi.push_back({row.stats->kl.lo, row.stats->kl.hi});
      }
    }
  }
  const std::string title =
      "KV-cache methods on " + r.options.model + ", " + r.options.text +
      (r.windowed() ? fmt::format(" ({} windows of {} tokens; bars: 95% bootstrap intervals)",
                                  r.window_ids.size(), r.n_tokens)
                    : " (first " + std::to_string(r.n_tokens) + " tokens)");
  return line_plot_svg(title, {ppl, kl}, 2);
}

}  // namespace vq::eval
