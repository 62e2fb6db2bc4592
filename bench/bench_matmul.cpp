// The Q8_0 x Q8_0 row kernels (engine/matmul.h) per kernel family, one thread, one activation
// row: a 256 x 768 matrix (209 KB, stays in L2: the kernels' arithmetic) and a 2048 x 768 one
// (1.7 MB, past L2: arithmetic plus memory). items_per_second is weight blocks per second;
// bytes_per_second the weight bytes read. Families the CPU lacks are skipped.
//
// matmul_prefill/<type>/<kernels>/threads:<n>: the matmuls of one llama-110m layer (dim 768,
// hidden 2048: q/k/v fused, o, gate/up fused, down, as the engine's forward calls them) over a
// 512-token prompt chunk, through matmul()/matmul_fused() with the best kernel family on n
// threads; <kernels> is tiles (the prefill tiles; for F32/F16/BF16 on an AVX-512 CPU the packed
// GEMM) or rows (one matrix-vector product per token, engine/matmul.h PrefillKernels).
// matmul_prefill/<type>/tiles-avx2/...: the block types' tiles with set_avx512_prefill(false)
// (the AVX2 tiles, not the AVX-512 VNNI ones). matmul_batch8/<type>/<kernels>/...: the same
// layer over 8 tokens, one step of eight batched decode sessions (rows: eight decode products).
// items_per_second is prompt tokens per second through the layer's matmuls, FLOP/s the same as
// floating-point operations (2 per multiply-add: compare with bench kernels' fma_avx512 peak). Run with --benchmark_enable_random_interleaving=true
// --benchmark_repetitions=N to alternate the cases.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>
#include <vector>

#include "engine/compute/block_matmul.h"
#include "engine/compute/matmul.h"
#include "engine/compute/parallel.h"
#include "engine/compute/weights.h"

