// Conformance: every registered method, without editing this file when methods are added.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "attention_util.h"
#include "test_util.h"

namespace vq {
namespace {

using test::KV;

class Conformance : public ::testing::TestWithParam<std::string> {
 protected:
  // The method with budget `budget` (when it has one) and its other defaults. The contracts of
  // uniform budgets run with headwise=false (a method whose default is head-wise,
  // criticaladakv, included); the head-wise ones (HeadwiseKeepsTheLayerTotalExact, ...) ask for
  // headwise=true.
  CacheConfig config(std::int64_t budget, const std::string& extra = "") const {
    CacheConfig c = extra.empty() ? CacheConfig(GetParam()) : CacheConfig::parse(GetParam() + ":" + extra);
    if (c.has("headwise") && extra.find("headwise") == std::string::npos) c.set("headwise", false);
    if (has_token_budget(c)) c = with_token_budget(c, budget);
    return c;
  }
  // The shape comes with the first step; a method that needs key filters (qfilters) gets
  // test::give_key_filters' for the KV it is fed.
  LayerCache cache(std::int64_t budget, const std::string& extra, const KV& kv) const {
    LayerCache c(config(budget, extra), LayerShape{0, 0, 0, 0, 1});
    test::give_key_filters(c, kv.H, kv.D);
    return c;
  }
  LayerCache cache(std::int64_t budget, const KV& kv) const { return cache(budget, "", kv); }
};

TEST_P(Conformance, BudgetHeldAfterEveryUpdate) {
  const MethodInfo& m = find_method(GetParam());
  for (std::int64_t chunk : {1, 7, 64}) {
    KV kv(2, 3, 160, 16, 100 + chunk);
    LayerCache c = cache(40, kv);
    const std::int64_t budget = c.budget();
    std::int64_t expected = 0;  // for prefill-only methods: budget after chunks, growth after singles
    for (std::int64_t t = 0; t < kv.S; t += chunk) {
      const std::int64_t n = std::min(chunk, kv.S - t);
      c.update(kv.keys(t, n), kv.values(t, n));
      expected = (m.prefill_only && n == 1) ? expected + 1 : std::min(expected + n, budget);
      const std::vector<std::int32_t> types = c.head_types();
      for (std::size_t i = 0; i < types.size() && m.head_types; ++i) {
        // Head types: a streaming head (2) holds the budget, any other head every row.
        EXPECT_EQ(c.stats().tokens_kept_per_head[i],
                  types[i] == 2 ? std::min(c.tokens_seen(), budget) : c.tokens_seen())
            << "chunk " << chunk << " t " << t << " head " << i;
      }
      for (std::int64_t kept : c.stats().tokens_kept_per_head) {
        if (m.head_types) {
          break;  // checked above
        } else if (budget < 0) {
          EXPECT_EQ(kept, c.tokens_seen());
        } else if (m.all_or_window) {  // every row, or the window (LayerKeepsAllOrItsWindow)
          EXPECT_TRUE(kept == c.tokens_seen() || kept == budget) << "chunk " << chunk << " t " << t;
        } else if (m.prefill_only) {
          EXPECT_EQ(kept, expected) << "chunk " << chunk << " t " << t;
        } else if (m.exact_budget) {
          EXPECT_EQ(kept, std::min(c.tokens_seen(), budget)) << "chunk " << chunk << " t " << t;
        } else {
          EXPECT_LE(kept, budget) << "chunk " << chunk << " t " << t;
          EXPECT_GE(kept, std::min(c.tokens_seen(), budget / 2)) << "chunk " << chunk << " t " << t;
        }
      }
      if (!m.head_types) {
        EXPECT_EQ(c.stats().tokens_kept_per_head, std::vector<std::int64_t>(6, c.tokens_kept()))
            << "every head holds the same number of rows";
      }
    }
  }
}

// Head-wise budgets (headwise=true, every method that has the option): after every step each
// batch element's heads hold exactly Hkv x budget rows together (Hkv x tokens before the budget
// is reached; prefill-only methods: at prefill chunks, then decode grows by one row per head),
// each head at least its floor, sinks kept, positions increasing; deterministic; with the
// attention source (engine-like probabilities over heads of unequal rows) and the proxy.
TEST_P(Conformance, HeadwiseKeepsTheLayerTotalExact) {
  const MethodInfo& m = find_method(GetParam());
  if (!CacheConfig(GetParam()).has("headwise"))
    GTEST_SKIP() << GetParam() << " has no headwise option";
  constexpr std::int64_t B = 2, H = 4, Hq = 8, D = 8, S = 150;
  const double alpha = 0.25;
  for (const char* source : {"attention", "proxy"}) {
    const std::string extra = std::string("headwise=true,headwise_floor=0.25,source=") + source;
    KV kv(B, H, S, D, 515);
    const std::vector<float> q = test::randn(static_cast<std::size_t>(B * Hq * S * D), 516);
    std::vector<test::Snapshot> runs;
    for (int run = 0; run < 2; ++run) {
      LayerCache c(config(48, extra), LayerShape{H, D, Hq, 0, 1});
      const std::int64_t budget = c.budget();
      const std::int64_t n_sink = c.config().has("n_sink") ? c.config().get_int("n_sink") : 0;
      const auto floor_rows = static_cast<std::int64_t>(alpha * static_cast<double>(budget));
      std::vector<std::int64_t> expected(B, 0);
      bool unequal = false;
      std::uint64_t state = 77;
      for (std::int64_t t = 0; t < S;) {
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        const std::int64_t n = std::min<std::int64_t>(
            S - t, t == 0 ? 60 : 1 + static_cast<std::int64_t>((state >> 33) % 9));
        if (std::string(source) == "attention") {
          test::feed_attention(c, kv, q, Hq, n, t, t + n);
        } else {
          c.update(kv.keys(t, n), kv.values(t, n));
        }
        t += n;
        const std::vector<std::int64_t> kept = c.stats().tokens_kept_per_head;
        for (std::int64_t b = 0; b < B; ++b) {
          std::int64_t& e = expected[static_cast<std::size_t>(b)];
          e = (m.prefill_only && n == 1) ? e + H : std::min(e + H * n, H * budget);
          std::int64_t total = 0;
          for (std::int64_t h = 0; h < H; ++h) {
            const std::int64_t k = kept[static_cast<std::size_t>(b * H + h)];
            total += k;
            unequal = unequal || k != kept[static_cast<std::size_t>(b * H)];
            if (t >= budget) {
              EXPECT_GE(k, floor_rows)
                  << GetParam() << " " << source << " t " << t << " head " << h;
            }
            const HeadRows r = c.stored(b, h);
            for (std::int64_t i = 0; i < r.n_rows; ++i) {
              if (i < n_sink) {
                EXPECT_EQ(r.positions[i], i) << GetParam() << " sinks";
              }
              if (i > 0) {
                EXPECT_LT(r.positions[i - 1], r.positions[i]) << GetParam();
              }
            }
          }
          ASSERT_EQ(total, e) << GetParam() << " " << source << " t " << t << " b " << b;
        }
      }
      EXPECT_TRUE(unequal) << GetParam() << " " << source << ": every head kept the same count";
      runs.push_back(test::snapshot(c, B, H));
    }
    EXPECT_TRUE(runs[0] == runs[1]) << GetParam() << " " << source << ": not deterministic";
  }
}

// headwise_floor=1 guarantees every head its own budget, which leaves nothing to share: the
// uniform split row for row, so head-wise with floor 1 must store exactly what headwise=false
// stores (tova with the attention source aside: uniform, it ranks by the layer-wide mean).
TEST_P(Conformance, HeadwiseWithFloorOneEqualsUniform) {
  if (!CacheConfig(GetParam()).has("headwise")) GTEST_SKIP() << GetParam() << " has no headwise option";
  constexpr std::int64_t B = 2, H = 3, Hq = 6, D = 8, S = 120;
  KV kv(B, H, S, D, 525);
  const std::vector<float> q = test::randn(static_cast<std::size_t>(B * Hq * S * D), 526);
  for (const char* source : {"attention", "proxy"}) {
    if (GetParam() == "tova" && std::string(source) == "attention") continue;
    for (std::int64_t chunk : {1, 50}) {
      LayerCache uniform(config(48, std::string("source=") + source), LayerShape{H, D, Hq, 0, 1});
      LayerCache floor1(config(48, std::string("source=") + source + ",headwise=true,headwise_floor=1"),
                        LayerShape{H, D, Hq, 0, 1});
      for (LayerCache* c : {&uniform, &floor1}) {
        if (std::string(source) == "attention") {
          test::feed_attention(*c, kv, q, Hq, chunk, 0, 70);
          test::feed_attention(*c, kv, q, Hq, 1, 70, S);
        } else {
          test::feed(*c, kv, chunk, 0, 70);
          test::feed(*c, kv, 1, 70, S);
        }
      }
      EXPECT_TRUE(test::snapshot(uniform, B, H) == test::snapshot(floor1, B, H))
          << GetParam() << " " << source << " chunk " << chunk;
    }
  }
}

TEST_P(Conformance, SinksKeptBitExact) {
  const CacheConfig probe(GetParam());
  if (!probe.has("n_sink")) GTEST_SKIP() << GetParam() << " has no sinks";
  KV kv(1, 2, 120, 8, 7);
  LayerCache c = cache(48, kv);
  const std::int64_t n_sink = c.config().get_int("n_sink");
  ASSERT_GT(n_sink, 0);
  test::feed(c, kv, 3);
  for (std::int64_t h = 0; h < 2; ++h) {
    const HeadRows r = c.stored(0, h);
    for (std::int64_t i = 0; i < n_sink; ++i) {
      EXPECT_EQ(r.positions[i], i);
      for (std::int64_t d = 0; d < 8; ++d) {
        EXPECT_EQ(r.key(i, d), half_to_float(float_to_half(kv.k[(h * 120 + i) * 8 + d])));
        EXPECT_EQ(r.value(i, d), half_to_float(float_to_half(kv.v[(h * 120 + i) * 8 + d])));
      }
    }
  }
}

TEST_P(Conformance, BudgetCoveringEveryTokenEqualsFull) {
  KV kv(2, 2, 50, 8, 8);
  // A method whose defaults prune key channels (think > 0: the `think` method) keeps full's rows
  // with the keys of a prefill chunk's rows pruned: its positions and values equal full's, each
  // key element equals full's or is 0, and it holds fewer bytes; token by token it is full.
  const CacheConfig probe = config(64);
  const bool prunes = probe.has("think") && probe.get_float("think") > 0.0;
  for (std::int64_t chunk : {1, 50}) {
    LayerCache c = cache(64, kv), full = test::make_cache("full");
    test::feed(c, kv, chunk);
    test::feed(full, kv, chunk);
    const test::Snapshot a = test::snapshot(c, 2, 2), f = test::snapshot(full, 2, 2);
    if (!prunes || chunk == 1) {
      EXPECT_TRUE(a == f) << "chunk " << chunk;
      EXPECT_EQ(c.kept_bytes(), full.kept_bytes());
      continue;
    }
    EXPECT_EQ(a.positions, f.positions);
    EXPECT_EQ(a.values, f.values);
    for (std::size_t h = 0; h < a.keys.size(); ++h) {
      ASSERT_EQ(a.keys[h].size(), f.keys[h].size());
      for (std::size_t i = 0; i < a.keys[h].size(); ++i) {
        EXPECT_TRUE(a.keys[h][i] == f.keys[h][i] || a.keys[h][i] == 0.0f) << "head " << h << " " << i;
      }
    }
    EXPECT_LT(c.kept_bytes(), full.kept_bytes());
  }
}

TEST_P(Conformance, DeterministicAndChunkingInvariant) {
  KV kv(1, 3, 150, 16, 9);
  for (std::int64_t chunk : {1, 13}) {
    LayerCache a = cache(48, kv), b = cache(48, kv);
    test::feed(a, kv, chunk);
    test::feed(b, kv, chunk);
    EXPECT_TRUE(test::snapshot(a, 1, 3) == test::snapshot(b, 1, 3)) << "same inputs, different state";
  }
  // Decides per chunk by design (prefill-only), or at the step that crosses the window with that
  // step's queries (all-or-window: the deciding step depends on the chunking).
  if (find_method(GetParam()).prefill_only || find_method(GetParam()).all_or_window) return;
  LayerCache a = cache(48, kv), c = cache(48, kv);
  test::feed(a, kv, 1);
  test::feed(c, kv, 13);
  EXPECT_TRUE(test::snapshot(a, 1, 3) == test::snapshot(c, 1, 3))
      << "chunk of 13 differs from single tokens";
}

TEST_P(Conformance, MergingVariantsAreDeterministicToo) {
  const CacheConfig probe(GetParam());
  if (!probe.has("merge")) GTEST_SKIP() << GetParam() << " has no merge disposition";
  KV kv(1, 2, 120, 8, 10);
  for (const char* extra : {"target=nearest,merge=sim_weighted",
                            "target=nearest,merge=mean,merge_gate=false,merge_keys=true",
                            "target=window,merge=mean,merge_m=4"}) {
    LayerCache a = cache(48, extra, kv), b = cache(48, extra, kv), c = cache(48, extra, kv);
    test::feed(a, kv, 3);
    test::feed(b, kv, 3);
    EXPECT_TRUE(test::snapshot(a, 1, 2) == test::snapshot(b, 1, 2)) << extra;
    if (find_method(GetParam()).prefill_only || find_method(GetParam()).all_or_window) continue;
    test::feed(c, kv, 1);
    EXPECT_TRUE(test::snapshot(a, 1, 2) == test::snapshot(c, 1, 2)) << extra;
  }
}

TEST_P(Conformance, ResetForgetsEverything) {
  KV kv(1, 2, 120, 8, 11), other(1, 2, 120, 8, 12);
  LayerCache fresh = cache(48, kv), reused = cache(48, kv);
  test::feed(reused, other, 4);
  reused.reset();
  EXPECT_EQ(reused.tokens_seen(), 0);
  EXPECT_EQ(reused.kept_bytes(), 0);
  test::feed(fresh, kv, 4);
  test::feed(reused, kv, 4);
  EXPECT_TRUE(test::snapshot(fresh, 1, 2) == test::snapshot(reused, 1, 2));
}

TEST_P(Conformance, DeferredEvictionOnEveryStep) {
  KV kv(1, 2, 120, 8, 13);
  LayerCache c = cache(48, kv);
  for (std::int64_t t = 0; t < kv.S; t += 5) {
    const test::Snapshot before = test::snapshot(c, 1, 2);
    const KVRows rows = c.update(kv.keys(t, 5), kv.values(t, 5));
    // The rows of the head that kept the most (heads differ with head types).
    const auto most = static_cast<std::int64_t>(
        std::max(before.positions[0].size(), before.positions[1].size()));
    for (std::int64_t h = 0; h < 2; ++h) {
      const std::int64_t kept = static_cast<std::int64_t>(before.positions[h].size());
      ASSERT_EQ(rows.n_rows, most + 5);
      for (std::int64_t r = 0; r < kept; ++r) {
        ASSERT_EQ(rows.position(0, h, r), before.positions[h][r]);
        for (std::int64_t d = 0; d < 8; ++d) {
          ASSERT_EQ(rows.value(0, h, r)[d], before.values[h][r * 8 + d]);
        }
      }
      for (std::int64_t s = 0; s < 5; ++s) ASSERT_EQ(rows.position(0, h, kept + s), t + s);
    }
  }
}

// Head types (MethodInfo::head_types, duoattention): after every step, once typed, a retrieval
// head (1) holds every position in order and a streaming head (2) its n_sink sinks and then the
// most recent budget - n_sink positions; untyped heads (0) hold every position; the stats count
// the heads of each type and their bytes add up to kept_bytes; with true attention and the
// proxy, chunked and token by token.
TEST_P(Conformance, HeadTypesKeepEveryRowOrSinksAndWindow) {
  const MethodInfo& m = find_method(GetParam());
  if (!m.head_types) GTEST_SKIP() << GetParam() << " has no head types";
  constexpr std::int64_t B = 2, H = 4, Hq = 8, D = 8, S = 140;
  KV kv(B, H, S, D, 545);
  const std::vector<float> q = test::randn(static_cast<std::size_t>(B * Hq * S * D), 546);
  for (const char* source : {"attention", "proxy"}) {
    for (std::int64_t chunk : {1, 50}) {
      LayerCache c(config(40, std::string("source=") + source), LayerShape{H, D, Hq, 0, 1});
      const std::int64_t budget = c.budget();
      const std::int64_t n_sink = c.config().get_int("n_sink");
      bool typed = false;
      for (std::int64_t t = 0; t < S; t += chunk) {
        const std::int64_t n = std::min(chunk, S - t);
        if (std::string(source) == "attention") {
          test::feed_attention(c, kv, q, Hq, n, t, t + n);
        } else {
          test::feed(c, kv, n, t, t + n);
        }
        const std::int64_t seen = c.tokens_seen();
        const std::vector<std::int32_t> types = c.head_types();
        const CacheStats s = c.stats();
        std::int64_t n_ret = 0, n_str = 0;
        for (std::int64_t i = 0; i < B * H; ++i) {
          const std::int32_t type = types[static_cast<std::size_t>(i)];
          n_ret += type == 1;
          n_str += type == 2;
          typed = typed || type != 0;
          const HeadRows r = c.stored(i / H, i % H);
          std::vector<std::int32_t> want;
          for (std::int64_t p = 0; p < seen; ++p) {
            if (type != 2 || p < n_sink || p >= std::max(n_sink, seen - (budget - n_sink))) {
              want.push_back(static_cast<std::int32_t>(p));
            }
          }
          ASSERT_EQ(std::vector<std::int32_t>(r.positions, r.positions + r.n_rows), want)
              << GetParam() << " " << source << " chunk " << chunk << " t " << t << " head " << i;
        }
        EXPECT_EQ(s.retrieval_heads, n_ret);
        EXPECT_EQ(s.streaming_heads, n_str);
        if (n_ret + n_str == B * H) {
          EXPECT_EQ(s.retrieval_bytes + s.streaming_bytes, s.kept_bytes);
        }
      }
      EXPECT_TRUE(typed) << GetParam() << " " << source << " chunk " << chunk
                         << ": no head was typed";
    }
  }
}

TEST_P(Conformance, StatsAreConsistent) {
  KV kv(1, 2, 100, 8, 14);
  LayerCache c = cache(48, kv);
  test::feed(c, kv, 10);
  const CacheStats s = c.stats();
  EXPECT_EQ(s.tokens_seen, 100);
  EXPECT_EQ(s.full_bytes, 100 * 2 * 8 * 2 * 2);
  EXPECT_GT(s.kept_bytes, 0);
  EXPECT_DOUBLE_EQ(s.compression_ratio,
                   static_cast<double>(s.full_bytes) / static_cast<double>(s.kept_bytes));
}

// demote= on every method with a token budget (a merge disposition, which demote excludes, is
// set to drop): the method's budget rows and at most demote_budget demoted rows per head, every
// head alike; sinks first and bit exact; distinct true positions; deterministic, chunking
// invariant (prefill-only methods aside) and reset-clean; deferred eviction (a step returns the
// rows held before it, demoted ones included, then the new rows); fewer bytes than fp16 rows.
TEST_P(Conformance, DemoteKeepsTheContracts) {
  const CacheConfig probe(GetParam());
  if (!has_token_budget(probe)) GTEST_SKIP() << GetParam() << " has no token budget";
  const MethodInfo& m = find_method(GetParam());
  std::string extra = "demote=kivi2,demote_budget=24";
  if (probe.has("merge") && probe.get_enum("merge") != "drop") extra += ",merge=drop";
  KV kv(1, 3, 150, 16, 15);
  for (std::int64_t chunk : {1, 13}) {
    LayerCache c = cache(48, extra, kv);
    const std::int64_t budget = c.budget();
    for (std::int64_t t = 0; t < kv.S; t += chunk) {
      const test::Snapshot before = test::snapshot(c, 1, 3);
      const std::int64_t n = std::min(chunk, kv.S - t);
      const KVRows rows = c.update(kv.keys(t, n), kv.values(t, n));
      std::int64_t most = 0;  // the rows of the head that kept the most (head types differ)
      for (const auto& p : before.positions) most = std::max(most, static_cast<std::int64_t>(p.size()));
      for (std::int64_t h = 0; h < 3; ++h) {
        const std::int64_t kept =
            static_cast<std::int64_t>(before.positions[static_cast<std::size_t>(h)].size());
        ASSERT_EQ(rows.n_rows, most + n);
        for (std::int64_t r = 0; r < kept; ++r) {
          ASSERT_EQ(rows.position(0, h, r),
                    before.positions[static_cast<std::size_t>(h)][static_cast<std::size_t>(r)]);
          ASSERT_EQ(
              rows.value(0, h, r)[3],
              before.values[static_cast<std::size_t>(h)][static_cast<std::size_t>(r * 16 + 3)]);
        }
      }
      const CacheStats s = c.stats();
      if (m.head_types) {  // heads of different types hold (and demote) different rows
        EXPECT_LE(s.demoted_rows, 3 * 24);
        continue;
      }
      EXPECT_EQ(s.tokens_kept_per_head, std::vector<std::int64_t>(3, c.tokens_kept()));
      const std::int64_t demoted = s.demoted_rows / 3;
      EXPECT_EQ(s.demoted_rows % 3, 0);
      EXPECT_LE(demoted, 24);
      if (m.exact_budget && !m.prefill_only) {
        EXPECT_EQ(c.tokens_kept(), std::min(c.tokens_seen(), budget + 24))
            << "chunk " << chunk << " t " << t;
        EXPECT_EQ(demoted,
                  std::min<std::int64_t>(std::max<std::int64_t>(c.tokens_seen() - budget, 0), 24));
      }
    }
    const CacheStats s = c.stats();
    if (!(m.prefill_only && chunk == 1)) {  // a prefill-only method evicts only from chunks
      EXPECT_GT(s.demoted_rows, 0) << "nothing was demoted";
      std::int64_t rows = 0;
      for (std::int64_t k : s.tokens_kept_per_head) rows += k;
      EXPECT_LT(s.kept_bytes, rows * 16 * 2 * 2) << "demoted rows cost fp16 bytes";
    }
    const std::int64_t n_sink = probe.has("n_sink") ? c.config().get_int("n_sink") : 0;
    for (std::int64_t h = 0; h < 3; ++h) {
      const HeadRows r = c.stored(0, h);
      std::vector<std::int32_t> pos(r.positions, r.positions + r.n_rows);
      for (std::int64_t i = 0; i < n_sink; ++i) {
        EXPECT_EQ(pos[static_cast<std::size_t>(i)], i);
        EXPECT_EQ(
            r.key(i, 5),
            half_to_float(float_to_half(kv.k[static_cast<std::size_t>((h * 150 + i) * 16 + 5)])));
      }
      std::sort(pos.begin(), pos.end());
      EXPECT_TRUE(std::adjacent_find(pos.begin(), pos.end()) == pos.end()) << "a position twice";
      EXPECT_LT(pos.back(), kv.S);
    }
  }
  LayerCache a = cache(48, extra, kv), b = cache(48, extra, kv), c = cache(48, extra, kv);
  test::feed(a, kv, 1);
  test::feed(b, kv, 1);
  EXPECT_TRUE(test::snapshot(a, 1, 3) == test::snapshot(b, 1, 3)) << "not deterministic";
  test::feed(c, kv, 13);
  if (!m.prefill_only && !m.all_or_window) {
    EXPECT_TRUE(test::snapshot(a, 1, 3) == test::snapshot(c, 1, 3)) << "chunk of 13 differs";
  }
  c.reset();
  EXPECT_EQ(c.stats().demoted_rows, 0);
  EXPECT_EQ(c.kept_bytes(), 0);
  test::feed(c, kv, 1);
  EXPECT_TRUE(test::snapshot(a, 1, 3) == test::snapshot(c, 1, 3)) << "reset left state behind";
}

// All-or-window methods (simlayerkv): after every step each layer holds every position seen, or
// exactly its window, the first `offset` positions (budget_offset's field) and the newest
// budget - offset; every head of the layer (every batch element) alike; once a window, always a
// window (until reset()); with the proxy (update()) and with engine-like attention, any chunking.
TEST_P(Conformance, LayerKeepsAllOrItsWindow) {
  const MethodInfo& m = find_method(GetParam());
  if (!m.all_or_window) GTEST_SKIP() << GetParam() << " is not an all-or-window method";
  constexpr std::int64_t B = 2, H = 3, Hq = 6, D = 16, S = 160;
  KV kv(B, H, S, D, 530);
  const std::vector<float> q = test::randn(static_cast<std::size_t>(B * Hq * S * D), 531);
  for (const char* source : {"proxy", "attention"}) {
    for (std::int64_t chunk : {1, 7, 64}) {
      LayerCache c(config(40, std::string("source=") + source), LayerShape{H, D, Hq, 0, 1});
      const std::int64_t budget = c.budget();
      const std::int64_t offset = c.config().get_int(m.budget_offset);
      ASSERT_GT(budget, offset);
      bool window = false;
      for (std::int64_t t = 0; t < S;) {
        const std::int64_t n = std::min(chunk, S - t);
        if (std::string(source) == "attention") {
          test::feed_attention(c, kv, q, Hq, n, t, t + n);
        } else {
          c.update(kv.keys(t, n), kv.values(t, n));
        }
        t += n;
        std::vector<std::int32_t> all(static_cast<std::size_t>(t)), win;
        std::iota(all.begin(), all.end(), 0);
        for (std::int32_t p = 0; p < t; ++p) {
          if (p < offset || p >= t - (budget - offset)) win.push_back(p);
        }
        const bool was_window = window;
        for (std::int64_t i = 0; i < B * H; ++i) {
          const HeadRows r = c.stored(i / H, i % H);
          const std::vector<std::int32_t> pos(r.positions, r.positions + r.n_rows);
          const bool is_all = pos == all, is_window = pos == win;
          ASSERT_TRUE(is_all || is_window) << GetParam() << " " << source << " chunk " << chunk
                                           << " t " << t << " head " << i;
          if (t > budget) {
            if (i == 0) window = is_window;
            EXPECT_EQ(is_window, window) << "the heads of a layer disagree, head " << i;
          }
        }
        if (was_window) {
          EXPECT_TRUE(window) << GetParam() << " " << source << ": a window grew back, t " << t;
        }
      }
    }
  }
}

// The method's own rows do not change with demote=: with the proxy (update()), the rows a method
// keeps in fp16 are exactly the rows it keeps without the option (the proxy scores only those
// rows), and the demoted rows follow them.
TEST_P(Conformance, DemoteLeavesTheMethodsRowsAsWithout) {
  const CacheConfig probe(GetParam());
  if (!has_token_budget(probe)) GTEST_SKIP() << GetParam() << " has no token budget";
  const std::string drop =
      probe.has("merge") && probe.get_enum("merge") != "drop" ? "merge=drop" : "";
  KV kv(1, 2, 130, 8, 16);
  for (std::int64_t chunk : {1, 9}) {
    LayerCache plain = cache(40, drop, kv);
    LayerCache mixed = cache(40, drop.empty() ? "demote=kivi4,demote_budget=16"
                                              : drop + ",demote=kivi4,demote_budget=16", kv);
    test::feed(plain, kv, chunk);
    test::feed(mixed, kv, chunk);
    const std::int64_t demoted = mixed.stats().demoted_rows / 2;
    for (std::int64_t h = 0; h < 2; ++h) {
      const HeadRows a = plain.stored(0, h), b = mixed.stored(0, h);
      if (find_method(GetParam()).head_types) {  // only the streaming heads demote
        ASSERT_GE(b.n_rows, a.n_rows) << "chunk " << chunk;
      } else {
        ASSERT_EQ(b.n_rows, a.n_rows + demoted) << "chunk " << chunk;
      }
      for (std::int64_t i = 0; i < a.n_rows; ++i) {
        ASSERT_EQ(a.positions[i], b.positions[i]) << "chunk " << chunk << " row " << i;
        for (std::int64_t d = 0; d < 8; ++d) {
          ASSERT_EQ(a.key(i, d), b.key(i, d));
          ASSERT_EQ(a.value(i, d), b.value(i, d));
        }
      }
    }
  }
}

// ---- Per-layer budgets inside a ModelCache (pyramidkv, squeeze) ----
//
// Driven as an engine drives it: a prefill chunk, then one token per step, each step through
// every layer in order (with true attention from random queries, or the proxy). After every
// step each layer holds exactly min(tokens seen, its own budget) rows per head, with its true
// positions, sinks first; the budgets' mean is exactly the requested budget; two identical
// runs are bit-identical.

class PerLayerConformance : public ::testing::TestWithParam<std::string> {};

struct ModelRun {
  std::vector<test::Snapshot> layers;
  std::vector<std::int64_t> budgets;
};

ModelRun drive(const std::string& spec, std::int64_t prefill, std::int64_t total,
               bool check_every_step) {
  constexpr std::int64_t L = 4, H = 2, Hq = 4, D = 8, C = 16;
  const CacheConfig config = with_token_budget(CacheConfig::parse(spec), C);
  const bool attention = config.has("source") && config.get_enum("source") == "attention";
  const std::int64_t n_sink = config.get_int("n_sink");
  ModelCache m(config, ModelShape{L, H, D, Hq});
  test::give_key_filters(m);
  std::vector<KV> kv;
  std::vector<std::vector<float>> q;
  for (std::int64_t l = 0; l < L; ++l) {
    kv.emplace_back(1, H, total, D, 200 + static_cast<std::uint64_t>(l));
    // Layers differ in how peaked their attention is (the squeeze signal).
    for (auto& x : kv.back().k) x *= 0.4f * static_cast<float>(l + 1);
    q.push_back(test::randn(static_cast<std::size_t>(Hq * total * D), 300 + static_cast<std::uint64_t>(l)));
  }
  for (std::int64_t t = 0; t < total;) {
    const std::int64_t n = t == 0 ? prefill : 1;
    for (std::int64_t l = 0; l < L; ++l) {
      if (attention) {
        m.observe_layer_similarity(l, l == L - 1 ? 0.99 : 0.5);
        test::feed_attention(m.layer(l), kv[static_cast<std::size_t>(l)], q[static_cast<std::size_t>(l)], Hq, n, t, t + n);
      } else {
        test::feed(m.layer(l), kv[static_cast<std::size_t>(l)], n, t, t + n);
      }
    }
    t += n;
    if (!check_every_step) continue;
    const std::vector<std::int64_t> b = m.layer_budgets();
    EXPECT_EQ(std::accumulate(b.begin(), b.end(), std::int64_t{0}), L * C) << spec << " t " << t;
    for (std::int64_t l = 0; l < L; ++l) {
      const LayerCache& c = m.layer(l);
      for (std::int64_t h = 0; h < H; ++h) {
        const HeadRows r = c.stored(0, h);
        EXPECT_EQ(r.n_rows, std::min(t, b[static_cast<std::size_t>(l)])) << spec << " layer " << l << " t " << t;
        for (std::int64_t i = 0; i < r.n_rows; ++i) {
          if (i < n_sink) {
            EXPECT_EQ(r.positions[i], i) << spec << " sinks";
          }
          if (i > 0) {
            EXPECT_LT(r.positions[i - 1], r.positions[i]) << spec;
          }
          EXPECT_LT(r.positions[i], t) << spec;
        }
      }
    }
  }
  ModelRun out;
  for (std::int64_t l = 0; l < L; ++l) out.layers.push_back(test::snapshot(m.layer(l), 1, H));
  out.budgets = m.layer_budgets();
  return out;
}

TEST_P(PerLayerConformance, EachLayerHoldsItsOwnBudgetAndTheMeanIsExact) {
  for (std::int64_t prefill : {1, 40}) {
    const ModelRun a = drive(GetParam(), prefill, 70, true);
    EXPECT_EQ(std::accumulate(a.budgets.begin(), a.budgets.end(), std::int64_t{0}), 4 * 16);
    EXPECT_NE(*std::min_element(a.budgets.begin(), a.budgets.end()),
              *std::max_element(a.budgets.begin(), a.budgets.end()))
        << GetParam() << ": the layers should get different budgets";
    const ModelRun b = drive(GetParam(), prefill, 70, false);
    EXPECT_EQ(a.budgets, b.budgets);
    for (std::size_t l = 0; l < a.layers.size(); ++l) {
      EXPECT_TRUE(a.layers[l] == b.layers[l]) << GetParam() << " layer " << l << ": not deterministic";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(PerLayer, PerLayerConformance,
                         ::testing::Values("pyramidkv", "pyramidkv:source=attention", "squeeze",
                                           "squeeze:source=attention"),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                           std::string name = p.param;
                           for (char& ch : name) {
                             if (ch == ':' || ch == '=') ch = '_';
                           }
                           return name;
                         });

INSTANTIATE_TEST_SUITE_P(EveryMethod, Conformance, ::testing::ValuesIn(method_ids()),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                           return p.param;
                         });

}  // namespace
}  // namespace vq
