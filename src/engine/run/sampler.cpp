#include "engine/run/sampler.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "veloxquant/errors.h"

namespace vq::engine {

Sampler::Sampler(std::int64_t vocab_size, float temperature, float top_p, std::uint64_t seed)
    : n_(vocab_size), temperature_(temperature), top_p_(top_p), state_(seed) {
  auto bad = [](const std::string& msg) {
    throw Error(ErrorCode::kInvalidArgument, "[sampler] " + msg);
  };
  if (vocab_size < 1) bad("vocab_size must be >= 1, got " + std::to_string(vocab_size));
  if (!(temperature >= 0.0f) || std::isinf(temperature)) {
    bad("temperature must be a finite number >= 0, got " + std::to_string(temperature));
  }
  if (!(top_p >= 0.0f && top_p <= 1.0f))
    bad("top-p must be in [0, 1], got " + std::to_string(top_p));
  if (seed == 0) bad("seed must be nonzero (the xorshift generator would only produce zeros)");
  candidates_.resize(static_cast<std::size_t>(vocab_size));
}

std::uint32_t Sampler::random_u32() noexcept {
  state_ ^= state_ >> 12;
  state_ ^= state_ << 25;
  state_ ^= state_ >> 27;
  return static_cast<std::uint32_t>((state_ * 0x2545F4914F6CDD1Dull) >> 32);
}

float Sampler::random_f32() noexcept { return static_cast<float>(random_u32() >> 8) / 16777216.0f; }

std::int32_t Sampler::sample(float* logits) {
  const std::int64_t n = n_;
  if (temperature_ == 0.0f) {
    std::int64_t best = 0;
    for (std::int64_t i = 1; i < n; ++i) {
      if (logits[i] > logits[best]) best = i;
    }
    return static_cast<std::int32_t>(best);
  }
  for (std::int64_t i = 0; i < n; ++i) logits[i] /= temperature_;
  // run.c's softmax: max, exp, sequential fp32 sum, divide.
  float max_val = logits[0];
  for (std::int64_t i = 1; i < n; ++i) max_val = logits[i] > max_val ? logits[i] : max_val;
  float sum = 0.0f;
  for (std::int64_t i = 0; i < n; ++i) {
    logits[i] = std::exp(logits[i] - max_val);
    sum += logits[i];
  }
  for (std::int64_t i = 0; i < n; ++i) logits[i] /= sum;
  const float coin = random_f32();
  if (top_p_ <= 0.0f || top_p_ >= 1.0f) {
    float cdf = 0.0f;
    for (std::int64_t i = 0; i < n; ++i) {
      cdf += logits[i];
      if (coin < cdf) return static_cast<std::int32_t>(i);
    }
    return static_cast<std::int32_t>(n - 1);  // rounding
  }
  return sample_topp(logits, coin);
}

std::int32_t Sampler::sample_topp(const float* probs, float coin) {
  const std::int64_t n = n_;
  // Tokens below this cannot be in the nucleus (run.c's shortcut; it decides the candidates).
  const float cutoff = n > 1 ? (1.0f - top_p_) / static_cast<float>(n - 1) : 0.0f;
  std::int64_t n0 = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    if (probs[i] >= cutoff)
      candidates_[static_cast<std::size_t>(n0++)] = {probs[i], static_cast<std::int32_t>(i)};
  }
  if (n0 == 0) {
    // Only possible for tiny top_p over a near-uniform distribution (run.c would read out of
    // bounds here): take the most probable token.
    std::int64_t best = 0;
    for (std::int64_t i = 1; i < n; ++i) best = probs[i] > probs[best] ? i : best;
    return static_cast<std::int32_t>(best);
  }
  // Descending probability; equal probabilities keep index order (a stable sort's result).
  std::sort(candidates_.begin(), candidates_.begin() + n0,
            [](const ProbIndex& a, const ProbIndex& b) {
              return a.prob != b.prob ? a.prob > b.prob : a.index < b.index;
            });
  float cumulative = 0.0f;
  std::int64_t last = n0 - 1;  // rounding: all of them
  for (std::int64_t i = 0; i < n0; ++i) {
    cumulative += candidates_[static_cast<std::size_t>(i)].prob;
    if (cumulative > top_p_) {
      last = i;
      break;
    }
  }
  const float r = coin * cumulative;
  float cdf = 0.0f;
  for (std::int64_t i = 0; i <= last; ++i) {
    cdf += candidates_[static_cast<std::size_t>(i)].prob;
    if (r < cdf) return candidates_[static_cast<std::size_t>(i)].index;
  }
  return candidates_[static_cast<std::size_t>(last)].index;
}

}  // namespace vq::engine
