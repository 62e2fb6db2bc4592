// expected_attention: keep the rows the next queries are expected to attend to.
//
// Paper: Devoto et al., "Expected Attention: KV cache compression by estimating attention from
// future queries distribution", 2025 (NVIDIA kvpress: ExpectedAttentionPress).
//
// Rule: per (batch, KV head), the queries of its G query heads are modelled as Gaussian: mean
// mu_g and covariance Sigma_g (population, 1/n) of the layer's last ea_n_window pre-RoPE
// queries of query head g (positions >= ea_n_sink only: the sink tokens' queries are outliers,
// as kvpress drops them). The statistics are moved to the next ea_n_future positions with the
// average RoPE rotation Rbar = (1/F) sum_{j=1..F} R_{t+j} (t the newest position; R_p rotates
// pair i by p x inv_freq[i], the layer's RopeRef): mubar = Rbar mu, Sigmabar = Rbar Sigma
// Rbar^T. Row i (post-RoPE key k_i, as the cache stores it) gets, per query head g, the log of
// its expected unnormalised attention l_g(i) = mubar_g . k_i / sqrt(d) + k_i^T Sigmabar_g k_i
// / (2 d) (the Gaussian moment of exp(q.k / sqrt(d))), softmax over the non-sink live rows
// per g, averaged over the G query heads, plus ea_epsilon, times the value norm ||v_i||_2
// (ea_vnorm; without it the averaged probability alone). The first ea_n_sink rows are never
// evicted; the rest keep the highest scores (ties evict the older row).
//
// When: with the step's queries (LayerCache::end_step(&probs, &queries); the engine passes
// them), a multi-token step (a prefill chunk) is one decision: every row of the chunk is added,
// the statistics are computed from the window at the chunk's last position, and the layer cuts
// to the budget at once (kvpress's prompt compression). A single-token (decode) step adds its
// query to the window and its row, scored with the statistics in force; every ea_interval
// tokens since the last refresh the statistics are recomputed and every live row re-scored;
// then, over budget, the lowest row leaves. So the cache holds exactly the budget after every
// step, and the full re-score costs O(n Hq d^2) once per ea_interval tokens (per-step work:
// O(G d^2) for the new row and O(n G) for the softmax over the cached log-scores).
// Without queries (update(), end_step() with none: the fallback, fixed at the first step until
// reset()): the step's keys stand in for the queries (one "query head" per KV head), turned back
// to their pre-RoPE form by the inverse rotation at their position when set_rope gave the
// layer's RoPE (as they are otherwise, and then no future rotation either), and every token is
// decided on its own (a chunk equals its tokens fed one at a time).
//
// Fields: ea_budget=512, ea_n_sink=4, ea_n_future=16, ea_n_window=128, ea_interval=32,
// ea_covariance=true, ea_vnorm=true, ea_epsilon=0; shared: merge=drop (+gate, keys; the gate
// compares the expected-attention score), quantize/demote, seed, kv_dtype.
// Guards: n_sink < budget.
// Deviations from kvpress: ea_n_future defaults to 16, not 512 (on stories260K, head_dim 8 and a
// 512-token context, averaging the rotation over 64+ positions cancels the fast RoPE pairs and
// perplexity collapses: docs/methods.md); the statistics come from the last n_window queries
// (kvpress: every prompt query after the sinks; n_window=16777216 does that at a prefill
// chunk); decode has a
// rule (kvpress compresses the prompt only, or with its decoding wrapper every N steps down to a
// target): rows are scored as they come and the budget holds after every step, the statistics
// refreshed every ea_interval tokens; sinks are protected rather than scored (kvpress pads them
// with the maximum score: the same keep); later prefill chunks are scored together with the
// rows kept earlier; the keys fallback when no queries are passed.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "base/kernels.h"
#include "policies/fields.h"
#include "policies/methods.h"
#include "policies/policy.h"
#include "veloxquant/errors.h"

