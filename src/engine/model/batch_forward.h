// One forward step for several sequences at once (continuous batching): every sequence brings
// its own tokens (a prefill chunk, or one token when decoding) and its own ModelCache; the rows
// of all sequences are stacked, so each weight matrix is read once per step for all of them
// (matmul over the stacked rows), while RoPE, attention and the cache step run per sequence,
// over that sequence's own cache and positions.
//
// Contract: each sequence's logits, and its cache's state after the step, are bit-identical to
// Transformer::forward(tokens, n, cache, Logits::kLast) run on that sequence alone: the per-row
// operations (RMSNorm, matmul rows, SwiGLU, residual adds) compute each row with the same code
// whatever rows sit beside it (engine/compute/matmul.h: out[s][i] depends only on x[s] and row
// i), and attention is Transformer's own code, run for one sequence at a time. Tested in
// tests/test_serve.cpp against Transformer::forward.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/model/transformer.h"

namespace vq::engine {

// One sequence's part of a batched step.
struct BatchItem {
  const std::int32_t* tokens = nullptr;  // [n]
  std::int64_t n = 0;                    // tokens this step (>= 1)
  ModelCache* cache = nullptr;           // this sequence's cache; positions continue from it
  bool want_logits = false;              // the last token's logits are needed (to sample)
};

class BatchForward {
 public:
  // The model must outlive this. A step takes at most `max_tokens` tokens summed over its
  // sequences and at most `max_chunk` from one sequence; positions stay below `max_rows` (0: the
  // model's seq_len), which sizes the RoPE tables and the attention scratch. Throws
  // Error(kInvalidArgument) for max_chunk outside [1, min(max_tokens, max_rows)], max_tokens < 1
  // or max_rows outside [0, seq_len].
  BatchForward(const Model& model, std::int64_t max_tokens, std::int64_t max_chunk,
               std::int64_t max_rows = 0);

  // Runs each item's tokens as one cache step of its own cache. Afterwards logits(i) is the
  // last token's logits [vocab] of item i when items[i].want_logits (valid until the next call).
  // Throws Error(kInvalidArgument) for an empty step, an item with n outside [1, max_chunk],
  // more than max_tokens tokens in all, a token outside the vocabulary, positions past max_rows,
  // a cache shaped for another model, or the same cache twice. On an exception the caches of the
  // step may have begun a step that did not end: the caller drops them.
  void forward(std::span<const BatchItem> items);

  const float* logits(std::size_t i) const;

  std::int64_t max_tokens() const noexcept { return max_tokens_; }
  std::int64_t max_chunk() const noexcept { return max_chunk_; }
  std::int64_t max_rows() const noexcept { return attn_.state().max_rows; }

 private:
  const Model* model_;
  std::int64_t max_tokens_, max_chunk_;
  Transformer attn_;  // its RunState holds RoPE tables and attention scratch for one sequence
  // Stacked activations [T][...] (T = max_tokens).
  std::vector<float> x_, xb_, xb2_, q_, k_, v_, att_out_, hb_, hb2_;
  std::vector<float> logits_;                     // [items wanting logits][vocab]
  std::vector<std::int64_t> logit_row_;           // item -> row in logits_ (-1: none)
  std::vector<std::vector<float>> probs_;         // per item: its attention probabilities
  std::vector<AttentionRef> refs_;                // per item
};

}  // namespace vq::engine
