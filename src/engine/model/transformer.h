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
// before its own position. Activations are preallocated in RunState; the attention's per-thread
// tile scratch and, for a cache that reads them, the step's probabilities grow on first use
// (the cache manages its own storage). Attention runs a tile of T query tokens of one KV head
// at a time (docs/engine.md "Prefill attention"), bit-identical to one query at a time.
// Matmuls are threaded over output rows and attention over (KV head, tile) units
// (engine/parallel.h); each output element is computed by one thread
// in a fixed order, so the same tokens and cache give bit-identical logits for every thread
// count, and for a cache that keeps every row a chunk of S tokens gives the same logits as S
// single steps.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/model/model.h"
#include "veloxquant/builder.h"

namespace vq::engine {

// The cache shape a model needs (one cache per layer, Hkv heads of head_dim, Hq queries).
ModelShape model_shape(const ModelConfig& config);

// Activations for steps of up to `max_chunk` tokens (S below) over at most `max_rows` cached
// rows (R below; the positions a run uses, at most seq_len). The per-token buffers (x .. hb2,
// logits) hold one token's room at construction and are grown to a step's S by the step
// (fit_tokens; never shrunk but by release_tokens), so a run that decodes holds a prompt
// chunk's activations only while it needs them.
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
  // [Hq][S][R] attention probabilities of the current step, for a cache that reads them
  // (LayerCache::reads_attention()): empty until such a step, then grown to that step's
  // Hq * S * R (never shrunk). Methods that read no probabilities never allocate it.
  std::vector<float> att;
  // Per thread of the attention loop: the scratch of one tile (T query tokens of one KV head's
  // G query heads; TG = T * G), grown to the view's rows R on use. O(TG * R) per thread, never
  // S-bounded.
  struct AttentionScratch {
    std::vector<float> q;            // [TG][D]       the tile's queries, token-major
    std::vector<std::int64_t> pos;   // [TG]          each query's position
    std::vector<float> scores;       // [TG][R]       scores, then probabilities
    std::vector<float> sums;         // [TG][4][D]    attention_values' partial sums
    std::vector<float> packed_sums;  // [G][8][D]     PackedRows::attend_values' scratch
    std::vector<float> row;          // [D]           a cached row as fp32
  };
  std::vector<AttentionScratch> att_scratch;  // one per thread (grown on use)
  std::vector<float> hb;            // [S][hidden_dim]  SwiGLU gate, then gate * up
  std::vector<float> hb2;           // [S][hidden_dim]  SwiGLU up
  // [S][vocab] logits: one row until a step asks for every token's (Logits::kAll with S > 1),
  // then grown to that step's S rows (never shrunk); row 0 only when just the last is asked.
  std::vector<float> logits;
  std::vector<float> layer_cosine;  // [n_layers] cos(hidden entering layer l, hidden after its
                                    // attention residual add), mean over the step's tokens
  std::vector<float> rope_cos;      // [R][D / 2] cos(pos * theta^(-2i/D))
  std::vector<float> rope_sin;      // [R][D / 2] sin(pos * theta^(-2i/D))

  // Query tokens per attention tile for G query heads per KV head: T * G about 32 queries.
  static std::int64_t tile_tokens(std::int64_t G) noexcept {
    return G >= 8 ? 4 : G >= 2 ? 32 / G : 16;  // 16, 16, 10, 8, 6, 5, 4, ... for G = 1, 2, ...
  }

  // max_rows = 0: the model's seq_len. Throws Error(kInvalidArgument) for max_chunk outside
  // [1, max_rows] or max_rows outside [1, seq_len].
  RunState(const ModelConfig& config, std::int64_t max_chunk, std::int64_t max_rows = 0);

  // Grows the per-token buffers to S tokens (1 <= S <= max_chunk, unchecked): q, k, v and
  // att_out (what attention() reads and writes) always; with `block` also x, xb, xb2, hb, hb2
  // and one row of logits (forward()'s; BatchForward keeps its own). Never shrinks.
  void fit_tokens(const ModelConfig& config, std::int64_t S, bool block);
  // Gives the per-token buffers' memory back down to one token's room, and the step
  // probabilities' (att) entirely; the next step grows what it needs again.
  void release_tokens(const ModelConfig& config);
};

