// The per-layer compressed KV cache.
//
// An engine makes one LayerCache per transformer layer (see builder.h) and calls it once per
// layer per forward step. Contracts (docs/design.md):
//  1. Positions are true token positions; each kept row carries its own, per KV head. The
//     cache never renumbers or re-rotates rows (RoPE is applied before the cache sees a key).
//  2. Deferred eviction: a step returns every previously kept row followed by all S new rows
//     (uncapped); only afterwards is the stored state cut to the budget.
//  3. Storage is fp16 by default (kv_dtype=f32 keeps fp32); all scoring and blending is fp32.
//  4. With the proxy source the tokens of a chunk are decided one at a time: feeding S tokens in
//     one step gives the same stored state as S steps of one token (snapkv, squeeze in a
//     ModelCache, and keyformer with anneal_steps > 0 aside: its temperature advances with
//     decode, i.e. single-token, steps). With source=attention a multi-token step (a prefill
//     chunk) is one decision made with the whole chunk's attention, as the papers decide a
//     prompt (README, contract 4).
//  5. Ties go to the lowest index; NaN scores never win a keep.
//  6. Deterministic: randomness comes from a counter RNG keyed by (seed, layer, kv head, draw
//     counter); the same config and inputs give bit-identical state.
//  7. kept_bytes() is the K/V payload the cache holds (rows, or codes + scales + zeros +
//     unquantized rows); full_bytes() the fp16 cost of every token seen; compression_ratio()
//     their quotient. stats().resident_bytes is every byte the cache keeps between steps, by
//     container capacity (payload, positions, per-row scores and bookkeeping). A quantized
//     cache keeps no dequantized copy: its rows are read through PackedRows.
//  8. Construction validates the config and throws Error(kInvalidConfig) naming the field.
//
// Two ways to drive it:
//  - Zero-copy, two phases (engines): view = begin_step(k, v); compute attention over the
//    view's rows; end_step(&probs) (or end_step() with the proxy score source). The view points
//    into cache storage and is valid until end_step(). With source=auto (the default) the
//    first step decides: probabilities passed -> the papers' true-attention rules, none -> the
//    key-as-query proxy, fixed until reset().
//  - One call (reference-library semantics): rows = update(k, v) returns an owning fp32 copy
//    and leaves the stored state at budget.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "veloxquant/config.h"
#include "veloxquant/rows.h"
#include "veloxquant/types.h"

namespace vq {

namespace detail {
class Policy;
struct LayerState;
struct LayerGroup;
}  // namespace detail

class ModelCache;

// A head pattern for a whole model: [n_layers][n_kv_heads] scores (LayerCache::set_head_pattern).
using HeadPattern = std::vector<std::vector<float>>;

// Reads a head pattern file: the DuoAttention repository's full_attention_heads.tsv layout,
// one line per layer (n_layers lines, a trailing newline and blank trailing lines allowed), on
// each n_kv_heads decimal numbers separated by tabs (or spaces), finite. Throws
// "[head pattern] FILE: line N: expected ..., found ..." for a file that
// cannot be read, a wrong number of lines or of numbers on a line, a field that is not a
// number, or NaN / infinity: Error(kFileError) whose path() is the file.
VQ_API HeadPattern load_head_pattern(const std::string& path, std::int64_t n_layers,
                                     std::int64_t n_kv_heads);

class VQ_API LayerCache {
 public:
  // Validates `config` (throws Error(kInvalidConfig)) and `shape` (Error(kInvalidArgument):
  // negative counts, or past the limits of types.h) and builds the method's policy.
  LayerCache(const CacheConfig& config, const LayerShape& shape);
  ~LayerCache();
  LayerCache(LayerCache&&) noexcept;
  LayerCache& operator=(LayerCache&&) noexcept;
  LayerCache(const LayerCache&) = delete;
  LayerCache& operator=(const LayerCache&) = delete;

