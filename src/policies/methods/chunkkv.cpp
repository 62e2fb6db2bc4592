// chunkkv: evict whole contiguous chunks, the same chunks for every KV head of a layer.
//
// Paper: Liu et al., "ChunkKV: Semantic-Preserving KV Cache Compression for Efficient
// Long-Context LLM Inference", NeurIPS 2025.
//
// Rule: each row's token score is H2O's cumulative proxy mass (chunkkv_score=attn_mass;
// grace/decay as in h2o) or minus its key norm (key_norm), summed over the
// KV heads of a batch row. Rows after the sinks form contiguous chunks of chunk_size in order
// (the newest chunk may be short). Over budget, the chunk with the lowest mean score that
// holds no protected (newest grace) row is evicted from every head, repeatedly until the
// budget holds, so a layer keeps between budget - chunk_size + 1 and budget rows.
// chunk_size = 1 on a single KV head is exactly h2o with the same n_sink, grace and decay.
// The recent window defaults to floor(chunkkv_recent_ratio 0.5 x (budget - n_sink -
// chunk_size + 1)) (grace = -1), so the guard n_sink + grace + chunk_size <= budget holds.
//
// Fields: chunkkv_budget=512, chunkkv_chunk_size=8 (paper recommends 10), chunkkv_n_sink=4,
// chunkkv_score=attn_mass, chunkkv_grace=-1, chunkkv_recent_ratio=0.5, chunkkv_decay=0.98;
// shared: merge=drop (+gate, keys), source=auto,
// quantize..., seed, kv_dtype.
// Deviations from the paper: chunks are chosen at every step from the live rows rather than
// once over the prompt; scores are key-as-query proxy mass.
#include <cmath>
#include <limits>

#include "base/kernels.h"
#include "policies/fields.h"
#include "policies/methods/h2o.h"
#include "policies/methods.h"
#include "veloxquant/errors.h"

namespace vq::detail {

// The registry entry (methods.h, method_card): what `veloxquant list` and the README table
// show, the field table and the shared field groups.
constexpr std::string_view kCard = R"(
id: chunkkv
token loop: yes
prefix: chunkkv
summary: ChunkKV: evict whole contiguous chunks by mean score, the same chunks for every head of a
  layer
paper: Liu et al., ChunkKV: Semantic-Preserving KV Cache Compression for Efficient Long-Context
  LLM Inference, NeurIPS 2025
disposition: drop (chunk; merge optional)
score: cumulative attention mass or key norm, pooled per chunk
budget: uniform (budget - chunk_size + 1 to budget)
deviations: chunks chosen at every step from the live rows (paper: once over the prompt);
  key-as-query proxy when no attention is passed (source=auto)
paper config: `chunkkv:chunk_size=10,n_sink=0,decay=1,source=attention` (chunks of 10; the paper
  selects chunks once at prefill)
defaults: H2O's defaults for the token scores (recent window = half the budget left after the
  sinks and one chunk, decay 0.98) and chunks of 8
exact budget: no
| chunkkv_budget | int | 512 | [1, 16777216] | rows kept per KV head, sinks included
| chunkkv_chunk_size | int | 8 | [1, 16777216] | rows per chunk (paper recommends 10)
| chunkkv_n_sink | int | 4 | [0, 16777216] | leading rows never evicted
| chunkkv_score | enum | attn_mass | {attn_mass, key_norm} | token score: H2O's cumulative mass,
  or minus the key norm
groups: mass
attention: yes
)";

