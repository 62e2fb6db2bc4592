#include "engine/model/transformer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "base/kernels.h"
#include "base/validate.h"
#include "engine/compute/matmul.h"
#include "engine/compute/ops.h"
#include "engine/compute/parallel.h"
#include "veloxquant/errors.h"

namespace vq::engine {

namespace {
std::size_t sz(std::int64_t n) { return static_cast<std::size_t>(n); }

[[noreturn]] void bad_argument(const std::string& msg) {
  throw Error(ErrorCode::kInvalidArgument, "[engine] " + msg);
}
}  // namespace

ModelShape model_shape(const ModelConfig& c) {
  return ModelShape{c.n_layers, c.n_kv_heads, c.head_dim, c.n_heads};
}

RunState::RunState(const ModelConfig& c, std::int64_t chunk, std::int64_t rows)
    : max_chunk(chunk), max_rows(rows == 0 ? c.seq_len : rows) {
  // A last guard: every front end checks and names the flag or argument that sets the run's
  // context (generate --steps, eval --tokens, bench decode --context, serve --max-context, the
  // Python arguments), so reaching this is a caller's bug, reported as such.
  if (max_rows < 1 || max_rows > c.seq_len) {
    bad_argument("internal: a run's context (max_rows) " +
                 validate::int_problem(rows, 1, c.seq_len) +
                 " (1 to the model's seq_len; the caller should have refused the flag or "
                 "argument that asked for it)");
  }
  if (chunk < 1 || chunk > max_rows) {
    bad_argument("max_chunk must be in [1, " +
                 (max_rows == c.seq_len ? "seq_len = " : std::string("max_rows = ")) +
                 std::to_string(max_rows) + "], got " + std::to_string(chunk));
  }
  const std::int64_t R = max_rows, D = c.head_dim, half = D / 2;
  // One token's room: the steps size the per-token buffers to their own S (fit_tokens).
  fit_tokens(c, 1, true);
  layer_cosine.assign(sz(c.n_layers), 0.0f);
  rope_cos.resize(sz(R * half));
  rope_sin.resize(sz(R * half));
  // Frequency scaling (Llama 3's rope_freqs, linear scaling): each frequency times
  // rope_freq_scale / factor[i]. Absent (the common case) it is not applied at all, so the
  // tables stay those of the unscaled formulas bit for bit.
  const bool scaled = !c.rope_freq_factors.empty() || c.rope_freq_scale != 1.0;
  auto freq_mul = [&](std::int64_t i) {
    const double f = c.rope_freq_factors.empty() ? 1.0 : c.rope_freq_factors[sz(i)];
    return c.rope_freq_scale / f;
  };
  for (std::int64_t pos = 0; pos < R; ++pos) {
    for (std::int64_t i = 0; i < half; ++i) {
      float cs, sn;
      if (c.rope == RopeStyle::kInterleaved) {
        // run.c, in fp32: freq = 1 / 10000^(2i / D), angle = pos * freq.
        float freq = 1.0f / std::pow(static_cast<float>(c.rope_theta),
                                     static_cast<float>(2 * i) / static_cast<float>(D));
        if (scaled) freq = static_cast<float>(static_cast<double>(freq) * freq_mul(i));
        const float angle = static_cast<float>(pos) * freq;
        cs = std::cos(angle);
        sn = std::sin(angle);
      } else {
        // Hugging Face's frequencies, evaluated in double and rounded once.
        double freq = std::pow(c.rope_theta, -static_cast<double>(2 * i) / static_cast<double>(D));
        if (scaled) freq *= freq_mul(i);
        const double angle = static_cast<double>(pos) * freq;
        cs = static_cast<float>(std::cos(angle));
        sn = static_cast<float>(std::sin(angle));
      }
      rope_cos[sz(pos * half + i)] = cs;
      rope_sin[sz(pos * half + i)] = sn;
    }
  }
}

void RunState::fit_tokens(const ModelConfig& c, std::int64_t S, bool block) {
  auto fit = [S](std::vector<float>& buf, std::int64_t per_token) {
    if (buf.size() < sz(S * per_token)) buf.resize(sz(S * per_token));
  };
  fit(q, c.q_dim());
  fit(k, c.kv_dim());
  fit(v, c.kv_dim());
  fit(att_out, c.q_dim());
  if (!block) return;
  fit(x, c.dim);
  fit(xb, c.dim);
  fit(xb2, c.dim);
  fit(hb, c.hidden_dim);
  fit(hb2, c.hidden_dim);
  if (logits.empty()) logits.resize(sz(c.vocab_size));
}

void RunState::release_tokens(const ModelConfig& c) {
  auto one = [](std::vector<float>& buf, std::int64_t per_token) {
    if (buf.size() > sz(per_token)) {
      std::vector<float>(buf.begin(), buf.begin() + per_token).swap(buf);
    }
  };
  one(x, c.dim);
  one(xb, c.dim);
  one(xb2, c.dim);
  one(q, c.q_dim());
  one(k, c.kv_dim());
  one(v, c.kv_dim());
  one(att_out, c.q_dim());
  one(hb, c.hidden_dim);
  one(hb2, c.hidden_dim);
  one(logits, c.vocab_size);
  std::vector<float>().swap(att);
}

Transformer::Transformer(const Model& model, std::int64_t max_chunk, std::int64_t max_rows)
    : model_(&model), s_(model.config(), max_chunk, max_rows) {}

namespace {

using Clock = std::chrono::steady_clock;

// Adds the time since the previous mark to a StepTimes bucket (nothing when timing is off).
class Laps {
 public:
  explicit Laps(bool on) : on_(on), last_(on ? Clock::now() : Clock::time_point{}) {}
  void mark(double& bucket) {
    if (!on_) return;
    const Clock::time_point now = Clock::now();
    bucket += std::chrono::duration<double>(now - last_).count();
    last_ = now;
  }

