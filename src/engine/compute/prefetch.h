#pragma once
// Software prefetch of the weights' rows ahead of the matrix-vector kernels, in address order.
//
// The decode kernels read R rows side by side (R independent accumulator chains), so a thread
// reads R streams a row apart. Measured on an AMD EPYC (Zen 4, 2026-12-07; docs/own-models.md):
// prefetching the next-but-one R rows a line per row per step, interleaved as the kernels read
// them, leaves a cold-weight matvec at 7-11 GB/s; prefetching the same bytes as one stream in
// address order (the R rows ahead are contiguous: R * row_bytes bytes) reaches 15-20 GB/s, and
// the prefetch distance barely matters. Each kernel therefore walks the span of the R rows
// ahead in step with its own progress through its rows: after its k-th step of `step` bytes per
// row it has prefetched [ahead, ahead + R * k * step).
#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace vq::engine {

// One prefetch per 64-byte line of [p, p + n) (a line of a span starting mid-line is covered
// by the span before it). A prefetch never faults, so spans may run past the matrix's end.
inline void prefetch_span(const std::uint8_t* p, std::int64_t n) noexcept {
#if defined(__x86_64__) || defined(__i386__)
  for (std::int64_t o = 0; o < n; o += 64) _mm_prefetch(reinterpret_cast<const char*>(p + o), _MM_HINT_T0);
#else
  (void)p, (void)n;
#endif
}

}  // namespace vq::engine
