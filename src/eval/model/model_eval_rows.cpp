// Rows of `veloxquant eval` from their window runs, and the windows' statistics.
#include <cmath>

#include "eval/model/model_eval_internal.h"
#include "veloxquant/registry.h"

namespace vq::eval {

std::string short_spec(const CacheConfig& c, bool drop_budget) {
  const MethodInfo& m = c.info();
  const CacheConfig defaults(c.method());
  const std::string budget_field = drop_budget ? m.budget_field : std::string();
  std::string out;
  for (std::size_t i = 0; i < c.fields().size(); ++i) {
    const auto& [name, value] = c.fields()[i];
    if (value == defaults.fields()[i].second || name == budget_field) continue;
    std::string key = name;
    if (!m.prefix.empty() && key.rfind(m.prefix + "_", 0) == 0)
      key = key.substr(m.prefix.size() + 1);
    out += (out.empty() ? ":" : ",") + key + "=" + value_text(value);
  }
  return c.method() + out;
}

engine::ForcedRun scored_part(const engine::ForcedRun& r, std::int64_t from) {
  engine::ForcedRun out;
  const auto f = static_cast<std::ptrdiff_t>(from);
  out.nll.assign(r.nll.begin() + f, r.nll.end());
  if (!r.kl.empty()) out.kl.assign(r.kl.begin() + f, r.kl.end());
  out.top1.assign(r.top1.begin() + f, r.top1.end());
  return out;
}

namespace {

// The summary over several windows: means of the per-window means (the windows score the same
// number of predictions), ppl = exp(mean NLL).
engine::ForcedSummary mean_summary(const std::vector<WindowRun>& w) {
  engine::ForcedSummary s;
  std::vector<double> nll, kl, top1;
  for (const WindowRun& r : w) {
    s.n_predictions += r.summary.n_predictions;
    nll.push_back(r.summary.nll_mean);
    kl.push_back(r.summary.kl_mean);
    top1.push_back(r.summary.top1_agreement);
  }
  s.nll_mean = mean_of(nll);
  s.ppl = std::exp(s.nll_mean);
  s.kl_mean = mean_of(kl);
  s.top1_agreement = mean_of(top1);
  return s;
}

}  // namespace

ModelEvalRow make_row(const CacheConfig& config, const std::string& series, bool is_reference,
                      const std::vector<WindowRun>& windows) {
  ModelEvalRow row;
  row.config = config;
  row.series = series;
  row.is_reference = is_reference;
  row.windows = windows;
  const WindowRun& w0 = windows.front();
  row.summary = windows.size() == 1 ? w0.summary : mean_summary(windows);
  row.nll = w0.nll;
  row.full_bytes = w0.cache.full_bytes;
  row.score_source = w0.cache.score_source;
  row.compression_ratio = w0.cache.compression_ratio;
  row.keeps_all = true;
  std::vector<double> kept_tokens, time, prefill, reconstruction;
  for (const WindowRun& w : windows) {
    kept_tokens.push_back(w.kept_tokens);
    time.push_back(w.time_per_token_ms);
    prefill.push_back(w.prefill_ms);
    reconstruction.push_back(w.reconstruction_ms);
    row.kept_bytes = std::max(row.kept_bytes, w.cache.kept_bytes);
    row.resident_bytes = std::max(row.resident_bytes, w.cache.resident_bytes);
    row.compression_ratio = std::min(row.compression_ratio, w.cache.compression_ratio);
    row.evictions = std::max(row.evictions, w.cache.evictions);
    row.merges = std::max(row.merges, w.cache.merges);
    row.keeps_all = row.keeps_all && w.cache.evictions == 0 && w.cache.merges == 0 &&
                    w.cache.kept_bytes >= w.cache.full_bytes;
  }
  row.kept_tokens = windows.size() == 1 ? w0.kept_tokens : mean_of(kept_tokens);
  row.time_per_token_ms = windows.size() == 1 ? w0.time_per_token_ms : mean_of(time);
  row.prefill_ms = windows.size() == 1 ? w0.prefill_ms : mean_of(prefill);
  row.reconstruction_ms = windows.size() == 1 ? w0.reconstruction_ms : mean_of(reconstruction);
  return row;
}

std::vector<double> window_nll(const ModelEvalRow& row) {
  std::vector<double> out;
  for (const WindowRun& w : row.windows) out.push_back(w.summary.nll_mean);
  return out;
}
std::vector<double> window_kl(const ModelEvalRow& row) {
  std::vector<double> out;
  for (const WindowRun& w : row.windows) out.push_back(w.summary.kl_mean);
  return out;
}
std::vector<double> window_top1(const ModelEvalRow& row) {
  std::vector<double> out;
  for (const WindowRun& w : row.windows) out.push_back(w.summary.top1_agreement);
  return out;
}

double ppl_change_pct(double delta_nll) { return 100.0 * (std::exp(delta_nll) - 1.0); }

PairedBootstrap result_bootstrap(const ModelEvalResult& r) {
  return PairedBootstrap(static_cast<std::int64_t>(r.window_ids.size()),
                         r.options.bootstrap_samples, r.options.bootstrap_seed);
}

void add_window_stats(ModelEvalResult& r) {
  const PairedBootstrap boot = result_bootstrap(r);
  const std::vector<double> ref_nll = window_nll(r.rows.front());
  for (ModelEvalRow& row : r.rows) {
    RowStats s;
    const std::vector<double> nll = window_nll(row);
    s.nll = boot.interval(nll);
    s.ppl = {std::exp(s.nll.lo), std::exp(s.nll.hi)};
    s.kl = boot.interval(window_kl(row));
    s.top1 = boot.interval(window_top1(row));
    std::vector<double> d(nll.size());
    for (std::size_t i = 0; i < d.size(); ++i) d[i] = nll[i] - ref_nll[i];
    s.delta_nll = mean_of(d);
    s.delta_nll_ci = boot.interval(d);
    s.delta_ppl_pct = ppl_change_pct(s.delta_nll);
    s.delta_ppl_pct_ci = {ppl_change_pct(s.delta_nll_ci.lo), ppl_change_pct(s.delta_nll_ci.hi)};
    row.stats = s;
  }
}

}  // namespace vq::eval