// Rotates `n_heads` heads of each of S rows (row stride n_heads * D) at positions pos0 + t by
// the state's RoPE tables (rope_cos/rope_sin, which must cover pos0 + S - 1). llama2.c pairs
// (2i, 2i+1) (RopeStyle::kInterleaved); Hugging Face pairs (i, i + D/2). Same rotation. The one
// RoPE of the engine: Transformer and BatchForward both call it.
void apply_rope(float* x, std::int64_t S, std::int64_t n_heads, std::int64_t D, std::int64_t pos0,
                RopeStyle style, const RunState& s);

enum class Logits {
  kAll,   // logits for every token of the step: RunState::logits [S][vocab]
  kLast,  // only the last token's: RunState::logits [vocab]
};

// Wall time of forward steps by kind (seconds, summed since reset_times()), when timing is on.
struct StepTimes {
  double matmul = 0;     // weight matrices: projections, feed-forward, classifier
  double attention = 0;  // RoPE, scores, softmax, weighted values
  double cache = 0;      // inside the cache: begin_step, end_step (scoring, eviction, merging,
                         // quantization) and the layer-similarity signal
  double other = 0;      // embedding, norms, residual adds, SwiGLU
  std::int64_t steps = 0;
  double total() const noexcept { return matmul + attention + cache + other; }
};

class Transformer {
 public:
  // The model must outlive the transformer. Steps take at most `max_chunk` tokens; positions
  // stay below `max_rows` (0: the model's seq_len), which sizes the attention and RoPE buffers.
  explicit Transformer(const Model& model, std::int64_t max_chunk = 1, std::int64_t max_rows = 0);

  // Runs tokens[0..S) at positions cache.tokens_seen() .. + S - 1 through the model as one
  // cache step per layer and returns the logits (see Logits). Throws Error(kInvalidArgument)
  // for S outside [1, max_chunk], a token outside the vocabulary, positions past seq_len or a
  // cache whose shape does not fit the model.
  const float* forward(const std::int32_t* tokens, std::int64_t S, ModelCache& cache,
                       Logits which = Logits::kAll);

  const RunState& state() const noexcept { return s_; }
  // Frees the activations sized by the largest step so far down to one token's (RunState::
  // release_tokens): call it after a prompt, before decoding token by token. Results do not
  // change; a later step of S > 1 tokens grows them again.
  void release_chunk_buffers() { s_.release_tokens(model_->config()); }
  // Timing of forward steps (off by default; a clock read per phase when on).
  void set_timing(bool on) noexcept { timing_ = on; }
  const StepTimes& times() const noexcept { return times_; }
  void reset_times() noexcept { times_ = StepTimes{}; }
  const Model& model() const noexcept { return *model_; }

 private:
  friend class BatchForward;  // engine/model/batch_forward.h: one sequence's attention at a time
  // Runs the layer's attention over the cache's view (the cache step stays open) and returns
  // the probabilities [B=1, Hq, S, R], valid until the next call; forward() closes the step.
  // The probabilities are materialised only when the cache reads them (data null otherwise).
  AttentionRef attention(std::int64_t layer, std::int64_t S, std::int64_t pos0, LayerCache& cache);
  // One tile: tokens [t0, min(t0 + T, S)) of KV head g (rows hr), outputs into att_out and,
  // when att is not null, the probability rows into att ([Hq][S][R]).
  void attend_tile(const HeadRows& hr, std::int64_t g, std::int64_t t0, std::int64_t T,
                   std::int64_t S, std::int64_t R, std::int64_t pos0, float scale, float* att,
                   RunState::AttentionScratch& w);

  const Model* model_;
  RunState s_;
  bool timing_ = false;
  StepTimes times_;
};

}  // namespace vq::engine
