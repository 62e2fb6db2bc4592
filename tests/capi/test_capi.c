/* The C API seen from C (compiled as C99 -pedantic, linked against libveloxquant.so).
 *
 * Expected values are derived by hand from the method definitions (docs/methods.md):
 * StreamingLLM keeps the n_sink first positions plus the most recent budget - n_sink; TOVA with
 * the attention source evicts the non-sink row the newest query attends to least; storage is
 * fp16, so kept bytes = rows x heads x (K + V) x head_dim x 2. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "veloxquant/veloxquant_c.h"

static int failures = 0;

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                              \
    }                                                                          \
  } while (0)

#define CHECK_EQ_I64(a, b)                                                                       \
  do {                                                                                           \
    long long va_ = (long long)(a), vb_ = (long long)(b);                                        \
    if (va_ != vb_) {                                                                            \
      fprintf(stderr, "%s:%d: %s == %s failed: %lld vs %lld\n", __FILE__, __LINE__, #a, #b, va_, \
              vb_);                                                                              \
      ++failures;                                                                                \
    }                                                                                            \
  } while (0)

/* Reads element d of row r of a head's rows as float (fp16 decoded by hand for the values the
 * tests use: multiples of 1/4 in [-128, 128]). */
static float half_bits_to_float(uint16_t h) {
  const int sign = (h >> 15) & 1, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  float v;
  if (exponent == 0) {
    v = ldexpf((float)mantissa, -24);
  } else {
    v = ldexpf((float)(mantissa | 0x400), exponent - 25);
  }
  return sign ? -v : v;
}

static float row_elem(const void* base, vq_dtype dtype, int64_t stride, int64_t r, int64_t d) {
  if (dtype == VQ_DTYPE_F32) return ((const float*)base)[r * stride + d];
  return half_bits_to_float(((const uint16_t*)base)[r * stride + d]);
}

/* keys[h][d] of the token at `pos`: pos + h/2 + d/4 (exact in fp16 below 512). */
static float key_of(int pos, int h, int d) {
  return (float)pos + 0.5f * (float)h + 0.25f * (float)d;
}
static float value_of(int pos, int h, int d) { return -(float)pos - 0.25f * (float)d - (float)h; }

static void test_version_and_errors(void) {
  vq_config* config = NULL;
  vq_error* error = NULL;
  CHECK_EQ_I64(vq_abi_version(), VQ_ABI_VERSION);
  CHECK(strlen(vq_version()) >= 5);
  CHECK(strcmp(vq_status_name(VQ_ERR_SHAPE_MISMATCH), "shape_mismatch") == 0);

  /* A budget of 0 is out of range; the message names the field and the value. */
  CHECK_EQ_I64(vq_config_parse("h2o:budget=0", &config, &error), VQ_ERR_INVALID_CONFIG);
  CHECK(config == NULL);
  CHECK(error != NULL);
  CHECK_EQ_I64(vq_error_status(error), VQ_ERR_INVALID_CONFIG);
  CHECK(strstr(vq_error_message(error), "h2o_budget") != NULL);
  CHECK(strstr(vq_error_message(error), "got 0") != NULL);
  vq_error_free(error);
  error = NULL;

  CHECK_EQ_I64(vq_config_parse("no_such_method", &config, &error), VQ_ERR_UNKNOWN_METHOD);
  CHECK(strstr(vq_error_message(error), "no_such_method") != NULL);
  vq_error_free(error);
  error = NULL;
  CHECK_EQ_I64(vq_config_parse("h2o:budget", &config, &error), VQ_ERR_INVALID_SPEC);
  vq_error_free(error);
  error = NULL;
  CHECK_EQ_I64(vq_config_parse("h2o:colour=red", &config, &error), VQ_ERR_INVALID_SPEC);
  CHECK(strstr(vq_error_message(error), "colour") != NULL);
  vq_error_free(error);
  /* Without an error object the status still comes back. */
  CHECK_EQ_I64(vq_config_parse("h2o:budget=1", &config, NULL), VQ_ERR_INVALID_CONFIG);
  CHECK_EQ_I64(vq_config_parse(NULL, &config, NULL), VQ_ERR_INVALID_ARGUMENT);
  CHECK_EQ_I64(vq_config_create("full", NULL, NULL), VQ_ERR_INVALID_ARGUMENT);
  vq_error_free(NULL);
  CHECK(strcmp(vq_error_message(NULL), "") == 0);
}

static void test_config(void) {
  vq_config* c = NULL;
  vq_config* copy = NULL;
  int64_t i = 0;
  const char* text = NULL;
  int b = -1;
  CHECK_EQ_I64(vq_config_parse("streaming_llm:n_sink=2,window_size=6", &c, NULL), VQ_OK);
  CHECK(strcmp(vq_config_method(c), "streaming_llm") == 0);
  /* Keys resolve with or without the method prefix. */
  CHECK_EQ_I64(vq_config_get_int(c, "n_sink", &i), VQ_OK);
  CHECK_EQ_I64(i, 2);
  CHECK_EQ_I64(vq_config_get_int(c, "stream_window_size", &i), VQ_OK);
  CHECK_EQ_I64(i, 6);
  CHECK_EQ_I64(vq_config_token_budget(c, &i), VQ_OK);
  CHECK_EQ_I64(i, 8); /* n_sink + window_size */
  CHECK_EQ_I64(vq_config_get_enum(c, "merge", &text), VQ_OK);
  CHECK(strcmp(text, "drop") == 0);
  CHECK_EQ_I64(vq_config_get_float(c, "n_sink", NULL), VQ_ERR_INVALID_ARGUMENT);
  CHECK_EQ_I64(vq_config_get_bool(c, "no_such_key", &b), VQ_ERR_INVALID_ARGUMENT);
  CHECK(strstr(vq_config_last_error(c), "no_such_key") != NULL);

  CHECK_EQ_I64(vq_config_spec(c, 0, &text), VQ_OK);
  CHECK(strstr(text, "streaming_llm:") == text);
  CHECK(strstr(text, "stream_n_sink=2") != NULL);
  CHECK(strstr(text, "stream_window_size=6") != NULL);

  /* Setting an out-of-range value is accepted, validation rejects it and names the field. */
  CHECK_EQ_I64(vq_config_set(c, "n_sink", "abc"), VQ_ERR_INVALID_SPEC);
  CHECK_EQ_I64(vq_config_set(c, "window_size", "0"), VQ_OK);
  CHECK_EQ_I64(vq_config_validate(c), VQ_ERR_INVALID_CONFIG);
  CHECK(strstr(vq_config_last_error(c), "stream_window_size") != NULL);
  CHECK_EQ_I64(vq_config_set(c, "window_size", "6"), VQ_OK);
  CHECK_EQ_I64(vq_config_validate(c), VQ_OK);

  CHECK_EQ_I64(vq_config_clone(c, &copy, NULL), VQ_OK);
  CHECK_EQ_I64(vq_config_set_token_budget(copy, 20), VQ_OK);
  CHECK_EQ_I64(vq_config_get_int(copy, "window_size", &i), VQ_OK);
  CHECK_EQ_I64(i, 18); /* budget 20 = 2 sinks + 18 */
  CHECK_EQ_I64(vq_config_get_int(c, "window_size", &i), VQ_OK);
  CHECK_EQ_I64(i, 6); /* the original is untouched */
  vq_config_free(copy);
  vq_config_free(c);

  CHECK_EQ_I64(vq_config_create("full", &c, NULL), VQ_OK);
  CHECK_EQ_I64(vq_config_token_budget(c, &i), VQ_ERR_INVALID_CONFIG);
  vq_config_free(c);
  vq_config_free(NULL);
}

