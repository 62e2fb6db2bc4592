// Products of GGUF block-quantized weights (Q4_0, Q4_1, Q5_0, Q5_1 and the K-quants Q2_K, Q3_K,
// Q4_K, Q5_K, Q6_K; engine/weights.h, layouts in engine/quants.h) with activations quantized the
// way llama.cpp's CPU backend quantizes them for each type: Q8_0 blocks for Q4_0/Q5_0, Q8_1 for
// Q4_1/Q5_1, Q8_K for the K-quants. The weights stay in their stored blocks (read in place from
// the file's mapping); nothing is widened at load. (Q8_0 weights: engine/matmul.h.)
//
// Activations (one row of n values):
//   Q8_0  per block of 32: d = fp16(amax / 127), q = round-half-even(x * (127 / amax)); as
//         matmul.h's quantize_activations_q8_0 (llama.cpp's x86 quantize_row_q8_0).
//   Q8_1  Q8_0's d and q, plus s = fp16(amax / 127 * sum(q)) (the unrounded d, as llama.cpp).
//   Q8_K  per block of 256: m = the first value of largest |x|, iscale = -127 / m,
//         q = min(127, round-half-even(iscale * x)), d = 1 / iscale (fp32), bsums[g] = the sum of
//         the 16 codes of group g; amax = 0 gives d = 0 and q = 0 (ggml's quantize_row_q8_K_ref,
//         which llama.cpp's x86 backend uses).
// A block holding a NaN or an infinity gets d = NaN (and s = NaN), q = 0, bsums = 0, so every
// output it enters is NaN.
//
// The product, the scalar definition (every family equals it bit for bit; only the exact integer
// sums are formed differently):
//   A weight block is decoded to integer codes c[] with its scales:
//     Q4_0  c = nibble - 8          Q5_0  c = 5-bit value - 16     (no min)
//     Q4_1  c = nibble, min m        Q5_1  c = 5-bit value, min m
//     K     c = the stored value (Q3_K: minus 4 where the high bit is clear; Q6_K: minus 32),
//           per 16-group g an integer scale sc[g] and (Q2_K, Q4_K, Q5_K) an integer min mn[g]
//           (Q4_K/Q5_K's 32-value sub-block scale for both of its groups; Q3_K's scale minus 32).
//   Legacy block b (32 values) with activation block b: isum = sum_j c_j * q_j (exact int32);
//     v = float(isum) * (d_w * d_x)                          (Q4_0, Q5_0)
//     v = float(isum) * (d_w * d_x) + m_w * s_x              (Q4_1, Q5_1)
//   K super-block b (256 values): sumi = sum_g sc[g] * (sum_{j in g} c_j * q_j) and
//     summ = sum_g mn[g] * bsums[g], both exact int32;
//     v = (d_w * d_x) * float(sumi) - (dmin_w * d_x) * float(summ)   (Q2_K, Q4_K, Q5_K)
//     v = (d_w * d_x) * float(sumi)                                  (Q3_K, Q6_K)
//   out = tree(acc) where acc[l] (l < 8, from +0) adds the v of blocks b = l, l + 8, ... in
//   increasing b and tree is ops::dot's ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)). Each fp32
//   operation rounds once (the build uses -ffp-contract=off).
// The AVX2 family decodes the blocks and forms the integer sums with SIMD instructions (exact:
// no sum can overflow its lane, see block_matmul.cpp) and runs the same scalar fp32 code, so it
// gives the scalar definition's bits (the legacy types' AVX2 kernel takes eight blocks at a time
// into eight vector lanes, lane l = block b % 8, the same additions). Every weight block is
// decoded once per row and group of tokens and reused across them: up to four tokens with rows
// outermost for S = 1 and PrefillKernels::kRows (engine/matmul.h); prefill tiles of up to 16
// tokens outermost otherwise (their activation blocks stay in L1 while the rows pass), where
// the AVX2 K-quant kernel also takes eight tokens into eight vector lanes (token u's integer
// sums reduced into lane u, then k_value's fp32 operations lane by lane: the same operations
// per token), and the AVX2 legacy kernel packs eight blocks' codes (of four rows, and of the
// tokens' activations alike) so that lane l of a four-byte dot belongs to block l and the blocks'
// exact sums need no reduction (as engine/matmul.h's Q8_0 tiles). kAvx2Vnni runs the AVX2
// kernels here, except that its K-quant prefill kernel accumulates the scaled pair sums with
// vpdpwssd (the same exact int32 sums).
#pragma once

#include <cstdint>

#include "engine/compute/matmul.h"
#include "engine/compute/weights.h"

