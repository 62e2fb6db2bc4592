// Typed weight matrices (engine/weights.h) and their matmul kernels (engine/matmul.h): every
// kernel family and every thread count against the scalar definition, bit for bit, with the
// expected values built independently (element conversions and the fused multiply-add dot in
// the fixed lane order written out here, fma_dot); and GGUF's Q8_0 block layout by hand.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "engine/compute/matmul.h"
#include "engine/compute/ops.h"
#include "engine/compute/parallel.h"
#include "engine/compute/weights.h"
#include "test_util.h"

namespace vq {
namespace {
using engine::BlockQ8_0;
using cpu::Isa;
using engine::Q8_0Activations;
using engine::WeightMatrix;
using engine::WeightType;

// Storage for a [rows][cols] matrix of `type` from fp32 values, and the values it holds
// (independently converted back: f16 via the library's half_to_float, bf16 by a 16-bit shift,
// Q8_0 as d * q per block).
struct Typed {
  std::vector<std::uint8_t> bytes;
  std::vector<float> exact;  // [rows][cols], the weights as stored
  WeightMatrix m;
};

Typed make_typed(WeightType type, std::int64_t rows, std::int64_t cols, std::uint64_t seed) {
  const std::vector<float> v = test::randn(static_cast<std::size_t>(rows * cols), seed);
  Typed t;
  t.m = WeightMatrix{type, rows, cols, nullptr};
  t.bytes.resize(static_cast<std::size_t>(t.m.bytes()) + 1);  // +1: data at an odd offset below
  std::uint8_t* base = t.bytes.data() + (type == WeightType::kQ8_0 ? 1 : 0);
  t.exact.resize(v.size());
  for (std::int64_t i = 0; i < rows; ++i) {
    std::uint8_t* row = base + i * t.m.row_bytes();
    for (std::int64_t j = 0; j < cols; ++j) {
      const float x = v[static_cast<std::size_t>(i * cols + j)];
      float& e = t.exact[static_cast<std::size_t>(i * cols + j)];
      if (type == WeightType::kF32) {
        std::memcpy(row + 4 * j, &x, 4);
        e = x;
      } else if (type == WeightType::kF16) {
        const std::uint16_t h = float_to_half(x);
        std::memcpy(row + 2 * j, &h, 2);
        e = half_to_float(h);
      } else if (type == WeightType::kBF16) {
        std::uint32_t bits;
        std::memcpy(&bits, &x, 4);
        const auto h = static_cast<std::uint16_t>(bits >> 16);  // truncation: any bf16 value
        std::memcpy(row + 2 * j, &h, 2);
        const std::uint32_t back = static_cast<std::uint32_t>(h) << 16;
        std::memcpy(&e, &back, 4);
      }
    }
    if (type == WeightType::kQ8_0) {
      // Arbitrary blocks: scale from the data, quants from a simple pattern with both extremes.
      for (std::int64_t b = 0; b < cols / 32; ++b) {
        BlockQ8_0 blk{};
        blk.d = float_to_half(0.01f + 0.001f * static_cast<float>((i * 7 + b) % 13));
        for (int j = 0; j < 32; ++j)
          blk.q[j] = static_cast<std::int8_t>(((i * 31 + b * 17 + j * 11) % 256) - 128);
        std::memcpy(row + b * 34, &blk, 34);
        for (int j = 0; j < 32; ++j)
          t.exact[static_cast<std::size_t>(i * cols + b * 32 + j)] =
              half_to_float(blk.d) * static_cast<float>(blk.q[j]);
      }
    }
  }
  t.m.data = base;
  return t;
}

// The definition of every fp32-activation product (engine/matmul.h), written out here from the
// definition's text: lane l (+0 at the start) takes a[j] * b[j] for j = l, l+8, ... in
// increasing j, each with one rounding (std::fma), then ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)).
float fma_dot(const float* a, const float* b, std::int64_t n) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (std::int64_t j = 0; j < n; ++j) lane[j % 8] = std::fma(a[j], b[j], lane[j % 8]);
  return ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
}

TEST(EngineWeights, FmaDotByHand) {
  // One lane's fused multiply-add keeps the product's low bits that a separate multiply drops:
  // a = b = 1 + 2^-12 gives a * b = 1 + 2^-11 + 2^-24; with c = -(1 + 2^-11) the fused result
  // is exactly 2^-24, the separate one (a * b rounds to 1 + 2^-11, ties to even) is 0.
  const float a = 1.0f + std::ldexp(1.0f, -12), c = -(1.0f + std::ldexp(1.0f, -11));
  std::vector<float> w(9, 0.0f), x(9, 0.0f);
  w[0] = c;  // lane 0 holds c exactly
  x[0] = 1.0f;
  w[8] = a;  // lane 0 again: fma(a, a, c)
  x[8] = a;
  EXPECT_EQ(fma_dot(w.data(), x.data(), 9), std::ldexp(1.0f, -24));
}

TEST(EngineWeights, EveryKernelIsTheFixedOrderDotOverTheStoredValues) {
  for (const WeightType type :
       {WeightType::kF32, WeightType::kF16, WeightType::kBF16, WeightType::kQ8_0}) {
    const std::vector<std::int64_t> widths =
        type == WeightType::kQ8_0 ? std::vector<std::int64_t>{32, 64, 96, 256}
                                  : std::vector<std::int64_t>{1, 7, 8, 9, 31, 64, 173};
    for (const std::int64_t cols : widths) {
      for (const std::int64_t rows : {1, 3, 4, 5, 9, 37}) {
        for (const std::int64_t S : {1, 2}) {
          const Typed t = make_typed(type, rows, cols, 100 + static_cast<std::uint64_t>(cols));
          const auto x =
              test::randn(static_cast<std::size_t>(S * cols), 7 + static_cast<std::uint64_t>(rows));
          for (const Isa isa :
               {Isa::kScalar, Isa::kAvx2, Isa::kAvx2Vnni, Isa::kAvx512, Isa::kAvx512Vnni}) {
            if (!cpu::isa_supported(isa)) continue;
            std::vector<float> out(static_cast<std::size_t>(S * rows), -1.0f);
            engine::matmul_rows(isa, out.data(), x.data(), t.m, S, 0, rows);
            for (std::int64_t s = 0; s < S; ++s) {
              for (std::int64_t i = 0; i < rows; ++i) {
                const float want =
                    fma_dot(t.exact.data() + i * cols, x.data() + s * cols, cols);
                const float got = out[static_cast<std::size_t>(s * rows + i)];
                ASSERT_EQ(std::memcmp(&want, &got, 4), 0)
                    << engine::to_string(type) << " " << cpu::to_string(isa) << " " << rows
                    << "x" << cols << " S=" << S << " row " << i << ": " << want << " vs " << got;
              }
            }
          }
          // dequantize_row gives the stored values exactly.
          std::vector<float> row(static_cast<std::size_t>(cols));
          engine::dequantize_row(t.m, rows - 1, row.data());
          ASSERT_EQ(std::memcmp(row.data(), t.exact.data() + (rows - 1) * cols, row.size() * 4), 0);
        }
      }
    }
  }
}

TEST(EngineWeights, Fp32MatricesGiveTheEngineMatmulBitForBit) {
  const Typed t = make_typed(WeightType::kF32, 67, 200, 5);
  const auto x = test::randn(3 * 200, 6);
  std::vector<float> a(3 * 67), b(3 * 67);
  engine::matmul(a.data(), x.data(), t.m, 3);
  engine::ops::matmul(b.data(), x.data(), static_cast<const float*>(t.m.data), 3, 200, 67);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
}

TEST(EngineWeights, ThreadedMatmulIsIdenticalForEveryThreadCount) {
  const int saved = engine::threads();
  const auto x = test::randn(2 * 256, 10);
  // Q8_0 weights: with Q8_0 activations (the default) and with fp32 activations.
  std::vector<std::int8_t> xq(2 * 256);
  std::vector<float> xd(2 * 256 / 32);
  engine::quantize_activations_q8_0(x.data(), 2 * 256, xq.data(), xd.data());
  for (const Q8_0Activations acts : {Q8_0Activations::kQ8_0, Q8_0Activations::kF32}) {
    engine::set_q8_0_activations(acts);
    for (const WeightType type : {WeightType::kBF16, WeightType::kQ8_0}) {
      const Typed t = make_typed(type, 1000, 256, 9);  // large enough to be split
      std::vector<float> want(2 * 1000);
      if (type == WeightType::kQ8_0 && acts == Q8_0Activations::kQ8_0) {
        engine::matmul_rows_q8_0(Isa::kScalar, want.data(), xq.data(), xd.data(), t.m, 2, 0, 1000);
      } else {
        engine::matmul_rows(Isa::kScalar, want.data(), x.data(), t.m, 2, 0, 1000);
      }
      for (const int n : {1, 2, 3, 5}) {
        engine::set_threads(n);
        std::vector<float> got(want.size(), -1.0f);
        engine::matmul(got.data(), x.data(), t.m, 2);
        EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * 4), 0)
            << engine::to_string(type) << " (" << engine::to_string(acts) << " activations) at "
            << n << " threads";
      }
    }
  }
  engine::set_q8_0_activations(Q8_0Activations::kQ8_0);
  engine::set_threads(saved);
  EXPECT_THROW(engine::set_threads(0), Error);
}

