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
  fit_tokens(c, 1);
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
  // The same frequencies for a cache that rotates queries itself (LayerCache::set_rope).
  rope_inv_freq = engine::rope_inv_freq(c);
}

void RunState::fit_tokens(const ModelConfig& c, std::int64_t T) {
  auto fit = [T](std::vector<float>& buf, std::int64_t per_token) {
    if (buf.size() < sz(T * per_token)) buf.resize(sz(T * per_token));
  };
  fit(x, c.dim);
  fit(xb, c.dim);
  fit(xb2, c.dim);
  fit(q, c.q_dim());
  fit(k, c.kv_dim());
  fit(v, c.kv_dim());
  fit(att_out, c.q_dim());
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
  std::vector<float>().swap(q_pre);
  std::vector<float>().swap(att);
}

Transformer::Transformer(const Model& model, std::int64_t max_chunk, std::int64_t max_rows,
                         std::int64_t max_tokens)
    : model_(&model),
      s_(model.config(), max_chunk, max_rows),  // checks max_chunk and max_rows
      max_tokens_(max_tokens == 0 ? max_chunk : max_tokens) {
  if (max_tokens_ < max_chunk) {
    bad_argument("max_tokens must be 0 (max_chunk) or at least max_chunk (" +
                 std::to_string(max_chunk) + "), got " + std::to_string(max_tokens));
  }
}

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

std::vector<float> rope_inv_freq(const ModelConfig& c) {
  const std::int64_t D = c.head_dim, half = D / 2;
  const bool scaled = !c.rope_freq_factors.empty() || c.rope_freq_scale != 1.0;
  std::vector<float> out(sz(half));
  for (std::int64_t i = 0; i < half; ++i) {
    const double mul =
        c.rope_freq_scale / (c.rope_freq_factors.empty() ? 1.0 : c.rope_freq_factors[sz(i)]);
    if (c.rope == RopeStyle::kInterleaved) {  // as the tables: fp32 power, then the scaling
      float freq = 1.0f / std::pow(static_cast<float>(c.rope_theta),
                                   static_cast<float>(2 * i) / static_cast<float>(D));
      if (scaled) freq = static_cast<float>(static_cast<double>(freq) * mul);
      out[sz(i)] = freq;
    } else {
      double freq = std::pow(c.rope_theta, -static_cast<double>(2 * i) / static_cast<double>(D));
      if (scaled) freq *= mul;
      out[sz(i)] = static_cast<float>(freq);
    }
  }
  return out;
}

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

AttentionRef Transformer::attention(std::int64_t layer, std::int64_t S, std::int64_t r0,
                                    std::int64_t pos0, LayerCache& cache, std::int64_t& att_at) {
  const ModelConfig& c = model_->config();
  const std::int64_t D = c.head_dim, Hq = c.n_heads, Hkv = c.n_kv_heads, G = Hq / Hkv;
  const float* q = s_.q.data() + r0 * c.q_dim();
  float* out = s_.att_out.data() + r0 * c.q_dim();

  // The sequence's new rows as [B=1, Hkv, S, D] views of its rows of k, v ([S][Hkv][D] in
  // memory).
  TensorRef kref = TensorRef::f32(s_.k.data() + r0 * c.kv_dim(), 1, Hkv, S, D);
  TensorRef vref = TensorRef::f32(s_.v.data() + r0 * c.kv_dim(), 1, Hkv, S, D);
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

  // The probabilities [Hq][S][R] exist only for a cache that reads them, in s_.att after the
  // step's earlier sequences' (growing it may move theirs: the caller points the refs once all
  // are written); otherwise the cache gets their shape with no data (LayerCache::end_step's
  // contract).
  float* att = nullptr;
  if (cache.reads_attention() || reconstructing_) {
    if (s_.att.size() < sz(att_at + Hq * S * R)) s_.att.resize(sz(att_at + Hq * S * R));
    att = s_.att.data() + att_at;
    att_at += Hq * S * R;
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
                    q, out, att, w);
      }
    }
  });
  laps.mark(times_.attention);
  // The probabilities' shape for the cache ([B=1, Hq, S, R]; masked entries are exactly 0); the
  // caller points it at them and closes the step once the layer's similarity signal is known.
  return AttentionRef{nullptr, 1, Hq, S, R};
}

