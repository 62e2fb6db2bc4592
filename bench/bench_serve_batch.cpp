// Batched decode against one sequence: the server's step (engine/model/transformer.h's batched forward) with B
// sessions decoding together vs one session, alternating rounds so both see the same machine
// load. Each session first prefills `prompt` tokens; then each round runs `steps` decode steps
// (greedy tokens) with B = 1 and with B = batch. Prints one JSON object: tokens/s of each and
// their ratio per round and the median.
//
// Usage: bench_serve_batch MODEL [TOKENIZER] [--batch 8] [--prompt 64] [--steps 16]
//          [--rounds 3] [--method full] [--threads 0]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/compute/parallel.h"
#include "engine/model/model.h"
#include "engine/model/transformer.h"
#include "veloxquant/builder.h"

int main(int argc, char** argv) {
  using namespace vq;
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL [--batch B] [--prompt P] [--steps N] [--rounds R] "
                         "[--method SPEC] [--threads T]\n", argv[0]);
    return 2;
  }
  std::int64_t batch = 8, prompt = 64, steps = 16, rounds = 3;
  int threads = 0;
  std::string method = "full";
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--batch") batch = std::atoll(v.c_str());
    else if (k == "--prompt") prompt = std::atoll(v.c_str());
    else if (k == "--steps") steps = std::atoll(v.c_str());
    else if (k == "--rounds") rounds = std::atoll(v.c_str());
    else if (k == "--method") method = v;
    else if (k == "--threads") threads = std::atoi(v.c_str());
    else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  if (batch < 1 || batch > 64 || prompt < 1 || steps < 1 || rounds < 1 || rounds > 20) {
    std::fprintf(stderr, "need --batch in [1, 64], --prompt, --steps >= 1, --rounds in [1, 20]\n");
    return 2;
  }
  if (threads > 0) engine::set_threads(threads);
  const engine::Model model = engine::Model::load(argv[1]);
  const auto& c = model.config();
  const std::int64_t ctx = prompt + rounds * steps * 2 + 2;
  engine::Transformer bf(model, 32, ctx, std::max<std::int64_t>(batch, 32));
  std::vector<ModelCache> caches;
  std::vector<std::int32_t> last(static_cast<std::size_t>(batch));
  for (std::int64_t b = 0; b < batch; ++b) {
    caches.push_back(KVCacheBuilder::for_model(CacheConfig::parse(method), engine::model_shape(c)));
    std::vector<std::int32_t> toks;
    for (std::int64_t t = 0; t < prompt; ++t)
      toks.push_back(static_cast<std::int32_t>((t * 131 + b * 17 + 3) % c.vocab_size));
    for (std::int64_t t0 = 0; t0 < prompt; t0 += 32) {
      const engine::BatchItem it{toks.data() + t0, std::min<std::int64_t>(32, prompt - t0),
                                 &caches[static_cast<std::size_t>(b)], engine::Logits::kNone};
      bf.forward({&it, 1});
    }
    last[static_cast<std::size_t>(b)] = toks.back();
  }
  auto decode = [&](std::int64_t B) {
    std::vector<engine::BatchItem> items;
    for (std::int64_t b = 0; b < B; ++b)
      items.push_back({&last[static_cast<std::size_t>(b)], 1, &caches[static_cast<std::size_t>(b)],
                       engine::Logits::kLast});
    const auto t0 = std::chrono::steady_clock::now();
    for (std::int64_t s = 0; s < steps; ++s) {
      bf.forward(items);
      for (std::int64_t b = 0; b < B; ++b) {
        const float* l = bf.logits(static_cast<std::size_t>(b));
        last[static_cast<std::size_t>(b)] =
            static_cast<std::int32_t>(std::max_element(l, l + c.vocab_size) - l);
      }
    }
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return static_cast<double>(B * steps) / sec;
  };
  std::vector<double> ratios;
  std::string rows;
  for (std::int64_t r = 0; r < rounds; ++r) {
    const double one = decode(1);
    const double many = decode(batch);
    ratios.push_back(many / one);
    rows += (r ? "," : "") + std::string("{\"one_tok_s\":") + std::to_string(one) +
            ",\"batch_tok_s\":" + std::to_string(many) + ",\"ratio\":" + std::to_string(many / one) + "}";
  }
  std::sort(ratios.begin(), ratios.end());
  std::printf("{\"model\":\"%s\",\"method\":\"%s\",\"batch\":%lld,\"prompt\":%lld,\"steps\":%lld,"
              "\"threads\":%d,\"rounds\":[%s],\"median_ratio\":%.3f}\n",
              argv[1], method.c_str(), static_cast<long long>(batch),
              static_cast<long long>(prompt), static_cast<long long>(steps), engine::threads(),
              rows.c_str(), ratios[ratios.size() / 2]);
  return 0;
}
