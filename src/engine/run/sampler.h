// Token sampling with llama2.c run.c's semantics, reproduced exactly: temperature 0 is argmax
// (first maximum); otherwise logits / temperature, softmax (fp32, sequential sum), one coin
// from run.c's xorshift64* RNG per sample, then either multinomial sampling (top_p <= 0 or
// >= 1) or nucleus sampling: candidates with probability >= (1 - top_p) / (n - 1), sorted by
// probability (descending; ties keep index order, like glibc's merge-sort qsort), cut after
// the cumulative probability first exceeds top_p, sampled with coin * that cumulative mass.
#pragma once

#include <cstdint>
#include <vector>

namespace vq::engine {

class Sampler {
 public:
  // Throws Error(kInvalidArgument) for temperature < 0 or NaN, top_p outside [0, 1], seed 0
  // (xorshift would emit zeros forever), vocab_size < 1.
  Sampler(std::int64_t vocab_size, float temperature, float top_p, std::uint64_t seed);

  // Picks the next token; modifies `logits` in place (as run.c does).
  std::int32_t sample(float* logits);

  // run.c's random_u32 / random_f32 over this sampler's state.
  std::uint32_t random_u32() noexcept;
  float random_f32() noexcept;

 private:
  struct ProbIndex {
    float prob;
    std::int32_t index;
  };
  std::int32_t sample_topp(const float* probs, float coin);

  std::int64_t n_;
  float temperature_, top_p_;
  std::uint64_t state_;
  std::vector<ProbIndex> candidates_;  // [vocab_size] preallocated
};

}  // namespace vq::engine
