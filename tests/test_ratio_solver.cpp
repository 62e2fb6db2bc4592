// Equal-memory evaluation (`eval --ratio`): the byte model and budget solver, the best
// configuration per ratio, and the TinyStories development / test split. Every expected value
// is worked out by hand in the comments (stories260K's shapes: 5 layers, 4 KV heads, head_dim 8,
// so an fp16 row of K and V costs 2 x 8 x 2 = 32 bytes per head per layer, 640 bytes over the
// 20 (layer, head) stores).
#include <gtest/gtest.h>

#include "engine_test_util.h"
#include "eval/report/pareto.h"
#include "eval/model/ratio_solver.h"
#include "veloxquant/errors.h"
#include "veloxquant/registry.h"

namespace vq {
namespace {

const eval::KvShape kStories{5, 4, 8, 0};

std::int64_t solved_budget(const std::string& spec, std::int64_t rows, double ratio,
                           std::int64_t offset = 0, std::int64_t below = 0) {
  std::string why;
  const auto c =
      eval::solve_budget(CacheConfig::parse(spec), kStories, rows, ratio, offset, below, &why);
  return c ? c->budget : -1;
}

TEST(RatioSolver, FullCacheBytesByHand) {
  // 511 rows x 640 bytes: the full cache after the 511 tokens a 512-token eval feeds (the
  // main job's full_bytes, results/eval/main.json).
  EXPECT_EQ(eval::full_cache_bytes(kStories, 511), 327040);
  EXPECT_EQ(eval::full_cache_bytes(kStories, 512), 327680);
}

TEST(RatioSolver, Fp16BudgetsByHand) {
  // 512 rows at 8x: 327680 / 8 = 40960 bytes = 64 rows of 640 bytes.
  EXPECT_EQ(solved_budget("streaming_llm", 512, 8), 64);
  EXPECT_EQ(solved_budget("h2o", 512, 8), 64);
  // 511 rows at 8x: 327040 / 8 = 40880 bytes = 63.875 rows: budget 63 (64 would hold 40960).
  EXPECT_EQ(solved_budget("h2o", 511, 8), 63);
  // 512 / 3 = 170.67 rows -> 170; 512 / 32 = 16 rows; 512 / 1 = every row.
  EXPECT_EQ(solved_budget("tova", 512, 3), 170);
  EXPECT_EQ(solved_budget("tova", 512, 32), 16);
  EXPECT_EQ(solved_budget("tova", 512, 1), 512);
  // f32 rows cost twice as much: 64 bytes per store, 1280 over 20; 8x of 512 rows = 32 rows.
  EXPECT_EQ(solved_budget("tova:kv_dtype=f32", 512, 8), 32);
  // predicted kept bytes at budget 63 and 511 rows seen: 63 x 640.
  EXPECT_EQ(eval::predicted_kept_bytes(CacheConfig::parse("h2o:budget=63"), kStories, 511), 40320);
  // A budget above the rows seen holds the rows seen.
  EXPECT_EQ(eval::predicted_kept_bytes(CacheConfig::parse("h2o:budget=600"), kStories, 511),
            327040);
}

TEST(RatioSolver, KiviStoreBytesByHand) {
  // kivi defaults: G = 32, R = 128, 2 bits, head_dim 8 (2 code bytes per row). 511 rows: keys
  // leave the tail by groups, qk = 32 x floor(383 / 32) = 352 quantized keys: codes 352 x 2 =
  // 704, 11 key groups x 8 channels x (fp16 scale + zero) = 352, key tail 159 x 8 x 2 = 2544.
  // Values leave one at a time, qv = 511 - 128 = 383: codes 766, one group per row (8 channels
  // < 32) x 4 = 1532, value tail 128 x 16 = 2048. Total 7946 per store, 158920 over 20 (the
  // kivi row of the main job, measured by the store itself).
  const CacheConfig kivi2 = CacheConfig::parse("kivi");
  EXPECT_EQ(eval::store_bytes(kivi2, 8, 511), 7946);
  EXPECT_EQ(eval::predicted_kept_bytes(kivi2, kStories, 511), 158920);
  // 4 bits: codes 352 x 4 = 1408 and 383 x 4 = 1532: 1408 + 352 + 2544 + 1532 + 1532 + 2048.
  EXPECT_EQ(eval::store_bytes(CacheConfig::parse("kivi:bit_width_inlier=4"), 8, 511), 9416);
  // Up to R = 128 rows nothing is quantized: 100 fp16 rows.
  EXPECT_EQ(eval::store_bytes(kivi2, 8, 100), 3200);
}

TEST(RatioSolver, KiviCompositionBudgetByHand) {
  // h2o:quantize=kivi2 (G = 32, R = 32): n = 32k + 32 + j rows (0 <= j < 32) hold qk = 32k
  // quantized keys at 2 (codes) + 1 (key scale/zero: 32 bytes per 32 rows) and n - qk fp16 keys
  // at 16; qv = n - 32 quantized values at 2 + 4 (scale/zero) and 32 fp16 values at 16. Bytes
  // = 3 qk + 16 (n - qk) + 6 (n - 32) + 512 = 288k + 1024 + 22j. 8x of 511 rows: 40880 / 20 =
  // 2044 bytes per store: 288k + 22j <= 1020 -> k = 3, j <= 7: n = 135 (2042 bytes, 40840 in
  // all); k = 4 already holds 2176. 95 rows (k = 1, j = 31) hold 1994 but 96 (k = 2, j = 0)
  // only 1600: the bytes are not monotone in the rows.
  const std::string spec = "h2o:quantize=kivi2";
  EXPECT_EQ(eval::store_bytes(CacheConfig::parse(spec), 8, 135), 2042);
  EXPECT_EQ(eval::store_bytes(CacheConfig::parse(spec), 8, 95), 1994);
  EXPECT_EQ(eval::store_bytes(CacheConfig::parse(spec), 8, 96), 1600);
  EXPECT_EQ(solved_budget(spec, 511, 8), 135);
  // 32x: 511 bytes per store, but the smallest budget with quantize= is R + G = 64 rows
  // (k = 1, j = 0), which hold 1312: not reachable, and the reason says so.
  std::string why;
  EXPECT_FALSE(eval::solve_budget(CacheConfig::parse(spec), kStories, 511, 32, 0, 0, &why));
  EXPECT_NE(why.find("26240 bytes"), std::string::npos) << why;  // 1312 x 20
  EXPECT_NE(why.find("must be >="), std::string::npos) << why;
}

TEST(RatioSolver, DemotedRowsByHand) {
  // demote=kivi4 (demote_group 32 -> 8 = head_dim): a demoted row costs codes 2 x 8 x 4 / 8 = 8
  // plus one fp16 scale and zero for K and for V = 8: 16 bytes; kivi2: 4 + 8 = 12.
  EXPECT_EQ(eval::demoted_row_bytes(CacheConfig::parse("h2o:demote=kivi4"), 8), 16);
  EXPECT_EQ(eval::demoted_row_bytes(CacheConfig::parse("h2o:demote=kivi2"), 8), 12);
  EXPECT_EQ(eval::demoted_row_bytes(CacheConfig::parse("h2o"), 8), 0);
  // head_dim 128, group 32: codes 2 x 64 = 128 (4 bits), 4 groups x 2 x 4 = 32: 160.
  EXPECT_EQ(eval::demoted_row_bytes(CacheConfig::parse("h2o:demote=kivi4"), 128), 160);
  // h2o at budget 32 with kivi4 after 511 rows: 32 fp16 rows (1024) + 32 demoted (the cap is
  // the budget) x 16 = 1536 per store, 30720 over 20 (13b's measured figure for this spec).
  EXPECT_EQ(eval::predicted_kept_bytes(CacheConfig::parse("h2o:budget=32,demote=kivi4"),
                                       kStories, 511),
            30720);
  // demote_budget 100 but only 511 - 400 = 111 rows evicted beyond budget 400: all demoted
  // would be 111, the cap 100 holds: 400 x 32 + 100 x 16 = 14400 per store.
  EXPECT_EQ(eval::predicted_kept_bytes(
                CacheConfig::parse("h2o:budget=400,demote=kivi4,demote_budget=100"), kStories, 511),
            14400 * 20);
}

TEST(RatioSolver, OffsetAndBelowCorrectTheBudget) {
  // A measured excess of 255 rows (snapkv keeps the decoded rows after its prefill cut):
  // 1.5x of 511 rows = 218026.67 bytes; (b + 255) x 640 <= it -> b <= 85.67 -> 85.
  EXPECT_EQ(solved_budget("h2o", 511, 1.5, 255 * 640), 85);
  // 2x: 163520 bytes; 255 rows already hold 163200, b <= 0.5: no budget.
  EXPECT_EQ(solved_budget("h2o", 511, 2, 255 * 640), -1);
  // 2x without offset: 255.5 rows -> 255; below 200 -> 199.
  EXPECT_EQ(solved_budget("h2o", 511, 2), 255);
  EXPECT_EQ(solved_budget("h2o", 511, 2, 0, 200), 199);
  EXPECT_THROW(solved_budget("h2o", 511, 0.5), Error);
}

TEST(RatioSolver, WidthVariantsAndNearest) {
  // kivi at 511 rows (KiviStoreBytesByHand): 2 bits 327040 / 158920 = 2.06; 4 bits 9416 x 20 =
  // 188320 bytes: 327040 / 188320 = 1.74.
  const auto v = eval::width_variants(CacheConfig::parse("kivi"), kStories, 511);
  ASSERT_EQ(v.size(), 2u);
  EXPECT_NEAR(v[0].predicted_ratio, 327040.0 / 158920.0, 1e-12);
  EXPECT_NEAR(v[1].predicted_ratio, 327040.0 / 188320.0, 1e-12);
  EXPECT_EQ(eval::nearest_width(v, 4).config.get_int("bit_width_inlier"), 2);
  EXPECT_EQ(eval::nearest_width(v, 1.75).config.get_int("bit_width_inlier"), 4);
  // full: quantize none (ratio 1), kivi2, kivi4 (R = 32, G = 32: 511 rows; 2 bits: keys
  // qk = 448 at 2 + 1 and 63 tail keys at 16: 2352; values qv = 479 at 2 + 4 and 32 at 16:
  // 3386; 5738 per store; ratio 16352 / 5738 = 2.85).
  const auto f = eval::width_variants(CacheConfig::parse("full"), kStories, 511);
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(f[0].predicted_ratio, 1.0);
  EXPECT_NEAR(f[1].predicted_ratio, 16352.0 / 5738.0, 1e-12);
  // A method with neither a budget nor a bit width: nothing to vary (full has quantize, so
  // there is none among the registered methods; the empty case is covered by the eval test).
}

TEST(Pareto, BestPerRatioOnAHandMadeTable) {
  const std::vector<eval::ParetoCandidate> c = {
      {2.1, 3.5, 0.01},   // 0
      {4.2, 3.6, 0.02},   // 1
      {8.1, 3.9, 0.05},   // 2
      {8.0, 3.7, 0.04},   // 3: exactly 8x
      {16.5, 3.7, 0.03},  // 4: same perplexity as 3, lower KL, more compression
      {7.99, 3.4, 0.01},  // 5: the best perplexity, but short of 8x
      {40, 9.0, 1.0},     // 6
      {40, 9.0, 1.0},     // 7: identical to 6 -> the earlier wins
  };
  const auto b = eval::best_per_ratio(c, {2, 4, 8, 16, 32, 64});
  ASSERT_EQ(b.size(), 6u);
  EXPECT_EQ(b[0], std::optional<std::size_t>(5));  // 2x: every candidate qualifies; 3.4
  EXPECT_EQ(b[1], std::optional<std::size_t>(5));  // 4x: 1..7 qualify; 3.4
  EXPECT_EQ(b[2], std::optional<std::size_t>(4));  // 8x: 2, 3, 4, 6, 7; 3.7 tie -> KL 0.03
  EXPECT_EQ(b[3], std::optional<std::size_t>(4));  // 16x: 4, 6, 7
  EXPECT_EQ(b[4], std::optional<std::size_t>(6));  // 32x: 6, 7 identical -> 6
  EXPECT_EQ(b[5], std::nullopt);                   // 64x: none
  // By KL (closest to the full cache): 2x: 0 and 5 have KL 0.01, 5 has the lower perplexity;
  // 4x: 5 (0.01); 8x: 4 (0.03, below 3's 0.04 and 2's 0.05); 16x: 4; 32x: 6 (tie with 7).
  const auto k = eval::best_per_ratio(c, {2, 4, 8, 16, 32, 64}, eval::ParetoCriterion::kKl);
  EXPECT_EQ(k[0], std::optional<std::size_t>(5));
  EXPECT_EQ(k[1], std::optional<std::size_t>(5));
  EXPECT_EQ(k[2], std::optional<std::size_t>(4));
  EXPECT_EQ(k[3], std::optional<std::size_t>(4));
  EXPECT_EQ(k[4], std::optional<std::size_t>(6));
  EXPECT_EQ(k[5], std::nullopt);
  // A case where the two disagree: lower perplexity but further from the reference.
  const std::vector<eval::ParetoCandidate> d = {{8, 3.0, 0.5}, {8, 3.2, 0.1}};
  EXPECT_EQ(eval::best_per_ratio(d, {8})[0], std::optional<std::size_t>(0));
  EXPECT_EQ(eval::best_per_ratio(d, {8}, eval::ParetoCriterion::kKl)[0],
            std::optional<std::size_t>(1));
}

TEST(DataSplit, TinyStoriesDevAndTestCutAtAStoryBoundary) {
  const std::string whole = test::read_all(test::data("tinystories_validation_excerpt.txt"));
  const std::string dev = test::read_all(test::data("tinystories_dev.txt"));
  const std::string tst = test::read_all(test::data("tinystories_test.txt"));
  // data/PROVENANCE.md: the first paragraph opening "Once upon a time" at or after byte
  // 32725 / 2 = 16362 starts at byte 16613.
  ASSERT_EQ(whole.size(), 32725u);
  EXPECT_EQ(dev.size(), 16613u);
  EXPECT_EQ(tst.size(), 32725u - 16613u);
  EXPECT_EQ(dev + tst, whole);
  EXPECT_EQ(dev.substr(dev.size() - 2), "\n\n");
  EXPECT_EQ(tst.rfind("Once upon a time, there was a little girl named Amy.", 0), 0u);
  // No story opens between the middle and the cut.
  const std::size_t earlier = whole.find("\n\nOnce upon a time", 32725 / 2);
  EXPECT_EQ(earlier + 2, 16613u);
}

TEST(RatioSolver, ThinkPrunesThePrefilledKeysByHand) {
  // The stories model (5 layers, 4 KV heads, D = 8), 511 rows seen of which 400 were one
  // prefill. think=0.5 keeps 8 - floor(4) = 4 key channels: the 400 prefilled rows hold 4 + 8
  // fp16 elements (24 bytes), the 111 decoded rows 16 (32 bytes), and the channel set 4 x 2 bytes:
  // 9600 + 3552 + 8 = 13160 bytes a store, x 20 stores = 263200. Full: 511 x 32 x 20 = 327040.
  const eval::KvShape prefilled{5, 4, 8, 400};
  const CacheConfig think = CacheConfig::parse("think");
  EXPECT_EQ(eval::store_bytes(think, 8, 511, 400), 13160);
  EXPECT_EQ(eval::predicted_kept_bytes(think, prefilled, 511), 263200);
  // Without a prefill nothing is pruned: the full cache's bytes.
  EXPECT_EQ(eval::predicted_kept_bytes(think, kStories, 511), 327040);
  // Its variants are the pruning shares 0.25, 0.5, 0.75; think=0.75 keeps 2 channels: 400 x 20
  // + 111 x 32 + 4 = 11556 a store, ratio 327040 / (20 x 11556) = 1.415.
  const std::vector<eval::WidthChoice> v = eval::width_variants(think, prefilled, 511);
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(v[2].config.spec(), "think:think=0.75");
  EXPECT_NEAR(v[2].predicted_ratio, 327040.0 / (20.0 * 11556.0), 1e-12);
  EXPECT_EQ(eval::nearest_width(v, 2.0).config.spec(), "think:think=0.75");
}

}  // namespace
}  // namespace vq
