// The one place that knows the CPU: what it can run (asked once, at run time, of the CPU with
// CPUID and of the OS with XGETBV; never taken from the compiler's flags, so a build for one CPU
// runs on another), the kernel families built on that, and which family each kernel area runs.
//
// A kernel family is a set of instructions a kernel may use. Every family computes every
// result bit for bit as the scalar definition does (each kernel's header says how), so the
// family only changes speed; tests run each supported family against the scalar one.
//
//   family       needs (CPU and OS)                      string
//   kScalar      nothing                                 scalar
//   kAvx2        AVX2, FMA3, F16C (OS saves ymm)         avx2+fma+f16c
//   kAvx2Vnni    kAvx2 and AVX-VNNI (vpdpbusd on ymm)    avx2+fma+f16c+avxvnni
//   kAvx512      kAvx2 and AVX-512 F/BW/VL/DQ (OS saves  avx512vl+bw+dq
//                zmm and opmask state)
//   kAvx512Vnni  kAvx512 and AVX-512 VNNI and VBMI       avx512vnni+vbmi
//
// Which kernels each area runs for a family (an area with no kernels of its own for a family
// runs the kernels named here; every kernel of the table is bit-identical to the scalar one):
//
//   family       matmul fp32 input (matmul.h)   Q8_0 / block weights (matmul.h,       packed attention
//                                               block_matmul.h)                        (packed_attention.h)
//   kScalar      scalar                         scalar                                 scalar
//   kAvx2        avx2                           avx2                                   avx2
//   kAvx2Vnni    avx2                           avx2, its dots by vpdpbusd; prefill    avx2
//                                               tiles of AVX-512 VNNI where
//                                               avx512_prefill_supported()
//   kAvx512      S = 1: avx512_base()'s;        avx512_base()'s                        avx512
//                S > 1: the AVX-512 packed GEMM
//   kAvx512Vnni  as kAvx512                     its own for one token (Q4_0, Q8_0,     avx512
//                                               Q4_K, Q5_K, Q6_K); prefill tiles of
//                                               AVX-512 VNNI (Q8_0, Q4_0, K-quants);
//                                               else avx512_base()'s
//
// best_isa() is the family every area runs in the library's own calls: the first supported of
// kAvx512Vnni, kAvx512, kAvx2Vnni, kAvx2, kScalar (fixed for the process, so no result depends
// on a thread or a call). Kernels built only when the compiler targets an instruction set
// (base/kernels.cpp, engine/compute/ops.cpp, store/packed_codes.h: #ifdef __AVX2__) follow the
// build's -march instead; they too equal their scalar code bit for bit.
#pragma once

#include <cstdint>

namespace vq::cpu {

// What the CPU and the OS report, read once (CPUID leaves 1, 7.0 and 7.1; XCR0 by XGETBV).
// All false off x86.
struct Features {
  bool avx2 = false;         // AVX2, FMA3 and F16C, with the OS saving the ymm state
  bool avx_vnni = false;     // AVX-VNNI (VEX vpdpbusd): CPUID.(7,1):EAX bit 4
  bool avx512 = false;       // AVX-512 F, BW, VL, DQ, with the OS saving the zmm and opmask state
  bool avx512_vnni = false;  // AVX512_VNNI: CPUID.(7,0):ECX bit 11
  bool avx512_vbmi = false;  // AVX512_VBMI: CPUID.(7,0):ECX bit 1
  bool fma = false;          // FMA3: CPUID.1:ECX bit 12, with the OS saving the ymm state
  // Reported for measurements (bench kernels); no kernel family uses them yet.
  bool avx512_bf16 = false;  // AVX512_BF16 (vdpbf16ps): CPUID.(7,1):EAX bit 5, with kAvx512's state
  bool amx_tile = false;     // AMX-TILE: CPUID.(7,0):EDX bit 24 (the CPU's word; the OS grants the
  bool amx_int8 = false;     // tile state per process: amx_usable()); AMX-INT8: EDX bit 25;
  bool amx_bf16 = false;     // AMX-BF16: EDX bit 22
};
const Features& features() noexcept;

enum class Isa : std::uint8_t { kScalar, kAvx2, kAvx2Vnni, kAvx512, kAvx512Vnni };
const char* to_string(Isa isa) noexcept;

// Whether this CPU (and OS) runs `isa` (the table above).
bool isa_supported(Isa isa) noexcept;
// The family the library's kernels run here (see above; cached after the first call).
Isa best_isa() noexcept;
// The family an AVX-512 family runs where it has no kernels of its own: kAvx2Vnni where the CPU
// has AVX-VNNI, else kAvx2 (cached).
Isa avx512_base() noexcept;

// Whether AMX tiles may run in this process: the CPU has AMX-TILE and the OS, asked once (Linux:
// arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA)), grants the tile data state and saves it (XCR0
// bits 17 and 18). False off Linux/x86, on a CPU without AMX, or when the request is refused.
bool amx_usable() noexcept;

// Whether a family's kernels may use AVX-512 instructions (kAvx512, kAvx512Vnni).
constexpr bool uses_avx512(Isa isa) noexcept {
  return isa == Isa::kAvx512 || isa == Isa::kAvx512Vnni;
}

// Whether the kAvx2Vnni family's block prefill tiles of AVX-512 VNNI (engine/compute/
// block_prefill_avx512.inc) run here: the CPU has kAvx2Vnni, kAvx512 and AVX512_VNNI. (The
// kAvx512Vnni family runs the same tiles wherever it is supported, AVX-VNNI or not.)
bool avx512_prefill_supported() noexcept;

}  // namespace vq::cpu
