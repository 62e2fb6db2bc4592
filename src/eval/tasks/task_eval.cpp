// Running `veloxquant eval --task`: options checked, settings planned (budgets, or the equal-
// memory solver per length), samples generated, every setting run on every sample as
// `veloxquant generate` runs a prompt, and the cells' statistics computed. The renderers are in
// task_report.cpp.
#include "eval/tasks/task_eval.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>

#include "engine/compute/parallel.h"
#include "engine/formats/mapped_file.h"
#include "engine/model/transformer.h"
#include "engine/run/qfilters_file.h"
#include "engine/run/chat_template.h"
#include "engine/run/sampler.h"
#include "engine/tokenizers/tokenizer.h"
#include "eval/model/model_eval_internal.h"
#include "eval/model/ratio_solver.h"
#include "eval/task_pool.h"
#include "policies/spec_budget.h"
#include "veloxquant/builder.h"
#include "veloxquant/errors.h"
#include "veloxquant/registry.h"

namespace vq::eval {

namespace {

[[noreturn]] void bad(const std::string& msg) {
  throw Error(ErrorCode::kInvalidArgument, "[eval --task] " + msg);
}

void check_options(const TaskEvalOptions& o) {
  if (o.tasks.empty()) bad("--task needs at least one task name");
  for (const std::string& t : o.tasks) task_spec(t);
  for (const std::int64_t d : o.depths) {
    if (d < 0 || d > 100) bad(fmt::format("--depths expects percents in [0, 100], got {}", d));
  }
  if (o.depths.empty()) bad("--depths needs at least one value");
  for (const std::int64_t l : o.lengths) {
    if (l < 1) bad(fmt::format("--lengths expects token counts >= 1, got {}", l));
  }
  for (const auto* list : {&o.depths, &o.lengths}) {
    for (std::size_t i = 0; i < list->size(); ++i) {
      if (std::count(list->begin(), list->begin() + static_cast<std::ptrdiff_t>(i), (*list)[i]) > 0)
        bad(fmt::format("{} lists {} twice", list == &o.depths ? "--depths" : "--lengths", (*list)[i]));
    }
  }
  if (o.samples < 1) bad(fmt::format("--samples must be >= 1, got {}", o.samples));
  if (o.threads < 0) bad(fmt::format("threads must be >= 0, got {}", o.threads));
  if (o.budgets.empty() && o.ratios.empty()) bad("--budget or --ratio needs at least one value");
  if (!o.haystack.empty()) {
    const Haystack h = parse_haystack(o.haystack);
    for (const std::string& t : o.tasks) {
      const TaskSpec& s = task_spec(t);
      if (s.kind == TaskKind::kCwe || s.kind == TaskKind::kFwe) {
        bad(fmt::format("--haystack applies to the niah_* tasks and vt; {} has its own word list "
                        "(got --haystack {} with --task {})",
                        t, o.haystack, t));
      }
      if (s.kind == TaskKind::kVt && h == Haystack::kNeedle) {
        bad("--haystack needle applies to the niah_* tasks; vt takes noise or essay");
      }
    }
  }
}

// The settings: the reference, then every method x budget (or x ratio, solved per length).
// A setting's fields with one configuration in every slot.
TaskSetting make_setting(std::string series, bool ref, std::int64_t budget, double ratio,
                         const CacheConfig& c, std::size_t slots, std::size_t n_lengths) {
  TaskSetting s;
  s.series = std::move(series);
  s.is_reference = ref;
  s.budget = budget;
  s.target_ratio = ratio;
  s.configs.assign(slots, c);
  s.skipped.assign(slots, "");
  s.n_lengths = n_lengths;
  return s;
}

// Equal-memory settings are solved per task and length for the shortest prompt there (`rows`:
// its tokens, [tasks][lengths] flattened), so every sample's cache reaches the ratio at the end
// of its prefill.
std::vector<TaskSetting> plan_settings(const TaskEvalOptions& o, const CacheConfig& reference,
                                       const engine::ModelConfig& mc,
                                       const std::vector<std::int64_t>& rows, std::size_t n_lengths) {
  std::vector<TaskSetting> out;
  const std::size_t L = rows.size();
  out.push_back(make_setting(short_spec(reference, false), true, 0, 0, reference, L, n_lengths));
  std::vector<CacheConfig> methods;
  std::vector<std::string> specs;  // as given ("" for the registered methods' defaults)
  if (o.methods.empty()) {
    for (const auto& id : method_ids()) {
      methods.emplace_back(id);
      specs.emplace_back();
    }
  }
  for (const auto& s : o.methods) {
    methods.push_back(CacheConfig::parse(s));
    specs.push_back(s);
  }
  const KvShape shape{mc.n_layers, mc.n_kv_heads, mc.head_dim, 0};
  for (std::size_t k_m = 0; k_m < methods.size(); ++k_m) {
    const CacheConfig& m = methods[k_m];
    if (m == reference) continue;
    const std::string series = short_spec(m, true);
    // A budget written in the spec pins the method's budget (policies/spec_budget.h): it runs
    // once at that budget, never silently at the default ratios or budgets.
    if (!specs[k_m].empty() && spec_writes_budget(specs[k_m])) {
      const std::int64_t b = token_budget(m);
      if (o.ratios_given) {
        throw Error(ErrorCode::kInvalidArgument,
                    fmt::format("--method '{}' writes its budget ({}) and --ratio sets every "
                                "method's budget: leave the budget out of the spec, or drop --ratio",
                                specs[k_m], b));
      }
      if (!o.budgets.empty() && o.budgets != std::vector<std::int64_t>{b}) {
        throw Error(ErrorCode::kInvalidArgument,
                    fmt::format("--method '{}' writes budget {} but --budget asks for other "
                                "budgets: give the budget in one place",
                                specs[k_m], b));
      }
      out.push_back(make_setting(series, false, b, 0, m, L, n_lengths));
      continue;
    }
    if (!o.ratios.empty()) {
      for (const double r : o.ratios) {
        TaskSetting s = make_setting(series, false, 0, r, m, L, n_lengths);
        for (std::size_t k = 0; k < L; ++k) {
          std::string why;
          if (has_token_budget(m)) {
            const auto c = solve_budget(m, shape, rows[k], r, 0, 0, &why);
            if (c) s.configs[k] = c->config;
            else s.skipped[k] = fmt::format("ratio {:g} not reachable: {}", r, why);
          } else {
            const std::vector<WidthChoice> v = width_variants(m, shape, rows[k]);
            if (v.empty()) s.skipped[k] = "the method has no budget and no bit width";
            else s.configs[k] = nearest_width(v, r).config;
          }
        }
        out.push_back(std::move(s));
      }
    } else if (has_token_budget(m)) {
      for (const std::int64_t b : o.budgets) {
        TaskSetting s = make_setting(series, false, b, 0, m, L, n_lengths);
        try {
          std::fill(s.configs.begin(), s.configs.end(), with_token_budget(m, b));
        } catch (const Error& e) {
          if (e.code() != ErrorCode::kInvalidConfig) throw;
          std::fill(s.skipped.begin(), s.skipped.end(), e.what());
        }
        out.push_back(std::move(s));
      }
    } else {
      out.push_back(make_setting(series, false, 0, 0, m, L, n_lengths));
    }
  }
  return out;
}

struct SampleKey {
  std::size_t task, length;
  std::int64_t depth, index;
};

std::vector<SampleKey> sample_keys(const TaskEvalOptions& o, std::size_t n_lengths) {
  std::vector<SampleKey> keys;
  for (std::size_t t = 0; t < o.tasks.size(); ++t) {
    const TaskSpec& spec = task_spec(o.tasks[t]);
    for (std::size_t l = 0; l < n_lengths; ++l) {
      const std::vector<std::int64_t> depths =
          spec.has_depth ? o.depths : std::vector<std::int64_t>{-1};
      for (const std::int64_t d : depths) {
        for (std::int64_t i = 0; i < o.samples; ++i) keys.push_back({t, l, d, i});
      }
    }
  }
  return keys;
}

// Runs one sample through one configuration as engine::generate runs a prompt: the whole
// prompt as one prefill step (Logits::kLast), then one decode step per token; greedy (the
// sampler at temperature 0). Stops at the model's stop token (as generate), EOS, the chat
// template's end of turn, a newline (the text before it is kept), tokens_to_generate, or the
// model's context.
class SampleRunner {
 public:
  SampleRunner(const engine::Model& model, const engine::Tokenizer& tok, std::int32_t end_of_turn)
      : model_(model), tok_(tok) {
    const engine::ModelConfig& c = model.config();
    stops_ = {c.format == "llama2c" ? 1 : c.eos_id, c.eos_id, end_of_turn};
  }

