// Running `veloxquant eval`: options checked, runs planned, inputs loaded and cut into windows,
// then every configuration run on every window (eval/task_pool.h) and the rows assembled. The
// renderers are in model_eval_report.cpp and pareto.cpp.
#include "eval/model/model_eval.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>

#include "base/validate.h"
#include "engine/compute/parallel.h"
#include "engine/formats/json_limits.h"
#include "engine/formats/mapped_file.h"
#include "engine/model/model.h"
#include "engine/run/generate.h"
#include "engine/run/qfilters_file.h"
#include "engine/tokenizers/tokenizer.h"
#include "eval/model/model_eval_internal.h"
#include "eval/model/ratio_solver.h"
#include "eval/task_pool.h"
#include "policies/spec_budget.h"
#include "veloxquant/cache.h"
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

// Runs the equal-memory solver may make for one method x ratio: its prediction, then checks
// that each correct the prediction by the bytes measured.
constexpr int kMaxSolverRuns = 8;

void check_window_options(const ModelEvalOptions& o) {
  if (o.windows < 0) bad(fmt::format("--windows must be >= 1, got {}", o.windows));
  if (o.windows == 0) {
    if (!o.more_texts.empty())
      bad("--text is given " + std::to_string(o.more_texts.size() + 1) +
          " times: several texts need --windows N");
    if (o.window_stride != 0) bad("--window-stride needs --windows N");
    if (!o.select_from.empty()) bad("--select-from needs --windows N and --ratio");
    return;
  }
  if (o.window_stride < 0)
    bad(fmt::format("--window-stride must be >= 0 (0: consecutive windows), got {}",
                    o.window_stride));
  if (o.bootstrap_samples < 1)
    bad(fmt::format("--bootstrap must be >= 1 resample, got {}", o.bootstrap_samples));
  if (!o.select_from.empty() && o.ratios.empty()) bad("--select-from needs --ratio");
}

void check_options(const ModelEvalOptions& o) {
  if (o.tokens < 2) bad("--tokens must be >= 2 (one prediction), got " + std::to_string(o.tokens));
  if (o.prefill < 0 || o.prefill > o.tokens - 2) {
    bad("--prefill must be in [0, " + std::to_string(o.tokens - 2) +
        "] (--tokens - 2: at least one prediction is decoded after the prefill), got " +
        std::to_string(o.prefill));
  }
  if (o.budgets.empty() && o.ratios.empty()) bad("--budget needs at least one value");
  for (const double r : o.ratios) {
    if (!std::isfinite(r) || r < 1.0)
      bad(fmt::format("--ratio values must be finite numbers >= 1, got {}", r));
  }
  if (o.threads < 0) bad(fmt::format("threads must be >= 0, got {}", o.threads));
  check_window_options(o);
}

// The token budget a spec writes itself ("h2o:budget=16", "h2o:h2o_budget=16",
// "streaming_llm:budget=16", "streaming_llm:window_size=16"), if any: the shared rule of
// policies/spec_budget.h, so eval agrees with every other command.
std::optional<std::int64_t> spec_budget(const std::string& spec, const CacheConfig& c) {
  if (!has_token_budget(c) || !spec_writes_budget(spec)) return std::nullopt;
  return token_budget(c);
}

// Method specs parsed; a budget written in a spec pins that method's budget (see
// ModelEvalOptions::budgets_given).
std::vector<CacheConfig> parse_methods(const ModelEvalOptions& o,
                                       std::vector<bool>& budget_written) {
  std::vector<CacheConfig> methods;
  if (o.methods.empty()) {
    for (const auto& id : method_ids()) methods.emplace_back(id);
  }
  budget_written.assign(methods.size(), false);
  for (const auto& s : o.methods) {
    methods.push_back(CacheConfig::parse(s));
    const std::optional<std::int64_t> b = spec_budget(s, methods.back());
    budget_written.push_back(b.has_value());
    if (!b) continue;
    if (!o.ratios.empty()) {
      bad(fmt::format("--method '{}' writes its budget ({}) and --ratio sets every method's "
                      "budget: leave the budget out of the spec, or drop --ratio",
                      s, *b));
    }
    if (o.budgets_given && o.budgets != std::vector<std::int64_t>{*b}) {
      std::string list;
      for (const std::int64_t v : o.budgets) list += (list.empty() ? "" : ",") + std::to_string(v);
      bad(fmt::format("--method '{}' writes budget {} but --budget {} asks for other budgets: "
                      "give the budget in one place",
                      s, *b, list));
    }
  }
  return methods;
}