// Fused products (q/k/v, gate/up in the engine) equal each matrix's product alone, bit for
// bit, for every weight type and thread count: the expected values are the single-thread
// definitions (matmul_rows, or matmul_rows_q8_0 over x quantized once) per matrix. The matrices
// have row counts that are not multiples of the 16-row units, so a thread's range crosses from
// one matrix into the next mid-way.
TEST(EngineWeights, FusedMatmulEqualsSeparateProductsBitForBit) {
  const int saved = engine::threads();
  constexpr std::int64_t S = 3, cols = 256;
  const std::int64_t rows[3] = {200, 72, 37};
  const auto x = test::randn(static_cast<std::size_t>(S * cols), 21);
  std::vector<std::int8_t> xq(static_cast<std::size_t>(S * cols));
  std::vector<float> xd(static_cast<std::size_t>(S * cols / 32));
  engine::quantize_activations_q8_0(x.data(), S * cols, xq.data(), xd.data());
  for (const Q8_0Activations acts : {Q8_0Activations::kQ8_0, Q8_0Activations::kF32}) {
    engine::set_q8_0_activations(acts);
    for (const WeightType type :
         {WeightType::kF32, WeightType::kF16, WeightType::kBF16, WeightType::kQ8_0}) {
      std::vector<Typed> ts;
      std::vector<std::vector<float>> want;
      for (int m = 0; m < 3; ++m) {
        ts.push_back(make_typed(type, rows[m], cols, 30 + static_cast<std::uint64_t>(m)));
        want.emplace_back(static_cast<std::size_t>(S * rows[m]));
        if (type == WeightType::kQ8_0 && acts == Q8_0Activations::kQ8_0) {
          engine::matmul_rows_q8_0(Isa::kScalar, want.back().data(), xq.data(), xd.data(),
                                   ts.back().m, S, 0, rows[m]);
        } else {
          engine::matmul_rows(Isa::kScalar, want.back().data(), x.data(), ts.back().m, S, 0,
                              rows[m]);
        }
      }
      for (const int n : {1, 2, 3, 7}) {
        engine::set_threads(n);
        std::vector<std::vector<float>> got, alone;
        std::vector<engine::MatmulOut> outs;
        for (int m = 0; m < 3; ++m) {
          got.emplace_back(want[static_cast<std::size_t>(m)].size(), -1.0f);
          alone.emplace_back(want[static_cast<std::size_t>(m)].size(), -2.0f);
        }
        for (int m = 0; m < 3; ++m) {
          outs.push_back(
              {got[static_cast<std::size_t>(m)].data(), &ts[static_cast<std::size_t>(m)].m});
          engine::matmul(alone[static_cast<std::size_t>(m)].data(), x.data(),
                         ts[static_cast<std::size_t>(m)].m, S);
        }
        engine::matmul_fused(outs, x.data(), S);
        for (std::size_t m = 0; m < 3; ++m) {
          EXPECT_EQ(std::memcmp(want[m].data(), got[m].data(), want[m].size() * 4), 0)
              << "fused matrix " << m << ", " << engine::to_string(type) << " ("
              << engine::to_string(acts) << " activations) at " << n << " threads";
          EXPECT_EQ(std::memcmp(want[m].data(), alone[m].data(), want[m].size() * 4), 0)
              << "matrix " << m << " alone, " << engine::to_string(type) << " at " << n
              << " threads";
        }
      }
    }
  }
  engine::set_q8_0_activations(Q8_0Activations::kQ8_0);
  engine::set_threads(saved);
}

