// GGUF block types used in their stored form (engine/block_matmul.h): one hand-built block per
// type dequantized by hand from ggml's documented layouts (engine/quants.h), the activation
// quantizers (Q8_1's sum, Q8_K) by hand, hand-computed dots, and every kernel family and thread
// count against the scalar definition bit for bit; the decoders of every family agree with each
// other and with the (hand-tested) dequantization; a product against double precision.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "engine/compute/block_matmul.h"
#include "engine/compute/matmul.h"
#include "engine/compute/parallel.h"
#include "engine/compute/quants.h"
#include "test_util.h"
#include "veloxquant/types.h"

namespace vq {
namespace {
using engine::ActType;
using engine::BlockActs;
using engine::GgmlType;
using cpu::Isa;
using engine::WeightMatrix;
using engine::WeightType;

std::vector<float> deq(GgmlType t, const std::vector<std::uint8_t>& block, std::int64_t n) {
  std::vector<float> out(static_cast<std::size_t>(n));
  engine::dequantize(t, block.data(), out.data(), n);
  return out;
}
void put_half(std::vector<std::uint8_t>& b, std::size_t at, std::uint16_t h) {
  b[at] = static_cast<std::uint8_t>(h & 0xFF);
  b[at + 1] = static_cast<std::uint8_t>(h >> 8);
}

// ---- Dequantization, one hand-built block per type ----

std::vector<std::uint8_t> q4_1_block() {
  std::vector<std::uint8_t> b(20, 0);
  put_half(b, 0, 0x3800);  // d = 0.5
  put_half(b, 2, 0xBC00);  // m = -1
  b[4] = 0x3A;             // qs[0]: low 10 -> x[0] = 10 * 0.5 - 1 = 4; high 3 -> x[16] = 0.5
  b[19] = 0xF0;            // qs[15]: low 0 -> x[15] = -1; high 15 -> x[31] = 6.5
  return b;
}

TEST(BlockDequant, Q4_1) {
  const auto x = deq(GgmlType::kQ4_1, q4_1_block(), 32);
  EXPECT_EQ(x[0], 4.0f);
  EXPECT_EQ(x[16], 0.5f);
  EXPECT_EQ(x[15], -1.0f);
  EXPECT_EQ(x[31], 6.5f);
  EXPECT_EQ(x[1], -1.0f);
}

TEST(BlockDequant, Q5_0) {
  // d = 2 at 0, qh (4 bytes) at 2, qs[16] at 6; x = d * ((nibble | high bit << 4) - 16).
  std::vector<std::uint8_t> b(22, 0);
  put_half(b, 0, 0x4000);
  b[2] = 0x01;  // bit 0: value 0's fifth bit
  b[4] = 0x02;  // bit 17: value 17's fifth bit
  b[6] = 0x21;  // qs[0]: low 1 (+16) -> x[0] = 2 * 1 = 2; high 2 -> x[16] = 2 * -14 = -28
  b[7] = 0xF3;  // qs[1]: low 3 -> x[1] = 2 * -13 = -26; high 15 (+16) -> x[17] = 2 * 15 = 30
  const auto x = deq(GgmlType::kQ5_0, b, 32);
  EXPECT_EQ(x[0], 2.0f);
  EXPECT_EQ(x[16], -28.0f);
  EXPECT_EQ(x[1], -26.0f);
  EXPECT_EQ(x[17], 30.0f);
  EXPECT_EQ(x[2], -32.0f);
}

TEST(BlockDequant, Q5_1) {
  // d = 0.25, m = 1, qh at 4, qs at 8; x = value * d + m.
  std::vector<std::uint8_t> b(24, 0);
  put_half(b, 0, 0x3400);
  put_half(b, 2, 0x3C00);
  b[7] = 0x80;   // bit 31: value 31's fifth bit
  b[23] = 0xF7;  // qs[15]: low 7 -> x[15] = 2.75; high 15 (+16) -> x[31] = 31 * 0.25 + 1 = 8.75
  const auto x = deq(GgmlType::kQ5_1, b, 32);
  EXPECT_EQ(x[15], 2.75f);
  EXPECT_EQ(x[31], 8.75f);
  EXPECT_EQ(x[0], 1.0f);
}

std::vector<std::uint8_t> q2_k_block() {
  // scales[16] at 0 (scale low nibble, min high nibble), qs[64] at 16, d at 80, dmin at 82.
  std::vector<std::uint8_t> b(84, 0);
  put_half(b, 80, 0x3C00);  // d = 1
  put_half(b, 82, 0x3800);  // dmin = 0.5
  b[0] = 0x23;              // group 0 (values 0..15): scale 3, min 2
  b[1] = 0x05;              // group 1 (16..31): scale 5, min 0
  b[9] = 0x17;              // group 9 (144..159): scale 7, min 1
  b[16 + 0] = 0x03;   // value 0 = qs[0] & 3 = 3
  b[16 + 16] = 0x02;  // value 16 = qs[16] & 3 = 2
  b[16 + 48] = 0x03;  // value 144 = 128 + 16: qs[32 + 16] & 3 = 3
  return b;
}

TEST(BlockDequant, Q2_K) {
  const auto x = deq(GgmlType::kQ2_K, q2_k_block(), 256);
  EXPECT_EQ(x[0], 1.0f * 3 * 3 - 0.5f * 2);  // 8
  EXPECT_EQ(x[1], -1.0f);
  EXPECT_EQ(x[16], 10.0f);
  EXPECT_EQ(x[144], 7.0f * 3 - 0.5f);  // 20.5
  EXPECT_EQ(x[145], -0.5f);
  EXPECT_EQ(x[32], 0.0f);  // group 2: scale 0, min 0
}

TEST(BlockDequant, Q3_K) {
  // hmask[32] at 0, qs[64] at 32, scales[12] at 96, d at 108 (0.5). Value y = 128n + 32j + l:
  // ((qs[32n + l] >> 2j) & 3) - (bit 4n + j of hmask[l] ? 0 : 4); scale of group g: low four
  // bits from scales[g % 8] >> 4(g / 8), high two from scales[8 + g % 4] >> 2(g / 4), minus 32.
  std::vector<std::uint8_t> b(110, 0);
  put_half(b, 108, 0x3800);
  std::uint8_t* s = b.data() + 96;
  s[0] = 0x04;  // group 0: low 4
  s[8] = 0x02;  // group 0: high 2 -> 4 | 32 = 36 -> 4
  s[5] = 0x01;  // group 5: low 1
  s[9] = 0x04;  // group 5: bits 2-3 = 1 -> 1 | 16 = 17 -> -15
  s[2] = 0x30;  // group 10: low = 3 (high nibble of s[2])
  s[10] = 0x20;  // group 10: bits 4-5 = 2 -> 3 | 32 = 35 -> 3
  b[32] = 0x02;  // y = 0: low bits 2
  b[0] = 0x21;   // hmask[0]: bit 0 (y = 0 keeps its value), bit 5 (y = 160 = 128 + 32 + 0)
  b[48] = 0x30;  // y = 80 = 64 + 16 (j = 2, l = 16): (qs[16] >> 4) & 3 = 3
  b[16] = 0x04;  // hmask[16] bit 2: y = 80 keeps its value
  b[64] = 0x04;  // y = 160 (n = 1, j = 1, l = 0): (qs[32] >> 2) & 3 = 1
  const auto x = deq(GgmlType::kQ3_K, b, 256);
  EXPECT_EQ(x[0], 0.5f * 4 * 2);        // 4
  EXPECT_EQ(x[1], 0.5f * 4 * -4);       // -8: high bit clear
  EXPECT_EQ(x[80], 0.5f * -15 * 3);     // -22.5
  EXPECT_EQ(x[160], 0.5f * 3 * 1);      // 1.5
  EXPECT_EQ(x[16], 0.5f * -32 * -4);    // group 1: scale 0 - 32, value 0 - 4 -> 64
}

TEST(BlockDequant, Q5_K) {
  // d = 1, dmin = 0.5, scales[12] at 4 (Q4_K's packing), qh[32] at 16, qs[128] at 48.
  std::vector<std::uint8_t> b(176, 0);
  put_half(b, 0, 0x3C00);
  put_half(b, 2, 0x3800);
  std::uint8_t* sc = b.data() + 4;
  sc[0] = 0x03;   // sub-block 0 scale 3
  sc[4] = 0x02;   // sub-block 0 min 2
  sc[1] = 0x05;   // sub-block 1 scale 5, min 0
  sc[8] = 0x21;   // sub-block 4: scale 1, min 2 (top bits from sc[0], sc[4]: 0)
  b[48] = 0x2A;   // qs[0]: low 10 (value 0), high 2 (value 32)
  b[16] = 0x13;   // qh[0]: bit 0 (value 0 +16), bit 1 (value 32 +16), bit 4 (value 128 +16)
  b[48 + 64] = 0x07;  // qs[64]: low 7 -> value 128 (sub-block 4)
  const auto x = deq(GgmlType::kQ5_K, b, 256);
  EXPECT_EQ(x[0], 3.0f * 26 - 1.0f);   // 77
  EXPECT_EQ(x[32], 5.0f * 18);         // 90
  EXPECT_EQ(x[1], -1.0f);
  EXPECT_EQ(x[128], 1.0f * 23 - 1.0f);  // 22
  EXPECT_EQ(x[129], -1.0f);
}

// ---- Activation quantizers ----

TEST(BlockActivations, Q8_KByHand) {
  // The first value of largest |x| is -2: iscale = -127 / -2 = 63.5, d = 1 / 63.5.
  std::vector<float> x(256, 0.0f);
  x[0] = 1.0f;    // 63.5 -> 64 (half to even)
  x[1] = -2.0f;   // -127
  x[2] = 0.5f;    // 31.75 -> 32
  x[3] = 2.0f;    // |2| ties |-2| but comes later: 127
  x[20] = -0.01f; // -0.635 -> -1
  std::vector<std::int8_t> q(256);
  float d = 0;
  std::vector<std::int16_t> bs(16);
  engine::quantize_activations_q8_k(x.data(), 256, q.data(), &d, bs.data());
  EXPECT_EQ(q[0], 64);
  EXPECT_EQ(q[1], -127);
  EXPECT_EQ(q[2], 32);
  EXPECT_EQ(q[3], 127);
  EXPECT_EQ(q[20], -1);
  EXPECT_EQ(d, 1.0f / 63.5f);
  EXPECT_EQ(bs[0], 64 - 127 + 32 + 127);
  EXPECT_EQ(bs[1], -1);
  for (int g = 2; g < 16; ++g) EXPECT_EQ(bs[g], 0);
  // All zero: d = 0, codes 0. A NaN: d = NaN, codes 0.
  std::vector<float> z(256, 0.0f);
  engine::quantize_activations_q8_k(z.data(), 256, q.data(), &d, bs.data());
  EXPECT_EQ(d, 0.0f);
  z[7] = std::numeric_limits<float>::quiet_NaN();
  engine::quantize_activations_q8_k(z.data(), 256, q.data(), &d, bs.data());
  EXPECT_TRUE(std::isnan(d));
}

// quantize_activations_q8_k (whatever kernel this CPU runs: AVX-512 or scalar) against the
// Q8_K definition written out here with std::nearbyint (round half to even) for the rounding:
// blocks of random values at several scales, ties of +max and -max (the first wins), values
// landing exactly on .5 (max = -127: iscale = 1), an all-zero block, blocks with a NaN or an
// infinity (d NaN, codes 0), subnormals beside a tiny normal max.
TEST(BlockActivations, Q8_KIsTheDefinitionOnManyBlocks) {
  constexpr int kBlocks = 40;
  std::vector<float> x = test::randn(256 * kBlocks, 4242);
  for (int b = 0; b < kBlocks; ++b) {
    float* xb = x.data() + 256 * b;
    const float scale = std::ldexp(1.0f, (b % 9) * 6 - 24);
    for (int j = 0; j < 256; ++j) xb[j] *= scale;
  }
  float* t = x.data() + 256 * 3;  // a tie: +5 at 7 comes first (max = +5), -5 at 100
  t[7] = 5.0f;
  t[100] = -5.0f;
  t = x.data() + 256 * 4;  // -max first
  t[9] = -7.0f;
  t[200] = 7.0f;
  t = x.data() + 256 * 5;  // max = -127: iscale = 1, the codes round x itself
  for (int j = 0; j < 256; ++j) t[j] = static_cast<float>(j % 50) - 25.5f;
  t[17] = -127.0f;
  std::fill(x.begin() + 256 * 6, x.begin() + 256 * 7, 0.0f);
  x[256 * 8 + 33] = std::numeric_limits<float>::quiet_NaN();
  x[256 * 9 + 255] = -std::numeric_limits<float>::infinity();
  t = x.data() + 256 * 10;
  for (int j = 0; j < 256; ++j) t[j] = std::ldexp(static_cast<float>(j - 128), -140);  // subnormal
  t[5] = -1e-36f;  // the max: iscale = 1.27e38, finite
  std::vector<std::int8_t> q(x.size());
  std::vector<float> d(kBlocks);
  std::vector<std::int16_t> bs(16 * kBlocks);
  engine::quantize_activations_q8_k(x.data(), 256 * kBlocks, q.data(), d.data(), bs.data());
  for (int b = 0; b < kBlocks; ++b) {
    const float* xb = x.data() + 256 * b;
    bool finite = true;
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 256; ++j) {
      finite = finite && std::isfinite(xb[j]);
      if (std::fabs(xb[j]) > amax) {
        amax = std::fabs(xb[j]);
        max = xb[j];
      }
    }
    std::int8_t want[256] = {};
    std::int16_t want_bs[16] = {};
    float want_d = 0.0f;
    if (!finite) {
      want_d = std::numeric_limits<float>::quiet_NaN();
    } else if (amax > 0.0f) {
      const float iscale = -127.0f / max;
      for (int j = 0; j < 256; ++j) {
        const float v = std::nearbyint(iscale * xb[j]);
        want[j] = static_cast<std::int8_t>(std::min(127.0f, v));
        want_bs[j / 16] = static_cast<std::int16_t>(want_bs[j / 16] + want[j]);
      }
      want_d = 1.0f / iscale;
    }
    if (!finite) {
      EXPECT_TRUE(std::isnan(d[static_cast<std::size_t>(b)])) << "block " << b;
    } else {
      EXPECT_EQ(d[static_cast<std::size_t>(b)], want_d) << "block " << b;
      EXPECT_EQ(std::memcmp(bs.data() + 16 * b, want_bs, sizeof(want_bs)), 0) << "block " << b;
    }
    EXPECT_EQ(std::memcmp(q.data() + 256 * b, want, 256), 0) << "block " << b;
  }
  EXPECT_EQ(q[256 * 3 + 7], -127);  // the first of the tie: iscale = -127 / 5
  EXPECT_EQ(q[256 * 3 + 100], 127);
  EXPECT_EQ(q[256 * 4 + 9], -127);
  EXPECT_EQ(q[256 * 4 + 200], 127);
  EXPECT_EQ(q[256 * 5 + 0], -26);     // -25.5 * 1 -> -26 (half to even)
  EXPECT_EQ(q[256 * 5 + 1], -24);     // -24.5 -> -24
}

TEST(BlockActivations, Q8_1SumByHand) {
  // amax = 127: d = 1 and the codes are the values; s = 1 * (sum of the codes).
  std::vector<float> x(32, 0.0f);
  x[0] = 127.0f;
  x[1] = -3.0f;
  x[5] = 10.0f;
  std::vector<std::int8_t> q(32);
  float d = 0, s = 0;
  engine::quantize_activations_q8_1(x.data(), 32, q.data(), &d, &s);
  EXPECT_EQ(d, 1.0f);
  EXPECT_EQ(q[0], 127);
  EXPECT_EQ(q[1], -3);
  EXPECT_EQ(s, 134.0f);
}

// ---- Hand-computed dots: sum_j w_j * (d_x * q_j) in exact arithmetic ----

float one_dot(WeightType t, const std::vector<std::uint8_t>& blk, std::int64_t cols,
              const BlockActs& a, Isa isa) {
  const WeightMatrix w{t, 1, cols, blk.data()};
  float out = -1;
  engine::matmul_rows_blocks(isa, &out, a, w, 1, 0, 1);
  return out;
}

TEST(BlockMatmul, HandComputedDots) {
  for (const Isa isa :
       {Isa::kScalar, Isa::kAvx2, Isa::kAvx2Vnni, Isa::kAvx512, Isa::kAvx512Vnni}) {
    if (!cpu::isa_supported(isa)) continue;
    {
      // Q2_K block above (x[0] = 8, x[1] = -1, x[16] = 10, x[144] = 20.5); activations d = 0.5,
      // q[0] = q[16] = q[144] = 1, q[1] = -3: 0.5 * (8 + 3 + 10 + 20.5) = 20.75.
      std::vector<std::int8_t> q(256, 0);
      q[0] = q[16] = q[144] = 1;
      q[1] = -3;
      std::vector<std::int16_t> bs(16, 0);
      bs[0] = -2;
      bs[1] = 1;
      bs[9] = 1;
      const float d = 0.5f;
      const BlockActs a{ActType::kQ8_K, 256, q.data(), &d, nullptr, bs.data()};
      EXPECT_EQ(one_dot(WeightType::kQ2_K, q2_k_block(), 256, a, isa), 20.75f)
          << cpu::to_string(isa);
    }
    {
      // Q4_1 block above (x[0] = 4, x[31] = 6.5); d = 0.25, q[0] = 2, q[31] = 4, s = 0.25 * 6:
      // 0.25 * (4 * 2 + 6.5 * 4) = 8.5.
      std::vector<std::int8_t> q(32, 0);
      q[0] = 2;
      q[31] = 4;
      const float d = 0.25f, s = 1.5f;
      const BlockActs a{ActType::kQ8_1, 32, q.data(), &d, &s, nullptr};
      EXPECT_EQ(one_dot(WeightType::kQ4_1, q4_1_block(), 32, a, isa), 8.5f)
          << cpu::to_string(isa);
    }
    {
      // Q6_K: d = 0.25, scales[0] = 4, [4] = 1, [8] = 10; x[0] = 10, x[64] = 1.25,
      // x[128] = -77.5 (engine/quants.h's layout, as in test_gguf). d_x = 2, q = 1, 2, -1:
      // 2 * (10 + 2.5 + 77.5) = 180.
      std::vector<std::uint8_t> b(210, 0);
      put_half(b, 208, 0x3400);
      b[192] = 4;
      b[196] = 1;
      b[200] = 10;
      b[0] = 0x5A;    // value 0 low 10, value 64 low 5
      b[128] = 0x22;  // qh[0]: value 0 high 2 (+32), value 64 high 2 (+32)
      b[64] = 0x01;   // value 128 low 1, high 0: 1 - 32 = -31
      std::vector<std::int8_t> q(256, 0);
      q[0] = 1;
      q[64] = 2;
      q[128] = -1;
      std::vector<std::int16_t> bs(16, 0);  // the 16-code group sums, as BlockActs has them
      bs[0] = 1;
      bs[4] = 2;
      bs[8] = -1;
      const float d = 2.0f;
      const BlockActs a{ActType::kQ8_K, 256, q.data(), &d, nullptr, bs.data()};
      EXPECT_EQ(one_dot(WeightType::kQ6_K, b, 256, a, isa), 180.0f) << cpu::to_string(isa);
    }
  }
}

// ---- Random blocks: families, threads, decoders, precision ----

const WeightType kTypes[] = {WeightType::kQ4_0, WeightType::kQ4_1, WeightType::kQ5_0,
                             WeightType::kQ5_1, WeightType::kQ2_K, WeightType::kQ3_K,
                             WeightType::kQ4_K, WeightType::kQ5_K, WeightType::kQ6_K};

// Random bytes with the scale fields set to finite fp16 values of a model's size; the matrix
// starts at byte 1 (an odd address: the kernels need no alignment).
std::vector<std::uint8_t> random_matrix(WeightType t, std::int64_t rows, std::int64_t cols,
                                        std::uint64_t seed) {
  const std::int64_t bytes = engine::weight_row_bytes(t, cols) * rows;
  std::vector<std::uint8_t> b(static_cast<std::size_t>(bytes) + 1);
  std::uint64_t z = seed * 0x9E3779B97F4A7C15ULL + 1;
  for (auto& v : b) {
    z ^= z << 13;
    z ^= z >> 7;
    z ^= z << 17;
    v = static_cast<std::uint8_t>(z >> 24);
  }
  const std::int64_t bb = engine::weight_block_bytes(t);
  std::vector<std::size_t> halves;  // offsets of fp16 scale fields in a block
  switch (t) {
    case WeightType::kQ4_0:
    case WeightType::kQ5_0:
      halves = {0};
      break;
    case WeightType::kQ4_1:
    case WeightType::kQ5_1:
    case WeightType::kQ4_K:
    case WeightType::kQ5_K:
      halves = {0, 2};
      break;
    case WeightType::kQ2_K:
      halves = {80, 82};
      break;
    case WeightType::kQ3_K:
      halves = {108};
      break;
    default:
      halves = {208};
      break;
  }
  for (std::int64_t blk = 0; blk < bytes / bb; ++blk) {
    for (std::size_t k = 0; k < halves.size(); ++k) {
      const float v = (k == 0 ? 0.002f : -0.001f) * static_cast<float>(1 + (blk * 7 + k) % 11);
      put_half(b, static_cast<std::size_t>(1 + blk * bb) + halves[k], float_to_half(v));
    }
  }
  return b;
}

struct Acts {
  std::vector<std::int8_t> q;
  std::vector<float> d, s;
  std::vector<std::int16_t> bs;
  BlockActs a;
};
Acts quantize(ActType t, const std::vector<float>& x, std::int64_t S, std::int64_t cols) {
  Acts r;
  const auto n = static_cast<std::size_t>(S * cols);
  r.q.resize(n);
  r.d.resize(n / 32);
  r.s.resize(n / 32);
  r.bs.resize(n / 16);
  if (t == ActType::kQ8_K) {
    engine::quantize_activations_q8_k(x.data(), S * cols, r.q.data(), r.d.data(), r.bs.data());
  } else {
    engine::quantize_activations_q8_1(x.data(), S * cols, r.q.data(), r.d.data(), r.s.data());
  }
  r.a = BlockActs{t, cols, r.q.data(), r.d.data(), r.s.data(), r.bs.data()};
  return r;
}

TEST(BlockMatmul, EveryFamilyIsTheScalarDefinitionBitForBit) {
  for (const WeightType t : kTypes) {
    for (const std::int64_t cols : {256, 768, 2560}) {
      const std::int64_t rows = 13;
      auto bytes = random_matrix(t, rows, cols, static_cast<std::uint64_t>(cols) + 3);
      const WeightMatrix w{t, rows, cols, bytes.data() + 1};
      for (const std::int64_t S : {1, 3, 4, 9}) {
        auto x = test::randn(static_cast<std::size_t>(S * cols), static_cast<std::uint64_t>(S));
        x[5] = 0;  // some exact zeros and a large value
        x[static_cast<std::size_t>(cols / 2)] = 40.0f;
        const Acts acts = quantize(engine::activation_type(t), x, S, cols);
        std::vector<float> want(static_cast<std::size_t>(S * rows), -1.0f);
        engine::matmul_rows_blocks(Isa::kScalar, want.data(), acts.a, w, S, 0, rows);
        for (const Isa isa : {Isa::kAvx2, Isa::kAvx2Vnni, Isa::kAvx512Vnni}) {
          if (!cpu::isa_supported(isa)) continue;
          std::vector<float> got(want.size(), -2.0f);
          engine::matmul_rows_blocks(isa, got.data(), acts.a, w, S, 0, 5);
          engine::matmul_rows_blocks(isa, got.data(), acts.a, w, S, 5, rows);
          for (std::size_t k = 0; k < want.size(); ++k)
            ASSERT_EQ(want[k], got[k]) << engine::to_string(t) << " cols " << cols << " S " << S
                                       << " " << cpu::to_string(isa) << " at " << k;
        }
        // A chunk of S tokens gives each token's single-token result.
        for (std::int64_t s = 0; s < S; ++s) {
          const Acts one = quantize(engine::activation_type(t),
                                    std::vector<float>(x.begin() + s * cols,
                                                       x.begin() + (s + 1) * cols),
                                    1, cols);
          std::vector<float> single(static_cast<std::size_t>(rows));
          engine::matmul_rows_blocks(cpu::best_isa(), single.data(), one.a, w, 1, 0, rows);
          EXPECT_EQ(std::memcmp(single.data(), want.data() + s * rows, single.size() * 4), 0)
              << engine::to_string(t) << " token " << s;
        }
      }
    }
  }
}

// The decode (S = 1) kernels of the AVX-512 VNNI family (Q4_0, Q4_K, Q5_K, Q6_K; the other types
// fall back to the AVX2 kernels) against the scalar definition, bit for bit: every width from
// one block up to past two groups of eight blocks (partial groups of every size, K super-block
// counts past the eight accumulators), row counts that leave every remainder of the two- and
// four-row passes, ranges split at odd rows, random bytes (every code, scale and min value;
// Q8_0-style extreme activations from a large value), and an activation block holding a NaN.
TEST(BlockMatmul, Avx512DecodeKernelsAreTheScalarDefinitionBitForBit) {
  if (!cpu::isa_supported(Isa::kAvx512Vnni)) GTEST_SKIP() << "no AVX-512 VNNI/VBMI here";
  for (const WeightType t : kTypes) {
    const bool k = engine::act_block_size(engine::activation_type(t)) == 256;
    std::vector<std::int64_t> widths;
    for (int n = 1; n <= (k ? 10 : 18); ++n) widths.push_back((k ? 256 : 32) * n);
    widths.push_back(k ? 8192 : 8224);
    for (const std::int64_t cols : widths) {
      for (const std::int64_t rows : {1, 2, 3, 4, 5, 6, 7, 9, 19}) {
        auto bytes = random_matrix(t, rows, cols, static_cast<std::uint64_t>(cols * 31 + rows));
        const WeightMatrix w{t, rows, cols, bytes.data() + 1};
        for (const bool nan : {false, true}) {
          auto x = test::randn(static_cast<std::size_t>(cols), static_cast<std::uint64_t>(rows));
          x[static_cast<std::size_t>(cols - 1)] = 50.0f;
          if (nan) x[0] = std::numeric_limits<float>::quiet_NaN();
          const Acts acts = quantize(engine::activation_type(t), x, 1, cols);
          std::vector<float> want(static_cast<std::size_t>(rows), -1.0f);
          engine::matmul_rows_blocks(Isa::kScalar, want.data(), acts.a, w, 1, 0, rows);
          std::vector<float> got(want.size(), -2.0f);
          const std::int64_t split = rows / 2 + (rows > 2 ? 1 : 0);
          engine::matmul_rows_blocks(Isa::kAvx512Vnni, got.data(), acts.a, w, 1, 0, split);
          engine::matmul_rows_blocks(Isa::kAvx512Vnni, got.data(), acts.a, w, 1, split, rows);
          for (std::int64_t i = 0; i < rows; ++i) {
            const auto u = static_cast<std::size_t>(i);
            ASSERT_EQ(std::memcmp(&want[u], &got[u], 4), 0)
                << engine::to_string(t) << " " << rows << "x" << cols << (nan ? " nan" : "")
                << " row " << i << ": " << want[u] << " vs " << got[u];
            if (nan) {
              ASSERT_TRUE(std::isnan(got[u]));
            }
          }
        }
      }
    }
  }
}

// The prefill tiles (engine/matmul.h PrefillKernels::kTiles: tiles of tokens outermost, each
// decoded block reused across them) against the scalar definition computed row by row
// (PrefillKernels::kRows), bit for bit, for every type and family: every token count 1 to 13
// (batched decode: the AVX-512 VNNI tiles' quads, full and partial) and some past the tiles, row counts split at odd rows, widths with a partial group of eight blocks;
// and through matmul() (activations quantized there) on 1, 2 and 3 threads.
TEST(BlockMatmul, PrefillTilesAreTheScalarDefinitionBitForBit) {
  const int saved = engine::threads();
  for (const WeightType t : kTypes) {
    const bool k = engine::act_block_size(engine::activation_type(t)) == 256;
    // Legacy rows wider than the packed tiles' 8192 take the 16-token row loop.
    const std::vector<std::int64_t> widths =
        k ? std::vector<std::int64_t>{768, 2304} : std::vector<std::int64_t>{288, 2304, 8224};
    for (const std::int64_t cols : widths) {
      for (const std::int64_t rows : {1, 7, 37}) {
        if (cols > 8192 && rows > 7) continue;
        auto bytes = random_matrix(t, rows, cols, static_cast<std::uint64_t>(cols + rows));
        const WeightMatrix w{t, rows, cols, bytes.data() + 1};
        for (const std::int64_t S : {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 16, 17, 20, 64}) {
          if (cols > 1000 && S > 17) continue;  // the wide rows: fewer token counts
          if (cols > 1000 && S > 5 && S % 4 != 1) continue;
          auto x = test::randn(static_cast<std::size_t>(S * cols),
                               static_cast<std::uint64_t>(S * 1000 + rows));
          x[3] = 0;
          x[static_cast<std::size_t>(S * cols / 2)] = -60.0f;
          const Acts acts = quantize(engine::activation_type(t), x, S, cols);
          std::vector<float> want(static_cast<std::size_t>(S * rows), -1.0f);
          engine::set_prefill_kernels(engine::PrefillKernels::kRows);
          engine::matmul_rows_blocks(Isa::kScalar, want.data(), acts.a, w, S, 0, rows);
          engine::set_prefill_kernels(engine::PrefillKernels::kTiles);
          // kAvx2Vnni and kAvx512Vnni (whose prefill is kAvx2Vnni's) twice: with the AVX-512 VNNI
          // tiles (where the CPU has them) and without.
          for (const bool avx512 : {false, true}) {
            engine::set_avx512_prefill(avx512);
            for (const Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx2Vnni, Isa::kAvx512Vnni}) {
              if (!cpu::isa_supported(isa)) continue;
              if (avx512 && ((isa != Isa::kAvx2Vnni && isa != Isa::kAvx512Vnni) ||
                             !engine::avx512_prefill()))
                continue;
              std::vector<float> got(want.size(), -2.0f);
              engine::matmul_rows_blocks(isa, got.data(), acts.a, w, S, 0, rows / 2);
              engine::matmul_rows_blocks(isa, got.data(), acts.a, w, S, rows / 2, rows);
              ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * 4), 0)
                  << engine::to_string(t) << " " << rows << "x" << cols << " S " << S << " "
                  << cpu::to_string(isa) << (avx512 ? " avx512 tiles" : "");
            }
          }
          for (const int n : {1, 2, 3}) {
            engine::set_threads(n);
            std::vector<float> got(want.size(), -3.0f);
            engine::matmul(got.data(), x.data(), w, S);
            ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * 4), 0)
                << engine::to_string(t) << " " << rows << "x" << cols << " S " << S
                << " matmul() at " << n << " threads";
          }
        }
      }
    }
  }
  engine::set_threads(saved);
}