  // Phase 1. keys/values: [B, Hkv, S, D], fp32 or fp16, same shape and dtype. Appends the S
  // new rows (positions tokens_seen() .. + S - 1) and returns every kept row followed by them.
  // Throws Error(kShapeMismatch) if B, Hkv or D differ from earlier calls or the shape given at
  // construction (state untouched), kInvalidState if a step is already open, and
  // kInvalidArgument (state untouched, nothing read) for a shape past the limits of types.h
  // (Hkv, D, B x Hkv; S > 2^31 - 1) or strides under which two rows overlap (TensorRef). S = 0
  // is a no-op that returns the kept rows.
  StepView begin_step(const TensorRef& keys, const TensorRef& values);

  // Phase 2. Scores, evicts, merges or quantizes so the stored state fits the budget.
  // `attention` (optional) holds the probabilities of this step's queries over the view's
  // rows; methods configured with the proxy source ignore it, methods with source=attention
  // require it. source=auto (the default of every attention-scored method) is resolved by the
  // first step with new rows: attention if that step passes probabilities, else proxy, and
  // stays so until reset(); a later step that passes the other way throws
  // Error(kInvalidArgument) naming `source` and leaves the step open (so an engine that passes
  // probabilities every step gets the papers' rules, and update() gets the proxy). Throws
  // Error(kShapeMismatch) for a wrongly shaped attention input, kInvalidState without an open
  // step.
  //
  // attention->data may be null when reads_attention() is false (an engine that skips computing
  // probabilities nobody reads): the shape is still checked and the step counts as one that
  // passes probabilities (source=auto), but the policy gets none. A null data with
  // reads_attention() true throws Error(kShapeMismatch), the step left open.
  //
  // A method registered with a scorer (registry.h, RowScorer) scores the step's new rows before
  // it decides anything; when the scorer throws, the step is rolled back: end_step throws
  // Error(kInvalidArgument) with the scorer's message, the step is closed, its rows and
  // positions are forgotten (tokens_seen() as before begin_step), and the next step gives what
  // it would have given had the failed one never been begun. The shape a first step fixed stays
  // fixed.
  void end_step(const AttentionRef* attention = nullptr);

  // end_step with the step's queries as a second score source (docs/api.md, "Queries"):
  // `queries` (optional) holds the layer's pre-RoPE queries of the step's tokens, [B, Hq, S, D]
  // (fp32 or fp16, D contiguous, other strides free, as TensorRef), query head q belonging to
  // KV head q / (Hq / Hkv). Methods that do not read queries (reads_queries() false) check the
  // shape and ignore them. A method that reads them (expected_attention) resolves its source at
  // the first step with new rows, as source=auto does: queries passed -> the method's rule on
  // the queries, none -> its documented fallback (the step's keys stand in for the queries),
  // fixed until reset(); a later step that passes the other way throws Error(kInvalidArgument)
  // naming `queries`, the step left open. Queries need the layer's RoPE (set_rope, once before
  // the first step that passes them): without it end_step throws Error(kInvalidArgument)
  // naming set_rope, the step left open. Throws Error(kShapeMismatch) for queries whose shape
  // is not [B, Hq, S, D] of the step (or with no data), the step left open.
  void end_step(const AttentionRef* attention, const TensorRef* queries);

  // Whether end_step reads the step's queries (expected_attention unless resolved to keys;
  // think= until a step with S > 1 chose its key channels); an engine materialises the
  // pre-RoPE queries only when it is true.
  bool reads_queries() const noexcept;

  // The layer's rotary embedding (RopeRef), copied; set once before the first step that passes
  // queries (a later call replaces it, for the next steps). Throws Error(kInvalidArgument) for
  // n_pairs < 0, n_pairs > 0 with a null inv_freq, a frequency that is not finite or < 0, or
  // n_pairs other than 0 or head_dim / 2 when head_dim is known (else checked by the first step
  // that uses it).
  void set_rope(const RopeRef& rope);
  bool has_rope() const noexcept;