TEST(EngineWeights, FusedMatmulRefusesMismatchedMatrices) {
  const Typed a = make_typed(WeightType::kF32, 16, 64, 40);
  const Typed b = make_typed(WeightType::kF32, 16, 96, 41);
  const auto x = test::randn(96, 42);
  std::vector<float> oa(16), ob(16);
  const engine::MatmulOut outs[] = {{oa.data(), &a.m}, {ob.data(), &b.m}};
  try {
    engine::matmul_fused(outs, x.data(), 1);
    ADD_FAILURE() << "mismatched cols accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("cols = 64, got 96"), std::string::npos) << e.what();
  }
  EXPECT_THROW(engine::matmul_fused(std::span<const engine::MatmulOut>(), x.data(), 1), Error);
}

// Two blocks by hand. Activations: block 0 holds 0.25 * (j - 16) for j < 31 and 31.75 =
// 127 * 0.25, so amax = 31.75, d = 0.25 (exact in fp16), 127 / amax = 4 and the codes are
// j - 16 and 127 (sum 96). Block 1: -31.75 (code -127), 0.125, 0.375, -0.625, 0.875 (x * 4 =
// 0.5, 1.5, -2.5, 3.5: ties, to even: 0, 2, -2, 4; llama.cpp's x86 quantizer rounds this way),
// then zeros.
void hand_activations(float* x) {
  for (int j = 0; j < 31; ++j) x[j] = 0.25f * static_cast<float>(j - 16);
  x[31] = 31.75f;
  for (int j = 32; j < 64; ++j) x[j] = 0.0f;
  x[32] = -31.75f;
  x[33] = 0.125f;
  x[34] = 0.375f;
  x[35] = -0.625f;
  x[36] = 0.875f;
}

