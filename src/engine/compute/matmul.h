// Matrix-vector products against typed weight matrices (engine/weights.h), threaded over
// output rows. The GGUF block types other than Q8_0 (Q4_0 .. Q6_K) always read quantized
// activations (Q8_0 / Q8_1 / Q8_K as llama.cpp does; definition and kernels in
// engine/block_matmul.h); matmul() and matmul_fused() quantize x once per call for each
// activation type the matrices need. matmul_rows() on such a matrix computes the fp32-activation
// product over its dequantized rows (ggml's values), for tests.
//
// fp32 activations (F32/F16/BF16 weights always; Q8_0 weights when asked, see
// Q8_0Activations): out[s][i] = dot(row_i, x[s], cols), where row_i is row i converted to fp32
// exactly (engine/weights.h) and dot is the library's fused multiply-add definition: lane l
// (l = 0..7) holds acc_l, +0 at the start; for j = l, l+8, ... in increasing j,
// acc_l = fma(w_j, x_j, acc_l) with one rounding (std::fma in the scalar reference, vfmadd in the
// vector kernels); then ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)). The build keeps
// -ffp-contract=off (and no fast-math): a multiply-add is fused only where the code writes it.
// SIMD paths keep that order lane for lane, so they equal the scalar definition bit for bit;
// threads split the output rows (never K), each element is computed by one thread, so the result
// does not depend on the thread count either. For S > 1 (prefill, batched decode) the AVX2
// kernels compute tiles of 3 rows x 4 tokens (PrefillKernels below), each (row, token) pair with
// its own 8 lanes; the AVX-512 families run a packed GEMM (matmul_gemm_avx512.inc): blocks of
// weight rows converted to fp32 once for all S tokens, tokens packed in pairs, micro-kernels of
// 4 rows x up to 12 tokens in zmm registers that each hold two (row, token) pairs' 8 lanes, K
// blocked with the lanes carried between blocks exactly; up to 12 tokens read the weights
// straight from the matrix instead. The same operations per element, in the same order.
// The other block types with fp32 activations (matmul_rows only) dequantize a block, then the
// same fused order.
//
// Q8_0 weights with Q8_0 activations (the default, as llama.cpp's CPU backend computes them):
// each activation row x[s] is first quantized to Q8_0 blocks (quantize_activations_q8_0), then
// out[s][i] = tree(lane[0..7]) where lane[l] sums, over the row's blocks b = l, l+8, ... in
// increasing b, float(isum_b) * (d_w[b] * d_x[b]): isum_b = sum_j q_w[32b+j] * q_x[32b+j] is an
// exact int32, d_w * d_x an exact fp32 product of two fp16 values, and the one rounding is the
// multiplication, then the lane's addition; tree() is the fp32 definition's ((l0+l4)+(l2+l6)) +
// ((l1+l5)+(l3+l7)). The AVX2 kernel (maddubs/madd integer dots, eight blocks' sums reduced to
// one vector) keeps that order lane for lane and equals the scalar definition bit for bit; the
// AVX-VNNI kernel is the same code with each block's integer dot formed by vpdpbusd (the sums
// are exact either way), so it gives the same bits. For S > 1 both compute tiles of 4 rows x 4
// tokens over weights and activations packed eight blocks at a time, so that the integer dots'
// lane l is block l's exact sum (no reduction), then the same fp32 steps lane for lane
// (matmul.cpp, matmul_q8q8_x86.inc). Where the AVX-512 VNNI prefill tiles run (kAvx512Vnni, and
// kAvx2Vnni on a CPU with AVX-512 VNNI; engine/block_matmul.h set_avx512_prefill), S > 1 takes
// them instead: Q4_0's tiles with the weights' codes + 128 as unsigned bytes, two rows per zmm,
// vpdpbusd, then 128 * the activations' block sum subtracted (exact), the same fp32 steps.
#pragma once

#include <cstdint>
#include <span>

#include "base/cpu.h"
#include "engine/compute/weights.h"

