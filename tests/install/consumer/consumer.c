/* Installed-package consumer, C side: a StreamingLLM cache (2 sinks + 6 recent) over 20 tokens
 * keeps positions 0, 1, 14..19. */
#include <stdio.h>
#include <string.h>
#include <veloxquant/veloxquant_c.h>

int main(void) {
  vq_error* error = NULL;
  vq_config* config = NULL;
  vq_model_cache* model = NULL;
  vq_layer_cache* layer = NULL;
  const vq_model_shape shape = {1, 1, 2, 0};
  float kv[2] = {0.5f, -0.5f};
  const vq_tensor t = {kv, VQ_DTYPE_F32, {1, 1, 1, 2}, {2, 2, 2, 1}};
  vq_step_view view;
  vq_head_rows rows;
  const int expect[8] = {0, 1, 14, 15, 16, 17, 18, 19};
  int pos, r;
  if (vq_abi_version() != VQ_ABI_VERSION) return 1;
  if (vq_config_parse("streaming_llm:n_sink=2,window_size=6", &config, &error) != VQ_OK ||
      vq_model_cache_create(config, &shape, &model, &error) != VQ_OK ||
      vq_model_cache_layer(model, 0, &layer) != VQ_OK) {
    fprintf(stderr, "%s\n", vq_error_message(error));
    return 1;
  }
  for (pos = 0; pos < 20; ++pos) {
    if (vq_layer_begin_step(layer, &t, &t, &view) != VQ_OK ||
        vq_layer_end_step(layer, NULL) != VQ_OK) {
      fprintf(stderr, "%s\n", vq_layer_last_error(layer));
      return 1;
    }
  }
  if (vq_layer_stored(layer, 0, 0, &rows) != VQ_OK || rows.n_rows != 8) return 1;
  for (r = 0; r < 8; ++r) {
    if (rows.positions[r] != expect[r]) return 1;
  }
  /* An error message comes back through the error object. */
  if (vq_config_parse("h2o:budget=0", &config, &error) != VQ_ERR_INVALID_CONFIG ||
      strstr(vq_error_message(error), "h2o_budget") == NULL) {
    return 1;
  }
  vq_error_free(error);
  vq_model_cache_free(model);
  vq_config_free(config);
  printf("consumer_c: ok (libveloxquant %s, ABI %d)\n", vq_version(), vq_abi_version());
  return 0;
}