  TaskRun run(const TaskSample& s, const TaskSpec& spec, const CacheConfig& config) const {
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    const engine::ModelConfig& c = model_.config();
    const auto S = static_cast<std::int64_t>(s.ids.size());
    const std::int64_t max_new = std::min<std::int64_t>(spec.tokens_to_generate, c.seq_len - S + 1);
    ModelCache cache = engine::make_model_cache(config, model_);  // qfilters' key filters
    cache.expect_positions(S + max_new - 1);
    cache.set_question_length(s.question_tokens);  // finch's window; other methods ignore it
    engine::Transformer tf(model_, S, S + max_new - 1);
    engine::Sampler sampler(c.vocab_size, 0.0f, 0.9f, 1);
    std::vector<float> work(static_cast<std::size_t>(c.vocab_size));
    const float* logits = tf.forward(s.ids.data(), S, cache, engine::Logits::kLast);
    tf.release_chunk_buffers();
    TaskRun r;
    std::int32_t prev = s.ids.back();
    while (true) {
      std::copy(logits, logits + c.vocab_size, work.begin());
      const std::int32_t next = sampler.sample(work.data());
      if (std::find(stops_.begin(), stops_.end(), next) != stops_.end()) break;
      const std::string piece = tok_.piece(prev, next);
      const std::size_t nl = piece.find('\n');
      ++r.n_generated;
      if (nl != std::string::npos) {
        r.output += piece.substr(0, nl);
        break;
      }
      r.output += piece;
      if (r.n_generated == max_new) break;
      logits = tf.forward(&next, 1, cache, engine::Logits::kLast);
      prev = next;
    }
    const CacheStats st = cache.stats();
    r.kept_bytes = st.kept_bytes;
    r.full_bytes = st.full_bytes;
    r.score = string_match_all(r.output, s.parts.answers);
    r.seconds = std::chrono::duration<double>(clock::now() - t0).count();
    return r;
  }

