// finch: kept rows and scores against tests/finch_reference.py (NumPy, from the formula), the
// question input (set_question_length) through LayerCache and ModelCache (C API:
// test_finch_capi.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "test_util.h"
#include "veloxquant/builder.h"

namespace vq {
namespace {

using Rows = std::vector<std::int32_t>;

Rows positions_of(const LayerCache& c, std::int64_t h) { return test::stored_positions(c, 0, h); }

// tests/finch_reference.py's inputs: u(seed, i) = test::hash_uniform.
double u(std::uint64_t seed, std::uint64_t i) { return test::hash_uniform(seed, i); }

constexpr std::int64_t kH = 2, kHq = 4, kT = 16, kD = 4;

// x[h][t][c] = f32(3 u(seed, (h T + t) D + c)): keys (seed 1, [Hkv][T][D]), queries (seed 4,
// [Hq][T][D]).
std::vector<float> ref_tensor(std::uint64_t seed, std::int64_t heads) {
  std::vector<float> x(static_cast<std::size_t>(heads * kT * kD));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(3.0 * u(seed, i));
  return x;
}

// The step's attention probabilities [1, Hq, T, T] from the reference queries and keys (the
// engine's job, done here in double): query head g reads KV head g / 2, causal softmax of
// q . k / sqrt(D) over rows j <= t.
std::vector<float> ref_attention(const std::vector<float>& q, const std::vector<float>& k) {
  std::vector<float> a(static_cast<std::size_t>(kHq * kT * kT), 0.0f);
  for (std::int64_t g = 0; g < kHq; ++g) {
    const std::int64_t h = g / (kHq / kH);
    for (std::int64_t t = 0; t < kT; ++t) {
      std::vector<double> l(static_cast<std::size_t>(t + 1));
      double mx = -1e300, sum = 0;
      for (std::int64_t j = 0; j <= t; ++j) {
        double s = 0;
        for (std::int64_t c = 0; c < kD; ++c) {
          s += static_cast<double>(q[static_cast<std::size_t>((g * kT + t) * kD + c)]) *
               static_cast<double>(k[static_cast<std::size_t>((h * kT + j) * kD + c)]);
        }
        l[static_cast<std::size_t>(j)] = s / std::sqrt(static_cast<double>(kD));
        mx = std::max(mx, l[static_cast<std::size_t>(j)]);
      }
      for (double& x : l) sum += (x = std::exp(x - mx));
      for (std::int64_t j = 0; j <= t; ++j) {
        a[static_cast<std::size_t>((g * kT + t) * kT + j)] =
            static_cast<float>(l[static_cast<std::size_t>(j)] / sum);
      }
    }
  }
  return a;
}

struct RefCase {
  const char* name;
  const char* spec;
  std::int64_t question;
  bool attention;
  std::vector<Rows> kept;
  std::vector<std::vector<double>> scores;
};

// Pasted from /usr/bin/python3 tests/finch_reference.py (ctest finch_reference checks that every
// line below is what it prints). The rows kept per KV head after one prefill step of 16 tokens
// and their scores (cache row_scores: the mean normalized window mass; 0 for window rows).
// smallest gap between a kept and a dropped score: 0.00126.
const std::vector<RefCase> kCases = {
    {"A", "finch:budget=10,n_sink=1,obs_window=3", 5, true,
     {{0, 1, 2, 4, 6, 11, 12, 13, 14, 15}, {0, 1, 3, 8, 10, 11, 12, 13, 14, 15}},  // A kept
     {{0.9378415, 1.03142, 1.093044, 0.9431812, 1.523617, 0, 0, 0, 0, 0},  // A h0
      {1.525936, 1.188632, 1.176706, 1.061209, 0.9232728, 0, 0, 0, 0, 0}}},  // A h1
    {"B", "finch:budget=10,n_sink=1,obs_window=3,normalize=false", 5, true,
     {{0, 1, 2, 6, 8, 11, 12, 13, 14, 15}, {0, 1, 3, 8, 10, 11, 12, 13, 14, 15}},  // B kept
     {{0.07224236, 0.0857223, 0.08634471, 0.1142695, 0.07438829, 0, 0, 0, 0, 0},  // B h0
      {0.1219116, 0.09367376, 0.09302449, 0.08219385, 0.07112475, 0, 0, 0, 0, 0}}},  // B h1
    {"C", "finch:budget=10,n_sink=1,obs_window=3", 0, true,
     {{0, 2, 4, 6, 7, 9, 11, 13, 14, 15}, {0, 1, 2, 3, 5, 8, 10, 13, 14, 15}},  // C kept
     {{1.056506, 0.9467665, 0.9911014, 1.859936, 1.041072, 1.070742, 1.130167, 0, 0, 0},  // C h0
      {1.217997, 1.049439, 0.9877992, 1.099894, 0.991042, 1.096177, 1.028197, 0, 0, 0}}},  // C h1
    {"D", "finch:budget=10,n_sink=1,obs_window=3", 5, false,
     {{0, 1, 2, 8, 9, 11, 12, 13, 14, 15}, {0, 2, 4, 6, 7, 11, 12, 13, 14, 15}},  // D kept
     {{0.773621, 1.395938, 0.8750157, 0.8904723, 0.874106, 0, 0, 0, 0, 0},  // D h0
      {0.7059061, 1.184692, 0.9046804, 0.8880122, 0.9802758, 0, 0, 0, 0, 0}}},  // D h1
    {"E", "finch:budget=10,n_sink=1,obs_window=3", 12, true,
     {{0, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {0, 7, 8, 9, 10, 11, 12, 13, 14, 15}},  // E kept
     {{0.7375438, 0, 0, 0, 0, 0, 0, 0, 0, 0},  // E h0
      {1.304116, 0, 0, 0, 0, 0, 0, 0, 0, 0}}},  // E h1
};

TEST(Finch, KeepsTheRowsOfTheNumpyReference) {
  const std::vector<float> k = ref_tensor(1, kH), q = ref_tensor(4, kHq);
  const std::vector<float> v(k.size(), 0.5f);
  const std::vector<float> att = ref_attention(q, k);
  for (const RefCase& rc : kCases) {
    SCOPED_TRACE(rc.name);
    LayerCache c(CacheConfig::parse(std::string(rc.spec) + ",kv_dtype=f32"),
                 LayerShape{kH, kD, kHq, 0, 1});
    EXPECT_TRUE(c.reads_question());
    c.set_question_length(rc.question);
    EXPECT_EQ(c.question_length(), rc.question);
    c.begin_step(TensorRef::f32(k.data(), 1, kH, kT, kD), TensorRef::f32(v.data(), 1, kH, kT, kD));
    EXPECT_EQ(c.question_length(), 0);  // consumed by the step
    if (rc.attention) {
      const AttentionRef a{att.data(), 1, kHq, kT, kT};
      c.end_step(&a);
    } else {
      c.end_step();
    }
    for (std::int64_t h = 0; h < kH; ++h) {
      EXPECT_EQ(positions_of(c, h), rc.kept[static_cast<std::size_t>(h)]) << "head " << h;
      const std::vector<float> s = c.row_scores(0, h);
      const std::vector<double>& want = rc.scores[static_cast<std::size_t>(h)];
      ASSERT_EQ(s.size(), want.size());
      for (std::size_t i = 0; i < s.size(); ++i) {
        EXPECT_NEAR(s[i], want[i], 1e-5 * std::max(1.0, std::fabs(want[i])))
            << "head " << h << " row " << i;
      }
    }
  }
}

// A decode step appends; the question is consumed, so the next prompt without one falls back to
// the fixed window; reset() forgets a pending question.
TEST(Finch, QuestionIsConsumedByItsStepAndDecodeAppends) {
  const std::vector<float> k = ref_tensor(1, kH), q = ref_tensor(4, kHq);
  const std::vector<float> v(k.size(), 0.5f);
  const std::vector<float> att = ref_attention(q, k);
  LayerCache c(CacheConfig::parse("finch:budget=10,n_sink=1,obs_window=3,kv_dtype=f32"),
               LayerShape{kH, kD, kHq, 0, 1});
  c.set_question_length(5);
  c.begin_step(TensorRef::f32(k.data(), 1, kH, kT, kD), TensorRef::f32(v.data(), 1, kH, kT, kD));
  const AttentionRef a{att.data(), 1, kHq, kT, kT};
  c.end_step(&a);
  EXPECT_EQ(positions_of(c, 0), kCases[0].kept[0]);
  for (int i = 0; i < 3; ++i) {
    c.begin_step(TensorRef::f32(k.data(), 1, kH, 1, kD), TensorRef::f32(v.data(), 1, kH, 1, kD));
    std::vector<float> one(static_cast<std::size_t>(kHq * (11 + i)), 0.0f);
    const AttentionRef a1{one.data(), 1, kHq, 1, 11 + i};
    c.end_step(&a1);
  }
  EXPECT_EQ(c.tokens_kept(), 13);
  c.set_question_length(4);
  c.reset();
  EXPECT_EQ(c.question_length(), 0);
  // Without a question: the fixed window (case C).
  c.begin_step(TensorRef::f32(k.data(), 1, kH, kT, kD), TensorRef::f32(v.data(), 1, kH, kT, kD));
  c.end_step(&a);
  EXPECT_EQ(positions_of(c, 0), kCases[2].kept[0]);
  EXPECT_EQ(positions_of(c, 1), kCases[2].kept[1]);
}

TEST(Finch, QuestionLengthErrorsNameTheSetter) {
  const std::vector<float> k = ref_tensor(1, kH), v(k.size(), 0.5f);
  LayerCache c(CacheConfig::parse("finch:budget=10,n_sink=1,obs_window=3"),
               LayerShape{kH, kD, kHq, 0, 1});
  test::expect_error([&] { c.set_question_length(-1); }, ErrorCode::kInvalidArgument,
                     {"set_question_length", "[0, 2147483647]", "got -1"});
  // A question longer than the step: refused by begin_step, nothing appended.
  c.set_question_length(17);
  test::expect_error(
      [&] {
        c.begin_step(TensorRef::f32(k.data(), 1, kH, kT, kD),
                     TensorRef::f32(v.data(), 1, kH, kT, kD));
      },
      ErrorCode::kInvalidArgument, {"set_question_length", "17", "only 16 new rows"});
  EXPECT_FALSE(c.step_open());
  EXPECT_EQ(c.tokens_seen(), 0);
  c.set_question_length(16);
  c.begin_step(TensorRef::f32(k.data(), 1, kH, kT, kD), TensorRef::f32(v.data(), 1, kH, kT, kD));
  test::expect_error([&] { c.set_question_length(2); }, ErrorCode::kInvalidState,
                     {"set_question_length", "step is open"});
  c.end_step();
  // The whole prompt as the question: the window is its last budget - n_sink = 9 rows.
  EXPECT_EQ(positions_of(c, 0), (Rows{0, 7, 8, 9, 10, 11, 12, 13, 14, 15}));
  // Other methods ignore the question but check it alike.
  LayerCache s(CacheConfig::parse("snapkv"), LayerShape{kH, kD, kHq, 0, 1});
  EXPECT_FALSE(s.reads_question());
  s.set_question_length(3);
  s.update(TensorRef::f32(k.data(), 1, kH, kT, kD), TensorRef::f32(v.data(), 1, kH, kT, kD));
  EXPECT_EQ(s.question_length(), 0);
}

TEST(Finch, ConfigGuards) {
  test::expect_error([] { (void)CacheConfig::parse("finch:budget=8,n_sink=4,obs_window=4"); },
                     ErrorCode::kInvalidConfig, {"finch_n_sink", "finch_obs_window", "finch_budget"});
  test::expect_error([] { (void)CacheConfig::parse("finch:budget=4,n_sink=4"); },
                     ErrorCode::kInvalidConfig, {"finch_n_sink", "finch_budget"});
}

TEST(Finch, ModelCacheSetsEveryLayer) {
  ModelCache m(CacheConfig::parse("finch:budget=10,n_sink=1,obs_window=3"),
               ModelShape{3, kH, kD, kHq});
  EXPECT_TRUE(m.reads_question());
  m.set_question_length(5);
  for (std::int64_t l = 0; l < 3; ++l) EXPECT_EQ(m.layer(l).question_length(), 5);
  test::expect_error([&] { m.set_question_length(-2); }, ErrorCode::kInvalidArgument,
                     {"set_question_length", "got -2"});
  EXPECT_EQ(m.layer(0).question_length(), 5);
}

}  // namespace
}  // namespace vq
