/* Embedding VeloxQuant from C: one cache per layer, called once per layer per step. The C twin
 * of examples/embed.cpp, built by CMake as `embed_c_example` and run by the test suite. */
#include <stdio.h>

#include "veloxquant/veloxquant_c.h"

enum { kLayers = 2, kKvHeads = 4, kHeadDim = 64, kQueryHeads = 8 };

int main(void) {
  vq_error* error = NULL;
  vq_config* config = NULL;
  vq_model_cache* caches = NULL;
  const vq_model_shape shape = {kLayers, kKvHeads, kHeadDim, kQueryHeads};
  float k[kKvHeads * kHeadDim], v[kKvHeads * kHeadDim]; /* one new token: [B=1, Hkv, S=1, D] */
  vq_tensor keys = {
      k, VQ_DTYPE_F32, {1, kKvHeads, 1, kHeadDim}, {kKvHeads * kHeadDim, kHeadDim, kHeadDim, 1}};
  vq_tensor values = keys;
  vq_cache_stats s;
  int pos, layer;
  size_t i;

  if (vq_abi_version() != VQ_ABI_VERSION) {
    fprintf(stderr, "libveloxquant ABI %d, header %d\n", vq_abi_version(), VQ_ABI_VERSION);
    return 1;
  }
  /* Spec strings accept field names with or without the method prefix. */
  if (vq_config_parse("cam:budget=128", &config, &error) != VQ_OK ||
      vq_model_cache_create(config, &shape, &caches, &error) != VQ_OK) {
    fprintf(stderr, "%s\n", vq_error_message(error));
    vq_error_free(error);
    vq_config_free(config);
    return 1;
  }
  values.data = v;

  for (pos = 0; pos < 1000; ++pos) {
    for (i = 0; i < sizeof k / sizeof k[0]; ++i) {
      k[i] = (float)((pos * 31 + i * 7) % 17) / 17.0f - 0.5f;
      v[i] = (float)((pos * 13 + i * 5) % 11) / 11.0f - 0.5f;
    }
    for (layer = 0; layer < kLayers; ++layer) {
      vq_layer_cache* cache = NULL;
      vq_step_view view;
      vq_head_rows head0;
      vq_model_cache_layer(caches, layer, &cache);
      /* Zero-copy: the view points into the cache and holds every kept row plus the new one. */
      if (vq_layer_begin_step(cache, &keys, &values, &view) != VQ_OK ||
          vq_layer_view_head(cache, 0, 0, &head0) != VQ_OK) { /* keys/values fp16, positions */
        fprintf(stderr, "%s\n", vq_layer_last_error(cache));
        return 1;
      }
      /* ... the engine computes attention over view.n_rows rows here ... */
      if (vq_layer_end_step(cache, NULL) != VQ_OK) { /* proxy scoring; or pass the probs */
        fprintf(stderr, "%s\n", vq_layer_last_error(cache));
        return 1;
      }
    }
  }
  vq_model_cache_stats(caches, &s);
  printf("kept %lld of %lld tokens per head, %lld bytes, compression %.2fx\n",
         (long long)s.tokens_kept, (long long)s.tokens_seen, (long long)s.kept_bytes,
         s.compression_ratio);
  vq_model_cache_free(caches);
  vq_config_free(config);
  return s.tokens_kept == 128 ? 0 : 1;
}
