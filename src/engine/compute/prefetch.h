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
//
// Into L2, not L1 (prefetcht1): two passes of R rows ahead is 2 * R * row_bytes bytes in
// flight, 32 KiB for four fp16 rows of 2048 values, the whole of Zen 4's L1, so prefetches into
// L1 were evicted before their use wherever rows are that long (llama-3.2-1b's every matrix,
// llama-110m's `down`: fp16 at 11-14 GB/s against 23-24 for the shorter rows). Into L2 the
// same kernels read 17-23 GB/s at every width (llama-3.2-1b's fp16 forward 2.0-2.5x faster,
// Q6_K 1.3x; nothing slower), the L1's own prefetchers bringing the lines on from L2.
#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace vq::engine {

// One prefetch per 64 bytes from p: the lines of [p, p + n) but, where the span does not start
// on a line, possibly its last one, which holds the next span's first byte and is fetched by
// that span. A prefetch never faults, so spans may run past the matrix's end.
inline void prefetch_span(const std::uint8_t* p, std::int64_t n) noexcept {
#if defined(__x86_64__) || defined(__i386__)
  for (std::int64_t o = 0; o < n; o += 64) _mm_prefetch(reinterpret_cast<const char*>(p + o), _MM_HINT_T1);
#else
  (void)p, (void)n;
#endif
}

}  // namespace vq::engine
