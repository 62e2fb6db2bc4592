#include "eval/model_eval.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "engine/formats/mapped_file.h"
#include "engine/model/model.h"
#include "engine/tokenizers/tokenizer.h"
#include "eval/pareto.h"
#include "eval/plot.h"
#include "eval/ratio_solver.h"
#include "eval/results.h"
#include "veloxquant/errors.h"
#include "veloxquant/registry.h"

namespace vq::eval {

namespace {

[[noreturn]] void bad(const std::string& msg) {
  throw Error(ErrorCode::kInvalidArgument, "[eval] " + msg);
}

struct Planned {
  CacheConfig config;
  std::string series;
  bool is_reference;
};

// A method's non-default fields without the method prefix ("h2o:grace=0,decay=1"), for
// table rows and plot legends; the budget field is left out (it has its own column/axis).
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

// Runs the equal-memory solver may make for one method x ratio: its prediction, then checks
// that each correct the prediction by the bytes measured.
constexpr int kMaxSolverRuns = 8;

// The part of a run the summaries count: predictions [from, P) (see scored_from).
engine::ForcedRun scored_part(const engine::ForcedRun& r, std::int64_t from) {
  engine::ForcedRun out;
  const auto f = static_cast<std::ptrdiff_t>(from);
  out.nll.assign(r.nll.begin() + f, r.nll.end());
  if (!r.kl.empty()) out.kl.assign(r.kl.begin() + f, r.kl.end());
  out.top1.assign(r.top1.begin() + f, r.top1.end());
  return out;
}

}  // namespace

ModelEvalResult run_model_eval(const ModelEvalOptions& o, std::ostream* progress) {
  ModelEvalResult res;
  res.options = o;
  if (o.tokens < 2) bad("--tokens must be >= 2 (one prediction), got " + std::to_string(o.tokens));
  if (o.prefill < 0 || o.prefill > o.tokens - 2) {
    bad("--prefill must be in [0, " + std::to_string(o.tokens - 2) +
        "] (--tokens - 2: at least one prediction is decoded after the prefill), got " +
        std::to_string(o.prefill));
  }
  if (o.budgets.empty() && o.ratios.empty()) bad("--budget needs at least one value");

  // Plan every run before loading anything, so bad specs fail fast.
  std::vector<Planned> plan;
  const CacheConfig reference = CacheConfig::parse(o.reference);
  plan.push_back({reference, short_spec(reference, false), true});
  std::vector<CacheConfig> methods;
  if (o.methods.empty()) {
    for (const auto& id : method_ids()) methods.emplace_back(id);
  }
  for (const auto& s : o.methods) methods.push_back(CacheConfig::parse(s));
  for (const double r : o.ratios) {
    if (!std::isfinite(r) || r < 1.0)
      bad(fmt::format("--ratio values must be finite numbers >= 1, got {}", r));
  }
  for (const CacheConfig& m : methods) {
    if (!o.ratios.empty()) break;  // equal-memory mode solves its settings after loading
    std::vector<CacheConfig> cells;
    if (has_token_budget(m)) {
      for (const std::int64_t b : o.budgets) {
        try {
          cells.push_back(with_token_budget(m, b));
        } catch (const Error& e) {
          if (e.code() != ErrorCode::kInvalidConfig) throw;
          res.skipped.push_back({m.spec(), b, e.what()});
        }
      }
    } else {
      cells.push_back(m);
    }
    for (CacheConfig& c : cells) {
      const bool dup =
          std::any_of(plan.begin(), plan.end(), [&](const Planned& p) { return p.config == c; });
      if (!dup) plan.push_back({std::move(c), short_spec(m, true), false});
    }
  }

  // Model, tokenizer, text.
  const engine::Model model = engine::Model::load(o.model);
  const auto tokenizer = engine::load_tokenizer(o.tokenizer, model);
  const engine::ModelConfig& mc = model.config();
  res.model_format = mc.format;
  res.tokenizer_path = tokenizer->path();
  res.model_config = {{"dim", mc.dim},
                      {"hidden_dim", mc.hidden_dim},
                      {"n_layers", mc.n_layers},
                      {"n_heads", mc.n_heads},
                      {"n_kv_heads", mc.n_kv_heads},
                      {"head_dim", mc.head_dim},
                      {"vocab_size", mc.vocab_size},
                      {"seq_len", mc.seq_len},
                      {"rope", engine::to_string(mc.rope)},
                      {"weights_dtype", mc.weights_dtype},
                      {"n_params", mc.n_params()}};
  if (o.tokens > mc.seq_len) {
    bad("--tokens " + std::to_string(o.tokens) + " exceeds the model's context (seq_len " +
        std::to_string(mc.seq_len) + ")");
  }
  const std::string text = engine::read_text_file(o.text);
  std::vector<std::int32_t> ids = engine::encode_first(*tokenizer, text, o.tokens);
  if (static_cast<std::int64_t>(ids.size()) < o.tokens) {
    throw Error(ErrorCode::kFileError,
                "'" + o.text + "': encodes to only " + std::to_string(ids.size()) +
                    " tokens, fewer than --tokens " + std::to_string(o.tokens),
                o.text);
  }
  res.n_tokens = o.tokens;
  res.ids = ids;
  res.scored_from = o.prefill >= 2 ? o.prefill : 0;
  if (o.before_run) o.before_run(mc);

  // The reference run keeps its logits; every other run is compared with it. The summaries
  // count the decoded predictions only (scored_from on).
  engine::ForcedRun ref, ref_scored;
  std::size_t n_done = 0;
  auto run_one = [&](const CacheConfig& config, const std::string& series, bool is_reference,
                     std::size_t n_planned) {
    engine::ForcedOptions fo;
    fo.prefill = o.prefill;
    fo.keep_logits = is_reference;
    fo.reference = is_reference ? nullptr : &ref;
    engine::ForcedRun run = engine::run_forced(model, ids, config, fo);
    const engine::ForcedRun scored = scored_part(run, res.scored_from);
    ModelEvalRow row;
    row.config = config;
    row.series = series;
    row.is_reference = is_reference;
    row.summary = engine::summarize(scored, is_reference ? &scored : &ref_scored);
    row.kept_tokens = run.kept_tokens_mean;
    row.kept_bytes = run.cache.kept_bytes;
    row.full_bytes = run.cache.full_bytes;
    row.compression_ratio = run.cache.compression_ratio;
    row.time_per_token_ms = 1000.0 * run.seconds / static_cast<double>(run.n_forward);
    row.evictions = run.cache.evictions;
    row.merges = run.cache.merges;
    row.keeps_all = run.cache.evictions == 0 && run.cache.merges == 0 &&
                    run.cache.kept_bytes >= run.cache.full_bytes;
    row.nll = run.nll;
    row.resident_bytes = run.cache.resident_bytes;
    row.score_source = run.cache.score_source;
    if (is_reference) {
      ref_scored = scored;
      ref = std::move(run);
    }
    ++n_done;
    if (progress != nullptr) {
      *progress << fmt::format(
                       "eval: [{}] {:<44} ppl {:8.4f}  KL {:.4f}  top1 {:.3f}  {:.3f} ms/token\n",
                       n_planned > 0 ? fmt::format("{}/{}", n_done, n_planned)
                                     : std::to_string(n_done),
                       config.spec() + (is_reference ? " (reference)" : ""), row.summary.ppl,
                       row.summary.kl_mean, row.summary.top1_agreement, row.time_per_token_ms)
                << std::flush;
    }
    return row;
  };
  if (o.ratios.empty()) {
    for (const Planned& p : plan)
      res.rows.push_back(run_one(p.config, p.series, p.is_reference, plan.size()));
    return res;
  }

  // Equal-memory mode: the reference, then every method x ratio (eval/ratio_solver.h).
  // (The number of runs is not known up front: progress lines count them.)
  res.rows.push_back(run_one(reference, plan[0].series, true, 0));
  const KvShape shape{mc.n_layers, mc.n_kv_heads, mc.head_dim};
  const std::int64_t rows_seen = o.tokens - 1;  // tokens fed: the last one is only a target
  const std::int64_t full = full_cache_bytes(shape, rows_seen);
  std::map<std::string, ModelEvalRow> memo;  // spec -> its run (a setting shared by two ratios)
  int runs = 0;
  auto run_cached = [&](const CacheConfig& c, const std::string& series) {
    const std::string key = c.spec(true);
    auto it = memo.find(key);
    if (it == memo.end()) {
      ++runs;
      it = memo.emplace(key, run_one(c, series, false, 0)).first;
    }
    ModelEvalRow row = it->second;
    row.series = series;
    return row;
  };
  for (const CacheConfig& m : methods) {
    const std::string series = short_spec(m, true);
    for (const double ratio : o.ratios) {
      const double target = static_cast<double>(full) / ratio;
      runs = 0;
      if (has_token_budget(m)) {
        // Predict, run, and correct by the measured bytes until the run reaches the ratio.
        std::int64_t offset = 0, below = 0;
        std::optional<ModelEvalRow> best;  // the accepted run, or the closest tried
        std::string why;
        for (int attempt = 0; attempt < kMaxSolverRuns; ++attempt) {
          const auto choice = solve_budget(m, shape, rows_seen, ratio, offset, below, &why);
          if (!choice) break;
          ModelEvalRow row = run_cached(choice->config, series);
          const bool met = static_cast<double>(row.kept_bytes) <= target;
          if (!best || row.compression_ratio > best->compression_ratio) best = row;
          if (met) {
            best = row;
            why.clear();
            break;
          }
          offset = row.kept_bytes - choice->predicted_bytes;
          below = choice->budget;
          why = fmt::format("budget {} holds {} bytes at the end of the text (predicted {})",
                            choice->budget, row.kept_bytes, choice->predicted_bytes);
        }
        if (!best) {
          res.skipped.push_back({m.spec(), 0,
                                 "ratio " + fmt::format("{:g}", ratio) + " not reachable: " + why,
                                 ratio});
          continue;
        }
        best->target_ratio = ratio;
        best->ratio_met = static_cast<double>(best->kept_bytes) <= target;
        if (!best->ratio_met) best->ratio_note = "not reachable: " + why;
        best->solver_runs = runs;
        res.rows.push_back(std::move(*best));
      } else {
        const std::vector<WidthChoice> variants = width_variants(m, shape, rows_seen);
        if (variants.empty()) {
          res.skipped.push_back({m.spec(), 0,
                                 "ratio " + fmt::format("{:g}", ratio) +
                                     " not reachable: the method has no budget and no bit width",
                                 ratio});
          continue;
        }
        const WidthChoice& pick = nearest_width(variants, ratio);
        if (pick.config == reference) {
          res.skipped.push_back({m.spec(), 0,
                                 "ratio " + fmt::format("{:g}", ratio) +
                                     ": the nearest setting is the reference itself",
                                 ratio});
          continue;
        }
        ModelEvalRow row = run_cached(pick.config, series);
        row.target_ratio = ratio;
        row.ratio_met = static_cast<double>(row.kept_bytes) <= target;
        if (!row.ratio_met) {
          std::string reach;
          for (const WidthChoice& v : variants) {
            reach += fmt::format("{}{:.2f} ({})", reach.empty() ? "" : ", ", v.predicted_ratio,
                                 v.config.spec());
          }
          row.ratio_note = "nearest: the bit widths reach only " + reach;
        }
        row.solver_runs = runs;
        res.rows.push_back(std::move(row));
      }
    }
  }
  return res;
}

nlohmann::json model_eval_json(const ModelEvalResult& r, const std::string& command) {
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
  nlohmann::json j = results_envelope("eval", command, settings);
  for (const ModelEvalRow& row : r.rows) {
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
    x["text"] = r.options.text;
    x["tokens"] = r.n_tokens;
    x["prefill"] = r.options.prefill;
    x["time_per_token_ms"] = row.time_per_token_ms;
    if (!r.options.ratios.empty() && !row.is_reference) {
      x["target_ratio"] = row.target_ratio;
      x["ratio_reached"] = row.compression_ratio;
      x["ratio_met"] = row.ratio_met;
      x["ratio_note"] = row.ratio_note;
      x["solver_runs"] = row.solver_runs;
    }
    j["rows"].push_back(x);
  }
  nlohmann::json skipped = nlohmann::json::array();
  for (const ModelEvalSkip& s : r.skipped) {
    nlohmann::json e = {{"method", s.method}, {"budget", s.budget}, {"reason", s.reason}};
    if (s.ratio > 0) {
      e["budget"] = nullptr;
      e["ratio"] = s.ratio;
    }
    skipped.push_back(e);
  }
  j["skipped"] = skipped;
  if (!r.options.ratios.empty()) {
    j["best_per_ratio"] = best_per_ratio_json(r, ParetoCriterion::kPerplexity);
    j["closest_per_ratio"] = best_per_ratio_json(r, ParetoCriterion::kKl);
  }
  return j;
}

std::string model_eval_table(const ModelEvalResult& r) {
  const std::int64_t n_scored = r.n_tokens - 1 - r.scored_from;
  std::string out =
      r.scored_from > 0
          ? fmt::format("{} ({}), {}: first {} tokens, the first {} as one prefill, then {} "
                        "decoded predictions (scored)\n\n",
                        r.options.model, r.model_format, r.options.text, r.n_tokens,
                        r.options.prefill, n_scored)
          : fmt::format("{} ({}), {}: first {} tokens, {} predictions, one token per step\n\n",
                        r.options.model, r.model_format, r.options.text, r.n_tokens, n_scored);
  const bool by_ratio = !r.options.ratios.empty();
  out += fmt::format("{:<40} {}{:>6} {:>9} {:>7} {:>8} {:>6} {:>9} {:>10} {:>10} {:>9} {:>8}\n",
                     "method", by_ratio ? "target " : "", "budget", "ppl", "nll", "KL", "top1",
                     "kept/head", "kept bytes", "resident", "ratio", "ms/tok");
  std::string notes;
  bool any_keeps_all = false;
  for (const ModelEvalRow& row : r.rows) {
    const std::string budget =
        has_token_budget(row.config) ? std::to_string(token_budget(row.config)) : "-";
    // KL below the table's precision but not zero is shown in scientific notation.
    const double kl = row.summary.kl_mean;
    const std::string kl_text =
        kl > 0 && kl < 5e-5 ? fmt::format("{:8.1e}", kl) : fmt::format("{:8.4f}", kl);
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
    out += fmt::format(
        "{:<40} {}{:>6} {:>9.4f} {:>7.4f} {} {:>6.3f} {:>9.1f} {:>10} {:>10} {:>9} {:>8.4f}\n",
        row.series + (row.is_reference ? " (reference)" : ""), target, budget, row.summary.ppl,
        row.summary.nll_mean, kl_text, row.summary.top1_agreement, row.kept_tokens, row.kept_bytes,
        row.resident_bytes, ratio, row.time_per_token_ms);
  }
  out += notes;
  for (const ModelEvalSkip& s : r.skipped) {
    if (s.ratio > 0) {
      out += fmt::format("skipped {} at ratio {:g}: {}\n", s.method, s.ratio, s.reason);
    } else {
      out += fmt::format("skipped {} at budget {}: {}\n", s.method, s.budget, s.reason);
    }
  }
  out += fmt::format(
      "\nppl = exp(mean NLL) over the {} scored predictions; KL = mean KL(reference || method) per "
      "token in nats; top1 = share of positions whose argmax matches the reference; kept/head = "
      "mean rows per KV head per layer after each step; kept bytes (payload) / resident (every "
      "byte the cache keeps) / ratio (full_bytes / kept_bytes) at the end of the text.{}\n",
      n_scored,
      any_keeps_all ? " keeps all = nothing evicted, merged or quantized in this scenario "
                      "(no compression)."
                    : "");
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
  std::string out = "run\tmethod\tbudget\tposition\ttoken\tnext_token\tscored\tnll\n";
  for (std::size_t i = 0; i < r.rows.size(); ++i) {
    const ModelEvalRow& row = r.rows[i];
    const std::string spec = row.config.spec();
    const std::string budget =
        has_token_budget(row.config) ? std::to_string(token_budget(row.config)) : "-";
    for (std::size_t p = 0; p < row.nll.size(); ++p) {
      // %.17g: the double round-trips exactly.
      out += fmt::format("{}\t{}\t{}\t{}\t{}\t{}\t{}\t{:.17g}\n", i, spec, budget, p, r.ids[p],
                         r.ids[p + 1], static_cast<std::int64_t>(p) >= r.scored_from ? 1 : 0,
                         row.nll[p]);
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
  // dashed horizontal lines.
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
    }
    if (row.summary.kl_mean > 0) {  // KL = 0 (the reference, nothing evicted) has no log-axis point
      Series& sk = series_in(kl, label, flat);
      for (const double x : xs) {
        sk.x.push_back(x);
        sk.y.push_back(row.summary.kl_mean);
      }
    }
  }
  const std::string title = "KV-cache methods on " + r.options.model + ", " + r.options.text +
                            " (first " + std::to_string(r.n_tokens) + " tokens)";
  return line_plot_svg(title, {ppl, kl}, 2);
}

}  // namespace vq::eval
