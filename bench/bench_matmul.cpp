// The Q8_0 x Q8_0 row kernels (engine/matmul.h) per kernel family, one thread, one activation
// row: a 256 x 768 matrix (209 KB, stays in L2: the kernels' arithmetic) and a 2048 x 768 one
// (1.7 MB, past L2: arithmetic plus memory). items_per_second is weight blocks per second;
// bytes_per_second the weight bytes read. Families the CPU lacks are skipped.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>
#include <vector>

#include "engine/compute/matmul.h"

namespace {

using vq::engine::Isa;

void BM_MatmulQ8Q8(benchmark::State& state, Isa isa, std::int64_t rows) {
  if (!vq::engine::isa_supported(isa)) {
    state.SkipWithError("kernel family not supported by this CPU");
    return;
  }
  constexpr std::int64_t kCols = 768;
  constexpr std::int64_t kBlocks = kCols / 32;
  // [rows][kBlocks] blocks: fp16 scale 0x3000 (0.125), codes covering -128..127.
  std::vector<std::uint8_t> w(static_cast<std::size_t>(rows * kBlocks * 34));
  for (std::size_t i = 0; i < w.size(); ++i) {
    const std::size_t k = i % 34;
    w[i] = k == 0 ? 0x00 : k == 1 ? 0x30 : static_cast<std::uint8_t>(i * 37 + 11);
  }
  const vq::engine::WeightMatrix m{vq::engine::WeightType::kQ8_0, rows, kCols, w.data()};
  std::vector<float> x(kCols);  // [kCols]
  for (std::int64_t j = 0; j < kCols; ++j) x[static_cast<std::size_t>(j)] = (j % 13) - 6.0f;
  std::vector<std::int8_t> q(kCols);  // [kCols] codes
  std::vector<float> d(kBlocks);      // [kBlocks] scales
  vq::engine::quantize_activations_q8_0(x.data(), kCols, q.data(), d.data());
  std::vector<float> out(static_cast<std::size_t>(rows));  // [rows]
  for (auto _ : state) {
    vq::engine::matmul_rows_q8_0(isa, out.data(), q.data(), d.data(), m, 1, 0, rows);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * rows * kBlocks);
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(w.size()));
}

void register_all() {
  for (const Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx2Vnni}) {
    for (const std::int64_t rows : {256, 2048}) {
      benchmark::RegisterBenchmark(("matmul_q8q8/" + std::string(vq::engine::to_string(isa)) + "/" +
                                    std::to_string(rows) + "x768")
                                       .c_str(),
                                   BM_MatmulQ8Q8, isa, rows)
          ->Unit(benchmark::kMicrosecond);
    }
  }
}

const int registered = (register_all(), 0);

}  // namespace
