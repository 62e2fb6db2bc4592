// Cache state loading (LayerCache::load_state, ModelCache::load_state; src/cache/state.cpp)
// from arbitrary bytes: byte 0 picks the target (one config per row store and stateful policy,
// and a ModelCache with group state), byte 1 whether the header's size and the checksum are
// set to match the bytes (so the input reaches the parser behind them). A load either throws
// vq::Error or succeeds; after a success the state saves back to the same bytes (the format has
// one encoding) and the cache takes further steps. The reader never allocates past the input's
// size (scripts/fuzz.sh runs with -malloc_limit_mb).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "base/state_io.h"
#include "fuzz_util.h"
#include "veloxquant/builder.h"
#include "veloxquant/cache.h"

namespace {

constexpr std::int64_t kH = 2, kD = 32;

const char* const kSpecs[] = {
    "h2o:budget=8,n_sink=1",                   // plain fp16 rows, scores
    "tova:budget=8,kv_dtype=q4_0",             // ggml blocks
    "kivi:residual_length=4,kivi_group_size=4",  // KIVI codes, groups and tails
    "h2o:budget=8,demote=kivi4",               // mixed precision tier
    "snapkv:budget=16,obs_window=4,think=0.5",  // pruned keys and the chosen channels
    "morphkv:budget=12,window=4,source=proxy", // per-row history
    "duoattention:budget=8",                   // head types
    "expected_attention:budget=8",             // per-head statistics
    "simlayerkv:budget=8",                     // layer type
    "keyformer:budget=8,kv_dtype=f32",         // RNG draws, fp32 rows
};
constexpr std::size_t kNumSpecs = sizeof(kSpecs) / sizeof(kSpecs[0]);

void fix_header(std::vector<std::uint8_t>& b) {
  if (b.size() < 28) return;
  const std::uint64_t n = b.size();
  std::memcpy(b.data() + 16, &n, 8);
  const std::uint32_t crc = vq::detail::crc32c(b.data(), b.size() - 4);
  std::memcpy(b.data() + b.size() - 4, &crc, 4);
}

// A few decode steps: a loaded cache must take them.
void steps(vq::LayerCache& c) {
  std::vector<float> k(static_cast<std::size_t>(kH * kD), 0.25f), v(k.size(), -0.5f);
  const std::int64_t B = c.stats().tokens_kept_per_head.empty()
                             ? 1
                             : static_cast<std::int64_t>(c.stats().tokens_kept_per_head.size()) / kH;
  k.resize(static_cast<std::size_t>(B * kH * kD), 0.25f);
  v.resize(k.size(), -0.5f);
  for (int i = 0; i < 3; ++i) {
    c.update(vq::TensorRef::f32(k.data(), B, kH, 1, kD), vq::TensorRef::f32(v.data(), B, kH, 1, kD));
  }
}

void check_round_trip(const std::vector<std::uint8_t>& in, const std::vector<std::uint8_t>& out) {
  if (in != out) {
    std::fprintf(stderr, "fuzz_state_load: a loaded state saves to other bytes (%zu vs %zu)\n",
                 in.size(), out.size());
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const std::size_t pick = data[0] % (kNumSpecs + 1);
  std::vector<std::uint8_t> state(data + 2, data + size);
  if (data[1] & 1) fix_header(state);
  vq::fuzz::expect_clean([&] {
    if (pick == kNumSpecs) {
      vq::ModelCache m(vq::CacheConfig::parse("squeeze:budget=8,n_sink=1"),
                       vq::ModelShape{3, kH, kD, kH});
      m.load_state(state.data(), state.size());
      check_round_trip(state, m.save_state());
      for (std::int64_t l = 0; l < m.n_layers(); ++l) steps(m.layer(l));
      return;
    }
    vq::LayerCache c(vq::CacheConfig::parse(kSpecs[pick]), vq::LayerShape{kH, kD, kH, 0, 1});
    c.load_state(state.data(), state.size());
    check_round_trip(state, c.save_state());
    steps(c);
  });
  return 0;
}
