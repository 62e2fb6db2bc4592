// PackedRows::load_rows (the bulk read the engine's attention uses) against the row-at-a-time
// reads: for KIVI stores (2 and 4 bits, several head_dims including ones whose last code byte
// or last value group is partial, fp16 and fp32 tails) and the mixed-precision tier, filled with
// random rows, with evictions (so key groups are merged and re-quantized) and read both between
// steps and in the middle of one (rows appended, settled but not yet compacted). Every element
// must be bit-identical to load_key / load_value and to key_at / value_at (the per-element path,
// which shares no unpacking code with the bulk one).
#include <cstring>
#include <random>
#include <vector>

#include "store/store.h"
#include "test_util.h"

namespace vq {
namespace {

std::uint32_t bits_of(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// Reads rows [r0, r1) with load_rows at a row stride of D + 3 (the padding must stay untouched)
// and compares every element, bit for bit, with load_key / load_value and key_at / value_at.
void expect_bulk_matches(const PackedRows& p, std::int64_t D, std::int64_t r0, std::int64_t r1,
                         const std::string& what) {
  const std::int64_t stride = D + 3, n = r1 - r0;
  constexpr float kPad = -12345.0f;
  std::vector<float> k(static_cast<std::size_t>(n * stride), kPad), v(k.size(), kPad);
  p.load_rows(r0, r1, stride, k.data(), v.data());
  std::vector<float> rk(static_cast<std::size_t>(D)), rv(rk.size());
  for (std::int64_t r = r0; r < r1; ++r) {
    p.load_key(r, rk.data());
    p.load_value(r, rv.data());
    for (std::int64_t d = 0; d < D; ++d) {
      const float bk = k[static_cast<std::size_t>((r - r0) * stride + d)];
      const float bv = v[static_cast<std::size_t>((r - r0) * stride + d)];
      ASSERT_EQ(bits_of(bk), bits_of(rk[static_cast<std::size_t>(d)]))
          << what << " key row " << r << " channel " << d;
      ASSERT_EQ(bits_of(bv), bits_of(rv[static_cast<std::size_t>(d)]))
          << what << " value row " << r << " channel " << d;
      ASSERT_EQ(bits_of(bk), bits_of(p.key_at(r, d))) << what << " key_at " << r << "," << d;
      ASSERT_EQ(bits_of(bv), bits_of(p.value_at(r, d))) << what << " value_at " << r << "," << d;
    }
    for (std::int64_t d = D; d < stride; ++d) {
      ASSERT_EQ(k[static_cast<std::size_t>((r - r0) * stride + d)], kPad) << what;
      ASSERT_EQ(v[static_cast<std::size_t>((r - r0) * stride + d)], kPad) << what;
    }
  }
  // Either half alone (the other pointer null) reads the same bits.
  std::vector<float> k_only(k.size(), kPad), v_only(k.size(), kPad);
  p.load_rows(r0, r1, stride, k_only.data(), nullptr);
  p.load_rows(r0, r1, stride, nullptr, v_only.data());
  for (std::size_t i = 0; i < k.size(); ++i) {
    ASSERT_EQ(bits_of(k_only[i]), bits_of(k[i])) << what << " keys only, element " << i;
    ASSERT_EQ(bits_of(v_only[i]), bits_of(v[i])) << what << " values only, element " << i;
  }
}

// The whole store and a few sub-ranges (starting inside key groups and inside the tail).
void expect_all_ranges(const detail::RowStore& s, std::int64_t D, std::mt19937& rng,
                       const std::string& what) {
  const HeadRows rows = s.rows();
  ASSERT_NE(rows.packed, nullptr) << what;
  const std::int64_t n = rows.n_rows;
  expect_bulk_matches(*rows.packed, D, 0, n, what + " [0, n)");
  for (int t = 0; t < 4 && n > 0; ++t) {
    const auto a = static_cast<std::int64_t>(rng() % static_cast<std::uint32_t>(n));
    const auto b = a + static_cast<std::int64_t>(rng() % static_cast<std::uint32_t>(n - a + 1));
    expect_bulk_matches(*rows.packed, D, a, b, what + " sub-range");
  }
}

std::vector<float> random_rows(std::mt19937& rng, std::int64_t n, std::int64_t D) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> scale(0.01f, 8.0f);
  std::vector<float> x(static_cast<std::size_t>(n * D));
  for (std::int64_t i = 0; i < n; ++i) {
    const float s = scale(rng);  // rows of different magnitudes
    for (std::int64_t d = 0; d < D; ++d) x[static_cast<std::size_t>(i * D + d)] = s * normal(rng);
  }
  return x;
}

TEST(PackedRowsBulk, KiviMatchesRowReadsBitForBit) {
  std::mt19937 rng(20261201);
  for (int bits : {2, 4}) {
    for (std::int64_t D : {1, 3, 7, 64, 70, 129}) {
      for (std::int64_t G : {4, 32}) {
        for (DType tail : {DType::kF16, DType::kF32}) {
          const std::string what = "bits " + std::to_string(bits) + " D " + std::to_string(D) +
                                   " G " + std::to_string(G) +
                                   (tail == DType::kF16 ? " f16" : " f32");
          const std::int64_t residual = 3;
          auto s = detail::make_kivi_store(bits, G, residual, tail, D);
          std::vector<std::int64_t> live;
          std::int32_t pos = 0;
          // A prompt of 3G + 5 rows, then 2G + 3 decode steps of one row; every 7th step evicts
          // the oldest live row but one (so quantized rows and key groups are dropped and
          // groups merge).
          for (int step = 0; step < 2 * G + 4; ++step) {
            const std::int64_t S = step == 0 ? 3 * G + 5 : 1;
            const std::vector<float> k = random_rows(rng, S, D), v = random_rows(rng, S, D);
            const std::int64_t n0 = s->size();
            s->append(TensorRef::f32(k.data(), 1, 1, S, D), TensorRef::f32(v.data(), 1, 1, S, D), 0,
                      0, pos);
            pos += static_cast<std::int32_t>(S);
            for (std::int64_t i = n0; i < n0 + S; ++i) live.push_back(i);
            if (step % 5 == 2) expect_all_ranges(*s, D, rng, what + " mid-step, appended");
            if (step % 7 == 6 && live.size() > 2) live.erase(live.begin() + 1);
            s->settle(live.data(), static_cast<std::int64_t>(live.size()));
            if (step % 5 == 3) expect_all_ranges(*s, D, rng, what + " mid-step, settled");
            s->keep(live.data(), static_cast<std::int64_t>(live.size()));
            for (std::size_t j = 0; j < live.size(); ++j) live[j] = static_cast<std::int64_t>(j);
            expect_all_ranges(*s, D, rng, what + " step " + std::to_string(step));
            if (HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

TEST(PackedRowsBulk, MixedTierMatchesRowReadsBitForBit) {
  std::mt19937 rng(77);
  for (int bits : {2, 4}) {
    for (std::int64_t D : {3, 7, 64, 70}) {
      for (std::int64_t G : {5, 32}) {
        const std::string what = "demote bits " + std::to_string(bits) + " D " + std::to_string(D) +
                                 " G " + std::to_string(G);
        auto s = detail::make_mixed_store(bits, G, 6, DType::kF16, D);
        std::vector<std::int64_t> live;
        std::int32_t pos = 0;
        for (int step = 0; step < 12; ++step) {
          const std::int64_t S = step == 0 ? 9 : 1;
          const std::vector<float> k = random_rows(rng, S, D), v = random_rows(rng, S, D);
          const std::int64_t n0 = s->size();
          s->append(TensorRef::f32(k.data(), 1, 1, S, D), TensorRef::f32(v.data(), 1, 1, S, D), 0,
                    0, pos);
          pos += static_cast<std::int32_t>(S);
          // The method's rows: the fp16 rows kept so far, then the step's new ones (the demoted
          // rows sit between them; keep() takes fp16 rows only, the tier stays on its own).
          const std::int64_t n_demoted = s->n_demoted();
          std::vector<std::int64_t> method;
          for (std::int64_t i = 0; i < n0 - n_demoted; ++i) method.push_back(i);
          for (std::int64_t i = n0; i < n0 + S; ++i) method.push_back(i);
          if (s->n_demoted() > 0) expect_all_ranges(*s, D, rng, what + " mid-step");
          // Demote the second-oldest fp16 row each step (score: its step number).
          std::vector<std::int64_t> keep;
          for (std::int64_t j = 0; j < static_cast<std::int64_t>(method.size()); ++j) {
            if (j == 1) {
              s->demote(method[static_cast<std::size_t>(j)], static_cast<float>(step));
            } else {
              keep.push_back(method[static_cast<std::size_t>(j)]);
            }
          }
          s->keep(keep.data(), static_cast<std::int64_t>(keep.size()));
          if (s->n_demoted() > 0) expect_all_ranges(*s, D, rng, what + " " + std::to_string(step));
          if (HasFatalFailure()) return;
        }
        EXPECT_GT(s->n_demoted(), 0) << what;
      }
    }
  }
}

}  // namespace
}  // namespace vq
