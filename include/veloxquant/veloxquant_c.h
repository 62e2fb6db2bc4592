/* VeloxQuant C API: a stable C99 interface to the compressed KV caches.
 *
 * Usable from C (and any language with a C FFI) without a C++ compiler; link libveloxquant.so
 * (pkg-config veloxquant, or CMake's VeloxQuant::veloxquant). The C++ API (veloxquant.h) is the
 * same library seen from C++; this header mirrors it with opaque handles and plain structs.
 *
 * Conventions
 *  - Every function that can fail returns a vq_status (VQ_OK = 0). Out-parameters are written
 *    only on success.
 *  - Errors: the message of the last failed call on a handle is read with that handle's
 *    *_last_error() function (owned by the handle, valid until its next failing call or until
 *    it is freed). Calls that have no handle yet (creating one) take an optional
 *    `vq_error** error`: on failure *error receives an error object to read with
 *    vq_error_message() / vq_error_status() and free with vq_error_free(); pass NULL to ignore.
 *    There is no global error state; messages are the C++ library's ("[h2o] h2o_budget must be
 *    in [2, 1048576], got 1").
 *  - Threads: a handle may be used by one thread at a time; different handles are independent
 *    (the layer caches of one model cache may be driven from different threads). Registry
 *    functions are safe from any thread.
 *  - No C++ exception crosses this boundary; out-of-memory is reported as VQ_ERR_OUT_OF_MEMORY.
 *  - Structs in this header change only together with VQ_ABI_VERSION (and the library's
 *    SONAME, libveloxquant.so.<VQ_ABI_VERSION>). Compare vq_abi_version() with VQ_ABI_VERSION
 *    at startup to detect a mismatched library.
 *
 * Driving a cache (the zero-copy, two-phase protocol of the C++ LayerCache; cache.h):
 *    vq_layer_begin_step(layer, &keys, &values, &view);     new K/V rows [B, Hkv, S, D]
 *    for each (b, h): vq_layer_view_head(layer, b, h, &rows) -> rows.keys/values/positions
 *    ... compute attention over rows.n_rows rows ...
 *    vq_layer_end_step(layer, &probs);                       or NULL for proxy scoring
 * The view's pointers point into cache storage and stay valid until vq_layer_end_step.
 */
#ifndef VELOXQUANT_C_H
#define VELOXQUANT_C_H

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__) || defined(__clang__)
#define VQ_C_API __attribute__((visibility("default")))
#else
#define VQ_C_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI this header describes; libveloxquant.so.<VQ_ABI_VERSION>. */
#define VQ_ABI_VERSION 1

typedef enum vq_status {
  VQ_OK = 0,
  VQ_ERR_INVALID_CONFIG = 1,   /* a field out of range, or fields inconsistent */
  VQ_ERR_INVALID_SPEC = 2,     /* a method spec string that does not parse */
  VQ_ERR_UNKNOWN_METHOD = 3,   /* a method id the registry does not know */
  VQ_ERR_SHAPE_MISMATCH = 4,   /* tensor shapes, strides or dtypes that do not fit */
  VQ_ERR_INVALID_STATE = 5,    /* calls out of order (end_step without begin_step, ...) */
  VQ_ERR_INVALID_ARGUMENT = 6, /* any other bad argument (NULL pointer, index out of range) */
  VQ_ERR_FILE = 7,             /* a missing or corrupt file */
  VQ_ERR_IO = 8,               /* an I/O failure */
  VQ_ERR_OUT_OF_MEMORY = 9,    /* an allocation failed */
  VQ_ERR_INTERNAL = 10         /* anything else (a bug in VeloxQuant) */
} vq_status;

typedef enum vq_dtype {
  VQ_DTYPE_F32 = 0, /* IEEE binary32 */
  VQ_DTYPE_F16 = 1  /* IEEE binary16, raw uint16_t bits */
} vq_dtype;

