// Per-row cost of attention on a quantized row against an fp16 row (issue 21's kernel targets:
// 2-bit <= 0.4x, 4-bit <= 0.6x, 8-bit <= 0.8x of fp16). n_q decode queries per KV head (n_q = 1,
// head_dim 64, as llama-110m; n_q = 4: a GQA group of 4 query heads, as llama-3.2-1b) over
// `rows` rows of each of `heads` heads: scores then value sums, the way the engine's attention
// calls them (every query of the group in one call). fp16: the engine's plain path
// (ops::attention_*); the others: PackedRows::attend_scores / attend_values of the stores (kivi2 /
// kivi4: KIVI's store, group 32, residual 32; q8_0 / q4_0: ggml's blocks). The kinds run
// alternately inside every iteration (so a shared machine's load falls on all of them alike); the
// counters are ns per row (keys and values) and the ratio to fp16 measured in the same iterations.
#include <benchmark/benchmark.h>

#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/compute/ops.h"
#include "store/packed_attention.h"
#include "store/store.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Kind {
  std::string name;
  std::vector<std::unique_ptr<vq::detail::RowStore>> heads;
  double seconds = 0.0;
};

void BM_AttentionPerRow(benchmark::State& state) {
  const std::int64_t rows = state.range(0), H = state.range(1), nq = state.range(2), D = 64;
  std::vector<Kind> kinds;
  for (const char* name : {"fp16", "kivi2", "kivi4", "q8_0", "q4_0"}) {
    Kind k;
    k.name = name;
    for (std::int64_t h = 0; h < H; ++h) {
      const std::string n = name;
      if (n == "fp16") {
        k.heads.push_back(vq::detail::make_plain_store(vq::DType::kF16, D));
      } else if (n == "kivi2" || n == "kivi4") {
        k.heads.push_back(
            vq::detail::make_kivi_store(n == "kivi2" ? 2 : 4, 32, 32, vq::DType::kF16, D));
      } else {
        k.heads.push_back(vq::detail::make_block_store(n == "q4_0", D));
      }
    }
    kinds.push_back(std::move(k));
  }
  // The same random rows in every kind.
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> kx(static_cast<std::size_t>(rows * D)), vx(kx.size());
  for (std::int64_t h = 0; h < H; ++h) {
    for (float& x : kx) x = normal(rng);
    for (float& x : vx) x = normal(rng);
    for (Kind& k : kinds) {
      auto& s = *k.heads[static_cast<std::size_t>(h)];
      s.append(vq::TensorRef::f32(kx.data(), 1, 1, rows, D),
               vq::TensorRef::f32(vx.data(), 1, 1, rows, D), 0, 0, 0);
      s.settle_keep_all();
    }
  }
  std::vector<float> q(static_cast<std::size_t>(nq * D)),
      scores(static_cast<std::size_t>(nq * rows)), out(static_cast<std::size_t>(nq * D)),
      sums(static_cast<std::size_t>(nq * 8 * D)), row(static_cast<std::size_t>(D));
  for (float& x : q) x = normal(rng) * 0.125f;
  const auto pos = static_cast<std::int64_t>(rows);
  for (auto _ : state) {
    for (Kind& k : kinds) {
      const Clock::time_point t0 = Clock::now();
      for (const auto& s : k.heads) {
        const vq::HeadRows r = s->rows();
        if (r.packed == nullptr) {
          vq::engine::ops::attention_scores(q.data(), nq, D, r.keys, r.dtype, r.row_stride,
                                            r.positions, r.n_rows, pos, scores.data(), rows,
                                            row.data());
          for (std::int64_t j = 0; j < nq; ++j)
            vq::engine::ops::softmax(scores.data() + j * rows, r.n_rows, 8.0f);
          vq::engine::ops::attention_values(scores.data(), nq, rows, D, r.values, r.dtype,
                                            r.row_stride, r.positions, r.n_rows, pos, out.data(),
                                            sums.data());
        } else {
          r.packed->attend_scores(q.data(), nq, pos, scores.data(), rows);
          for (std::int64_t j = 0; j < nq; ++j)
            vq::engine::ops::softmax(scores.data() + j * rows, r.n_rows, 8.0f);
          r.packed->attend_values(scores.data(), nq, rows, pos, out.data(), sums.data());
        }
        benchmark::DoNotOptimize(out.data());
      }
      k.seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    }
  }
  state.SetLabel(std::string("packed kernels: ") +
                 vq::cpu::to_string(vq::detail::attn::kernels_for(vq::cpu::best_isa())));
  const double n = static_cast<double>(state.iterations()) * static_cast<double>(rows * H);
  for (const Kind& k : kinds) {
    state.counters[k.name + "_ns_row"] = k.seconds / n * 1e9;
    if (k.name != "fp16") state.counters[k.name + "_vs_fp16"] = k.seconds / kinds[0].seconds;
  }
}

// 8192 rows x 48 heads: 48 MiB of fp16 K/V (beyond the caches, as a long decode reads), and a
// cache-resident case (2048 rows x 4 heads, 2 MiB); one query per head, and a GQA group of four
// (8192 x 48 again: the rows cost the same to read, the arithmetic is four times).
BENCHMARK(BM_AttentionPerRow)
    ->ArgNames({"rows", "heads", "nq"})
    ->Args({8192, 48, 1})
    ->Args({2048, 4, 1})
    ->Args({8192, 48, 4})
    ->Unit(benchmark::kMillisecond);

}  // namespace