  // Whether end_step of a step with new rows reads the probabilities it is passed: true for a
  // method scored by attention with source=attention, or source=auto not yet resolved (passing
  // probabilities resolves it to attention); false for methods that score without attention
  // (full, streaming_llm, the key scorers, kivi, ...) and for the proxy source. Quantized and
  // demoted storage (quantize=, demote=) read none. An engine may skip materialising the
  // probabilities when it is false (AttentionRef with data null, above).
  bool reads_attention() const noexcept;

  // begin_step + an owning copy of the view + end_step(). Reference-library semantics.
  KVRows update(const TensorRef& keys, const TensorRef& values);

  // A hint, for memory only: at most `n` positions will be fed to this cache (0: unknown, the
  // default). A store that grows its containers in steps (the plain fp16/fp32 rows of the full
  // cache and of every dropping method) then never grows them past n rows per head while its
  // rows fit in n, so a cache fed exactly n positions holds no unused capacity; feeding more
  // still works (the stores grow on in bounded steps). Results never depend on it. Kept across
  // reset(). Throws Error(kInvalidArgument) for n < 0.
  void expect_positions(std::int64_t n);

  // The layer's output projection, for methods that weigh a value by what it adds to the
  // attention output (criticalkv, criticaladakv: ||W_o^g v||_2). `gram` holds, per query head g,
  // the D x D Gram matrix G_g = W_o^g^T W_o^g of W_o^g, the dim x D slice of the output
  // projection that head g's attention output goes through (row-major, [n_query_heads][D][D],
  // fp32; query head g is served by KV head g / (n_query_heads / Hkv)); the cache copies it.
  // Only a method that reads it keeps it (reads_output_gram()); for the others it is checked and
  // ignored. Kept across reset(); a later call replaces it. Without it such a method weighs by
  // ||v||_2 (CacheStats::value_norm "plain"). Throws Error(kInvalidArgument) naming
  // set_output_gram for a null gram, counts < 1 or past the limits of types.h, a non-finite
  // entry, or counts that differ from the cache's shape (n_query_heads, head_dim, a multiple of
  // n_kv_heads) where it is known; kInvalidState while a step is open. A first step whose shape
  // differs from the counts throws Error(kShapeMismatch) naming set_output_gram.
  void set_output_gram(const float* gram, std::int64_t n_query_heads, std::int64_t head_dim);
  // The question of the next prompt (finch): the last `n` tokens of the next step with new
  // rows are the prompt's question, whose queries score the rows before them (Finch's
  // observation window; docs/methods.md, finch). Consumed by that step (a step rolled back gives
  // it back); reset() forgets it; 0 (the default) says no question, and finch then uses its
  // fixed window (finch_obs_window). Methods that do not read it (reads_question() false)
  // ignore it, but every step checks it: begin_step throws Error(kInvalidArgument) naming
  // set_question_length, the state untouched, when n exceeds the step's S > 0 new rows. Throws
  // Error(kInvalidArgument) for n < 0 or n > 2^31 - 1, Error(kInvalidState) while a step is open.
  void set_question_length(std::int64_t n);
  // The question length waiting for the next step (0: none).
  std::int64_t question_length() const noexcept;
  // Whether the method reads the question length (finch).
  bool reads_question() const noexcept;

  // Whether the method reads set_output_gram's matrices, and whether it holds them.
  bool reads_output_gram() const noexcept;
  bool has_output_gram() const noexcept;

