// End-to-end decode speed of the reference engine on stories260K (data/): the llama2.c run.c
// benchmark setting (greedy from BOS, 256 positions), per cache method. items_per_second is
// decode tokens per second (forward + cache + sampling), the prompt step excluded. The
// attention-scored methods' default source=auto resolves to the engine's probabilities; the
// source=proxy variants time the key-as-query proxy.
#include <benchmark/benchmark.h>

#include "engine/run/generate.h"
#include "veloxquant/registry.h"

namespace {

void BM_Generate(benchmark::State& state, const std::string& spec) {
  static const vq::engine::Model model =
      vq::engine::Model::load(VELOXQUANT_DATA_DIR "/stories260K.bin");
  static const auto tokenizer = vq::engine::load_tokenizer("", model);
  vq::engine::GenerateOptions o;
  o.steps = 256;
  o.method = vq::CacheConfig::parse(spec);
  if (vq::has_token_budget(o.method)) o.method = vq::with_token_budget(o.method, 64);
  std::int64_t tokens = 0;
  double seconds = 0;
  for (auto _ : state) {
    const auto r = vq::engine::generate(model, *tokenizer, o);
    tokens += r.n_decode;
    seconds += r.decode_seconds;
    benchmark::DoNotOptimize(r.ids.data());
  }
  state.counters["decode_tok_per_s"] = benchmark::Counter(static_cast<double>(tokens) / seconds);
  state.SetItemsProcessed(tokens);
}

void register_all() {
  for (const std::string spec :
       {"full", "full:kv_dtype=f32", "streaming_llm", "h2o", "h2o:source=proxy", "tova",
        "tova:source=proxy", "morphkv", "morphkv:source=proxy", "knorm", "cam", "cam:source=proxy",
        "kivi"}) {
    benchmark::RegisterBenchmark(("generate_stories260K_256/" + spec).c_str(), BM_Generate, spec)
        ->Unit(benchmark::kMillisecond);
  }
}

const int registered = (register_all(), 0);

}  // namespace