static void test_registry(void) {
  size_t n = vq_registry_count(), i, f, full = 99, h2o = 99;
  vq_method_info m;
  vq_field_info fi;
  CHECK(n >= 10);
  CHECK_EQ_I64(vq_registry_find("full", &full), VQ_OK);
  CHECK_EQ_I64(vq_registry_find("h2o", &h2o), VQ_OK);
  CHECK_EQ_I64(vq_registry_find("nope", &i), VQ_ERR_UNKNOWN_METHOD);
  CHECK_EQ_I64(vq_registry_method(n, &m), VQ_ERR_INVALID_ARGUMENT);
  CHECK_EQ_I64(vq_registry_method(full, &m), VQ_OK);
  CHECK(strcmp(m.id, "full") == 0);
  CHECK_EQ_I64(m.has_token_budget, 0);
  CHECK_EQ_I64(vq_registry_method(h2o, &m), VQ_OK);
  CHECK(strcmp(m.id, "h2o") == 0 && strcmp(m.prefix, "h2o") == 0);
  CHECK_EQ_I64(m.has_token_budget, 1);
  CHECK_EQ_I64(vq_registry_field(h2o, m.n_fields, &fi), VQ_ERR_INVALID_ARGUMENT);

  /* Every method: its defaults are a valid config, and every field's default text, set back
   * into it, is accepted and lies within the advertised range or choices. */
  for (i = 0; i < n; ++i) {
    vq_config* c = NULL;
    const char* spec = NULL;
    CHECK_EQ_I64(vq_registry_method(i, &m), VQ_OK);
    CHECK_EQ_I64(vq_config_create(m.id, &c, NULL), VQ_OK);
    CHECK_EQ_I64(vq_config_validate(c), VQ_OK);
    CHECK_EQ_I64(vq_config_spec(c, 0, &spec), VQ_OK);
    CHECK(strcmp(spec, m.id) == 0);
    for (f = 0; f < m.n_fields; ++f) {
      CHECK_EQ_I64(vq_registry_field(i, f, &fi), VQ_OK);
      CHECK(fi.name != NULL && fi.doc != NULL && fi.allowed_text != NULL);
      CHECK_EQ_I64(vq_config_set(c, fi.name, fi.default_text), VQ_OK);
      if (fi.type == VQ_FIELD_INT || fi.type == VQ_FIELD_FLOAT) {
        const double v = atof(fi.default_text);
        CHECK(fi.min <= v && v <= fi.max);
      } else {
        size_t k;
        int found = 0;
        CHECK(fi.n_choices >= 2);
        for (k = 0; k < fi.n_choices; ++k) found |= strcmp(fi.choices[k], fi.default_text) == 0;
        CHECK(found);
      }
    }
    CHECK_EQ_I64(vq_config_spec(c, 0, &spec), VQ_OK);
    CHECK(strcmp(spec, m.id) == 0);
    vq_config_free(c);
  }
}

/* StreamingLLM, 2 sinks + window 6, Hkv = 2, D = 4, fed one token at a time (fp32), with the
 * view checked at every step and the stored rows after it. */
static void test_streaming_steps(void) {
  enum { H = 2, D = 4, N = 20 };
  vq_config* c = NULL;
  vq_layer_cache* layer = NULL;
  vq_layer_cache* other = NULL;
  const vq_layer_shape shape = {H, D, 0, 0, 1};
  float k[H * D], v[H * D];
  vq_tensor keys = {NULL, VQ_DTYPE_F32, {1, H, 1, D}, {H * D, D, D, 1}};
  vq_tensor values;
  vq_step_view view;
  vq_head_rows rows;
  vq_cache_stats s;
  int64_t counts[4] = {0, 0, 0, 0}, budget = 0;
  size_t n_heads = 0;
  int pos, h, d, r;
  keys.data = k;
  values = keys;
  values.data = v;

  CHECK_EQ_I64(vq_config_parse("streaming_llm:n_sink=2,window_size=6", &c, NULL), VQ_OK);
  CHECK_EQ_I64(vq_layer_cache_create(c, &shape, &layer, NULL), VQ_OK);
  CHECK_EQ_I64(vq_layer_cache_create(c, &shape, &other, NULL), VQ_OK);
  vq_config_free(c); /* the cache holds its own copy */
  CHECK_EQ_I64(vq_layer_budget(layer, &budget), VQ_OK);
  CHECK_EQ_I64(budget, 8);

  CHECK_EQ_I64(vq_layer_end_step(layer, NULL), VQ_ERR_INVALID_STATE);
  CHECK(strstr(vq_layer_last_error(layer), "") != NULL && strlen(vq_layer_last_error(layer)) > 0);
  CHECK(strlen(vq_layer_last_error(other)) == 0); /* errors are per handle */
  CHECK_EQ_I64(vq_layer_view_head(layer, 0, 0, &rows), VQ_ERR_INVALID_STATE);

  for (pos = 0; pos < N; ++pos) {
    const int kept_before = pos < 8 ? pos : 8;
    for (h = 0; h < H; ++h) {
      for (d = 0; d < D; ++d) {
        k[h * D + d] = key_of(pos, h, d);
        v[h * D + d] = value_of(pos, h, d);
      }
    }
    CHECK_EQ_I64(vq_layer_begin_step(layer, &keys, &values, &view), VQ_OK);
    CHECK_EQ_I64(vq_layer_step_open(layer), 1);
    CHECK_EQ_I64(view.batch, 1);
    CHECK_EQ_I64(view.n_kv_heads, H);
    CHECK_EQ_I64(view.head_dim, D);
    CHECK_EQ_I64(view.n_new, 1);
    /* Deferred eviction: the view holds every kept row plus the new one. */
    CHECK_EQ_I64(view.n_rows, kept_before + 1);
    CHECK_EQ_I64(vq_layer_begin_step(layer, &keys, &values, &view), VQ_ERR_INVALID_STATE);
    for (h = 0; h < H; ++h) {
      CHECK_EQ_I64(vq_layer_view_head(layer, 0, h, &rows), VQ_OK);
      CHECK_EQ_I64(rows.n_rows, kept_before + 1);
      CHECK_EQ_I64(rows.dtype, VQ_DTYPE_F16);
      for (r = 0; r < rows.n_rows; ++r) {
        /* Sinks 0, 1, then the most recent positions up to `pos`. */
        const int expect = r < 2 || pos < 8 ? r : pos - (int)rows.n_rows + 1 + r;
        CHECK_EQ_I64(rows.positions[r], expect);
        for (d = 0; d < D; ++d) {
          CHECK(row_elem(rows.keys, rows.dtype, rows.row_stride, r, d) == key_of(expect, h, d));
          CHECK(row_elem(rows.values, rows.dtype, rows.row_stride, r, d) == value_of(expect, h, d));
        }
      }
    }
    CHECK_EQ_I64(vq_layer_view_head(layer, 0, H, &rows), VQ_ERR_INVALID_ARGUMENT);
    CHECK_EQ_I64(vq_layer_end_step(layer, NULL), VQ_OK);
    CHECK_EQ_I64(vq_layer_step_open(layer), 0);
  }
  /* After 20 tokens: positions 0, 1, 14..19. */
  for (h = 0; h < H; ++h) {
    const int expect[8] = {0, 1, 14, 15, 16, 17, 18, 19};
    CHECK_EQ_I64(vq_layer_stored(layer, 0, h, &rows), VQ_OK);
    CHECK_EQ_I64(rows.n_rows, 8);
    for (r = 0; r < 8 && r < rows.n_rows; ++r) CHECK_EQ_I64(rows.positions[r], expect[r]);
  }
  CHECK_EQ_I64(vq_layer_stored(layer, 1, 0, &rows), VQ_ERR_INVALID_ARGUMENT);
  CHECK_EQ_I64(vq_layer_kept_per_head(layer, counts, 4, &n_heads), VQ_OK);
  CHECK_EQ_I64(n_heads, 2);
  CHECK_EQ_I64(counts[0], 8);
  CHECK_EQ_I64(counts[1], 8);
  CHECK_EQ_I64(counts[2], 0); /* beyond B * Hkv: untouched */

  CHECK_EQ_I64(vq_layer_stats(layer, &s), VQ_OK);
  CHECK_EQ_I64(s.tokens_seen, 20);
  CHECK_EQ_I64(s.tokens_kept, 8);
  CHECK_EQ_I64(s.kept_bytes, 8 * H * 2 * D * 2);  /* rows x heads x (K+V) x D x fp16 */
  CHECK_EQ_I64(s.full_bytes, 20 * H * 2 * D * 2); /* every token seen at fp16 */
  CHECK(fabs(s.compression_ratio - 2.5) < 1e-12);
  CHECK_EQ_I64(s.evictions, 12 * H);
  CHECK_EQ_I64(s.merges, 0);
  CHECK(s.allocated_bytes >= s.kept_bytes);
  CHECK(s.resident_bytes >= s.allocated_bytes);

  /* A different head_dim is a shape mismatch that leaves the state untouched. */
  keys.shape[3] = values.shape[3] = 2;
  CHECK_EQ_I64(vq_layer_begin_step(layer, &keys, &values, &view), VQ_ERR_SHAPE_MISMATCH);
  CHECK(strlen(vq_layer_last_error(layer)) > 0);
  keys.shape[3] = values.shape[3] = D;
  keys.dtype = (vq_dtype)7;
  CHECK_EQ_I64(vq_layer_begin_step(layer, &keys, &values, &view), VQ_ERR_SHAPE_MISMATCH);
  keys.dtype = VQ_DTYPE_F32;
  CHECK_EQ_I64(vq_layer_begin_step(layer, NULL, &values, &view), VQ_ERR_INVALID_ARGUMENT);
  CHECK_EQ_I64(vq_layer_stats(layer, &s), VQ_OK);
  CHECK_EQ_I64(s.tokens_seen, 20);
  CHECK_EQ_I64(vq_layer_step_open(layer), 0);

  CHECK_EQ_I64(vq_layer_reset(layer), VQ_OK);
  CHECK_EQ_I64(vq_layer_stats(layer, &s), VQ_OK);
  CHECK_EQ_I64(s.tokens_seen, 0);
  CHECK_EQ_I64(s.kept_bytes, 0);
  vq_layer_cache_free(layer);
  vq_layer_cache_free(other);
  vq_layer_cache_free(NULL);
}