TEST(EngineWeights, Q8_0ActivationQuantizationByHand) {
  float x[64];
  hand_activations(x);
  std::int8_t q[64];
  float d[2];
  engine::quantize_activations_q8_0(x, 64, q, d);
  EXPECT_EQ(d[0], 0.25f);
  EXPECT_EQ(d[1], 0.25f);
  for (int j = 0; j < 31; ++j) EXPECT_EQ(q[j], j - 16) << j;
  EXPECT_EQ(q[31], 127);
  const std::int8_t want1[5] = {-127, 0, 2, -2, 4};
  for (int j = 0; j < 5; ++j) EXPECT_EQ(q[32 + j], want1[j]) << j;
  for (int j = 37; j < 64; ++j) EXPECT_EQ(q[j], 0) << j;

  // amax = 12.7: d = fp16(0.1) = 0x2e66 = 0.0999755859375, codes x * 10 rounded.
  float y[32] = {};
  y[0] = 12.7f;
  y[1] = -5.0f;  // -50 (127 / 12.7f = 10 up to one fp32 rounding)
  y[2] = 1.0f;   // 10
  std::int8_t qy[32];
  float dy;
  engine::quantize_activations_q8_0(y, 32, qy, &dy);
  EXPECT_EQ(dy, half_to_float(0x2e66));
  EXPECT_EQ(qy[0], 127);
  EXPECT_EQ(qy[1], -50);
  EXPECT_EQ(qy[2], 10);

  // An all-zero block: d = 0, codes 0. A block with a NaN or an infinity: d = NaN, codes 0.
  std::fill(y, y + 32, 0.0f);
  engine::quantize_activations_q8_0(y, 32, qy, &dy);
  EXPECT_EQ(dy, 0.0f);
  for (const std::int8_t v : qy) EXPECT_EQ(v, 0);
  y[5] = std::numeric_limits<float>::infinity();
  y[6] = 3.0f;
  engine::quantize_activations_q8_0(y, 32, qy, &dy);
  EXPECT_TRUE(std::isnan(dy));
  for (const std::int8_t v : qy) EXPECT_EQ(v, 0);
}

