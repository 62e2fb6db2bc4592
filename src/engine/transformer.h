// The Llama forward pass over a compressed KV cache, llama2.c style: read top to bottom.
//
//   x = embedding[token]
//   per layer l:
//     xb = rmsnorm(x) ; q, k, v = xb Wq, xb Wk, xb Wv ; RoPE(q, k) at each token's position
//     view = cache[l].begin_step(k, v)           // kept rows + the step's new rows
//     attention of every query over the view's rows, masked by position (row pos <= query pos)
//     cache[l].end_step(&probs)                  // the probabilities go back to the cache
//     x += (attention output) Wo                 // layer_cosine[l] = cos(x before, x after)
//     x += W2 (silu(rmsnorm(x) W1) * rmsnorm(x) W3)
//   logits = rmsnorm(x) Wcls
//
// A forward step takes S tokens (a prefill chunk, or S = 1 when decoding) as one cache step:
// matmuls run over S rows and each token attends to the kept rows and to the new rows at or
// before its own position. Everything is preallocated in RunState; the forward allocates
// nothing (the cache manages its own storage). Single-threaded and deterministic: the same
// tokens and cache give bit-identical logits, and for a cache that keeps every row a chunk of
// S tokens gives the same logits as S single steps.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/model.h"
#include "veloxquant/builder.h"

namespace vq::engine {

// The cache shape a model needs (one cache per layer, Hkv heads of head_dim, Hq queries).
ModelShape model_shape(const ModelConfig& config);

// Preallocated activations for steps of up to `max_chunk` tokens (S below) over at most
// seq_len cached rows (R below).
struct RunState {
  std::int64_t max_chunk = 0;  // S: the most tokens one forward step takes
  std::int64_t max_rows = 0;   // R: the most rows a layer's view can hold (the context)

  std::vector<float> x;             // [S][dim]         residual stream
  std::vector<float> xb;            // [S][dim]         normed block input; scratch
  std::vector<float> xb2;           // [S][dim]         attention output projected by Wo
  std::vector<float> q;             // [S][Hq * D]      queries, RoPE applied
  std::vector<float> k;             // [S][Hkv * D]     the step's keys, RoPE applied (to the cache)
  std::vector<float> v;             // [S][Hkv * D]     the step's values (to the cache)
  std::vector<float> att_out;       // [S][Hq * D]      attention-weighted values per query head
  std::vector<float> att;           // [Hq][S][R]       attention probabilities of the current step
  std::vector<float> row;           // [D]              one cached key or value row as fp32
  std::vector<float> packed_k;      // [R][D]           a packed (quantized) head's keys and
  std::vector<float> packed_v;      // [R][D]           values, dequantized for one step
  std::vector<float> hb;            // [S][hidden_dim]  SwiGLU gate, then gate * up
  std::vector<float> hb2;           // [S][hidden_dim]  SwiGLU up
  std::vector<float> logits;        // [S][vocab]       (row 0 only when just the last is asked)
  std::vector<float> layer_cosine;  // [n_layers] cos(hidden entering layer l, hidden after its
                                    // attention residual add), mean over the step's tokens
  std::vector<float> rope_cos;      // [seq_len][D / 2] cos(pos * theta^(-2i/D))
  std::vector<float> rope_sin;      // [seq_len][D / 2] sin(pos * theta^(-2i/D))

  RunState(const ModelConfig& config, std::int64_t max_chunk);
};

enum class Logits {
  kAll,   // logits for every token of the step: RunState::logits [S][vocab]
  kLast,  // only the last token's: RunState::logits [vocab]
};

class Transformer {
 public:
  // The model must outlive the transformer. Steps take at most `max_chunk` tokens.
  explicit Transformer(const Model& model, std::int64_t max_chunk = 1);

  // Runs tokens[0..S) at positions cache.tokens_seen() .. + S - 1 through the model as one
  // cache step per layer and returns the logits (see Logits). Throws Error(kInvalidArgument)
  // for S outside [1, max_chunk], a token outside the vocabulary, positions past seq_len or a
  // cache whose shape does not fit the model.
  const float* forward(const std::int32_t* tokens, std::int64_t S, ModelCache& cache,
                       Logits which = Logits::kAll);

  const RunState& state() const noexcept { return s_; }
  const Model& model() const noexcept { return *model_; }

 private:
  // Runs the layer's attention over the cache's view (the cache step stays open) and returns
  // the probabilities [B=1, Hq, S, R], valid until the next call; forward() closes the step.
  AttentionRef attention(std::int64_t layer, std::int64_t S, std::int64_t pos0, LayerCache& cache);

  const Model* model_;
  RunState s_;
};

}  // namespace vq::engine
