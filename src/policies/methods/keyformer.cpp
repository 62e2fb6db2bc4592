// keyformer: H2O's cumulative mass plus frozen Gumbel noise, with a temperature schedule.
//
// Paper: Adnan et al., "Keyformer: KV Cache Reduction through Key Tokens Selection for
// Efficient Generative Inference", MLSys 2024.
//
// Proxy rule: H2O accumulation without decay (the first token starts at 1.0; each
// later token adds softmax(K_stored . k_t / sqrt(d)) to the stored rows' scores and is appended
// at 0). Each token gets Gumbel noise g = -ln(-ln u) drawn once, when it arrives, from the
// counter RNG (seed, layer, kv head, draw counter), and keeps it. Over budget: evict
// argmin(score + tau * g) with sinks and the newest `recent` rows protected, where
// tau = tau_init + min(t, T) (tau_end - tau_init) / T, t = the decode steps (single-token
// steps) before this step and T = anneal_steps (tau = tau_init when T <= 0), so a prompt read
// in one chunk uses tau_init and tau rises with each generated token, as in the paper.
// tau = 0 is exactly h2o with the same recent window (grace) and decay 1.
// The recent window: keyformer_recent rows, or with -1 (default)
// floor(keyformer_recent_ratio x (budget - n_sink)), ratio 0.3 as in the paper. The seed
// library's recent = 0 freezes the cache on a real model (keyformer:recent=0, not a default).
//
// Fields: keyformer_budget=512, keyformer_n_sink=4, keyformer_tau_init=1,
// keyformer_tau_end=1 (paper: rising to 2), keyformer_anneal_steps=0, keyformer_recent=-1,
// keyformer_recent_ratio=0.3; shared: merge=drop (+gate, keys), source=auto, quantize...,
// seed, kv_dtype.
// Attention source (the paper's rule): each token's attention probabilities give its logits up
// to a constant, x = ln a; every live row accumulates softmax((x + g) / tau) (tau = 0: the
// one-hot argmax), with each key row's frozen noise g; eviction takes the argmin of the
// accumulated score, sinks and the newest `recent` rows protected.
// Deviations from the paper: with the proxy source, noise perturbs the accumulated proxy mass
// at eviction time instead; the noise is one draw per key token, kept for its lifetime.
#include <cmath>
#include <limits>

#include "base/kernels.h"
#include "policies/fields.h"
#include "policies/methods/h2o.h"
#include "policies/methods.h"

