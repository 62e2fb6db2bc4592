// `veloxquant demo`: every method on synthetic K/V, printing what each keeps and what it costs.
#include <fmt/format.h>

#include <chrono>
#include <iostream>
#include <optional>

#include "cli.h"
#include "eval/perturb/perturb.h"
#include "eval/perturb/perturb_bench.h"
#include "engine/run/qfilters_file.h"
#include "engine/run/resources.h"
#include "eval/perturb/synthetic.h"
#include "policies/spec_budget.h"
#include "veloxquant/cache.h"
#include "veloxquant/errors.h"
#include "veloxquant/registry.h"

namespace vq::cli {
namespace {

struct DemoOptions {
  std::vector<std::string> methods;
  std::int64_t seq = 1024, budget = 64, heads = 4, head_dim = 64, probes = 32;
  std::uint64_t seed = 0;
  std::string geometry = "spans";
  bool budget_given = false;  // --budget on the command line: it overrides the specs' budgets
  std::uint64_t max_memory = 0;  // --max-memory; 0: the available memory
};

// Flag ranges (the same as bench perturb's, eval/perturb/perturb_bench.h).
constexpr std::int64_t kMaxTokens = std::int64_t{1} << 20;

void run_demo(const DemoOptions& o) {
  // The flags' ranges are checked by CLI11 (add_demo_command); the products below stay far
  // from overflow (at most 2^8 x 2^20 x 2^10 elements).
  const auto geometry = eval::parse_geometry(o.geometry);
  // The budget rule every command shares (policies/spec_budget.h): a budget written in a spec
  // wins over --budget's default; an explicit --budget contradicting it is an error. All specs
  // are resolved before anything runs.
  std::vector<std::string> specs = o.methods;
  if (specs.empty()) specs = method_ids();
  std::vector<CacheConfig> configs;
  std::vector<std::string> skipped;  // why a method cannot run at the default budget
  for (const std::string& spec : specs) {
    const bool written = spec_writes_budget(spec);
    try {
      configs.push_back(config_with_flag_budget(
          spec, o.budget_given ? std::optional<std::int64_t>(o.budget) : std::nullopt, o.budget));
      skipped.emplace_back();
    } catch (const Error& e) {
      // With its other fields at their defaults a method may not take --budget's default (e.g.
      // snapkv's 32-row window needs > 36 rows): say so and go on. A --method spec that does
      // not fit an explicit --budget, or contradicts it, is the user's error.
      if (!o.methods.empty() && (o.budget_given || written)) throw;
      configs.push_back(CacheConfig::parse(spec));
      skipped.push_back(e.what());
    }
  }
  const auto d = [](std::int64_t v) { return static_cast<double>(v); };
  // Synthetic keys, values, probes (fp32), two full-cache references (fp16 and fp32) and the
  // method's cache (fp32 at most).
  const double bytes = 4 * d(o.heads) * d(o.head_dim) * (2 * d(o.seq) + d(o.probes) + 1) +
                       (2 * 2 + 2 * 4 + 2 * 4) * d(o.heads) * d(o.seq) * d(o.head_dim);
  engine::check_memory("demo", bytes,
                     "--heads " + std::to_string(o.heads) + " x --seq " + std::to_string(o.seq) +
                         " x --head-dim " + std::to_string(o.head_dim) +
                         " of synthetic K/V and caches, plus --probes " + std::to_string(o.probes),
                     o.max_memory);
  const eval::SyntheticKV kv =
      eval::make_synthetic(geometry, o.heads, o.seq, o.head_dim, o.probes, o.seed);
  const TensorRef all_k = TensorRef::f32(kv.keys.data(), 1, o.heads, o.seq, o.head_dim);

  // The full cache is the reference for the perturbation column, stored in the method's own
  // kv_dtype (so a method that keeps everything scores exactly 0).
  auto full_cache = [&](DType dtype) {
    CacheConfig c("full");
    c.set("kv_dtype", std::string(to_string(dtype)));
    LayerCache cache(c, LayerShape{o.heads, o.head_dim, 0, 0, 1});
    cache.update(all_k, TensorRef::f32(kv.values.data(), 1, o.heads, o.seq, o.head_dim));
    return cache;
  };
  LayerCache full_f16 = full_cache(DType::kF16), full_f32 = full_cache(DType::kF32);

  std::cout << fmt::format(
      "synthetic K/V: geometry {}, {} tokens fed one at a time, {} KV heads, head_dim {}, "
      "budget {}{}\n\n",
      o.geometry, o.seq, o.heads, o.head_dim, o.budget,
      o.budget_given ? "" : " (where the spec gives none)");
  std::cout << fmt::format("{:<34} {:>9} {:>11} {:>11} {:>11} {:>7} {:>12} {:>10}\n", "method",
                           "kept/head", "kept bytes", "resident", "full bytes", "ratio",
                           "perturbation", "us/token");
  for (std::size_t m = 0; m < configs.size(); ++m) {
    CacheConfig config = configs[m];
    if (!skipped[m].empty()) {
      std::cout << fmt::format("{:<34} skipped: {}\n", config.spec(), skipped[m]);
      continue;
    }
    LayerCache cache(config, LayerShape{o.heads, o.head_dim, 0, 0, 1});
    engine::give_random_key_filters(cache, o.seed);  // qfilters: no model to calibrate
    TensorRef k = all_k, v = TensorRef::f32(kv.values.data(), 1, o.heads, o.seq, o.head_dim);
    k.shape[2] = v.shape[2] = 1;
    const auto t0 = std::chrono::steady_clock::now();
    for (std::int64_t t = 0; t < o.seq; ++t) {
      k.data = kv.keys.data() + t * o.head_dim;
      v.data = kv.values.data() + t * o.head_dim;
      cache.begin_step(k, v);
      cache.end_step();
    }
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                          .count() / static_cast<double>(o.seq);
    const LayerCache& full = config.kv_dtype() == DType::kF32 ? full_f32 : full_f16;
    double pert = 0;
    for (std::int64_t h = 0; h < o.heads; ++h) {
      pert += eval::head_perturbation(kv.probes.data() + h * o.probes * o.head_dim, o.probes,
                                      o.head_dim, full.stored(0, h), cache.stored(0, h));
    }
    pert /= static_cast<double>(o.heads);
    const CacheStats s = cache.stats();
    std::cout << fmt::format("{:<34} {:>9} {:>11} {:>11} {:>11} {:>7.2f} {:>12.4f} {:>10.2f}\n",
                             config.spec(), s.tokens_kept, s.kept_bytes, s.resident_bytes,
                             s.full_bytes, s.compression_ratio, pert, us);
  }
  std::cout << "\nkept bytes = the K/V payload (rows, or codes + scales + zeros + fp16 tail); "
               "resident = every byte the cache keeps between steps (container capacities: "
               "payload, positions, scores, bookkeeping); ratio = full bytes / kept bytes.\n"
               "perturbation = mean over probe queries of 1 - cos(full-cache attention output, "
               "compressed output); lower is better.\n";
}

}  // namespace

void add_demo_command(CLI::App& app) {
  auto opts = std::make_shared<DemoOptions>();
  auto* cmd = app.add_subcommand(
      "demo", "Run every method (or --method SPEC ...) on synthetic K/V and print kept tokens, "
              "bytes, compression ratio and output perturbation");
  cmd->add_option("--method", opts->methods,
                  "Method spec ID[:key=value,...]; repeatable (default: every registered method)");
  cmd->add_option("--seq", opts->seq, "Tokens to feed")
      ->capture_default_str()
      ->check(int_range(eval::kMinSyntheticTokens, kMaxTokens));
  cmd->add_option("--budget", opts->budget,
                  "Token budget per KV head where the spec writes none; a spec's own budget=B "
                  "wins over the default, and an explicit --budget contradicting it is an error")
      ->capture_default_str()
      ->check(int_range(2, kMaxTokens));
  cmd->add_option("--heads", opts->heads, "KV heads")
      ->capture_default_str()
      ->check(int_range(1, eval::kMaxBenchHeads));
  cmd->add_option("--head-dim", opts->head_dim, "Head dimension")
      ->capture_default_str()
      ->check(int_range(1, eval::kMaxBenchHeadDim));
  cmd->add_option("--probes", opts->probes, "Probe queries per head")
      ->capture_default_str()
      ->check(int_range(1, eval::kMaxBenchProbes));
  cmd->add_option("--seed", opts->seed, "Data seed")
      ->capture_default_str()
      ->check(uint_range(0, UINT64_MAX));
  add_max_memory_option(*cmd, opts->max_memory);
  cmd->add_option("--geometry", opts->geometry, "spans | shift | stable | planted")
      ->capture_default_str();
  cmd->callback([opts, cmd]() {
    opts->budget_given = cmd->count("--budget") > 0;
    run_demo(*opts);
  });
}

}  // namespace vq::cli