typedef enum vq_field_type {
  VQ_FIELD_INT = 0,
  VQ_FIELD_FLOAT = 1,
  VQ_FIELD_BOOL = 2,
  VQ_FIELD_ENUM = 3
} vq_field_type;

/* Opaque handles. */
typedef struct vq_error vq_error;
typedef struct vq_config vq_config;
typedef struct vq_model_cache vq_model_cache;
typedef struct vq_layer_cache vq_layer_cache;

/* ---- Version and errors ---------------------------------------------------------------- */

/* VQ_ABI_VERSION of the library actually loaded. */
VQ_C_API int vq_abi_version(void);
/* The library version, "MAJOR.MINOR.PATCH" (static storage). */
VQ_C_API const char* vq_version(void);
/* "ok", "invalid_config", ... (static storage; "unknown" for values outside the enum). */
VQ_C_API const char* vq_status_name(vq_status status);

VQ_C_API vq_status vq_error_status(const vq_error* error);
/* The message (owned by the error object); "" for NULL. */
VQ_C_API const char* vq_error_message(const vq_error* error);
VQ_C_API void vq_error_free(vq_error* error); /* NULL is a no-op */

/* ---- Registry: every method and its fields ---------------------------------------------- */

typedef struct vq_method_info {
  const char* id;           /* stable, lower-case: "h2o" */
  const char* prefix;       /* field-name prefix ("h2o" for h2o_budget); may be "" */
  const char* summary;      /* one line */
  const char* paper;        /* the paper it implements or adapts */
  const char* disposition;  /* drop / merge / quantize */
  const char* score_signal; /* what ranks tokens */
  const char* budget_type;  /* uniform / none / ... */
  const char* deviations;   /* where it departs from the paper */
  size_t n_fields;
  int has_token_budget; /* 1 when the method has a token budget (all but full) */
} vq_method_info;

typedef struct vq_field_info {
  const char* name; /* canonical config key, "h2o_budget" */
  vq_field_type type;
  const char* default_text; /* the default as spec text: "64", "0.98", "true", "drop" */
  double min, max;          /* inclusive range of INT / FLOAT fields (0 otherwise) */
  size_t n_choices;         /* ENUM: the allowed values; BOOL: 2 ("true", "false") */
  const char* const* choices;
  const char* allowed_text; /* "[1, 1048576]", "{sim_weighted, mean, drop}" */
  const char* doc;          /* one line */
} vq_field_info;

/* Number of registered methods. */
VQ_C_API size_t vq_registry_count(void);
/* Method `index` (registry order). Strings have static storage. VQ_ERR_INVALID_ARGUMENT for an
 * index >= vq_registry_count() or a NULL `out`. */
VQ_C_API vq_status vq_registry_method(size_t index, vq_method_info* out);
/* Field `field` of method `index`. Strings have static storage. */
VQ_C_API vq_status vq_registry_field(size_t index, size_t field, vq_field_info* out);
/* The index of method `id`; VQ_ERR_UNKNOWN_METHOD when there is none. */
VQ_C_API vq_status vq_registry_find(const char* id, size_t* index);

/* ---- Config ---------------------------------------------------------------------------- */

/* The method's defaults. VQ_ERR_UNKNOWN_METHOD lists the known ids. */
VQ_C_API vq_status vq_config_create(const char* method, vq_config** out, vq_error** error);
/* Parses and validates ID[:KEY=VALUE[,KEY=VALUE...]] (keys with or without the method prefix):
 * VQ_ERR_INVALID_SPEC, VQ_ERR_UNKNOWN_METHOD or VQ_ERR_INVALID_CONFIG with the message. */
VQ_C_API vq_status vq_config_parse(const char* spec, vq_config** out, vq_error** error);
VQ_C_API vq_status vq_config_clone(const vq_config* config, vq_config** out, vq_error** error);
VQ_C_API void vq_config_free(vq_config* config); /* NULL is a no-op */
/* The message of the last failed call on `config`; "" when none failed. */
VQ_C_API const char* vq_config_last_error(const vq_config* config);