  // Context reconstruction (kvzip; docs/methods.md "kvzip", docs/api.md "Reconstruction").
  // A method that reads it (reads_reconstruction()) scores each stored row by the attention it
  // receives while the model is teacher-forced to repeat the context: after a prompt, the engine
  // runs each chunk of the reconstruction input (a repeat instruction, then the context's own
  // tokens) as one step over this cache -- view = begin_step(k, v) with the chunk's keys and
  // values, attention of its queries over the view's rows (the stored rows, and causally the
  // chunk's own), end_reconstruction_step(&probs) -- and finally calls compress(), which cuts the
  // stored rows to the budget by those scores. Decode steps then append (prefill-only contract).
  //
  // set_reconstruction(true) tells the cache, before the prompt, that the engine runs the pass:
  // multi-token steps then keep every row until compress(), and a single-token step that comes
  // while a prompt waits for its compress() throws Error(kInvalidState) naming compress (the step
  // rolled back). Without it (the default: an engine that never runs the pass, update(), the
  // C API without the calls) a multi-token step is cut at once by the method's fallback score
  // (kvzip: the prompt's own attention, max over its queries, or the proxy). Kept across reset();
  // ignored by methods that do not read reconstruction. Throws kInvalidState while a step is
  // open.
  void set_reconstruction(bool on);
  bool reads_reconstruction() const noexcept;
  // Tokens of context per reconstruction step the method asks for (kvzip_chunk); 0 for methods
  // that do not read reconstruction.
  std::int64_t reconstruction_chunk() const noexcept;
  // Closes an open step whose new rows are reconstruction tokens: `attention` holds the
  // probabilities of the step's queries over the view's rows, [B, Hq, S, R] as end_step takes
  // them (data required); the method takes each query's probabilities over the rows stored
  // before the step into its scores, and the step's rows are forgotten (tokens_seen(), stored
  // rows and positions as before begin_step). Throws Error(kShapeMismatch) for a missing or
  // wrongly shaped attention, kInvalidState without an open step, without
  // set_reconstruction(true), or for a method that does not read reconstruction; in every case
  // but the first (no open step) the step is rolled back first.
  void end_reconstruction_step(const AttentionRef* attention);
  // Cuts the rows kept since the last compress() to the method's budget by the reconstruction
  // scores (kvzip: the top rows of each head, or of the layer's heads together with headwise).
  // A no-op when no prompt waits (nothing was appended by a multi-token step since the last
  // compress, or set_reconstruction is off) and for methods that do not read reconstruction.
  // Throws Error(kInvalidState) while a step is open, or when a prompt waits and no
  // reconstruction step was observed since it (the pass was not run: nothing is cut).
  void compress();

  // Saving and restoring (docs/api.md, "Saving and restoring a cache"). The state is everything
  // later steps read: every stored row as held (keys, values, codes, scales, positions, pruned
  // channels, the demoted tier), the per-row scores, counters, RNG draw counters, the resolved
  // score and query sources, and the method's own state. It is not the set-up the engine gives
  // (set_rope, set_key_filters, set_output_gram, set_head_pattern, set_reconstruction,
  // expect_positions): load_state keeps the target's own, so the target must be built from the
  // same config and shape and set up as the saved cache was; it then behaves bit-identically to
  // the saved one for every later step (stats().resident_bytes aside: a restored store holds
  // no spare capacity). The format is versioned and checksummed (CRC-32C), little-endian.
  //
  // save_state throws Error(kInvalidState) while a step is open or a reconstruction pass waits
  // for compress(). load_state validates everything before it changes anything (a failed load
  // leaves the cache as it was): Error(kInvalidArgument) for bytes that are not a state of this
  // format version (truncated, checksum, magic, counts out of bounds or inconsistent with the
  // shape and store type: the message says what was expected and found) and for a valid state
  // of another config or shape (naming both specs, or the field); kInvalidState while a step is
  // open. The file variants write a temporary file beside `path`, fsync it and rename it over
  // `path` (atomic; Error(kIoError) naming the path on failure), and read with
  // Error(kFileError) whose path() is the file for a missing, unreadable, truncated or corrupt
  // file (a state of another config or shape: kInvalidArgument, as load_state).
  std::vector<std::uint8_t> save_state() const;
  void load_state(const std::uint8_t* data, std::size_t size);
  void save_state_file(const std::string& path) const;
  void load_state_file(const std::string& path);

  // Forgets every token (shape stays fixed); the RNG counters restart; source=auto is
  // unresolved again. A head pattern (set_head_pattern) is kept.
  void reset();