namespace {
void check(const CacheConfig& c) {
  require_less(c, "chunkkv_n_sink", "chunkkv_budget");
  if (c.get_enum("chunkkv_score") == "key_norm" && c.get_enum("source") == "attention") {
    config_error(c, "source=attention applies to chunkkv_score=attn_mass only (key_norm uses no "
                    "attention)");
  }
  if (c.get_enum("chunkkv_score") == "key_norm") {
    for (const char* f : {"chunkkv_decay", "source", "gqa_reduce"}) {
      if (c.is_set(f)) {
        config_error(c, std::string(f) + " has no effect with chunkkv_score=key_norm (key norms "
                                         "use no attention)");
      }
    }
  }
  check_recent_window(c, "chunkkv", "grace", "chunkkv_chunk_size");
}

class ChunkKVPolicy final : public H2OPolicy {
 public:
  explicit ChunkKVPolicy(const PolicyContext& ctx)
      : H2OPolicy(ctx), chunk_(ctx.config.get_int("chunkkv_chunk_size")),
        key_norm_(ctx.config.get_enum("chunkkv_score") == "key_norm") {
    // Key norms use no attention: nothing to resolve, "none" in result files.
    if (key_norm_) source_.kind = source_.configured = ScoreSource::Kind::kNone;
  }

 protected:
  // Every head of a batch row loses the same chunk, token by token (never a chunk at once).
  bool decides_chunk_at_once() const noexcept override { return false; }
  bool shares_rows() const noexcept override { return true; }
  void layer_losers(LayerState& st, std::int64_t b, std::int64_t keep,
                    std::vector<std::int64_t>& losers) override {
    const std::int64_t H = st.shape.n_kv_heads;
    if (static_cast<std::int64_t>(st.heads[static_cast<std::size_t>(b * H)].live.size()) <= keep) {
      return;
    }
    const auto [c0, c1] = lowest_chunk(st, b);
    for (std::int64_t r = c0; r < c1; ++r) losers.push_back(r);
  }

  void on_token(HeadCtx& h, std::int64_t row) override {
    if (!key_norm_) {
      H2OPolicy::on_token(h, row);
      return;
    }
    const float* k = key_of_row(h, row);
    push_row(h.hs, row, -std::sqrt(kernels::dot(k, k, h.head_dim)));
  }

 private:
  // The evictable chunk [c0, c1) of batch row b with the lowest mean head-summed score (NaN
  // first, ties to the lowest index).
  std::pair<std::int64_t, std::int64_t> lowest_chunk(const LayerState& st, std::int64_t b) {
    const std::int64_t H = st.shape.n_kv_heads;
    const std::int64_t n = static_cast<std::int64_t>(st.heads[static_cast<std::size_t>(b * H)].live.size());
    token_.assign(static_cast<std::size_t>(n), 0.0f);
    for (std::int64_t h = 0; h < H; ++h) {
      const auto& score = st.heads[static_cast<std::size_t>(b * H + h)].score;
      for (std::int64_t r = 0; r < n; ++r) token_[static_cast<std::size_t>(r)] += score[static_cast<std::size_t>(r)];
    }
    means_.clear();
    starts_.clear();
    for (std::int64_t c0 = n_sink_; c0 < n; c0 += chunk_) {
      const std::int64_t c1 = std::min(n, c0 + chunk_);
      if (c1 > n - grace_) break;  // this chunk and all later ones hold protected rows
      float sum = 0;
      for (std::int64_t r = c0; r < c1; ++r) sum += token_[static_cast<std::size_t>(r)];
      means_.push_back(sum / static_cast<float>(c1 - c0));
      starts_.push_back(c0);
    }
    const std::int64_t best = kernels::argmin_evict(means_.data(), static_cast<std::int64_t>(means_.size()));
    VQ_ASSERT(best >= 0, "chunkkv found no evictable chunk (construction guards should prevent this)");
    const std::int64_t c0 = starts_[static_cast<std::size_t>(best)];
    return {c0, std::min(n, c0 + chunk_)};
  }

  std::int64_t chunk_;
  bool key_norm_;
  std::vector<float> token_, means_;
  std::vector<std::int64_t> starts_;
};

}  // namespace

MethodInfo chunkkv_method() { return method_card(kCard, &check, &make_policy_of<ChunkKVPolicy>); }

}  // namespace vq::detail
