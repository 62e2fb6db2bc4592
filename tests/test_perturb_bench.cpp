// The perturbation benchmark: the metric, the harness (bench perturb) and the synthetic
// geometries it runs on.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "eval/perturb/perturb.h"
#include "eval/perturb/perturb_bench.h"
#include "eval/perturb/synthetic.h"
#include "test_util.h"

namespace vq {
namespace {

using eval::Geometry;
using eval::PerturbOptions;

PerturbOptions small_options(std::vector<std::string> methods, Geometry g = Geometry::kSpans) {
  PerturbOptions o;
  o.methods = std::move(methods);
  o.seqs = {96};
  o.budgets = {24, 48};
  o.heads = 2;
  o.head_dim = 16;
  o.probes = 6;
  o.seeds = 3;
  o.geometry = g;
  return o;
}

// Removes every timing field (names ending in _us or _ms), recursively.
void strip_timing(nlohmann::json& j) {
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end();) {
      const std::string& k = it.key();
      const bool timing = k.size() > 3 && (k.compare(k.size() - 3, 3, "_us") == 0 ||
                                           k.compare(k.size() - 3, 3, "_ms") == 0);
      if (timing) {
        it = j.erase(it);
      } else {
        strip_timing(*it);
        ++it;
      }
    }
  } else if (j.is_array()) {
    for (auto& x : j) strip_timing(x);
  }
}

const nlohmann::json& row_of(const nlohmann::json& doc, const std::string& arg, std::int64_t seq,
                             std::int64_t budget) {
  for (const auto& r : doc["rows"]) {
    if (r["method_arg"] == arg && r["seq"] == seq &&
        (r["budget"].is_null() ? budget < 0 : r["budget"] == budget)) {
      return r;
    }
  }
  ADD_FAILURE() << "no row " << arg << " seq " << seq << " budget " << budget;
  static const nlohmann::json none;
  return none;
}

TEST(PerturbMetric, OneMinusCosHandCases) {
  const float a[2] = {1, 0}, b[2] = {1, 1}, c[3] = {1, 2, 3}, d[3] = {-2, -4, -6};
  const float z[3] = {0, 0, 0};
  EXPECT_NEAR(eval::one_minus_cos(a, b, 2), 1.0 - 1.0 / std::sqrt(2.0), 1e-12);
  EXPECT_NEAR(eval::one_minus_cos(c, d, 3), 2.0, 1e-12);  // opposite directions
  EXPECT_EQ(eval::one_minus_cos(c, c, 3), 0.0);
  EXPECT_EQ(eval::one_minus_cos(z, z, 3), 0.0);
  EXPECT_EQ(eval::one_minus_cos(z, c, 3), 1.0);
}

TEST(PerturbMetric, AttentionOutputHandCase) {
  // D = 1, so the scale is 1: q = 1 and keys 0, ln 3 give weights 1/4, 3/4; values 4, 8 -> 7.
  const float keys[2] = {0.0f, std::log(3.0f)}, values[2] = {4.0f, 8.0f};
  const std::int32_t pos[2] = {0, 1};
  const HeadRows rows{keys, values, pos, DType::kF32, 2, 1};
  const float q = 1.0f;
  float out = 0;
  eval::attention_output(&q, rows, 1, &out);
  EXPECT_NEAR(out, 7.0f, 1e-5f);
  // One row of the two: the output is that row's value; against the full output 7 (a 1-D
  // vector of the same sign) 1 - cos is 0, against a negative value it is 2.
  const HeadRows first{keys, values, pos, DType::kF32, 1, 1};
  const float neg_values[1] = {-1.0f};
  const HeadRows negative{keys, neg_values, pos, DType::kF32, 1, 1};
  EXPECT_NEAR(eval::perturbation_vs(&q, 1, 1, &out, first), 0.0, 1e-12);
  EXPECT_NEAR(eval::perturbation_vs(&q, 1, 1, &out, negative), 2.0, 1e-12);
  // Two probes over D = 2: the mean of the two per-probe values.
  const float k2[4] = {1, 0, 0, 1}, v2[4] = {1, 0, 0, 1};
  const HeadRows two{k2, v2, pos, DType::kF32, 2, 2};
  const HeadRows one{k2, v2, pos, DType::kF32, 1, 2};
  const float probes[4] = {10, 0, 0, 10};  // each attends (almost) only to its own row
  std::vector<float> ref(4);
  eval::attention_outputs(probes, 2, 2, two, ref.data());
  const double p0 = eval::one_minus_cos(ref.data(), v2, 2), p1 = eval::one_minus_cos(ref.data() + 2, v2, 2);
  EXPECT_NEAR(eval::perturbation_vs(probes, 2, 2, ref.data(), one), (p0 + p1) / 2, 1e-12);
  EXPECT_GT(p1, 0.9);  // probe 1 loses the row it attends to
}