namespace vq::detail {

constexpr std::string_view kExpectedAttentionCard = R"(
id: expected_attention
prefix: ea
summary: Expected Attention: keep the rows future queries are expected to attend to (a Gaussian
  of the recent pre-RoPE queries rotated to the next positions), times the value norm
paper: Devoto et al., Expected Attention: KV cache compression by estimating attention from
  future queries distribution, 2025 (kvpress ExpectedAttentionPress)
disposition: drop (merge optional)
score: softmax over keys of mubar.k / sqrt(d) + k^T Sigmabar k / (2d), mean over the group,
  times the value norm
budget: uniform (prefill: one cut with the chunk's queries; decode: exact, re-scored every
  interval tokens)
deviations: 16 future positions by default (kvpress 512); statistics of the last n_window
  queries; a decode rule (re-score every interval
  tokens, budget exact); sinks protected; without queries the keys stand in for them
paper config: `expected_attention:n_future=512,n_window=16777216` (kvpress's 512 future
  positions, every prompt query after the sinks)
| ea_budget | int | 512 | [1, 16777216] | rows kept per KV head, sinks included
| ea_n_sink | int | 4 | [0, 16777216] | leading rows never evicted; their queries are left out of
  the statistics
| ea_n_future | int | 16 | [1, 1048576] | future positions the query statistics are rotated to
  (averaged rotation; kvpress: 512)
| ea_n_window | int | 128 | [1, 16777216] | most recent queries per query head the mean and
  covariance are taken over
| ea_interval | int | 32 | [1, 16777216] | tokens between two refreshes of the statistics (and
  re-scores of every row); a prefill chunk with queries always refreshes
| ea_covariance | bool | true | - | add the covariance term k^T Sigmabar k / (2d)
| ea_vnorm | bool | true | - | multiply by the value norm: (p + epsilon) x the L2 norm of v
| ea_epsilon | float | 0 | [0, 1e+06] | added to the averaged probability before the value norm
)";

namespace {

void check(const CacheConfig& c) { require_less(c, "ea_n_sink", "ea_budget"); }

class ExpectedAttentionPolicy final : public TokenPolicy {
 public:
  explicit ExpectedAttentionPolicy(const PolicyContext& ctx)
      : TokenPolicy(ctx), n_future_(ctx.config.get_int("ea_n_future")),
        window_(ctx.config.get_int("ea_n_window")), interval_(ctx.config.get_int("ea_interval")),
        covariance_(ctx.config.get_bool("ea_covariance")),
        vnorm_(ctx.config.get_bool("ea_vnorm")), epsilon_(ctx.config.get_float("ea_epsilon")) {}

  bool reads_queries() const noexcept override { return true; }
  void on_reset(LayerState& /*st*/) override { stats_.clear(); }
  void state(StateIO& io, LayerState& st) override {
    TokenPolicy::state(io, st);
    io.value(queries_, "expected_attention query source");
    const std::int64_t G = st.shape.n_kv_heads > 0 ? st.shape.n_query_heads / st.shape.n_kv_heads : 1;
    io.bounded<std::int64_t>(groups_, 1, std::max<std::int64_t>(G, 1), "expected_attention groups");
    std::uint64_t n = stats_.size();
    io.bounded<std::uint64_t>(n, 0, st.heads.size(), "expected_attention heads");
    if (io.loading()) {
      io.check(n == 0 || n == st.heads.size(),
               "expected_attention heads: expected 0 or " + std::to_string(st.heads.size()) +
                   ", found " + std::to_string(n));
      io.check(groups_ == (queries_ ? G : 1), "expected_attention groups: expected " +
                                                  std::to_string(queries_ ? G : 1));
      stats_.assign(static_cast<std::size_t>(n), Stats{});
      for (const HeadState& hs : st.heads) {
        io.check(n == 0 ? hs.score.empty() : hs.hist_stride == groups_,
                 "expected_attention: rows before the query source was resolved, or a history "
                 "stride other than the query groups");
      }
    }
    const auto d = static_cast<std::uint64_t>(st.shape.head_dim);
    const auto g = static_cast<std::uint64_t>(groups_);
    for (Stats& s : stats_) {
      io.bounded<std::int64_t>(s.held, 0, window_, "expected_attention window rows");
      io.bounded<std::int64_t>(s.next, 0, window_, "expected_attention window slot");
      io.bounded<std::int64_t>(s.since, 0, st.tokens_seen, "expected_attention tokens since refresh");
      io.value(s.valid, "expected_attention statistics valid");
      io.vec(s.window, static_cast<std::uint64_t>(window_) * g * d, "expected_attention window");
      io.vec(s.mu, g * d, "expected_attention mean");
      io.vec(s.sigma, g * d * d, "expected_attention covariance");
      if (io.loading()) {
        const bool mu_ok = s.mu.empty() || s.mu.size() == g * d;
        const bool sigma_ok = s.sigma.empty() || s.sigma.size() == g * d * d;
        const bool valid_ok = !s.valid || (s.mu.size() == g * d &&
                                           (!covariance_ || s.sigma.size() == g * d * d));
        io.check(s.window.size() == static_cast<std::uint64_t>(s.held) * g * d &&
                     s.next < std::max<std::int64_t>(window_, 1) && mu_ok && sigma_ok && valid_ok,
                 "expected_attention statistics: sizes do not match the shape");
      }
    }
  }

