#include "eval/roofline/peaks.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>

#include "base/cpu.h"
#include "engine/compute/parallel.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define VQ_PEAKS_X86 1
#endif

namespace vq::eval {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// An arithmetic kernel: `iters` iterations of its loop; returns a value that depends on every
// accumulator, so no chain can be dropped.
using Kernel = double (*)(std::int64_t iters);

#ifdef VQ_PEAKS_X86

// The loops are written in assembly (GCC spills some accumulators of the intrinsic form to the
// stack): `chains` accumulators, each instruction depending only on its own accumulator's
// previous value, the two operands in registers, then a count-down branch. iters >= 1.
constexpr int kChainsYmm = 12;  // 12 accumulators + 2 operands of 16 ymm registers
constexpr int kChainsZmm = 24;  // 24 + 2 of 32 zmm registers

// The loops' text, written once. VQ_REGSn(L) is L(0) L(1) ... L(n - 1), a string literal per
// accumulator register. VQ_LOOP broadcasts a and b into registers R A and R B, zeroes every
// accumulator with VQ_Z(n), then per iteration runs VQ_OP(n) for each accumulator and counts
// down; the calling function defines VQ_Z and VQ_OP for its instructions.
#define VQ_REGS12(L) L(0) L(1) L(2) L(3) L(4) L(5) L(6) L(7) L(8) L(9) L(10) L(11)
#define VQ_REGS24(L) \
  VQ_REGS12(L) L(12) L(13) L(14) L(15) L(16) L(17) L(18) L(19) L(20) L(21) L(22) L(23)
#define VQ_CLOBBERS_YMM                                                                    \
  "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", \
      "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "cc"
#define VQ_CLOBBERS_ZMM                                                                         \
  "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",      \
      "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", \
      "xmm21", "xmm22", "xmm23", "xmm24", "xmm25", "xmm26", "xmm27", "xmm28", "xmm29", "xmm30", \
      "xmm31", "cc"
#define VQ_LOOP(BCAST, R, A, B, REGS, CLOBBERS) \
  __asm__ volatile(BCAST " %[a], %%" R #A "\n\t" BCAST " %[b], %%" R #B "\n\t" REGS(VQ_Z) \
                   "1:\n\t" REGS(VQ_OP) "dec %[n]\n\t"                                  \
                   "jnz 1b"                                                                 \
                   : [n] "+r"(iters)                                                        \
                   : [a] "m"(a), [b] "m"(b)                                                 \
                   : CLOBBERS)

// acc += a * b (0.999 * 0.001: far from overflow for any run, never subnormal).
__attribute__((target("avx2,fma"), noinline)) double fma_avx2(std::int64_t iters) {
  const float a = 0.999f, b = 1e-3f;
#define VQ_Z(n) "vxorps %%ymm" #n ", %%ymm" #n ", %%ymm" #n "\n\t"
#define VQ_OP(n) "vfmadd231ps %%ymm15, %%ymm14, %%ymm" #n "\n\t"
  VQ_LOOP("vbroadcastss", "ymm", 14, 15, VQ_REGS12, VQ_CLOBBERS_YMM);
#undef VQ_Z
#undef VQ_OP
  return 0.0;
}
// acc = acc * a, then acc += b: the separate multiply-add the kernels use today.
__attribute__((target("avx2"), noinline)) double muladd_avx2(std::int64_t iters) {
  const float a = 0.999f, b = 1e-3f;
#define VQ_Z(n) "vxorps %%ymm" #n ", %%ymm" #n ", %%ymm" #n "\n\t"
#define VQ_OP(n)                          \
  "vmulps %%ymm14, %%ymm" #n ", %%ymm" #n \
  "\n\t"                                  \
  "vaddps %%ymm15, %%ymm" #n ", %%ymm" #n "\n\t"
  VQ_LOOP("vbroadcastss", "ymm", 14, 15, VQ_REGS12, VQ_CLOBBERS_YMM);
#undef VQ_Z
#undef VQ_OP
  return 0.0;
}
// The same with 24 zmm chains.
__attribute__((target("avx512f"), noinline)) double fma_avx512(std::int64_t iters) {
  const float a = 0.999f, b = 1e-3f;
#define VQ_Z(n) "vpxord %%zmm" #n ", %%zmm" #n ", %%zmm" #n "\n\t"
#define VQ_OP(n) "vfmadd231ps %%zmm31, %%zmm30, %%zmm" #n "\n\t"
  VQ_LOOP("vbroadcastss", "zmm", 30, 31, VQ_REGS24, VQ_CLOBBERS_ZMM);
#undef VQ_Z
#undef VQ_OP
  return 0.0;
}
// acc += u8 a . s8 b per 4-byte group (int32 wraps: no trap, no effect on timing).
__attribute__((target("avx512f,avx512vnni"), noinline)) double vnni_avx512(std::int64_t iters) {
  const std::int32_t a = 3 * 0x01010101, b = -2 * 0x01010101;
#define VQ_Z(n) "vpxord %%zmm" #n ", %%zmm" #n ", %%zmm" #n "\n\t"
#define VQ_OP(n) "vpdpbusd %%zmm31, %%zmm30, %%zmm" #n "\n\t"
  VQ_LOOP("vpbroadcastd", "zmm", 30, 31, VQ_REGS24, VQ_CLOBBERS_ZMM);
#undef VQ_Z
#undef VQ_OP
  return 0.0;
}
// The VEX form (AVX-VNNI), 12 ymm chains.
__attribute__((target("avx2,avxvnni"), noinline)) double vnni_avx(std::int64_t iters) {
  const std::int32_t a = 3 * 0x01010101, b = -2 * 0x01010101;
#define VQ_Z(n) "vpxor %%ymm" #n ", %%ymm" #n ", %%ymm" #n "\n\t"
#define VQ_OP(n) "%{vex%} vpdpbusd %%ymm15, %%ymm14, %%ymm" #n "\n\t"
  VQ_LOOP("vpbroadcastd", "ymm", 14, 15, VQ_REGS12, VQ_CLOBBERS_YMM);
#undef VQ_Z
#undef VQ_OP
  return 0.0;
}
// acc += a . b over bf16 pairs (2^-7 each: the sums stay far from overflow).
__attribute__((target("avx512f,avx512bf16"), noinline)) double bf16_avx512(std::int64_t iters) {
  const std::int32_t a = 0x3C003C00, b = 0x3C003C00;
#define VQ_Z(n) "vpxord %%zmm" #n ", %%zmm" #n ", %%zmm" #n "\n\t"
#define VQ_OP(n) "vdpbf16ps %%zmm31, %%zmm30, %%zmm" #n "\n\t"
  VQ_LOOP("vpbroadcastd", "zmm", 30, 31, VQ_REGS24, VQ_CLOBBERS_ZMM);
#undef VQ_Z
#undef VQ_OP
  return 0.0;
}

// AMX: tiles 0-3 accumulate (16 rows x 16 int32/fp32), 4-5 hold A and 6-7 B (16 rows x 64 bytes),
// loaded once from zeros; each iteration runs four tile products, every accumulator its own chain.
struct alignas(64) TileConfig {
  std::uint8_t palette = 1, start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};

__attribute__((target("amx-tile"))) void amx_begin(const TileConfig& cfg, const void* src) {
  __asm__ volatile("ldtilecfg %0" ::"m"(cfg));
  const std::int64_t stride = 64;
  __asm__ volatile(
      "tileloadd (%0,%1,1), %%tmm4\n\t"
      "tileloadd (%0,%1,1), %%tmm5\n\t"
      "tileloadd (%0,%1,1), %%tmm6\n\t"
      "tileloadd (%0,%1,1), %%tmm7\n\t"
      "tilezero %%tmm0\n\t"
      "tilezero %%tmm1\n\t"
      "tilezero %%tmm2\n\t"
      "tilezero %%tmm3" ::"r"(src),
      "r"(stride)
      : "memory");
}

TileConfig amx_config() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  return cfg;
}