/* Strided and fp16 inputs: a chunk of 3 tokens given token-major ([S][H][D] memory, strides
 * {.., D, H*D, 1}) in fp16 stores the same values as the same tokens given contiguously. */
static void test_strides_and_f16(void) {
  enum { H = 2, D = 4, S = 3 };
  vq_config* c = NULL;
  vq_layer_cache* layer = NULL;
  const vq_layer_shape shape = {0, 0, 0, 0, 1}; /* taken from the first step */
  uint16_t k[S * H * D], v[S * H * D];
  vq_tensor keys = {NULL, VQ_DTYPE_F16, {1, H, S, D}, {S * H * D, D, H * D, 1}};
  vq_tensor values;
  vq_step_view view;
  vq_head_rows rows;
  int s, h, d, r;
  /* fp16 bit patterns by hand: 1 = 0x3C00, 2 = 0x4000, 0.5 = 0x3800, -1 = 0xBC00; element
   * (s, h, d) gets pattern[(s + 2h + d) % 4]. */
  const uint16_t pattern[4] = {0x3C00, 0x4000, 0x3800, 0xBC00};
  const float decoded[4] = {1.0f, 2.0f, 0.5f, -1.0f};
  for (s = 0; s < S; ++s) {
    for (h = 0; h < H; ++h) {
      for (d = 0; d < D; ++d) {
        k[(s * H + h) * D + d] = pattern[(s + 2 * h + d) % 4];
        v[(s * H + h) * D + d] = pattern[(s + 2 * h + d + 1) % 4];
      }
    }
  }
  keys.data = k;
  values = keys;
  values.data = v;
  CHECK_EQ_I64(vq_config_parse("full", &c, NULL), VQ_OK);
  CHECK_EQ_I64(vq_layer_cache_create(c, &shape, &layer, NULL), VQ_OK);
  CHECK_EQ_I64(vq_layer_begin_step(layer, &keys, &values, &view), VQ_OK);
  CHECK_EQ_I64(view.n_rows, S);
  CHECK_EQ_I64(view.n_new, S);
  for (h = 0; h < H; ++h) {
    CHECK_EQ_I64(vq_layer_view_head(layer, 0, h, &rows), VQ_OK);
    for (r = 0; r < S; ++r) {
      CHECK_EQ_I64(rows.positions[r], r);
      for (d = 0; d < D; ++d) {
        CHECK(row_elem(rows.keys, rows.dtype, rows.row_stride, r, d) ==
              decoded[(r + 2 * h + d) % 4]);
        CHECK(row_elem(rows.values, rows.dtype, rows.row_stride, r, d) ==
              decoded[(r + 2 * h + d + 1) % 4]);
      }
    }
  }
  CHECK_EQ_I64(vq_layer_end_step(layer, NULL), VQ_OK);
  /* A non-unit innermost stride is rejected. */
  keys.stride[3] = 2;
  CHECK_EQ_I64(vq_layer_begin_step(layer, &keys, &values, &view), VQ_ERR_SHAPE_MISMATCH);
  vq_layer_cache_free(layer);
  vq_config_free(c);
}

/* TOVA with the attention source: budget 3 with 1 sink. At the fourth token the probabilities
 * over the 4 rows are {0.1, 0.5, 0.05, 0.35}; row 0 is a sink, so row 2 (0.05) leaves. */
