// duoattention: retrieval heads keep every row, streaming heads sinks + window. The kept
// positions are checked against values worked out by hand (the arithmetic is in the comments),
// for a hand-made head pattern (set directly and read from a file), the on-the-fly estimate with
// the proxy and with true attention, and the pattern file's error cases.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>

#include "test_util.h"
#include "veloxquant/builder.h"

namespace vq {
namespace {

std::vector<std::int32_t> positions_of(const LayerCache& c, std::int64_t h) {
  const HeadRows r = c.stored(0, h);
  return std::vector<std::int32_t>(r.positions, r.positions + r.n_rows);
}

std::vector<std::int32_t> range(std::int32_t n) {
  std::vector<std::int32_t> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

// Feeds keys k ([H][T][D], one batch element) through update() in steps of `chunk` rows; the
// values are the keys (irrelevant to every rule here).
void feed(LayerCache& c, const std::vector<float>& k, std::int64_t H, std::int64_t T,
          std::int64_t D, std::int64_t chunk) {
  for (std::int64_t t = 0; t < T; t += chunk) {
    const std::int64_t n = std::min(chunk, T - t);
    std::vector<float> part(static_cast<std::size_t>(H * n * D));
    for (std::int64_t h = 0; h < H; ++h) {
      for (std::int64_t s = 0; s < n; ++s) {
        for (std::int64_t d = 0; d < D; ++d) {
          part[static_cast<std::size_t>((h * n + s) * D + d)] =
              k[static_cast<std::size_t>((h * T + t + s) * D + d)];
        }
      }
    }
    c.update(TensorRef::f32(part.data(), 1, H, n, D), TensorRef::f32(part.data(), 1, H, n, D));
  }
}

template <typename Fn>
void expect_err(ErrorCode code, Fn&& fn, const std::vector<std::string>& fragments) {
  test::expect_error(std::forward<Fn>(fn), code, fragments);
}

std::string temp_file(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "duo_" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

// ---- A hand-made pattern ---------------------------------------------------------------------

TEST(DuoAttention, PatternTypesTheHeadsFromTheFirstStep) {
  // 4 KV heads, ratio 0.5: round(0.5 x 4) = 2 retrieval heads, the two highest scores of
  // {0.1, 0.9, 0.5, 0.7}: heads 1 (0.9) and 3 (0.7). Streaming heads keep sinks {0, 1} and the
  // window of 3: after 10 tokens {0, 1, 7, 8, 9}; retrieval heads keep 0..9. Every chunking
  // gives the same (the pattern is known before the first row).
  const std::int64_t H = 4, T = 10, D = 2;
  std::vector<float> k(static_cast<std::size_t>(H * T * D));
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = static_cast<float>(i % 7) - 3.0f;
  for (std::int64_t chunk : {1, 3, 10}) {
    LayerCache c = test::make_cache("duoattention:n_sink=2,window=3,head_ratio=0.5,kv_dtype=f32", H, D);
    c.set_head_pattern({0.1f, 0.9f, 0.5f, 0.7f});
    feed(c, k, H, T, D, chunk);
    const std::vector<std::int32_t> streaming = {0, 1, 7, 8, 9};
    EXPECT_EQ(positions_of(c, 0), streaming) << "chunk " << chunk;
    EXPECT_EQ(positions_of(c, 1), range(10)) << "chunk " << chunk;
    EXPECT_EQ(positions_of(c, 2), streaming) << "chunk " << chunk;
    EXPECT_EQ(positions_of(c, 3), range(10)) << "chunk " << chunk;
    EXPECT_EQ(c.head_types(), (std::vector<std::int32_t>{2, 1, 2, 1}));
    // Bytes per type (kv_dtype=f32: a row is K + V = 2 x 2 x 4 = 16 bytes): retrieval 2 heads x
    // 10 rows x 16 = 320, streaming 2 x 5 x 16 = 160.
    const CacheStats s = c.stats();
    EXPECT_EQ(s.retrieval_heads, 2);
    EXPECT_EQ(s.streaming_heads, 2);
    EXPECT_EQ(s.retrieval_bytes, 320);
    EXPECT_EQ(s.streaming_bytes, 160);
    EXPECT_EQ(s.kept_bytes, 480);
  }
  // After reset() (the pattern is kept): while a streaming head holds at most n_sink + window
  // = 5 rows nothing leaves, so after 5 tokens every head keeps 0..4.
  LayerCache c = test::make_cache("duoattention:n_sink=2,window=3,kv_dtype=f32", H, D);
  c.set_head_pattern({0.1f, 0.9f, 0.5f, 0.7f});
  feed(c, k, H, T, D, 10);
  c.reset();
  std::vector<float> k5(static_cast<std::size_t>(H * 5 * D), 1.0f);
  feed(c, k5, H, 5, D, 1);
  for (std::int64_t h = 0; h < H; ++h) EXPECT_EQ(positions_of(c, h), range(5)) << h;
  EXPECT_EQ(c.head_types(), (std::vector<std::int32_t>{2, 1, 2, 1})) << "kept across reset()";
}

TEST(DuoAttention, RetrievalShareRoundsAndTiesGoToTheLowerHead) {
  // 4 heads, scores {0.5, 0.5, 0.5, 0.2}: ratio 0.5 -> 2 retrieval heads; of three equal
  // scores the lower indices win: heads 0 and 1. ratio 0.375 -> round(1.5) = 2 (halves round
  // up); 0.3 -> round(1.2) = 1 (head 0); 0 -> none; 1 -> all four.
  const std::int64_t H = 4, D = 1;
  const std::vector<float> k(static_cast<std::size_t>(H * 8), 1.0f);
  const std::vector<float> ties = {0.5f, 0.5f, 0.5f, 0.2f};
  auto types = [&](const std::string& ratio) {
    LayerCache c = test::make_cache("duoattention:n_sink=1,window=2,head_ratio=" + ratio, H, D);
    c.set_head_pattern(ties);
    feed(c, k, H, 8, D, 8);
    return c.head_types();
  };
  EXPECT_EQ(types("0.5"), (std::vector<std::int32_t>{1, 1, 2, 2}));
  EXPECT_EQ(types("0.375"), (std::vector<std::int32_t>{1, 1, 2, 2}));
  EXPECT_EQ(types("0.3"), (std::vector<std::int32_t>{1, 2, 2, 2}));
  EXPECT_EQ(types("0"), (std::vector<std::int32_t>{2, 2, 2, 2}));
  EXPECT_EQ(types("1"), (std::vector<std::int32_t>{1, 1, 1, 1}));
}

// ---- The on-the-fly estimate -----------------------------------------------------------------

TEST(DuoAttention, ProxyEstimateByHand) {
  // n_sink 1, window 2, obs_queries 1, head_dim 1 (sqrt(d) = 1), kv_dtype=f32. The one observed
  // query is position r = n_sink + window = 3, whose streaming view misses row 1 (rows 1..r-2).
  // Proxy: the key k3 = 1 as the query, weights softmax(k_i x 1) over rows 0..3.
  //   head 0 keys 0, 5, 0, 1: mass on row 1 = e^5 / (1 + e^5 + 1 + e) = 148.41 / 153.13 = 0.969
  //   head 1 keys 0, 0, 0, 1: 1 / (3 + e) = 0.175
  //   head 2 keys 0,-5, 0, 1: e^-5 / (2 + e^-5 + e) = 0.0067 / 4.725 = 0.0014
  //   head 3 keys 0, 2, 0, 1: e^2 / (2 + e^2 + e) = 7.389 / 12.107 = 0.610
  // Ratio 0.5: retrieval heads 0 and 3; heads 1 and 2 stream. The decision comes after
  // position 3 (4 rows): streaming heads drop row 1 -> {0, 2, 3}; then one row a token: after
  // position 5, {0, 4, 5}. Retrieval heads keep 0..5. Keys 4, 5 (= 1) do not matter.
  const std::int64_t H = 4, T = 6, D = 1;
  const std::vector<float> k = {0, 5, 0, 1, 1, 1,    //
                                0, 0, 0, 1, 1, 1,    //
                                0, -5, 0, 1, 1, 1,   //
                                0, 2, 0, 1, 1, 1};
  for (std::int64_t chunk : {1, 2, 4, 6}) {
    LayerCache c = test::make_cache("duoattention:n_sink=1,window=2,obs_queries=1,kv_dtype=f32", H, D);
    std::vector<float> k4;  // the first 4 tokens of every head
    for (std::int64_t h = 0; h < H; ++h) k4.insert(k4.end(), k.begin() + h * T, k.begin() + h * T + 4);
    feed(c, k4, H, 4, D, std::min<std::int64_t>(chunk, 4));
    EXPECT_EQ(c.head_types(), (std::vector<std::int32_t>{1, 2, 2, 1})) << "chunk " << chunk;
    EXPECT_EQ(positions_of(c, 1), (std::vector<std::int32_t>{0, 2, 3})) << "chunk " << chunk;
    LayerCache d = test::make_cache("duoattention:n_sink=1,window=2,obs_queries=1,kv_dtype=f32", H, D);
    feed(d, k, H, T, D, chunk);
    EXPECT_EQ(positions_of(d, 0), range(6)) << "chunk " << chunk;
    EXPECT_EQ(positions_of(d, 1), (std::vector<std::int32_t>{0, 4, 5})) << "chunk " << chunk;
    EXPECT_EQ(positions_of(d, 2), (std::vector<std::int32_t>{0, 4, 5})) << "chunk " << chunk;
    EXPECT_EQ(positions_of(d, 3), range(6)) << "chunk " << chunk;
  }
  // Before the decision (3 rows, under n_sink + window + obs = 4) every head keeps every row and
  // no head is typed.
  LayerCache c = test::make_cache("duoattention:n_sink=1,window=2,obs_queries=1,kv_dtype=f32", H, D);
  feed(c, std::vector<float>(12, 1.0f), H, 3, D, 3);
  EXPECT_EQ(c.head_types(), (std::vector<std::int32_t>{0, 0, 0, 0}));
  EXPECT_EQ(c.stats().retrieval_heads + c.stats().streaming_heads, 0);
}

TEST(DuoAttention, AttentionEstimateByHand) {
  // 2 KV heads, 4 query heads (2 each, gqa_reduce=mean), n_sink 1, window 2, obs_queries 2: the
  // observed queries are positions 3 (misses row 1) and 4 (misses rows 1, 2), one prefill step
  // of 6 tokens with the probabilities below (rows 0..5, causal).
  //   KV head 0: q3: qh0 row1 0.5, qh1 row1 0.3 -> mean 0.4;
  //              q4: qh0 rows1+2 0.1 + 0.1, qh1 0.2 + 0.2 -> mean 0.3;   score (0.4 + 0.3) / 2 = 0.35
  //   KV head 1: q3: qh2 0.0, qh3 0.6 -> 0.3; q4: qh2 0.3 + 0.3, qh3 0.2 + 0.2 -> 0.5; score 0.4
  // Ratio 0.5 (1 of 2): head 1 retrieves, head 0 streams: {0} + window {4, 5}.
  // The keys would make the proxy choose the other way: head 0's key at row 1 is 5 (the proxy
  // query k3 = 1 pays it e^5 / (e^5 + 2 + e) = 0.97), head 1's 0 (1 / (3 + e) = 0.17).
  const std::int64_t H = 2, Hq = 4, S = 6, D = 1;
  const std::vector<float> k = {0, 5, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1};
  std::vector<float> p(static_cast<std::size_t>(Hq * S * S), 0.0f);
  auto row = [&](std::int64_t qh, std::int64_t s, std::vector<float> v) {
    for (std::size_t r = 0; r < v.size(); ++r) p[static_cast<std::size_t>((qh * S + s) * S) + r] = v[r];
  };
  for (std::int64_t qh = 0; qh < Hq; ++qh) {  // queries 0, 1, 2, 5: uniform (not observed)
    for (std::int64_t s : {0, 1, 2, 5}) {
      row(qh, s, std::vector<float>(static_cast<std::size_t>(s + 1), 1.0f / static_cast<float>(s + 1)));
    }
  }
  row(0, 3, {0.1f, 0.5f, 0.2f, 0.2f});
  row(1, 3, {0.1f, 0.3f, 0.3f, 0.3f});
  row(0, 4, {0.1f, 0.1f, 0.1f, 0.3f, 0.4f});
  row(1, 4, {0.2f, 0.2f, 0.2f, 0.2f, 0.2f});
  row(2, 3, {0.7f, 0.0f, 0.1f, 0.2f});
  row(3, 3, {0.2f, 0.6f, 0.1f, 0.1f});
  row(2, 4, {0.2f, 0.3f, 0.3f, 0.1f, 0.1f});
  row(3, 4, {0.5f, 0.2f, 0.2f, 0.05f, 0.05f});
  LayerCache c(CacheConfig::parse("duoattention:n_sink=1,window=2,obs_queries=2,source=attention,"
                                  "kv_dtype=f32"),
               LayerShape{H, D, Hq, 0, 1});
  c.begin_step(TensorRef::f32(k.data(), 1, H, S, D), TensorRef::f32(k.data(), 1, H, S, D));
  const AttentionRef a{p.data(), 1, Hq, S, S};
  c.end_step(&a);
  EXPECT_EQ(c.head_types(), (std::vector<std::int32_t>{2, 1}));
  EXPECT_EQ(positions_of(c, 0), (std::vector<std::int32_t>{0, 4, 5}));
  EXPECT_EQ(positions_of(c, 1), range(6));
  // The proxy on the same keys chooses the other way. Query 3 (key 1): row 1 gets
  // e^5 / (2 + e^5 + e) = 0.969 in head 0, 1 / (3 + e) = 0.175 in head 1; query 4 (key 1): rows
  // 1, 2 get (e^5 + 1) / (2 + e^5 + 2e) = 0.959 in head 0, 2 / (3 + 2e) = 0.237 in head 1.
  // Scores 0.964 and 0.206: head 0 retrieves.
  LayerCache proxy = test::make_cache("duoattention:n_sink=1,window=2,obs_queries=2,kv_dtype=f32", H, D);
  feed(proxy, k, H, S, D, S);
  EXPECT_EQ(proxy.head_types(), (std::vector<std::int32_t>{1, 2}));
}

// ---- The pattern file ------------------------------------------------------------------------

TEST(DuoAttention, PatternFileSetsEveryLayer) {
  // Two layers of 2 KV heads, ratio 0.5: layer 0 scores 0.2, 0.8 -> head 1 retrieves; layer 1
  // scores 0.9, 0.1 -> head 0. Tabs as in full_attention_heads.tsv, CRLF and a trailing blank
  // line tolerated.
  const std::string path = temp_file("ok.tsv", "0.2\t0.8\r\n0.9\t1e-1\n\n");
  const HeadPattern p = load_head_pattern(path, 2, 2);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0], (std::vector<float>{0.2f, 0.8f}));
  EXPECT_EQ(p[1], (std::vector<float>{0.9f, 0.1f}));
  ModelCache m(CacheConfig::parse("duoattention:n_sink=1,window=2,kv_dtype=f32"), ModelShape{2, 2, 1, 2});
  m.set_head_pattern(p);
  std::vector<float> k(2 * 6, 1.0f);
  for (std::int64_t l = 0; l < 2; ++l) feed(m.layer(l), k, 2, 6, 1, 6);
  EXPECT_EQ(m.layer(0).head_types(), (std::vector<std::int32_t>{2, 1}));
  EXPECT_EQ(m.layer(1).head_types(), (std::vector<std::int32_t>{1, 2}));
  EXPECT_EQ(positions_of(m.layer(0), 0), (std::vector<std::int32_t>{0, 4, 5}));
  EXPECT_EQ(positions_of(m.layer(1), 0), range(6));
  const CacheStats s = m.stats();
  EXPECT_EQ(s.retrieval_heads, 2);
  EXPECT_EQ(s.streaming_heads, 2);
  EXPECT_EQ(s.retrieval_bytes + s.streaming_bytes, s.kept_bytes);
  // Wrong layer count for the model: refused before any layer changes.
  ModelCache fresh(CacheConfig::parse("duoattention"), ModelShape{3, 2, 1, 2});
  expect_err(ErrorCode::kInvalidArgument, [&] { fresh.set_head_pattern(p); },
                     {"expected 3 layers, found 2"});
  expect_err(ErrorCode::kInvalidArgument,
                     [&] { fresh.set_head_pattern({{1, 2}, {1, 2}, {1}}); },
                     {"layer 2", "expected 2 scores", "found 1"});
}

TEST(DuoAttention, PatternFileErrorsNameFileLineExpectedAndFound) {
  const std::string three = temp_file("3.tsv", "0.1\t0.2\n0.3\t0.4\n0.5\t0.6\n");
  expect_err(ErrorCode::kFileError, [&] { load_head_pattern(three, 2, 2); },
                     {three, "line 3", "expected 2 lines (one per layer), found more"});
  expect_err(ErrorCode::kFileError, [&] { load_head_pattern(three, 4, 2); },
                     {three, "expected 4 lines (one per layer), found 3"});
  expect_err(ErrorCode::kFileError, [&] { load_head_pattern(three, 3, 3); },
                     {three, "line 1", "expected 3 numbers (one per KV head), found 2"});
  const std::string word = temp_file("word.tsv", "0.1\t0.2\n0.3\tabc\n");
  expect_err(ErrorCode::kFileError, [&] { load_head_pattern(word, 2, 2); },
                     {word, "line 2", "field 2", "expected a number, found \"abc\""});
  const std::string nan = temp_file("nan.tsv", "nan\t0.2\n");
  expect_err(ErrorCode::kFileError, [&] { load_head_pattern(nan, 1, 2); },
                     {nan, "line 1", "field 1", "expected a finite number, found \"nan\""});
  const std::string inf = temp_file("inf.tsv", "0.5\t-inf\n");
  expect_err(ErrorCode::kFileError, [&] { load_head_pattern(inf, 1, 2); },
                     {"line 1", "field 2", "expected a finite number"});
  const std::string gap = temp_file("gap.tsv", "0.1\t0.2\n\n0.3\t0.4\n");
  expect_err(ErrorCode::kFileError, [&] { load_head_pattern(gap, 2, 2); },
                     {"line 3", "expected only blank lines after the last layer"});
  expect_err(ErrorCode::kFileError,
                     [&] { load_head_pattern(::testing::TempDir() + "duo_missing.tsv", 1, 1); },
                     {"duo_missing.tsv", "cannot be opened"});
}

TEST(DuoAttention, SetterRefusesWhatItCannotUse) {
  LayerCache h2o = test::make_cache("h2o", 2, 4);
  expect_err(ErrorCode::kInvalidArgument, [&] { h2o.set_head_pattern({1, 2}); },
                     {"takes no head pattern"});
  LayerCache c = test::make_cache("duoattention", 2, 4);
  expect_err(ErrorCode::kInvalidArgument, [&] { c.set_head_pattern({1, 2, 3}); },
                     {"expected 2 scores", "found 3"});
  expect_err(ErrorCode::kInvalidArgument, [&] { c.set_head_pattern({1, NAN}); },
                     {"KV head 1", "finite"});
  LayerCache unknown = test::make_cache("duoattention");
  expect_err(ErrorCode::kInvalidArgument, [&] { unknown.set_head_pattern({1, 2}); },
                     {"number of KV heads is not known"});
  std::vector<float> k(2 * 4, 1.0f);
  c.update(TensorRef::f32(k.data(), 1, 2, 1, 4), TensorRef::f32(k.data(), 1, 2, 1, 4));
  expect_err(ErrorCode::kInvalidState, [&] { c.set_head_pattern({1, 2}); },
                     {"before the first step"});
  c.reset();
  EXPECT_NO_THROW(c.set_head_pattern({1, 2}));
  EXPECT_NO_THROW(c.set_head_pattern({}));  // back to the estimate
}

TEST(DuoAttention, BudgetSetsTheWindow) {
  const CacheConfig c = with_token_budget(CacheConfig::parse("duoattention:n_sink=4"), 64);
  EXPECT_EQ(c.get_int("duo_window"), 60);
  EXPECT_EQ(token_budget(c), 64);
  EXPECT_FALSE(find_method("duoattention").exact_budget);
  EXPECT_TRUE(find_method("duoattention").head_types);
  expect_err(ErrorCode::kInvalidConfig,
                     [] { CacheConfig::parse("duoattention:head_ratio=1.5"); }, {"duo_head_ratio"});
  expect_err(ErrorCode::kInvalidConfig,
                     [] { CacheConfig::parse("duoattention:obs_queries=0"); }, {"duo_obs_queries"});
}

}  // namespace
}  // namespace vq