TEST(BlockMatmul, DecodersAgreeWithEachOtherAndWithDequantization) {
  for (const WeightType t : kTypes) {
    const std::int64_t B = engine::weight_block_size(t), cols = 4 * B;
    auto bytes = random_matrix(t, 3, cols, 77);
    const WeightMatrix w{t, 3, cols, bytes.data() + 1};
    std::vector<float> row(static_cast<std::size_t>(cols));
    for (std::int64_t i = 0; i < 3; ++i) {
      engine::dequantize_row(w, i, row.data());
      for (std::int64_t b = 0; b < 4; ++b) {
        engine::DecodedBlock s{}, v{};
        engine::decode_block(Isa::kScalar, w, i, b, &s);
        if (cpu::isa_supported(Isa::kAvx2)) {
          engine::decode_block(Isa::kAvx2, w, i, b, &v);
          EXPECT_EQ(std::memcmp(&s, &v, sizeof(s)), 0) << engine::to_string(t) << " block " << b;
        }
        // The codes and scales rebuild ggml's values (dequantize, tested by hand above) in
        // each type's order: legacy c * d (+ m); K (d * sc) * c - dmin * mn (Q4_K/Q5_K: the
        // products d * sc and dmin * m first).
        for (std::int64_t j = 0; j < B; ++j) {
          const float c = static_cast<float>(s.codes[j]);
          float want;
          if (B == 32) {
            want = c * s.d;
            if (t == WeightType::kQ4_1 || t == WeightType::kQ5_1) want = want + s.dmin;
          } else {
            const int g = static_cast<int>(j / 16);
            want = (s.d * static_cast<float>(s.sc[g])) * c;
            if (t != WeightType::kQ3_K && t != WeightType::kQ6_K)
              want = want - s.dmin * static_cast<float>(s.mn[g]);
          }
          ASSERT_EQ(want, row[static_cast<std::size_t>(b * B + j)])
              << engine::to_string(t) << " row " << i << " value " << b * B + j;
        }
      }
    }
  }
}

