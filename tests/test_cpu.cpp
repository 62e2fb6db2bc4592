// The CPU-feature layer (base/cpu.h) against the kernel's own reading of the CPU: the flags
// line of /proc/cpuinfo, which Linux fills from CPUID and clears for state the OS does not save.
#include "base/cpu.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace vq {
namespace {

using cpu::Isa;

std::vector<std::string> cpuinfo_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  std::vector<std::string> flags;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    for (std::string f; words >> f;) flags.push_back(f);
    break;
  }
  return flags;
}

TEST(Cpu, FamiliesFollowTheFlagsLinuxReports) {
  const std::vector<std::string> flags = cpuinfo_flags();
  if (flags.empty()) GTEST_SKIP() << "no flags line in /proc/cpuinfo";
  const auto has = [&](const char* f) {
    return std::find(flags.begin(), flags.end(), f) != flags.end();
  };
  const bool avx2 = has("avx2") && has("f16c");
  const bool vnni = avx2 && has("avx_vnni");
  const bool avx512 =
      avx2 && has("avx512f") && has("avx512bw") && has("avx512vl") && has("avx512dq");
  const bool avx512_vnni = avx512 && has("avx512_vnni") && has("avx512vbmi");

  const cpu::Features& f = cpu::features();
  EXPECT_EQ(f.avx2, avx2);
  EXPECT_EQ(f.avx_vnni, has("avx_vnni") && avx2);
  EXPECT_EQ(f.avx512, avx512);
  EXPECT_EQ(f.avx512_vnni, avx512 && has("avx512_vnni"));
  EXPECT_EQ(f.avx512_vbmi, avx512 && has("avx512vbmi"));
  // The features reported for measurements (bench kernels' peaks).
  EXPECT_EQ(f.fma, has("fma") && has("avx"));
  EXPECT_EQ(f.avx512_bf16, avx512 && has("avx512_bf16"));
  // Linux lists AMX only where it enables the tile state; CPUID reports it regardless.
  EXPECT_TRUE(f.amx_tile || !has("amx_tile"));
  EXPECT_TRUE(f.amx_int8 || !has("amx_int8"));
  EXPECT_TRUE(f.amx_bf16 || !has("amx_bf16"));
  EXPECT_TRUE(!cpu::amx_usable() || (has("amx_tile") && f.amx_tile));

  EXPECT_TRUE(cpu::isa_supported(Isa::kScalar));
  EXPECT_EQ(cpu::isa_supported(Isa::kAvx2), avx2);
  EXPECT_EQ(cpu::isa_supported(Isa::kAvx2Vnni), vnni);
  EXPECT_EQ(cpu::isa_supported(Isa::kAvx512), avx512);
  EXPECT_EQ(cpu::isa_supported(Isa::kAvx512Vnni), avx512_vnni);
  EXPECT_EQ(cpu::best_isa(), avx512_vnni ? Isa::kAvx512Vnni
                             : avx512    ? Isa::kAvx512
                             : vnni      ? Isa::kAvx2Vnni
                             : avx2      ? Isa::kAvx2
                                         : Isa::kScalar);
  if (avx2) {
    EXPECT_EQ(cpu::avx512_base(), vnni ? Isa::kAvx2Vnni : Isa::kAvx2);
  }
  EXPECT_EQ(cpu::avx512_prefill_supported(), vnni && avx512 && has("avx512_vnni"));
}

TEST(Cpu, FamilyNamesAndAvx512Membership) {
  EXPECT_STREQ(cpu::to_string(Isa::kScalar), "scalar");
  EXPECT_STREQ(cpu::to_string(Isa::kAvx2), "avx2+fma+f16c");
  EXPECT_STREQ(cpu::to_string(Isa::kAvx2Vnni), "avx2+fma+f16c+avxvnni");
  EXPECT_STREQ(cpu::to_string(Isa::kAvx512), "avx512vl+bw+dq");
  EXPECT_STREQ(cpu::to_string(Isa::kAvx512Vnni), "avx512vnni+vbmi");
  EXPECT_FALSE(cpu::uses_avx512(Isa::kScalar));
  EXPECT_FALSE(cpu::uses_avx512(Isa::kAvx2));
  EXPECT_FALSE(cpu::uses_avx512(Isa::kAvx2Vnni));
  EXPECT_TRUE(cpu::uses_avx512(Isa::kAvx512));
  EXPECT_TRUE(cpu::uses_avx512(Isa::kAvx512Vnni));
}

}  // namespace
}  // namespace vq