namespace vq::engine {

// The kernel families (cpu::Isa) and which kernels each runs here: base/cpu.h. In short,
// kAvx2Vnni differs from kAvx2 only in the Q8_0 x Q8_0 block dots (vpdpbusd); kAvx512Vnni has
// its own matrix-vector kernels (S = 1, decode) for Q4_0 and Q8_0 x Q8_0 and Q4_K/Q5_K/Q6_K x
// Q8_K (engine/block_matvec_avx512.inc); kAvx512, and kAvx512Vnni elsewhere, run
// cpu::avx512_base()'s kernels.

// Rows [row_begin, row_end) of out[s][i] for s < S, one thread, with the given kernel family:
// x is [S][w.cols], out is [S][w.rows] (row stride w.rows). For tests and benchmarks.
void matmul_rows(cpu::Isa isa, float* out, const float* x, const WeightMatrix& w, std::int64_t S,
                 std::int64_t row_begin, std::int64_t row_end) noexcept;

// Activations quantized for Q8_0 weights as llama.cpp's CPU backend does on x86 (ggml-cpu's
// quantize_row_q8_0, AVX path): per block of 32, amax = max_j |x_j|, d = fp16(amax / 127),
// q_j = round-half-to-even(x_j * (127 / amax)) in [-127, 127], all 0 when amax = 0. A block
// holding a NaN or an infinity gets d = NaN and q = 0, so every output it enters is NaN.
// x[n] -> q[n] codes, d[n / 32] scales as fp32 (exactly the fp16 value); n a multiple of 32.
void quantize_activations_q8_0(const float* x, std::int64_t n, std::int8_t* q, float* d) noexcept;

// Rows [row_begin, row_end) of the Q8_0 x Q8_0 product (definition above), one thread: w is
// Q8_0, xq is [S][w.cols] codes and xd [S][w.cols / 32] scales from quantize_activations_q8_0;
// out is [S][w.rows]. For tests and benchmarks.
void matmul_rows_q8_0(cpu::Isa isa, float* out, const std::int8_t* xq, const float* xd,
                      const WeightMatrix& w, std::int64_t S, std::int64_t row_begin,
                      std::int64_t row_end) noexcept;

// What matmul() does with the activations of Q8_0 weights: kQ8_0 (default) quantizes them to
// Q8_0 blocks (8 bits per value per 32-block, as llama.cpp does; faster than kF32: integer
// block dots, no per-weight conversion); kF32 keeps them fp32 (matmul_rows's definition: only the
// weights are rounded). Process-wide, like set_threads; not to be changed while a matmul runs.
enum class Q8_0Activations : std::uint8_t { kQ8_0, kF32 };
const char* to_string(Q8_0Activations a) noexcept;
void set_q8_0_activations(Q8_0Activations a) noexcept;
Q8_0Activations q8_0_activations() noexcept;

// The kernels of a product over S > 1 tokens (prefill): kTiles (default) computes tiles of
// several rows x several tokens, each weight chunk or block loaded and decoded once for the
// tile's tokens (matrix-matrix products); kRows computes each row's tokens one matrix-vector
// product after another (the row kernels, as decode does). Both compute every element with
// the definition's operations in its order, so they give the same bits; the switch exists for
// benchmarks comparing them in one process. Process-wide, like set_q8_0_activations; not to be
// changed while a matmul runs. S = 1 (decode) always runs the row kernels.
enum class PrefillKernels : std::uint8_t { kTiles, kRows };
void set_prefill_kernels(PrefillKernels k) noexcept;
PrefillKernels prefill_kernels() noexcept;

// out[S][w.rows] = x[S][w.cols] W^T with the best kernel family, rows split over the engine's
// threads (engine/parallel.h). Q8_0 weights with Q8_0 activations quantize x once per call into
// a per-thread scratch that grows to the largest S * w.cols seen and is then reused (no
// allocation per token once the first forward has run; growing it may throw std::bad_alloc).
void matmul(float* out, const float* x, const WeightMatrix& w, std::int64_t S);

// One product of a fused call: out[S][w->rows] = x[S][w->cols] w^T.
struct MatmulOut {
  float* out;
  const WeightMatrix* w;
};

// Several products of the same input in one parallel loop (one barrier instead of one per
// matrix): the matrices' 16-row units are numbered in order and split over the threads as one
// range, and every output element is computed by one thread with matmul_rows's (or, for Q8_0
// weights with Q8_0 activations, matmul_rows_q8_0's) code, so each out equals matmul(out, x, *w,
// S) bit for bit for every thread count. x is quantized once for all Q8_0 matrices. 1 to 8
// products (throws Error(kInvalidArgument) otherwise), all with the same cols; the outs must
// not overlap each other or x. matmul() is the one-product case.
void matmul_fused(std::span<const MatmulOut> outs, const float* x, std::int64_t S);

}  // namespace vq::engine