// Budget mode: the reference, then every method x budget (a budget the method's guards reject
// is recorded in `skipped`); duplicates run once.
std::vector<Planned> plan_budget_runs(const CacheConfig& reference,
                                      const std::vector<CacheConfig>& methods,
                                      const std::vector<bool>& budget_written,
                                      const ModelEvalOptions& o,
                                      std::vector<ModelEvalSkip>& skipped) {
  std::vector<Planned> plan;
  plan.push_back({reference, short_spec(reference, false), true});
  for (std::size_t k = 0; k < methods.size(); ++k) {
    const CacheConfig& m = methods[k];
    std::vector<CacheConfig> cells;
    if (has_token_budget(m) && !budget_written[k]) {
      for (const std::int64_t b : o.budgets) {
        try {
          cells.push_back(with_token_budget(m, b));
        } catch (const Error& e) {
          if (e.code() != ErrorCode::kInvalidConfig) throw;
          skipped.push_back({m.spec(), b, e.what()});
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
  return plan;
}

// Every registered method (no --method): a method that needs key filters (qfilters) is skipped,
// with the reason, when the model has no filter file, so a model nobody calibrated still runs
// the rest. Named with --method, such a method fails instead (engine/run/qfilters_file.h).
void skip_without_key_filters(const engine::Model& model, std::vector<CacheConfig>& methods,
                              std::vector<bool>& budget_written, std::vector<Planned>& plan,
                              std::vector<ModelEvalSkip>& skipped) {
  const std::string file = model.qfilters_path();
  std::error_code ec;
  if (!file.empty() && std::filesystem::exists(file, ec)) return;
  auto needs = [](const CacheConfig& c) {
    return LayerCache(c, LayerShape{1, 1, 0, 0, 1}).needs_key_filters();
  };
  const std::string why = "no key-filter file" + (file.empty() ? std::string() : " '" + file + "'") +
                          " for this model: make it with `veloxquant calibrate`";
  for (auto it = plan.begin(); it != plan.end();) {
    if (!it->is_reference && needs(it->config)) {
      skipped.push_back({it->config.spec(), has_token_budget(it->config) ? token_budget(it->config) : 0, why});
      it = plan.erase(it);
    } else {
      ++it;
    }
  }
  for (std::size_t k = methods.size(); k-- > 0;) {
    if (!needs(methods[k])) continue;
    if (plan.empty()) skipped.push_back({methods[k].spec(), 0, why});  // equal-memory mode
    methods.erase(methods.begin() + static_cast<std::ptrdiff_t>(k));
    budget_written.erase(budget_written.begin() + static_cast<std::ptrdiff_t>(k));
  }
}

nlohmann::json model_config_json(const engine::ModelConfig& mc) {
  return {{"dim", mc.dim},
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
}

// The windows of one text (windows mode), appended to `out` and `info`.
void cut_windows(const ModelEvalOptions& o, const engine::Tokenizer& tokenizer,
                 const std::string& path, std::vector<std::vector<std::int32_t>>& out,
                 std::vector<WindowInfo>& info) {
  const std::vector<std::int32_t> ids = tokenizer.encode(engine::read_text_file(path));
  const bool bos = !ids.empty() && tokenizer.bos_id() >= 0 && ids[0] == tokenizer.bos_id();
  const std::int64_t head = bos ? 1 : 0, per = o.tokens - head;
  const std::int64_t stride = o.window_stride > 0 ? o.window_stride : per;
  if (stride < per) {
    bad(fmt::format("--window-stride {} is shorter than a window's {} text tokens (--tokens {}{}): "
                    "windows would overlap",
                    stride, per, o.tokens, bos ? ", BOS first" : ""));
  }
  const std::int64_t need = head + (o.windows - 1) * stride + per;
  if (static_cast<std::int64_t>(ids.size()) < need) {
    throw Error(ErrorCode::kFileError,
                fmt::format("'{}': encodes to {} tokens; --windows {} of --tokens {} (stride {}) "
                            "need {}; at most {} windows fit",
                            path, ids.size(), o.windows, o.tokens, stride, need,
                            (static_cast<std::int64_t>(ids.size()) - head - per) / stride + 1),
                path);
  }
  for (std::int64_t k = 0; k < o.windows; ++k) {
    const std::int64_t start = head + k * stride;
    std::vector<std::int32_t> w;
    if (bos) w.push_back(ids[0]);
    w.insert(w.end(), ids.begin() + start, ids.begin() + start + per);
    out.push_back(std::move(w));
    info.push_back({path, k, start});
  }
}

// The token windows: the text's first `tokens` tokens without --windows, else every text's.
std::vector<std::vector<std::int32_t>> load_windows(const ModelEvalOptions& o,
                                                    const engine::Tokenizer& tokenizer,
                                                    std::vector<WindowInfo>& info) {
  std::vector<std::vector<std::int32_t>> out;
  if (o.windows == 0) {
    const std::string text = engine::read_text_file(o.text);
    std::vector<std::int32_t> ids = engine::encode_first(tokenizer, text, o.tokens);
    if (static_cast<std::int64_t>(ids.size()) < o.tokens) {
      throw Error(ErrorCode::kFileError,
                  "'" + o.text + "': encodes to only " + std::to_string(ids.size()) +
                      " tokens, fewer than --tokens " + std::to_string(o.tokens),
                  o.text);
    }
    out.push_back(std::move(ids));
    return out;
  }
  cut_windows(o, tokenizer, o.text, out, info);
  for (const std::string& t : o.more_texts) cut_windows(o, tokenizer, t, out, info);
  return out;
}

// The configurations a selection file chose per ratio (its best_per_ratio), after checking that
// it evaluated the same scenario. Every key read is type-checked: a wrong type is an error
// naming the key, the type expected and the value found (never a JSON library exception).
void read_selection(const ModelEvalOptions& o, ModelEvalResult& res) {
  using nlohmann::json;
  const std::string& path = o.select_from;
  const json j = engine::parse_json_limited(engine::read_text_file(path), path, "result file");
  auto refuse = [&](const std::string& why) {
    throw Error(ErrorCode::kFileError, "--select-from '" + validate::excerpt(path, 300) + "': " + why,
                path);
  };
  enum class Want { kString, kObject, kArray, kNumber, kInteger };
  auto is = [](const json& v, Want w) {
    switch (w) {
      case Want::kString: return v.is_string();
      case Want::kObject: return v.is_object();
      case Want::kArray: return v.is_array();
      case Want::kNumber: return v.is_number();
      case Want::kInteger: return v.is_number_integer();
    }
    return false;
  };
  auto wanted = [](Want w) {
    switch (w) {
      case Want::kString: return "a string";
      case Want::kObject: return "an object";
      case Want::kArray: return "an array";
      case Want::kNumber: return "a number";
      case Want::kInteger: return "an integer";
    }
    return "";
  };
  auto found = [](const json& v) {
    const std::string t = v.type_name();
    const bool vowel = t[0] == 'a' || t[0] == 'o';
    return std::string(vowel ? "an " : "a ") + t + " (" + engine::json_excerpt(v) + ")";
  };
  // The value at `key` of `obj` (named `where` in messages), or nullptr when absent or null.
  auto get = [&](const json& obj, const std::string& where, const std::string& key,
                 Want w) -> const json* {
    const auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return nullptr;
    if (!is(*it, w)) {
      refuse("key '" + where + key + "' must be " + wanted(w) + ", found " + found(*it));
    }
    return &*it;
  };
  const std::string expected =
      "expected an eval result file with best_per_ratio (eval --ratio --windows --json)";
  if (!j.is_object()) refuse(expected + ", found " + found(j));
  const json* kind = get(j, "", "kind", Want::kString);
  const json* settings = get(j, "", "settings", Want::kObject);
  const json* best = get(j, "", "best_per_ratio", Want::kArray);
  if (kind == nullptr || *kind != "eval" || settings == nullptr || best == nullptr) refuse(expected);
  const json& st = *settings;
  if (get(st, "settings.", "windows", Want::kNumber) == nullptr) refuse("it was not run with --windows");
  const json* model = get(st, "settings.", "model", Want::kString);
  const json* tokens = get(st, "settings.", "tokens", Want::kInteger);
  const json* prefill = get(st, "settings.", "prefill", Want::kInteger);
  const json* ratios = get(st, "settings.", "ratios", Want::kArray);
  const json* reference = get(st, "settings.", "reference", Want::kString);
  if (model == nullptr || *model != o.model || tokens == nullptr || *tokens != o.tokens ||
      prefill == nullptr || *prefill != o.prefill || ratios == nullptr || *ratios != o.ratios ||
      reference == nullptr || *reference != o.reference) {
    refuse("it evaluated another scenario (model, --tokens, --prefill, --ratio and --reference "
           "must match this run's)");
  }
  const json* text = get(st, "settings.", "text", Want::kString);
  res.selected_text = text == nullptr ? std::string() : text->get<std::string>();
  for (std::size_t i = 0; i < best->size(); ++i) {
    const json& e = (*best)[i];
    const std::string where = "best_per_ratio[" + std::to_string(i) + "]";
    if (!e.is_object()) refuse("key '" + where + "' must be an object, found " + found(e));
    const json* ratio = get(e, where + ".", "ratio", Want::kNumber);
    const json* series = get(e, where + ".", "series", Want::kString);
    res.selected.push_back({ratio == nullptr ? 0.0 : ratio->get<double>(),
                            series == nullptr ? std::string() : series->get<std::string>()});
  }
}

// Runs configurations on the windows: the reference first (it keeps its logits), then any
// configuration on any window, from any thread.
class Runner {
 public:
  Runner(const engine::Model& model, const ModelEvalOptions& o, const ModelEvalResult& res,
         std::ostream* progress, engine::RepeatPrompt repeat)
      : model_(model), o_(o), res_(res), progress_(progress),
        threads_(o.threads > 0 ? o.threads : engine::threads()), repeat_(std::move(repeat)) {
    if (!o.head_pattern.empty()) {
      pattern_ = load_head_pattern(o.head_pattern, model.config().n_layers,
                                   model.config().n_kv_heads);
    }
  }

  std::size_t n_windows() const { return res_.window_ids.size(); }
  int threads() const { return threads_; }

  void run_reference(const CacheConfig& reference) {
    refs_.resize(n_windows());
    ref_scored_.resize(n_windows());
    ref_rows_.resize(n_windows());
    run_tasks(static_cast<std::int64_t>(n_windows()), threads_, [&](std::int64_t w) {
      const auto i = static_cast<std::size_t>(w);
      ref_rows_[i] = run(reference, i, &refs_[i]);
    });
  }
  const std::vector<WindowRun>& reference_runs() const { return ref_rows_; }

  // One configuration on one window (the reference's own run when `keep` is given).
  WindowRun run(const CacheConfig& config, std::size_t w, engine::ForcedRun* keep = nullptr) const {
    engine::ForcedOptions fo;
    fo.prefill = o_.prefill;
    fo.keep_logits = keep != nullptr;
    fo.head_pattern = pattern_.empty() ? nullptr : &pattern_;
    fo.repeat = &repeat_;
    fo.reference = keep != nullptr ? nullptr : &refs_[w];
    engine::ForcedRun run = engine::run_forced(model_, res_.window_ids[w], config, fo);
    const engine::ForcedRun scored = scored_part(run, res_.scored_from);
    WindowRun out;
    out.summary = engine::summarize(scored, keep != nullptr ? &scored : &ref_scored_[w]);
    out.nll = run.nll;
    out.kept_tokens = run.kept_tokens_mean;
    out.cache = run.cache;
    out.time_per_token_ms = 1000.0 * run.seconds / static_cast<double>(run.n_forward);
    out.prefill_ms = 1000.0 * run.prefill_seconds;
    out.reconstruction_ms = 1000.0 * run.reconstruction_seconds;
    if (keep != nullptr) {
      ref_scored_[w] = scored;
      *keep = std::move(run);
    }
    return out;
  }

  // A progress line for a finished row (label: "[k/N]" or "[k]").
  void report(const std::string& label, const ModelEvalRow& row) const {
    if (progress_ == nullptr) return;
    std::lock_guard<std::mutex> lk(m_);
    *progress_ << fmt::format(
                      "eval: [{}] {:<44} ppl {:8.4f}  KL {:.4f}  top1 {:.3f}  {:.3f} ms/token\n",
                      label, row.config.spec() + (row.is_reference ? " (reference)" : ""),
                      row.summary.ppl, row.summary.kl_mean, row.summary.top1_agreement,
                      row.time_per_token_ms)
               << std::flush;
  }
  // The next number for a progress line without a planned total.
  int next_count() const {
    std::lock_guard<std::mutex> lk(m_);
    return ++count_;
  }

 private:
  const engine::Model& model_;
  const ModelEvalOptions& o_;
  const ModelEvalResult& res_;
  std::ostream* progress_;
  int threads_;
  HeadPattern pattern_;  // --duo-pattern, read once
  engine::RepeatPrompt repeat_;  // kvzip's reconstruction instruction in the text's tokenizer
  std::vector<engine::ForcedRun> refs_;
  mutable std::vector<engine::ForcedRun> ref_scored_;
  std::vector<WindowRun> ref_rows_;
  mutable std::mutex m_;
  mutable int count_ = 0;
};

// Budget mode: every planned configuration on every window, in parallel.
void run_budget_mode(const std::vector<Planned>& plan, const Runner& runner, ModelEvalResult& res) {
  const std::size_t W = runner.n_windows(), P = plan.size();
  std::vector<std::vector<WindowRun>> runs(P, std::vector<WindowRun>(W));
  runs[0] = runner.reference_runs();
  res.rows.resize(P);
  res.rows[0] = make_row(plan[0].config, plan[0].series, true, runs[0]);
  runner.report(fmt::format("1/{}", P), res.rows[0]);
  std::vector<std::size_t> left(P, W);
  std::mutex m;
  run_tasks(static_cast<std::int64_t>((P - 1) * W), runner.threads(), [&](std::int64_t t) {
    const std::size_t p = 1 + static_cast<std::size_t>(t) / W, w = static_cast<std::size_t>(t) % W;
    runs[p][w] = runner.run(plan[p].config, w);
    {
      std::lock_guard<std::mutex> lk(m);
      if (--left[p] != 0) return;
    }
    res.rows[p] = make_row(plan[p].config, plan[p].series, false, runs[p]);
    runner.report(fmt::format("{}/{}", p + 1, P), res.rows[p]);
  });
}

// One method's equal-memory cells, solved on window 0 (eval/model/ratio_solver.h).
struct RatioCell {
  std::optional<ModelEvalSkip> skip;
  CacheConfig config;
  std::string series;
  double ratio = 0;
  bool met = true;   // window 0 reached the ratio
  std::string note;  // why not
  int solver_runs = 0;
};

struct MethodSolve {
  std::vector<RatioCell> cells;
  std::map<std::string, WindowRun> window0;  // spec -> its run on window 0
};

class Solver {
 public:
  Solver(const Runner& runner, const KvShape& shape, std::int64_t rows_seen,
         const CacheConfig& reference)
      : runner_(runner), shape_(shape), rows_seen_(rows_seen), reference_(reference),
        full_(full_cache_bytes(shape, rows_seen)) {}

  MethodSolve solve(const CacheConfig& m, const std::vector<double>& ratios) const {
    MethodSolve out;
    const std::string series = short_spec(m, true);
    for (const double ratio : ratios) {
      int runs = 0;
      auto run = [&](const CacheConfig& c) -> const WindowRun& {
        const std::string key = c.spec(true);
        auto it = out.window0.find(key);
        if (it == out.window0.end()) {
          ++runs;
          it = out.window0.emplace(key, runner_.run(c, 0)).first;
          ModelEvalRow row = make_row(c, series, false, {it->second});
          runner_.report(std::to_string(runner_.next_count()), row);
        }
        return it->second;
      };
      RatioCell cell = has_token_budget(m) ? solve_budget_cell(m, ratio, run)
                                           : solve_width_cell(m, ratio, run);
      cell.series = series;
      cell.ratio = ratio;
      cell.solver_runs = runs;
      out.cells.push_back(std::move(cell));
    }
    return out;
  }

 private:
  template <typename Run>
  RatioCell solve_budget_cell(const CacheConfig& m, double ratio, Run& run) const {
    const double target = static_cast<double>(full_) / ratio;
    // Predict, run, and correct by the measured bytes until the run reaches the ratio.
    std::int64_t offset = 0, below = 0;
    std::optional<CacheConfig> best;  // the accepted setting, or the closest tried
    double best_ratio = 0;
    std::string why;
    for (int attempt = 0; attempt < kMaxSolverRuns; ++attempt) {
      const auto choice = solve_budget(m, shape_, rows_seen_, ratio, offset, below, &why);
      if (!choice) break;
      const WindowRun& r = run(choice->config);
      const bool met = static_cast<double>(r.cache.kept_bytes) <= target;
      if (!best || r.cache.compression_ratio > best_ratio || met) {
        best = choice->config;
        best_ratio = r.cache.compression_ratio;
      }
      if (met) {
        why.clear();
        break;
      }
      offset = r.cache.kept_bytes - choice->predicted_bytes;
      below = choice->budget;
      why = fmt::format("budget {} holds {} bytes at the end of the text (predicted {})",
                        choice->budget, r.cache.kept_bytes, choice->predicted_bytes);
    }
    RatioCell cell;
    if (!best) {
      cell.skip = ModelEvalSkip{
          m.spec(), 0, "ratio " + fmt::format("{:g}", ratio) + " not reachable: " + why, ratio};
      return cell;
    }
    cell.config = *best;
    cell.met = why.empty();
    if (!cell.met) cell.note = "not reachable: " + why;
    return cell;
  }

  template <typename Run>
  RatioCell solve_width_cell(const CacheConfig& m, double ratio, Run& run) const {
    RatioCell cell;
    const std::vector<WidthChoice> variants = width_variants(m, shape_, rows_seen_);
    const std::string asked = "ratio " + fmt::format("{:g}", ratio);
    if (variants.empty()) {
      cell.skip = ModelEvalSkip{
          m.spec(), 0, asked + " not reachable: the method has no budget and no bit width", ratio};
      return cell;
    }
    const WidthChoice& pick = nearest_width(variants, ratio);
    if (pick.config == reference_) {
      cell.skip = ModelEvalSkip{
          m.spec(), 0, asked + ": the nearest setting is the reference itself", ratio};
      return cell;
    }
    cell.config = pick.config;
    const WindowRun& r = run(pick.config);
    if (static_cast<double>(r.cache.kept_bytes) > static_cast<double>(full_) / ratio) {
      std::string reach;
      for (const WidthChoice& v : variants) {
        reach += fmt::format("{}{:.2f} ({})", reach.empty() ? "" : ", ", v.predicted_ratio,
                             v.config.spec());
      }
      cell.met = false;
      cell.note = "nearest: the settings (bit widths, or think= shares) reach only " + reach;
    }
    return cell;
  }

  const Runner& runner_;
  KvShape shape_;
  std::int64_t rows_seen_;
  CacheConfig reference_;
  std::int64_t full_;
};

// Equal-memory mode: settings solved per method on window 0 (methods in parallel), then every
// chosen setting run on the other windows (in parallel), then the rows in method x ratio order.
void run_ratio_mode(const CacheConfig& reference, const std::vector<CacheConfig>& methods,
                    const Runner& runner, const engine::ModelConfig& mc, ModelEvalResult& res) {
  const std::vector<WindowRun>& ref_runs = runner.reference_runs();
  res.rows.push_back(make_row(reference, short_spec(reference, false), true, ref_runs));
  runner.report(std::to_string(runner.next_count()), res.rows[0]);
  const KvShape shape{mc.n_layers, mc.n_kv_heads, mc.head_dim, res.options.prefill};
  const std::int64_t rows_seen = res.n_tokens - 1;  // tokens fed: the last one is only a target
  const Solver solver(runner, shape, rows_seen, reference);
  std::vector<MethodSolve> solved(methods.size());
  run_tasks(static_cast<std::int64_t>(methods.size()), runner.threads(), [&](std::int64_t i) {
    const auto k = static_cast<std::size_t>(i);
    solved[k] = solver.solve(methods[k], res.options.ratios);
  });
  // The chosen settings on every window (window 0's runs are the solver's).
  std::vector<std::pair<std::size_t, std::string>> chosen;  // (method, spec)
  for (std::size_t k = 0; k < solved.size(); ++k) {
    for (const RatioCell& c : solved[k].cells) {
      if (c.skip) continue;
      const std::pair<std::size_t, std::string> key{k, c.config.spec(true)};
      if (std::find(chosen.begin(), chosen.end(), key) == chosen.end()) chosen.push_back(key);
    }
  }
  const std::size_t W = runner.n_windows();
  std::vector<std::vector<WindowRun>> runs(chosen.size(), std::vector<WindowRun>(W));
  std::vector<CacheConfig> configs(chosen.size());
  for (std::size_t i = 0; i < chosen.size(); ++i) {
    for (const RatioCell& c : solved[chosen[i].first].cells) {
      if (!c.skip && c.config.spec(true) == chosen[i].second) configs[i] = c.config;
    }
    runs[i][0] = solved[chosen[i].first].window0.at(chosen[i].second);
  }
  if (W > 1) {
    run_tasks(static_cast<std::int64_t>(chosen.size() * (W - 1)), runner.threads(),
              [&](std::int64_t t) {
                const std::size_t i = static_cast<std::size_t>(t) / (W - 1);
                const std::size_t w = 1 + static_cast<std::size_t>(t) % (W - 1);
                runs[i][w] = runner.run(configs[i], w);
              });
  }
  const double full = static_cast<double>(full_cache_bytes(shape, rows_seen));
  for (std::size_t k = 0; k < solved.size(); ++k) {
    for (const RatioCell& c : solved[k].cells) {
      if (c.skip) {
        res.skipped.push_back(*c.skip);
        continue;
      }
      const std::size_t i = static_cast<std::size_t>(
          std::find(chosen.begin(), chosen.end(), std::make_pair(k, c.config.spec(true))) -
          chosen.begin());
      ModelEvalRow row = make_row(c.config, c.series, false, runs[i]);
      row.target_ratio = c.ratio;
      row.ratio_met = static_cast<double>(row.kept_bytes) <= full / c.ratio;
      row.ratio_note = c.met ? "" : c.note;
      if (!row.ratio_met && c.met) {
        row.ratio_note = fmt::format("reached on window 0; another window holds {} bytes",
                                     row.kept_bytes);
      }
      row.solver_runs = c.solver_runs;
      res.rows.push_back(std::move(row));
    }
  }
}

}  // namespace

ModelEvalResult run_model_eval(const ModelEvalOptions& o, std::ostream* progress) {
  ModelEvalResult res;
  res.options = o;
  check_options(o);
  // Plan every run before loading anything, so bad specs fail fast.
  const CacheConfig reference = CacheConfig::parse(o.reference);
  std::vector<bool> budget_written;
  std::vector<CacheConfig> methods = parse_methods(o, budget_written);
  std::vector<Planned> plan;
  if (o.ratios.empty()) plan = plan_budget_runs(reference, methods, budget_written, o, res.skipped);
  if (!o.select_from.empty()) read_selection(o, res);

  engine::Model model = engine::Model::load(o.model);
  if (!o.qfilters.empty()) model.set_qfilters_path(o.qfilters);
  if (o.methods.empty()) skip_without_key_filters(model, methods, budget_written, plan, res.skipped);
  // A method named with --method that needs key filters fails now, before the runs, when the
  // model's filter file is missing or made for another model.
  for (const CacheConfig& m : methods) {
    if (!LayerCache(m, LayerShape{1, 1, 0, 0, 1}).needs_key_filters()) continue;
    (void)engine::make_model_cache(m, model);
    break;
  }
  const auto tokenizer = engine::load_tokenizer(o.tokenizer, model);
  const engine::ModelConfig& mc = model.config();
  res.model_format = mc.format;
  res.tokenizer_path = tokenizer->path();
  res.model_config = model_config_json(mc);
  if (o.tokens > mc.seq_len) {
    bad("--tokens " + std::to_string(o.tokens) + " exceeds the model's context (seq_len " +
        std::to_string(mc.seq_len) + ")");
  }
  res.window_ids = load_windows(o, *tokenizer, res.windows);
  res.n_tokens = o.tokens;
  res.ids = res.window_ids[0];
  res.scored_from = o.prefill >= 2 ? o.prefill : 0;
  if (o.before_run) o.before_run(mc);

  // The reference runs keep their logits; every other run is compared with them. The
  // summaries count the decoded predictions only (scored_from on).
  Runner runner(model, o, res, progress, engine::repeat_prompt(*tokenizer));
  runner.run_reference(reference);
  if (o.ratios.empty()) {
    run_budget_mode(plan, runner, res);
  } else {
    run_ratio_mode(reference, methods, runner, mc, res);
  }
  if (res.windowed()) add_window_stats(res);
  return res;
}

}  // namespace vq::eval
