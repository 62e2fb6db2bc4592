#include "base/cpu.h"

#include <initializer_list>

#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define VQ_CPU_X86 1
#endif

namespace vq::cpu {
namespace {

inline bool bit(unsigned reg, int n) noexcept { return ((reg >> n) & 1u) != 0; }

Features detect() noexcept {
  Features f;
#ifdef VQ_CPU_X86
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(1, &a, &b, &c, &d) == 0) return f;
  // XGETBV needs OSXSAVE (leaf 1 ECX bit 27); XCR0 says which register state the OS saves:
  // bits 1-2 SSE and AVX (ymm), bits 5-7 the opmask and the upper zmm registers.
  const bool f16c = bit(c, 29);
  const bool fma = bit(c, 12);
  std::uint64_t xcr0 = 0;
  if (bit(c, 27)) {
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = (static_cast<std::uint64_t>(hi) << 32) | lo;
  }
  const bool ymm_state = (xcr0 & 0x6) == 0x6;
  const bool zmm_state = (xcr0 & 0xE6) == 0xE6;
  a = b = c = d = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return f;
  // Leaf 7.0: EBX bit 5 AVX2, 16 AVX512F, 17 AVX512DQ, 30 AVX512BW, 31 AVX512VL; ECX bit 1
  // AVX512_VBMI, 11 AVX512_VNNI.
  f.fma = ymm_state && fma;
  f.avx2 = f.fma && f16c && bit(b, 5);
  f.avx512 = f.avx2 && zmm_state && bit(b, 16) && bit(b, 17) && bit(b, 30) && bit(b, 31);
  f.avx512_vnni = f.avx512 && bit(c, 11);
  f.avx512_vbmi = f.avx512 && bit(c, 1);
  // Leaf 7.0 EDX: bit 22 AMX-BF16, 24 AMX-TILE, 25 AMX-INT8.
  f.amx_tile = bit(d, 24);
  f.amx_int8 = f.amx_tile && bit(d, 25);
  f.amx_bf16 = f.amx_tile && bit(d, 22);
  const unsigned max_subleaf = a;
  a = b = c = d = 0;
  // Leaf 7.1 (present when leaf 7.0's EAX, the highest subleaf, is at least 1): EAX bit 4
  // AVX-VNNI, bit 5 AVX512_BF16.
  const bool leaf71 = max_subleaf >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d) != 0;
  f.avx_vnni = f.avx2 && leaf71 && bit(a, 4);
  f.avx512_bf16 = f.avx512 && leaf71 && bit(a, 5);
#endif
  return f;
}

}  // namespace

const Features& features() noexcept {
  static const Features f = detect();
  return f;
}

const char* to_string(Isa isa) noexcept {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2+fma+f16c";
    case Isa::kAvx2Vnni:
      return "avx2+fma+f16c+avxvnni";
    case Isa::kAvx512:
      return "avx512vl+bw+dq";
    case Isa::kAvx512Vnni:
      return "avx512vnni+vbmi";
  }
  return "?";
}

bool isa_supported(Isa isa) noexcept {
  const Features& f = features();
  switch (isa) {
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
      return f.avx2;
    case Isa::kAvx2Vnni:
      return f.avx2 && f.avx_vnni;
    case Isa::kAvx512:
      return f.avx512;
    case Isa::kAvx512Vnni:
      return f.avx512 && f.avx512_vnni && f.avx512_vbmi;
  }
  return false;
}

Isa best_isa() noexcept {
  static const Isa best = [] {
    for (const Isa isa : {Isa::kAvx512Vnni, Isa::kAvx512, Isa::kAvx2Vnni, Isa::kAvx2}) {
      if (isa_supported(isa)) return isa;
    }
    return Isa::kScalar;
  }();
  return best;
}

Isa avx512_base() noexcept {
  static const Isa base = isa_supported(Isa::kAvx2Vnni) ? Isa::kAvx2Vnni : Isa::kAvx2;
  return base;
}

bool amx_usable() noexcept {
  static const bool usable = [] {
#if defined(__linux__) && defined(__x86_64__)
    if (!features().amx_tile) return false;
    // ARCH_REQ_XCOMP_PERM (0x1023) for XFEATURE_XTILEDATA (18): the kernel then saves the tile
    // data of this process's threads (arch/x86/include/uapi/asm/prctl.h).
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) return false;
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & (3u << 17)) == (3u << 17);  // XTILECFG and XTILEDATA
#else
    return false;
#endif
  }();
  return usable;
}

bool avx512_prefill_supported() noexcept {
  return isa_supported(Isa::kAvx2Vnni) && features().avx512 && features().avx512_vnni;
}

}  // namespace vq::cpu
