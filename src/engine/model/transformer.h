// The Llama forward pass over a compressed KV cache, llama2.c style: read top to bottom.
//
//   x = embedding[token]
//   per layer l:
//     xb = rmsnorm(x) ; q, k, v = xb Wq (+ bq), xb Wk (+ bk), xb Wv (+ bv) ; RoPE(q, k) at each
//     token's position
//     view = cache[l].begin_step(k, v)           // kept rows + the step's new rows
//     attention of every query over the view's rows, masked by position (row pos <= query pos)
//     x += (attention output) Wo                 // layer_cosine[l] = cos(x before, x after)
//     cache[l].end_step(&probs)                  // the probabilities go back to the cache
//     x += W2 (silu(rmsnorm(x) W1) * rmsnorm(x) W3)
//   logits = rmsnorm(x) Wcls
//
// One step is a batch of sequences (BatchItem), each with its own cache and positions and its
// own number of tokens (a prefill chunk, or 1 when decoding); the batch is the unit, and a
// single sequence (forward(tokens, S, cache)) is a batch of one, so `generate`, `eval`, the
// benches and `serve`'s continuous batching all run this one layer loop. The rows of all
// sequences are stacked: RMSNorm, the matmuls (each weight matrix read once per step for every
// sequence), biases, SwiGLU and the residual adds run over the stacked rows, while RoPE,
// attention and the cache step run per sequence over its own cache and positions. Each row is
// computed by the same code whatever rows sit beside it (engine/compute/matmul.h: out[s][i]
// depends only on x[s] and row i), so a sequence's logits and cache are bit-identical whether
// it runs alone or in a batch (tests/test_forward_batch.cpp, on every named shape).
//
// Within a sequence, S tokens are one cache step: each token attends to the kept rows and to
// the new rows at or before its own position. Activations live in RunState: the per-token
// buffers grow to a step's stacked tokens and are given back by release_tokens; the
// attention's per-thread tile scratch and, for a cache that reads them, the step's probabilities
// grow on first use (the cache manages its own storage). Attention runs a tile of T query
// tokens of one KV head at a time (docs/engine.md "Prefill attention"), bit-identical to one
// query at a time. Matmuls are threaded over output rows and attention over (KV head, tile)
// units (engine/parallel.h); each output element is computed by one thread in a fixed order, so
// the same tokens and caches give bit-identical logits for every thread count, and for a cache
// that keeps every row a chunk of S tokens gives the same logits as S single steps.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "engine/model/model.h"
#include "veloxquant/builder.h"

namespace vq::engine {

// The cache shape a model needs (one cache per layer, Hkv heads of head_dim, Hq queries).
ModelShape model_shape(const ModelConfig& config);

// Activations for steps whose sequences take up to `max_chunk` tokens each (S below: one
// sequence's tokens in a step) over at most `max_rows` cached rows (R below; the positions a run
// uses, at most seq_len). T below: a step's tokens stacked over its sequences (T = S for a
// single sequence). The per-token buffers (x .. hb2, logits) hold one token's room at
// construction and are grown to a step's T by the step (fit_tokens; never shrunk but by
// release_tokens), so a run that decodes holds a prompt chunk's activations only while it
// needs them.
struct RunState {
  std::int64_t max_chunk = 0;  // S: the most tokens one sequence takes in a step
  std::int64_t max_rows = 0;   // R: the most rows a layer's view can hold (the context)

  std::vector<float> x;             // [T][dim]         residual stream
  std::vector<float> xb;            // [T][dim]         normed block input; scratch
  std::vector<float> xb2;           // [T][dim]         attention output projected by Wo
  std::vector<float> q;             // [T][Hq * D]      queries, RoPE applied
  std::vector<float> k;             // [T][Hkv * D]     the step's keys, RoPE applied (to the cache)
  std::vector<float> v;             // [T][Hkv * D]     the step's values (to the cache)
  std::vector<float> att_out;       // [T][Hq * D]      attention-weighted values per query head
  // The current layer's attention probabilities, for the sequences whose cache reads them
  // (LayerCache::reads_attention()): each such sequence's [Hq][S][R] block (its own S and R),
  // one after another in the step's order. Empty until such a step, then grown to the largest
  // layer's total (never shrunk but by release_tokens). Methods that read no probabilities
  // never allocate it.
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
  std::vector<float> hb;            // [T][hidden_dim]  SwiGLU gate, then gate * up
  std::vector<float> hb2;           // [T][hidden_dim]  SwiGLU up
  // [rows][vocab] logits: the rows the step's sequences asked for, in the step's order
  // (Logits::kAll: each of its tokens; kLast: its last token; kNone: none). One row's room until
  // a step asks for more, then grown to that step's rows (never shrunk but by release_tokens).
  std::vector<float> logits;
  std::vector<float> layer_cosine;  // [n_layers] cos(hidden entering layer l, hidden after its
                                    // attention residual add), mean over the step's tokens (all
                                    // sequences; each cache gets the mean over its own)
  std::vector<float> rope_cos;      // [R][D / 2] cos(pos * theta^(-2i/D))
  std::vector<float> rope_sin;      // [R][D / 2] sin(pos * theta^(-2i/D))
  std::vector<float> rope_inv_freq; // [D / 2] each pair's angle per position, as the tables use
                                    // it (after any scaling; LayerCache::set_rope)
  // The step's queries before RoPE ([T][Hq * D]), only for the sequences whose cache reads them
  // (LayerCache::reads_queries(): expected_attention); empty until such a step (never shrunk but
  // by release_tokens). Other methods never allocate it.
  std::vector<float> q_pre;