TEST(PerturbBench, ZeroWhenTheBudgetCoversTheSequence) {
  // kv_dtype=f32 checks that the reference is a full cache of the method's own dtype.
  PerturbOptions o = small_options({"full", "cam", "cam:merge_gate=false,kv_dtype=f32", "h2o",
                                    "tova", "streaming_llm", "morphkv:window=4"});
  o.seqs = {48, 96};
  o.budgets = {96, 24};
  const nlohmann::json doc = eval::run_perturb(o, "test");
  for (const auto& r : doc["rows"]) {
    const bool covers = r["budget"].is_null() || r["budget"].get<std::int64_t>() >= r["seq"];
    for (const auto& p : r["perturbation_per_seed"]) {
      if (covers) {
        EXPECT_EQ(p.get<double>(), 0.0) << r["method"] << " seq " << r["seq"];
      } else {
        EXPECT_GT(p.get<double>(), 0.01) << r["method"] << " seq " << r["seq"];
      }
    }
  }
  // Byte accounting of a row that evicts: 2 heads x 24 rows x 16 dims x (K + V) x 2 bytes.
  const auto& cam = row_of(doc, "cam", 96, 24);
  EXPECT_EQ(cam["kept_tokens"], 24);
  EXPECT_EQ(cam["kept_bytes"], 2 * 24 * 16 * 2 * 2);
  EXPECT_EQ(cam["full_bytes"], 2 * 96 * 16 * 2 * 2);
  EXPECT_DOUBLE_EQ(cam["compression_ratio"].get<double>(), 4.0);
  EXPECT_EQ(cam["evictions"], 2 * (96 - 24));
}

TEST(PerturbBench, IdenticalSeedsGiveIdenticalJson) {
  for (const Geometry g :
       {Geometry::kSpans, Geometry::kShift, Geometry::kStable, Geometry::kPlanted}) {
    PerturbOptions o = small_options({"cam", "cam:merge=mean,merge_gate=false", "h2o:grace=4",
                                      "morphkv:window=2", "full"},
                                     g);
    nlohmann::json a = eval::run_perturb(o, "veloxquant bench perturb ...");
    nlohmann::json b = eval::run_perturb(o, "veloxquant bench perturb ...");
    EXPECT_TRUE(a["rows"][1].contains("time_per_token_us"));
    strip_timing(a);
    strip_timing(b);
    EXPECT_FALSE(a["rows"][1].contains("time_per_token_us"));
    EXPECT_EQ(a.dump(), b.dump()) << eval::to_string(g);
    // Data seed s is seed s whatever the count: two seeds reproduce the first two of three.
    o.seeds = 2;
    const nlohmann::json c = eval::run_perturb(o, "x");
    for (std::size_t i = 0; i < c["rows"].size(); ++i) {
      EXPECT_EQ(c["rows"][i]["perturbation_per_seed"][0], a["rows"][i]["perturbation_per_seed"][0]);
      EXPECT_EQ(c["rows"][i]["perturbation_per_seed"][1], a["rows"][i]["perturbation_per_seed"][1]);
    }
    // Different data seeds give different numbers (the seeds do reach the data).
    const auto& per_seed = a["rows"][0]["perturbation_per_seed"];
    EXPECT_NE(per_seed[0], per_seed[1]);
  }
}

