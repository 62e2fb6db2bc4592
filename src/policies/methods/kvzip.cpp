// kvzip: after a prompt, keep the rows the model attends to most while it is teacher-forced to
// repeat the prompt (context reconstruction); query-agnostic, decided once per prompt.
//
// Paper: Kim et al., "KVzip: Query-Agnostic KV Cache Compression with Context Reconstruction",
// 2025 (arXiv 2505.23416); kvpress: KVzipPress.
//
// Rule: the engine prefills the prompt with the full cache (set_reconstruction(true): multi-token
// steps keep every row), then runs the reconstruction input -- a repeat instruction followed by
// the context's own tokens, in chunks of kvzip_chunk context tokens -- one step per chunk over
// the cache (LayerCache::end_reconstruction_step): each reconstruction query attends to the
// stored rows and causally to the chunk's tokens before it, and a stored row's score becomes the
// max of its score so far and, over the chunk's queries t and the query heads q of its KV group,
// of the probability p[q][t][row]. The chunk's own rows are forgotten. compress() then cuts:
// each head keeps its kvzip_n_sink sinks and the (budget - n_sink) rows of highest score
// (uniform), or, with headwise=true (the default), the layer's n_kv_heads x budget rows are
// shared among its heads by one ranking of the scores (policies/headwise.h, floor
// headwise_floor = 0 by default: KVzip uses no per-head safeguard). Ranks: highest first, ties
// to the lowest index, NaN never wins a keep. Survivors stay in position order. Single-token
// steps (decode) append without eviction; every stored row is a candidate of the next cut.
// Without the pass (set_reconstruction off: update(), engines that do not run it) a multi-token
// step is cut at once by the prompt's own attention in place of its reconstruction: source =
// attention, the max over the step's queries and the group's query heads of the probabilities
// the step passes; proxy, the max over the step's rows r >= i, as queries by their keys, of
// softmax_i(k_i . k_r / sqrt(D)) over the rows up to r. With set_reconstruction on, a prompt
// whose pass was not run is never cut silently: compress() throws, and so does a decode step.
//
// Fields: kvzip_budget=512, kvzip_n_sink=4, kvzip_chunk=2048; shared: headwise=true,
// headwise_floor=0, source=auto (the fallback's), merge=drop, quantize/demote, seed, kv_dtype.
// Guards: n_sink < budget.
// Deviations from the paper:
//  - head-wise budgets per layer (kvpress's layerwise=True); the paper and kvpress's default
//    share one threshold across every layer and head of the model;
//  - a reconstruction query's probabilities are over the whole cache (the attention the model
//    computes); kvpress renormalises each chunk's attention over the sinks, the chunk's own
//    context rows and the repeat tokens only;
//  - the repeat instruction is plain text ("Repeat the previous context exactly."; later chunks
//    "Repeat the part of the previous context exactly, starting with" and the previous chunk's
//    last 8 tokens), without a chat template;
//  - the chunk shrinks to the positions left in the run's context (the repeat tokens take
//    positions after the prompt).
#include <algorithm>
#include <string>
#include <vector>

#include "policies/fields.h"
#include "policies/methods.h"
#include "policies/prefill_only.h"
#include "veloxquant/errors.h"

namespace vq::detail {

constexpr std::string_view kKvzipCard = R"(
id: kvzip
prefix: kvzip
summary: KVzip: after the prompt, the engine teacher-forces the model to repeat it; each row
  keeps the max attention a repeat query gives it, and the top rows stay; decode appends
paper: Kim et al., KVzip: Query-Agnostic KV Cache Compression with Context Reconstruction, 2025
disposition: drop (merge optional)
score: max attention of the context-reconstruction queries (prompt attention without the pass)
budget: head-wise per layer at prefill (decode grows)
deviations: head-wise per layer, not model-wide; probabilities over the whole cache; plain
  repeat prompt without chat template; without the engine's pass, the prompt's own attention
paper config: `kvzip:n_sink=4` with the engine's reconstruction pass (chunks of 2048)
prefill only: yes
shared defaults: headwise=true,headwise_floor=0,gqa_reduce=max
| kvzip_budget | int | 512 | [1, 16777216] | rows kept per KV head after the reconstruction cut,
  sinks included (with headwise, the layer keeps n_kv_heads x budget)
| kvzip_n_sink | int | 4 | [0, 16777216] | leading rows never evicted
| kvzip_chunk | int | 2048 | [1, 1048576] | context tokens per reconstruction step of the
  engine's pass
attention: yes
)";

namespace {

class KvzipPolicy final : public PrefillOnlyPolicy {
 public:
  explicit KvzipPolicy(const PolicyContext& ctx)
      : PrefillOnlyPolicy(ctx), chunk_(ctx.config.get_int("kvzip_chunk")) {}

  bool reads_reconstruction() const noexcept override { return true; }
  std::int64_t reconstruction_chunk() const noexcept override { return chunk_; }

