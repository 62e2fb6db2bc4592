// leverage: compress at prefill, keeping the key rows of highest (ridge) statistical leverage.
//
// Paper: Chari & Van Durme, "Compactor: Calibrated Query-Agnostic KV Cache Compression with
// Approximate Leverage Scores", 2025 (kvpress: LeverageScorePress).
//
// Rule: on a step with S > 1 new rows (a prefill chunk) that leaves more than budget rows, each
// head scores its n live rows from their keys alone (no attention): X = K - mean(K), the keys
// as the cache stores them centred over the head's live rows (n x d), G = X^T X + lambda I with
// lambda = leverage_ridge x trace(X^T X) / d, and score_i = x_i^T G^{-1} x_i, in double
// precision (Cholesky of the d x d G, then two triangular solves per row). The ridge makes G
// invertible when n <= d or the keys span fewer than d directions; when every live key is the
// same (trace 0) every score is 0. The cache keeps the first leverage_n_sink rows, the newest
// leverage_grace rows and the (budget - n_sink - grace) other rows of highest score (ties to
// the lowest index; a NaN score never wins a keep), in position order. Single-token steps
// (decode) append without eviction, so the cache grows past the budget during generation, as
// snapkv's does. Cost: O(n d^2 + d^3) per head, once per prefill chunk.
//
// Fields: leverage_budget=512, leverage_n_sink=4, leverage_grace=16, leverage_ridge=1e-3;
// shared: merge=drop (+gate, keys; the gate compares the leverage score), quantize/demote,
// seed, kv_dtype.
// Guards: n_sink < budget and n_sink + grace < budget.
// Deviations from the paper: exact leverage scores (the paper's Gaussian sketch and its
// Cholesky solve on the sketched keys are a speed approximation this skips: the scores here are
// exact and deterministic); post-RoPE keys as the cache stores them (the paper scores pre-RoPE
// keys); a ridge term (the paper's plain pseudo-inverse); leverage alone (Compactor's blend
// with attention from a query window and its calibrated per-context budget are not
// implemented); sinks and a grace window are protected; later prefill chunks are scored
// together with the rows kept earlier.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "policies/fields.h"
#include "policies/methods.h"
#include "policies/policy.h"
#include "policies/prefill_only.h"

namespace vq::detail {

constexpr std::string_view kLeverageCard = R"(
id: leverage
prefix: leverage
summary: Compactor's leverage scores: at prefill, keep the key rows of highest ridge leverage
  among the centred keys (exact, no attention); decode appends
paper: Chari & Van Durme, Compactor: Calibrated Query-Agnostic KV Cache Compression with
  Approximate Leverage Scores, 2025
disposition: drop (merge optional)
score: exact ridge leverage of the centred keys, x_i^T (X^T X + lambda I)^-1 x_i
budget: uniform at prefill (decode grows)
deviations: exact scores (the paper's Gaussian sketch is a speed approximation, skipped);
  post-RoPE keys; a ridge lambda = ridge x trace / d; leverage alone, no attention blend or
  calibrated budget; sinks and a grace window protected
paper config: `leverage:n_sink=0,grace=0` (leverage alone; no sketch)
prefill only: yes
| leverage_budget | int | 512 | [1, 16777216] | rows kept per KV head after a prefill chunk,
  sinks and grace included
| leverage_n_sink | int | 4 | [0, 16777216] | leading rows never evicted
| leverage_grace | int | 16 | [0, 16777216] | newest rows never evicted at a prefill cut
| leverage_ridge | float | 0.001 | [1e-12, 1e+06] | ridge lambda = ridge x trace(X^T X) / d (makes
  X^T X + lambda I invertible when n <= d)
)";

namespace {

void check(const CacheConfig& c) {
  require_less(c, "leverage_n_sink", "leverage_budget");
  require_sum_less(c, "leverage_n_sink", "leverage_grace", "leverage_budget");
}

// A prefill chunk (S > 1) is one decision on the leverage scores; a decode step appends
// (policies/prefill_only.h).
class LeveragePolicy final : public PrefillOnlyPolicy {
 public:
  explicit LeveragePolicy(const PolicyContext& ctx)
      : PrefillOnlyPolicy(ctx), grace_(ctx.config.get_int("leverage_grace")),
        ridge_(ctx.config.get_float("leverage_ridge")) {}