TEST(PerturbBench, CamDropEqualsH2OPaperRule) {
  for (const Geometry g : {Geometry::kSpans, Geometry::kShift, Geometry::kPlanted}) {
    for (const eval::Feed feed : {eval::Feed::kPrefill, eval::Feed::kStream}) {
      // cam:merge=drop is its H2O base with the same fields; the seed library's degenerate
      // setting (grace 0, decay 1) written out on both sides.
      PerturbOptions o =
          small_options({"cam:grace=0,decay=1,merge=drop", "h2o:grace=0,decay=1", "h2o"}, g);
      o.feed = feed;
      const nlohmann::json doc = eval::run_perturb(o, "test");
      for (const std::int64_t b : o.budgets) {
        const auto& cam = row_of(doc, "cam:grace=0,decay=1,merge=drop", 96, b);
        const auto& h2o = row_of(doc, "h2o:grace=0,decay=1", 96, b);
        EXPECT_EQ(cam["perturbation_per_seed"], h2o["perturbation_per_seed"]) << b;
        EXPECT_EQ(cam["kept_bytes"], h2o["kept_bytes"]);
        EXPECT_EQ(cam["merges"], 0);
        // h2o's defaults (a recent window of half the budget, decay 0.98) are a different rule:
        // the check can fail.
        EXPECT_NE(cam["perturbation_per_seed"], row_of(doc, "h2o", 96, b)["perturbation_per_seed"]);
      }
    }
  }
}

TEST(PerturbBench, PrefillAndStreamKeepTheSameRows) {
  // Contract 4 (a chunk decides like single steps), seen through the benchmark.
  PerturbOptions o = small_options({"cam", "cam:merge_gate=false", "tova", "morphkv:window=3"});
  const nlohmann::json prefill = eval::run_perturb(o, "test");
  o.feed = eval::Feed::kStream;
  const nlohmann::json stream = eval::run_perturb(o, "test");
  ASSERT_EQ(prefill["rows"].size(), stream["rows"].size());
  for (std::size_t i = 0; i < prefill["rows"].size(); ++i) {
    EXPECT_EQ(prefill["rows"][i]["perturbation_per_seed"], stream["rows"][i]["perturbation_per_seed"]);
    EXPECT_EQ(prefill["rows"][i]["merges"], stream["rows"][i]["merges"]);
    EXPECT_EQ(stream["rows"][i]["feed"], "stream");
  }
}

TEST(PerturbBench, ValidatesEverythingBeforeRunning) {
  using test::expect_error;
  auto plan = [](PerturbOptions o) { return [o] { eval::plan_perturb(o); }; };
  PerturbOptions o = small_options({"cam"});
  EXPECT_EQ(eval::plan_perturb(o).size(), 2u);
  PerturbOptions bad = o;
  bad.methods.clear();
  expect_error(plan(bad), ErrorCode::kInvalidArgument, {"at least one --method"});
  bad = o;
  bad.seqs.clear();
  expect_error(plan(bad), ErrorCode::kInvalidArgument, {"--seq needs at least one value"});
  bad = o;
  bad.seqs = {64, 7};
  expect_error(plan(bad), ErrorCode::kInvalidArgument, {"--seq must be in [8,", "got 7"});
  bad = o;
  bad.budgets = {32, 0};
  expect_error(plan(bad), ErrorCode::kInvalidArgument, {"--budget must be in [1,", "got 0"});
  bad = o;
  bad.budgets = {32, 64, 32};
  expect_error(plan(bad), ErrorCode::kInvalidArgument, {"--budget lists 32 twice"});
  bad = o;
  bad.heads = 0;
  expect_error(plan(bad), ErrorCode::kInvalidArgument, {"--heads must be in [1,"});
  bad = o;
  bad.seeds = -1;
  expect_error(plan(bad), ErrorCode::kInvalidArgument, {"--seeds", "got -1"});
  bad = o;
  bad.probes = 0;
  expect_error(plan(bad), ErrorCode::kInvalidArgument, {"--probes"});
  bad = o;
  bad.head_dim = 5000;
  expect_error(plan(bad), ErrorCode::kInvalidArgument, {"--head-dim", "got 5000"});
  bad = o;
  bad.seqs = {1 << 20};
  bad.seeds = 100;
  expect_error(plan(bad), ErrorCode::kInvalidArgument, {"GiB of synthetic K/V", "limit is 4 GiB"});
  // A fixed grace of 16 + 4 sinks needs a budget above 20.
  bad = small_options({"cam", "h2o:grace=16"});
  bad.budgets = {64, 16};
  expect_error(plan(bad), ErrorCode::kInvalidConfig,
               {"--budget 16", "--method 'h2o:grace=16'", "h2o_grace"});
  bad = small_options({"cam:budgett=3"});
  expect_error(plan(bad), ErrorCode::kInvalidSpec, {"--method 'cam:budgett=3'", "unknown key"});
  bad = small_options({"nope"});
  expect_error(plan(bad), ErrorCode::kUnknownMethod, {"--method 'nope'", "known methods"});
  bad = small_options({"cam", "cam:merge=mean"});
  expect_error(plan(bad), ErrorCode::kInvalidArgument, {"same configuration"});
  // The spec's own budget wins over --budget's default; an explicit --budget contradicting it
  // is an error naming both (policies/spec_budget.h).
  bad = small_options({"cam:budget=8"});
  bad.budgets_given = true;
  expect_error(plan(bad), ErrorCode::kInvalidArgument,
               {"contradicts budget 8 written in the spec 'cam:budget=8'"});
  PerturbOptions own = small_options({"cam:budget=8"});
  const auto own_cases = eval::plan_perturb(own);
  ASSERT_FALSE(own_cases.empty());
  for (const auto& c : own_cases) EXPECT_EQ(token_budget(c.config), 8);
  // Rows: seq, then method as given, then budget as given; full once per seq.
  PerturbOptions order = small_options({"tova", "full", "cam"});
  order.seqs = {64, 32};
  order.budgets = {16, 8};
  std::vector<std::string> got;
  for (const auto& c : eval::plan_perturb(order)) {
    got.push_back(std::to_string(c.seq) + " " + c.config.spec());
  }
  EXPECT_EQ(got, (std::vector<std::string>{
                     "64 tova:tova_budget=16", "64 tova:tova_budget=8", "64 full",
                     "64 cam:cam_budget=16", "64 cam:cam_budget=8", "32 tova:tova_budget=16",
                     "32 tova:tova_budget=8", "32 full", "32 cam:cam_budget=16",
                     "32 cam:cam_budget=8"}));
}