void Transformer::attend_tile(const HeadRows& hr, std::int64_t g, std::int64_t t0, std::int64_t T,
                              std::int64_t S, std::int64_t R, std::int64_t pos0, float scale,
                              const float* q, float* out_q, float* att,
                              RunState::AttentionScratch& w) {
  const ModelConfig& c = model_->config();
  const std::int64_t D = c.head_dim, G = c.n_heads / c.n_kv_heads, qd = c.q_dim();
  const std::int64_t nt = std::min(T, S - t0), nq = nt * G;  // this tile's tokens, queries
  // The head's own rows: with head-wise budgets a head may hold fewer than R, and the columns
  // past its rows stay 0 (AttentionRef's contract).
  const std::int64_t n = hr.n_rows;
  // Query j = tl * G + h: token t0 + tl (position pos0 + t0 + tl), query head g * G + h.
  for (std::int64_t tl = 0; tl < nt; ++tl) {
    std::copy_n(q + (t0 + tl) * qd + g * G * D, G * D, w.q.data() + tl * G * D);
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
  float* out = out_q + g * G * D;  // token t's G heads at out + t * qd
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

std::int64_t Transformer::check_step(std::span<const BatchItem> items) {
  const ModelConfig& c = model_->config();
  const std::size_t B = items.size();
  if (B == 0) bad_argument("a forward step needs at least one sequence");
  // A batch of one reads as a plain forward step; in a batch, a message names the sequence.
  auto where = [B](std::size_t i) {
    return B == 1 ? std::string() : "sequence " + std::to_string(i) + " of the step: ";
  };
  if (row0_.size() < B) {
    row0_.resize(B);
    pos0_.resize(B);
    att_at_.resize(B);
    logit_row_.resize(B);
    refs_.resize(B);
    qrefs_.resize(B);
  }
  std::int64_t T = 0;
  for (std::size_t i = 0; i < B; ++i) {
    const BatchItem& it = items[i];
    if (it.tokens == nullptr || it.cache == nullptr) bad_argument(where(i) + "no tokens or cache");
    if (it.n < 1 || it.n > s_.max_chunk) {
      bad_argument(where(i) + "a forward step takes 1 to " + std::to_string(s_.max_chunk) +
                   " tokens, got " + std::to_string(it.n));
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (items[j].cache == it.cache) {
        bad_argument("sequences " + std::to_string(j) + " and " + std::to_string(i) +
                     " of the step have the same cache");
      }
    }
    const ModelShape& cs = it.cache->shape();
    if (cs.n_layers != c.n_layers || cs.n_kv_heads != c.n_kv_heads ||
        cs.head_dim != c.head_dim || cs.n_query_heads != c.n_heads) {
      bad_argument(where(i) + "the cache is shaped for " + std::to_string(cs.n_layers) +
                   " layers x " + std::to_string(cs.n_kv_heads) + " KV heads x head_dim " +
                   std::to_string(cs.head_dim) + ", the model needs " +
                   std::to_string(c.n_layers) + " x " + std::to_string(c.n_kv_heads) + " x " +
                   std::to_string(c.head_dim));
    }
    const std::int64_t pos0 = it.cache->layer(0).tokens_seen(), last = pos0 + it.n - 1;
    if (last >= c.seq_len) {
      bad_argument(where(i) + "position " + std::to_string(last) +
                   " is past the model's context (seq_len " + std::to_string(c.seq_len) + ")");
    }
    if (last >= s_.max_rows) {
      bad_argument(where(i) + "position " + std::to_string(last) +
                   " is past this transformer's max_rows (" + std::to_string(s_.max_rows) + ")");
    }
    for (std::int64_t t = 0; t < it.n; ++t) {
      if (it.tokens[t] < 0 || it.tokens[t] >= c.vocab_size) {
        bad_argument(where(i) + "token id " + std::to_string(it.tokens[t]) +
                     " is outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
      }
    }
    row0_[i] = T;
    pos0_[i] = pos0;
    T += it.n;
  }
  if (T > max_tokens_) {
    bad_argument("a step takes at most " + std::to_string(max_tokens_) +
                 " tokens over its sequences, got " + std::to_string(T));
  }
  return T;
}

void Transformer::provide_output_gram(ModelCache& cache) {
  const ModelConfig& c = model_->config();
  const std::int64_t dim = c.dim, qd = c.q_dim(), D = c.head_dim, Hq = c.n_heads;
  if (wo_gram_.empty()) {
    std::vector<std::vector<float>> grams(sz(c.n_layers));
    std::vector<float> wo(sz(dim * qd));
    for (std::int64_t l = 0; l < c.n_layers; ++l) {
      const WeightMatrix& m = model_->weights().layers[sz(l)].wo;  // [dim][q_dim]
      for (std::int64_t r = 0; r < dim; ++r) dequantize_row(m, r, wo.data() + r * qd);
      std::vector<float>& g = grams[sz(l)];
      g.resize(sz(Hq * D * D));
      parallel_for(Hq, threads(), [&](std::int64_t h0, std::int64_t h1) {
        std::vector<double> acc(sz(D * D));
        for (std::int64_t h = h0; h < h1; ++h) {
          std::fill(acc.begin(), acc.end(), 0.0);
          for (std::int64_t r = 0; r < dim; ++r) {
            const float* row = wo.data() + r * qd + h * D;
            for (std::int64_t a = 0; a < D; ++a) {
              const double x = row[a];
              for (std::int64_t b = 0; b <= a; ++b) acc[sz(a * D + b)] += x * row[b];
            }
          }
          float* out = g.data() + h * D * D;
          for (std::int64_t a = 0; a < D; ++a) {
            for (std::int64_t b = 0; b <= a; ++b) {
              out[a * D + b] = out[b * D + a] = static_cast<float>(acc[sz(a * D + b)]);
            }
          }
        }
      });
    }
    wo_gram_ = std::move(grams);
  }
  for (std::int64_t l = 0; l < c.n_layers; ++l) {
    cache.set_output_gram(l, wo_gram_[sz(l)].data(), Hq, D);
  }
}

void Transformer::forward(std::span<const BatchItem> items) {
  const ModelConfig& c = model_->config();
  const Weights& w = model_->weights();
  n_items_ = 0;  // no logits to read until this step has run
  const std::int64_t T = check_step(items);  // before any cache begins a step
  for (const BatchItem& item : items) {
    if (item.cache->reads_output_gram() && !item.cache->has_output_gram()) {
      provide_output_gram(*item.cache);
    }
  }
  const std::size_t B = items.size();
  s_.fit_tokens(c, T);
  Laps laps(timing_);
  const std::int64_t dim = c.dim, hid = c.hidden_dim, qd = c.q_dim(), kvd = c.kv_dim();
  float* x = s_.x.data();
  float* xb = s_.xb.data();
  float* xb2 = s_.xb2.data();

  // Token embeddings, the sequences' rows stacked: sequence i's token t is row row0_[i] + t.
  for (std::size_t i = 0; i < B; ++i) {
    for (std::int64_t t = 0; t < items[i].n; ++t)
      dequantize_row(w.token_embedding, items[i].tokens[t], x + (row0_[i] + t) * dim);
  }

  for (std::int64_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& lw = w.layers[sz(l)];

    // Attention block: norm, projections (+ Qwen2's biases) over every row; RoPE, attention
    // over the cache and the cache step per sequence; the output projection over every row.
    for (std::int64_t t = 0; t < T; ++t)
      ops::rmsnorm(xb + t * dim, x + t * dim, lw.attn_norm, dim, c.norm_eps);
    laps.mark(times_.other);
    // q, k and v in one parallel loop (one barrier; x quantized once for Q8_0 weights).
    const MatmulOut qkv[] = {{s_.q.data(), &lw.wq}, {s_.k.data(), &lw.wk}, {s_.v.data(), &lw.wv}};
    matmul_fused(qkv, xb, T);
    const std::pair<const float*, std::pair<float*, std::int64_t>> biases[] = {
        {lw.bq, {s_.q.data(), qd}}, {lw.bk, {s_.k.data(), kvd}}, {lw.bv, {s_.v.data(), kvd}}};
    for (const auto& [bias, out] : biases) {
      if (bias == nullptr) continue;
      for (std::int64_t t = 0; t < T; ++t) {
        float* o = out.first + t * out.second;
        for (std::int64_t j = 0; j < out.second; ++j) o[j] += bias[j];
      }
    }
    laps.mark(times_.matmul);
    // The pre-RoPE queries of the sequences whose cache reads them (expected_attention), with
    // the layer's rotary embedding given once; no other method pays for them.
    for (std::size_t i = 0; i < B; ++i) {
      if (items[i].cache->layer(l).reads_queries() && s_.q_pre.size() < sz(T * qd)) {
        s_.q_pre.resize(sz(T * qd));  // before any sequence points into it
      }
    }
    for (std::size_t i = 0; i < B; ++i) {
      LayerCache& lc = items[i].cache->layer(l);
      qrefs_[i] = TensorRef{};
      if (!lc.reads_queries()) continue;
      if (!lc.has_rope()) {
        lc.set_rope(RopeRef{s_.rope_inv_freq.data(), c.head_dim / 2,
                            c.rope == RopeStyle::kInterleaved ? RopePairing::kInterleaved
                                                              : RopePairing::kHalfSplit});
      }
      std::copy_n(s_.q.data() + row0_[i] * qd, items[i].n * qd, s_.q_pre.data() + row0_[i] * qd);
      TensorRef& qr = qrefs_[i];
      qr = TensorRef::f32(s_.q_pre.data() + row0_[i] * qd, 1, c.n_heads, items[i].n, c.head_dim);
      qr.stride[0] = items[i].n * qd;
      qr.stride[1] = c.head_dim;
      qr.stride[2] = qd;
    }
    for (std::size_t i = 0; i < B; ++i) {
      apply_rope(s_.q.data() + row0_[i] * qd, items[i].n, c.n_heads, c.head_dim, pos0_[i], c.rope,
                 s_);
      apply_rope(s_.k.data() + row0_[i] * kvd, items[i].n, c.n_kv_heads, c.head_dim, pos0_[i],
                 c.rope, s_);
    }
    if (query_tap_) query_tap_(l, s_.q.data(), T);  // calibration (set_query_tap)
    laps.mark(times_.attention);
    std::int64_t att_at = 0;
    for (std::size_t i = 0; i < B; ++i) {
      const std::int64_t at = att_at;
      refs_[i] = attention(l, items[i].n, row0_[i], pos0_[i], items[i].cache->layer(l),
                           att_at);  // times itself
      att_at_[i] = att_at > at ? at : -1;
    }
    for (std::size_t i = 0; i < B; ++i) {
      if (att_at_[i] >= 0) refs_[i].data = s_.att.data() + att_at_[i];
    }
    laps = Laps(timing_);
    matmul(xb2, s_.att_out.data(), lw.wo, T);
    laps.mark(times_.matmul);

    // Residual add, and how far the attention turned the hidden state (cosine, mean over each
    // sequence's tokens). SqueezeAttention's signal goes to each cache before its layer step
    // closes; then the cache gets its probabilities and applies its budget.
    double cos_all = 0.0;
    for (std::size_t i = 0; i < B; ++i) {
      double cos_sum = 0.0;
      for (std::int64_t t = row0_[i]; t < row0_[i] + items[i].n; ++t) {
        float* xt = x + t * dim;
        float* yt = xb + t * dim;
        for (std::int64_t j = 0; j < dim; ++j) yt[j] = xt[j] + xb2[t * dim + j];
        cos_sum += kernels::cosine(xt, yt, dim);
        std::memcpy(xt, yt, sz(dim) * sizeof(float));
      }
      cos_all += cos_sum;
      laps.mark(times_.other);
      ModelCache& cache = *items[i].cache;
      if (reconstructing_) {
        cache.layer(l).end_reconstruction_step(&refs_[i]);  // the step's rows are forgotten
        laps.mark(times_.cache);
        continue;
      }
      cache.observe_layer_similarity(l, cos_sum / static_cast<double>(items[i].n));
      cache.layer(l).end_step(&refs_[i], qrefs_[i].data != nullptr ? &qrefs_[i] : nullptr);
      laps.mark(times_.cache);
    }
    s_.layer_cosine[sz(l)] = static_cast<float>(cos_all / static_cast<double>(T));

    // Feed-forward block: x += W2 (silu(W1 xb) * W3 xb).
    for (std::int64_t t = 0; t < T; ++t)
      ops::rmsnorm(xb + t * dim, x + t * dim, lw.ffn_norm, dim, c.norm_eps);
    laps.mark(times_.other);
    const MatmulOut gate_up[] = {{s_.hb.data(), &lw.w_gate}, {s_.hb2.data(), &lw.w_up}};
    matmul_fused(gate_up, xb, T);
    laps.mark(times_.matmul);
    ops::swiglu(s_.hb.data(), s_.hb2.data(), T * hid);
    laps.mark(times_.other);
    matmul(xb, s_.hb.data(), lw.w_down, T);
    laps.mark(times_.matmul);
    for (std::int64_t j = 0; j < T * dim; ++j) x[j] += xb[j];
  }

  // Final norm and classifier over the rows the sequences asked for, gathered in order into xb.
  std::int64_t rows = 0;
  for (std::size_t i = 0; i < B; ++i) {
    logit_row_[i] = -1;
    if (items[i].logits == Logits::kNone) continue;
    logit_row_[i] = rows;
    const std::int64_t first = items[i].logits == Logits::kAll ? 0 : items[i].n - 1;
    for (std::int64_t t = row0_[i] + first; t < row0_[i] + items[i].n; ++t)
      ops::rmsnorm(xb + (rows++) * dim, x + t * dim, w.final_norm, dim, c.norm_eps);
  }
  laps.mark(times_.other);
  if (rows > 0) {
    if (s_.logits.size() < sz(rows * c.vocab_size)) s_.logits.resize(sz(rows * c.vocab_size));
    matmul(s_.logits.data(), xb, w.classifier, rows);
  }
  laps.mark(times_.matmul);
  n_items_ = B;
  if (timing_) ++times_.steps;
}

const float* Transformer::logits(std::size_t i) const {
  if (i >= n_items_ || logit_row_[i] < 0) {
    bad_argument("sequence " + std::to_string(i) + " asked for no logits in the last step");
  }
  return s_.logits.data() + logit_row_[i] * model_->config().vocab_size;
}

const float* Transformer::forward(const std::int32_t* tokens, std::int64_t S, ModelCache& cache,
                                  Logits which) {
  const BatchItem one{tokens, S, &cache, which};
  forward(std::span<const BatchItem>(&one, 1));
  return which == Logits::kNone ? nullptr : s_.logits.data();
}

double Transformer::reconstruct(const std::int32_t* context, std::int64_t n, ModelCache& cache,
                                const RepeatPrompt& prompt) {
  if (!cache.reads_reconstruction() || n < 1) return 0.0;
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  const ModelConfig& c = model_->config();
  const std::int64_t pos0 = cache.layer(0).tokens_seen();
  const std::int64_t limit = std::min({s_.max_chunk, max_tokens_, s_.max_rows - pos0,
                                       c.seq_len - pos0});
  const std::int64_t chunk = cache.reconstruction_chunk();
  std::vector<std::int32_t> step;
  struct Off {  // the steps' mode ends with the pass, also when a step throws
    bool& flag;
    ~Off() { flag = false; }
  } off{reconstructing_};
  std::int64_t start = 0;
  while (start < n) {
    if (start == 0) {
      step = prompt.first;
    } else {
      step = prompt.next;
      const std::int64_t carry = std::min(prompt.carry, start);
      step.insert(step.end(), context + start - carry, context + start);
    }
    step.insert(step.end(), prompt.suffix.begin(), prompt.suffix.end());
    const auto head = static_cast<std::int64_t>(step.size());
    const std::int64_t room = limit - head;
    if (room < 1) {
      bad_argument("the reconstruction pass needs " + std::to_string(head + 1) +
                   " positions after the prompt's " + std::to_string(pos0) +
                   " (its instruction and one context token), and " + std::to_string(limit) +
                   " are left (max_chunk " + std::to_string(s_.max_chunk) + ", max_rows " +
                   std::to_string(s_.max_rows) + ", seq_len " + std::to_string(c.seq_len) + ")");
    }
    const std::int64_t len = std::min({chunk, room, n - start});
    step.insert(step.end(), context + start, context + start + len);
    reconstructing_ = true;
    forward(step.data(), static_cast<std::int64_t>(step.size()), cache, Logits::kNone);
    reconstructing_ = false;
    start += len;
  }
  cache.compress();
  return std::chrono::duration<double>(clock::now() - t0).count();
}

}  // namespace vq::engine
