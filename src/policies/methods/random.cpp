// random: a seeded random eviction baseline (what any method should beat).
//
// kvpress ships it as RandomPress; no paper of its own. Each row draws a uniform score in
// [0, 1) once, when it arrives, from the layer's counter-based RNG keyed by (seed, layer, KV
// head) and the row's batch element and true position, so a row's score does not depend on
// chunking, threads or what else was drawn. Over budget the unprotected row of lowest score
// leaves: the first n_sink rows and the newest `grace` rows are protected (as kvpress leaves
// the question after a compressed context, and as knorm/keydiff here); among the others the
// kept rows are a uniformly random subset.
//
// Fields: random_budget=512, random_n_sink=4, random_grace=16; shared: merge (the gate
// compares the scores), quantize/demote, seed, kv_dtype. `random:n_sink=0,grace=0` is the pure
// baseline (every row equally likely to stay).
#include <cstdint>
#include <limits>

#include "policies/fields.h"
#include "policies/methods.h"
#include "policies/policy.h"

namespace vq::detail {

constexpr std::string_view kRandomCard = R"(
id: random
token loop: yes
prefix: random
summary: Random: evict a uniformly random row (seeded); the baseline every method should beat
paper: - (a baseline; kvpress's RandomPress)
disposition: drop (merge optional)
score: uniform random, drawn once per row
budget: uniform
deviations: sinks and a recent window protected by default (kvpress compresses the context
  only, so the question stays)
paper config: `random:n_sink=0,grace=0` (every row equally likely to stay)
| random_budget | int | 512 | [1, 16777216] | rows kept per KV head, sinks included
| random_n_sink | int | 4 | [0, 16777216] | leading rows never evicted
| random_grace | int | 16 | [0, 16777216] | newest rows protected from eviction
)";

namespace {

// The draw counters of the scores: bit 63 set keeps them apart from the merge gate's
// (HeadState::draws, counting up from 0); then the batch element and the true position.
std::uint64_t score_counter(std::int64_t batch_index, std::int32_t position) noexcept {
  return (std::uint64_t{1} << 63) | (static_cast<std::uint64_t>(batch_index) << 32) |
         static_cast<std::uint32_t>(position);
}

class RandomPolicy final : public TokenPolicy {
 public:
  explicit RandomPolicy(const PolicyContext& ctx)
      : TokenPolicy(ctx), grace_(ctx.config.get_int("random_grace")) {}

 protected:
  void on_token(HeadCtx& h, std::int64_t row) override {
    const std::int64_t b = h.index / h.st.shape.n_kv_heads;
    const std::int32_t pos = h.rows().positions[row];
    push_row(h.hs, row, static_cast<float>(h.rng.uniform(score_counter(b, pos))));
  }
  void eviction_scores(HeadCtx& h, float* out) override {
    const std::int64_t n = h.n_live();
    const float inf = std::numeric_limits<float>::infinity();
    for (std::int64_t i = 0; i < n; ++i) {
      out[i] = (i < n_sink_ || i >= n - grace_) ? inf : h.hs.score[static_cast<std::size_t>(i)];
    }
  }
  // The scores are static: merging leaves the survivor's as it was.
  void on_merge(HeadCtx& /*h*/, std::int64_t /*target*/, std::int64_t /*loser*/) override {}

 private:
  std::int64_t grace_;
};

void check(const CacheConfig& c) {
  require_less(c, "random_n_sink", "random_budget");
  require_sum_less(c, "random_n_sink", "random_grace", "random_budget");
}

}  // namespace

MethodInfo random_method() {
  return method_card(kRandomCard, &check, &make_policy_of<RandomPolicy>);
}

}  // namespace vq::detail
