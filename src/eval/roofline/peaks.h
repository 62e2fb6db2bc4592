// This machine's ceilings, measured with microbenchmarks of our own (`veloxquant bench kernels`,
// docs/own-models.md "Roofline"): arithmetic throughput per instruction family and memory read
// bandwidth. Each kernel is compiled for its family with a target attribute and runs only where
// base/cpu.h reports the family (CPU and OS), so the binary runs on any x86-64; a family the CPU
// lacks is reported absent with the reason, never executed.
//
//   peak          unit     instruction (per lane, per instruction)             ops counted
//   fma_avx2      GFLOP/s  vfmadd231ps ymm (8 lanes)                            2 per lane
//   fma_avx512    GFLOP/s  vfmadd231ps zmm (16 lanes)                           2 per lane
//   muladd_avx2   GFLOP/s  vmulps + vaddps ymm, a dependent pair (8 lanes)      2 per lane per pair
//                          (the separate multiply-add the kernels use today: its ceiling)
//   vnni_avx512   GOP/s    vpdpbusd zmm (64 u8 x s8 pairs)                      2 per pair
//   vnni_avx      GOP/s    AVX-VNNI vpdpbusd ymm (32 pairs)                     2 per pair
//   bf16_avx512   GFLOP/s  vdpbf16ps zmm (32 bf16 pairs)                        2 per pair
//   amx_int8      GOP/s    tdpbssd, 16 x 16 x 64 int8 products                  2 per product
//   amx_bf16      GFLOP/s  tdpbf16ps, 16 x 16 x 32 bf16 products                2 per product
//   read_bw       GB/s     a streaming read (sum) of a buffer far larger than the last-level
//                          cache, each thread its own contiguous part; 1e9 bytes per GB
//
// Arithmetic kernels keep every accumulator in a register (12 independent chains on ymm, 24 on
// zmm, 4 tiles for AMX: more than an FMA's latency times its ports on current x86 cores), with
// no loads in the loop. Each peak is the best of `repeats` timed runs (one untimed first), the
// loop length calibrated so a run lasts about `target_seconds`; with T threads every thread runs
// the same loop and the rate is the total work over the wall time of the parallel region.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace vq::eval {

struct Peak {
  std::string name;                   // "fma_avx2", ... (table above)
  std::string unit;                   // "GFLOP/s", "GOP/s", "GB/s"
  std::string instruction;            // what was timed
  bool available = false;             // false: not run (the CPU or OS lacks the family)
  std::string note;                   // why absent, or what the number means
  std::map<int, double> per_threads;  // thread count -> rate in `unit`
};

struct PeakOptions {
  std::vector<int> threads = {1};                        // thread counts to measure at (each >= 1)
  int repeats = 5;                                       // timed runs per measurement (best kept)
  double target_seconds = 0.05;                          // length of one arithmetic run
  std::int64_t bandwidth_bytes = std::int64_t{1} << 30;  // read buffer
};

// Every peak of the table, in its order (absent ones with available = false).
std::vector<Peak> measure_peaks(const PeakOptions& options);

// The names of the CPU features base/cpu.h reports present ("avx2", "fma", "avx512_vnni", ...,
// "amx_tile (OS grants tiles)" / "amx_tile (OS refuses tiles)").
std::vector<std::string> cpu_feature_names();

}  // namespace vq::eval
