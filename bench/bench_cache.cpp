// Micro-benchmarks: one decode-step update per method at a fixed budget, as the context grows.
#include <benchmark/benchmark.h>

#include "engine/run/qfilters_file.h"
#include "eval/perturb/synthetic.h"
#include "veloxquant/veloxquant.h"

namespace {

void BM_DecodeStep(benchmark::State& state, const std::string& spec) {
  const std::int64_t context = state.range(0);
  const std::int64_t budget = state.range(1);
  const std::int64_t H = 4, D = 64;
  vq::CacheConfig config = vq::CacheConfig::parse(spec);
  if (vq::has_token_budget(config)) config = vq::with_token_budget(config, budget);
  const auto kv = vq::eval::make_synthetic(vq::eval::Geometry::kSpans, H, context + 1, D, 1, 7);
  vq::LayerCache cache(config, vq::LayerShape{H, D, 0, 0, 1});
  vq::engine::give_random_key_filters(cache, 7);  // qfilters: no model to calibrate
  // Prefill `context` tokens in one chunk, then time single-token steps.
  std::vector<float> k(static_cast<std::size_t>(H * context * D)), v(k.size());
  for (std::int64_t h = 0; h < H; ++h) {
    std::copy_n(kv.keys.begin() + h * (context + 1) * D, context * D, k.begin() + h * context * D);
    std::copy_n(kv.values.begin() + h * (context + 1) * D, context * D, v.begin() + h * context * D);
  }
  cache.update(vq::TensorRef::f32(k.data(), 1, H, context, D),
               vq::TensorRef::f32(v.data(), 1, H, context, D));
  vq::TensorRef tk = vq::TensorRef::f32(kv.keys.data() + context * D, 1, H, 1, D);
  vq::TensorRef tv = vq::TensorRef::f32(kv.values.data() + context * D, 1, H, 1, D);
  tk.stride[1] = tv.stride[1] = (context + 1) * D;
  for (auto _ : state) {
    vq::StepView view = cache.begin_step(tk, tv);
    benchmark::DoNotOptimize(view.n_rows());
    cache.end_step();
  }
  state.counters["kept_bytes"] = static_cast<double>(cache.kept_bytes());
}

void register_all() {
  for (const auto& id : vq::method_ids()) {
    auto* b = benchmark::RegisterBenchmark(("decode_step/" + id).c_str(), BM_DecodeStep, id);
    for (std::int64_t context : {512, 2048}) b->Args({context, 128});
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