 private:
  bool on_;
  Clock::time_point last_;
};

}  // namespace

void apply_rope(float* x, std::int64_t S, std::int64_t n_heads, std::int64_t D, std::int64_t pos0,
                RopeStyle style, const RunState& s) {
  const std::int64_t half = D / 2;
  for (std::int64_t t = 0; t < S; ++t) {
    const float* cs = s.rope_cos.data() + (pos0 + t) * half;
    const float* sn = s.rope_sin.data() + (pos0 + t) * half;
    for (std::int64_t h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * D;
      for (std::int64_t i = 0; i < half; ++i) {
        // llama2.c pairs (2i, 2i+1); Hugging Face pairs (i, i + D/2). Same rotation.
        float* a = style == RopeStyle::kInterleaved ? v + 2 * i : v + i;
        float* b = style == RopeStyle::kInterleaved ? v + 2 * i + 1 : v + i + half;
        const float x0 = *a, x1 = *b;
        *a = x0 * cs[i] - x1 * sn[i];
        *b = x0 * sn[i] + x1 * cs[i];
      }
    }
  }
}

AttentionRef Transformer::attention(std::int64_t layer, std::int64_t S, std::int64_t pos0,
                                    LayerCache& cache) {
  const ModelConfig& c = model_->config();
  const std::int64_t D = c.head_dim, Hq = c.n_heads, Hkv = c.n_kv_heads, G = Hq / Hkv;

  // The step's new rows as [B=1, Hkv, S, D] views of k, v ([S][Hkv][D] in memory).
  TensorRef kref = TensorRef::f32(s_.k.data(), 1, Hkv, S, D);
  TensorRef vref = TensorRef::f32(s_.v.data(), 1, Hkv, S, D);
  for (TensorRef* t : {&kref, &vref}) {
    t->stride[0] = S * Hkv * D;
    t->stride[1] = D;
    t->stride[2] = Hkv * D;
  }
  Laps laps(timing_);
  const StepView view = cache.begin_step(kref, vref);
  laps.mark(times_.cache);
  const std::int64_t R = view.n_rows();
  if (R > s_.max_rows || view.n_new() != S) {
    try {
      cache.end_step();  // leave the cache usable; an attention-sourced method refuses, and stays
                         // open
    } catch (const Error&) {
    }
    throw Error(ErrorCode::kInvalidState,
                "[engine] layer " + std::to_string(layer) + " cache returned " + std::to_string(R) +
                    " rows (" + std::to_string(view.n_new()) + " new) for a step of " +
                    std::to_string(S) + " tokens; at most " + std::to_string(s_.max_rows) + " fit");
  }

  // The probabilities [Hq][S][R] exist only for a cache that reads them; otherwise the cache
  // gets their shape with no data (LayerCache::end_step's contract).
  const bool keep_probs = cache.reads_attention();
  float* att = nullptr;
  if (keep_probs) {
    if (s_.att.size() < sz(Hq * S * R)) s_.att.resize(sz(Hq * S * R));
    att = s_.att.data();
  }
  const float scale = std::sqrt(static_cast<float>(D));  // scores are q.k / sqrt(D), as run.c

  // Tiled: a unit is T query tokens of one KV head's G query heads (TG queries), whose scores
  // over the head's rows are computed together, so each key and value row is read once per
  // tile instead of once per query. Every element is still computed as the per-query
  // definition computes it (ops::attention_scores, ops::softmax, ops::attention_values: the
  // same dot order, the same two-pass softmax over the whole row, the same partial sums); only
  // the order in which rows are visited across queries changes, so the result is bit-identical
  // to one query at a time and memory is O(TG * R) per thread.
  const std::int64_t T = std::min(S, RunState::tile_tokens(G)), TG = T * G;
  const std::int64_t n_tiles = (S + T - 1) / T, n_units = Hkv * n_tiles;
  const int nt =
      static_cast<int>(std::min<std::int64_t>(S * R * D * G >= 4096 ? threads() : 1, n_units));
  if (s_.att_scratch.size() < sz(nt)) s_.att_scratch.resize(sz(nt));
  for (int i = 0; i < nt; ++i) {
    RunState::AttentionScratch& w = s_.att_scratch[sz(i)];
    if (w.scores.size() < sz(TG * R)) w.scores.resize(sz(TG * R));
    if (w.q.size() < sz(TG * D)) {
      w.q.resize(sz(TG * D));
      w.pos.resize(sz(TG));
      w.sums.resize(sz(TG * 4 * D));
    }
    if (w.packed_sums.size() < sz(G * 8 * D)) w.packed_sums.resize(sz(G * 8 * D));
    if (w.row.size() < sz(D)) w.row.resize(sz(D));
  }
  // Thread i takes units [n_units * i / nt, n_units * (i + 1) / nt) with scratch i; a unit
  // writes its own tokens' outputs and probability rows, whichever thread runs it.
  parallel_for(nt, nt, [&](std::int64_t i0, std::int64_t i1) {
    for (std::int64_t i = i0; i < i1; ++i) {
      RunState::AttentionScratch& w = s_.att_scratch[sz(i)];
      for (std::int64_t u = n_units * i / nt; u < n_units * (i + 1) / nt; ++u) {
        attend_tile(view.head(0, u / n_tiles), u / n_tiles, (u % n_tiles) * T, T, S, R, pos0, scale,
                    att, w);
      }
    }
  });
  laps.mark(times_.attention);
  // The probabilities for the cache ([B=1, Hq, S, R]; masked entries are exactly 0), or their
  // shape alone; the caller closes the step with them once the layer's similarity signal is
  // known.
  return AttentionRef{att, 1, Hq, S, R};
}

void Transformer::attend_tile(const HeadRows& hr, std::int64_t g, std::int64_t t0, std::int64_t T,
                              std::int64_t S, std::int64_t R, std::int64_t pos0, float scale,
                              float* att, RunState::AttentionScratch& w) {
  const ModelConfig& c = model_->config();
  const std::int64_t D = c.head_dim, G = c.n_heads / c.n_kv_heads, qd = c.q_dim();
  const std::int64_t nt = std::min(T, S - t0), nq = nt * G;  // this tile's tokens, queries
  // The head's own rows: with head-wise budgets a head may hold fewer than R, and the columns
  // past its rows stay 0 (AttentionRef's contract).
  const std::int64_t n = hr.n_rows;
  // Query j = tl * G + h: token t0 + tl (position pos0 + t0 + tl), query head g * G + h.
  for (std::int64_t tl = 0; tl < nt; ++tl) {
    std::copy_n(s_.q.data() + (t0 + tl) * qd + g * G * D, G * D, w.q.data() + tl * G * D);
    for (std::int64_t h = 0; h < G; ++h) w.pos[sz(tl * G + h)] = pos0 + t0 + tl;
  }
  const std::int64_t last = pos0 + t0 + nt - 1;  // the tile's last position
  float* scores = w.scores.data();               // [nq][R]
  // Scores of every query over the rows the tile's last token sees (a score does not depend on
  // the position it is masked at), then each query's own mask: the rows past its position are
  // -inf, as ops::attention_scores writes them for that query alone.
  if (hr.packed == nullptr) {
    ops::attention_scores(w.q.data(), nq, D, hr.keys, hr.dtype, hr.row_stride, hr.positions, n,
                          last, scores, R, w.row.data());
  } else {
    hr.packed->attend_scores(w.q.data(), nq, last, scores, R);
  }
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (std::int64_t j = 0; j < nq; ++j) {
    float* p = scores + j * R;
    const std::int64_t pj = w.pos[sz(j)];
    if (pj < last) {
      for (std::int64_t r = 0; r < n; ++r) {
        if (hr.positions[r] > pj) p[r] = neg_inf;
      }
    }
    ops::softmax(p, n, scale);
  }
  if (att != nullptr) {
    // The probability rows the cache reads: head g * G + h, token t at ((g*G + h) * S + t) * R.
    for (std::int64_t tl = 0; tl < nt; ++tl) {
      for (std::int64_t h = 0; h < G; ++h) {
        float* dst = att + ((g * G + h) * S + t0 + tl) * R;
        std::copy_n(scores + (tl * G + h) * R, n, dst);
        std::fill(dst + n, dst + R, 0.0f);
      }
    }
  }
  float* out = s_.att_out.data() + g * G * D;  // token t's G heads at out + t * qd
  if (hr.packed == nullptr) {
    // The weighted values of every query at once, each row read once per tile; each query
    // adds exactly the rows it sees, in attention_values' order.
    std::fill(w.sums.begin(), w.sums.begin() + nq * 4 * D, 0.0f);
    ops::attention_values_add_each(scores, nq, R, D, hr.values, hr.dtype, hr.row_stride,
                                   hr.positions, n, w.pos.data(), w.sums.data());
    for (std::int64_t tl = 0; tl < nt; ++tl) {
      ops::attention_values_finish(w.sums.data() + tl * G * 4 * D, G, D, out + (t0 + tl) * qd);
    }
    return;
  }
  // A packed (quantized) head: value sums read straight from its codes, the scales and zeros
  // folded into the probabilities (no row dequantized), one token's G queries at a time.
  for (std::int64_t tl = 0; tl < nt; ++tl) {
    hr.packed->attend_values(scores + tl * G * R, G, R, pos0 + t0 + tl, out + (t0 + tl) * qd,
                             w.packed_sums.data());
  }
}

const float* Transformer::forward(const std::int32_t* tokens, std::int64_t S, ModelCache& cache,
                                  Logits which) {
  const ModelConfig& c = model_->config();
  const Weights& w = model_->weights();
  if (S < 1 || S > s_.max_chunk) {
    bad_argument("a forward step takes 1 to " + std::to_string(s_.max_chunk) + " tokens, got " +
                 std::to_string(S));
  }
  const ModelShape& cs = cache.shape();
  if (cs.n_layers != c.n_layers || cs.n_kv_heads != c.n_kv_heads || cs.head_dim != c.head_dim ||
      cs.n_query_heads != c.n_heads) {
    bad_argument("the cache is shaped for " + std::to_string(cs.n_layers) + " layers x " +
                 std::to_string(cs.n_kv_heads) + " KV heads x head_dim " +
                 std::to_string(cs.head_dim) + ", the model needs " + std::to_string(c.n_layers) +
                 " x " + std::to_string(c.n_kv_heads) + " x " + std::to_string(c.head_dim));
  }
  const std::int64_t pos0 = cache.layer(0).tokens_seen();
  if (pos0 + S > c.seq_len) {
    bad_argument("position " + std::to_string(pos0 + S - 1) +
                 " is past the model's context (seq_len " + std::to_string(c.seq_len) + ")");
  }
  if (pos0 + S > s_.max_rows) {
    bad_argument("position " + std::to_string(pos0 + S - 1) +
                 " is past this transformer's max_rows (" + std::to_string(s_.max_rows) + ")");
  }
  s_.fit_tokens(c, S, true);
  Laps laps(timing_);
  const std::int64_t dim = c.dim, hid = c.hidden_dim;
  float* x = s_.x.data();
  float* xb = s_.xb.data();
  float* xb2 = s_.xb2.data();

  // Token embeddings.
  for (std::int64_t t = 0; t < S; ++t) {
    const std::int32_t tok = tokens[t];
    if (tok < 0 || tok >= c.vocab_size) {
      bad_argument("token id " + std::to_string(tok) + " is outside the vocabulary [0, " +
                   std::to_string(c.vocab_size) + ")");
    }
    dequantize_row(w.token_embedding, tok, x + t * dim);
  }

  for (std::int64_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& lw = w.layers[sz(l)];

    // Attention block: norm, projections, RoPE, attention over the cache, output projection.
    for (std::int64_t t = 0; t < S; ++t)
      ops::rmsnorm(xb + t * dim, x + t * dim, lw.attn_norm, dim, c.norm_eps);
    laps.mark(times_.other);
    // q, k and v in one parallel loop (one barrier; x quantized once for Q8_0 weights).
    const MatmulOut qkv[] = {{s_.q.data(), &lw.wq}, {s_.k.data(), &lw.wk}, {s_.v.data(), &lw.wv}};
    matmul_fused(qkv, xb, S);
    // Qwen2's projection biases.
    const std::pair<const float*, std::pair<float*, std::int64_t>> biases[] = {
        {lw.bq, {s_.q.data(), c.q_dim()}},
        {lw.bk, {s_.k.data(), c.kv_dim()}},
        {lw.bv, {s_.v.data(), c.kv_dim()}}};
    for (const auto& [bias, out] : biases) {
      if (bias == nullptr) continue;
      for (std::int64_t t = 0; t < S; ++t) {
        float* o = out.first + t * out.second;
        for (std::int64_t i = 0; i < out.second; ++i) o[i] += bias[i];
      }
    }
    laps.mark(times_.matmul);
    apply_rope(s_.q.data(), S, c.n_heads, c.head_dim, pos0, c.rope, s_);
    apply_rope(s_.k.data(), S, c.n_kv_heads, c.head_dim, pos0, c.rope, s_);
    laps.mark(times_.attention);
    const AttentionRef probs = attention(l, S, pos0, cache.layer(l));  // times itself
    laps = Laps(timing_);
    matmul(xb2, s_.att_out.data(), lw.wo, S);
    laps.mark(times_.matmul);

    // Residual add, and how far the attention turned the hidden state (cosine, mean over S).
    double cos_sum = 0.0;
    for (std::int64_t t = 0; t < S; ++t) {
      float* xt = x + t * dim;
      float* yt = xb + t * dim;
      for (std::int64_t i = 0; i < dim; ++i) yt[i] = xt[i] + xb2[t * dim + i];
      cos_sum += kernels::cosine(xt, yt, dim);
      std::memcpy(xt, yt, sz(dim) * sizeof(float));
    }
    s_.layer_cosine[sz(l)] = static_cast<float>(cos_sum / static_cast<double>(S));
    // SqueezeAttention's signal goes to the cache before the layer's step closes; then the cache
    // gets this step's attention probabilities and applies its budget.
    laps.mark(times_.other);
    cache.observe_layer_similarity(l, cos_sum / static_cast<double>(S));
    cache.layer(l).end_step(&probs);
    laps.mark(times_.cache);

    // Feed-forward block: x += W2 (silu(W1 xb) * W3 xb).
    for (std::int64_t t = 0; t < S; ++t)
      ops::rmsnorm(xb + t * dim, x + t * dim, lw.ffn_norm, dim, c.norm_eps);
    laps.mark(times_.other);
    const MatmulOut gate_up[] = {{s_.hb.data(), &lw.w_gate}, {s_.hb2.data(), &lw.w_up}};
    matmul_fused(gate_up, xb, S);
    laps.mark(times_.matmul);
    ops::swiglu(s_.hb.data(), s_.hb2.data(), S * hid);
    laps.mark(times_.other);
    matmul(xb, s_.hb.data(), lw.w_down, S);
    laps.mark(times_.matmul);
    for (std::int64_t i = 0; i < S * dim; ++i) x[i] += xb[i];
  }

  // Final norm and classifier, for every token or only the last.
  const std::int64_t first = which == Logits::kAll ? 0 : S - 1;
  for (std::int64_t t = first; t < S; ++t)
    ops::rmsnorm(xb + t * dim, x + t * dim, w.final_norm, dim, c.norm_eps);
  laps.mark(times_.other);
  const auto n_logits = sz((S - first) * c.vocab_size);
  if (s_.logits.size() < n_logits) s_.logits.resize(n_logits);
  matmul(s_.logits.data(), xb + first * dim, w.classifier, S - first);
  laps.mark(times_.matmul);
  if (timing_) ++times_.steps;
  return s_.logits.data();
}

}  // namespace vq::engine
