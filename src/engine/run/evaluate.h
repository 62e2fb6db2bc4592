// Teacher-forced evaluation of one cache method on a token sequence: the model reads the text
// (an optional prefill chunk, then one token per step) and at every position predicts the next
// token. Per prediction it records the negative log-likelihood of the true next token, the
// argmax, and, against a reference run over the same tokens, KL(reference || this run).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "engine/model/model.h"
#include "engine/model/transformer.h"
#include "veloxquant/cache.h"
#include "veloxquant/config.h"

namespace vq::engine {

struct ForcedRun {
  std::vector<double> nll;         // [P] -ln softmax(logits_t)[token t+1], P = n_tokens - 1
  std::vector<double> kl;          // [P] KL(reference || this run) in nats; empty without one
  std::vector<std::int32_t> top1;  // [P] argmax of the logits (first maximum)
  std::vector<float> logits;       // [P][vocab] when kept (a reference run keeps them)
  double kept_tokens_mean = 0;     // rows held per KV head per layer after each step, averaged
                                   // over the predictions the steps made
  CacheStats cache;                // at the end (kept/full bytes of every layer)
  double seconds = 0;              // forward time, model + cache (the metrics are not timed),
                                   // the reconstruction pass included
  double prefill_seconds = 0;      // the prefill step's forward time (0 without one)
  double reconstruction_seconds = 0;  // kvzip's reconstruction pass after the prefill (0: none)
  std::int64_t n_forward = 0;      // tokens fed (= P)
};

struct ForcedOptions {
  std::int64_t prefill = 0;  // the first `prefill` tokens go in as one step (0 or 1: none)
  bool keep_logits = false;  // keep every position's logits (for use as a reference)
  const ForcedRun* reference = nullptr;  // computes kl when given (it must have kept logits)
  // A head pattern for methods with head types (duoattention; ModelCache::set_head_pattern);
  // other methods ignore it. Null: none.
  const HeadPattern* head_pattern = nullptr;
  // The reconstruction input's instruction for a method that reads a reconstruction pass
  // (kvzip: after the prefill step the engine runs it, Transformer::reconstruct); null: the
  // context's tokens alone. Methods that read none ignore it.
  const RepeatPrompt* repeat = nullptr;
  // Called after each forward step with (tokens fed so far, total).
  std::function<void(std::int64_t, std::int64_t)> progress;
};

// Throws Error(kInvalidArgument) for fewer than 2 tokens, more than the model's context, a
// prefill outside [0, n_tokens - 1] or a reference over a different token count.
ForcedRun run_forced(const Model& model, const std::vector<std::int32_t>& tokens,
                     const CacheConfig& method, const ForcedOptions& options = {});

struct ForcedSummary {
  std::int64_t n_predictions = 0;
  double nll_mean = 0;        // nats per token
  double ppl = 0;             // exp(nll_mean)
  double kl_mean = 0;         // 0 without a reference
  double top1_agreement = 1;  // fraction of positions whose argmax equals the reference's
};
ForcedSummary summarize(const ForcedRun& run, const ForcedRun* reference);

// ln sum exp(x) in double (max-shifted, sequential): the log-softmax normaliser.
double log_sum_exp(const float* x, std::int64_t n) noexcept;

}  // namespace vq::engine