TEST(PerturbBench, PlotAndTables) {
  PerturbOptions o = small_options({"full", "cam", "cam:merge_gate=false", "tova"}, Geometry::kShift);
  const nlohmann::json doc = eval::run_perturb(o, "test");
  const std::string svg = eval::perturb_plot_svg(doc);
  // Ungated merging is drawn dashed, nothing else is (full is left out: perturbation 0): one
  // dashed line in each of the two panels (perturbation, late-topic fraction).
  std::size_t dashed = 0;
  for (std::size_t at = svg.find("stroke-dasharray=\"5,3\" points"); at != std::string::npos;
       at = svg.find("stroke-dasharray=\"5,3\" points", at + 1)) {
    ++dashed;
  }
  EXPECT_EQ(dashed, 2u);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("seq 96"), std::string::npos);
  EXPECT_NE(svg.find("late-topic fraction"), std::string::npos);
  EXPECT_NE(svg.find(">tova<"), std::string::npos);
  EXPECT_NE(svg.find("not drawn (perturbation 0): full"), std::string::npos);
  const std::string md = eval::perturb_markdown({doc});
  EXPECT_NE(md.find("| method | 96 / 24 | 96 / 48 |"), std::string::npos) << md;
  const auto& r = row_of(doc, "tova", 96, 48);
  const std::string cell = fmt::format("{:.3f} ± {:.3f}", r["perturbation_mean"].get<double>(),
                                       r["perturbation_std"].get<double>());
  EXPECT_NE(md.find(cell), std::string::npos) << cell << "\n" << md;
  EXPECT_NE(md.find("**Late-topic fraction**"), std::string::npos);
  // Merges of the merging methods only: gated CaM (the paper's window rule on H2O's defaults)
  // merges some evicted rows, not all; ungated it merges every evicted row (the recent window
  // keeps rows after each loser to spread it over). 2 heads x (96 - 24) and x (96 - 48)
  // evictions.
  const std::string merges = md.substr(md.find("**Merges**"));
  const std::string gated = merges.substr(merges.find("| `cam` |"));
  const std::string gated_row = gated.substr(0, gated.find('\n'));
  EXPECT_NE(gated_row.find(" / 144 |"), std::string::npos) << merges;
  EXPECT_NE(gated_row.find(" / 96 |"), std::string::npos) << merges;
  EXPECT_EQ(gated_row.find("| 0 / "), std::string::npos) << gated_row;
  EXPECT_EQ(gated_row.find("| 144 / 144 |"), std::string::npos) << gated_row;
  EXPECT_NE(merges.find("| `cam:merge_gate=false` | 144 / 144 | 96 / 96 |"), std::string::npos);
  EXPECT_EQ(merges.substr(0, merges.find("**Late-topic")).find("tova"), std::string::npos);
  // full has no budget: one row, shown under every budget of its seq.
  EXPECT_NE(md.find("| `full` | 0.000 ± 0.000 | 0.000 ± 0.000 |"), std::string::npos);
  test::expect_error([] { eval::perturb_markdown({nlohmann::json{{"kind", "eval"}}}); },
                     ErrorCode::kInvalidArgument, {"not a perturb result"});
}