namespace vq::detail {

// The registry entry (methods.h, method_card): what `veloxquant list` and the README table
// show, the field table and the shared field groups.
constexpr std::string_view kCard = R"(
id: keyformer
token loop: yes
prefix: keyformer
summary: Keyformer: H2O mass plus frozen per-token Gumbel noise with a temperature schedule
paper: Adnan et al., Keyformer: KV Cache Reduction through Key Tokens Selection for Efficient
  Generative Inference, MLSys 2024
disposition: drop (merge optional)
score: noisy cumulative attention mass
budget: uniform
deviations: proxy source: noise added to the accumulated mass at eviction (source=attention: the
  paper's softmax((x + g) / tau) accumulation)
paper config: `keyformer:n_sink=0,recent_ratio=0.3,tau_init=1,tau_end=2,anneal_steps=256,source=attention`
  (anneal_steps = the tokens to generate, here 256; 30% recent window, tau rising from 1 to 2)
defaults: the paper's 30% recent window (of the non-sink budget, so it scales with budget=) and 4
  sinks; a constant tau of 1 (the paper's rise to 2 needs the generation length: anneal_steps)
| keyformer_budget | int | 512 | [1, 16777216] | rows kept per KV head, sinks included
| keyformer_n_sink | int | 4 | [0, 16777216] | leading rows never evicted
| keyformer_tau_init | float | 1 | [0, 1e+06] | noise temperature for the prompt and the first
  decode step
| keyformer_tau_end | float | 1 | [0, 1e+06] | noise temperature after anneal_steps (paper: 2)
| keyformer_anneal_steps | int | 0 | [0, 16777216] | decode steps (single-token steps) over which
  tau moves linearly from tau_init to tau_end (0: constant tau_init)
| keyformer_recent | int | -1 | [-1, 16777216] | newest rows protected from eviction (the recent
  window); -1: recent_ratio of the budget left after the sinks
| keyformer_recent_ratio | float | 0.3 | [0, 1] | share of the non-sink budget kept as the recent
  window when recent = -1 (the paper: 0.3)
attention: yes
)";

namespace {
void check(const CacheConfig& c) {
  check_recent_family(c);
  const bool constant = c.get_float("keyformer_tau_end") == c.get_float("keyformer_tau_init");
  if (c.get_int("keyformer_anneal_steps") == 0 && !constant) {
    config_error(c, "keyformer_tau_end has no effect with keyformer_anneal_steps=0 (tau stays "
                    "keyformer_tau_init): set anneal_steps, or tau_end = tau_init");
  }
  if (c.get_int("keyformer_anneal_steps") > 0 && constant) {
    config_error(c, "keyformer_anneal_steps has no effect with keyformer_tau_end = "
                    "keyformer_tau_init (tau is constant)");
  }
}

class KeyformerPolicy final : public H2OPolicy {
 public:
  explicit KeyformerPolicy(const PolicyContext& ctx)
      : H2OPolicy(ctx), tau_init_(ctx.config.get_float("keyformer_tau_init")),
        tau_end_(ctx.config.get_float("keyformer_tau_end")),
        anneal_(ctx.config.get_int("keyformer_anneal_steps")) {}

 protected:
  // The temperature anneals over decode steps (single-token steps), as in the paper, where tau
  // rises with each generated token: a step uses tau_at(number of earlier decode steps), so a
  // prompt read in one chunk uses tau_init.
  void begin_step(LayerState& /*st*/) override { tau_ = tau_at(decode_steps_); }
  void finish_step(LayerState& st) override {
    if (st.step_new == 1) ++decode_steps_;
  }
  void on_reset(LayerState& /*st*/) override { decode_steps_ = 0; }
  void state(StateIO& io, LayerState& st) override {
    H2OPolicy::state(io, st);
    io.bounded<std::int64_t>(decode_steps_, 0, st.tokens_seen, "keyformer decode steps");
  }

  void on_token(HeadCtx& h, std::int64_t row) override {
    const double u = h.rng.uniform_open(h.hs.draws++);
    const float g = static_cast<float>(-std::log(-std::log(u)));
    if (!source_.attention()) {
      H2OPolicy::on_token(h, row);
      h.hs.aux.back() = g;
      return;
    }
    // Paper variant: with the logits x = ln(a) + const recovered from the probabilities,
    // accumulate softmax((x + g) / tau) over the live rows (tau = 0: the one-hot argmax).
    push_row(h.hs, row, 0.0f, g);
    const std::int64_t n = h.n_live();
    const float* a = attention_row(h, row - h.hs.prev);
    const float tau = tau_;
    weights_.resize(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) {
      const float x = std::log(a[h.hs.live[static_cast<std::size_t>(i)]]) + h.hs.aux[static_cast<std::size_t>(i)];
      weights_[static_cast<std::size_t>(i)] = x;
    }
    bool any_finite = false;
    for (float w : weights_) any_finite = any_finite || std::isfinite(w);
    if (!any_finite) return;  // every live row got zero attention: nothing to add
    if (tau > 0.0f) {
      for (auto& w : weights_) w /= tau;
      kernels::softmax(weights_.data(), n);
    } else {
      const std::int64_t best = kernels::argmax_keep(weights_.data(), n);
      for (std::int64_t i = 0; i < n; ++i) weights_[static_cast<std::size_t>(i)] = i == best ? 1.0f : 0.0f;
    }
    for (std::int64_t i = 0; i < n; ++i) h.hs.score[static_cast<std::size_t>(i)] += weights_[static_cast<std::size_t>(i)];
  }

  void eviction_scores(HeadCtx& h, float* out) override {
    const std::int64_t n = h.n_live();
    // Proxy variant: the frozen noise perturbs the accumulated mass at eviction time; the
    // attention variant has already put it into the accumulation.
    const float tau = source_.attention() ? 0.0f : tau_;
    const float inf = std::numeric_limits<float>::infinity();
    for (std::int64_t i = 0; i < n; ++i) {
      out[i] = (i < n_sink_ || i >= n - grace_) ? inf : rank_of(h.hs.score[i] + tau * h.hs.aux[i]);
    }
  }

 private:
  float tau_at(std::int64_t steps) const {
    const double t = static_cast<double>(steps);
    const double tau = anneal_ <= 0 ? tau_init_
                                    : tau_init_ + std::min<double>(t, static_cast<double>(anneal_)) *
                                                      (tau_end_ - tau_init_) /
                                                      static_cast<double>(anneal_);
    return static_cast<float>(tau);
  }

  double tau_init_, tau_end_;
  std::int64_t anneal_;
  std::int64_t decode_steps_ = 0;  // single-token steps this layer has completed
  float tau_ = 0.0f;               // the temperature of the open step
};

}  // namespace

MethodInfo keyformer_method() {
  return method_card(kCard, &check, &make_policy_of<KeyformerPolicy>);
}

}  // namespace vq::detail