  void end_step(LayerState& st, const AttentionRef* /*attention*/) override {
    const bool prompt = st.step_new > 1;
    if (st.reconstruction && !prompt && pending_) {
      // Nothing decided yet: the cache rolls the step back.
      throw Error(ErrorCode::kInvalidState,
                  "[kvzip] a single-token step came while the prompt's rows wait for the "
                  "reconstruction pass: run it (end_reconstruction_step) and call compress() "
                  "(C: vq_layer_compress) before decoding");
    }
    open_live(st);
    for (std::int64_t j = 0; j < st.step_new; ++j) {
      for (HeadState& hs : st.heads) push_row(hs, hs.prev + j, 0.0f);
    }
    if (prompt && !st.reconstruction) {
      for (std::int64_t i = 0; i < st.n_heads_total(); ++i) {
        HeadCtx h = ctx(st, i);
        prompt_scores(h);
      }
      cut(st, budget_);
    } else {
      for (std::int64_t i = 0; i < st.n_heads_total(); ++i) settle(st, i);
    }
    commit_live(st);
    if (prompt && st.reconstruction) {
      pending_ = true;
      observed_ = false;
    }
  }

  void observe_reconstruction(LayerState& st, const AttentionRef& a) override {
    const std::int64_t H = st.shape.n_kv_heads, Hq = a.n_query_heads, S = a.n_queries;
    const std::int64_t R = a.n_rows, g = Hq / H;
    for (std::int64_t b = 0; b < st.batch; ++b) {
      for (std::int64_t kv = 0; kv < H; ++kv) {
        HeadState& hs = st.heads[static_cast<std::size_t>(b * H + kv)];
        // The method's stored rows (physical rows 0 .. n-1, before the step's own).
        const std::int64_t n = static_cast<std::int64_t>(hs.score.size());
        float* score = hs.score.data();
        for (std::int64_t q = kv * g; q < (kv + 1) * g; ++q) {
          for (std::int64_t t = 0; t < S; ++t) {
            const float* p = a.data + ((b * Hq + q) * S + t) * R;
            for (std::int64_t j = 0; j < n; ++j) score[j] = std::max(score[j], p[j]);
          }
        }
      }
    }
    observed_ = true;
  }

  void compress(LayerState& st) override {
    if (!st.reconstruction || !pending_) return;
    if (!observed_) {
      throw Error(ErrorCode::kInvalidState,
                  "[kvzip] compress: the prompt's rows wait for a reconstruction pass and no "
                  "reconstruction step was observed since the prompt (run the pass: begin_step + "
                  "end_reconstruction_step per chunk); nothing was cut");
    }
    cut_stored(st, budget_);
    pending_ = observed_ = false;
  }

  void on_reset(LayerState& /*st*/) override { pending_ = observed_ = false; }
  bool awaits_compress(const LayerState& st) const noexcept override {
    return st.reconstruction && pending_;
  }
  void state(StateIO& io, LayerState& /*st*/) override {
    io.value(pending_, "kvzip pending prompt");
    io.value(observed_, "kvzip observed reconstruction");
  }

 protected:
  // Each head keeps its sinks and the (keep - n_sink) candidates of highest score.
  void select(HeadCtx& h, std::int64_t keep) override {
    keep_top(h, h.hs.score.data(), n_sink_, h.n_live(), keep - n_sink_);
  }

 private:
  HeadCtx ctx(LayerState& st, std::int64_t i) {
    return HeadCtx{st, st.heads[static_cast<std::size_t>(i)], i, st.shape.head_dim,
                   st.rngs[static_cast<std::size_t>(st.kv_head_of(i))]};
  }

  // The fallback without the pass: the step's own queries stand in for the reconstruction's
  // (live is the identity during the step: live index = physical row).
  void prompt_scores(HeadCtx& h) {
    const std::int64_t n = h.n_live(), S = h.st.step_new, first = n - S;
    float* score = h.hs.score.data();
    if (source_.attention() && h.st.attention != nullptr) {
      const AttentionRef& a = *h.st.attention;
      const std::int64_t H = h.st.shape.n_kv_heads, Hq = a.n_query_heads, R = a.n_rows;
      const std::int64_t g = Hq / H, b = h.index / H, kv = h.index % H;
      for (std::int64_t q = kv * g; q < (kv + 1) * g; ++q) {
        for (std::int64_t t = 0; t < S; ++t) {
          const float* p = a.data + ((b * Hq + q) * S + t) * R;
          for (std::int64_t j = 0; j < n; ++j) score[j] = std::max(score[j], p[j]);
        }
      }
      return;
    }
    weights_.resize(static_cast<std::size_t>(n));
    for (std::int64_t r = first; r < n; ++r) {
      proxy_weights(h, key_of(h, r), r + 1, weights_.data());
      for (std::int64_t j = 0; j <= r; ++j) {
        score[j] = std::max(score[j], weights_[static_cast<std::size_t>(j)]);
      }
    }
  }

  std::int64_t chunk_;
  bool pending_ = false;   // a prompt's rows wait for compress() (set_reconstruction on)
  bool observed_ = false;  // a reconstruction step was observed since that prompt
};

// n_sink < budget; gqa_reduce (a shared field of the attention-scored methods) is max, the
// rule's fold over the query group (the card's shared default), and no other value is taken.
void check(const CacheConfig& c) {
  check_sink_below_budget(c);
  if (c.is_set("gqa_reduce")) {
    config_error(c, "gqa_reduce must be max: kvzip takes the max of the attention over the KV "
                    "head's query heads (the paper's rule), got " + c.get_enum("gqa_reduce"));
  }
}

}  // namespace

MethodInfo kvzip_method() {
  return method_card(kKvzipCard, &check, &make_policy_of<KvzipPolicy>);
}

}  // namespace vq::detail