TEST(EngineWeights, Q8_0TimesQ8_0DotByHand) {
  // Weights: block 0 has d = 0.5 (fp16 0x3800) and every code 1; block 1 has d = 2 (0x4000),
  // codes -128, 7, 3, 5, 1, then 7.
  std::uint8_t raw[68];
  raw[0] = 0x00;
  raw[1] = 0x38;
  for (int j = 0; j < 32; ++j) raw[2 + j] = 1;
  raw[34] = 0x00;
  raw[35] = 0x40;
  for (int j = 0; j < 32; ++j) raw[36 + j] = 7;
  raw[36] = 0x80;  // -128
  raw[38] = 3;
  raw[39] = 5;
  raw[40] = 1;
  const WeightMatrix m{WeightType::kQ8_0, 1, 64, raw};
  float x[64];
  hand_activations(x);
  std::int8_t q[64];
  float d[2];
  engine::quantize_activations_q8_0(x, 64, q, d);
  // Block 0: isum = 96, times 0.5 * 0.25 = 12. Block 1: isum = (-128)(-127) + 7*0 + 3*2 +
  // 5*(-2) + 1*4 = 16256, times 2 * 0.25 = 8128. Lanes 0 and 1: 12 + 8128 = 8140.
  for (const Isa isa :
       {Isa::kScalar, Isa::kAvx2, Isa::kAvx2Vnni, Isa::kAvx512, Isa::kAvx512Vnni}) {
    if (!cpu::isa_supported(isa)) continue;
    float out = -1.0f;
    engine::matmul_rows_q8_0(isa, &out, q, d, m, 1, 0, 1);
    EXPECT_EQ(out, 8140.0f) << cpu::to_string(isa);
  }
  float out = -1.0f;
  engine::matmul(&out, x, m, 1);  // the default: Q8_0 activations
  EXPECT_EQ(out, 8140.0f);
  // fp32 activations: 0.5 * 24 + 2 * (4064 + 0.875 + 1.125 - 3.125 + 0.875) = 12 + 8127.5.
  engine::set_q8_0_activations(Q8_0Activations::kF32);
  engine::matmul(&out, x, m, 1);
  engine::set_q8_0_activations(Q8_0Activations::kQ8_0);
  EXPECT_EQ(out, 8139.5f);
}

// The Q8_0 x Q8_0 definition written out here: per block the integer dot times the product of
// the two scales, added to lane b % 8, the lanes summed as ((0+4)+(2+6))+((1+5)+(3+7)).
float q8q8_reference(const std::uint8_t* row, const std::int8_t* xq, const float* xd,
                     std::int64_t nb) {
  float lane[8] = {};
  for (std::int64_t b = 0; b < nb; ++b) {
    BlockQ8_0 blk;
    std::memcpy(&blk, row + 34 * b, 34);
    int isum = 0;
    for (int j = 0; j < 32; ++j) isum += blk.q[j] * xq[32 * b + j];
    const float scale = half_to_float(blk.d) * xd[b];
    lane[b % 8] += static_cast<float>(isum) * scale;
  }
  return ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
}

TEST(EngineWeights, Q8_0TimesQ8_0KernelsAreTheDefinitionBitForBit) {
  // Block counts around the AVX2 kernel's groups of 8 (tails of every length), odd row counts
  // (its pairs of rows and the single-row tail), several activation rows.
  for (const std::int64_t nb : {1, 2, 3, 7, 8, 9, 15, 16, 17, 23, 24, 40}) {
    const std::int64_t cols = 32 * nb;
    for (const std::int64_t rows : {1, 2, 3, 5, 8}) {
      for (const std::int64_t S : {1, 3}) {
        const Typed t =
            make_typed(WeightType::kQ8_0, rows, cols, 300 + static_cast<std::uint64_t>(nb));
        auto x =
            test::randn(static_cast<std::size_t>(S * cols), 40 + static_cast<std::uint64_t>(rows));
        for (std::size_t i = 0; i < x.size(); i += 5) x[i] *= 30.0f;  // spread the scales
        std::vector<std::int8_t> xq(x.size());
        std::vector<float> xd(x.size() / 32);
        engine::quantize_activations_q8_0(x.data(), S * cols, xq.data(), xd.data());
        for (const Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx2Vnni, Isa::kAvx512Vnni}) {
          if (!cpu::isa_supported(isa)) continue;
          std::vector<float> out(static_cast<std::size_t>(S * rows), -1.0f);
          engine::matmul_rows_q8_0(isa, out.data(), xq.data(), xd.data(), t.m, S, 0, rows);
          for (std::int64_t s = 0; s < S; ++s) {
            for (std::int64_t i = 0; i < rows; ++i) {
              const float want =
                  q8q8_reference(t.m.row(i), xq.data() + s * cols, xd.data() + s * nb, nb);
              const float got = out[static_cast<std::size_t>(s * rows + i)];
              ASSERT_EQ(std::memcmp(&want, &got, 4), 0)
                  << cpu::to_string(isa) << " " << rows << "x" << cols << " S=" << S << " row "
                  << i << ": " << want << " vs " << got;
            }
          }
        }
      }
    }
  }
}