  // Query tokens per attention tile for G query heads per KV head: T * G about 32 queries.
  static std::int64_t tile_tokens(std::int64_t G) noexcept {
    return G >= 8 ? 4 : G >= 2 ? 32 / G : 16;  // 16, 16, 10, 8, 6, 5, 4, ... for G = 1, 2, ...
  }

  // max_rows = 0: the model's seq_len. Throws Error(kInvalidArgument) for max_chunk outside
  // [1, max_rows] or max_rows outside [1, seq_len].
  RunState(const ModelConfig& config, std::int64_t max_chunk, std::int64_t max_rows = 0);

  // Grows the per-token buffers (x .. hb2) to T tokens (T >= 1, unchecked) and logits to at
  // least one row. Never shrinks.
  void fit_tokens(const ModelConfig& config, std::int64_t T);
  // Gives the per-token buffers' memory back down to one token's room, and the step
  // probabilities' (att) entirely; the next step grows what it needs again.
  void release_tokens(const ModelConfig& config);
};

// Each RoPE pair's angle per position (D / 2 values), as RunState's tables use it (after any
// scaling): what LayerCache::set_rope takes.
std::vector<float> rope_inv_freq(const ModelConfig& config);

// Rotates `n_heads` heads of each of S rows (row stride n_heads * D) at positions pos0 + t by
// the state's RoPE tables (rope_cos/rope_sin, which must cover pos0 + S - 1). llama2.c pairs
// (2i, 2i+1) (RopeStyle::kInterleaved); Hugging Face pairs (i, i + D/2). Same rotation. The one
// RoPE of the engine.
void apply_rope(float* x, std::int64_t S, std::int64_t n_heads, std::int64_t D, std::int64_t pos0,
                RopeStyle style, const RunState& s);

enum class Logits {
  kAll,   // logits for every token of the sequence's step: [S][vocab]
  kLast,  // only the last token's: [vocab]
  kNone,  // none (a prefill chunk whose logits nobody reads: no classifier work)
};

// One sequence's part of a forward step.
struct BatchItem {
  const std::int32_t* tokens = nullptr;  // [n]
  std::int64_t n = 0;                    // tokens this step (1 to max_chunk)
  ModelCache* cache = nullptr;           // this sequence's cache; positions continue from it
  Logits logits = Logits::kLast;         // which logits the step computes for it
};

// The reconstruction input's instruction (kvzip's context reconstruction, Transformer::
// reconstruct): `first` before the first chunk of the context, `next` before each later chunk
// followed by the previous chunk's last `carry` context tokens, then `suffix`, then the chunk's
// context tokens. All empty: each step is the context chunk alone.
struct RepeatPrompt {
  std::vector<std::int32_t> first, next, suffix;
  std::int64_t carry = 8;
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
  // The model must outlive the transformer. A sequence takes at most `max_chunk` tokens a step
  // and a step at most `max_tokens` summed over its sequences (0: max_chunk); positions stay
  // below `max_rows` (0: the model's seq_len), which sizes the attention and RoPE buffers.
  // Throws Error(kInvalidArgument) for max_chunk outside [1, max_rows], max_rows outside
  // [0, seq_len] or max_tokens outside {0} and [max_chunk, inf).
  explicit Transformer(const Model& model, std::int64_t max_chunk = 1, std::int64_t max_rows = 0,
                       std::int64_t max_tokens = 0);

  // One step for a batch of sequences: each item's tokens run at positions
  // cache->tokens_seen() .. + n - 1 as one cache step per layer of its own cache. Afterwards
  // logits(i) is item i's logits (BatchItem::logits), valid until the next step. Every check
  // comes before any cache begins a step: throws Error(kInvalidArgument) for an empty batch, an
  // item without tokens or cache, n outside [1, max_chunk], more than max_tokens tokens in all,
  // a token outside the vocabulary, positions past seq_len or max_rows, a cache shaped for
  // another model, or the same cache twice. Should a cache itself fail inside the step
  // (Error(kInvalidState) when its view does not fit), the caches of the step may hold a step
  // that did not end: the caller drops them.
  void forward(std::span<const BatchItem> items);
  // Item i's logits of the last step: [n][vocab] for Logits::kAll, [vocab] for kLast. Throws
  // Error(kInvalidArgument) for an item that asked for none or was not in the step.
  const float* logits(std::size_t i) const;

  // A batch of one: runs tokens[0..S) of one sequence and returns its logits (see Logits;
  // nullptr for kNone). Same checks as above.
  const float* forward(const std::int32_t* tokens, std::int64_t S, ModelCache& cache,
                       Logits which = Logits::kAll);