  // Head types (methods whose MethodInfo::head_types is set: duoattention). `scores` holds one
  // score per KV head (DuoAttention's alpha: the higher, the more a head needs the full
  // context); the method types the heads from it (duoattention: the top duo_head_ratio share
  // keep every row) from the first step on, instead of estimating the scores from the prompt.
  // An empty vector goes back to the estimate. Throws Error(kInvalidArgument) for a method that
  // takes no pattern, a size other than n_kv_heads (which must be known: given in the
  // LayerShape or fixed by a first step) or a non-finite score, and Error(kInvalidState) after
  // the first step with rows (call reset() first) or while a step is open. Kept across reset().
  void set_head_pattern(const std::vector<float>& scores);
  // Each (b, h) store's type, b-major [B * Hkv]: 0 untyped (other methods, or not decided yet),
  // 1 retrieval head (keeps every row), 2 streaming head (sinks + window). Empty before the
  // first step.
  std::vector<std::int32_t> head_types() const;

  // The rows stored between steps for (b, h), in order. Invalidated by the next step.
  HeadRows stored(std::int64_t b, std::int64_t h) const;
  // The method's per-row scores for the stored rows of (b, h), parallel to stored(b, h)
  // (diagnostic: H2O's cumulative mass, TOVA's last weights, ...; zeros for methods without
  // scores). With demote=, the stored rows are the method's rows followed by the demoted rows,
  // whose scores are the ones they were demoted with.
  std::vector<float> row_scores(std::int64_t b, std::int64_t h) const;
  bool step_open() const noexcept;

  CacheStats stats() const;
  // The score source in force (CacheStats::score_source).
  const char* score_source() const noexcept;
  std::int64_t tokens_seen() const noexcept;
  std::int64_t tokens_kept() const noexcept;  // (b=0, h=0)
  std::int64_t kept_bytes() const noexcept;
  std::int64_t full_bytes() const noexcept;
  double compression_ratio() const noexcept;
  // Rows kept per KV head after each step, sinks included; -1 when the method keeps all. With
  // head-wise budgets (headwise=true) it is the mean: the layer holds n_kv_heads x budget rows
  // per batch element, shared unequally among its heads.
  std::int64_t budget() const noexcept;

  const CacheConfig& config() const noexcept;
  const LayerShape& shape() const noexcept;

  // Per-head key filters, for methods that score keys against a calibrated direction (qfilters:
  // a key's score is its projection on its KV head's filter; `veloxquant calibrate` makes them
  // from a model's queries, docs/methods.md). `filters` holds n = n_kv_heads x head_dim floats,
  // head-major ([Hkv][D]), copied. Throws Error(kInvalidArgument) for a null `filters` with
  // n > 0, a non-finite value, or (when the shape given at construction has n_kv_heads and
  // head_dim) n != n_kv_heads x head_dim; a cache whose shape is fixed by its first step checks
  // n there. Kept across reset(); a later call replaces them (in force from the next step).
  // Other methods ignore them. A method that needs them (needs_key_filters()) throws
  // Error(kInvalidState) naming this setter at the first step with new rows when none were set.
  void set_key_filters(const float* filters, std::int64_t n);
  // Whether the method scores keys with filters set by set_key_filters (qfilters).
  bool needs_key_filters() const noexcept;

 private:
  friend class ModelCache;
  // load_state's body (state.cpp); path: the file, for its errors (null for a buffer).
  void load_state_impl(const std::uint8_t* data, std::size_t size, const std::string* path);
  // Used by ModelCache: the layers of one model share a group (per-layer budgets that depend
  // on every layer, e.g. SqueezeAttention). Trusts `config` and `shape`: ModelCache validated
  // them where they entered (asserted only).
  LayerCache(const CacheConfig& config, const LayerShape& shape,
             std::shared_ptr<detail::LayerGroup> group);

  std::unique_ptr<detail::LayerState> state_;
  std::unique_ptr<detail::Policy> policy_;
};

}  // namespace vq