static void test_attention_input(void) {
  vq_config* c = NULL;
  vq_model_cache* model = NULL;
  vq_layer_cache* layer = NULL;
  vq_layer_cache* layer1 = NULL;
  const vq_model_shape shape = {2, 1, 2, 1};
  float kv[2] = {0.0f, 0.0f};
  vq_tensor t = {NULL, VQ_DTYPE_F32, {1, 1, 1, 2}, {2, 2, 2, 1}};
  vq_step_view view;
  vq_head_rows rows;
  vq_cache_stats s;
  int64_t budgets[2] = {0, 0};
  const float probs[4][4] = {
      {1, 0, 0, 0}, {0.5f, 0.5f, 0, 0}, {0.25f, 0.25f, 0.5f, 0}, {0.1f, 0.5f, 0.05f, 0.35f}};
  vq_attention a = {NULL, 1, 1, 1, 0};
  int pos;
  t.data = kv;
  CHECK_EQ_I64(vq_config_parse("tova:budget=3,n_sink=1,source=attention", &c, NULL), VQ_OK);
  CHECK_EQ_I64(vq_model_cache_create(c, &shape, &model, NULL), VQ_OK);
  CHECK_EQ_I64(vq_model_cache_n_layers(model), 2);
  CHECK_EQ_I64(vq_model_cache_layer(model, 2, &layer), VQ_ERR_INVALID_ARGUMENT);
  /* The shared validators' wording (base/validate.h), as the CLI and Python give it. */
  CHECK(strcmp(vq_model_cache_last_error(model),
               "[capi] vq_model_cache_layer: i must be an integer in [0, 1], got 2") == 0);
  CHECK_EQ_I64(vq_model_cache_layer(model, INT64_MIN, &layer), VQ_ERR_INVALID_ARGUMENT);
  CHECK(strstr(vq_model_cache_last_error(model),
               "i must be an integer in [0, 1], got -9223372036854775808") != NULL);
  CHECK_EQ_I64(vq_model_cache_layer(model, 0, &layer), VQ_OK);
  CHECK_EQ_I64(vq_model_cache_layer(model, 1, &layer1), VQ_OK);
  CHECK_EQ_I64(vq_model_cache_layer_budgets(model, budgets, 2), VQ_OK);
  CHECK_EQ_I64(budgets[0], 3);
  CHECK_EQ_I64(budgets[1], 3);
  for (pos = 0; pos < 4; ++pos) {
    kv[0] = (float)pos;
    CHECK_EQ_I64(vq_layer_begin_step(layer, &t, &t, &view), VQ_OK);
    CHECK_EQ_I64(view.n_rows, pos + 1);
    /* Wrongly shaped probabilities are rejected; the step stays open. */
    a.data = probs[pos];
    a.n_rows = view.n_rows + 1;
    CHECK_EQ_I64(vq_layer_end_step(layer, &a), VQ_ERR_SHAPE_MISMATCH);
    CHECK_EQ_I64(vq_layer_step_open(layer), 1);
    a.n_rows = view.n_rows;
    CHECK_EQ_I64(vq_layer_end_step(layer, &a), VQ_OK);
  }
  CHECK_EQ_I64(vq_layer_stored(layer, 0, 0, &rows), VQ_OK);
  CHECK_EQ_I64(rows.n_rows, 3);
  if (rows.n_rows == 3) {
    CHECK_EQ_I64(rows.positions[0], 0);
    CHECK_EQ_I64(rows.positions[1], 1);
    CHECK_EQ_I64(rows.positions[2], 3);
  }
  /* The layers are independent: layer 1 has seen nothing; the model's tokens are layer 0's. */
  CHECK_EQ_I64(vq_layer_stats(layer1, &s), VQ_OK);
  CHECK_EQ_I64(s.tokens_seen, 0);
  CHECK_EQ_I64(vq_model_cache_stats(model, &s), VQ_OK);
  CHECK_EQ_I64(s.tokens_seen, 4);
  CHECK_EQ_I64(s.tokens_kept, 3);
  CHECK_EQ_I64(s.kept_bytes, 3 * 1 * 2 * 2 * 2);
  CHECK_EQ_I64(s.evictions, 1);
  CHECK_EQ_I64(vq_model_cache_reset(model), VQ_OK);
  CHECK_EQ_I64(vq_model_cache_stats(model, &s), VQ_OK);
  CHECK_EQ_I64(s.tokens_seen, 0);
  vq_layer_cache_free(layer); /* owned by the model cache: ignored */
  vq_model_cache_free(model);
  vq_config_free(c);
}

/* Two threads drive two layers of one model cache at once, each making its own kind of failing
 * call between good steps: every layer handle keeps its own last error (no global state), and
 * both layers end with StreamingLLM's hand-derived state. */
typedef struct {
  vq_layer_cache* layer;
  int kind; /* 0: end_step without a step; 1: view_head with a bad head */
  int failures;
} Worker;

static void* drive(void* arg) {
  Worker* w = (Worker*)arg;
  float kv[4] = {0.5f, 1.0f, -1.0f, 2.0f};
  const vq_tensor t = {kv, VQ_DTYPE_F32, {1, 1, 1, 4}, {4, 4, 4, 1}};
  vq_step_view view;
  vq_head_rows rows;
  int pos;
  for (pos = 0; pos < 300; ++pos) {
    if (vq_layer_begin_step(w->layer, &t, &t, &view) != VQ_OK) ++w->failures;
    if (vq_layer_view_head(w->layer, 0, 0, &rows) != VQ_OK) ++w->failures;
    if (w->kind == 1 && vq_layer_view_head(w->layer, 0, 5, &rows) != VQ_ERR_INVALID_ARGUMENT)
      ++w->failures;
    if (vq_layer_end_step(w->layer, NULL) != VQ_OK) ++w->failures;
    if (w->kind == 0 && vq_layer_end_step(w->layer, NULL) != VQ_ERR_INVALID_STATE) ++w->failures;
  }
  return NULL;
}

static void test_threads(void) {
  vq_config* c = NULL;
  vq_model_cache* model = NULL;
  const vq_model_shape shape = {2, 1, 4, 1};
  Worker w[2];
  pthread_t th[2];
  vq_cache_stats s;
  int i;
  CHECK_EQ_I64(vq_config_parse("streaming_llm:n_sink=2,window_size=6", &c, NULL), VQ_OK);
  CHECK_EQ_I64(vq_model_cache_create(c, &shape, &model, NULL), VQ_OK);
  for (i = 0; i < 2; ++i) {
    w[i].kind = i;
    w[i].failures = 0;
    CHECK_EQ_I64(vq_model_cache_layer(model, i, &w[i].layer), VQ_OK);
  }
  for (i = 0; i < 2; ++i) CHECK(pthread_create(&th[i], NULL, drive, &w[i]) == 0);
  for (i = 0; i < 2; ++i) CHECK(pthread_join(th[i], NULL) == 0);
  for (i = 0; i < 2; ++i) {
    CHECK_EQ_I64(w[i].failures, 0);
    CHECK_EQ_I64(vq_layer_stats(w[i].layer, &s), VQ_OK);
    CHECK_EQ_I64(s.tokens_seen, 300);
    CHECK_EQ_I64(s.tokens_kept, 8);
    CHECK_EQ_I64(s.evictions, 292);
  }
  CHECK(strstr(vq_layer_last_error(w[0].layer), "without an open step") != NULL);
  CHECK(strstr(vq_layer_last_error(w[1].layer), "without an open step") == NULL);
  CHECK(strstr(vq_layer_last_error(w[1].layer),
               "[capi] vq_layer_view_head: (b, h): h must be an integer in [0, 0], got 5") != NULL);
  CHECK(strlen(vq_model_cache_last_error(model)) == 0);
  vq_model_cache_free(model);
  vq_config_free(c);
}