/* The method id (owned by the config, valid until it is freed). */
VQ_C_API const char* vq_config_method(const vq_config* config);
/* Sets a field from its spec text ("64", "drop", "true"); type-checked now, ranges checked by
 * vq_config_validate() and by every cache constructor. */
VQ_C_API vq_status vq_config_set(vq_config* config, const char* key, const char* value);
/* Checks every field's range and the method's cross-field guards (VQ_ERR_INVALID_CONFIG). */
VQ_C_API vq_status vq_config_validate(vq_config* config);
/* Typed getters; VQ_ERR_INVALID_ARGUMENT for an unknown key or a type mismatch. */
VQ_C_API vq_status vq_config_get_int(vq_config* config, const char* key, int64_t* out);
VQ_C_API vq_status vq_config_get_float(vq_config* config, const char* key, double* out);
VQ_C_API vq_status vq_config_get_bool(vq_config* config, const char* key, int* out);
/* *out is owned by the config and valid until it is freed or the field is set again. */
VQ_C_API vq_status vq_config_get_enum(vq_config* config, const char* key, const char** out);
/* The spec string that reproduces the config (all_fields = 0: only non-default fields). *out is
 * owned by the config and valid until the next vq_config_spec call on it. */
VQ_C_API vq_status vq_config_spec(vq_config* config, int all_fields, const char** out);
/* The method's token budget (rows per KV head); VQ_ERR_INVALID_CONFIG for a method without
 * one (full). */
VQ_C_API vq_status vq_config_token_budget(vq_config* config, int64_t* out);
/* Sets the token budget and validates (VQ_ERR_INVALID_CONFIG leaves the config unchanged). */
VQ_C_API vq_status vq_config_set_token_budget(vq_config* config, int64_t budget);

/* ---- Tensors --------------------------------------------------------------------------- */

/* A read-only 4-D tensor [B, H, S, D] (batch, heads, tokens, head_dim) with strides in
 * elements; stride[3] must be 1 (the other strides are free). */
typedef struct vq_tensor {
  const void* data;
  vq_dtype dtype;
  int64_t shape[4];
  int64_t stride[4];
} vq_tensor;

/* Attention probabilities of the step's queries over the view's rows: [B, Hq, S, R]
 * contiguous fp32, S = view.n_new, R = view.n_rows. Query head q belongs to KV head
 * q / (Hq / Hkv). Entries the causal mask hid must be 0, and so must the columns from a KV
 * head's own rows.n_rows on (fewer than R only with head-wise budgets, headwise=true). */
typedef struct vq_attention {
  const float* data;
  int64_t batch, n_query_heads, n_queries, n_rows;
} vq_attention;

/* The rows of one (batch, KV head), in order: keys/values [n_rows][row_stride] elements of
 * `dtype` (the first head_dim used), positions [n_rows] (true token positions). */
typedef struct vq_head_rows {
  const void* keys;   /* [n_rows][row_stride] of dtype; NULL when packed */
  const void* values; /* [n_rows][row_stride] of dtype; NULL when packed */
  const int32_t* positions; /* [n_rows] */
  vq_dtype dtype;
  int64_t n_rows;
  int64_t row_stride;
  /* Nonzero for rows held packed (quantize=, kivi): keys and values are NULL and the rows are
   * read as fp32 with vq_head_rows_load (the cache keeps no dequantized copy). */
  int32_t packed;
  int64_t head_dim;
  const void* internal; /* the packed rows' reader; not for the caller's use */
} vq_head_rows;

/* The shape of an open step's view: every (b, h) holds n_rows rows, the last n_new of which are
 * the step's new tokens. With head-wise budgets (headwise=true) heads hold different counts:
 * each head's own is its vq_head_rows.n_rows, and n_rows here is the largest (R). */
typedef struct vq_step_view {
  int64_t batch, n_kv_heads, head_dim;
  int64_t n_rows; /* R = the largest head's row count */
  int64_t n_new;  /* S */
} vq_step_view;