// --- geometries -------------------------------------------------------------------------------

double proj(const float* x, const float* u, std::int64_t d) {
  double s = 0;
  for (std::int64_t i = 0; i < d; ++i) s += static_cast<double>(x[i]) * u[i];
  return s;
}

// Share of probe p's full attention (fp32, all tokens) on tokens [t0, t1).
double attention_share(const eval::SyntheticKV& kv, std::int64_t h, std::int64_t p,
                       std::int64_t t0, std::int64_t t1) {
  const std::int64_t D = kv.head_dim;
  std::vector<double> logit(static_cast<std::size_t>(kv.tokens));
  double mx = -1e300;
  for (std::int64_t t = 0; t < kv.tokens; ++t) {
    logit[t] = proj(kv.key(h, t), kv.probe(h, p), D) / std::sqrt(static_cast<double>(D));
    mx = std::max(mx, logit[t]);
  }
  double in = 0, all = 0;
  for (std::int64_t t = 0; t < kv.tokens; ++t) {
    const double w = std::exp(logit[t] - mx);
    all += w;
    if (t >= t0 && t < t1) in += w;
  }
  return in / all;
}

TEST(Synthetic, DeterministicPerHeadAndValidated) {
  const auto a = eval::make_synthetic(Geometry::kShift, 4, 64, 16, 3, 9);
  const auto b = eval::make_synthetic(Geometry::kShift, 4, 64, 16, 3, 9);
  const auto two = eval::make_synthetic(Geometry::kShift, 2, 64, 16, 3, 9);
  const auto other = eval::make_synthetic(Geometry::kShift, 4, 64, 16, 3, 10);
  EXPECT_EQ(a.keys, b.keys);
  EXPECT_EQ(a.values, b.values);
  EXPECT_EQ(a.probes, b.probes);
  // Head h's data does not depend on how many heads are drawn.
  EXPECT_TRUE(std::equal(two.keys.begin(), two.keys.end(), a.keys.begin()));
  EXPECT_NE(a.keys, other.keys);
  test::expect_error([] { eval::make_synthetic(Geometry::kSpans, 1, 7, 8, 1, 0); },
                     ErrorCode::kInvalidArgument, {"tokens >= 8", "got heads 1, tokens 7"});
  test::expect_error([] { eval::parse_geometry("round"); }, ErrorCode::kInvalidArgument,
                     {"unknown geometry 'round'", "spans, shift, stable, planted"});
}

TEST(Synthetic, SpansAreTheSeedSetup) {
  const std::int64_t S = 240, D = 64;
  const auto kv = eval::make_synthetic(Geometry::kSpans, 2, S, D, 8, 1);
  EXPECT_EQ(kv.span_starts, (std::vector<std::int64_t>{40, 120, 192}));
  EXPECT_EQ(kv.span_len, 20);
  for (std::int64_t h = 0; h < 2; ++h) {
    double in = 0, out = 0;
    std::int64_t n_in = 0;
    for (std::int64_t t = 0; t < S; ++t) {
      bool span = false;
      for (auto s : kv.span_starts) span = span || (t >= s && t < s + kv.span_len);
      (span ? in : out) += proj(kv.key(h, t), kv.axis_of(h), D);
      n_in += span;
    }
    EXPECT_EQ(n_in, 60);
    EXPECT_NEAR(in / 60, 4.0, 0.4);         // +4u on every span key
    EXPECT_NEAR(out / (S - 60), 0.0, 0.2);  // N(0, 1) along u elsewhere
  }
}

