// Every registered method's every field at the edges of its documented range (min, min + 1,
// max - 1, max, for ints; min, max and the midpoint for floats; every choice of an enum and
// bool), alone and combined with each non-default choice of the method's enum fields (so
// demote_budget is tried with demote=kivi2, quantize fields with quantize=kivi4, ...).
//
// The contract under test (issue 23): a value inside a field's documented range either is
// refused by validate() with Error(kInvalidConfig) naming a field (a cross-field guard), or
// the cache built from it runs: prefill, single-token decode steps, with and without attention
// probabilities, and reads its rows back, without an internal error (VQ_ASSERT aborts; a
// SIGABRT handler names the spec that did it) and without any other exception.
#include <gtest/gtest.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <unistd.h>

#include "test_util.h"
#include "veloxquant/registry.h"

namespace vq {
namespace {

char g_current[512];  // the spec being run, for the abort handler

extern "C" void report_abort(int) {
  const char msg[] = "\ntest_field_edges: aborted while running spec: ";
  (void)!write(2, msg, sizeof msg - 1);
  (void)!write(2, g_current, std::strlen(g_current));
  (void)!write(2, "\n", 1);
  std::signal(SIGABRT, SIG_DFL);
}

std::vector<FieldValue> edge_values(const FieldSpec& f) {
  std::vector<FieldValue> out;
  switch (f.type) {
    case FieldType::kInt: {
      const auto lo = static_cast<std::int64_t>(f.min), hi = static_cast<std::int64_t>(f.max);
      if (!f.choices.empty()) {
        for (const auto& c : f.choices) out.emplace_back(std::int64_t{std::stoll(c)});
        break;
      }
      for (const std::int64_t v : {lo, lo + 1, hi - 1, hi})
        if (v >= lo && v <= hi) out.emplace_back(v);
      break;
    }
    case FieldType::kFloat:
      for (const double v : {f.min, f.max, 0.5 * (f.min + f.max)}) out.emplace_back(v);
      break;
    case FieldType::kBool:
      out.emplace_back(true);
      out.emplace_back(false);
      break;
    case FieldType::kEnum:
      for (const auto& c : f.choices) out.emplace_back(c);
      break;
  }
  return out;
}

// Runs the config through both feeding paths; returns "" or what went wrong.
std::string run_config(const CacheConfig& config) {
  constexpr std::int64_t H = 2, D = 32, S = 40;  // D: a whole ggml block (kv_dtype=q8_0|q4_0)
  const test::KV kv(1, H, S, D, 7);
  try {
    // update() passes no probabilities: a documented usage error with source=attention.
    const bool needs_probs = config.has("source") && config.get_enum("source") == "attention";
    if (!needs_probs) {
      LayerCache a(config, LayerShape{H, D, 0, 0, 1});
      test::give_key_filters(a, H, D);
      test::feed(a, kv, 16, 0, 16);
      test::feed(a, kv, 1, 16, S);
      for (std::int64_t h = 0; h < H; ++h) (void)a.stored(0, h);
      (void)a.stats();
    }

    LayerCache b(config, LayerShape{H, D, 0, 0, 1});
    test::give_key_filters(b, H, D);
    std::vector<float> probs;
    for (std::int64_t t = 0; t < S;) {
      const std::int64_t n = t == 0 ? 16 : 1;
      const StepView view = b.begin_step(kv.keys(t, n), kv.values(t, n));
      const std::int64_t R = view.n_rows();
      probs.assign(static_cast<std::size_t>(H * n * R), 0.0f);
      for (std::int64_t q = 0; q < H; ++q) {
        const HeadRows& hr = view.head(0, q);
        for (std::int64_t s = 0; s < n; ++s) {
          std::int64_t visible = 0;
          for (std::int64_t r = 0; r < hr.n_rows; ++r) visible += hr.positions[r] <= t + s;
          for (std::int64_t r = 0; r < hr.n_rows; ++r) {
            probs[static_cast<std::size_t>((q * n + s) * R + r)] =
                hr.positions[r] <= t + s ? 1.0f / static_cast<float>(visible) : 0.0f;
          }
        }
      }
      const AttentionRef att{probs.data(), 1, H, n, R};
      b.end_step(&att);
      t += n;
    }
    (void)b.stats();
  } catch (const Error& e) {
    return std::string("Error: ") + e.what();
  } catch (const std::exception& e) {
    return std::string("std::exception: ") + e.what();
  }
  return {};
}

TEST(FieldEdges, EveryFieldAtItsRangeEdgesRunsOrIsRefused) {
  std::signal(SIGABRT, report_abort);
  std::int64_t ran = 0, refused = 0;
  for (const MethodInfo& m : registry()) {
    // Bases: the defaults, and the defaults with one enum field at one non-default choice.
    std::vector<CacheConfig> bases{CacheConfig(m.id)};
    for (const FieldSpec& f : m.fields) {
      if (f.type != FieldType::kEnum) continue;
      for (const auto& c : f.choices) {
        if (FieldValue(c) == f.default_value) continue;
        CacheConfig b(m.id);
        b.set(f.name, c);
        try {
          b.validate();
        } catch (const Error&) {
          continue;  // this choice needs other fields set (a guard): not a base
        }
        bases.push_back(b);
      }
    }
    for (const CacheConfig& base : bases) {
      for (const FieldSpec& f : m.fields) {
        for (const FieldValue& v : edge_values(f)) {
          CacheConfig c = base;
          c.set(f.name, v);
          const std::string spec = c.spec();
          std::snprintf(g_current, sizeof g_current, "%s", spec.c_str());
          try {
            c.validate();
          } catch (const Error& e) {
            EXPECT_EQ(e.code(), ErrorCode::kInvalidConfig) << spec << ": " << e.what();
            ++refused;
            continue;
          }
          const std::string why = run_config(c);
          EXPECT_EQ(why, "") << spec;
          ++ran;
        }
      }
    }
  }
  std::signal(SIGABRT, SIG_DFL);
  // Every method ran at several edges (a registry change that made everything refuse would
  // otherwise pass silently).
  EXPECT_GT(ran, 20 * static_cast<std::int64_t>(registry().size()));
  std::printf("field edges: %lld configs ran, %lld refused by a guard\n",
              static_cast<long long>(ran), static_cast<long long>(refused));
}

}  // namespace
}  // namespace vq