/* Misuse the API can guard (issue 23): NULLs, wrong shapes, calls out of order, non-finite
 * data, and the demote tier at its range edge. Each returns a status with a message, never
 * aborts, and leaves the cache usable. */
static void test_misuse(void) {
  enum { H = 2, D = 4 };
  vq_config* c = NULL;
  vq_layer_cache* layer = NULL;
  const vq_layer_shape shape = {H, D, 0, 0, 1};
  float k[H * D], v[H * D], probs[H * 2];
  vq_tensor keys = {NULL, VQ_DTYPE_F32, {1, H, 1, D}, {H * D, D, D, 1}};
  vq_tensor values, wrong;
  vq_attention att;
  vq_step_view view;
  vq_head_rows rows;
  vq_cache_stats st;
  int i, pos;
  const float nan_value = (float)NAN, inf_value = (float)INFINITY;
  keys.data = k;
  values = keys;
  values.data = v;
  for (i = 0; i < H * D; ++i) k[i] = v[i] = 0.5f;

  /* NULLs */
  CHECK_EQ_I64(vq_config_parse(NULL, &c, NULL), VQ_ERR_INVALID_ARGUMENT);
  CHECK_EQ_I64(vq_config_parse("h2o", NULL, NULL), VQ_ERR_INVALID_ARGUMENT);
  CHECK_EQ_I64(vq_layer_cache_create(NULL, &shape, &layer, NULL), VQ_ERR_INVALID_ARGUMENT);
  CHECK_EQ_I64(vq_layer_begin_step(NULL, &keys, &values, &view), VQ_ERR_INVALID_ARGUMENT);
  CHECK_EQ_I64(vq_config_parse("h2o:budget=8,n_sink=1,grace=1", &c, NULL), VQ_OK);
  CHECK_EQ_I64(vq_layer_cache_create(c, NULL, &layer, NULL), VQ_ERR_INVALID_ARGUMENT);
  CHECK_EQ_I64(vq_layer_cache_create(c, &shape, &layer, NULL), VQ_OK);
  CHECK_EQ_I64(vq_layer_begin_step(layer, NULL, &values, &view), VQ_ERR_INVALID_ARGUMENT);
  CHECK(strstr(vq_layer_last_error(layer), "keys") != NULL);

  /* Out of order: end before begin, view before begin, begin twice. */
  CHECK_EQ_I64(vq_layer_end_step(layer, NULL), VQ_ERR_INVALID_STATE);
  CHECK_EQ_I64(vq_layer_view_head(layer, 0, 0, &rows), VQ_ERR_INVALID_STATE);
  CHECK_EQ_I64(vq_layer_begin_step(layer, &keys, &values, &view), VQ_OK);
  CHECK_EQ_I64(vq_layer_begin_step(layer, &keys, &values, &view), VQ_ERR_INVALID_STATE);

  /* Wrong shapes: attention of the wrong size, keys of the wrong head count. */
  att.data = probs;
  att.batch = 1;
  att.n_query_heads = H;
  att.n_queries = 1;
  att.n_rows = 2; /* the view has 1 row */
  for (i = 0; i < H * 2; ++i) probs[i] = 1.0f;
  CHECK_EQ_I64(vq_layer_end_step(layer, &att), VQ_ERR_SHAPE_MISMATCH);
  att.n_rows = 1;
  att.data = NULL;
  CHECK_EQ_I64(vq_layer_end_step(layer, &att), VQ_ERR_INVALID_ARGUMENT);
  att.data = probs;

  /* Non-finite attention: refused, the step stays open, then a good one closes it. */
  probs[1] = nan_value;
  CHECK_EQ_I64(vq_layer_end_step(layer, &att), VQ_ERR_INVALID_ARGUMENT);
  CHECK(strstr(vq_layer_last_error(layer), "is nan") != NULL);
  CHECK_EQ_I64(vq_layer_step_open(layer), 1);
  /* A finite value outside [0, 1] is no probability either (3e38 would overflow a summed
     score): refused naming the element and the value. */
  probs[1] = 3e38f;
  CHECK_EQ_I64(vq_layer_end_step(layer, &att), VQ_ERR_INVALID_ARGUMENT);
  CHECK(strstr(vq_layer_last_error(layer), "(0, 1, 0, 0) is 3.00000001e+38") != NULL);
  probs[1] = -0.25f;
  CHECK_EQ_I64(vq_layer_end_step(layer, &att), VQ_ERR_INVALID_ARGUMENT);
  CHECK(strstr(vq_layer_last_error(layer), "is -0.25; attention probabilities must be finite and "
                                           "in [0, 1]") != NULL);
  CHECK_EQ_I64(vq_layer_step_open(layer), 1);
  probs[1] = 1.0f;
  CHECK_EQ_I64(vq_layer_end_step(layer, &att), VQ_OK);

  wrong = keys;
  wrong.shape[1] = H + 1; /* more heads than the layer: a shape error, not a read past k */
  CHECK_EQ_I64(vq_layer_begin_step(layer, &wrong, &wrong, &view), VQ_ERR_SHAPE_MISMATCH);

  /* Non-finite keys and values: refused before anything is stored. */
  k[5] = nan_value;
  CHECK_EQ_I64(vq_layer_begin_step(layer, &keys, &values, &view), VQ_ERR_INVALID_ARGUMENT);
  CHECK(strstr(vq_layer_last_error(layer), "keys element (b, h, s, d) = (0, 1, 0, 1) is nan") !=
        NULL);
  k[5] = 0.5f;
  v[0] = -inf_value;
  CHECK_EQ_I64(vq_layer_begin_step(layer, &keys, &values, &view), VQ_ERR_INVALID_ARGUMENT);
  CHECK(strstr(vq_layer_last_error(layer), "values element") != NULL);
  CHECK(strstr(vq_layer_last_error(layer), "is -inf") != NULL);
  v[0] = 0.5f;
  CHECK_EQ_I64(vq_layer_stats(layer, &st), VQ_OK);
  CHECK_EQ_I64(st.tokens_seen, 1);
  CHECK_EQ_I64(vq_layer_step_open(layer), 0);
  vq_layer_cache_free(layer);
  vq_config_free(c);

  /* demote_budget = 0, inside its documented range [-1, ...]: runs (the tier holds no row, every
   * demoted row is dropped), where it used to abort at the first eviction. */
  CHECK_EQ_I64(vq_config_parse("h2o:budget=8,n_sink=1,grace=1,demote=kivi2,demote_budget=0", &c,
                               NULL),
               VQ_OK);
  CHECK_EQ_I64(vq_layer_cache_create(c, &shape, &layer, NULL), VQ_OK);
  for (pos = 0; pos < 20; ++pos) {
    CHECK_EQ_I64(vq_layer_begin_step(layer, &keys, &values, &view), VQ_OK);
    CHECK_EQ_I64(vq_layer_end_step(layer, NULL), VQ_OK);
  }
  CHECK_EQ_I64(vq_layer_stats(layer, &st), VQ_OK);
  CHECK_EQ_I64(st.tokens_kept, 8);
  vq_layer_cache_free(layer);
  vq_config_free(c);
}