typedef struct vq_cache_stats {
  int64_t tokens_seen;      /* token positions passed in so far (per sequence) */
  int64_t tokens_kept;      /* rows stored for (b=0, h=0) (layer 0 for a model cache) */
  int64_t kept_bytes;       /* K/V payload (+ quantization metadata) held now */
  int64_t full_bytes;       /* fp16 K+V cost of every token seen, all heads */
  int64_t resident_bytes;   /* every byte the cache keeps between steps (containers) */
  int64_t allocated_bytes;  /* capacity reserved for K/V payload (>= kept_bytes) */
  int64_t evictions;        /* rows removed since reset, all heads (merged or dropped) */
  int64_t merges;           /* of those, rows merged into a survivor */
  double compression_ratio; /* full_bytes / kept_bytes (1 when both are 0) */
} vq_cache_stats;

/* ---- Shape limits ---------------------------------------------------------------------- */

/* The limits of every cache shape (include/veloxquant/types.h says why): far above any released
 * model, low enough that what a shape alone makes a cache allocate stays small. A shape past
 * them (a model cache of 10^8 layers, a step of 10^5 KV heads) is refused with
 * VQ_ERR_INVALID_ARGUMENT naming the limit, before anything is allocated. */
#define VQ_MAX_LAYERS 4096        /* n_layers */
#define VQ_MAX_HEADS 4096         /* n_kv_heads, and n_query_heads */
#define VQ_MAX_HEAD_DIM 65536     /* head_dim */
#define VQ_MAX_BATCH_HEADS 65536  /* B x n_kv_heads of a step (one row store each) */

/* ---- Layer caches ---------------------------------------------------------------------- */

/* The shape a layer cache serves; zero head counts or head_dim are taken from the first
 * non-empty step. n_query_heads 0 means n_kv_heads; n_layers 0 means 1. */
typedef struct vq_layer_shape {
  int64_t n_kv_heads, head_dim, n_query_heads, layer, n_layers;
} vq_layer_shape;

/* A standalone layer cache (validates the config: VQ_ERR_INVALID_CONFIG; a shape past the
 * limits above: VQ_ERR_INVALID_ARGUMENT). The config is copied; free it whenever. Free the
 * cache with vq_layer_cache_free. */
VQ_C_API vq_status vq_layer_cache_create(const vq_config* config, const vq_layer_shape* shape,
                                         vq_layer_cache** out, vq_error** error);
/* Frees a standalone layer cache; NULL and layers owned by a model cache are ignored. */
VQ_C_API void vq_layer_cache_free(vq_layer_cache* layer);
VQ_C_API const char* vq_layer_last_error(const vq_layer_cache* layer);

/* Phase 1: appends keys/values [B, Hkv, S, D] (same shape and dtype) and describes the view:
 * every kept row followed by the S new ones. VQ_ERR_SHAPE_MISMATCH for a shape that differs
 * from earlier steps (state untouched), VQ_ERR_INVALID_STATE when a step is already open.
 * VQ_ERR_INVALID_ARGUMENT, before any element is read, for a shape past the limits above (or
 * S > 2^31 - 1) and for strides under which two (b, h, s) rows overlap: every row needs its
 * own D elements, so a zero stride along a dimension of size > 1 (a broadcast) is refused
 * (the cache would copy every row it names: 2^28 rows of a 16-byte buffer are 4 GiB). */
VQ_C_API vq_status vq_layer_begin_step(vq_layer_cache* layer, const vq_tensor* keys,
                                       const vq_tensor* values, vq_step_view* view);
/* The open step's rows of (b, h), pointing into cache storage (no copy), valid until
 * vq_layer_end_step. VQ_ERR_INVALID_STATE without an open step. */
VQ_C_API vq_status vq_layer_view_head(vq_layer_cache* layer, int64_t b, int64_t h,
                                      vq_head_rows* out);
