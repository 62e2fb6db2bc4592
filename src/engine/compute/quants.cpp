// GGML block formats: dequantization of the types GGUF models commonly use, and the few
// quantizers the GGUF writer needs (F16, BF16, Q8_0). The layouts are documented in quants.h.
#include "engine/compute/quants.h"

#include <cmath>
#include <cstring>

#include "veloxquant/errors.h"
#include "veloxquant/types.h"

namespace vq::engine {
namespace {

constexpr std::int64_t kQK = 32;    // values per Q8_0 / Q4_0 block
constexpr std::int64_t kQKK = 256;  // values per K-quant super-block

float load_half(const std::uint8_t* p) noexcept {
  std::uint16_t bits;
  std::memcpy(&bits, p, 2);
  return half_to_float(bits);
}

void store_u16(std::uint8_t* p, std::uint16_t v) noexcept { std::memcpy(p, &v, 2); }

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K block: j < 4 keep them in the low
// six bits of bytes j and j + 4; j >= 4 take four low bits from byte j + 4 and the two high
// bits from the top of bytes j - 4 (scale) and j (min).
void q4k_scale_min(int j, const std::uint8_t* s, std::uint8_t* sc, std::uint8_t* m) noexcept {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = static_cast<std::uint8_t>((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
    *m = static_cast<std::uint8_t>((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

void dequant_q8_0(const std::uint8_t* src, float* dst, std::int64_t n) noexcept {
  for (std::int64_t b = 0; b < n / kQK; ++b, src += 34, dst += kQK) {
    const float d = load_half(src);
    for (int j = 0; j < kQK; ++j)
      dst[j] = static_cast<float>(static_cast<std::int8_t>(src[2 + j])) * d;
  }
}

void dequant_q4_0(const std::uint8_t* src, float* dst, std::int64_t n) noexcept {
  for (std::int64_t b = 0; b < n / kQK; ++b, src += 18, dst += kQK) {
    const float d = load_half(src);
    const std::uint8_t* qs = src + 2;
    for (int j = 0; j < kQK / 2; ++j) {
      dst[j] = static_cast<float>((qs[j] & 0x0F) - 8) * d;
      dst[j + kQK / 2] = static_cast<float>((qs[j] >> 4) - 8) * d;
    }
  }
}

void dequant_q4_k(const std::uint8_t* src, float* dst, std::int64_t n) noexcept {
  for (std::int64_t b = 0; b < n / kQKK; ++b, src += 144) {
    const float d = load_half(src);
    const float dmin = load_half(src + 2);
    const std::uint8_t* scales = src + 4;
    const std::uint8_t* q = src + 16;
    for (int g = 0; g < 4; ++g, q += 32) {
      std::uint8_t sc, m;
      q4k_scale_min(2 * g, scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      q4k_scale_min(2 * g + 1, scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *dst++ = d1 * static_cast<float>(q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *dst++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
}

void dequant_q4_1(const std::uint8_t* src, float* dst, std::int64_t n) noexcept {
  for (std::int64_t b = 0; b < n / kQK; ++b, src += 20, dst += kQK) {
    const float d = load_half(src);
    const float m = load_half(src + 2);
    const std::uint8_t* qs = src + 4;
    for (int j = 0; j < kQK / 2; ++j) {
      dst[j] = static_cast<float>(qs[j] & 0x0F) * d + m;
      dst[j + kQK / 2] = static_cast<float>(qs[j] >> 4) * d + m;
    }
  }
}

// Q5_0 (with_min false: 22-byte blocks, value - 16) and Q5_1 (24-byte blocks, value * d + m).
template <bool kWithMin>
void dequant_q5(const std::uint8_t* src, float* dst, std::int64_t n) noexcept {
  constexpr int kBytes = kWithMin ? 24 : 22;
  for (std::int64_t b = 0; b < n / kQK; ++b, src += kBytes, dst += kQK) {
    const float d = load_half(src);
    const float m = kWithMin ? load_half(src + 2) : 0.0f;
    const std::uint8_t* hb = src + (kWithMin ? 4 : 2);
    const std::uint32_t qh = static_cast<std::uint32_t>(hb[0]) | static_cast<std::uint32_t>(hb[1]) << 8 |
                             static_cast<std::uint32_t>(hb[2]) << 16 |
                             static_cast<std::uint32_t>(hb[3]) << 24;
    const std::uint8_t* qs = hb + 4;
    for (int j = 0; j < kQK / 2; ++j) {
      const int v0 = static_cast<int>((qs[j] & 0x0F) | (((qh >> j) & 1u) << 4));
      const int v1 = static_cast<int>((qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4));
      if constexpr (kWithMin) {
        dst[j] = static_cast<float>(v0) * d + m;
        dst[j + kQK / 2] = static_cast<float>(v1) * d + m;
      } else {
        dst[j] = static_cast<float>(v0 - 16) * d;
        dst[j + kQK / 2] = static_cast<float>(v1 - 16) * d;
      }
    }
  }
}

void dequant_q2_k(const std::uint8_t* src, float* dst, std::int64_t n) noexcept {
  for (std::int64_t b = 0; b < n / kQKK; ++b, src += 84) {
    const std::uint8_t* scales = src;
    const float d = load_half(src + 80);
    const float dmin = load_half(src + 82);
    for (int half = 0; half < 2; ++half) {
      const std::uint8_t* q = src + 16 + 32 * half;
      for (int j = 0; j < 4; ++j) {
        for (int part = 0; part < 2; ++part) {
          const std::uint8_t sc = scales[8 * half + 2 * j + part];
          const float dl = d * static_cast<float>(sc & 0xF);
          const float ml = dmin * static_cast<float>(sc >> 4);
          for (int l = 0; l < 16; ++l) {
            *dst++ = dl * static_cast<float>((q[16 * part + l] >> (2 * j)) & 3) - ml;
          }
        }
      }
    }
  }
}

void dequant_q3_k(const std::uint8_t* src, float* dst, std::int64_t n) noexcept {
  for (std::int64_t b = 0; b < n / kQKK; ++b, src += 110) {
    const std::uint8_t* hmask = src;
    const std::uint8_t* s = src + 96;
    const float d = load_half(src + 108);
    for (int half = 0; half < 2; ++half) {
      const std::uint8_t* q = src + 32 + 32 * half;
      for (int j = 0; j < 4; ++j) {
        const int bit = 4 * half + j;
        for (int part = 0; part < 2; ++part) {
          const int g = 8 * half + 2 * j + part;
          const int sc = ((s[g % 8] >> (4 * (g / 8))) & 0xF) | (((s[8 + g % 4] >> (2 * (g / 4))) & 3) << 4);
          const float dl = d * static_cast<float>(sc - 32);
          for (int l = 16 * part; l < 16 * part + 16; ++l) {
            const int v = ((q[l] >> (2 * j)) & 3) - (((hmask[l] >> bit) & 1) ? 0 : 4);
            *dst++ = dl * static_cast<float>(v);
          }
        }
      }
    }
  }
}

void dequant_q5_k(const std::uint8_t* src, float* dst, std::int64_t n) noexcept {
  for (std::int64_t b = 0; b < n / kQKK; ++b, src += 176) {
    const float d = load_half(src);
    const float dmin = load_half(src + 2);
    const std::uint8_t* scales = src + 4;
    const std::uint8_t* qh = src + 16;
    const std::uint8_t* q = src + 48;
    for (int g = 0; g < 4; ++g, q += 32) {
      std::uint8_t sc, m;
      q4k_scale_min(2 * g, scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      q4k_scale_min(2 * g + 1, scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l)
        *dst++ = d1 * static_cast<float>((q[l] & 0xF) + (((qh[l] >> (2 * g)) & 1) << 4)) - m1;
      for (int l = 0; l < 32; ++l)
        *dst++ = d2 * static_cast<float>((q[l] >> 4) + (((qh[l] >> (2 * g + 1)) & 1) << 4)) - m2;
    }
  }
}

void dequant_q6_k(const std::uint8_t* src, float* dst, std::int64_t n) noexcept {
  for (std::int64_t b = 0; b < n / kQKK; ++b, src += 210) {
    const std::uint8_t* ql = src;
    const std::uint8_t* qh = src + 128;
    const auto* sc = reinterpret_cast<const std::int8_t*>(src + 192);
    const float d = load_half(src + 208);
    for (int half = 0; half < 2; ++half, dst += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        dst[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
        dst[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        dst[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        dst[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
    }
  }
}

void quant_q8_0(const float* src, std::uint8_t* dst, std::int64_t n) noexcept {
  for (std::int64_t b = 0; b < n / kQK; ++b, src += kQK, dst += 34) {
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::fmax(amax, std::fabs(src[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_u16(dst, float_to_half(d));
    for (int j = 0; j < kQK; ++j) {
      dst[2 + j] = static_cast<std::uint8_t>(static_cast<std::int8_t>(std::round(src[j] * id)));
    }
  }
}

}  // namespace

std::optional<GgmlType> ggml_type_from_id(std::uint32_t id) noexcept {
  switch (id) {
    case 0:
      return GgmlType::kF32;
    case 1:
      return GgmlType::kF16;
    case 2:
      return GgmlType::kQ4_0;
    case 3:
      return GgmlType::kQ4_1;
    case 6:
      return GgmlType::kQ5_0;
    case 7:
      return GgmlType::kQ5_1;
    case 8:
      return GgmlType::kQ8_0;
    case 10:
      return GgmlType::kQ2_K;
    case 11:
      return GgmlType::kQ3_K;
    case 12:
      return GgmlType::kQ4_K;
    case 13:
      return GgmlType::kQ5_K;
    case 14:
      return GgmlType::kQ6_K;
    case 30:
      return GgmlType::kBF16;
    default:
      return std::nullopt;
  }
}

const GgmlTypeInfo& type_info(GgmlType type) noexcept {
  static const GgmlTypeInfo f32{"F32", 1, 4}, f16{"F16", 1, 2}, bf16{"BF16", 1, 2},
      q8_0{"Q8_0", 32, 34}, q4_0{"Q4_0", 32, 18}, q4_1{"Q4_1", 32, 20}, q5_0{"Q5_0", 32, 22},
      q5_1{"Q5_1", 32, 24}, q2_k{"Q2_K", 256, 84}, q3_k{"Q3_K", 256, 110}, q4_k{"Q4_K", 256, 144},
      q5_k{"Q5_K", 256, 176}, q6_k{"Q6_K", 256, 210};
  switch (type) {
    case GgmlType::kF32:
      return f32;
    case GgmlType::kF16:
      return f16;
    case GgmlType::kBF16:
      return bf16;
    case GgmlType::kQ8_0:
      return q8_0;
    case GgmlType::kQ4_0:
      return q4_0;
    case GgmlType::kQ4_1:
      return q4_1;
    case GgmlType::kQ5_0:
      return q5_0;
    case GgmlType::kQ5_1:
      return q5_1;
    case GgmlType::kQ2_K:
      return q2_k;
    case GgmlType::kQ3_K:
      return q3_k;
    case GgmlType::kQ4_K:
      return q4_k;
    case GgmlType::kQ5_K:
      return q5_k;
    case GgmlType::kQ6_K:
      return q6_k;
  }
  return f32;
}

WeightType weight_type_of(GgmlType type) noexcept {
  switch (type) {
    case GgmlType::kF32:
      return WeightType::kF32;
    case GgmlType::kF16:
      return WeightType::kF16;
    case GgmlType::kBF16:
      return WeightType::kBF16;
    case GgmlType::kQ8_0:
      return WeightType::kQ8_0;
    case GgmlType::kQ4_0:
      return WeightType::kQ4_0;
    case GgmlType::kQ4_1:
      return WeightType::kQ4_1;
    case GgmlType::kQ5_0:
      return WeightType::kQ5_0;
    case GgmlType::kQ5_1:
      return WeightType::kQ5_1;
    case GgmlType::kQ2_K:
      return WeightType::kQ2_K;
    case GgmlType::kQ3_K:
      return WeightType::kQ3_K;
    case GgmlType::kQ4_K:
      return WeightType::kQ4_K;
    case GgmlType::kQ5_K:
      return WeightType::kQ5_K;
    case GgmlType::kQ6_K:
      return WeightType::kQ6_K;
  }
  return WeightType::kF32;
}

GgmlType ggml_type_of(WeightType type) noexcept {
  switch (type) {
    case WeightType::kF32:
      return GgmlType::kF32;
    case WeightType::kF16:
      return GgmlType::kF16;
    case WeightType::kBF16:
      return GgmlType::kBF16;
    case WeightType::kQ8_0:
      return GgmlType::kQ8_0;
    case WeightType::kQ4_0:
      return GgmlType::kQ4_0;
    case WeightType::kQ4_1:
      return GgmlType::kQ4_1;
    case WeightType::kQ5_0:
      return GgmlType::kQ5_0;
    case WeightType::kQ5_1:
      return GgmlType::kQ5_1;
    case WeightType::kQ2_K:
      return GgmlType::kQ2_K;
    case WeightType::kQ3_K:
      return GgmlType::kQ3_K;
    case WeightType::kQ4_K:
      return GgmlType::kQ4_K;
    case WeightType::kQ5_K:
      return GgmlType::kQ5_K;
    case WeightType::kQ6_K:
      return GgmlType::kQ6_K;
  }
  return GgmlType::kF32;
}

std::string ggml_type_name(std::uint32_t id) {
  static const char* const names[] = {
      "F32",     "F16",    "Q4_0",    "Q4_1",  "Q4_2",   "Q4_3",  "Q5_0",  "Q5_1",
      "Q8_0",    "Q8_1",   "Q2_K",    "Q3_K",  "Q4_K",   "Q5_K",  "Q6_K",  "Q8_K",
      "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS",
      "I8",      "I16",    "I32",     "I64",   "F64",    "IQ1_M", "BF16"};
  if (id < sizeof(names) / sizeof(names[0])) return names[id];
  if (id == 34) return "TQ1_0";
  if (id == 35) return "TQ2_0";
  if (id == 39) return "MXFP4";
  return "type " + std::to_string(id);
}

std::int64_t type_bytes(GgmlType type, std::int64_t n) noexcept {
  const GgmlTypeInfo& t = type_info(type);
  return n / t.block_size * t.block_bytes;
}

void dequantize(GgmlType type, const std::uint8_t* src, float* dst, std::int64_t n) {
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, src, static_cast<std::size_t>(n) * 4);
      return;
    case GgmlType::kF16:
      for (std::int64_t i = 0; i < n; ++i) dst[i] = load_half(src + 2 * i);
      return;
    case GgmlType::kBF16:
      for (std::int64_t i = 0; i < n; ++i) {
        std::uint16_t bits;
        std::memcpy(&bits, src + 2 * i, 2);
        dst[i] = bf16_to_float(bits);
      }
      return;
    case GgmlType::kQ8_0:
      return dequant_q8_0(src, dst, n);
    case GgmlType::kQ4_0:
      return dequant_q4_0(src, dst, n);
    case GgmlType::kQ4_1:
      return dequant_q4_1(src, dst, n);
    case GgmlType::kQ5_0:
      return dequant_q5<false>(src, dst, n);
    case GgmlType::kQ5_1:
      return dequant_q5<true>(src, dst, n);
    case GgmlType::kQ2_K:
      return dequant_q2_k(src, dst, n);
    case GgmlType::kQ3_K:
      return dequant_q3_k(src, dst, n);
    case GgmlType::kQ4_K:
      return dequant_q4_k(src, dst, n);
    case GgmlType::kQ5_K:
      return dequant_q5_k(src, dst, n);
    case GgmlType::kQ6_K:
      return dequant_q6_k(src, dst, n);
  }
}

void quantize(GgmlType type, const float* src, std::uint8_t* dst, std::int64_t n) {
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, src, static_cast<std::size_t>(n) * 4);
      return;
    case GgmlType::kF16:
      for (std::int64_t i = 0; i < n; ++i) store_u16(dst + 2 * i, float_to_half(src[i]));
      return;
    case GgmlType::kBF16:
      for (std::int64_t i = 0; i < n; ++i) store_u16(dst + 2 * i, float_to_bf16(src[i]));
      return;
    case GgmlType::kQ8_0:
      return quant_q8_0(src, dst, n);
    default:
      throw Error(ErrorCode::kInvalidArgument,
                  std::string("[gguf] quantizing to ") + type_info(type).name +
                      " is not supported; supported: F32, F16, BF16, Q8_0");
  }
}

}  // namespace vq::engine
