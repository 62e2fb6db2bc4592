// simlayerkv: which rows a lazy and a busy layer keep, against attention matrices written by
// hand (the mass worked out in the comments) and a NumPy reference of the proxy path.
#include <gtest/gtest.h>

#include <functional>
#include <numeric>

#include "test_util.h"

namespace vq {
namespace {

constexpr std::int64_t kHq = 2, kD = 2;

std::vector<std::int32_t> positions_of(const LayerCache& c, std::int64_t h = 0) {
  const HeadRows r = c.stored(0, h);
  return std::vector<std::int32_t>(r.positions, r.positions + r.n_rows);
}

std::vector<std::int32_t> range(std::int32_t n) {
  std::vector<std::int32_t> out(static_cast<std::size_t>(n));
  std::iota(out.begin(), out.end(), 0);
  return out;
}

// Sets p[(q, j)] (a row of R probabilities of query head q, new token j); returns false to
// leave the row uniform over the rows the token may see (its own position and before).
using Probs = std::function<bool(std::int64_t q, std::int64_t j, std::vector<float>& row)>;

// One step of S new tokens (one KV head, B = 1, Hq = 2) with probabilities from `probs`.
void step(LayerCache& c, std::int64_t t0, std::int64_t S, const Probs& probs) {
  std::vector<float> k(static_cast<std::size_t>(S * kD)), v(k.size());
  for (std::int64_t i = 0; i < S * kD; ++i) {
    k[static_cast<std::size_t>(i)] = 0.25f * static_cast<float>((t0 * kD + i) % 7) - 0.5f;
    v[static_cast<std::size_t>(i)] = static_cast<float>(i);
  }
  const StepView view = c.begin_step(TensorRef::f32(k.data(), 1, 1, S, kD),
                                     TensorRef::f32(v.data(), 1, 1, S, kD));
  const std::int64_t R = view.n_rows();
  const HeadRows& rows = view.head(0, 0);
  std::vector<float> p(static_cast<std::size_t>(kHq * S * R), 0.0f);
  for (std::int64_t q = 0; q < kHq; ++q) {
    for (std::int64_t j = 0; j < S; ++j) {
      std::vector<float> row(static_cast<std::size_t>(R), 0.0f);
      if (!probs(q, j, row)) {
        std::int64_t seen = 0;
        for (std::int64_t r = 0; r < R; ++r) seen += rows.positions[r] <= t0 + j ? 1 : 0;
        for (std::int64_t r = 0; r < R; ++r) {
          row[static_cast<std::size_t>(r)] =
              rows.positions[r] <= t0 + j ? 1.0f / static_cast<float>(seen) : 0.0f;
        }
      }
      std::copy(row.begin(), row.end(), p.begin() + (q * S + j) * R);
    }
  }
  const AttentionRef ref{p.data(), 1, kHq, S, R};
  c.end_step(&ref);
}

const Probs kUniform = [](std::int64_t, std::int64_t, std::vector<float>&) { return false; };

LayerCache attention_cache(const std::string& threshold = "0.75") {
  return LayerCache(CacheConfig::parse("simlayerkv:n_initial=2,n_recent=4,n_last=2,threshold=" +
                                       threshold + ",source=attention,kv_dtype=f32"),
                    LayerShape{1, kD, kHq, 0, 1});
}

// The prefill of 10 rows (R = 10 > W = 6): the window is rows {0, 1} and {6, 7, 8, 9}; the last
// n_last = 2 queries (tokens 8 and 9) of both query heads decide. Each matrix below lists the
// nonzero probabilities of those four rows; the mass is the mean of their window sums.
//   lazy:  h0 t8: p0 .5, p8 .5 (window 1) | h0 t9: p0 .25, p3 .25, p9 .5 (.75)
//          h1 t8: p1 .5, p2 .25, p7 .25 (.75) | h1 t9: p0 .5, p5 .25, p6 .25 (.75)
//          mass = (1 + .75 + .75 + .75) / 4 = .8125 > .75: lazy.
//   edge:  as lazy but h1 t8: p1 .25, p2 .25, p4 .25, p7 .25 (.5):
//          mass = (1 + .75 + .5 + .75) / 4 = .75, not > .75: busy (lazy with threshold .749).
//   busy:  as edge but h0 t8: p2 .5, p3 .5 (0): mass = (0 + .75 + .5 + .75) / 4 = .5: busy.
// Every value is a multiple of 1/16, so the sums are exact.
enum class Case { kLazy, kEdge, kBusy };
Probs prefill_probs(Case c) {
  return [c](std::int64_t q, std::int64_t j, std::vector<float>& row) {
    if (j < 8) return false;
    auto set = [&row](std::initializer_list<std::pair<int, float>> ps) {
      for (const auto& [i, x] : ps) row[static_cast<std::size_t>(i)] = x;
    };
    if (q == 0 && j == 8) {
      if (c == Case::kBusy) {
        set({{2, .5f}, {3, .5f}});
      } else {
        set({{0, .5f}, {8, .5f}});
      }
    } else if (q == 0 && j == 9) {
      set({{0, .25f}, {3, .25f}, {9, .5f}});
    } else if (q == 1 && j == 8) {
      if (c == Case::kLazy) {
        set({{1, .5f}, {2, .25f}, {7, .25f}});
      } else {
        set({{1, .25f}, {2, .25f}, {4, .25f}, {7, .25f}});
      }
    } else {
      set({{0, .5f}, {5, .25f}, {6, .25f}});
    }
    return true;
  };
}

TEST(SimLayerKV, PrefillLazyLayerKeepsTheInitialAndRecentRows) {
  LayerCache c = attention_cache();
  step(c, 0, 10, prefill_probs(Case::kLazy));
  EXPECT_EQ(positions_of(c), (std::vector<std::int32_t>{0, 1, 6, 7, 8, 9}));
  // Row scores: each kept row's mean probability over the four deciding rows, by hand:
  // row 0: (.5 + .25 + 0 + .5) / 4 = .3125; row 1: .5 / 4; row 6: .25 / 4; row 7: .25 / 4;
  // row 8: .5 / 4; row 9: .5 / 4.
  EXPECT_EQ(c.row_scores(0, 0),
            (std::vector<float>{0.3125f, 0.125f, 0.0625f, 0.0625f, 0.125f, 0.125f}));
  // Decode: a lazy layer slides its window (StreamingLLM), whatever the new queries attend to.
  for (std::int64_t t = 10; t < 13; ++t) step(c, t, 1, kUniform);
  EXPECT_EQ(positions_of(c), (std::vector<std::int32_t>{0, 1, 9, 10, 11, 12}));
}

TEST(SimLayerKV, MassEqualToTheThresholdIsNotLazy) {
  LayerCache busy = attention_cache();
  step(busy, 0, 10, prefill_probs(Case::kEdge));
  EXPECT_EQ(positions_of(busy), range(10));
  LayerCache lazy = attention_cache("0.749");
  step(lazy, 0, 10, prefill_probs(Case::kEdge));
  EXPECT_EQ(positions_of(lazy), (std::vector<std::int32_t>{0, 1, 6, 7, 8, 9}));
}

TEST(SimLayerKV, BusyLayerKeepsEveryRowAndStaysBusy) {
  LayerCache c = attention_cache();
  step(c, 0, 10, prefill_probs(Case::kBusy));
  EXPECT_EQ(positions_of(c), range(10));
  // Later queries that attend only to row 0 (the window) do not reopen the decision.
  const Probs on_first = [](std::int64_t, std::int64_t, std::vector<float>& row) {
    row[0] = 1.0f;
    return true;
  };
  for (std::int64_t t = 10; t < 14; ++t) step(c, t, 1, on_first);
  EXPECT_EQ(positions_of(c), range(14));
  // reset() forgets the decision: the lazy prefill now makes the layer lazy.
  c.reset();
  step(c, 0, 10, prefill_probs(Case::kLazy));
  EXPECT_EQ(positions_of(c), (std::vector<std::int32_t>{0, 1, 6, 7, 8, 9}));
}

// Token by token: nothing is decided while the layer holds at most W = 6 rows; the 7th token
// decides with its own query (q = min(n_last 2, S 1) = 1 row per query head). The window of
// R = 7 rows is {0, 1} and {3, 4, 5, 6}: only row 2 is outside.
//   busy (edge): h0: p2 .5, p6 .5 (window .5); h1: p0 1 (1): mass (.5 + 1) / 2 = .75: busy.
//   lazy:        h0: p2 .25, p6 .75 (.75);     h1: p0 1 (1): mass .875: lazy.
TEST(SimLayerKV, TokenByTokenDecidesAtTheRowAfterTheWindow) {
  for (const bool lazy : {false, true}) {
    LayerCache c = attention_cache();
    for (std::int64_t t = 0; t < 6; ++t) step(c, t, 1, kUniform);
    EXPECT_EQ(positions_of(c), range(6));
    step(c, 6, 1, [lazy](std::int64_t q, std::int64_t, std::vector<float>& row) {
      if (q == 1) {
        row[0] = 1.0f;
      } else {
        row[2] = lazy ? .25f : .5f;
        row[6] = lazy ? .75f : .5f;
      }
      return true;
    });
    const std::vector<std::int32_t> lazy7{0, 1, 3, 4, 5, 6}, lazy8{0, 1, 4, 5, 6, 7};
    EXPECT_EQ(positions_of(c), lazy ? lazy7 : range(7));
    step(c, 7, 1, kUniform);
    EXPECT_EQ(positions_of(c), lazy ? lazy8 : range(8));
  }
}

// The proxy path against tests/simlayerkv_reference.py (two KV heads, d = 2, keys below): the
// mass of a 12-row prefill is 0.288458755 and, fed token by token (decided at R = 5), 0.752307400
// (n_initial 1, n_recent 3, n_last 2). Thresholds 1e-4 below make the layer lazy, 1e-4 above
// busy.
std::vector<std::int32_t> proxy_kept(double threshold, std::int64_t chunk, std::int64_t T,
                                     std::int64_t head) {
  constexpr std::int64_t H = 2;
  std::vector<float> k(static_cast<std::size_t>(H * T * kD)), v(k.size(), 1.0f);
  for (std::int64_t h = 0; h < H; ++h) {
    for (std::int64_t t = 0; t < T; ++t) {
      float* key = k.data() + (h * T + t) * kD;
      key[0] = static_cast<float>((t * (2 * h + 3)) % 5 - 2) / 2.0f + (t == 0 ? 3.0f : 0.0f);
      key[1] = static_cast<float>((t * t + h) % 3 - 1) / 2.0f + (t == 0 ? 3.0f : 0.0f);
    }
  }
  LayerCache c(CacheConfig::parse("simlayerkv:n_initial=1,n_recent=3,n_last=2,source=proxy,"
                                  "kv_dtype=f32,threshold=" +
                                  std::to_string(threshold)),
               LayerShape{H, kD, H, 0, 1});
  for (std::int64_t t = 0; t < T; t += chunk) {
    const std::int64_t n = std::min(chunk, T - t);
    TensorRef kr = TensorRef::f32(k.data() + t * kD, 1, H, n, kD);
    TensorRef vr = TensorRef::f32(v.data() + t * kD, 1, H, n, kD);
    kr.stride[1] = vr.stride[1] = T * kD;
    kr.stride[0] = vr.stride[0] = H * T * kD;
    c.update(kr, vr);
  }
  return positions_of(c, head);
}

TEST(SimLayerKV, ProxyPrefillMatchesTheNumpyReference) {
  for (std::int64_t h = 0; h < 2; ++h) {
    EXPECT_EQ(proxy_kept(0.2884, 12, 12, h), (std::vector<std::int32_t>{0, 9, 10, 11}));
    EXPECT_EQ(proxy_kept(0.2886, 12, 12, h), range(12));
  }
}

TEST(SimLayerKV, ProxyTokenByTokenMatchesTheNumpyReference) {
  for (std::int64_t h = 0; h < 2; ++h) {
    EXPECT_EQ(proxy_kept(0.7522, 1, 5, h), (std::vector<std::int32_t>{0, 2, 3, 4}));
    EXPECT_EQ(proxy_kept(0.7522, 1, 12, h), (std::vector<std::int32_t>{0, 9, 10, 11}));
    EXPECT_EQ(proxy_kept(0.7524, 1, 12, h), range(12));
  }
}

// A busy layer (threshold 1: a mass never exceeds it while rows outside the window get some
// attention) stores exactly what `full` stores, plain or KIVI-quantized, fed in any chunks:
// after its decision it appends rows as `full` does.
TEST(SimLayerKV, BusyLayerStoresAsFull) {
  test::KV kv(1, 2, 150, 16, 77);
  for (const std::string extra : {"", ",quantize=kivi2"}) {
    for (std::int64_t chunk : {1, 13, 100}) {
      LayerCache sim = test::make_cache("simlayerkv:threshold=1,budget=64" + extra);
      LayerCache full = test::make_cache(extra.empty() ? "full" : "full:" + extra.substr(1));
      test::feed(sim, kv, chunk);
      test::feed(full, kv, chunk);
      EXPECT_TRUE(test::snapshot(sim, 1, 2) == test::snapshot(full, 1, 2)) << extra << " " << chunk;
      EXPECT_EQ(sim.kept_bytes(), full.kept_bytes()) << extra << " " << chunk;
    }
  }
}

TEST(SimLayerKV, BudgetSetsTheRecentWindow) {
  const CacheConfig c = with_token_budget(CacheConfig::parse("simlayerkv:n_initial=4"), 64);
  EXPECT_EQ(c.get_int("sim_n_recent"), 60);
  EXPECT_EQ(token_budget(c), 64);
  EXPECT_EQ(token_budget(CacheConfig("simlayerkv")), 256);
  EXPECT_THROW(CacheConfig::parse("simlayerkv:threshold=1.5"), Error);
  EXPECT_THROW(CacheConfig::parse("simlayerkv:n_last=0"), Error);
  EXPECT_FALSE(CacheConfig("simlayerkv").has("headwise"));
  // The mass averages every query head: folding a KV head's query heads has no effect.
  EXPECT_THROW(CacheConfig::parse("simlayerkv:source=attention,gqa_reduce=max"), Error);
  EXPECT_NO_THROW(CacheConfig::parse("simlayerkv:source=attention,gqa_reduce=mean"));
}

}  // namespace
}  // namespace vq