 protected:
  bool decides_chunk_at_once() const noexcept override { return queries_; }

  // The first step after construction or reset: the source (queries or keys) is resolved.
  void begin_step(LayerState& st) override {
    if (stats_.size() == st.heads.size()) return;
    queries_ = st.query_source == 1;
    groups_ = queries_ ? st.shape.n_query_heads / st.shape.n_kv_heads : 1;
    stats_.assign(st.heads.size(), Stats{});
    for (HeadState& hs : st.heads) {
      VQ_ASSERT(hs.score.empty(), "expected_attention resolves its source before any row");
      hs.hist_stride = groups_;
      hs.hist.clear();
    }
    rbar_pos_ = -1;
  }

  void on_token(HeadCtx& h, std::int64_t row) override {
    const LayerState& st = h.st;
    const std::int64_t d = h.head_dim;
    const std::int64_t j = row - h.hs.prev;
    const std::int64_t pos = st.tokens_seen - st.step_new + j;
    value_.resize(static_cast<std::size_t>(d));
    h.hs.store()->read_value(row, value_.data());
    double norm = 0.0;
    for (std::int64_t c = 0; c < d; ++c) norm += static_cast<double>(value_[c]) * value_[c];
    push_row(h.hs, row, 0.0f, static_cast<float>(std::sqrt(norm)));
    Stats& s = stats_[static_cast<std::size_t>(h.index)];
    if (pos >= n_sink_) push_window(h, s, j, row, pos);
    ++s.since;
    if (queries_ && st.step_new > 1) return;  // the chunk's cut refreshes (cut_head)
    if (!s.valid || s.since >= interval_) {
      refresh(h, s, pos);
    } else {
      log_scores(h, s, h.n_live() - 1);
    }
  }

  // A prefill chunk with queries: the statistics at its last position, then one cut.
  void cut_head(HeadCtx& h, std::int64_t keep) override {
    refresh(h, stats_[static_cast<std::size_t>(h.index)], h.st.tokens_seen - 1);
    cut_to(h, keep);
  }

  // Sinks protected (+inf); every other live row by its expected attention (into hs.score).
  void eviction_scores(HeadCtx& h, float* out) override {
    const std::int64_t n = h.n_live(), G = groups_;
    const float inf = std::numeric_limits<float>::infinity();
    for (std::int64_t i = 0; i < std::min(n, n_sink_); ++i) out[i] = inf;
    if (n <= n_sink_) return;
    const float* l = h.hs.hist.data();
    prob_.assign(static_cast<std::size_t>(n), 0.0);
    for (std::int64_t g = 0; g < G; ++g) {
      double m = -std::numeric_limits<double>::infinity();
      for (std::int64_t i = n_sink_; i < n; ++i) m = std::max(m, static_cast<double>(l[i * G + g]));
      double z = 0.0;
      for (std::int64_t i = n_sink_; i < n; ++i) z += std::exp(static_cast<double>(l[i * G + g]) - m);
      for (std::int64_t i = n_sink_; i < n; ++i) {
        prob_[static_cast<std::size_t>(i)] += std::exp(static_cast<double>(l[i * G + g]) - m) / z;
      }
    }
    for (std::int64_t i = n_sink_; i < n; ++i) {
      const double p = prob_[static_cast<std::size_t>(i)] / static_cast<double>(G);
      const double score =
          vnorm_ ? (p + epsilon_) * static_cast<double>(h.hs.aux[static_cast<std::size_t>(i)]) : p;
      h.hs.score[static_cast<std::size_t>(i)] = static_cast<float>(score);
      out[i] = rank_of(static_cast<float>(score));
    }
  }

 private:
  struct Stats {
    std::vector<float> window;  // ring of up to n_window entries, [entry][G][d]
    std::int64_t held = 0, next = 0;
    std::int64_t since = 0;  // tokens since the last refresh
    bool valid = false;
    std::vector<float> mu;     // [G][d] rotated mean
    std::vector<float> sigma;  // [G][d][d] rotated covariance (covariance on)
  };

  // The pair (a, b) of pair index p in a head of d elements.
  static std::int64_t pair_a(const LayerState& st, std::int64_t p, std::int64_t /*d*/) {
    return st.rope_interleaved ? 2 * p : p;
  }
  static std::int64_t pair_b(const LayerState& st, std::int64_t p, std::int64_t d) {
    return st.rope_interleaved ? 2 * p + 1 : p + d / 2;
  }
  bool rotates(const LayerState& st) const {
    return st.rope_set && !st.rope_inv_freq.empty() &&
           static_cast<std::int64_t>(st.rope_inv_freq.size()) * 2 == st.shape.head_dim;
  }