// The prefill tiles (several rows x several tokens per kernel call, engine/matmul.h
// PrefillKernels) against the definitions written out in this file, bit for bit: the fixed-order
// dot over the stored values (fp32 activations) and q8q8_reference (Q8_0 x Q8_0). Token counts
// below, at and past the tiles' 4 tokens, row counts that are not multiples of the tiles' rows,
// widths with a tail after the last chunk of 8 (fp32) or group of 8 blocks (Q8_0), one past the
// tiles' widest row (the row kernels then); through matmul_rows per family and kernel choice,
// and through matmul() on 1, 2 and 3 threads.
struct PrefillCase {
  WeightType type;
  bool q8_activations;  // Q8_0 weights: Q8_0 x Q8_0; otherwise fp32 activations
  std::int64_t cols;
};

TEST(EngineWeights, PrefillTilesAreTheDefinitionBitForBit) {
  const int saved = engine::threads();
  std::vector<PrefillCase> cases;
  for (const WeightType type : {WeightType::kF32, WeightType::kF16, WeightType::kBF16}) {
    for (const std::int64_t cols : {9, 64, 203}) cases.push_back({type, false, cols});
  }
  for (const std::int64_t nb : {1, 8, 9, 23}) cases.push_back({WeightType::kQ8_0, false, 32 * nb});
  for (const std::int64_t nb : {1, 7, 8, 9, 17, 24, 260})
    cases.push_back({WeightType::kQ8_0, true, 32 * nb});
  for (const PrefillCase& c : cases) {
    for (const std::int64_t rows : {1, 5, 7, 37}) {
      const Typed t = make_typed(c.type, rows, c.cols, 500 + static_cast<std::uint64_t>(c.cols));
      for (const std::int64_t S : {1, 2, 3, 5, 8, 17, 64}) {
        if (c.cols > 1000 && S > 5) continue;  // the wide rows: a few token counts suffice
        auto x = test::randn(static_cast<std::size_t>(S * c.cols),
                             60 + static_cast<std::uint64_t>(rows * 100 + S));
        for (std::size_t i = 0; i < x.size(); i += 7) x[i] *= 25.0f;  // spread the scales
        const std::int64_t nb = c.cols / 32;
        std::vector<std::int8_t> xq(x.size());
        std::vector<float> xd(x.size() / 32 + 1);
        if (c.q8_activations) engine::quantize_activations_q8_0(x.data(), S * c.cols, xq.data(), xd.data());
        std::vector<float> want(static_cast<std::size_t>(S * rows));
        for (std::int64_t s = 0; s < S; ++s) {
          for (std::int64_t i = 0; i < rows; ++i) {
            want[static_cast<std::size_t>(s * rows + i)] =
                c.q8_activations ? q8q8_reference(t.m.row(i), xq.data() + s * c.cols,
                                                  xd.data() + s * nb, nb)
                                 : fma_dot(t.exact.data() + i * c.cols,
                                           x.data() + s * c.cols, c.cols);
          }
        }
        const auto check = [&](const std::vector<float>& got, const std::string& what) {
          for (std::size_t k = 0; k < want.size(); ++k) {
            ASSERT_EQ(std::memcmp(&want[k], &got[k], 4), 0)
                << engine::to_string(c.type) << (c.q8_activations ? " x q8_0 " : " x f32 ")
                << rows << "x" << c.cols << " S=" << S << " " << what << " at " << k << ": "
                << want[k] << " vs " << got[k];
          }
        };
        for (const engine::PrefillKernels k :
             {engine::PrefillKernels::kTiles, engine::PrefillKernels::kRows}) {
          engine::set_prefill_kernels(k);
          const std::string kname = k == engine::PrefillKernels::kTiles ? "tiles" : "rows";
          for (const Isa isa :
               {Isa::kScalar, Isa::kAvx2, Isa::kAvx2Vnni, Isa::kAvx512, Isa::kAvx512Vnni}) {
            if (!cpu::isa_supported(isa)) continue;
            // Two calls splitting the rows at an odd row: tiles start anywhere.
            std::vector<float> got(want.size(), -1.0f);
            const std::int64_t mid = rows / 2;
            for (const auto& [b, e] : {std::pair{std::int64_t{0}, mid}, std::pair{mid, rows}}) {
              if (c.q8_activations) {
                engine::matmul_rows_q8_0(isa, got.data(), xq.data(), xd.data(), t.m, S, b, e);
              } else {
                engine::matmul_rows(isa, got.data(), x.data(), t.m, S, b, e);
              }
            }
            check(got, kname + " " + cpu::to_string(isa));
          }
          engine::set_q8_0_activations(c.q8_activations ? Q8_0Activations::kQ8_0
                                                        : Q8_0Activations::kF32);
          for (const int n : {1, 2, 3}) {
            engine::set_threads(n);
            std::vector<float> got(want.size(), -1.0f);
            engine::matmul(got.data(), x.data(), t.m, S);
            check(got, kname + " matmul() at " + std::to_string(n) + " threads");
          }
          engine::set_q8_0_activations(Q8_0Activations::kQ8_0);
        }
        engine::set_prefill_kernels(engine::PrefillKernels::kTiles);
      }
    }
  }
  engine::set_threads(saved);
}