__attribute__((target("amx-tile,amx-int8"), noinline)) double amx_int8(std::int64_t iters) {
  alignas(64) static const std::uint8_t zeros[16 * 64] = {};
  const TileConfig cfg = amx_config();
  amx_begin(cfg, zeros);
  for (std::int64_t i = 0; i < iters; ++i) {
    __asm__ volatile(
        "tdpbssd %%tmm6, %%tmm4, %%tmm0\n\t"
        "tdpbssd %%tmm7, %%tmm4, %%tmm1\n\t"
        "tdpbssd %%tmm6, %%tmm5, %%tmm2\n\t"
        "tdpbssd %%tmm7, %%tmm5, %%tmm3" ::);
  }
  __asm__ volatile("tilerelease" ::);
  return 0.0;
}

__attribute__((target("amx-tile,amx-bf16"), noinline)) double amx_bf16(std::int64_t iters) {
  alignas(64) static const std::uint8_t zeros[16 * 64] = {};
  const TileConfig cfg = amx_config();
  amx_begin(cfg, zeros);
  for (std::int64_t i = 0; i < iters; ++i) {
    __asm__ volatile(
        "tdpbf16ps %%tmm6, %%tmm4, %%tmm0\n\t"
        "tdpbf16ps %%tmm7, %%tmm4, %%tmm1\n\t"
        "tdpbf16ps %%tmm6, %%tmm5, %%tmm2\n\t"
        "tdpbf16ps %%tmm7, %%tmm5, %%tmm3" ::);
  }
  __asm__ volatile("tilerelease" ::);
  return 0.0;
}

