// Typed weight matrices (engine/weights.h) and their matmul kernels (engine/matmul.h): every
// kernel family and every thread count against the scalar definition, bit for bit, with the
// expected values built independently (element conversions written out here, the library's
// core kernels::dot for the fixed summation order); and GGUF's Q8_0 block layout by hand.
#include <cstring>
#include <vector>

#include "core/kernels.h"
#include "engine/matmul.h"
#include "engine/ops.h"
#include "engine/parallel.h"
#include "engine/weights.h"
#include "test_util.h"

namespace vq {
namespace {
using engine::BlockQ8_0;
using engine::Isa;
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
          for (const Isa isa : {Isa::kScalar, Isa::kAvx2}) {
            if (!engine::isa_supported(isa)) continue;
            std::vector<float> out(static_cast<std::size_t>(S * rows), -1.0f);
            engine::matmul_rows(isa, out.data(), x.data(), t.m, S, 0, rows);
            for (std::int64_t s = 0; s < S; ++s) {
              for (std::int64_t i = 0; i < rows; ++i) {
                const float want =
                    kernels::dot(t.exact.data() + i * cols, x.data() + s * cols, cols);
                const float got = out[static_cast<std::size_t>(s * rows + i)];
                ASSERT_EQ(std::memcmp(&want, &got, 4), 0)
                    << engine::to_string(type) << " " << engine::to_string(isa) << " " << rows
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
  for (const WeightType type : {WeightType::kBF16, WeightType::kQ8_0}) {
    const Typed t = make_typed(type, 1000, 256, 9);  // large enough to be split
    const auto x = test::randn(2 * 256, 10);
    std::vector<float> want(2 * 1000);
    engine::matmul_rows(Isa::kScalar, want.data(), x.data(), t.m, 2, 0, 1000);
    for (const int n : {1, 2, 3, 5}) {
      engine::set_threads(n);
      std::vector<float> got(want.size(), -1.0f);
      engine::matmul(got.data(), x.data(), t.m, 2);
      EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * 4), 0)
          << engine::to_string(type) << " at " << n << " threads";
    }
  }
  engine::set_threads(saved);
  EXPECT_THROW(engine::set_threads(0), Error);
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
