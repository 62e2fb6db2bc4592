// compress_interval (the schedule group): evict every N tokens instead of every token. The
// expected rows are derived by hand from the rule (a head holds up to budget + N - 1 rows; the
// token that brings it to budget + N cuts it back to budget in one decision, by the method's
// own ranking), and a property every method on the token loop must keep.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "test_util.h"
#include "veloxquant/builder.h"
#include "veloxquant/registry.h"

namespace vq {
namespace {

using Rows = std::vector<std::int32_t>;

Rows positions_of(const LayerCache& c) { return test::stored_positions(c, 0, 0); }

// One token a step, one head of D = 2, key (x, 0) for the given x.
std::vector<Rows> run_keys(const std::string& spec, const std::vector<float>& xs) {
  LayerCache c(CacheConfig::parse(spec + ",kv_dtype=f32"), LayerShape{1, 2, 0, 0, 1});
  std::vector<Rows> out;
  for (float x : xs) {
    const float kv[2] = {x, 0.0f};
    c.update(TensorRef::f32(kv, 1, 1, 1, 2), TensorRef::f32(kv, 1, 1, 1, 2));
    out.push_back(positions_of(c));
  }
  return out;
}

TEST(CompressInterval, StreamingSlidesItsWindowEveryNTokens) {
  // Budget 4 = 1 sink + 3; N = 3: up to 6 rows. Token 6 makes 7: the 3 oldest non-sink rows
  // (1, 2, 3) leave at once; tokens 7 and 8 grow it to 6 again; token 9 cuts 4, 5, 6.
  const std::vector<float> xs(10, 1.0f);
  const auto got = run_keys("streaming_llm:n_sink=1,window_size=3,compress_interval=3", xs);
  const std::vector<Rows> want = {{0},          {0, 1},          {0, 1, 2},       {0, 1, 2, 3},
                                  {0, 1, 2, 3, 4}, {0, 1, 2, 3, 4, 5}, {0, 4, 5, 6},
                                  {0, 4, 5, 6, 7}, {0, 4, 5, 6, 7, 8}, {0, 7, 8, 9}};
  EXPECT_EQ(got, want);
  // N = 1 is the paper's rule: the sink and the 3 newest after every token.
  EXPECT_EQ(run_keys("streaming_llm:n_sink=1,window_size=3,compress_interval=1", xs).back(),
            (Rows{0, 7, 8, 9}));
  EXPECT_EQ(run_keys("streaming_llm:n_sink=1,window_size=3", xs)[6], (Rows{0, 4, 5, 6}));
}

TEST(CompressInterval, KnormCutsTheLargestNormsAtOnce) {
  // knorm keeps low key norms; budget 3, no sinks, no protected window, N = 3: up to 5 rows.
  // Norms by position: 5 1 4 2 3 6 0.5 7 2.5.
  // Token 5 makes 6 rows: the 3 lowest of {5, 1, 4, 2, 3, 6} stay: positions 1 (1), 3 (2), 4 (3).
  // Tokens 6, 7: 5 rows. Token 8 makes 6: the lowest of {1, 2, 3, 0.5, 7, 2.5} are 0.5 (6),
  // 1 (1), 2 (3).
  const std::vector<float> xs = {5, 1, 4, 2, 3, 6, 0.5f, 7, 2.5f};
  const auto got = run_keys("knorm:budget=3,n_sink=0,grace=0,compress_interval=3", xs);
  EXPECT_EQ(got[4], (Rows{0, 1, 2, 3, 4}));
  EXPECT_EQ(got[5], (Rows{1, 3, 4}));
  EXPECT_EQ(got[7], (Rows{1, 3, 4, 6, 7}));
  EXPECT_EQ(got[8], (Rows{1, 3, 6}));
  // Every token (N = 1): after token 4 the budget already holds: 5 (0) left at token 3, 4 (2)
  // at token 4.
  const auto each = run_keys("knorm:budget=3,n_sink=0,grace=0", xs);
  EXPECT_EQ(each[4], (Rows{1, 3, 4}));
}

// The registry's methods that take compress_interval: every method on the token loop with a
// token budget, none other.
TEST(CompressInterval, TheTokenLoopMethodsHaveTheField) {
  std::vector<std::string> with;
  for (const MethodInfo& m : registry()) {
    bool has = false;
    for (const FieldSpec& f : m.fields) has = has || f.name == "compress_interval";
    EXPECT_EQ(has, m.token_loop && !m.budget_field.empty()) << m.id;
    if (has) with.push_back(m.id);
  }
  for (const char* id : {"streaming_llm", "h2o", "tova", "knorm", "lagkv", "random", "chunkkv"}) {
    EXPECT_NE(std::find(with.begin(), with.end(), id), with.end()) << id;
  }
  for (const char* id : {"full", "kivi", "snapkv", "duoattention", "expected_attention"}) {
    EXPECT_EQ(std::find(with.begin(), with.end(), id), with.end()) << id;
  }
  test::expect_error([] { (void)CacheConfig::parse("h2o:compress_interval=0"); },
                     ErrorCode::kInvalidConfig, {"compress_interval"});
  test::expect_error([] { (void)CacheConfig::parse("snapkv:compress_interval=4"); },
                     ErrorCode::kInvalidSpec, {"unknown key 'compress_interval'"});
}

// Every method with the field, on random keys and true attention in steps of 1 to 5 tokens:
// between steps no head holds more than budget + N - 1 rows, and a step that evicted leaves
// a single-token step that evicted leaves the head at the budget (exactly, for the methods
// whose budget is exact; chunkkv evicts whole chunks), a longer one at most its later tokens
// above it.
TEST(CompressInterval, EveryMethodHoldsAtMostBudgetPlusNMinusOne) {
  constexpr std::int64_t H = 2, D = 8, Hq = 4, N = 5;
  const test::KV kv(1, H, 80, D, 7);
  for (const MethodInfo& m : registry()) {
    if (!(m.token_loop && !m.budget_field.empty())) continue;
    const CacheConfig cfg =
        with_token_budget(CacheConfig::parse(m.id + ":compress_interval=5"), 24);
    LayerCache c(cfg, LayerShape{H, D, Hq, 0, 1});
    std::int64_t t = 0, step = 0;
    bool cut_seen = false, above_budget = false;
    while (t < kv.S) {
      const std::int64_t n = std::min<std::int64_t>(1 + step % 5, kv.S - t);
      std::vector<std::int64_t> before(H);
      for (std::int64_t h = 0; h < H; ++h) before[static_cast<std::size_t>(h)] = c.stored(0, h).n_rows;
      const StepView v = c.begin_step(kv.keys(t, n), kv.values(t, n));
      const std::int64_t R = v.n_rows();
      std::vector<float> att(static_cast<std::size_t>(Hq * n * R), 0.0f);
      for (std::int64_t q = 0; q < Hq; ++q) {
        for (std::int64_t s = 0; s < n; ++s) {
          const std::int64_t visible = R - n + s + 1;  // causal within the step
          for (std::int64_t r = 0; r < visible; ++r) {
            att[static_cast<std::size_t>((q * n + s) * R + r)] =
                static_cast<float>(1 + (r * 7 + q * 3 + s) % 5) / static_cast<float>(3 * visible);
          }
        }
      }
      const AttentionRef a{att.data(), 1, Hq, n, R};
      c.end_step(&a);
      for (std::int64_t h = 0; h < H; ++h) {
        const std::int64_t rows = c.stored(0, h).n_rows;
        EXPECT_LE(rows, 24 + N - 1) << m.id << " step " << step << " head " << h;
        above_budget = above_budget || rows > 24;
        if (rows < before[static_cast<std::size_t>(h)] + n) {
          // A cut in this step: to the budget, after which at most the step's later tokens
          // (n - 1 of them) arrived; a single-token step ends at the cut.
          cut_seen = true;
          EXPECT_LE(rows, 24 + n - 1) << m.id << " step " << step << " head " << h;
          if (n == 1) {
            EXPECT_LE(rows, 24) << m.id << " step " << step << " head " << h;
          }
          if (n == 1 && m.exact_budget) {
            EXPECT_EQ(rows, 24) << m.id << " step " << step << " head " << h;
          }
        }
      }
      t += n;
      ++step;
    }
    EXPECT_TRUE(cut_seen) << m.id;
    EXPECT_TRUE(above_budget) << m.id << ": the interval never let a head past its budget";
  }
}

}  // namespace
}  // namespace vq