  // Context reconstruction (kvzip; ModelCache::reads_reconstruction): after the prompt
  // context[0..n) was run over `cache` (set_reconstruction(true) before it), teacher-forces the
  // model on the reconstruction input (prompt.first or prompt.next with its carried tokens,
  // prompt.suffix, then a chunk of the context) one chunk per step, each step at the positions
  // after the cache's tokens and closed with end_reconstruction_step (its rows forgotten), then
  // calls cache.compress(). A chunk holds cache.reconstruction_chunk() context tokens, fewer
  // where the step would pass max_chunk, max_tokens or max_rows. Returns the pass's wall time in
  // seconds (also added to times() when timing is on, by phase). A cache that does not read
  // reconstruction: nothing runs, returns 0. Throws Error(kInvalidArgument) when no step fits
  // one context token after the instruction (naming the positions left), and as forward().
  double reconstruct(const std::int32_t* context, std::int64_t n, ModelCache& cache,
                     const RepeatPrompt& prompt);

  std::int64_t max_chunk() const noexcept { return s_.max_chunk; }
  std::int64_t max_rows() const noexcept { return s_.max_rows; }
  std::int64_t max_tokens() const noexcept { return max_tokens_; }
  const RunState& state() const noexcept { return s_; }
  // Frees the activations sized by the largest step so far down to one token's (RunState::
  // release_tokens): call it after a prompt, before decoding token by token. Results do not
  // change; a later step of more tokens grows them again.
  void release_chunk_buffers() { s_.release_tokens(model_->config()); }
  // Timing of forward steps (off by default; a clock read per phase when on).
  void set_timing(bool on) noexcept { timing_ = on; }
  const StepTimes& times() const noexcept { return times_; }
  void reset_times() noexcept { times_ = StepTimes{}; }
  const Model& model() const noexcept { return *model_; }
  // Calibration (`veloxquant calibrate`, engine/run/qfilters_file.h): when set, called once per
  // layer of every step with the step's queries after RoPE, q = [T][Hq * D] (T: the step's
  // tokens stacked over its sequences), before the attention reads them. Results do not change.
  using QueryTap = std::function<void(std::int64_t layer, const float* q, std::int64_t T)>;
  void set_query_tap(QueryTap tap) { query_tap_ = std::move(tap); }

 private:
  // The checks of forward(items), before any cache step; fills row0_ and pos0_ and returns the
  // step's tokens T.
  std::int64_t check_step(std::span<const BatchItem> items);
  // Runs one sequence's attention for `layer`: its S tokens' rows [r0, r0 + S) of q, k, v and
  // att_out at positions pos0.., over its cache's view (the cache step stays open). The
  // probabilities, when the cache reads them, go to att at offset `att_at` ([Hq][S][R]), which
  // is advanced past them; the returned ref has their shape and a null data pointer (the caller
  // points it into att once every sequence's block is in place).
  AttentionRef attention(std::int64_t layer, std::int64_t S, std::int64_t r0, std::int64_t pos0,
                         LayerCache& cache, std::int64_t& att_at);
  // For a cache whose method reads the output projection (ModelCache::reads_output_gram:
  // criticalkv) and holds none yet: every layer's Gram matrices per query head,
  // G_g = W_o^g^T W_o^g with W_o^g the dim x D columns of wo that head g's output goes through
  // (dequantized), computed once per Transformer (double sums in a fixed order, so the same for
  // every thread count) and handed to the cache.
  void provide_output_gram(ModelCache& cache);
  // One tile: tokens [t0, min(t0 + T, S)) of KV head g (rows hr) of one sequence whose queries
  // are q ([S][Hq * D]); outputs into out ([S][Hq * D]) and, when att is not null, the
  // probability rows into att ([Hq][S][R]).
  void attend_tile(const HeadRows& hr, std::int64_t g, std::int64_t t0, std::int64_t T,
                   std::int64_t S, std::int64_t R, std::int64_t pos0, float scale,
                   const float* q, float* out, float* att, RunState::AttentionScratch& w);

  const Model* model_;
  RunState s_;
  std::int64_t max_tokens_;
  bool timing_ = false;
  bool reconstructing_ = false;  // the step is a reconstruction step (reconstruct)
  StepTimes times_;
  QueryTap query_tap_;
  // Per item of the current step (grown, never shrunk: no allocation once a batch size was
  // seen): its first stacked row, its first position, its probabilities' offset in s_.att (-1:
  // none), the ref its cache gets, its first logits row (-1: none).
  std::vector<std::int64_t> row0_, pos0_, att_at_, logit_row_;
  std::vector<AttentionRef> refs_;
  std::vector<TensorRef> qrefs_;      // per sequence: its pre-RoPE queries (data null: none)
  std::size_t n_items_ = 0;  // items in the last step
  std::vector<std::vector<float>> wo_gram_;  // [n_layers][Hq * D * D], empty until needed
};

}  // namespace vq::engine