/* Phase 2: scores, evicts, merges or quantizes down to the budget. `attention` may be NULL for
 * methods with the proxy score source; methods with source=attention require it. Every
 * probability must be finite and in [0, 1]: VQ_ERR_INVALID_ARGUMENT naming the element
 * otherwise, and the step stays open. A method registered from C++ whose scorer throws
 * (registry.h, RowScorer) gives VQ_ERR_INVALID_ARGUMENT with the scorer's message, and the step
 * is rolled back: closed, its rows forgotten, the cache as before vq_layer_begin_step. */
VQ_C_API vq_status vq_layer_end_step(vq_layer_cache* layer, const vq_attention* attention);
/* Phase 2 with the step's pre-RoPE queries as a second score source (docs/api.md, "Queries"):
 * queries [B, Hq, S, D] (fp32 or fp16, stride[3] = 1; NULL: none), every element finite
 * (VQ_ERR_INVALID_ARGUMENT naming it otherwise). Read by methods scored from the queries
 * (expected_attention; vq_layer_reads_queries), ignored (shape checked) by the others. Such a
 * method fixes at its first step whether queries come (then every step must pass them, and
 * vq_layer_set_rope must have been called) or not (its fallback: the keys stand in for them);
 * VQ_ERR_INVALID_ARGUMENT naming the input otherwise, the step left open.
 * VQ_ERR_SHAPE_MISMATCH for queries not shaped [B, Hq, S, D] of the step. */
VQ_C_API vq_status vq_layer_end_step_queries(vq_layer_cache* layer, const vq_attention* attention,
                                             const vq_tensor* queries);
/* 1 when vq_layer_end_step_queries reads the queries it is passed (0: an engine may skip
 * computing them), 0 for a NULL layer. */
VQ_C_API int vq_layer_reads_queries(const vq_layer_cache* layer);

/* The layer's rotary embedding, for methods that rotate queries to future positions: pair i
 * (i < head_dim / 2) turns by pos x inv_freq[i] (after any frequency scaling); pairing
 * VQ_ROPE_INTERLEAVED pairs elements (2i, 2i+1) (llama2.c, GGUF), VQ_ROPE_HALF_SPLIT pairs
 * (i, i + head_dim/2) (Hugging Face, NeoX). n_pairs = 0: the layer has no rotary embedding. */
enum { VQ_ROPE_INTERLEAVED = 0, VQ_ROPE_HALF_SPLIT = 1 };
typedef struct vq_rope {
  const float* inv_freq; /* [n_pairs], finite and >= 0 */
  int64_t n_pairs;       /* head_dim / 2, or 0 */
  int pairing;           /* VQ_ROPE_INTERLEAVED or VQ_ROPE_HALF_SPLIT */
} vq_rope;
/* Copies `rope` into the layer (set once, before the first step that passes queries).
 * VQ_ERR_INVALID_ARGUMENT for a NULL rope, n_pairs < 0 or not head_dim / 2 (when known), a NULL
 * inv_freq with n_pairs > 0, a frequency not finite or < 0, an unknown pairing. */
VQ_C_API vq_status vq_layer_set_rope(vq_layer_cache* layer, const vq_rope* rope);
/* The rows stored between steps for (b, h) (rows may differ per head); valid until the next
 * step or reset. */
VQ_C_API vq_status vq_layer_stored(vq_layer_cache* layer, int64_t b, int64_t h, vq_head_rows* out);
/* Row `row` of `rows` (plain or packed) as fp32: key and value [head_dim] each (either may be
 * NULL). VQ_ERR_INVALID_ARGUMENT for a NULL `rows` or a row outside [0, n_rows). */
VQ_C_API vq_status vq_head_rows_load(const vq_head_rows* rows, int64_t row, float* key,
                                     float* value);
VQ_C_API vq_status vq_layer_stats(vq_layer_cache* layer, vq_cache_stats* out);
/* Rows kept per (b, h) after the last step: writes min(n, B * Hkv) counts, b-major, and sets
 * *n_heads (may be NULL) to B * Hkv. */
