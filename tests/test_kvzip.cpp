// kvzip: the reconstruction scores and cut against tests/kvzip_reference.py (ctest runs it with
// --check on this file), the pass's contract (rows forgotten, clear failures), the fallback.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "test_util.h"
#include "veloxquant/builder.h"

namespace vq {
namespace {

using Rows = std::vector<std::int32_t>;

Rows positions_of(const LayerCache& c, std::int64_t h) { return test::stored_positions(c, 0, h); }

// tests/kvzip_reference.py's inputs: u(seed, i) = test::hash_uniform.
double u(std::uint64_t seed, std::uint64_t i) { return test::hash_uniform(seed, i); }

constexpr std::int64_t kH = 2, kG = 2, kD = 4, kT = 24, kS = 10, kChunks = 2;

// [a][b][D] = f32(3 u(seed, (x b + t) D + d)), contiguous.
std::vector<float> ref_tensor(std::uint64_t seed, std::int64_t a, std::int64_t b) {
  std::vector<float> x(static_cast<std::size_t>(a * b * kD));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(3.0 * u(seed, i));
  return x;
}

// What tests/kvzip_reference.py prints (budget 10, n_sink 2): kept positions per KV head.
constexpr std::array<std::array<std::int32_t, 10>, 2> kUniformKept = {{
    {0, 1, 2, 6, 10, 12, 15, 18, 20, 21},
    {0, 1, 2, 4, 11, 12, 14, 18, 21, 23},
}};
// Head-wise (headwise=true, headwise_floor=0): 11 and 9 rows.
const std::vector<std::vector<std::int32_t>> kHeadwiseKept = {{
    {0, 1, 2, 6, 9, 10, 12, 15, 18, 20, 21},
    {0, 1, 2, 4, 12, 14, 18, 21, 23},
}};

// The attention an engine computes for reconstruction chunk c over the view's rows: query t of
// query head q attends to the stored rows and to the chunk's rows 0..t, softmax in double
// ([1, Hq, S, R], R = stored + S, masked entries 0). Computed here, outside the code under test.
std::vector<float> chunk_attention(const StepView& view, const std::vector<float>& q) {
  const std::int64_t R = view.n_rows(), Hq = kH * kG;
  std::vector<float> p(static_cast<std::size_t>(Hq * kS * R), 0.0f);
  for (std::int64_t qh = 0; qh < Hq; ++qh) {
    const HeadRows hr = view.head(0, qh / kG);
    const std::int64_t stored = R - kS;
    for (std::int64_t t = 0; t < kS; ++t) {
      const std::int64_t n = stored + t + 1;
      std::vector<double> logit(static_cast<std::size_t>(n));
      double mx = -1e300;
      for (std::int64_t j = 0; j < n; ++j) {
        double dot = 0.0;
        for (std::int64_t d = 0; d < kD; ++d) {
          dot += static_cast<double>(q[static_cast<std::size_t>((qh * kS + t) * kD + d)]) *
                 hr.key(j, d);
        }
        logit[static_cast<std::size_t>(j)] = dot / std::sqrt(static_cast<double>(kD));
        mx = std::max(mx, logit[static_cast<std::size_t>(j)]);
      }
      double sum = 0.0;
      for (double& x : logit) sum += (x = std::exp(x - mx));
      for (std::int64_t j = 0; j < n; ++j) {
        p[static_cast<std::size_t>((qh * kS + t) * R + j)] =
            static_cast<float>(logit[static_cast<std::size_t>(j)] / sum);
      }
    }
  }
  return p;
}

// The reference case: the context as one prompt step, two reconstruction chunks, compress().
LayerCache run_reference(const std::string& spec) {
  LayerCache c(CacheConfig::parse(spec), LayerShape{kH, kD, kH * kG, 0, 1});
  c.set_reconstruction(true);
  const std::vector<float> k = ref_tensor(1, kH, kT), v = ref_tensor(2, kH, kT);
  c.begin_step(TensorRef::f32(k.data(), 1, kH, kT, kD), TensorRef::f32(v.data(), 1, kH, kT, kD));
  c.end_step();
  EXPECT_EQ(c.tokens_kept(), kT) << "the prompt waits for the pass with every row";
  for (std::int64_t ch = 0; ch < kChunks; ++ch) {
    const std::vector<float> kc = ref_tensor(10 + static_cast<std::uint64_t>(ch), kH, kS);
    const std::vector<float> qc = ref_tensor(20 + static_cast<std::uint64_t>(ch), kH * kG, kS);
    const StepView view = c.begin_step(TensorRef::f32(kc.data(), 1, kH, kS, kD),
                                       TensorRef::f32(kc.data(), 1, kH, kS, kD));
    EXPECT_EQ(view.n_rows(), kT + kS);
    const std::vector<float> p = chunk_attention(view, qc);
    const AttentionRef a{p.data(), 1, kH * kG, kS, kT + kS};
    c.end_reconstruction_step(&a);
    EXPECT_EQ(c.tokens_seen(), kT) << "the chunk's rows are forgotten";
    EXPECT_EQ(c.tokens_kept(), kT);
  }
  c.compress();
  // The kept rows' K/V are the prompt's, bit for bit (kv_dtype=f32 stores them as given).
  for (std::int64_t h = 0; h < kH; ++h) {
    const HeadRows r = c.stored(0, h);
    for (std::int64_t i = 0; i < r.n_rows; ++i) {
      const std::int64_t src = (h * kT + r.positions[i]) * kD;
      EXPECT_EQ(std::memcmp(r.key_row(i), k.data() + src, kD * sizeof(float)), 0);
      EXPECT_EQ(std::memcmp(r.value_row(i), v.data() + src, kD * sizeof(float)), 0);
    }
  }
  return c;
}

TEST(Kvzip, UniformCutMatchesTheReference) {
  const LayerCache c = run_reference("kvzip:budget=10,n_sink=2,headwise=false,kv_dtype=f32");
  for (std::int64_t h = 0; h < kH; ++h) {
    const auto& want = kUniformKept[static_cast<std::size_t>(h)];
    EXPECT_EQ(positions_of(c, h), Rows(want.begin(), want.end())) << "head " << h;
  }
  EXPECT_EQ(c.tokens_seen(), kT);
}

TEST(Kvzip, HeadwiseCutMatchesTheReference) {
  // The defaults: headwise=true, headwise_floor=0.
  const LayerCache c = run_reference("kvzip:budget=10,n_sink=2,kv_dtype=f32");
  for (std::int64_t h = 0; h < kH; ++h) {
    EXPECT_EQ(positions_of(c, h), kHeadwiseKept[static_cast<std::size_t>(h)]) << "head " << h;
  }
}

TEST(Kvzip, DecodeAfterTheCutAppendsAtTheNextPosition) {
  LayerCache c = run_reference("kvzip:budget=10,n_sink=2,headwise=false,kv_dtype=f32");
  const std::vector<float> k = ref_tensor(7, kH, 1);
  c.update(TensorRef::f32(k.data(), 1, kH, 1, kD), TensorRef::f32(k.data(), 1, kH, 1, kD));
  EXPECT_EQ(positions_of(c, 0).back(), kT) << "the reconstruction rows took no position";
  EXPECT_EQ(c.tokens_kept(), 11) << "decode appends without eviction";
  // compress() with no prompt waiting changes nothing.
  c.compress();
  EXPECT_EQ(c.tokens_kept(), 11);
}

TEST(Kvzip, APromptWhosePassWasNotRunIsNeverCutSilently) {
  test::KV kv(1, kH, kT, kD, 5);
  LayerCache c(CacheConfig::parse("kvzip:budget=10,n_sink=2"), LayerShape{kH, kD, kH * kG, 0, 1});
  c.set_reconstruction(true);
  c.update(kv.keys(0, kT), kv.values(0, kT));
  try {
    c.compress();
    FAIL() << "compress without a reconstruction step";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidState);
    EXPECT_NE(std::string(e.what()).find("reconstruction"), std::string::npos) << e.what();
  }
  EXPECT_EQ(c.tokens_kept(), kT) << "nothing was cut";
  try {
    c.update(kv.keys(0, 1), kv.values(0, 1));
    FAIL() << "a decode step while the prompt waits";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidState);
    EXPECT_NE(std::string(e.what()).find("compress"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(c.step_open());
  EXPECT_EQ(c.tokens_seen(), kT) << "the refused step was rolled back";
}

TEST(Kvzip, ReconstructionStepErrorsRollTheStepBack) {
  test::KV kv(1, kH, kT + kS, kD, 6);
  const std::vector<float> p(static_cast<std::size_t>(kH * kG * kS * (kT + kS)), 0.01f);
  const AttentionRef good{p.data(), 1, kH * kG, kS, kT + kS};
  const AttentionRef bad_shape{p.data(), 1, kH * kG, kS, kT + kS - 1};
  auto expect_refused = [&](LayerCache& c, const AttentionRef* a, ErrorCode code,
                            const char* word) {
    c.begin_step(kv.keys(kT, kS), kv.values(kT, kS));
    try {
      c.end_reconstruction_step(a);
      FAIL() << word;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
    }
    EXPECT_FALSE(c.step_open());
    EXPECT_EQ(c.tokens_seen(), kT);
    EXPECT_EQ(c.tokens_kept(), c.budget() < 0 ? kT : c.tokens_kept());
  };
  {
    LayerCache c(CacheConfig::parse("kvzip:budget=10,n_sink=2"), LayerShape{kH, kD, kH * kG, 0, 1});
    c.update(kv.keys(0, kT), kv.values(0, kT));  // cut by the fallback: no set_reconstruction
    expect_refused(c, &good, ErrorCode::kInvalidState, "set_reconstruction");
  }
  {
    LayerCache c(CacheConfig::parse("kvzip:budget=10,n_sink=2"), LayerShape{kH, kD, kH * kG, 0, 1});
    c.set_reconstruction(true);
    c.update(kv.keys(0, kT), kv.values(0, kT));
    expect_refused(c, &bad_shape, ErrorCode::kShapeMismatch, "[B, Hq, S, R]");
    expect_refused(c, nullptr, ErrorCode::kShapeMismatch, "none");
    EXPECT_EQ(c.tokens_kept(), kT);
  }
  {
    LayerCache c(CacheConfig::parse("h2o:budget=40"), LayerShape{kH, kD, kH * kG, 0, 1});
    EXPECT_FALSE(c.reads_reconstruction());
    EXPECT_EQ(c.reconstruction_chunk(), 0);
    c.set_reconstruction(true);  // ignored
    c.update(kv.keys(0, kT), kv.values(0, kT));
    expect_refused(c, &good, ErrorCode::kInvalidState, "does not score");
    c.compress();  // a no-op
    EXPECT_EQ(c.tokens_kept(), kT);
  }
}

// Without the pass (no set_reconstruction), a prompt step is cut by its own attention: the max
// over its queries and the group's query heads. One KV head, two query heads, 6 rows, budget 4,
// n_sink 1, the probabilities below (causal: zeros above the diagonal). By hand, the maxima of
// columns 1..5 over both tables:
//   col 1: a0 .5 .2 .1 .1 .1, a1 .3 .1 0 0 0   -> .5
//   col 2: a0 .6 .1 .2 .1,    a1 .1 .2 .1 .1   -> .6
//   col 3: a0 .4 .2 .1,       a1 .1 .1 .1      -> .4
//   col 4: a0 .3 .3,          a1 .4 .05        -> .4
//   col 5: a0 .3,             a1 .1            -> .3
// The sink (row 0) stays; the top 3 of the rest: 2 (.6), 1 (.5), then the exact tie of 3 and 4
// (.4f both) goes to the lower index: {0, 1, 2, 3}.
TEST(Kvzip, FallbackWithoutThePassUsesThePromptsOwnAttention) {
  constexpr std::int64_t S = 6;
  test::KV kv(1, 1, S, 2, 9);
  LayerCache c(CacheConfig::parse("kvzip:budget=4,n_sink=1,source=attention,headwise=false"),
               LayerShape{1, 2, 2, 0, 1});
  const float a0[S][S] = {{1, 0, 0, 0, 0, 0},           {.5f, .5f, 0, 0, 0, 0},
                          {.2f, .2f, .6f, 0, 0, 0},     {.4f, .1f, .1f, .4f, 0, 0},
                          {.2f, .1f, .2f, .2f, .3f, 0}, {.1f, .1f, .1f, .1f, .3f, .3f}};
  const float a1[S][S] = {{1, 0, 0, 0, 0, 0},           {.7f, .3f, 0, 0, 0, 0},
                          {.8f, .1f, .1f, 0, 0, 0},     {.7f, 0, .2f, .1f, 0, 0},
                          {.4f, 0, .1f, .1f, .4f, 0},   {.65f, 0, .1f, .1f, .05f, .1f}};
  std::vector<float> p;
  for (const auto* a : {&a0, &a1}) {
    for (std::int64_t t = 0; t < S; ++t) p.insert(p.end(), (*a)[t], (*a)[t] + S);
  }
  c.begin_step(kv.keys(0, S), kv.values(0, S));
  const AttentionRef a{p.data(), 1, 2, S, S};
  c.end_step(&a);
  EXPECT_EQ(positions_of(c, 0), (Rows{0, 1, 2, 3}));
  EXPECT_EQ(c.tokens_seen(), S);
}

TEST(Kvzip, ModelCacheForwardsTheCalls) {
  ModelCache m(CacheConfig::parse("kvzip:budget=8,chunk=64"), ModelShape{2, 1, 4, 2});
  EXPECT_TRUE(m.reads_reconstruction());
  EXPECT_EQ(m.reconstruction_chunk(), 64);
  ModelCache full(CacheConfig::parse("full"), ModelShape{2, 1, 4, 2});
  EXPECT_FALSE(full.reads_reconstruction());
  EXPECT_EQ(full.reconstruction_chunk(), 0);
}

TEST(Kvzip, GqaReduceIsRefusedNotIgnored) {
  // The rule takes the max over the group: gqa_reduce is max, and another value is an error.
  for (const char* spec : {"kvzip:gqa_reduce=mean", "kvzip:gqa_reduce=sum"}) {
    try {
      (void)CacheConfig::parse(spec);
      ADD_FAILURE() << spec << " parsed";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidConfig);
      EXPECT_NE(std::string(e.what()).find("gqa_reduce must be max"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(CacheConfig::parse("kvzip").get_enum("gqa_reduce"), "max");
  EXPECT_NO_THROW((void)CacheConfig::parse("kvzip:gqa_reduce=max,source=attention"));
}

}  // namespace
}  // namespace vq