TEST(BlockMatmul, CloseToTheDoublePrecisionProductOfTheStoredValues) {
  // The definition against sum_j w_j * (d_x q_j) in double, with w from dequantize (tested by
  // hand). Integer sums are exact, so the error is a few fp32 roundings per block (Q4_1/Q5_1:
  // their s is rounded to fp16, as llama.cpp's Q8_1 is).
  for (const WeightType t : kTypes) {
    const std::int64_t rows = 7, cols = 1024;
    auto bytes = random_matrix(t, rows, cols, 5);
    const WeightMatrix w{t, rows, cols, bytes.data() + 1};
    const auto x = test::randn(static_cast<std::size_t>(cols), 6);
    const ActType at = engine::activation_type(t);
    const Acts acts = quantize(at, x, 1, cols);
    std::vector<float> got(static_cast<std::size_t>(rows));
    engine::matmul_rows_blocks(cpu::best_isa(), got.data(), acts.a, w, 1, 0, rows);
    std::vector<float> wr(static_cast<std::size_t>(cols));
    const std::int64_t xb = engine::act_block_size(at);
    for (std::int64_t i = 0; i < rows; ++i) {
      engine::dequantize_row(w, i, wr.data());
      double ref = 0, mag = 0;
      for (std::int64_t j = 0; j < cols; ++j) {
        const double term = static_cast<double>(wr[static_cast<std::size_t>(j)]) *
                            acts.d[static_cast<std::size_t>(j / xb)] *
                            acts.q[static_cast<std::size_t>(j)];
        ref += term;
        mag += std::fabs(term);
      }
      const double tol = (at == ActType::kQ8_1 ? 2e-3 : 1e-5) * mag;
      EXPECT_NEAR(got[static_cast<std::size_t>(i)], ref, tol) << engine::to_string(t) << " row " << i;
    }
  }
}

