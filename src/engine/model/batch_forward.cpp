#include "engine/model/batch_forward.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "base/kernels.h"
#include "engine/compute/matmul.h"
#include "engine/compute/ops.h"
#include "veloxquant/errors.h"

namespace vq::engine {

namespace {
std::size_t sz(std::int64_t n) { return static_cast<std::size_t>(n); }

[[noreturn]] void bad_argument(const std::string& msg) {
  throw Error(ErrorCode::kInvalidArgument, "[batch forward] " + msg);
}

}  // namespace

BatchForward::BatchForward(const Model& model, std::int64_t max_tokens, std::int64_t max_chunk,
                           std::int64_t max_rows)
    : model_(&model),
      max_tokens_(max_tokens),
      max_chunk_(max_chunk),
      attn_(model, max_chunk, max_rows) {  // RunState checks max_chunk and max_rows
  if (max_tokens < 1 || max_chunk < 1 || max_chunk > max_tokens) {
    bad_argument("max_tokens must be >= 1 and max_chunk in [1, max_tokens], got max_tokens " +
                 std::to_string(max_tokens) + ", max_chunk " + std::to_string(max_chunk));
  }
  const ModelConfig& c = model.config();
  // The attention's own per-token buffers for one sequence's chunk (the rest are ours, below).
  attn_.s_.fit_tokens(c, max_chunk, false);
  const std::int64_t T = max_tokens;
  x_.resize(sz(T * c.dim));
  xb_.resize(sz(T * c.dim));
  xb2_.resize(sz(T * c.dim));
  q_.resize(sz(T * c.q_dim()));
  k_.resize(sz(T * c.kv_dim()));
  v_.resize(sz(T * c.kv_dim()));
  att_out_.resize(sz(T * c.q_dim()));
  hb_.resize(sz(T * c.hidden_dim));
  hb2_.resize(sz(T * c.hidden_dim));
}

const float* BatchForward::logits(std::size_t i) const {
  if (i >= logit_row_.size() || logit_row_[i] < 0) {
    bad_argument("item " + std::to_string(i) + " asked for no logits in the last step");
  }
  return logits_.data() + logit_row_[i] * model_->config().vocab_size;
}

void BatchForward::forward(std::span<const BatchItem> items) {
  const ModelConfig& c = model_->config();
  const Weights& w = model_->weights();
  const std::size_t B = items.size();
  if (B == 0) bad_argument("a step needs at least one sequence");
  // Checks first, so that no cache begins a step when the step is refused.
  std::vector<std::int64_t> row0(B), pos0(B);
  std::int64_t T = 0;
  for (std::size_t i = 0; i < B; ++i) {
    const BatchItem& it = items[i];
    if (it.cache == nullptr || it.tokens == nullptr) bad_argument("item without tokens or cache");
    if (it.n < 1 || it.n > max_chunk_) {
      bad_argument("a sequence takes 1 to " + std::to_string(max_chunk_) + " tokens a step, got " +
                   std::to_string(it.n));
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (items[j].cache == it.cache) bad_argument("the same cache appears twice in one step");
    }
    const ModelShape& cs = it.cache->shape();
    if (cs.n_layers != c.n_layers || cs.n_kv_heads != c.n_kv_heads ||
        cs.head_dim != c.head_dim || cs.n_query_heads != c.n_heads) {
      bad_argument("a cache is shaped for another model");
    }
    pos0[i] = it.cache->layer(0).tokens_seen();
    if (pos0[i] + it.n > max_rows()) {
      bad_argument("position " + std::to_string(pos0[i] + it.n - 1) + " is past max_rows (" +
                   std::to_string(max_rows()) + ")");
    }
    for (std::int64_t t = 0; t < it.n; ++t) {
      if (it.tokens[t] < 0 || it.tokens[t] >= c.vocab_size) {
        bad_argument("token id " + std::to_string(it.tokens[t]) +
                     " is outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
      }
    }
    row0[i] = T;
    T += it.n;
  }
  if (T > max_tokens_) {
    bad_argument("a step takes at most " + std::to_string(max_tokens_) + " tokens, got " +
                 std::to_string(T));
  }
  const std::int64_t dim = c.dim, hid = c.hidden_dim, qd = c.q_dim(), kvd = c.kv_dim();
  float* x = x_.data();
  float* xb = xb_.data();
  float* xb2 = xb2_.data();
  for (std::size_t i = 0; i < B; ++i) {
    for (std::int64_t t = 0; t < items[i].n; ++t)
      dequantize_row(w.token_embedding, items[i].tokens[t], x + (row0[i] + t) * dim);
  }
  probs_.resize(std::max(probs_.size(), B));
  refs_.resize(B);
  RunState& as = attn_.s_;

  for (std::int64_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& lw = w.layers[sz(l)];
    for (std::int64_t t = 0; t < T; ++t)
      ops::rmsnorm(xb + t * dim, x + t * dim, lw.attn_norm, dim, c.norm_eps);
    const MatmulOut qkv[] = {{q_.data(), &lw.wq}, {k_.data(), &lw.wk}, {v_.data(), &lw.wv}};
    matmul_fused(qkv, xb, T);
    // Per sequence: RoPE at its positions, attention over its own cache (Transformer's code).
    for (std::size_t i = 0; i < B; ++i) {
      const std::int64_t n = items[i].n, r0 = row0[i];
      apply_rope(q_.data() + r0 * qd, n, c.n_heads, c.head_dim, pos0[i], c.rope, as);
      apply_rope(k_.data() + r0 * kvd, n, c.n_kv_heads, c.head_dim, pos0[i], c.rope, as);
      std::memcpy(as.q.data(), q_.data() + r0 * qd, sz(n * qd) * sizeof(float));
      std::memcpy(as.k.data(), k_.data() + r0 * kvd, sz(n * kvd) * sizeof(float));
      std::memcpy(as.v.data(), v_.data() + r0 * kvd, sz(n * kvd) * sizeof(float));
      const AttentionRef a = attn_.attention(l, n, pos0[i], items[i].cache->layer(l));
      // A cache that reads the probabilities gets its own copy (the next sequence's attention
      // reuses the transformer's buffer); one that reads none gets their shape alone.
      refs_[i] = a;
      if (a.data != nullptr) {
        const std::size_t count = sz(a.n_query_heads * a.n_queries * a.n_rows);
        std::vector<float>& p = probs_[i];
        if (p.size() < count) p.resize(count);
        std::copy(a.data, a.data + count, p.begin());
        refs_[i].data = p.data();
      }
      std::memcpy(att_out_.data() + r0 * qd, as.att_out.data(), sz(n * qd) * sizeof(float));
    }
    matmul(xb2, att_out_.data(), lw.wo, T);
    // Residual add and the layer-similarity signal per sequence (mean over its tokens), then
    // each cache closes its step with its own probabilities.
    for (std::size_t i = 0; i < B; ++i) {
      double cos_sum = 0.0;
      for (std::int64_t t = row0[i]; t < row0[i] + items[i].n; ++t) {
        float* xt = x + t * dim;
        float* yt = xb + t * dim;
        for (std::int64_t j = 0; j < dim; ++j) yt[j] = xt[j] + xb2[t * dim + j];
        cos_sum += kernels::cosine(xt, yt, dim);
        std::memcpy(xt, yt, sz(dim) * sizeof(float));
      }
      ModelCache& cache = *items[i].cache;
      cache.observe_layer_similarity(l, cos_sum / static_cast<double>(items[i].n));
      cache.layer(l).end_step(&refs_[i]);
    }
    for (std::int64_t t = 0; t < T; ++t)
      ops::rmsnorm(xb + t * dim, x + t * dim, lw.ffn_norm, dim, c.norm_eps);
    const MatmulOut gate_up[] = {{hb_.data(), &lw.w_gate}, {hb2_.data(), &lw.w_up}};
    matmul_fused(gate_up, xb, T);
    ops::swiglu(hb_.data(), hb2_.data(), T * hid);
    matmul(xb, hb_.data(), lw.w_down, T);
    for (std::int64_t j = 0; j < T * dim; ++j) x[j] += xb[j];
  }

  // Final norm and classifier over the last token of each sequence that wants logits.
  logit_row_.assign(B, -1);
  std::int64_t nl = 0;
  for (std::size_t i = 0; i < B; ++i) {
    if (!items[i].want_logits) continue;
    const std::int64_t t = row0[i] + items[i].n - 1;
    ops::rmsnorm(xb + nl * dim, x + t * dim, w.final_norm, dim, c.norm_eps);
    logit_row_[i] = nl++;
  }
  if (nl > 0) {
    if (logits_.size() < sz(nl * c.vocab_size)) logits_.resize(sz(nl * c.vocab_size));
    matmul(logits_.data(), xb, w.classifier, nl);
  }
}

}  // namespace vq::engine