namespace {

using vq::cpu::Isa;

void BM_MatmulQ8Q8(benchmark::State& state, Isa isa, std::int64_t rows) {
  if (!vq::cpu::isa_supported(isa)) {
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

// A [rows][cols] matrix of `type` with deterministic bytes: every block's fp16 scales set to
// small finite values (the rest of a block is codes and packed scales, any bytes valid).
std::vector<std::uint8_t> prefill_matrix(vq::engine::WeightType type, std::int64_t rows,
                                         std::int64_t cols, std::uint32_t seed) {
  using vq::engine::WeightType;
  const vq::engine::WeightMatrix shape{type, rows, cols, nullptr};
  std::vector<std::uint8_t> b(static_cast<std::size_t>(shape.bytes()));
  std::uint32_t state = seed;
  for (auto& v : b) {
    state = state * 1664525u + 1013904223u;
    v = static_cast<std::uint8_t>(state >> 24);
  }
  if (type == WeightType::kF16) {
    for (std::size_t i = 1; i < b.size(); i += 2) b[i] = static_cast<std::uint8_t>(0x20 | (b[i] & 0x9f));
  } else if (type == WeightType::kBF16 || type == WeightType::kF32) {
    // The top byte (sign and exponent's high bits): magnitudes about 2^-7, never NaN or inf.
    const std::size_t el = type == WeightType::kBF16 ? 2 : 4;
    for (std::size_t i = el - 1; i < b.size(); i += el) b[i] = static_cast<std::uint8_t>(0x3c | (b[i] & 0x81));
  } else if (type == WeightType::kQ8_0 || type == WeightType::kQ4_0 || type == WeightType::kQ4_K) {
    const auto bb = static_cast<std::size_t>(vq::engine::weight_block_bytes(type));
    for (std::size_t k = 0; k + bb <= b.size(); k += bb) {
      b[k] = 0x00;
      b[k + 1] = 0x20;  // d = 2^-7
      if (type == WeightType::kQ4_K) {
        b[k + 2] = 0x00;
        b[k + 3] = 0x1c;  // dmin = 2^-8
      }
    }
  }
  return b;
}

void BM_MatmulPrefill(benchmark::State& state, vq::engine::WeightType type,
                      vq::engine::PrefillKernels kernels, int threads, bool avx512_tiles,
                      std::int64_t kS) {
  using vq::engine::MatmulOut;
  using vq::engine::WeightMatrix;
  constexpr std::int64_t kDim = 768, kHidden = 2048;
  const std::int64_t shapes[7][2] = {{kDim, kDim},    {kDim, kDim},    {kDim, kDim},   {kDim, kDim},
                                     {kHidden, kDim}, {kHidden, kDim}, {kDim, kHidden}};
  std::vector<std::vector<std::uint8_t>> bytes;
  std::vector<WeightMatrix> w;
  for (int m = 0; m < 7; ++m) {
    bytes.push_back(prefill_matrix(type, shapes[m][0], shapes[m][1], 17u + static_cast<std::uint32_t>(m)));
    w.push_back(WeightMatrix{type, shapes[m][0], shapes[m][1], bytes.back().data()});
  }
  std::vector<float> x(static_cast<std::size_t>(kS * kHidden));  // [S][hidden] (first kDim used)
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(static_cast<int>(i * 37 % 97) - 48) / 16.0f;
  std::vector<float> q(kS * kDim), k(kS * kDim), v(kS * kDim), o(kS * kDim), g(kS * kHidden),
      u(kS * kHidden), d(kS * kDim);
  const int saved_threads = vq::engine::threads();
  const vq::engine::PrefillKernels saved_kernels = vq::engine::prefill_kernels();
  const bool saved_avx512 = vq::engine::avx512_prefill();
  vq::engine::set_threads(threads);
  vq::engine::set_prefill_kernels(kernels);
  vq::engine::set_avx512_prefill(avx512_tiles);
  for (auto _ : state) {
    const MatmulOut qkv[3] = {{q.data(), &w[0]}, {k.data(), &w[1]}, {v.data(), &w[2]}};
    vq::engine::matmul_fused(qkv, x.data(), kS);
    vq::engine::matmul(o.data(), q.data(), w[3], kS);
    const MatmulOut gate_up[2] = {{g.data(), &w[4]}, {u.data(), &w[5]}};
    vq::engine::matmul_fused(gate_up, o.data(), kS);
    vq::engine::matmul(d.data(), g.data(), w[6], kS);
    benchmark::DoNotOptimize(d.data());
    benchmark::ClobberMemory();
  }
  vq::engine::set_threads(saved_threads);
  vq::engine::set_prefill_kernels(saved_kernels);
  vq::engine::set_avx512_prefill(saved_avx512);
  state.SetItemsProcessed(state.iterations() * kS);
  double flops = 0;  // 2 per multiply-add, the layer's matrices
  for (const auto& sh : shapes) flops += 2.0 * static_cast<double>(kS * sh[0] * sh[1]);
  state.counters["FLOP/s"] =
      benchmark::Counter(flops * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

void register_all() {
  using vq::engine::PrefillKernels;
  using vq::engine::WeightType;
  for (const WeightType type :
       {WeightType::kF32, WeightType::kF16, WeightType::kBF16, WeightType::kQ8_0, WeightType::kQ4_K,
        WeightType::kQ4_0}) {
    for (const int threads : {1, 2}) {
      for (const PrefillKernels k : {PrefillKernels::kRows, PrefillKernels::kTiles}) {
        benchmark::RegisterBenchmark(
            ("matmul_prefill/" + std::string(vq::engine::to_string(type)) + "/" +
             (k == PrefillKernels::kTiles ? "tiles" : "rows") + "/threads:" + std::to_string(threads))
                .c_str(),
            BM_MatmulPrefill, type, k, threads, true, std::int64_t{512})
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
      }
    }
  }
  // The block types' tiles without the AVX-512 VNNI ones (set_avx512_prefill(false): the AVX2
  // tiles), to compare in one process; and the same layer over 8 tokens (matmul_batch8: one
  // step of eight batched decode sessions) with and without them.
  for (const WeightType type : {WeightType::kQ8_0, WeightType::kQ4_K, WeightType::kQ4_0}) {
    const std::string t = vq::engine::to_string(type);
    for (const int threads : {1, 2}) {
      const std::string n = "/threads:" + std::to_string(threads);
      benchmark::RegisterBenchmark(("matmul_prefill/" + t + "/tiles-avx2" + n).c_str(), BM_MatmulPrefill,
                                   type, PrefillKernels::kTiles, threads, false, std::int64_t{512})
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
      for (const bool avx512 : {true, false}) {
        benchmark::RegisterBenchmark(
            ("matmul_batch8/" + t + (avx512 ? "/tiles" : "/tiles-avx2") + n).c_str(),
            BM_MatmulPrefill, type, PrefillKernels::kTiles, threads, avx512, std::int64_t{8})
            ->Unit(benchmark::kMicrosecond)
            ->UseRealTime();
      }
      benchmark::RegisterBenchmark(("matmul_batch8/" + t + "/rows" + n).c_str(), BM_MatmulPrefill,
                                   type, PrefillKernels::kRows, threads, true, std::int64_t{8})
          ->Unit(benchmark::kMicrosecond)
          ->UseRealTime();
    }
  }
  for (const Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx2Vnni}) {
    for (const std::int64_t rows : {256, 2048}) {
      benchmark::RegisterBenchmark(("matmul_q8q8/" + std::string(vq::cpu::to_string(isa)) + "/" +
                                    std::to_string(rows) + "x768")
                                       .c_str(),
                                   BM_MatmulQ8Q8, isa, rows)
          ->Unit(benchmark::kMicrosecond);
    }
  }
}

const int registered = (register_all(), 0);

// matvec/<type>/<family>/<rows>x<cols>: one token's product (S = 1, decode) of one matrix with
// one kernel family, one thread, through matmul_rows_blocks (matmul_rows_q8_0 for Q8_0) over
// activations quantized once: llama-3.2-1b's shapes (2048 x 2048: q/o, 8192 x 2048: gate/up,
// 2048 x 8192: down) and llama-110m's (768 x 768, 2048 x 768). A 2048 x 2048 Q4_K matrix is
// 2.4 MB, past this CPU's L2, so the figures include the weights' memory traffic.
// items_per_second is weight rows per second; bytes_per_second the weight bytes read. Compare
// families with --benchmark_filter=matvec --benchmark_enable_random_interleaving=true
// --benchmark_repetitions=N.
void BM_Matvec(benchmark::State& state, vq::engine::WeightType type, Isa isa, std::int64_t rows,
               std::int64_t cols) {
  using vq::engine::WeightType;
  if (!vq::cpu::isa_supported(isa)) {
    state.SkipWithError("kernel family not supported by this CPU");
    return;
  }
  std::vector<std::uint8_t> bytes = prefill_matrix(type, rows, cols, 5u);
  const auto bb = static_cast<std::size_t>(vq::engine::weight_block_bytes(type));
  if (type == WeightType::kQ5_K || type == WeightType::kQ6_K) {  // finite fp16 scales
    const std::size_t at = type == WeightType::kQ6_K ? 208 : 0;
    for (std::size_t k = 0; k + bb <= bytes.size(); k += bb) {
      bytes[k + at] = 0x00;
      bytes[k + at + 1] = 0x20;
      if (type == WeightType::kQ5_K) {
        bytes[k + 2] = 0x00;
        bytes[k + 3] = 0x1c;
      }
    }
  }
  const vq::engine::WeightMatrix w{type, rows, cols, bytes.data()};
  std::vector<float> x(static_cast<std::size_t>(cols));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(static_cast<int>(i * 37 % 97) - 48) / 16.0f;
  const vq::engine::ActType at = vq::engine::activation_type(type);
  std::vector<std::int8_t> q(x.size());
  std::vector<float> d(x.size() / 32), s(x.size() / 32);
  std::vector<std::int16_t> bs(x.size() / 16);
  if (at == vq::engine::ActType::kQ8_K) {
    vq::engine::quantize_activations_q8_k(x.data(), cols, q.data(), d.data(), bs.data());
  } else {
    vq::engine::quantize_activations_q8_1(x.data(), cols, q.data(), d.data(), s.data());
  }
  const vq::engine::BlockActs a{at, cols, q.data(), d.data(), s.data(), bs.data()};
  std::vector<float> out(static_cast<std::size_t>(rows));
  for (auto _ : state) {
    if (type == WeightType::kQ8_0) {
      vq::engine::matmul_rows_q8_0(isa, out.data(), q.data(), d.data(), w, 1, 0, rows);
    } else {
      vq::engine::matmul_rows_blocks(isa, out.data(), a, w, 1, 0, rows);
    }
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * rows);
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(bytes.size()));
}

void register_matvec() {
  using vq::engine::WeightType;
  const std::int64_t shapes[5][2] = {{2048, 2048}, {8192, 2048}, {2048, 8192}, {768, 768}, {2048, 768}};
  for (const WeightType type : {WeightType::kQ4_0, WeightType::kQ8_0, WeightType::kQ4_K,
                                WeightType::kQ5_K, WeightType::kQ6_K}) {
    for (const Isa isa : {Isa::kAvx2Vnni, Isa::kAvx512Vnni}) {
      for (const auto& sh : shapes) {
        benchmark::RegisterBenchmark(("matvec/" + std::string(vq::engine::to_string(type)) + "/" +
                                      vq::cpu::to_string(isa) + "/" + std::to_string(sh[0]) +
                                      "x" + std::to_string(sh[1]))
                                         .c_str(),
                                     BM_Matvec, type, isa, sh[0], sh[1])
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
}

const int registered_matvec = (register_matvec(), 0);

}  // namespace