  // Appends token j's queries (or, as the fallback, its key turned back to pre-RoPE) to the
  // head's window.
  void push_window(HeadCtx& h, Stats& s, std::int64_t j, std::int64_t row, std::int64_t pos) {
    const LayerState& st = h.st;
    const std::int64_t d = h.head_dim, G = groups_;
    const std::int64_t entry = G * d;
    float* dst;
    if (s.held < window_) {
      s.window.resize(static_cast<std::size_t>((s.held + 1) * entry));
      dst = s.window.data() + s.held * entry;
      ++s.held;
    } else {
      dst = s.window.data() + s.next * entry;
      s.next = (s.next + 1) % window_;
    }
    if (queries_) {
      const TensorRef& q = *st.queries;
      const std::int64_t b = h.index / st.shape.n_kv_heads, kv = st.kv_head_of(h.index);
      const std::size_t size = dtype_size(q.dtype);
      for (std::int64_t g = 0; g < G; ++g) {
        const auto* src = static_cast<const char*>(q.data) +
                          (b * q.stride[0] + (kv * G + g) * q.stride[1] + j * q.stride[2]) *
                              static_cast<std::int64_t>(size);
        kernels::load_row(src, q.dtype, dst + g * d, d);
      }
      return;
    }
    const float* k = key_of_row(h, row);
    std::copy_n(k, d, dst);
    if (!rotates(st)) return;
    for (std::int64_t p = 0; p < d / 2; ++p) {
      const double angle = static_cast<double>(pos) * st.rope_inv_freq[static_cast<std::size_t>(p)];
      const double c = std::cos(angle), sn = std::sin(angle);
      float* a = dst + pair_a(st, p, d);
      float* bb = dst + pair_b(st, p, d);
      const double x0 = *a, x1 = *bb;
      *a = static_cast<float>(x0 * c + x1 * sn);  // R_pos^T: the inverse rotation
      *bb = static_cast<float>(-x0 * sn + x1 * c);
    }
  }

  // The averaged rotation to positions pos + 1 .. pos + n_future, per pair (cos, sin means).
  void average_rotation(const LayerState& st, std::int64_t pos) {
    if (rbar_pos_ == pos) return;
    const std::int64_t half = static_cast<std::int64_t>(st.rope_inv_freq.size());
    cbar_.assign(static_cast<std::size_t>(half), 0.0);
    sbar_.assign(static_cast<std::size_t>(half), 0.0);
    for (std::int64_t p = 0; p < half; ++p) {
      double cs = 0.0, sn = 0.0;
      for (std::int64_t f = 1; f <= n_future_; ++f) {
        const double angle = static_cast<double>(pos + f) * st.rope_inv_freq[static_cast<std::size_t>(p)];
        cs += std::cos(angle);
        sn += std::sin(angle);
      }
      cbar_[static_cast<std::size_t>(p)] = cs / static_cast<double>(n_future_);
      sbar_[static_cast<std::size_t>(p)] = sn / static_cast<double>(n_future_);
    }
    rbar_pos_ = pos;
  }

  // x <- Rbar x over the d elements at x (stride between elements `step`).
  void rotate(const LayerState& st, double* x, std::int64_t d, std::int64_t step) const {
    for (std::int64_t p = 0; p < d / 2; ++p) {
      double& a = x[pair_a(st, p, d) * step];
      double& b = x[pair_b(st, p, d) * step];
      const double c = cbar_[static_cast<std::size_t>(p)], sn = sbar_[static_cast<std::size_t>(p)];
      const double x0 = a, x1 = b;
      a = c * x0 - sn * x1;
      b = sn * x0 + c * x1;
    }
  }

