// expected_attention: kept rows and scores against tests/expected_attention_reference.py (an
// independent NumPy implementation with explicit d x d rotation matrices), the queries / RoPE
// interface's error cases, and the other methods' indifference to queries.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "test_util.h"

#include "expected_attention_inputs.h"

namespace vq {
namespace {

using namespace ea_ref;  // the reference inputs (expected_attention_inputs.h)

const std::string kBase =
    "expected_attention:budget=10,n_sink=2,n_future=5,n_window=16,interval=3,kv_dtype=f32";

LayerCache make(const std::string& extra = "", bool rope = true,
                RopePairing pairing = RopePairing::kInterleaved) {
  // A key of `extra` replaces the base's (n_window).
  std::string spec = kBase;
  if (extra.find("n_window=") != std::string::npos) spec.replace(spec.find(",n_window=16"), 12, "");
  LayerCache c(CacheConfig::parse(spec + extra), LayerShape{kHkv, kD, kHq, 0, 1});
  if (rope) {
    const std::vector<float> f = ref_freq();
    c.set_rope(RopeRef{f.data(), kD / 2, pairing});
  }
  return c;
}

// Feeds the chunks `steps` with their queries (begin_step, end_step(nullptr, &queries)).
void feed_queries(LayerCache& c, const std::vector<std::int64_t>& steps) {
  std::int64_t t = 0;
  for (std::int64_t S : steps) {
    const Step st(t, S);
    c.begin_step(st.keys(), st.values());
    const TensorRef q = st.queries();
    c.end_step(nullptr, &q);
    t += S;
  }
}
// The keys fallback: update() in chunks of `chunk`.
void feed_keys(LayerCache& c, std::int64_t T, std::int64_t chunk) {
  for (std::int64_t t = 0; t < T; t += chunk) {
    const Step st(t, std::min(chunk, T - t));
    c.update(st.keys(), st.values());
  }
}

std::vector<std::int32_t> kept(const LayerCache& c, std::int64_t h) {
  const HeadRows r = c.stored(0, h);
  return std::vector<std::int32_t>(r.positions, r.positions + r.n_rows);
}

// The kept rows and, past the sinks, the scores the last cut ranked them by (row_scores), as
// the reference prints them (relative tolerance 1e-4: the smallest relative gap between a kept
// and an evicted score the script reports is 2.1e-4, fp32 statistics differ by ~1e-6).
void expect_head(const LayerCache& c, std::int64_t h, const std::vector<std::int32_t>& rows,
                 const std::vector<double>& scores, const char* what) {
  EXPECT_EQ(kept(c, h), rows) << what << " head " << h;
  const std::vector<float> s = c.row_scores(0, h);
  ASSERT_EQ(s.size(), rows.size()) << what;
  for (std::size_t i = 0; i < scores.size(); ++i) {
    EXPECT_NEAR(s[i + 2], scores[i], 1e-4 * scores[i]) << what << " head " << h << " row " << i + 2;
  }
}

// Expected: /usr/bin/python3 tests/expected_attention_reference.py (pasted).
TEST(ExpectedAttention, PrefillCutMatchesTheNumpyReference) {
  LayerCache a = make();
  feed_queries(a, {24});
  expect_head(a, 0, {0, 1, 4, 7, 10, 12, 15, 18, 19, 21},
              {0.117351157, 0.126807179, 0.139760894, 0.120651231, 0.110653762, 0.174253702,
               0.126870608, 0.151778211},
              "prefill");
  expect_head(a, 1, {0, 1, 3, 4, 5, 7, 10, 12, 16, 23},
              {0.113448966, 0.16579967, 0.137929823, 0.1654772, 0.127266683, 0.116509677,
               0.137138646, 0.148502719},
              "prefill");

  // Half-split pairing (HF), no covariance term, epsilon 0.05.
  LayerCache b = make(",covariance=false,epsilon=0.05", true, RopePairing::kHalfSplit);
  feed_queries(b, {24});
  expect_head(b, 0, {0, 1, 4, 6, 9, 10, 18, 19, 21, 23},
              {0.246693706, 0.219946197, 0.219894464, 0.282327134, 0.284815496, 0.227664649,
               0.292255412, 0.224845488},
              "prefill_half_nocov");
  expect_head(b, 1, {0, 1, 3, 5, 7, 9, 11, 14, 16, 23},
              {0.266256381, 0.270413346, 0.296049916, 0.249609163, 0.250978189, 0.259264025,
               0.261608213, 0.27498425},
              "prefill_half_nocov");

  // No value norm (the averaged probability alone), a window of the last 6 queries.
  LayerCache c = make(",vnorm=false,n_window=6");
  feed_queries(c, {24});
  expect_head(c, 0, {0, 1, 7, 12, 14, 15, 16, 18, 19, 20},
              {0.0592537244, 0.0920644288, 0.0533356439, 0.0688054516, 0.0438695763,
               0.0752943961, 0.0560569781, 0.0506488362},
              "prefill_novnorm");
  expect_head(c, 1, {0, 1, 2, 3, 4, 5, 7, 18, 20, 23},
              {0.0506925416, 0.0490201171, 0.0664399296, 0.0550655641, 0.0662768055,
               0.0492358087, 0.0515743524, 0.0590809842},
              "prefill_novnorm");
}

TEST(ExpectedAttention, DecodeRuleMatchesTheNumpyReference) {
  // A chunk of 16, then 8 decode steps: each scored with the statistics in force, refreshed
  // every 3 tokens, the budget exact after every step.
  LayerCache c = make();
  feed_queries(c, {16});
  EXPECT_EQ(c.tokens_kept(), 10);
  for (std::int64_t t = 16; t < 24; ++t) {
    const Step st(t, 1);
    c.begin_step(st.keys(), st.values());
    const TensorRef q = st.queries();
    c.end_step(nullptr, &q);
    EXPECT_EQ(c.tokens_kept(), 10) << "t " << t;
  }
  expect_head(c, 0, {0, 1, 4, 6, 7, 10, 16, 18, 19, 21},
              {0.270334799, 0.251824393, 0.266020254, 0.344786708, 0.229436515, 0.385662378,
               0.248333914, 0.308859492},
              "decode");
  expect_head(c, 1, {0, 1, 4, 5, 7, 10, 16, 18, 20, 23},
              {0.394464098, 0.261779426, 0.418786411, 0.357045644, 0.245408476, 0.216803548,
               0.208563729, 0.298639834},
              "decode");
}

TEST(ExpectedAttention, KeysFallbackMatchesTheNumpyReferenceAtAnyChunking) {
  // No queries: the keys, turned back to pre-RoPE, stand in for them; token by token, so a
  // chunk of 7 equals single tokens.
  for (std::int64_t chunk : {1, 7}) {
    LayerCache c = make();
    feed_keys(c, 20, chunk);
    EXPECT_FALSE(c.reads_queries());
    expect_head(c, 0, {0, 1, 4, 7, 10, 13, 15, 17, 18, 19},
                {0.233519597, 0.253700817, 0.432014956, 0.194166341, 0.221588496, 0.234113462,
                 0.386316323, 0.229631168},
                "keys");
    expect_head(c, 1, {0, 1, 4, 6, 7, 11, 12, 15, 16, 18},
                {0.377579812, 0.235247373, 0.481545935, 0.289590368, 0.203921793, 0.252891238,
                 0.198236517, 0.264676249},
                "keys");
  }
  // Without set_rope: the keys as they are, no rotation.
  LayerCache d = make("", false);
  feed_keys(d, 20, 1);
  expect_head(d, 0, {0, 1, 4, 6, 7, 10, 12, 13, 16, 18},
              {0.362063734, 0.130022163, 0.157874431, 0.401142481, 0.164389106, 0.479858334,
               0.365845525, 0.148459596},
              "keys_norope");
  expect_head(d, 1, {0, 1, 4, 6, 7, 10, 11, 13, 15, 18},
              {0.650922259, 0.0988267236, 0.45610352, 0.330588632, 0.101779848, 0.545481027,
               0.10129873, 0.124192745},
              "keys_norope");
}

TEST(ExpectedAttention, HandDerivedOneQueryHeadOneDimensionPair) {
  // d = 2, one KV head, one query head, no RoPE (n_pairs 0), no covariance, no value norm,
  // n_sink 0, budget 2. Queries (pre-RoPE) of the 3 tokens: (1, 0), (3, 0), (2, 0): mean
  // mu = (2, 0). Keys (0, 0), (1, 0), (-1, 5): l_i = mu . k_i / sqrt(2) = 0, 1.4142, -1.4142,
  // so the third row (lowest softmax share) leaves and rows 0 and 1 stay, their shares
  // exp(0) / Z and exp(1.4142) / Z with Z = 1 + e^1.4142 + e^-1.4142 = 5.3573:
  // 0.18666 and 0.76796.
  LayerCache c(CacheConfig::parse("expected_attention:budget=2,n_sink=0,covariance=false,"
                                  "vnorm=false,kv_dtype=f32"),
               LayerShape{1, 2, 1, 0, 1});
  c.set_rope(RopeRef{nullptr, 0, RopePairing::kInterleaved});
  const std::vector<float> k = {0, 0, 1, 0, -1, 5}, v(6, 1.0f), q = {1, 0, 3, 0, 2, 0};
  c.begin_step(TensorRef::f32(k.data(), 1, 1, 3, 2), TensorRef::f32(v.data(), 1, 1, 3, 2));
  const TensorRef qr = TensorRef::f32(q.data(), 1, 1, 3, 2);
  c.end_step(nullptr, &qr);
  EXPECT_EQ(kept(c, 0), (std::vector<std::int32_t>{0, 1}));
  const std::vector<float> s = c.row_scores(0, 0);
  EXPECT_NEAR(s[0], 0.18666, 1e-4);
  EXPECT_NEAR(s[1], 0.76796, 1e-4);
}

TEST(ExpectedAttention, InterfaceErrorsNameTheInput) {
  const Step st(0, 24), one(24, 1);
  const TensorRef q = st.queries();
  {  // Queries without the layer's RoPE: named, the step stays open; set_rope then succeeds.
    LayerCache c = make("", false);
    EXPECT_TRUE(c.reads_queries());
    c.begin_step(st.keys(), st.values());
    test::expect_error([&] { c.end_step(nullptr, &q); }, ErrorCode::kInvalidArgument,
                       {"expected_attention", "set_rope"});
    EXPECT_TRUE(c.step_open());
    const std::vector<float> f = ref_freq();
    c.set_rope(RopeRef{f.data(), kD / 2, RopePairing::kInterleaved});
    c.end_step(nullptr, &q);
    EXPECT_EQ(c.tokens_kept(), 10);
    EXPECT_TRUE(c.reads_queries());
    // Queries at the first step, none at the next: named, the step stays open.
    c.begin_step(one.keys(), one.values());
    test::expect_error([&] { c.end_step(nullptr, nullptr); }, ErrorCode::kInvalidArgument,
                       {"queries", "stays open"});
    EXPECT_TRUE(c.step_open());
    // A wrongly shaped query tensor (S = 24 for a step of 1): kShapeMismatch naming queries.
    test::expect_error([&] { c.end_step(nullptr, &q); }, ErrorCode::kShapeMismatch,
                       {"queries must be [B, Hq, S, D] = [1, 4, 1, 8]"});
    const TensorRef q1 = one.queries();
    c.end_step(nullptr, &q1);
    // update() passes no queries: refused the same way.
    test::expect_error([&] { c.update(one.keys(), one.values()); }, ErrorCode::kInvalidArgument,
                       {"queries"});
    c.end_step(nullptr, &q1);  // the step update() opened
    // reset(): unresolved again, the keys fallback is allowed.
    c.reset();
    feed_keys(c, 20, 1);
    EXPECT_FALSE(c.reads_queries());
    c.begin_step(one.keys(), one.values());
    test::expect_error([&] { c.end_step(nullptr, &q1); }, ErrorCode::kInvalidArgument,
                       {"queries", "passed no queries"});
    c.end_step();
  }
  {  // set_rope's guards.
    LayerCache c = make("", false);
    const std::vector<float> f = ref_freq();
    test::expect_error([&] { c.set_rope(RopeRef{f.data(), 3, RopePairing::kInterleaved}); },
                       ErrorCode::kInvalidArgument, {"set_rope", "head_dim / 2 = 4"});
    test::expect_error([&] { c.set_rope(RopeRef{nullptr, 4, RopePairing::kInterleaved}); },
                       ErrorCode::kInvalidArgument, {"set_rope", "inv_freq is null"});
    const std::vector<float> nan = {1.0f, std::nanf(""), 0.5f, 0.25f};
    test::expect_error([&] { c.set_rope(RopeRef{nan.data(), 4, RopePairing::kHalfSplit}); },
                       ErrorCode::kInvalidArgument, {"inv_freq[1]"});
    EXPECT_FALSE(c.has_rope());
  }
}

TEST(ExpectedAttention, OtherMethodsIgnoreQueries) {
  // A method that reads no queries: same state with and without them (bit for bit), and it
  // never asks for them.
  for (const char* spec : {"h2o:budget=10,kv_dtype=f32", "snapkv:budget=10,obs_window=4,kv_dtype=f32",
                           "streaming_llm:budget=10"}) {
    LayerCache a(CacheConfig::parse(spec), LayerShape{kHkv, kD, kHq, 0, 1});
    LayerCache b(CacheConfig::parse(spec), LayerShape{kHkv, kD, kHq, 0, 1});
    EXPECT_FALSE(a.reads_queries()) << spec;
    for (std::int64_t t = 0; t < 30; t += 6) {
      const Step st(t, 6);
      const TensorRef q = st.queries();
      a.begin_step(st.keys(), st.values());
      a.end_step(nullptr, &q);
      b.begin_step(st.keys(), st.values());
      b.end_step(nullptr, nullptr);
    }
    EXPECT_TRUE(test::snapshot(a, 1, kHkv) == test::snapshot(b, 1, kHkv)) << spec;
  }
}

}  // namespace
}  // namespace vq