TEST(Synthetic, ShiftMovesTheProbesToTheLateBlockAndStableDoesNot) {
  const std::int64_t S = 400, D = 64, P = 16;
  const auto shift = eval::make_synthetic(Geometry::kShift, 2, S, D, P, 3);
  const auto stable = eval::make_synthetic(Geometry::kStable, 2, S, D, P, 3);
  ASSERT_EQ(shift.late_start, 280);
  ASSERT_EQ(stable.late_start, 280);
  double share_shift = 0, share_stable = 0;
  for (std::int64_t h = 0; h < 2; ++h) {
    for (std::int64_t p = 0; p < P; ++p) {
      share_shift += attention_share(shift, h, p, shift.late_start, S) / (2 * P);
      share_stable += attention_share(stable, h, p, stable.late_start, S) / (2 * P);
    }
  }
  EXPECT_GT(share_shift, 0.9);  // documented: about 95% at D = 64
  EXPECT_NEAR(share_stable, 0.3, 0.1);
  // The two share everything before the late block.
  EXPECT_TRUE(std::equal(shift.keys.begin(), shift.keys.begin() + 280 * D, stable.keys.begin()));
}

TEST(Synthetic, LateTopicFractionTracksTheShift) {
  PerturbOptions o = small_options({"full", "morphkv:window=8", "h2o:grace=0,decay=1"});
  o.seqs = {256};
  o.budgets = {32};
  o.head_dim = 64;
  std::map<std::string, double> late;
  for (const Geometry g : {Geometry::kShift, Geometry::kStable}) {
    o.geometry = g;
    for (const auto& c : eval::plan_perturb(o)) {
      const auto m = eval::measure_case(o, c);
      ASSERT_TRUE(m.late_topic_fraction.has_value());
      EXPECT_FALSE(m.planted_survival.has_value());
      late[std::string(eval::to_string(g)) + " " + c.method_arg] = *m.late_topic_fraction;
    }
  }
  // full keeps everything: the late block's share of positions, (256 - 179) / 256.
  EXPECT_DOUBLE_EQ(late["shift full"], 77.0 / 256.0);
  EXPECT_DOUBLE_EQ(late["stable full"], 77.0 / 256.0);
  // MorphKV's recent window follows the shift; without one it keeps much less of the block.
  EXPECT_GT(late["shift morphkv:window=8"], late["stable morphkv:window=8"] + 0.2);
  // H2O's paper rule (newest row always loses) never keeps a late row, shift or not.
  EXPECT_EQ(late["shift h2o:grace=0,decay=1"], 0.0);
}

TEST(Synthetic, PlantedTokenIsHeavyForProbesAndTracked) {
  const std::int64_t S = 200, D = 64;
  const auto kv = eval::make_synthetic(Geometry::kPlanted, 2, S, D, 8, 5);
  ASSERT_EQ(kv.planted_pos, 50);
  ASSERT_EQ(kv.burst_start, 180);
  for (std::int64_t h = 0; h < 2; ++h) {
    EXPECT_NEAR(proj(kv.key(h, 50), kv.axis_of(h), D), 2 * 8.0, 1e-4);
    EXPECT_NEAR(std::fabs(proj(kv.key(h, 10), kv.axis_of(h), D)), 0.0, 1e-4);  // filler ⟂ u
    EXPECT_NEAR(proj(kv.key(h, 190), kv.axis_of(h), D), 4.0, 1e-4);            // burst
    for (std::int64_t p = 0; p < 8; ++p) EXPECT_GT(attention_share(kv, h, p, 50, 51), 0.99);
  }
  PerturbOptions o = small_options({"full", "streaming_llm", "h2o:grace=0,decay=1"},
                                   Geometry::kPlanted);
  o.seqs = {S};
  o.budgets = {32};
  o.head_dim = D;
  for (const auto& c : eval::plan_perturb(o)) {
    const auto m = eval::measure_case(o, c);
    ASSERT_TRUE(m.planted_survival.has_value());
    if (c.method_arg == "full") {
      EXPECT_EQ(*m.planted_survival, 1.0);
      EXPECT_EQ(m.perturbation_mean, 0.0);
    } else {
      // Sinks + the last 28 tokens, or the first 31 + the newest: both miss position 50, and
      // losing the token the probes attend to moves the output almost orthogonally.
      EXPECT_EQ(*m.planted_survival, 0.0) << c.method_arg;
      EXPECT_GT(m.perturbation_mean, 0.8) << c.method_arg;
    }
  }
}

}  // namespace
}  // namespace vq