 protected:

  // The leverage scores, sinks and grace rows protected (+inf).
  void eviction_scores(HeadCtx& h, float* out) override {
    const std::int64_t n = h.n_live();
    score(h);
    const float inf = std::numeric_limits<float>::infinity();
    for (std::int64_t i = 0; i < n; ++i) {
      out[i] = (i < n_sink_ || i >= n - grace_) ? inf
                                                : rank_of(h.hs.score[static_cast<std::size_t>(i)]);
    }
  }

 private:
  // score_i = x_i^T G^{-1} x_i for every live row (into hs.score), in double precision.
  void score(HeadCtx& h) {
    const std::int64_t n = h.n_live(), d = h.head_dim;
    const auto ns = static_cast<std::size_t>(n), ds = static_cast<std::size_t>(d);
    x_.resize(ns * ds);
    mean_.assign(ds, 0.0);
    for (std::size_t i = 0; i < ns; ++i) {
      const float* k = key_of(h, static_cast<std::int64_t>(i));
      for (std::size_t c = 0; c < ds; ++c) {
        x_[i * ds + c] = k[c];
        mean_[c] += k[c];
      }
    }
    for (double& m : mean_) m /= static_cast<double>(n);
    for (std::size_t i = 0; i < ns; ++i) {
      for (std::size_t c = 0; c < ds; ++c) x_[i * ds + c] -= mean_[c];
    }
    // G = X^T X (lower triangle), trace, ridge.
    g_.assign(ds * ds, 0.0);
    for (std::size_t i = 0; i < ns; ++i) {
      const double* xi = x_.data() + i * ds;
      for (std::size_t a = 0; a < ds; ++a) {
        const double xa = xi[a];
        for (std::size_t b = 0; b <= a; ++b) g_[a * ds + b] += xa * xi[b];
      }
    }
    double trace = 0.0;
    for (std::size_t a = 0; a < ds; ++a) trace += g_[a * ds + a];
    const double lambda = ridge_ * trace / static_cast<double>(d);
    bool ok = trace > 0.0 && std::isfinite(trace) && lambda > 0.0;
    // Cholesky G + lambda I = L L^T (L in the lower triangle of g_).
    for (std::size_t a = 0; ok && a < ds; ++a) {
      g_[a * ds + a] += lambda;
      for (std::size_t b = 0; b <= a; ++b) {
        double s = g_[a * ds + b];
        for (std::size_t k = 0; k < b; ++k) s -= g_[a * ds + k] * g_[b * ds + k];
        if (a == b) {
          if (!(s > 0.0) || !std::isfinite(s)) {
            ok = false;
            break;
          }
          g_[a * ds + a] = std::sqrt(s);
        } else {
          g_[a * ds + b] = s / g_[b * ds + b];
        }
      }
    }
    // score_i = |L^{-1} x_i|^2 (one forward solve per row).
    y_.resize(ds);
    for (std::size_t i = 0; i < ns; ++i) {
      double s = 0.0;
      if (ok) {
        const double* xi = x_.data() + i * ds;
        for (std::size_t a = 0; a < ds; ++a) {
          double v = xi[a];
          for (std::size_t k = 0; k < a; ++k) v -= g_[a * ds + k] * y_[k];
          y_[a] = v / g_[a * ds + a];
          s += y_[a] * y_[a];
        }
      } else if (!(trace >= 0.0) || !std::isfinite(trace)) {
        s = std::numeric_limits<double>::quiet_NaN();  // non-finite keys: never a keep
      }
      h.hs.score[i] = static_cast<float>(s);
    }
  }

  void select(HeadCtx& h, std::int64_t keep) override {
    const std::int64_t n = h.n_live();
    score(h);
    const std::int64_t g = std::min(grace_, n - n_sink_);
    // Candidates [n_sink, n - g): the top (budget - n_sink - g) by score stay.
    keep_top(h, h.hs.score.data(), n_sink_, n - g, keep - n_sink_ - g);
  }

  std::int64_t grace_;
  double ridge_;
  std::vector<double> x_, mean_, g_, y_;
};

}  // namespace

MethodInfo leverage_method() {
  return method_card(kLeverageCard, &check, &make_policy_of<LeveragePolicy>);
}

}  // namespace vq::detail