// The AVX-512 GEMM's edges (matmul_gemm_avx512.inc: panels of 4 rows, micro-kernels of 1 to 6
// token pairs, K blocks of 256 values, blocks of 24 pairs and of up to 64 rows) against
// fma_dot over the stored values, bit for bit, for every family: token counts 2 to 20 (every
// micro-kernel width, odd counts with a zero partner) and past one and two pair blocks, row
// counts that are not multiples of 4 and past one row block, widths of one chunk, with a tail,
// across one and several K blocks; row ranges starting at odd rows; and matmul() on 1 to 3
// threads.
TEST(EngineWeights, GemmEdgesAreTheDefinitionBitForBit) {
  const int saved = engine::threads();
  std::vector<std::int64_t> token_counts;
  for (std::int64_t S = 2; S <= 20; ++S) token_counts.push_back(S);
  for (const std::int64_t S : {47, 48, 49, 97}) token_counts.push_back(S);
  for (const WeightType type :
       {WeightType::kF32, WeightType::kF16, WeightType::kBF16, WeightType::kQ8_0}) {
    const std::vector<std::int64_t> widths =
        type == WeightType::kQ8_0 ? std::vector<std::int64_t>{32, 256, 288, 544}
                                  : std::vector<std::int64_t>{8, 15, 256, 264, 523};
    for (const std::int64_t cols : widths) {
      for (const std::int64_t rows : {3, 5, 67, 131}) {
        const Typed t = make_typed(type, rows, cols, 900 + static_cast<std::uint64_t>(cols + rows));
        for (const std::int64_t S : token_counts) {
          if (rows * S * cols > 4'000'000 && S % 16 != 1) continue;  // the largest: a few S
          auto x = test::randn(static_cast<std::size_t>(S * cols),
                               31 + static_cast<std::uint64_t>(rows * 1000 + S));
          for (std::size_t i = 0; i < x.size(); i += 5) x[i] *= 40.0f;
          std::vector<float> want(static_cast<std::size_t>(S * rows));
          for (std::int64_t s = 0; s < S; ++s) {
            for (std::int64_t i = 0; i < rows; ++i) {
              want[static_cast<std::size_t>(s * rows + i)] =
                  fma_dot(t.exact.data() + i * cols, x.data() + s * cols, cols);
            }
          }
          const auto check = [&](const std::vector<float>& got, const std::string& what) {
            for (std::size_t k = 0; k < want.size(); ++k) {
              ASSERT_EQ(std::memcmp(&want[k], &got[k], 4), 0)
                  << engine::to_string(type) << " " << rows << "x" << cols << " S=" << S << " "
                  << what << " at " << k << ": " << want[k] << " vs " << got[k];
            }
          };
          for (const Isa isa :
               {Isa::kScalar, Isa::kAvx2, Isa::kAvx2Vnni, Isa::kAvx512, Isa::kAvx512Vnni}) {
            if (!cpu::isa_supported(isa)) continue;
            std::vector<float> got(want.size(), -1.0f);
            const std::int64_t a = rows / 3, b = rows - rows / 4;  // three ranges, odd starts
            for (const auto& [r0, r1] : {std::pair{std::int64_t{0}, a}, std::pair{a, b},
                                         std::pair{b, rows}}) {
              engine::matmul_rows(isa, got.data(), x.data(), t.m, S, r0, r1);
            }
            check(got, cpu::to_string(isa));
          }
          if (S % 8 == 1 || S == 8) {
            engine::set_q8_0_activations(Q8_0Activations::kF32);
            for (const int n : {1, 2, 3}) {
              engine::set_threads(n);
              std::vector<float> got(want.size(), -1.0f);
              engine::matmul(got.data(), x.data(), t.m, S);
              check(got, "matmul() at " + std::to_string(n) + " threads");
            }
            engine::set_q8_0_activations(Q8_0Activations::kQ8_0);
          }
        }
      }
    }
  }
  engine::set_threads(saved);
}