__attribute__((target("avx2"))) std::uint64_t sum_words_avx2(const std::uint64_t* p,
                                                             std::int64_t n) noexcept {
  __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_add_epi64(s0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
    s1 = _mm256_add_epi64(s1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 4)));
    s2 = _mm256_add_epi64(s2, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 8)));
    s3 = _mm256_add_epi64(s3, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 12)));
  }
  const __m256i s = _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3));
  alignas(32) std::uint64_t out[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), s);
  std::uint64_t total = out[0] + out[1] + out[2] + out[3];
  for (; i < n; ++i) total += p[i];
  return total;
}

#endif  // VQ_PEAKS_X86

std::uint64_t sum_words(const std::uint64_t* p, std::int64_t n) noexcept {
#ifdef VQ_PEAKS_X86
  if (cpu::features().avx2) return sum_words_avx2(p, n);
#endif
  std::uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  std::int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += p[i];
    s1 += p[i + 1];
    s2 += p[i + 2];
    s3 += p[i + 3];
  }
  for (; i < n; ++i) s0 += p[i];
  return s0 + s1 + s2 + s3;
}

volatile double g_sink = 0;  // keeps every kernel's result observable

// Wall time of `threads` threads each running kernel(iters).
double time_kernel(Kernel kernel, std::int64_t iters, int threads) {
  std::vector<double> result(static_cast<std::size_t>(threads), 0.0);
  const auto t0 = Clock::now();
  engine::parallel_for(threads, threads, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t t = b; t < e; ++t) result[static_cast<std::size_t>(t)] = kernel(iters);
  });
  const double secs = seconds_since(t0);
  for (const double r : result) g_sink = g_sink + r;
  return secs;
}

// Rate (ops per second) of `kernel` doing `ops_per_iter` per iteration, per thread count.
std::map<int, double> measure_kernel(Kernel kernel, double ops_per_iter, const PeakOptions& o) {
  // Calibrate on one thread: grow the loop until a run lasts a quarter of the target, then scale.
  std::int64_t iters = 1 << 10;
  double t = time_kernel(kernel, iters, 1);
  while (t < o.target_seconds / 4 && iters < (std::int64_t{1} << 40)) {
    iters *= 4;
    t = time_kernel(kernel, iters, 1);
  }
  if (t > 0) {
    iters = std::max<std::int64_t>(
        1, static_cast<std::int64_t>(static_cast<double>(iters) * o.target_seconds / t));
  }
  std::map<int, double> rates;
  for (const int threads : o.threads) {
    (void)time_kernel(kernel, iters, threads);  // untimed: wakes the threads
    double best = 0;
    for (int r = 0; r < o.repeats; ++r) {
      const double secs = time_kernel(kernel, iters, threads);
      best = std::max(best, ops_per_iter * static_cast<double>(iters) * threads / secs);
    }
    rates[threads] = best;
  }
  return rates;
}

std::map<int, double> measure_bandwidth(const PeakOptions& o) {
  const std::int64_t n = o.bandwidth_bytes / 8;
  const int max_threads = *std::max_element(o.threads.begin(), o.threads.end());
  std::unique_ptr<std::uint64_t[]> buf(new std::uint64_t[static_cast<std::size_t>(n)]);
  // First touch by the threads that will read it (pages placed near them).
  engine::parallel_for(n, max_threads, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i)
      buf[static_cast<std::size_t>(i)] = static_cast<std::uint64_t>(i);
  });
  std::map<int, double> rates;
  std::uint64_t sink = 0;
  for (const int threads : o.threads) {
    std::vector<std::uint64_t> part(static_cast<std::size_t>(threads), 0);
    double best = 0;
    for (int r = 0; r <= o.repeats; ++r) {  // the first pass is untimed
      const auto t0 = Clock::now();
      engine::parallel_for(threads, threads, [&](std::int64_t b, std::int64_t e) {
        for (std::int64_t t = b; t < e; ++t) {
          const std::int64_t lo = n * t / threads, hi = n * (t + 1) / threads;
          part[static_cast<std::size_t>(t)] = sum_words(buf.get() + lo, hi - lo);
        }
      });
      const double secs = seconds_since(t0);
      for (const std::uint64_t s : part) sink += s;
      if (r > 0) best = std::max(best, static_cast<double>(n * 8) / secs);
    }
    rates[threads] = best / 1e9;
  }
  g_sink = g_sink + static_cast<double>(sink & 1);
  return rates;
}

}  // namespace