VQ_C_API vq_status vq_layer_kept_per_head(vq_layer_cache* layer, int64_t* counts, size_t n,
                                          size_t* n_heads);
/* Rows kept per KV head after each step (sinks included); -1 when the method keeps all. */
VQ_C_API vq_status vq_layer_budget(vq_layer_cache* layer, int64_t* out);
/* 1 while a step is open. */
VQ_C_API int vq_layer_step_open(const vq_layer_cache* layer);
/* Forgets every token (shape stays fixed); an open step is abandoned. */
VQ_C_API vq_status vq_layer_reset(vq_layer_cache* layer);
/* Head types (duoattention; LayerCache::set_head_pattern in cache.h): one score per KV head
 * (n = n_kv_heads; n = 0 goes back to the on-the-fly estimate), set before the first step.
 * VQ_ERR_INVALID_ARGUMENT for a method without head types, a wrong n or a non-finite score;
 * VQ_ERR_INVALID_STATE after the first step (reset first). Kept across vq_layer_reset. */
VQ_C_API vq_status vq_layer_set_head_pattern(vq_layer_cache* layer, const float* scores, size_t n);
/* Each (b, h) store's type, b-major: writes min(n, B * Hkv) values (0 untyped or not decided
 * yet, 1 retrieval head: keeps every row, 2 streaming head: sinks + window) and sets *n_heads
 * (may be NULL) to B * Hkv (0 before the first step). */
VQ_C_API vq_status vq_layer_head_types(vq_layer_cache* layer, int32_t* types, size_t n,
                                       size_t* n_heads);
/* Key filters [n_kv_heads][head_dim] for a method that scores keys against them (qfilters;
 * LayerCache::set_key_filters in cache.h): n = n_kv_heads x head_dim floats, copied.
 * VQ_ERR_INVALID_ARGUMENT for another n, a NULL `filters` with n > 0 or a non-finite value. A
 * qfilters cache with none set fails its first step with VQ_ERR_INVALID_STATE naming this
 * setter. */
VQ_C_API vq_status vq_layer_set_key_filters(vq_layer_cache* layer, const float* filters, size_t n);
/* 1 when the layer's method needs key filters (qfilters), else 0. */
VQ_C_API int vq_layer_needs_key_filters(const vq_layer_cache* layer);
/* The prompt's question (finch; LayerCache::set_question_length in cache.h): the last n
 * tokens of the layer's next step with new rows are the question, whose queries score the rows
 * before them; 0 (the default): none. Consumed by that step. VQ_ERR_INVALID_ARGUMENT for
 * n < 0 or n > 2^31 - 1 (and from vq_layer_begin_step, naming set_question_length, when n
 * exceeds that step's new rows); VQ_ERR_INVALID_STATE during a step. */
VQ_C_API vq_status vq_layer_set_question_length(vq_layer_cache* layer, int64_t n);
/* 1 when the layer's method reads the question length (finch), else 0. */
VQ_C_API int vq_layer_reads_question(const vq_layer_cache* layer);
/* The layer's output projection for methods that weigh values by it (criticalkv,
 * criticaladakv): gram holds per query head g the head_dim x head_dim Gram matrix
 * G_g = W_o^g^T W_o^g of the slice W_o^g (dim x head_dim) of the output projection that query
 * head g's attention output goes through, row-major [n_query_heads][head_dim][head_dim], fp32;
 * copied. Methods that do not read it check it and ignore it. Without it such a method weighs by
 * ||v||_2. VQ_ERR_INVALID_ARGUMENT (naming set_output_gram) for NULL, counts out of range or
 * unlike the cache's shape, a non-finite entry; VQ_ERR_INVALID_STATE during a step. Layers of a
 * model cache: through vq_model_cache_layer. */
VQ_C_API vq_status vq_layer_set_output_gram(vq_layer_cache* layer, const float* gram,
                                            int64_t n_query_heads, int64_t head_dim);