 private:
  const engine::Model& model_;
  const engine::Tokenizer& tok_;
  std::vector<std::int32_t> stops_;
};

// The prompt encoder: the chat template's user turn and assistant header, then the answer
// prefix; or, for a model without one, BOS and the plain prompt.
PromptEncoder make_encoder(const engine::Tokenizer& tok,
                           const std::shared_ptr<engine::ChatTemplate>& chat) {
  if (!chat) return [&tok](const PromptText& t) { return tok.encode(t.plain(), true); };
  return [chat](const PromptText& t) {
    // The task's question is content (plain text); the answer prefix is the harness's own.
    std::vector<engine::ChatSpan> spans = chat->render_spans({{"user", t.user}}, 0);
    spans.push_back({t.answer_prefix, false});
    return chat->tokenize(spans, true);
  };
}

bool zero_one(const std::vector<double>& x) {
  return std::all_of(x.begin(), x.end(), [](double v) { return v == 0.0 || v == 1.0; });
}

// The cell's statistics from its samples' runs (paired with the reference's on the same ones).
void fill_cell(TaskCell& cell, const TaskEvalResult& r, const TaskEvalOptions& o,
               std::map<std::int64_t, PairedBootstrap>& boots) {
  std::vector<double> a, ref;
  double kept = 0, ratio = 0, secs = 0;
  for (const std::size_t i : cell.samples) {
    const TaskRun& run = r.runs[cell.setting][i];
    a.push_back(run.score);
    ref.push_back(r.runs[0][i].score);
    kept += static_cast<double>(run.kept_bytes);
    ratio += static_cast<double>(run.full_bytes) / static_cast<double>(std::max<std::int64_t>(1, run.kept_bytes));
    secs += run.seconds;
  }
  cell.n = static_cast<std::int64_t>(a.size());
  const double n = static_cast<double>(cell.n);
  cell.accuracy = mean_of(a);
  cell.kept_bytes = kept / n;
  cell.compression_ratio = ratio / n;
  cell.seconds = secs / n;
  auto it = boots.find(cell.n);
  if (it == boots.end()) {
    it = boots.emplace(cell.n, PairedBootstrap(cell.n, o.bootstrap_samples, o.bootstrap_seed)).first;
  }
  cell.wilson = zero_one(a);
  if (cell.wilson) {
    const double hits = std::accumulate(a.begin(), a.end(), 0.0);
    cell.ci = wilson_interval(static_cast<std::int64_t>(hits), cell.n);
  } else {
    cell.ci = it->second.interval(a);
  }
  const double ref_acc = mean_of(ref);
  cell.relative = ref_acc > 0 ? cell.accuracy / ref_acc : std::nan("");
  cell.delta_ci = it->second.paired_difference(a, ref);
}

void compute_cells(TaskEvalResult& r, const std::vector<SampleKey>& keys) {
  std::map<std::int64_t, PairedBootstrap> boots;
  const TaskEvalOptions& o = r.options;
  for (std::size_t s = 0; s < r.settings.size(); ++s) {
    for (std::size_t t = 0; t < o.tasks.size(); ++t) {
      const bool depth = task_spec(o.tasks[t]).has_depth;
      for (std::size_t l = 0; l < r.lengths.size(); ++l) {
        if (!r.settings[s].skipped[r.settings[s].at(t, l)].empty()) continue;
        std::vector<std::int64_t> depths = depth ? o.depths : std::vector<std::int64_t>{};
        depths.push_back(-1);
        for (const std::int64_t d : depths) {
          TaskCell cell;
          cell.setting = s;
          cell.task = t;
          cell.length = l;
          cell.depth = d;
          for (std::size_t i = 0; i < keys.size(); ++i) {
            if (keys[i].task == t && keys[i].length == l && (d < 0 || keys[i].depth == d))
              cell.samples.push_back(i);
          }
          fill_cell(cell, r, o, boots);
          r.cells.push_back(std::move(cell));
        }
      }
    }
  }
}

nlohmann::json model_config_json(const engine::ModelConfig& mc) {
  return {{"dim", mc.dim},           {"hidden_dim", mc.hidden_dim}, {"n_layers", mc.n_layers},
          {"n_heads", mc.n_heads},   {"n_kv_heads", mc.n_kv_heads}, {"head_dim", mc.head_dim},
          {"vocab_size", mc.vocab_size}, {"seq_len", mc.seq_len},  {"n_params", mc.n_params()}};
}

void check_lengths(const std::vector<std::int64_t>& lengths, const engine::ModelConfig& mc) {
  for (const std::int64_t l : lengths) {
    if (l > mc.seq_len) {
      bad(fmt::format("--lengths {} exceeds the model's context (seq_len {}): a prompt must fit "
                      "with at least one generated token",
                      l, mc.seq_len));
    }
  }
}

}  // namespace

std::vector<std::int64_t> default_lengths(std::int64_t seq_len) {
  // RULER's rule: the prompt leaves room for the answer (niah's tokens_to_generate, 128, the
  // most any task asks for), so a prompt of the full length L can be answered. A context of
  // 256 or less has no such room; L is then the context.
  constexpr std::int64_t kAnswerRoom = 128;
  const std::int64_t l = seq_len > 2 * kAnswerRoom
                             ? std::min<std::int64_t>(seq_len - kAnswerRoom, 4096)
                             : seq_len;
  return {l / 4, l / 2, l};
}

namespace {

// The model's chat template (null for a model without one, e.g. llama2.c); its name in `name`.
std::shared_ptr<engine::ChatTemplate> load_chat(const engine::Model& model,
                                                const engine::Tokenizer& tok, std::string& name) {
  const engine::ModelConfig& mc = model.config();
  const engine::TemplateKind kind = engine::detect_template(
      engine::model_chat_template(model.path(), model.directory(), mc.format));
  name = engine::to_string(kind);
  if (kind == engine::TemplateKind::kPlain) return nullptr;
  return std::make_shared<engine::ChatTemplate>(kind, tok, mc.bos_id, mc.eos_id);
}

// Every sample, made in parallel (each depends on its key only).
void generate_samples(TaskEvalResult& r, const std::vector<SampleKey>& keys,
                      const TaskGenerator& gen, int threads) {
  const TaskEvalOptions& o = r.options;
  r.samples.resize(keys.size());
  run_tasks(static_cast<std::int64_t>(keys.size()), threads, [&](std::int64_t i) {
    const SampleKey& k = keys[static_cast<std::size_t>(i)];
    const TaskSpec& spec = task_spec(o.tasks[k.task]);
    const Haystack h = o.haystack.empty() ? spec.haystack : parse_haystack(o.haystack);
    r.samples[static_cast<std::size_t>(i)] =
        gen.make(spec, h, o.question, r.lengths[k.length], k.depth, k.index);
  });
  for (const SampleKey& k : keys) r.sample_task.push_back(k.task);
}

// The shortest prompt's tokens per task and length ([tasks][lengths] flattened).
std::vector<std::int64_t> shortest_prompts(const TaskEvalResult& r,
                                           const std::vector<SampleKey>& keys) {
  const std::size_t n_lengths = r.lengths.size();
  std::vector<std::int64_t> rows(r.options.tasks.size() * n_lengths,
                                 std::numeric_limits<std::int64_t>::max());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    std::int64_t& v = rows[keys[i].task * n_lengths + keys[i].length];
    v = std::min(v, static_cast<std::int64_t>(r.samples[i].ids.size()));
  }
  return rows;
}

std::string setting_text(const TaskSetting& s) {
  if (s.target_ratio > 0) return fmt::format("{} at ratio {:g}", s.series, s.target_ratio);
  if (s.budget > 0) return fmt::format("{} at budget {}", s.series, s.budget);
  return s.series;
}

// Every setting on every sample, in parallel; a progress line when a setting is done.
void run_settings(TaskEvalResult& r, const std::vector<SampleKey>& keys, const SampleRunner& runner,
                  int threads, std::ostream* progress) {
  const std::size_t N = keys.size(), P = r.settings.size();
  r.runs.assign(P, std::vector<TaskRun>(N));
  std::vector<std::size_t> left(P, N);
  std::mutex m;
  const auto t0 = std::chrono::steady_clock::now();
  run_tasks(static_cast<std::int64_t>(P * N), threads, [&](std::int64_t t) {
    const std::size_t p = static_cast<std::size_t>(t) / N, i = static_cast<std::size_t>(t) % N;
    const SampleKey& k = keys[i];
    const TaskSetting& set = r.settings[p];
    const std::size_t slot = set.at(k.task, k.length);
    if (set.skipped[slot].empty()) {
      r.runs[p][i] = runner.run(r.samples[i], task_spec(r.options.tasks[k.task]), set.configs[slot]);
    }
    std::lock_guard<std::mutex> lk(m);
    if (--left[p] == 0 && progress != nullptr) {
      *progress << fmt::format("eval --task: [{}/{}] {} done\n", p + 1, P, setting_text(set))
                << std::flush;
    }
  });
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TaskEvalResult run_task_eval(const TaskEvalOptions& o, std::ostream* progress) {
  check_options(o);
  TaskEvalResult r;
  r.options = o;
  const CacheConfig reference = CacheConfig::parse(o.reference);
  for (const auto& s : o.methods) CacheConfig::parse(s);  // bad specs fail before loading
  const engine::Model model = engine::Model::load(o.model);
  const auto tok = engine::load_tokenizer(o.tokenizer, model);
  const engine::ModelConfig& mc = model.config();
  r.model_format = mc.format;
  r.tokenizer_path = tok->path();
  r.model_config = model_config_json(mc);
  r.lengths = o.lengths.empty() ? default_lengths(mc.seq_len) : o.lengths;
  check_lengths(r.lengths, mc);
  const std::shared_ptr<engine::ChatTemplate> chat = load_chat(model, *tok, r.chat_template);
  r.essay = o.text.empty() ? "built-in" : o.text;
  const std::string essay = o.text.empty() ? default_essay_text() : engine::read_text_file(o.text);
  const TaskGenerator gen(make_encoder(*tok, chat), essay, task_words(), o.seed);
  if (o.before_run) o.before_run(mc);

  const int threads = o.threads > 0 ? o.threads : engine::threads();
  const std::vector<SampleKey> keys = sample_keys(o, r.lengths.size());
  generate_samples(r, keys, gen, threads);
  r.settings = plan_settings(o, reference, mc, shortest_prompts(r, keys), r.lengths.size());
  if (progress != nullptr) *progress << fmt::format("eval --task: {} samples generated\n", keys.size());
  run_settings(r, keys, SampleRunner(model, *tok, chat ? chat->end_of_turn() : -1), threads, progress);
  compute_cells(r, keys);
  return r;
}

}  // namespace vq::eval