/* Issue 33: shapes past the documented limits (VQ_MAX_*) and inputs whose rows alias are refused
 * with VQ_ERR_INVALID_ARGUMENT before anything is allocated or read. Each call returns at once:
 * before the limits, 10^8 layers built 10^8 layer caches, and 2^28 zero-stride rows were scanned
 * and copied (4 GiB) before any error. */
static void test_shape_limits(void) {
  vq_config* c = NULL;
  vq_error* error = NULL;
  vq_model_cache* model = NULL;
  vq_layer_cache* layer = NULL;
  vq_model_shape ms = {100000000, 2, 8, 0};
  vq_layer_shape ls = {1, 4, 0, 0, 1};
  vq_step_view view;
  vq_cache_stats st;
  float buffer[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  /* 2^28 tokens of one 4-float row: every stride but head_dim's is 0. */
  vq_tensor broadcast = {buffer, VQ_DTYPE_F32, {1, 1, 268435456, 4}, {0, 0, 0, 1}};
  /* Two tokens 2 floats apart with rows of 4: they share elements 2 and 3. */
  vq_tensor overlap = {buffer, VQ_DTYPE_F32, {1, 1, 2, 4}, {8, 8, 2, 1}};
  /* The same two tokens 4 apart, and 2 heads laid out [S][H][D] (stride 8 and 4): distinct. */
  float two[16] = {0};
  vq_tensor distinct = {two, VQ_DTYPE_F32, {1, 2, 2, 4}, {16, 4, 8, 1}};
  vq_layer_shape ls2 = {2, 4, 0, 0, 1};
  CHECK_EQ_I64(vq_config_parse("streaming_llm:n_sink=1,window_size=3", &c, NULL), VQ_OK);

  CHECK_EQ_I64(vq_model_cache_create(c, &ms, &model, &error), VQ_ERR_INVALID_ARGUMENT);
  CHECK(model == NULL);
  CHECK(strstr(vq_error_message(error), "n_layers must be at most 4096") != NULL);
  CHECK(strstr(vq_error_message(error), "got 100000000") != NULL);
  vq_error_free(error);
  error = NULL;
  ms.n_layers = VQ_MAX_LAYERS + 1;
  CHECK_EQ_I64(vq_model_cache_create(c, &ms, &model, NULL), VQ_ERR_INVALID_ARGUMENT);
  ms.n_layers = 2;
  ms.n_kv_heads = VQ_MAX_HEADS + 1;
  ms.n_query_heads = 0;
  CHECK_EQ_I64(vq_model_cache_create(c, &ms, &model, &error), VQ_ERR_INVALID_ARGUMENT);
  CHECK(strstr(vq_error_message(error), "n_kv_heads must be at most 4096") != NULL);
  vq_error_free(error);
  error = NULL;
  ms.n_kv_heads = 2;
  ms.head_dim = VQ_MAX_HEAD_DIM + 1;
  CHECK_EQ_I64(vq_model_cache_create(c, &ms, &model, NULL), VQ_ERR_INVALID_ARGUMENT);
  ms.head_dim = 8;
  ms.n_layers = VQ_MAX_LAYERS; /* the limit itself is allowed */
  CHECK_EQ_I64(vq_model_cache_create(c, &ms, &model, NULL), VQ_OK);
  CHECK_EQ_I64(vq_model_cache_n_layers(model), VQ_MAX_LAYERS);
  vq_model_cache_free(model);

  ls.head_dim = VQ_MAX_HEAD_DIM + 1;
  CHECK_EQ_I64(vq_layer_cache_create(c, &ls, &layer, &error), VQ_ERR_INVALID_ARGUMENT);
  CHECK(strstr(vq_error_message(error), "head_dim must be at most 65536") != NULL);
  vq_error_free(error);
  error = NULL;
  ls.head_dim = 4;
  CHECK_EQ_I64(vq_layer_cache_create(c, &ls, &layer, NULL), VQ_OK);
  CHECK_EQ_I64(vq_layer_begin_step(layer, &broadcast, &broadcast, &view), VQ_ERR_INVALID_ARGUMENT);
  CHECK(strstr(vq_layer_last_error(layer), "[capi] vq_layer_begin_step: keys [1, 1, 268435456, 4]") !=
        NULL);
  CHECK(strstr(vq_layer_last_error(layer), "rows that overlap") != NULL);
  CHECK_EQ_I64(vq_layer_step_open(layer), 0);
  CHECK_EQ_I64(vq_layer_begin_step(layer, &overlap, &overlap, &view), VQ_ERR_INVALID_ARGUMENT);
  CHECK(strstr(vq_layer_last_error(layer), "along S (size 2) the stride is 2 elements") != NULL);
  CHECK_EQ_I64(vq_layer_stats(layer, &st), VQ_OK);
  CHECK_EQ_I64(st.tokens_seen, 0);
  /* The refused steps left nothing behind: a good step works (rows 0..3 and 4..7 of buffer). */
  overlap.stride[2] = 4;
  CHECK_EQ_I64(vq_layer_begin_step(layer, &overlap, &overlap, &view), VQ_OK);
  CHECK_EQ_I64(view.n_new, 2);
  CHECK_EQ_I64(vq_layer_end_step(layer, NULL), VQ_OK);
  vq_layer_cache_free(layer);

  /* A permuted layout ([S][H][D]) is distinct rows, accepted. */
  CHECK_EQ_I64(vq_layer_cache_create(c, &ls2, &layer, NULL), VQ_OK);
  CHECK_EQ_I64(vq_layer_begin_step(layer, &distinct, &distinct, &view), VQ_OK);
  CHECK_EQ_I64(vq_layer_end_step(layer, NULL), VQ_OK);
  vq_layer_cache_free(layer);

  /* B x Hkv past VQ_MAX_BATCH_HEADS on a first step: refused before a row store is made. */
  CHECK_EQ_I64(vq_layer_cache_create(c, &ls, &layer, NULL), VQ_OK);
  broadcast.shape[0] = VQ_MAX_BATCH_HEADS + 1;
  broadcast.shape[2] = 1;
  CHECK_EQ_I64(vq_layer_begin_step(layer, &broadcast, &broadcast, &view), VQ_ERR_INVALID_ARGUMENT);
  CHECK(strstr(vq_layer_last_error(layer), "past the limit 65536") != NULL);
  vq_layer_cache_free(layer);
  vq_config_free(c);
}

/* duoattention's head pattern through the C API: 2 layers of 2 KV heads, ratio 0.5, n_sink 1,
 * window 2. Layer 0's scores {0.2, 0.8} make head 1 the retrieval head (all 6 rows kept), head 0
 * streaming ({0} + window {4, 5}: 3 rows); layer 1's {0.9, 0.1} the reverse. */
static void test_head_pattern(void) {
  enum { L = 2, H = 2, T = 6 };
  vq_config* c = NULL;
  vq_model_cache* m = NULL;
  vq_layer_cache* layer = NULL;
  const vq_model_shape shape = {L, H, 1, 0};
  const float scores[L * H] = {0.2f, 0.8f, 0.9f, 0.1f};
  float k[H];
  vq_tensor keys = {NULL, VQ_DTYPE_F32, {1, H, 1, 1}, {H, 1, 1, 1}};
  vq_step_view view;
  int32_t types[4] = {-1, -1, -1, -1};
  int64_t counts[2] = {0, 0};
  size_t n_heads = 0;
  int l, pos;
  keys.data = k;
  k[0] = k[1] = 1.0f;
  CHECK_EQ_I64(vq_config_parse("duoattention:n_sink=1,window=2", &c, NULL), VQ_OK);
  CHECK_EQ_I64(vq_model_cache_create(c, &shape, &m, NULL), VQ_OK);
  vq_config_free(c);
  CHECK_EQ_I64(vq_model_cache_set_head_pattern(m, scores, 3), VQ_ERR_INVALID_ARGUMENT);
  CHECK(strstr(vq_model_cache_last_error(m), "expected n_layers x n_kv_heads = 4") != NULL);
  CHECK_EQ_I64(vq_model_cache_load_head_pattern(m, "/nonexistent/duo.tsv"), VQ_ERR_FILE);
  CHECK(strstr(vq_model_cache_last_error(m), "/nonexistent/duo.tsv") != NULL);
  CHECK_EQ_I64(vq_model_cache_set_head_pattern(m, scores, L * H), VQ_OK);
  for (l = 0; l < L; ++l) {
    CHECK_EQ_I64(vq_model_cache_layer(m, l, &layer), VQ_OK);
    for (pos = 0; pos < T; ++pos) {
      CHECK_EQ_I64(vq_layer_begin_step(layer, &keys, &keys, &view), VQ_OK);
      CHECK_EQ_I64(vq_layer_end_step(layer, NULL), VQ_OK);
    }
    CHECK_EQ_I64(vq_layer_head_types(layer, types, 4, &n_heads), VQ_OK);
    CHECK_EQ_I64(n_heads, 2);
    CHECK_EQ_I64(types[0], l == 0 ? 2 : 1);
    CHECK_EQ_I64(types[1], l == 0 ? 1 : 2);
    CHECK_EQ_I64(vq_layer_kept_per_head(layer, counts, 2, NULL), VQ_OK);
    CHECK_EQ_I64(counts[0], l == 0 ? 3 : 6);
    CHECK_EQ_I64(counts[1], l == 0 ? 6 : 3);
    /* After the first step the pattern is refused until a reset. */
    CHECK_EQ_I64(vq_layer_set_head_pattern(layer, scores, 2), VQ_ERR_INVALID_STATE);
  }
  vq_model_cache_free(m);
}

/* qfilters' key filters (docs/methods.md): the setters check n against the shape, a cache
 * without filters fails its first step naming the setter (and rolls it back), and a layer's
 * filter is what scores its keys: key (1, 0, 0, 0) against filter (20, 21, 22, 23) scores 20. */
static void test_key_filters(void) {
  vq_config* c = NULL;
  vq_model_cache* mc = NULL;
  vq_layer_cache* l2 = NULL;
  const vq_model_shape ms = {3, 2, 4, 4};
  float all[24], k[8] = {0, 0, 0, 0, 1, 0, 0, 0}, v[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  vq_tensor tk, tv;
  vq_step_view view;
  vq_head_rows rows;
  int i;
  for (i = 0; i < 24; ++i) all[i] = (float)i;
  CHECK_EQ_I64(vq_config_parse("qfilters", &c, NULL), VQ_OK);
  CHECK_EQ_I64(vq_model_cache_create(c, &ms, &mc, NULL), VQ_OK);
  CHECK_EQ_I64(vq_model_cache_layer(mc, 2, &l2), VQ_OK);
  CHECK_EQ_I64(vq_layer_needs_key_filters(l2), 1);
  memset(&tk, 0, sizeof tk);
  tk.data = k;
  tk.dtype = VQ_DTYPE_F32;
  tk.shape[0] = 1;
  tk.shape[1] = 2;
  tk.shape[2] = 1;
  tk.shape[3] = 4;
  tk.stride[0] = 8;
  tk.stride[1] = 4;
  tk.stride[2] = 4;
  tk.stride[3] = 1;
  tv = tk;
  tv.data = v;
  CHECK_EQ_I64(vq_layer_begin_step(l2, &tk, &tv, &view), VQ_OK);
  CHECK_EQ_I64(vq_layer_end_step(l2, NULL), VQ_ERR_INVALID_STATE);
  CHECK(strstr(vq_layer_last_error(l2), "set_key_filters") != NULL);
  CHECK_EQ_I64(vq_layer_step_open(l2), 0);
  CHECK_EQ_I64(vq_model_cache_set_key_filters(mc, all, 16), VQ_ERR_INVALID_ARGUMENT);
  CHECK(strstr(vq_model_cache_last_error(mc), "got 16") != NULL);
  CHECK_EQ_I64(vq_layer_set_key_filters(l2, all, 7), VQ_ERR_INVALID_ARGUMENT);
  CHECK_EQ_I64(vq_model_cache_set_key_filters(mc, all, 24), VQ_OK);
  CHECK_EQ_I64(vq_layer_begin_step(l2, &tk, &tv, &view), VQ_OK);
  CHECK_EQ_I64(vq_layer_end_step(l2, NULL), VQ_OK);
  CHECK_EQ_I64(vq_layer_stored(l2, 0, 1, &rows), VQ_OK);
  CHECK_EQ_I64(rows.n_rows, 1);
  CHECK_EQ_I64(vq_layer_set_key_filters(l2, all, 8), VQ_OK);
  vq_model_cache_free(mc);
  vq_config_free(c);
}

/* Feeds tokens [t0, t1) of a deterministic sequence to `layer` (H heads of D), one per step. */
static void feed_tokens(vq_layer_cache* layer, int H, int D, int t0, int t1) {
  float k[4 * 32], v[4 * 32];
  vq_tensor keys = {NULL, VQ_DTYPE_F32, {1, 0, 1, 0}, {0, 0, 0, 1}};
  vq_tensor values;
  vq_step_view view;
  int t, h, d;
  keys.shape[1] = H;
  keys.shape[3] = D;
  keys.stride[0] = H * D;
  keys.stride[1] = D;
  keys.stride[2] = D;
  keys.data = k;
  values = keys;
  values.data = v;
  for (t = t0; t < t1; ++t) {
    for (h = 0; h < H; ++h) {
      for (d = 0; d < D; ++d) {
        k[h * D + d] = (float)sin(0.37 * t + 0.11 * d + h);
        v[h * D + d] = (float)cos(0.23 * t - 0.05 * d + h);
      }
    }
    CHECK_EQ_I64(vq_layer_begin_step(layer, &keys, &values, &view), VQ_OK);
    CHECK_EQ_I64(vq_layer_end_step(layer, NULL), VQ_OK);
  }
}

/* Whether two layers hold the same rows (positions, keys and values as fp32, bit for bit). */
static int same_rows(vq_layer_cache* a, vq_layer_cache* b, int H, int D) {
  vq_head_rows ra, rb;
  float ka[32], va[32], kb[32], vb[32];
  int h, r;
  for (h = 0; h < H; ++h) {
    if (vq_layer_stored(a, 0, h, &ra) != VQ_OK || vq_layer_stored(b, 0, h, &rb) != VQ_OK) return 0;
    if (ra.n_rows != rb.n_rows) return 0;
    for (r = 0; r < ra.n_rows; ++r) {
      if (ra.positions[r] != rb.positions[r]) return 0;
      if (vq_head_rows_load(&ra, r, ka, va) != VQ_OK || vq_head_rows_load(&rb, r, kb, vb) != VQ_OK)
        return 0;
      if (memcmp(ka, kb, sizeof(float) * (size_t)D) != 0 ||
          memcmp(va, vb, sizeof(float) * (size_t)D) != 0)
        return 0;
    }
  }
  return 1;
}

/* Save / restore through buffers and files: the restored cache continues as the saved one. */
static void test_state(void) {
  enum { H = 2, D = 32 };
  vq_config* c = NULL;
  vq_layer_cache *a = NULL, *b = NULL;
  vq_layer_shape shape = {H, D, 0, 0, 1};
  size_t size = 0, size2 = 0;
  uint8_t* buf;
  uint8_t* buf2;
  vq_model_cache *m = NULL, *m2 = NULL;
  vq_model_shape mshape = {3, H, D, 0};
  vq_layer_cache* ml = NULL;
  vq_cache_stats s1, s2;
  int i;
  const char* path = "vq_capi_state.bin";

  CHECK_EQ_I64(vq_config_parse("h2o:budget=8,n_sink=1", &c, NULL), VQ_OK);
  CHECK_EQ_I64(vq_layer_cache_create(c, &shape, &a, NULL), VQ_OK);
  CHECK_EQ_I64(vq_layer_cache_create(c, &shape, &b, NULL), VQ_OK);
  feed_tokens(a, H, D, 0, 20);
  /* The size query, then a buffer too small, then the state. */
  CHECK_EQ_I64(vq_layer_save_state(a, NULL, 0, &size), VQ_OK);
  CHECK(size > 20);
  buf = (uint8_t*)malloc(size);
  buf2 = (uint8_t*)malloc(size);
  CHECK_EQ_I64(vq_layer_save_state(a, buf, size - 1, &size2), VQ_ERR_INVALID_ARGUMENT);
  CHECK(strstr(vq_layer_last_error(a), "bytes") != NULL);
  CHECK_EQ_I64(vq_layer_save_state(a, buf, size, &size2), VQ_OK);
  CHECK_EQ_I64(size2, size);
  CHECK_EQ_I64(vq_layer_save_state(a, buf, size, NULL), VQ_ERR_INVALID_ARGUMENT);
  CHECK_EQ_I64(vq_layer_load_state(b, buf, size), VQ_OK);
  CHECK(same_rows(a, b, H, D));
  CHECK_EQ_I64(vq_layer_save_state(b, buf2, size, &size2), VQ_OK);
  CHECK(size2 == size && memcmp(buf, buf2, size) == 0);
  feed_tokens(a, H, D, 20, 30);
  feed_tokens(b, H, D, 20, 30);
  CHECK(same_rows(a, b, H, D));
  /* Corrupt bytes: an error naming the checksum, the cache unchanged. */
  buf[size / 2] ^= 0x10;
  CHECK_EQ_I64(vq_layer_load_state(b, buf, size), VQ_ERR_INVALID_ARGUMENT);
  CHECK(strstr(vq_layer_last_error(b), "checksum") != NULL);
  CHECK(same_rows(a, b, H, D));
  CHECK_EQ_I64(vq_layer_load_state(b, NULL, 4), VQ_ERR_INVALID_ARGUMENT);
  /* Files. */
  CHECK_EQ_I64(vq_layer_save_state_file(a, path), VQ_OK);
  vq_layer_cache_free(b);
  CHECK_EQ_I64(vq_layer_cache_create(c, &shape, &b, NULL), VQ_OK);
  CHECK_EQ_I64(vq_layer_load_state_file(b, path), VQ_OK);
  CHECK(same_rows(a, b, H, D));
  CHECK_EQ_I64(vq_layer_load_state_file(b, "no_such_vq_state.bin"), VQ_ERR_FILE);
  CHECK(strstr(vq_layer_last_error(b), "no_such_vq_state.bin") != NULL);
  remove(path);
  vq_layer_cache_free(a);
  vq_layer_cache_free(b);
  vq_config_free(c);
  free(buf);
  free(buf2);

  /* A model cache (squeeze: the layers' shared budgets are part of the state). */
  CHECK_EQ_I64(vq_config_parse("squeeze:budget=8,n_sink=1", &c, NULL), VQ_OK);
  CHECK_EQ_I64(vq_model_cache_create(c, &mshape, &m, NULL), VQ_OK);
  CHECK_EQ_I64(vq_model_cache_create(c, &mshape, &m2, NULL), VQ_OK);
  for (i = 0; i < 3; ++i) {
    CHECK_EQ_I64(vq_model_cache_layer(m, i, &ml), VQ_OK);
    feed_tokens(ml, H, D, 0, 12);
  }
  CHECK_EQ_I64(vq_model_cache_save_state(m, NULL, 0, &size), VQ_OK);
  buf = (uint8_t*)malloc(size);
  CHECK_EQ_I64(vq_model_cache_save_state(m, buf, size, &size2), VQ_OK);
  CHECK_EQ_I64(vq_model_cache_load_state(m2, buf, size), VQ_OK);
  CHECK_EQ_I64(vq_model_cache_stats(m, &s1), VQ_OK);
  CHECK_EQ_I64(vq_model_cache_stats(m2, &s2), VQ_OK);
  CHECK_EQ_I64(s1.tokens_seen, s2.tokens_seen);
  CHECK_EQ_I64(s1.kept_bytes, s2.kept_bytes);
  CHECK_EQ_I64(s1.evictions, s2.evictions);
  CHECK_EQ_I64(vq_model_cache_save_state_file(m, path), VQ_OK);
  CHECK_EQ_I64(vq_model_cache_load_state_file(m2, path), VQ_OK);
  /* A layer state is not a model state. */
  CHECK_EQ_I64(vq_model_cache_layer(m, 0, &ml), VQ_OK);
  CHECK_EQ_I64(vq_layer_save_state(ml, NULL, 0, &size2), VQ_OK);
  buf2 = (uint8_t*)malloc(size2);
  CHECK_EQ_I64(vq_layer_save_state(ml, buf2, size2, &size2), VQ_OK);
  CHECK_EQ_I64(vq_model_cache_load_state(m2, buf2, size2), VQ_ERR_INVALID_ARGUMENT);
  CHECK(strstr(vq_model_cache_last_error(m2), "LayerCache state") != NULL);
  remove(path);
  free(buf);
  free(buf2);
  vq_model_cache_free(m);
  vq_model_cache_free(m2);
  vq_config_free(c);
}

int main(void) {
  test_version_and_errors();
  test_config();
  test_registry();
  test_streaming_steps();
  test_strides_and_f16();
  test_attention_input();
  test_threads();
  test_misuse();
  test_shape_limits();
  test_head_pattern();
  test_key_filters();
  test_state();
  if (failures != 0) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("capi: all checks passed\n");
  return 0;
}