TEST(BlockMatmul, MatmulIsIdenticalForEveryThreadCountAndFusion) {
  const int saved = engine::threads();
  const std::int64_t S = 5, cols = 512, rows = 300;
  const auto x = test::randn(static_cast<std::size_t>(S * cols), 12);
  std::vector<std::vector<std::uint8_t>> store;
  std::vector<WeightMatrix> ws;
  for (const WeightType t : kTypes) {
    store.push_back(random_matrix(t, rows, cols, static_cast<std::uint64_t>(t) + 40));
    ws.push_back(WeightMatrix{t, rows, cols, store.back().data() + 1});
  }
  std::vector<std::vector<float>> want;
  for (const WeightMatrix& w : ws) {
    const Acts acts = quantize(engine::activation_type(w.type), x, S, cols);
    want.emplace_back(static_cast<std::size_t>(S * rows));
    engine::matmul_rows_blocks(Isa::kScalar, want.back().data(), acts.a, w, S, 0, rows);
  }
  for (const int n : {1, 2, 3}) {
    engine::set_threads(n);
    for (std::size_t k = 0; k < ws.size(); ++k) {
      std::vector<float> got(want[k].size(), -1.0f);
      engine::matmul(got.data(), x.data(), ws[k], S);
      EXPECT_EQ(std::memcmp(got.data(), want[k].data(), got.size() * 4), 0)
          << engine::to_string(ws[k].type) << " at " << n << " threads";
    }
    // Legacy and K types fused in one call (each reads its own activation type).
    std::vector<float> a(want[1].size()), b(want[6].size()), c(want[0].size());
    const engine::MatmulOut outs[] = {{a.data(), &ws[1]}, {b.data(), &ws[6]}, {c.data(), &ws[0]}};
    engine::matmul_fused(outs, x.data(), S);
    EXPECT_EQ(std::memcmp(a.data(), want[1].data(), a.size() * 4), 0) << n;
    EXPECT_EQ(std::memcmp(b.data(), want[6].data(), b.size() * 4), 0) << n;
    EXPECT_EQ(std::memcmp(c.data(), want[0].data(), c.size() * 4), 0) << n;
  }
  engine::set_threads(saved);
}

TEST(BlockMatmul, ANonFiniteActivationBlockGivesNaN) {
  for (const WeightType t : kTypes) {
    const std::int64_t cols = 256;
    auto bytes = random_matrix(t, 2, cols, 9);
    const WeightMatrix w{t, 2, cols, bytes.data() + 1};
    auto x = test::randn(static_cast<std::size_t>(cols), 3);
    x[100] = std::numeric_limits<float>::infinity();
    std::vector<float> out(2);
    engine::matmul(out.data(), x.data(), w, 1);
    EXPECT_TRUE(std::isnan(out[0]) && std::isnan(out[1])) << engine::to_string(t);
  }
}

}  // namespace
}  // namespace vq