  // The statistics of the window at position pos, then every live row's log-scores.
  void refresh(HeadCtx& h, Stats& s, std::int64_t pos) {
    const LayerState& st = h.st;
    const std::int64_t d = h.head_dim, G = groups_, n = s.held;
    const bool rot = rotates(st);
    if (rot) average_rotation(st, pos);
    s.mu.assign(static_cast<std::size_t>(G * d), 0.0f);
    if (covariance_) s.sigma.assign(static_cast<std::size_t>(G * d * d), 0.0f);
    mean_.resize(static_cast<std::size_t>(d));
    cov_.resize(static_cast<std::size_t>(d * d));
    for (std::int64_t g = 0; g < G; ++g) {
      std::fill(mean_.begin(), mean_.end(), 0.0);
      std::fill(cov_.begin(), cov_.end(), 0.0);
      for (std::int64_t e = 0; e < n; ++e) {
        const float* q = s.window.data() + (e * G + g) * d;
        for (std::int64_t a = 0; a < d; ++a) mean_[static_cast<std::size_t>(a)] += q[a];
      }
      if (n > 0) {
        for (double& m : mean_) m /= static_cast<double>(n);
      }
      if (covariance_ && n > 0) {
        centred_.resize(static_cast<std::size_t>(d));
        for (std::int64_t e = 0; e < n; ++e) {
          const float* q = s.window.data() + (e * G + g) * d;
          for (std::int64_t a = 0; a < d; ++a) {
            centred_[static_cast<std::size_t>(a)] = q[a] - mean_[static_cast<std::size_t>(a)];
          }
          for (std::int64_t a = 0; a < d; ++a) {
            const double xa = centred_[static_cast<std::size_t>(a)];
            double* row = cov_.data() + a * d;
            for (std::int64_t b = 0; b < d; ++b) row[b] += xa * centred_[static_cast<std::size_t>(b)];
          }
        }
        for (double& v : cov_) v /= static_cast<double>(n);
      }
      if (rot) {
        rotate(st, mean_.data(), d, 1);
        if (covariance_) {
          for (std::int64_t c = 0; c < d; ++c) rotate(st, cov_.data() + c, d, d);  // Rbar Sigma
          for (std::int64_t r = 0; r < d; ++r) rotate(st, cov_.data() + r * d, d, 1);  // .. Rbar^T
        }
      }
      for (std::int64_t a = 0; a < d; ++a) {
        s.mu[static_cast<std::size_t>(g * d + a)] = static_cast<float>(mean_[static_cast<std::size_t>(a)]);
      }
      if (covariance_) {
        for (std::int64_t a = 0; a < d * d; ++a) {
          s.sigma[static_cast<std::size_t>(g * d * d + a)] = static_cast<float>(cov_[static_cast<std::size_t>(a)]);
        }
      }
    }
    s.valid = true;
    s.since = 0;
    for (std::int64_t i = 0; i < h.n_live(); ++i) log_scores(h, s, i);
  }

  // Live row i's log-scores l_g(i) for the G query heads (into hs.hist).
  void log_scores(HeadCtx& h, const Stats& s, std::int64_t i) {
    const std::int64_t d = h.head_dim, G = groups_;
    const float* k = key_of(h, i);
    const double inv_sqrt_d = 1.0 / std::sqrt(static_cast<double>(d));
    for (std::int64_t g = 0; g < G; ++g) {
      const float* mu = s.mu.data() + g * d;
      double dot = 0.0;
      for (std::int64_t a = 0; a < d; ++a) dot += static_cast<double>(mu[a]) * k[a];
      double l = dot * inv_sqrt_d;
      if (covariance_) {
        const float* sigma = s.sigma.data() + g * d * d;
        // (Sigmabar k)_a in eight fixed lanes (lane u sums the columns b = u mod 8; the lanes
        // vectorise without reassociating anything), then k . (Sigmabar k).
        double quad = 0.0;
        const std::int64_t d8 = d - d % 8;
        for (std::int64_t a = 0; a < d; ++a) {
          const float* row = sigma + a * d;
          float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
          for (std::int64_t b = 0; b < d8; b += 8) {
            for (int u = 0; u < 8; ++u) lane[u] += row[b + u] * k[b + u];
          }
          float acc = ((lane[0] + lane[1]) + (lane[2] + lane[3])) +
                      ((lane[4] + lane[5]) + (lane[6] + lane[7]));
          for (std::int64_t b = d8; b < d; ++b) acc += row[b] * k[b];
          quad += static_cast<double>(acc) * k[a];
        }
        l += quad / (2.0 * static_cast<double>(d));
      }
      h.hs.hist[static_cast<std::size_t>(i * G + g)] = static_cast<float>(l);
    }
  }

  std::int64_t n_future_, window_, interval_;
  bool covariance_, vnorm_;
  double epsilon_;
  bool queries_ = false;
  std::int64_t groups_ = 1;
  std::vector<Stats> stats_;  // [B * Hkv]
  std::int64_t rbar_pos_ = -1;
  std::vector<double> cbar_, sbar_, mean_, cov_, centred_, prob_;
  std::vector<float> value_;
};

}  // namespace

MethodInfo expected_attention_method() {
  return method_card(kExpectedAttentionCard, &check, &make_policy_of<ExpectedAttentionPolicy>);
}

}  // namespace vq::detail
