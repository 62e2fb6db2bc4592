// ThinK's key-channel pruning (think=, method `think`): the kept channels and the attention over
// pruned keys against tests/think_reference.py (an independent NumPy implementation with explicit
// RoPE matrices; ctest's think_reference checks the block below is what it prints), the bytes
// held, composition with an eviction method, and the configuration errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "test_util.h"

#include "expected_attention_inputs.h"

namespace vq {
namespace {

using namespace ea_ref;  // the inputs (the same formulas as tests/think_reference.py)

struct RefHead {
  std::int64_t head;
  std::vector<std::int32_t> channels;
  std::vector<double> outputs;  // [G][D] probe outputs
};

// BEGIN think_reference
// queries: {kv head, kept channels, probe outputs [G][D]}; kept_bytes 720
const RefHead kQueriesRef[] = {
  // head 0: scores 7.7646 8.4928 6.3850 7.5529 9.7934 2.9792 7.4915 7.0233
  {0, {0, 1, 3, 4}, {-0.327980792, 0.385551315, 0.260390322, -0.407275078, -0.026238564, 0.0551033153, -0.0672243552, -0.106525571, -0.628159388, 0.0452820493, 0.0207558307, -0.0951263254, -0.20532895, 0.195683549, 0.173125789, 0.0945987686}},
  // head 1: scores 7.2374 8.5014 6.7470 6.6538 10.1279 6.9172 7.8167 5.6717
  {1, {0, 1, 4, 6}, {0.428624009, 0.387475477, -0.723397734, -0.272298185, -0.422743191, -0.108375068, 0.498042134, -0.439251261, 0.318008582, 0.204835282, -0.535095821, -0.062045636, -0.430679183, -0.287497704, 0.402515668, -0.361832304}},
};
constexpr std::int64_t kQueriesBytes = 720;
// proxy (keys as queries): {kv head, kept channels, probe outputs [G][D]}; kept_bytes 720
const RefHead kProxyRef[] = {
  // head 0: scores 7.0489 6.0282 2.9210 4.9161 5.9441 2.9824 4.6787 6.8919
  {0, {0, 1, 4, 7}, {-0.344664244, 0.420138956, 0.226138054, -0.425806881, -0.0780596486, 0.015656913, 0.0847025821, -0.163540789, -0.585516408, 0.0833794799, 0.0759938293, -0.129444331, -0.137495933, 0.206321156, 0.0593232012, 0.117831394}},
  // head 1: scores 5.1365 6.8787 2.9034 6.3184 8.0654 3.0130 5.8155 5.9481
  {1, {1, 3, 4, 7}, {0.429884995, 0.267992729, -0.70026026, -0.445997926, -0.557537067, -0.248580387, 0.593989302, -0.348253936, 0.472037886, 0.303934006, -0.612625542, -0.0922439668, -0.319915627, -0.181243298, 0.44865124, -0.307609742}},
};
constexpr std::int64_t kProxyBytes = 720;
// END think_reference

constexpr std::int64_t kPrompt = 6, kG = kHq / kHkv;

float probe(std::int64_t q, std::int64_t c) {
  return static_cast<float>((3 * q + 5 * c + 1) % 7 - 3) / 4.0f;
}

LayerCache make(const std::string& spec) {
  LayerCache c(CacheConfig::parse(spec), LayerShape{kHkv, kD, kHq, 0, 1});
  const std::vector<float> f = ref_freq();
  c.set_rope(RopeRef{f.data(), kD / 2, RopePairing::kInterleaved});
  return c;
}

// The prompt (one step, with or without its queries), then one decode token.
void feed(LayerCache& c, bool queries) {
  const Step prompt(0, kPrompt);
  c.begin_step(prompt.keys(), prompt.values());
  const TensorRef q = prompt.queries();
  c.end_step(nullptr, queries ? &q : nullptr);
  const Step decode(kPrompt, 1);
  c.update(decode.keys(), decode.values());
}

// Kept channels, the keys as the cache reads them (pruned channels zero on the prompt rows, the
// decode row whole), and a probe query's attention output through the packed rows' attention
// (attend_scores, a softmax here, attend_values) against the reference.
void expect_reference(const LayerCache& c, const RefHead (&ref)[2], const char* what) {
  for (const RefHead& r : ref) {
    const HeadRows hr = c.stored(0, r.head);
    ASSERT_EQ(hr.n_rows, kPrompt + 1) << what;
    ASSERT_NE(hr.packed, nullptr) << what;
    for (std::int64_t row = 0; row <= kPrompt; ++row) {
      for (std::int64_t ch = 0; ch < kD; ++ch) {
        const bool kept = std::find(r.channels.begin(), r.channels.end(), ch) != r.channels.end();
        const float want = row < kPrompt && !kept ? 0.0f : ref_key(row, r.head, ch);
        EXPECT_EQ(hr.key(row, ch), want) << what << " head " << r.head << " row " << row << " ch " << ch;
        EXPECT_EQ(hr.value(row, ch), ref_value(row, r.head, ch)) << what;
      }
    }
    std::vector<float> q(static_cast<std::size_t>(kG * kD));
    for (std::int64_t g = 0; g < kG; ++g) {
      for (std::int64_t ch = 0; ch < kD; ++ch) q[static_cast<std::size_t>(g * kD + ch)] = probe(r.head * kG + g, ch);
    }
    const std::int64_t R = hr.n_rows;
    std::vector<float> p(static_cast<std::size_t>(kG * R)), out(static_cast<std::size_t>(kG * kD));
    std::vector<float> scratch(static_cast<std::size_t>(8 * kG * kD));
    hr.packed->attend_scores(q.data(), kG, kPrompt, p.data(), R);
    for (std::int64_t g = 0; g < kG; ++g) {
      float* s = p.data() + g * R;
      double mx = -1e30, sum = 0;
      for (std::int64_t i = 0; i < R; ++i) mx = std::max(mx, static_cast<double>(s[i]) / std::sqrt(8.0));
      for (std::int64_t i = 0; i < R; ++i) sum += std::exp(static_cast<double>(s[i]) / std::sqrt(8.0) - mx);
      for (std::int64_t i = 0; i < R; ++i) {
        s[i] = static_cast<float>(std::exp(static_cast<double>(s[i]) / std::sqrt(8.0) - mx) / sum);
      }
    }
    hr.packed->attend_values(p.data(), kG, R, kPrompt, out.data(), scratch.data());
    for (std::size_t i = 0; i < out.size(); ++i) {
      EXPECT_NEAR(out[i], r.outputs[i], 2e-6) << what << " head " << r.head << " output " << i;
    }
  }
}

TEST(Think, QueriesMatchTheReference) {
  LayerCache c = make("think:think_window=3,kv_dtype=f32");
  EXPECT_TRUE(c.reads_queries());  // until the channel set is chosen
  feed(c, true);
  EXPECT_FALSE(c.reads_queries());
  expect_reference(c, kQueriesRef, "queries");
  EXPECT_EQ(c.kept_bytes(), kQueriesBytes);
  EXPECT_EQ(c.stats().allocated_bytes >= c.kept_bytes(), true);
}

TEST(Think, KeysStandInForQueriesWithoutThem) {
  LayerCache c = make("think:think_window=3,kv_dtype=f32");
  feed(c, false);
  expect_reference(c, kProxyRef, "proxy");
  EXPECT_EQ(c.kept_bytes(), kProxyBytes);
}

TEST(Think, Fp16BytesCountTheKeptChannelsOnly) {
  // think=0.5 of D = 8 keeps 4 channels. Per head, fp16: 6 prompt keys x 4 + 1 decode key x 8
  // + 7 values x 8 = 88 elements = 176 bytes, plus the channel set (4 x 2 bytes) = 184; two heads
  // 368. The full cache holds 7 x 2 x 8 x 2 x 2 = 448 bytes.
  LayerCache c = make("think");
  feed(c, false);
  EXPECT_EQ(c.kept_bytes(), 368);
  EXPECT_EQ(c.full_bytes(), 448);
  EXPECT_EQ(c.tokens_kept(), kPrompt + 1);
}

TEST(Think, RoundingOfTheKeptChannels) {
  // D - floor(think x D): 0.3 x 8 = 2.4 prunes 2 (keeps 6); 0.9 x 8 = 7.2 prunes 7 (keeps 1).
  for (const auto& [ratio, kept] : {std::pair{std::string("0.3"), 6}, std::pair{std::string("0.9"), 1}}) {
    LayerCache c = make("think:think=" + ratio + ",kv_dtype=f32");
    feed(c, false);
    // Per head f32: 6 x kept + 8 + 7 x 8 elements x 4 bytes + 2 x kept.
    EXPECT_EQ(c.kept_bytes(), 2 * (4 * (6 * kept + 8 + 56) + 2 * kept)) << ratio;
  }
}

TEST(Think, NoPrefillNoPruning) {
  // Token by token (every step S = 1): nothing is pruned, the cache holds what `full` holds.
  LayerCache c = make("think");
  LayerCache f = make("full");
  for (std::int64_t t = 0; t < 7; ++t) {
    const Step s(t, 1);
    c.update(s.keys(), s.values());
    f.update(s.keys(), s.values());
  }
  EXPECT_EQ(c.kept_bytes(), f.kept_bytes());
}

TEST(Think, ComposesWithEviction) {
  // snapkv,think=0.5 keeps snapkv's rows (eviction first) and prunes their keys; the channel set
  // is scored over the rows kept.
  const std::string snap = "snapkv:budget=4,obs_window=2,n_sink=1,kernel=1,kv_dtype=f32";
  LayerCache plain = make(snap);
  LayerCache thin = make(snap + ",think=0.5,think_window=3");
  feed(plain, false);
  feed(thin, false);
  for (std::int64_t h = 0; h < kHkv; ++h) {
    const HeadRows a = plain.stored(0, h), b = thin.stored(0, h);
    ASSERT_EQ(a.n_rows, b.n_rows);
    std::int64_t zero_channels = 0;
    for (std::int64_t r = 0; r < a.n_rows; ++r) {
      EXPECT_EQ(a.positions[r], b.positions[r]);
      for (std::int64_t ch = 0; ch < kD; ++ch) {
        const float k = b.key(r, ch);
        EXPECT_TRUE(k == a.key(r, ch) || (k == 0.0f && r < a.n_rows - 1)) << r << " " << ch;
        if (r == 0 && k == 0.0f && a.key(r, ch) != 0.0f) ++zero_channels;
      }
    }
    EXPECT_GE(zero_channels, 1);
  }
  // 4 prompt rows kept (budget) + the decode row, per head f32: keys 4 x 4 + 8, values 5 x 8.
  EXPECT_EQ(thin.kept_bytes(), 2 * (4 * (16 + 8 + 40) + 8));
  EXPECT_LT(thin.kept_bytes(), plain.kept_bytes());
}

TEST(Think, ResetChoosesAgainAndIsDeterministic) {
  LayerCache a = make("think:think_window=3,kv_dtype=f32");
  feed(a, false);
  a.reset();
  EXPECT_TRUE(a.reads_queries());
  feed(a, true);  // the second life passes queries: its set is the queries' one
  expect_reference(a, kQueriesRef, "after reset");
}

TEST(Think, ConfigErrorsNameTheField) {
  auto error_of = [](const std::string& spec) -> std::string {
    try {
      CacheConfig::parse(spec).validate();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error_of("think:think=1").find("think must be < 1"), std::string::npos);
  EXPECT_NE(error_of("think:think=1.5").find("think"), std::string::npos);
  EXPECT_NE(error_of("snapkv:think=0.5,quantize=kivi2").find("exclusive"), std::string::npos);
  EXPECT_NE(error_of("h2o:think=0.5,demote=kivi4").find("exclusive"), std::string::npos);
  EXPECT_NE(error_of("think:kv_dtype=q8_0").find("kv_dtype=q8_0"), std::string::npos);
  EXPECT_NE(error_of("h2o:think_window=8").find("think_window has no effect"), std::string::npos);
  EXPECT_NE(error_of("kivi:think=0.5").find("think"), std::string::npos);  // no such field
  EXPECT_EQ(error_of("h2o:think=0.25,think_window=8"), "");
}

}  // namespace
}  // namespace vq
