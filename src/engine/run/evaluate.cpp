#include "engine/run/evaluate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>

#include "engine/model/transformer.h"
#include "engine/run/generate.h"
#include "engine/run/qfilters_file.h"
#include "engine/model/weights_check.h"
#include "veloxquant/builder.h"
#include "veloxquant/errors.h"
#include "veloxquant/registry.h"

namespace vq::engine {

double log_sum_exp(const float* x, std::int64_t n) noexcept {
  double m = -INFINITY;
  for (std::int64_t i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  double s = 0.0;
  for (std::int64_t i = 0; i < n; ++i) s += std::exp(static_cast<double>(x[i]) - m);
  return m + std::log(s);
}

namespace {

std::int32_t argmax(const float* x, std::int64_t n) {
  std::int64_t best = 0;
  for (std::int64_t i = 1; i < n; ++i) best = x[i] > x[best] ? i : best;
  return static_cast<std::int32_t>(best);
}

// KL(p || q) for the softmaxes of logits a (p) and b (q), in double.
double kl_divergence(const float* a, const float* b, std::int64_t n) {
  const double lse_a = log_sum_exp(a, n), lse_b = log_sum_exp(b, n);
  double kl = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double lpa = static_cast<double>(a[i]) - lse_a;
    const double lpb = static_cast<double>(b[i]) - lse_b;
    kl += std::exp(lpa) * (lpa - lpb);
  }
  return kl;
}

}  // namespace

ForcedRun run_forced(const Model& model, const std::vector<std::int32_t>& tokens,
                     const CacheConfig& method, const ForcedOptions& o) {
  using clock = std::chrono::steady_clock;
  const ModelConfig& c = model.config();
  const auto T = static_cast<std::int64_t>(tokens.size());
  auto bad = [](const std::string& msg) {
    throw Error(ErrorCode::kInvalidArgument, "[eval] " + msg);
  };
  if (T < 2) bad("need at least 2 tokens (one prediction), got " + std::to_string(T));
  if (T > c.seq_len) {
    bad(std::to_string(T) + " tokens exceed the model's context (seq_len " +
        std::to_string(c.seq_len) + ")");
  }
  if (o.prefill < 0 || o.prefill > T - 1) {
    bad("prefill must be in [0, " + std::to_string(T - 1) + "] (tokens - 1), got " +
        std::to_string(o.prefill));
  }
  const std::int64_t P = T - 1, V = c.vocab_size;
  // Every id is checked before the run: the NLL reads token t + 1 before it is forwarded.
  for (std::int64_t i = 0; i < T; ++i) {
    const std::int32_t id = tokens[static_cast<std::size_t>(i)];
    if (id < 0 || id >= V) {
      bad("token " + std::to_string(i) + " is id " + std::to_string(id) +
          ", outside the model's vocabulary [0, " + std::to_string(V) + ")");
    }
  }
  if (o.reference != nullptr && static_cast<std::int64_t>(o.reference->logits.size()) != P * V) {
    bad("the reference run kept no logits for these " + std::to_string(T) + " tokens");
  }
  const std::int64_t chunk = o.prefill >= 2 ? o.prefill : 1;

  ForcedRun run;
  run.nll.resize(static_cast<std::size_t>(P));
  run.top1.resize(static_cast<std::size_t>(P));
  if (o.reference != nullptr) run.kl.resize(static_cast<std::size_t>(P));
  if (o.keep_logits) run.logits.resize(static_cast<std::size_t>(P * V));

  ModelCache cache = make_model_cache(method, model);  // loads qfilters' key filters
  // A reconstruction pass (kvzip) after the prefill step: the prompt's rows wait for it, and its
  // steps (instruction + a chunk of the prompt, at the positions after the prompt) get room.
  const RepeatPrompt plain;
  const RepeatPrompt& repeat = o.repeat != nullptr ? *o.repeat : plain;
  const bool reconstructs = chunk >= 2 && cache.reads_reconstruction();
  std::pair<std::int64_t, std::int64_t> room{chunk, T};  // buffers sized by the positions read
  if (reconstructs) {
    cache.set_reconstruction(true);
    room = reconstruction_room(c, repeat, chunk, cache.reconstruction_chunk(), chunk, T);
  }
  Transformer tf(model, room.first, room.second);
  if (o.head_pattern != nullptr && method.info().head_types) cache.set_head_pattern(*o.head_pattern);
  cache.expect_positions(T);  // memory only: the stores grow no further than the run's rows
  double kept_weighted = 0.0;
  std::int64_t t = 0;
  while (t < P) {
    const std::int64_t S = t == 0 ? chunk : 1;
    const auto start = clock::now();
    const float* logits = tf.forward(tokens.data() + t, S, cache, Logits::kAll);
    const double forward_seconds = std::chrono::duration<double>(clock::now() - start).count();
    run.seconds += forward_seconds;
    if (t == 0 && S > 1) run.prefill_seconds = forward_seconds;
    for (std::int64_t s = 0; s < S; ++s) {
      const std::int64_t pos = t + s;
      const float* row = logits + s * V;
      const auto i = static_cast<std::size_t>(pos);
      if (!all_finite(row, V)) {
        check_finite(row, V,
                     "[evaluate] " + method.spec() + ": logits at position " + std::to_string(pos));
      }
      run.nll[i] = log_sum_exp(row, V) - static_cast<double>(row[tokens[i + 1]]);
      if (!std::isfinite(run.nll[i])) {
        throw Error(ErrorCode::kFileError,
                    "'" + model.path() + "': the NLL at position " + std::to_string(pos) +
                        " is not finite (logits beyond float range?); the model's weights "
                        "(e.g. a norm tensor) look broken",
                    model.path());
      }
      run.top1[i] = argmax(row, V);
      if (o.reference != nullptr)
        run.kl[i] = kl_divergence(o.reference->logits.data() + pos * V, row, V);
      if (o.keep_logits) std::copy(row, row + V, run.logits.begin() + pos * V);
    }
    // The pass after the prefill step's logits were read (the next step overwrites them).
    if (t == 0 && S > 1 && reconstructs) {
      run.reconstruction_seconds = tf.reconstruct(tokens.data(), S, cache, repeat);
      run.seconds += run.reconstruction_seconds;
    }
    // Rows held per KV head per layer after this step, weighted by its predictions.
    double rows = 0.0;
    for (std::int64_t l = 0; l < c.n_layers; ++l) {
      for (std::int64_t h = 0; h < c.n_kv_heads; ++h)
        rows += static_cast<double>(cache.layer(l).stored(0, h).n_rows);
    }
    kept_weighted += rows / static_cast<double>(c.n_layers * c.n_kv_heads) * static_cast<double>(S);
    t += S;
    if (S > 1) tf.release_chunk_buffers();  // the rest is read one token a step
    if (o.progress) o.progress(t, P);
  }
  // exp(mean NLL) overflows a double past ~709 nats per token (uniform guessing over the
  // vocabulary is ln V, about 10): a perplexity of inf would be reported as a result.
  double nll_sum = 0.0;
  for (const double x : run.nll) nll_sum += x;
  if (!std::isfinite(std::exp(nll_sum / static_cast<double>(P)))) {
    throw Error(ErrorCode::kFileError,
                "'" + model.path() + "': the mean NLL is " +
                    std::to_string(nll_sum / static_cast<double>(P)) +
                    " nats per token, so the perplexity is not finite; the model's weights (e.g. a "
                    "norm tensor) look broken",
                model.path());
  }
  run.n_forward = P;
  run.kept_tokens_mean = kept_weighted / static_cast<double>(P);
  run.cache = cache.stats();
  return run;
}

ForcedSummary summarize(const ForcedRun& run, const ForcedRun* reference) {
  ForcedSummary s;
  s.n_predictions = static_cast<std::int64_t>(run.nll.size());
  if (s.n_predictions == 0) return s;
  double nll = 0.0, kl = 0.0;
  std::int64_t agree = 0;
  for (std::size_t i = 0; i < run.nll.size(); ++i) {
    nll += run.nll[i];
    if (!run.kl.empty()) kl += run.kl[i];
    if (reference != nullptr && i < reference->top1.size() && reference->top1[i] == run.top1[i])
      ++agree;
  }
  const auto n = static_cast<double>(s.n_predictions);
  s.nll_mean = nll / n;
  s.ppl = std::exp(s.nll_mean);
  s.kl_mean = run.kl.empty() ? 0.0 : kl / n;
  s.top1_agreement = reference == nullptr ? 1.0 : static_cast<double>(agree) / n;
  return s;
}

}  // namespace vq::engine