std::vector<std::string> cpu_feature_names() {
  const cpu::Features& f = cpu::features();
  std::vector<std::string> names;
  const auto add = [&](bool on, const char* name) {
    if (on) names.emplace_back(name);
  };
  add(f.avx2, "avx2+fma+f16c");
  add(f.fma, "fma");
  add(f.avx_vnni, "avx_vnni");
  add(f.avx512, "avx512f+bw+vl+dq");
  add(f.avx512_vnni, "avx512_vnni");
  add(f.avx512_vbmi, "avx512_vbmi");
  add(f.avx512_bf16, "avx512_bf16");
  if (f.amx_tile) {
    names.emplace_back(cpu::amx_usable() ? "amx_tile (OS grants tiles)"
                                         : "amx_tile (OS refuses tiles)");
  }
  add(f.amx_int8, "amx_int8");
  add(f.amx_bf16, "amx_bf16");
  return names;
}

std::vector<Peak> measure_peaks(const PeakOptions& o) {
  const cpu::Features& f = cpu::features();
  std::vector<Peak> peaks;
  const auto arith = [&](const char* name, const char* unit, const char* instruction, bool have,
                         const char* missing, Kernel kernel, double ops_per_iter) {
    Peak p{name, unit, instruction, have, have ? "" : missing, {}};
    if (have && kernel != nullptr) p.per_threads = measure_kernel(kernel, ops_per_iter, o);
    if (kernel == nullptr) {
      p.available = false;
      p.note = "not an x86-64 build";
    }
    peaks.push_back(std::move(p));
  };
#ifdef VQ_PEAKS_X86
  const bool amx = cpu::amx_usable();
  const char* no_amx = !f.amx_tile ? "not available: the CPU has no AMX"
                                   : "not available: the OS did not grant the AMX tile state";
  arith("fma_avx2", "GFLOP/s", "vfmadd231ps ymm, 12 chains", f.avx2 && f.fma,
        "not available: the CPU (or OS) lacks AVX2 with FMA", fma_avx2, kChainsYmm * 8 * 2 / 1e9);
  arith("fma_avx512", "GFLOP/s", "vfmadd231ps zmm, 24 chains", f.avx512,
        "not available: the CPU (or OS) lacks AVX-512", fma_avx512, kChainsZmm * 16 * 2 / 1e9);
  arith("muladd_avx2", "GFLOP/s", "vmulps + vaddps ymm, 12 chains", f.avx2,
        "not available: the CPU (or OS) lacks AVX2", muladd_avx2, kChainsYmm * 8 * 2 / 1e9);
  arith("vnni_avx512", "GOP/s", "vpdpbusd zmm, 24 chains", f.avx512_vnni,
        "not available: the CPU has no AVX512_VNNI", vnni_avx512, kChainsZmm * 64 * 2 / 1e9);
  arith("vnni_avx", "GOP/s", "vpdpbusd ymm (AVX-VNNI), 12 chains", f.avx_vnni,
        "not available: the CPU has no AVX-VNNI", vnni_avx, kChainsYmm * 32 * 2 / 1e9);
  arith("bf16_avx512", "GFLOP/s", "vdpbf16ps zmm, 24 chains", f.avx512_bf16,
        "not available: the CPU has no AVX512_BF16", bf16_avx512, kChainsZmm * 32 * 2 / 1e9);
  arith("amx_int8", "GOP/s", "tdpbssd, 4 tile chains", amx && f.amx_int8, no_amx, amx_int8,
        4.0 * 16 * 16 * 64 * 2 / 1e9);
  arith("amx_bf16", "GFLOP/s", "tdpbf16ps, 4 tile chains", amx && f.amx_bf16, no_amx, amx_bf16,
        4.0 * 16 * 16 * 32 * 2 / 1e9);
#else
  (void)f;
  for (const char* name : {"fma_avx2", "fma_avx512", "muladd_avx2", "vnni_avx512", "vnni_avx",
                           "bf16_avx512", "amx_int8", "amx_bf16"}) {
    arith(name, "", "", false, "", nullptr, 0);
  }
#endif
  Peak bw{"read_bw", "GB/s", "streaming sum of 64-bit words", true, "", {}};
  bw.note = std::to_string(o.bandwidth_bytes >> 20) + " MiB buffer, each thread its own part";
  bw.per_threads = measure_bandwidth(o);
  peaks.push_back(std::move(bw));
  return peaks;
}

}  // namespace vq::eval