namespace vq::engine {

enum class ActType : std::uint8_t { kQ8_0, kQ8_1, kQ8_K };
const char* to_string(ActType a) noexcept;
// The activation type of a block weight type (Q8_0 weights: kQ8_0).
ActType activation_type(WeightType w) noexcept;
// Values per activation block: 32 (Q8_0, Q8_1) or 256 (Q8_K).
inline std::int64_t act_block_size(ActType a) noexcept { return a == ActType::kQ8_K ? 256 : 32; }

// Quantized activations of S rows of `cols` values (cols a multiple of the block size), as
// produced by quantize_activations below; row s starts at q + s * cols, d + s * cols / B, ...
struct BlockActs {
  ActType type = ActType::kQ8_0;
  std::int64_t cols = 0;
  const std::int8_t* q = nullptr;        // [S][cols] codes
  const float* d = nullptr;              // [S][cols / B] scales (fp32; Q8_0/Q8_1: fp16 values)
  const float* s = nullptr;              // Q8_1: [S][cols / 32] d * sum(q) (fp16 values)
  const std::int16_t* bsums = nullptr;   // Q8_K: [S][cols / 16] sums of 16 codes (must be
                                         // q's: kAvx512Vnni's Q6_K kernel relies on them)
};

// One row: x[n] -> the codes and scales above (n a multiple of the block size). s may be null
// for Q8_0; bsums is used only for Q8_K.
void quantize_activations_q8_1(const float* x, std::int64_t n, std::int8_t* q, float* d,
                               float* s) noexcept;
void quantize_activations_q8_k(const float* x, std::int64_t n, std::int8_t* q, float* d,
                               std::int16_t* bsums) noexcept;

// Rows [row_begin, row_end) of out[s][i] for s < S (out row stride w.rows), one thread, with
// the given kernel family; w is a block type other than Q8_0 and a.type its activation_type.
void matmul_rows_blocks(cpu::Isa isa, float* out, const BlockActs& a, const WeightMatrix& w,
                        std::int64_t S, std::int64_t row_begin, std::int64_t row_end) noexcept;

// For matmul.cpp: rows [row_begin, row_end) of the Q8_0 x Q8_0 product (engine/matmul.h's
// definition) of one token with the kAvx512Vnni family's kernel (block_matvec_avx512.inc); false,
// with nothing written, where it has none (no AVX-512 build, rows of more than 131,072 values).
bool matvec_q8_0_avx512(float* out, const std::int8_t* xq, const float* xd, const WeightMatrix& w,
                        std::int64_t row_begin, std::int64_t row_end) noexcept;

// For matmul.cpp: rows [row_begin, row_end) of the Q8_0 x Q8_0 product over S > 1 tokens with
// the AVX-512 VNNI prefill tiles (block_prefill_avx512.inc), where the family `isa` takes them
// (as for Q4_0, below); false, with nothing written, where it does not.
bool prefill_q8_0_avx512(cpu::Isa isa, float* out, const std::int8_t* xq, const float* xd,
                         const WeightMatrix& w, std::int64_t S, std::int64_t row_begin,
                         std::int64_t row_end) noexcept;

// AVX-512 VNNI prefill tiles (block_prefill_avx512.inc) for Q4_0, Q8_0 (x Q8_0) and the
// K-quants: a product over S > 1 tokens with PrefillKernels::kTiles runs them in the kAvx512Vnni
// family, and in the kAvx2Vnni family where cpu::avx512_prefill_supported(), when they are
// switched on (the default); rows wider than 16384 values keep the AVX2 tiles. They give the
// scalar definition's bits like every family. set_avx512_prefill(false) keeps the AVX2 tiles
// (for tests and benchmarks comparing them in one process); process-wide, like
// set_prefill_kernels, not to be changed while a matmul runs. avx512_prefill() is whether they
// are on and some family of this CPU has them.
void set_avx512_prefill(bool on) noexcept;
bool avx512_prefill() noexcept;

// For tests: block b of row `row` of w decoded to its integer codes and scales as the family
// `isa` decodes it, in a fixed layout: codes[256] (the first 32 for legacy types), sc[16] and
// mn[16] (legacy: unused, 0), d, dmin (legacy: m). Equal across families (tested).
struct DecodedBlock {
  alignas(32) std::int8_t codes[256];
  std::int32_t sc[16];
  std::int32_t mn[16];
  float d, dmin;
};
void decode_block(cpu::Isa isa, const WeightMatrix& w, std::int64_t row, std::int64_t block,
                  DecodedBlock* out) noexcept;

}  // namespace vq::engine
