// Matrix-vector products against typed weight matrices (engine/weights.h), threaded over
// output rows.
//
// Definition (every path, every type, every thread count): out[s][i] = ops::dot(row_i, x[s],
// cols), where row_i is row i converted to fp32 exactly (engine/weights.h). ops::dot's order is
// the library's fixed one: lane l of 8 sums the products j = l, l+8, ... in increasing j, then
// ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)). SIMD paths keep that order lane for lane (the build
// uses -ffp-contract=off and no fast-math), so they equal the scalar definition bit for bit;
// threads split the output rows, each element is computed by one thread with the same code, so
// the result does not depend on the thread count either.
#pragma once

#include <cstdint>

#include "engine/weights.h"

namespace vq::engine {

// The kernel families. kAvx2 needs AVX2 and F16C (checked at run time).
enum class Isa { kScalar, kAvx2 };
const char* to_string(Isa isa) noexcept;
// The best family this CPU supports (cached after the first call).
Isa best_isa() noexcept;
bool isa_supported(Isa isa) noexcept;

// Rows [row_begin, row_end) of out[s][i] for s < S, one thread, with the given kernel family:
// x is [S][w.cols], out is [S][w.rows] (row stride w.rows). For tests and benchmarks.
void matmul_rows(Isa isa, float* out, const float* x, const WeightMatrix& w, std::int64_t S,
                 std::int64_t row_begin, std::int64_t row_end) noexcept;

// out[S][w.rows] = x[S][w.cols] W^T with the best kernel family, rows split over the engine's
// threads (engine/parallel.h).
void matmul(float* out, const float* x, const WeightMatrix& w, std::int64_t S) noexcept;

}  // namespace vq::engine