/* 1 when the layer's method reads vq_layer_set_output_gram's matrices. */
VQ_C_API int vq_layer_reads_output_gram(const vq_layer_cache* layer);
/* Context reconstruction (kvzip; docs/api.md "Reconstruction"). vq_layer_reads_reconstruction:
 * 1 when the method scores rows by a reconstruction pass; vq_layer_reconstruction_chunk: its
 * context tokens per reconstruction step (0 for other methods).
 * vq_layer_set_reconstruction(layer, 1) before the prompt: multi-token steps keep every row
 * until vq_layer_compress (without it a prompt step is cut at once by its own attention).
 * After the prompt, per chunk of the reconstruction input: vq_layer_begin_step with the chunk's
 * keys and values, attention of its queries over the view's rows, then
 * vq_layer_end_reconstruction_step(layer, &probs) ([B, Hq, S, R], data required): the method
 * takes each stored row's max probability and the chunk's rows are forgotten. Then
 * vq_layer_compress cuts to the budget. Errors: VQ_ERR_INVALID_STATE (a step open; no
 * set_reconstruction, or a method that reads no reconstruction, at end_reconstruction_step;
 * compress with no reconstruction step since the prompt; a decode step while a prompt waits),
 * VQ_ERR_SHAPE_MISMATCH (missing or wrongly shaped probabilities); these roll an open step
 * back. A non-finite probability: VQ_ERR_INVALID_ARGUMENT naming it, the step left open. Layers of a model cache:
 * through vq_model_cache_layer. */
VQ_C_API int vq_layer_reads_reconstruction(const vq_layer_cache* layer);
VQ_C_API int64_t vq_layer_reconstruction_chunk(const vq_layer_cache* layer);
VQ_C_API vq_status vq_layer_set_reconstruction(vq_layer_cache* layer, int on);
VQ_C_API vq_status vq_layer_end_reconstruction_step(vq_layer_cache* layer,
                                                    const vq_attention* attention);
VQ_C_API vq_status vq_layer_compress(vq_layer_cache* layer);

/* ---- Model caches ---------------------------------------------------------------------- */

typedef struct vq_model_shape {
  int64_t n_layers, n_kv_heads, head_dim;
  int64_t n_query_heads; /* 0 means n_kv_heads */
} vq_model_shape;

/* One cache per layer (layer i gets seed + i). n_layers in [1, VQ_MAX_LAYERS], n_kv_heads in
 * [1, VQ_MAX_HEADS], head_dim in [1, VQ_MAX_HEAD_DIM]: VQ_ERR_INVALID_ARGUMENT otherwise, before
 * any layer is built. */
VQ_C_API vq_status vq_model_cache_create(const vq_config* config, const vq_model_shape* shape,
                                         vq_model_cache** out, vq_error** error);
VQ_C_API void vq_model_cache_free(vq_model_cache* cache); /* NULL is a no-op */
VQ_C_API const char* vq_model_cache_last_error(const vq_model_cache* cache);
VQ_C_API int64_t vq_model_cache_n_layers(const vq_model_cache* cache);
/* Layer i's cache, owned by the model cache (valid until it is freed; do not free it). Each
 * layer handle keeps its own last error. */
VQ_C_API vq_status vq_model_cache_layer(vq_model_cache* cache, int64_t i, vq_layer_cache** out);
/* Sums over layers (tokens_seen and tokens_kept are layer 0's). */
VQ_C_API vq_status vq_model_cache_stats(vq_model_cache* cache, vq_cache_stats* out);
/* Each layer's current budget (-1: keeps all): writes min(n, n_layers) values. */
VQ_C_API vq_status vq_model_cache_layer_budgets(vq_model_cache* cache, int64_t* out, size_t n);
/* SqueezeAttention's per-layer signal (see builder.h); other methods ignore it. */
VQ_C_API vq_status vq_model_cache_observe_layer_similarity(vq_model_cache* cache, int64_t layer,
                                                           double cosine);
