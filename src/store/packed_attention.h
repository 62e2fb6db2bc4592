// Attention read straight from packed rows (the quantized stores' fused path): scores and
// weighted value sums computed on the codes, with the scale and zero folded into the query or
// the probability, never a row dequantized to fp32. One family of kernels serves every packed
// store: KIVI (kivi_store.cpp: keys per channel, values per token), the demote= tier
// (mixed_store.cpp: per token) and ggml's q8_0 / q4_0 blocks (block_store.cpp: per token), and
// their plain (fp16 / fp32) rows, read with the same sums.
//
// Each kernel has one scalar definition, below, in a fixed order; each SIMD family (chosen at
// run time: AVX2, or the same kernels built for AVX-512) computes the same additions in the
// same order and is bit-identical to it
// (tests/test_packed_attention.cpp). "dot" is kernels::dot's order (src/base/kernels.h, the
// library's definition): lane l (0..7) accumulates the terms c = l, l+8, ... in increasing c
// from +0 with one fused multiply-add each, acc_l = fma(a_c, b_c, acc_l), then
// ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)). Below, "sums a * b" means that: fma(a, b, acc) per
// term, one rounding (std::fma in the scalar definitions, vfmadd in the SIMD families).
//
// Element x_rc of a row (exact in fp32): a plain row's value (kF32, kF16); a code 0..2^bits-1
// (kU2, kU4: packed as packed_codes.h, code c at bit (c * bits) % 8 of byte (c * bits) / 8);
// an int8 (kQ8_0); a 4-bit code minus 8 (kQ4_0: ggml's nibble order, byte j of a 32-channel
// block holds channel j in its low nibble and channel j + 16 in its high one).
// A per-token row has, per group g of `group` channels (the last may be shorter), an fp16 scale
// s_rg and, asymmetric (kU2, kU4), an fp16 zero z_rg; its value is x * s + z (kU2, kU4) or
// x * s (kQ8_0, kQ4_0). Plain rows: one group of D channels, no scale.
#pragma once

#include <cstdint>

#include "base/cpu.h"

namespace vq::detail::attn {

// The kernel families (cpu::Isa; base/cpu.h): kAvx2 and kAvx2Vnni run the AVX2 kernels;
// kAvx512 and kAvx512Vnni the same 8-lane operations compiled for AVX-512 VL/BW/DQ (32 vector
// registers, EVEX forms): the same operations in the same order, so the same bits.
// kernels_for(isa) is the family whose kernels `isa` runs here (kScalar, kAvx2 or kAvx512).
constexpr cpu::Isa kernels_for(cpu::Isa isa) noexcept {
  return cpu::uses_avx512(isa)       ? cpu::Isa::kAvx512
         : isa == cpu::Isa::kScalar ? cpu::Isa::kScalar
                                     : cpu::Isa::kAvx2;
}

enum class Fmt { kF32, kF16, kU2, kU4, kQ8_0, kQ4_0 };

// n rows of one format. Row r's elements at data + r * row_bytes; its group parameters at
// scale[r * param_stride + g] (and zero[...] for kU2 / kU4), fp16 bits; positions[r] its
// position (a row is masked for a query at pos when positions[r] > pos).
struct RowSet {
  Fmt fmt = Fmt::kF16;
  const std::uint8_t* data = nullptr;
  std::int64_t row_bytes = 0;
  const std::uint16_t* scale = nullptr;
  const std::uint16_t* zero = nullptr;
  std::int64_t param_stride = 0;
  std::int64_t group = 0;  // channels per parameter group (plain rows: ignored)
  const std::int32_t* positions = nullptr;
  std::int64_t n = 0;
};

// Element x_rc of a row set (see the top of the file).
float element(const RowSet& rows, std::int64_t r, std::int64_t c) noexcept;

// Scores of n_q queries (q_j = q + j * D) over the rows of a per-token set:
//   out[j * ld + r] = -inf if positions[r] > pos, else
//   plain: dot(q_j, x_r);
//   grouped: acc_l = fma(s_rg, t_gl, acc_l) over groups g, in order, from +0, where t_gl sums
//   q_jc * x_rc (t = fma(q_jc, x_rc, t)) over the group's channels c with c % 8 == l, in
//   increasing c, from +0; the score is ((acc_0+acc_4)+(acc_2+acc_6)) +
//   ((acc_1+acc_5)+(acc_3+acc_7)), plus, asymmetric, zt = fma(z_rg, Q_jg, zt) over g, in order,
//   from +0, with Q_jg = kernels::sum of q_j over the group's channels (a plain sum).
void token_scores(cpu::Isa isa, const RowSet& rows, std::int64_t D, const float* q,
                  std::int64_t n_q, std::int64_t pos, float* out, std::int64_t ld) noexcept;

// Scores over a KIVI key group: rows sharing per-channel fp16 scale[c] and zero[c], codes kU2 or
// kU4 (fmt), param_stride and group unused. out[j * ld + r] = -inf if positions[r] > pos, else
// dot(qs_j, x_r) + dot(q_j, z) where qs_jc = q_jc * s_c (a plain product: the query folded into
// the scales once per group).
void channel_scores(cpu::Isa isa, const RowSet& rows, const std::uint16_t* scale,
                    const std::uint16_t* zero, std::int64_t D, const float* q, std::int64_t n_q,
                    std::int64_t pos, float* out, std::int64_t ld) noexcept;

// Weighted value sums, added into partial sums: for each row r with positions[r] <= pos, in
// increasing r, k = (first + r) mod 4 (first: the index of row 0 in the whole head), for each
// query j (p = probs[j * ld + r]) and group g:
//   A[(j * 4 + k) * D + c] = fma(w, x_rc, A[...]) for the group's channels c, w = p (plain) or
//   the plain product p * s_rg; asymmetric: Z[(j * 4 + k) * zs + g] = fma(p, z_rg, Z[...]) (zs:
//   Z's stride, >= the number of groups).
// A and Z are the caller's, +0 at the start of the head; finish_values turns them into outputs.
void token_values(cpu::Isa isa, const RowSet& rows, std::int64_t first, std::int64_t D,
                  const float* probs, std::int64_t n_q, std::int64_t ld, std::int64_t pos,
                  float* A, float* Z, std::int64_t zs) noexcept;

// out[j * D + c] = (A0 + A2) + (A1 + A3) for channel c, plus, with Z (not null),
// (Z0 + Z2) + (Z1 + Z3) of c's group (channels per group: `group`).
void finish_values(const float* A, const float* Z, std::int64_t zs, std::int64_t group,
                   std::int64_t n_q, std::int64_t D, float* out) noexcept;

}  // namespace vq::detail::attn