TEST(EngineWeights, Q8_0BlockLayoutIsGgufs) {
  // One block by hand: bytes 0-1 the fp16 scale (little-endian), bytes 2..33 the int8 quants.
  std::uint8_t raw[34];
  raw[0] = 0x00;  // 0x3800 = fp16 0.5
  raw[1] = 0x38;
  for (int j = 0; j < 32; ++j)
    raw[2 + j] = static_cast<std::uint8_t>(static_cast<std::int8_t>(j - 16));
  raw[2 + 31] = 0x80;  // -128
  const WeightMatrix m{WeightType::kQ8_0, 1, 32, raw};
  EXPECT_EQ(m.row_bytes(), 34);
  float w[32];
  engine::dequantize_row(m, 0, w);
  for (int j = 0; j < 31; ++j) EXPECT_EQ(w[j], 0.5f * static_cast<float>(j - 16)) << j;
  EXPECT_EQ(w[31], -64.0f);

  // The quantizer: max |x| = 127 * 0.25 gives d = 0.25 (exact in fp16) and q = x / 0.25.
  float x[32];
  for (int j = 0; j < 32; ++j)
    x[j] = 0.25f * static_cast<float>(j * 8 - 127 > 127 ? 127 : j * 8 - 127);
  BlockQ8_0 b{};
  engine::quantize_row_q8_0(x, &b, 32);
  EXPECT_EQ(b.d, 0x3400);  // fp16 0.25
  for (int j = 0; j < 32; ++j) EXPECT_EQ(b.q[j], static_cast<std::int8_t>(x[j] / 0.25f)) << j;
  // An all-zero block: d = 0, every q = 0.
  const float z[32] = {};
  engine::quantize_row_q8_0(z, &b, 32);
  EXPECT_EQ(b.d, 0);
  for (const std::int8_t q : b.q) EXPECT_EQ(q, 0);
}

TEST(EngineWeights, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 lies halfway between bf16 1.0 and 1 + 2^-7: ties to even (1.0); just above rounds up.
  EXPECT_EQ(engine::float_to_bf16(1.0f + 0x1p-8f), 0x3f80);
  EXPECT_EQ(engine::float_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
  EXPECT_EQ(engine::float_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);  // halfway, odd below: up
  EXPECT_EQ(engine::bf16_to_float(0xc000), -2.0f);
}

}  // namespace
}  // namespace vq
