#include "eval/model/decode_bench.h"

#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string_view>

#include "base/cpu.h"
#include "base/validate.h"
#include "engine/run/qfilters_file.h"
#include "engine/compute/matmul.h"
#include "engine/model/model.h"
#include "engine/compute/parallel.h"
#include "engine/model/shapes.h"
#include "engine/model/transformer.h"
#include "eval/report/plot.h"
#include "engine/run/resources.h"
#include "eval/report/results.h"
#include "policies/spec_budget.h"
#include "veloxquant/builder.h"
#include "veloxquant/errors.h"
#include "veloxquant/registry.h"

namespace vq::eval {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

[[noreturn]] void bad(const std::string& msg) {
  throw Error(ErrorCode::kInvalidArgument, "bench decode: " + msg);
}

std::size_t sz(std::int64_t n) { return static_cast<std::size_t>(n); }

// Counter RNG (splitmix64's finaliser) for the synthetic K/V: uniform in [-1, 1).
inline std::uint64_t mix(std::uint64_t z) noexcept {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
inline float unit(std::uint64_t key) noexcept {
  return static_cast<float>(mix(key) >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

// The spec's own budget wins over the --budget default; an explicit --budget that contradicts
// it is an error (policies/spec_budget.h). --budget 0: every spec's own (the method default
// where the spec writes none).
CacheConfig method_config(const std::string& spec, const DecodeBenchOptions& o) {
  if (o.budget == 0) return CacheConfig::parse(spec);
  return config_with_flag_budget(spec, o.budget_given ? std::optional<std::int64_t>(o.budget)
                                                      : std::nullopt,
                                 o.budget, "--budget");
}

// Fills every layer of `cache` with n positions of synthetic K/V ([1, Hkv, C, D] fp32 chunks,
// uniform in [-1, 1) keyed by (seed, layer, position, head, d)). Every step passes uniform
// attention probabilities over each query's visible rows, as an engine passes its own, so
// source=auto resolves to attention as it does in the decode steps that follow (a cache that
// reads none gets their shape without data, as the engine passes it).
void synthetic_fill(ModelCache& cache, const engine::ModelConfig& c, std::int64_t n,
                    std::int64_t chunk, std::uint64_t seed) {
  const std::int64_t Hkv = c.n_kv_heads, D = c.head_dim, Hq = c.n_heads, G = Hq / Hkv;
  std::vector<float> k(sz(Hkv * chunk * D)), v(k.size()), probs, qbuf;
  for (std::int64_t l = 0; l < c.n_layers; ++l) {
    LayerCache& lc = cache.layer(l);
    for (std::int64_t p0 = 0; p0 < n; p0 += chunk) {
      const std::int64_t S = std::min(chunk, n - p0);
      for (std::int64_t h = 0; h < Hkv; ++h) {
        for (std::int64_t t = 0; t < S; ++t) {
          const std::uint64_t key = mix(seed ^ mix((static_cast<std::uint64_t>(l) << 40) ^
                                                   (static_cast<std::uint64_t>(p0 + t) << 8) ^
                                                   static_cast<std::uint64_t>(h)));
          float* kr = k.data() + (h * S + t) * D;
          float* vr = v.data() + (h * S + t) * D;
          for (std::int64_t d = 0; d < D; ++d) {
            kr[d] = unit(key + 2 * static_cast<std::uint64_t>(d));
            vr[d] = unit(key + 2 * static_cast<std::uint64_t>(d) + 1);
          }
        }
      }
      const StepView view = lc.begin_step(TensorRef::f32(k.data(), 1, Hkv, S, D),
                                          TensorRef::f32(v.data(), 1, Hkv, S, D));
      const std::int64_t R = view.n_rows();
      // A cache that reads queries (expected_attention) gets synthetic pre-RoPE queries and the
      // model's RoPE, as the engine gives them, so the decode steps that follow run its query
      // rule.
      const TensorRef* queries = nullptr;
      TensorRef qref;
      if (lc.reads_queries()) {
        if (!lc.has_rope()) {
          const std::vector<float> freq = engine::rope_inv_freq(c);
          lc.set_rope(RopeRef{freq.data(), D / 2,
                              c.rope == engine::RopeStyle::kInterleaved
                                  ? RopePairing::kInterleaved
                                  : RopePairing::kHalfSplit});
        }
        qbuf.resize(sz(Hq * S * D));
        for (std::int64_t h = 0; h < Hq; ++h) {
          for (std::int64_t t = 0; t < S; ++t) {
            const std::uint64_t key = mix(~seed ^ mix((static_cast<std::uint64_t>(l) << 40) ^
                                                      (static_cast<std::uint64_t>(p0 + t) << 8) ^
                                                      static_cast<std::uint64_t>(h)));
            for (std::int64_t d = 0; d < D; ++d) {
              qbuf[sz((h * S + t) * D + d)] = unit(key + static_cast<std::uint64_t>(d));
            }
          }
        }
        qref = TensorRef::f32(qbuf.data(), 1, Hq, S, D);
        queries = &qref;
      }
      if (!lc.reads_attention()) {
        // A cache that reads no probabilities gets their shape alone, as the engine passes it.
        const AttentionRef shape_only{nullptr, 1, Hq, S, R};
        lc.end_step(&shape_only, queries);
        continue;
      }
      probs.assign(sz(Hq * S * R), 0.0f);
      for (std::int64_t q = 0; q < Hq; ++q) {
        const HeadRows& hr = view.head(0, q / G);  // hr.n_rows <= R (head-wise budgets)
        for (std::int64_t t = 0; t < S; ++t) {
          std::int64_t visible = 0;
          for (std::int64_t r = 0; r < hr.n_rows; ++r) visible += hr.positions[r] <= p0 + t ? 1 : 0;
          float* row = probs.data() + (q * S + t) * R;
          for (std::int64_t r = 0; r < hr.n_rows; ++r)
            row[r] = hr.positions[r] <= p0 + t ? 1.0f / static_cast<float>(visible) : 0.0f;
        }
      }
      const AttentionRef att{probs.data(), 1, Hq, S, R};
      lc.end_step(&att, queries);
    }
  }
}

std::int32_t argmax(const float* x, std::int64_t n) {
  std::int64_t best = 0;
  for (std::int64_t i = 1; i < n; ++i) best = x[i] > x[best] ? i : best;
  return static_cast<std::int32_t>(best);
}

nlohmann::json config_json(const engine::ModelConfig& c, const engine::Model& m) {
  return {{"dim", c.dim},
          {"hidden_dim", c.hidden_dim},
          {"n_layers", c.n_layers},
          {"n_heads", c.n_heads},
          {"n_kv_heads", c.n_kv_heads},
          {"head_dim", c.head_dim},
          {"vocab_size", c.vocab_size},
          {"weights_dtype", c.weights_dtype},
          {"n_params", c.n_params()},
          {"matrix_bytes", m.matrix_bytes()},
          {"owned_bytes", m.owned_bytes()}};
}

// An upper estimate of what a run allocates beyond `model_bytes`: every method's cache and
// transformer at once (they live together within a context), the synthetic fill's K/V and
// probability buffers, and the bandwidth buffer.
double decode_bench_bytes(const DecodeBenchOptions& o, const engine::ModelConfig& c,
                          double model_bytes) {
  const auto d = [](std::int64_t v) { return static_cast<double>(v); };
  const std::int64_t max_ctx = *std::max_element(o.contexts.begin(), o.contexts.end());
  const std::int64_t rows = max_ctx + o.warmup + o.steps + 1;
  const std::int64_t chunk = o.prefill_real ? std::min(o.prefill_chunk, max_ctx) : 1;
  // The chunk's probabilities only for the methods that read them (the engine and the
  // synthetic fill materialise them for those alone).
  double methods = 0;
  bool any_reads = false;
  for (const std::string& m : o.methods) {
    const bool reads = engine::reads_attention(m, c);
    any_reads = any_reads || reads;
    methods += engine::engine_run_bytes(c, chunk, rows, reads);
  }
  const double fill_chunk = d(std::min(o.fill_chunk, max_ctx));
  const double fill = o.prefill_real
                          ? 4.0 * d(max_ctx)
                          : 4.0 * (2.0 * d(c.n_kv_heads) * fill_chunk * d(c.head_dim) +
                                   (any_reads ? d(c.n_heads) * fill_chunk * d(max_ctx) : 0.0));
  return model_bytes + methods + fill + d(o.bandwidth_mib) * 1024.0 * 1024.0;
}

}  // namespace

std::int64_t peak_rss_bytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<std::int64_t>(ru.ru_maxrss) * 1024;
}

std::int64_t current_rss_bytes() {
  std::ifstream in("/proc/self/statm");
  std::int64_t pages = 0, resident = 0;
  if (!(in >> pages >> resident)) return 0;
  return resident * static_cast<std::int64_t>(::sysconf(_SC_PAGESIZE));
}

double measure_read_bandwidth(std::int64_t mib, int threads, int repeats) {
  const std::int64_t n = mib * 1024 * 1024 / 8;
  std::unique_ptr<std::uint64_t[]> buf(new std::uint64_t[sz(n)]);
  for (std::int64_t i = 0; i < n; ++i) buf[sz(i)] = static_cast<std::uint64_t>(i);
  double best = 0;
  std::uint64_t sink = 0;
  for (int rep = 0; rep < repeats; ++rep) {
    const auto t0 = Clock::now();
    std::vector<std::uint64_t> part(sz(threads), 0);
    engine::parallel_for(threads, threads, [&](std::int64_t t0_, std::int64_t t1_) {
      for (std::int64_t t = t0_; t < t1_; ++t) {
        const std::int64_t b = n * t / threads, e = n * (t + 1) / threads;
        std::uint64_t s = 0;
        for (std::int64_t i = b; i < e; ++i) s += buf[sz(i)];
        part[sz(t)] = s;
      }
    });
    std::uint64_t total = 0;
    for (const std::uint64_t p : part) total += p;
    const double secs = seconds_since(t0);
    sink += total;
    best = std::max(best, static_cast<double>(n * 8) / secs);
  }
  if (sink == 1) best += 0;  // keeps the sums observable
  return best;
}

void validate_decode_options(const DecodeBenchOptions& o) {
  if (o.shape.empty() == o.model_path.empty())
    bad("give exactly one of --shape NAME and --model PATH");
  if (!o.shape.empty()) (void)engine::find_shape(o.shape);
  // Every count is bounded, so the sums and products sized from them cannot overflow.
  const auto in_range = [](const std::string& flag, std::int64_t v, std::int64_t lo,
                           std::int64_t hi) { validate::check_int(v, "bench decode: " + flag, lo, hi); };
  if (!o.model_path.empty() && o.layers != 0)
    bad("--layers " + std::to_string(o.layers) + " applies to --shape only, not to --model " +
        o.model_path);
  in_range("--layers", o.layers, 0, kMaxDecodeLayers);
  if (o.contexts.empty()) bad("--context needs at least one value");
  for (const std::int64_t n : o.contexts) in_range("--context", n, 1, kMaxDecodeContext);
  if (o.methods.empty()) bad("--method needs at least one spec");
  in_range("--budget", o.budget, 0, kMaxDecodeContext);
  for (const std::string& m : o.methods) (void)method_config(m, o);
  if (o.threads.empty()) bad("--threads needs at least one value");
  for (const int t : o.threads) in_range("--threads", t, 1, engine::available_cores());
  in_range("--steps", o.steps, 1, kMaxDecodeSteps);
  in_range("--warmup", o.warmup, 0, kMaxDecodeSteps);
  in_range("--fill-chunk", o.fill_chunk, 1, kMaxDecodeContext);
  in_range("--bandwidth-mib", o.bandwidth_mib, 16, kMaxBandwidthMib);
}

namespace {

nlohmann::json decode_settings(const DecodeBenchOptions& o, const engine::Model& model,
                               double load_s) {
  nlohmann::json settings;
  settings["model"] = o.shape.empty() ? o.model_path : "shape:" + o.shape;
  if (!o.shape.empty()) {
    settings["shape_note"] = engine::find_shape(o.shape).note;
    settings["seed"] = o.seed;
  }
  settings["model_config"] = config_json(model.config(), model);
  settings["contexts"] = o.contexts;
  settings["methods"] = o.methods;
  settings["budget"] = o.budget;
  settings["threads"] = o.threads;
  settings["steps"] = o.steps;
  settings["warmup"] = o.warmup;
  settings["fill"] = o.prefill_real ? "prefill" : "synthetic";
  settings["fill_chunk"] = o.fill_chunk;
  if (o.prefill_real) settings["prefill_chunk"] = o.prefill_chunk;
  settings["model_load_ms"] = load_s * 1e3;
  settings["matmul_isa"] = cpu::to_string(cpu::best_isa());
  return settings;
}

using Progress = std::function<void(const DecodeProgress&)>;

// Bandwidth, once per thread count, before the runs (same process, same buffers' size).
std::map<int, double> measure_bandwidths(const DecodeBenchOptions& o, nlohmann::json& settings,
                                         const Progress& progress) {
  std::map<int, double> bandwidth;
  for (const int t : o.threads) {
    bandwidth[t] = measure_read_bandwidth(o.bandwidth_mib, t);
    if (progress) {
      progress({0, 0,
                fmt::format("[decode] read bandwidth at {} thread(s): {:.2f} GB/s", t,
                            bandwidth[t] / 1e9)});
    }
  }
  nlohmann::json bw = nlohmann::json::object();
  for (const auto& [t, b] : bandwidth) bw[std::to_string(t)] = b / 1e9;
  settings["read_bandwidth_gbs"] = bw;
  settings["bandwidth_mib"] = o.bandwidth_mib;
  return bandwidth;
}

// One method's cache at one context, filled and warmed up, with its step times.
struct Run {
  CacheConfig cfg;
  std::string spec;
  std::unique_ptr<ModelCache> cache;
  std::unique_ptr<engine::Transformer> tf;
  std::int32_t token = 0;
  double fill_s = 0;
  std::vector<double> step_s;
};

Run fill_run(const engine::Model& model, const DecodeBenchOptions& o, const std::string& spec,
             std::int64_t n, std::vector<std::int32_t>& prompt) {
  const engine::ModelConfig& c = model.config();
  Run r{method_config(spec, o), spec, nullptr, nullptr, 0, 0, {}};
  r.cache = std::make_unique<ModelCache>(r.cfg, engine::model_shape(c));
  if (!o.head_pattern.empty() && r.cfg.info().head_types) {
    r.cache->set_head_pattern(load_head_pattern(o.head_pattern, c.n_layers, c.n_kv_heads));
  }
  if (r.cache->needs_key_filters()) {
    if (!model.qfilters_path().empty()) {
      engine::attach_key_filters(*r.cache, model);  // --model: its calibrated file
    } else {
      // A named shape has random weights and no file to calibrate: qfilters gets one random unit
      // direction per (layer, KV head) from the bench's seed. Its step cost (one dot product per
      // new key, the same eviction loop) does not depend on the filters' values.
      engine::give_random_key_filters(*r.cache, o.seed);
    }
  }
  // Memory only: the prompt, the warm-up and the timed steps are every position the cache gets,
  // so the stores grow no further than that (a full cache holds exactly its rows).
  r.cache->expect_positions(n + o.warmup + o.steps);
  r.tf = std::make_unique<engine::Transformer>(
      model, o.prefill_real ? std::min(o.prefill_chunk, n) : 1, n + o.warmup + o.steps + 1);
  const auto t_fill = Clock::now();
  r.token = c.bos_id >= 0 ? c.bos_id : 0;
  if (o.prefill_real) {
    // n tokens, deterministic and spread over the vocabulary, in chunks of --prefill-chunk.
    prompt.resize(sz(n));
    for (std::int64_t i = 0; i < n; ++i)
      prompt[sz(i)] = static_cast<std::int32_t>(mix(o.seed + static_cast<std::uint64_t>(i)) %
                                                static_cast<std::uint64_t>(c.vocab_size));
    const float* logits = nullptr;
    for (std::int64_t p = 0; p < n; p += o.prefill_chunk) {
      const std::int64_t S = std::min(o.prefill_chunk, n - p);
      logits = r.tf->forward(prompt.data() + p, S, *r.cache, engine::Logits::kLast);
    }
    r.token = argmax(logits, c.vocab_size);
    r.tf->release_chunk_buffers();  // decoding needs one token's activations, not a chunk's
  } else {
    synthetic_fill(*r.cache, c, n, o.fill_chunk, o.seed);
  }
  r.fill_s = seconds_since(t_fill);
  for (std::int64_t i = 0; i < o.warmup; ++i)
    r.token = argmax(r.tf->forward(&r.token, 1, *r.cache, engine::Logits::kLast), c.vocab_size);
  r.tf->set_timing(true);
  r.tf->reset_times();
  return r;
}

// Rows per KV head, the mean over heads (head-wise budgets make them differ) and layers.
double mean_kept_rows(const ModelCache& cache, std::int64_t n_layers) {
  double kept_rows = 0;
  for (std::int64_t l = 0; l < n_layers; ++l) {
    const std::vector<std::int64_t> per_head = cache.layer(l).stats().tokens_kept_per_head;
    double head_sum = 0;
    for (const std::int64_t k : per_head) head_sum += static_cast<double>(k);
    if (!per_head.empty()) kept_rows += head_sum / static_cast<double>(per_head.size());
  }
  return kept_rows / static_cast<double>(n_layers);
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size();
  return m % 2 ? v[m / 2] : 0.5 * (v[m / 2 - 1] + v[m / 2]);
}

// A run's result row; `full_ms` is the full cache's time at this context (null before it).
nlohmann::json run_row(const Run& r, const engine::Model& model, const DecodeBenchOptions& o,
                       std::int64_t n, int nt, double bandwidth,
                       const std::optional<double>& full_ms) {
  double sum = 0;
  for (const double t : r.step_s) sum += t;
  const engine::StepTimes& st = r.tf->times();
  const CacheStats cs = r.cache->stats();
  const double steps = static_cast<double>(o.steps);
  const double ms = median_of(r.step_s) * 1e3;
  const std::int64_t bytes_read = model.matrix_bytes() + cs.kept_bytes;
  const double bound_ms = static_cast<double>(bytes_read) / bandwidth * 1e3;
  nlohmann::json row = method_json(r.cfg);
  row["method_arg"] = r.spec;
  row["context"] = n;
  row["threads"] = nt;
  row["tokens_per_s"] = 1e3 / ms;
  row["ms_per_token"] = ms;
  row["mean_ms_per_token"] = sum / steps * 1e3;
  row["weights_ms"] = st.matmul / steps * 1e3;
  row["attention_ms"] = st.attention / steps * 1e3;
  row["cache_ms"] = st.cache / steps * 1e3;
  row["other_ms"] = st.other / steps * 1e3;
  row["cache_share"] = st.total() > 0 ? st.cache / st.total() : 0.0;
  row["kept_rows"] = mean_kept_rows(*r.cache, model.config().n_layers);
  row["kept_bytes"] = cs.kept_bytes;
  row["resident_bytes"] = cs.resident_bytes;
  row["full_bytes"] = cs.full_bytes;
  row["compression_ratio"] = cs.compression_ratio;
  row["bytes_read_per_token"] = bytes_read;
  row["bandwidth_bound_ms"] = bound_ms;
  row["bandwidth_ratio"] = ms / bound_ms;
  row["speedup_vs_full"] = full_ms ? nlohmann::json(*full_ms / ms) : nlohmann::json();
  row["fill_ms"] = r.fill_s * 1e3;
  row["peak_rss_bytes"] = peak_rss_bytes();
  row["rss_bytes"] = current_rss_bytes();
  return row;
}

std::string row_progress(const nlohmann::json& row, std::size_t index, std::size_t total) {
  return fmt::format(
      "[decode {}/{}] threads {} context {} {}: {:.2f} ms/token median (mean: weights {:.2f}, "
      "attention {:.2f}, cache {:.2f}), {:.0f} rows, {:.2f}x bandwidth bound, RSS {:.2f} GiB",
      index, total, row["threads"].get<int>(), row["context"].get<std::int64_t>(),
      row["method_arg"].get<std::string>(), row["ms_per_token"].get<double>(),
      row["weights_ms"].get<double>(), row["attention_ms"].get<double>(),
      row["cache_ms"].get<double>(), row["kept_rows"].get<double>(),
      row["bandwidth_ratio"].get<double>(),
      static_cast<double>(row["rss_bytes"].get<std::int64_t>()) / (1 << 30));
}

// Every method at one thread count and context: every cache is filled first; then the timed
// steps alternate between the methods (one step each, round robin), so load from other
// processes falls on all of them alike and the ratios within a context are fair.
void time_context(const engine::Model& model, const DecodeBenchOptions& o, int nt, std::int64_t n,
                  double bandwidth, std::size_t& index, std::size_t total, nlohmann::json& doc,
                  const Progress& progress) {
  const engine::ModelConfig& c = model.config();
  std::vector<std::int32_t> prompt;
  std::vector<Run> runs;
  for (const std::string& spec : o.methods) {
    runs.push_back(fill_run(model, o, spec, n, prompt));
    if (progress) {
      progress({index, total,
                fmt::format("[decode] threads {} context {} {}: filled in {:.1f} s", nt, n, spec,
                            runs.back().fill_s)});
    }
  }
  for (std::int64_t i = 0; i < o.steps; ++i) {
    for (Run& r : runs) {
      const auto t0 = Clock::now();
      r.token = argmax(r.tf->forward(&r.token, 1, *r.cache, engine::Logits::kLast), c.vocab_size);
      r.step_s.push_back(seconds_since(t0));
    }
  }
  // The reference for speedup_vs_full: the full cache in plain rows (kv_dtype f16 or f32;
  // full:kv_dtype=q8_0 is a quantized cache), else any full cache; wherever it is listed.
  std::optional<double> full_ms;
  for (const bool plain_only : {true, false}) {
    for (const Run& r : runs) {
      const std::string& t = r.cfg.get_enum("kv_dtype");
      if (!full_ms && r.cfg.method() == "full" && (!plain_only || t == "f16" || t == "f32"))
        full_ms = median_of(r.step_s) * 1e3;
    }
  }
  for (const Run& r : runs) {
    ++index;
    const nlohmann::json row = run_row(r, model, o, n, nt, bandwidth, full_ms);
    if (progress) progress({index, total, row_progress(row, index, total)});
    doc["rows"].push_back(row);
  }
}

}  // namespace

nlohmann::json run_decode_bench(const DecodeBenchOptions& o, const std::string& command,
                                const Progress& progress) {
  validate_decode_options(o);
  const int max_threads = *std::max_element(o.threads.begin(), o.threads.end());
  engine::set_threads(max_threads);
  const std::int64_t max_ctx = *std::max_element(o.contexts.begin(), o.contexts.end());
  // Every flag is bounded (validate_decode_options), so these sums cannot overflow.
  const std::int64_t rows_needed = max_ctx + o.warmup + o.steps + 1;
  if (!o.shape.empty()) {
    // The shape's weights are built in memory: refuse before building them.
    engine::ModelConfig sc = engine::find_shape(o.shape).config;
    if (o.layers > 0) sc.n_layers = std::min(o.layers, sc.n_layers);
    else sc.n_layers = engine::find_shape(o.shape).default_layers;
    engine::check_memory("bench decode", decode_bench_bytes(o, sc, engine::model_weight_bytes(sc, o.weight_type)),
                 "the shape's weights, every method's cache and engine buffers at context " +
                     std::to_string(rows_needed) + ", the fill and bandwidth buffers",
                 o.max_memory);
  }
  const auto t_load = Clock::now();
  const engine::Model model =
      o.shape.empty() ? engine::Model::load(o.model_path)
                      : engine::make_random_model(o.shape, {o.seed, o.weight_type, o.layers});
  const double load_s = seconds_since(t_load);
  const engine::ModelConfig& c = model.config();
  if (rows_needed > c.seq_len) {
    // The engine's run state holds rows_needed positions (engine/model/transformer.h).
    bad(fmt::format("--context {} + --warmup {} + --steps {} + 1 = {} positions exceed the "
                    "model's context (seq_len {})",
                    max_ctx, o.warmup, o.steps, rows_needed, c.seq_len));
  }
  engine::check_memory("bench decode", decode_bench_bytes(o, c, 0),
               "every method's cache and engine buffers at context " +
                   std::to_string(rows_needed) + ", the fill and bandwidth buffers (beyond the "
                   "loaded model)",
               o.max_memory);
  nlohmann::json settings = decode_settings(o, model, load_s);
  const std::map<int, double> bandwidth = measure_bandwidths(o, settings, progress);
  nlohmann::json doc = results_envelope("decode", command, settings);
  const std::size_t total = o.threads.size() * o.contexts.size() * o.methods.size();
  std::size_t index = 0;
  for (const int nt : o.threads) {
    engine::set_threads(nt);
    for (const std::int64_t n : o.contexts)
      time_context(model, o, nt, n, bandwidth.at(nt), index, total, doc, progress);
  }
  engine::set_threads(max_threads);
  return doc;
}

std::string decode_plot_svg(const nlohmann::json& doc) {
  const bool several = doc["settings"]["threads"].size() > 1;
  std::map<std::string, Series> series;
  std::vector<std::string> order;
  for (const auto& r : doc["rows"]) {
    std::string label = r["method_arg"].get<std::string>();
    if (several) label += fmt::format(" ({} thr)", r["threads"].get<int>());
    if (!series.count(label)) {
      order.push_back(label);
      series[label].label = label;
    }
    series[label].x.push_back(static_cast<double>(r["context"].get<std::int64_t>()));
    series[label].y.push_back(r["ms_per_token"].get<double>());
  }
  Panel p;
  p.title = doc["settings"]["model"].get<std::string>();
  p.x_label = "context (positions in the cache before decoding)";
  p.y_label = "ms per decoded token";
  p.log_x = true;
  for (const auto& l : order) p.series.push_back(series[l]);
  return line_plot_svg("veloxquant bench decode: ms/token vs context", {p}, 1);
}

}  // namespace vq::eval
