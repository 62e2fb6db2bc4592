// `bench perturb`: its options checked and its rows planned (eval/perturb/perturb_bench.h).
#include "eval/perturb/perturb_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "policies/spec_budget.h"
#include "veloxquant/errors.h"
#include "veloxquant/registry.h"

namespace vq::eval {

Feed parse_feed(const std::string& name) {
  if (name == "prefill") return Feed::kPrefill;
  if (name == "stream") return Feed::kStream;
  throw Error(ErrorCode::kInvalidArgument,
              "unknown feed '" + name + "'; allowed: prefill, stream");
}

const char* to_string(Feed feed) noexcept {
  return feed == Feed::kPrefill ? "prefill" : "stream";
}

namespace {

[[noreturn]] void bad_option(const std::string& message) {
  throw Error(ErrorCode::kInvalidArgument, "bench perturb: " + message);
}

void check_range(const char* flag, std::int64_t value, std::int64_t lo, std::int64_t hi) {
  if (value < lo || value > hi) {
    bad_option(fmt::format("{} must be in [{}, {}], got {}", flag, lo, hi, value));
  }
}

void check_list(const char* flag, const std::vector<std::int64_t>& values, std::int64_t lo,
                std::int64_t hi) {
  if (values.empty()) bad_option(fmt::format("{} needs at least one value", flag));
  for (std::size_t i = 0; i < values.size(); ++i) {
    check_range(flag, values[i], lo, hi);
    for (std::size_t j = 0; j < i; ++j) {
      if (values[j] == values[i]) bad_option(fmt::format("{} lists {} twice", flag, values[i]));
    }
  }
}


// A --method spec with every --budget applied (or the config itself without a budget).
struct PlannedMethod {
  std::string arg;
  std::vector<CacheConfig> configs;
};

PlannedMethod plan_method(const std::string& spec, const std::vector<std::int64_t>& budgets,
                          bool budgets_given) {
  CacheConfig config;
  try {
    config = CacheConfig::parse(spec);
  } catch (const Error& e) {
    throw Error(e.code(), "bench perturb: --method '" + spec + "': " + e.what());
  }
  PlannedMethod m{spec, {}};
  if (!has_token_budget(config)) {
    m.configs.push_back(config);
    return m;
  }
  if (spec_writes_budget(spec)) {
    // The spec's own budget wins over --budget's default; an explicit --budget list other
    // than that one budget contradicts it (policies/spec_budget.h).
    const std::int64_t written = token_budget(config);
    if (budgets_given && (budgets.size() != 1 || budgets[0] != written)) {
      std::string list;
      for (const std::int64_t b : budgets) list += (list.empty() ? "" : ",") + std::to_string(b);
      throw Error(ErrorCode::kInvalidArgument,
                  "bench perturb: --budget " + list + " contradicts budget " +
                      std::to_string(written) + " written in the spec '" + spec +
                      "'; drop one of them");
    }
    m.configs.push_back(config);
    return m;
  }
  for (const std::int64_t budget : budgets) {
    try {
      m.configs.push_back(with_token_budget(config, budget));
    } catch (const Error& e) {
      throw Error(ErrorCode::kInvalidConfig,
                  fmt::format("bench perturb: --budget {} does not fit --method '{}': {}", budget,
                              spec, e.what()));
    }
  }
  return m;
}

// Two specs name the same configuration (also when they differ only in their budget, which
// --budget overrides): their rows would be duplicates.
void check_distinct(const std::vector<PlannedMethod>& methods) {
  for (std::size_t i = 0; i < methods.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      for (const CacheConfig& a : methods[i].configs) {
        for (const CacheConfig& b : methods[j].configs) {
          if (a == b) {
            bad_option("--method '" + methods[i].arg + "' and --method '" + methods[j].arg +
                       "' give the same configuration (" + a.spec() + ")");
          }
        }
      }
    }
  }
}

}  // namespace

double perturb_bytes(const PerturbOptions& o) {
  // Every seed's K/V of one sequence length is held at once (fp32), plus the full-cache
  // references (up to fp32 again): 16 bytes per element at most; and every seed's probes
  // (fp32). The sizes are range-checked by plan_perturb, so this is far from overflow.
  const std::int64_t max_seq = o.seqs.empty() ? 0 : *std::max_element(o.seqs.begin(), o.seqs.end());
  const auto d = [](std::int64_t v) { return static_cast<double>(v); };
  return d(o.seeds) * d(o.heads) * d(o.head_dim) * (16.0 * d(max_seq) + 4.0 * d(o.probes));
}

std::vector<PerturbCase> plan_perturb(const PerturbOptions& o) {
  if (o.methods.empty()) bad_option("needs at least one --method SPEC");
  check_list("--seq", o.seqs, kMinSyntheticTokens, kMaxBenchTokens);
  check_list("--budget", o.budgets, 1, kMaxBenchTokens);
  check_range("--heads", o.heads, 1, kMaxBenchHeads);
  check_range("--head-dim", o.head_dim, 1, kMaxBenchHeadDim);
  check_range("--probes", o.probes, 1, kMaxBenchProbes);
  check_range("--seeds", o.seeds, 1, kMaxBenchSeeds);
  const std::int64_t max_seq = *std::max_element(o.seqs.begin(), o.seqs.end());
  const double bytes = perturb_bytes(o);
  if (bytes > static_cast<double>(kMaxBenchBytes)) {
    bad_option(fmt::format(
        "--seeds {} x --heads {} x (--seq {} + --probes {}) x --head-dim {} needs about {:.1f} "
        "GiB of synthetic K/V at once; the limit is {} GiB (use fewer seeds, probes or a "
        "shorter sequence)",
        o.seeds, o.heads, max_seq, o.probes, o.head_dim, bytes / (1 << 30), kMaxBenchBytes >> 30));
  }

  // Parse every spec and apply every budget first, so a bad one fails before anything runs.
  std::vector<PlannedMethod> methods;
  for (const std::string& spec : o.methods) methods.push_back(plan_method(spec, o.budgets, o.budgets_given));
  check_distinct(methods);
  std::vector<PerturbCase> cases;
  for (const std::int64_t seq : o.seqs) {
    for (const PlannedMethod& m : methods) {
      for (const CacheConfig& config : m.configs) cases.push_back(PerturbCase{m.arg, config, seq});
    }
  }
  return cases;
}

}  // namespace vq::eval