VQ_C_API vq_status vq_model_cache_reset(vq_model_cache* cache);
/* vq_layer_set_head_pattern on every layer: scores is [n_layers][n_kv_heads] row-major
 * (n = n_layers * n_kv_heads; n = 0 clears every layer's pattern). Nothing changes on error. */
VQ_C_API vq_status vq_model_cache_set_head_pattern(vq_model_cache* cache, const float* scores,
                                                   size_t n);
/* Reads a head pattern file (the DuoAttention full_attention_heads.tsv layout: one line per
 * layer, one tab-separated score per KV head; cache.h, load_head_pattern) with the cache's
 * shape and sets it. VQ_ERR_FILE naming the file, line, what was expected and found. */
VQ_C_API vq_status vq_model_cache_load_head_pattern(vq_model_cache* cache, const char* path);
/* vq_layer_set_key_filters on every layer: n = n_layers x n_kv_heads x head_dim floats,
 * layer-major (the layout of a `veloxquant calibrate` file, docs/methods.md). */
VQ_C_API vq_status vq_model_cache_set_key_filters(vq_model_cache* cache, const float* filters,
                                                  size_t n);
/* vq_layer_set_question_length on every layer (checked before any layer changes). */
VQ_C_API vq_status vq_model_cache_set_question_length(vq_model_cache* cache, int64_t n);

/* ---- Saving and restoring a cache's state ------------------------------------------------
 * LayerCache::save_state and its neighbours (cache.h, builder.h; docs/api.md "Saving and
 * restoring a cache"): everything later steps read, not the engine's set-up (RoPE, key
 * filters, output Gram matrices, head pattern, set_reconstruction, expect_positions), so the
 * target must be created from the same config and shape and set up as the saved cache was.
 *
 * *_save_state: the state's size goes to *size (required); the state is written to buf when
 * capacity >= that size. buf NULL with capacity 0 asks for the size only (VQ_OK). A smaller
 * capacity: VQ_ERR_INVALID_ARGUMENT naming both sizes, nothing written. VQ_ERR_INVALID_STATE
 * while a step is open or a reconstruction pass waits for compress.
 * *_load_state: all or nothing (on error the cache is as it was). VQ_ERR_INVALID_ARGUMENT for
 * bytes that are not a state (truncated, checksum, version: the message says what was
 * expected and found) or a state of another config or shape (naming both);
 * VQ_ERR_INVALID_STATE while a step is open.
 * *_save_state_file: written to a temporary file beside `path`, fsynced and renamed over it;
 * VQ_ERR_IO naming the path on failure. *_load_state_file: VQ_ERR_FILE naming the path for a
 * missing, truncated or corrupt file; VQ_ERR_INVALID_ARGUMENT for another config or shape. */
VQ_C_API vq_status vq_layer_save_state(vq_layer_cache* layer, uint8_t* buf, size_t capacity,
                                       size_t* size);
VQ_C_API vq_status vq_layer_load_state(vq_layer_cache* layer, const uint8_t* data, size_t size);
VQ_C_API vq_status vq_layer_save_state_file(vq_layer_cache* layer, const char* path);
VQ_C_API vq_status vq_layer_load_state_file(vq_layer_cache* layer, const char* path);
/* The same for every layer of a model cache and their shared state, in one state. */
VQ_C_API vq_status vq_model_cache_save_state(vq_model_cache* cache, uint8_t* buf, size_t capacity,
                                             size_t* size);
VQ_C_API vq_status vq_model_cache_load_state(vq_model_cache* cache, const uint8_t* data,
                                             size_t size);
VQ_C_API vq_status vq_model_cache_save_state_file(vq_model_cache* cache, const char* path);
VQ_C_API vq_status vq_model_cache_load_state_file(vq_model_cache* cache, const char* path);

#ifdef __cplusplus
}
#endif

#endif /* VELOXQUANT_C_H */
