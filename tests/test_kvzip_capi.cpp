// kvzip's reconstruction pass through the C API: set_reconstruction, a reconstruction step that
// forgets its rows, compress to the budget, and the errors (the C++ rule: test_kvzip.cpp).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "veloxquant/veloxquant_c.h"

namespace {

vq_tensor f32(const float* data, int64_t S) {
  return vq_tensor{data, VQ_DTYPE_F32, {1, 1, S, 2}, {S * 2, S * 2, 2, 1}};
}

TEST(KvzipCApi, ThePassThroughTheCApi) {
  vq_config* config = nullptr;
  ASSERT_EQ(vq_config_parse("kvzip:budget=3,n_sink=1,headwise=false,chunk=16", &config, nullptr),
            VQ_OK);
  vq_layer_shape shape{1, 2, 1, 0, 1};
  vq_layer_cache* layer = nullptr;
  ASSERT_EQ(vq_layer_cache_create(config, &shape, &layer, nullptr), VQ_OK);
  EXPECT_EQ(vq_layer_reads_reconstruction(layer), 1);
  EXPECT_EQ(vq_layer_reconstruction_chunk(layer), 16);
  EXPECT_EQ(vq_layer_reads_reconstruction(nullptr), 0);
  ASSERT_EQ(vq_layer_set_reconstruction(layer, 1), VQ_OK);

  // The prompt: 6 rows, all kept until compress.
  const std::vector<float> k(12, 0.5f);
  vq_tensor kt = f32(k.data(), 6);
  vq_step_view view;
  ASSERT_EQ(vq_layer_begin_step(layer, &kt, &kt, &view), VQ_OK);
  ASSERT_EQ(vq_layer_end_step(layer, nullptr), VQ_OK);
  // compress before any reconstruction step: refused, nothing cut.
  EXPECT_EQ(vq_layer_compress(layer), VQ_ERR_INVALID_STATE);
  EXPECT_NE(std::string(vq_layer_last_error(layer)).find("reconstruction"), std::string::npos);

  // One reconstruction step of 2 tokens over the 6 stored rows (R = 8). By hand: query 0 puts
  // .5 on row 4 and .3 on row 2, query 1 .6 on row 5 and .1 on row 2: scores (max) row 2 .3,
  // row 4 .5, row 5 .6, the others 0 or .1 -> with budget 3 and sink row 0: {0, 4, 5}.
  const std::vector<float> kr(4, 0.25f);
  vq_tensor krt = f32(kr.data(), 2);
  ASSERT_EQ(vq_layer_begin_step(layer, &krt, &krt, &view), VQ_OK);
  EXPECT_EQ(view.n_rows, 8);
  const std::vector<float> p = {0.1f, 0.0f, 0.3f, 0.0f, 0.5f, 0.0f, 0.1f, 0.0f,
                                0.1f, 0.1f, 0.1f, 0.0f, 0.0f, 0.6f, 0.05f, 0.05f};
  const vq_attention wrong{p.data(), 1, 1, 2, 7};
  EXPECT_EQ(vq_layer_end_reconstruction_step(layer, &wrong), VQ_ERR_SHAPE_MISMATCH);
  vq_cache_stats stats;
  ASSERT_EQ(vq_layer_stats(layer, &stats), VQ_OK);
  EXPECT_EQ(stats.tokens_seen, 6) << "the refused step was rolled back";
  ASSERT_EQ(vq_layer_begin_step(layer, &krt, &krt, &view), VQ_OK);
  const vq_attention a{p.data(), 1, 1, 2, 8};
  ASSERT_EQ(vq_layer_end_reconstruction_step(layer, &a), VQ_OK) << vq_layer_last_error(layer);
  ASSERT_EQ(vq_layer_stats(layer, &stats), VQ_OK);
  EXPECT_EQ(stats.tokens_seen, 6);
  EXPECT_EQ(stats.tokens_kept, 6);
  ASSERT_EQ(vq_layer_compress(layer), VQ_OK) << vq_layer_last_error(layer);
  ASSERT_EQ(vq_layer_stats(layer, &stats), VQ_OK);
  EXPECT_EQ(stats.tokens_kept, 3);
  vq_head_rows rows;
  ASSERT_EQ(vq_layer_stored(layer, 0, 0, &rows), VQ_OK);
  ASSERT_EQ(rows.n_rows, 3);
  EXPECT_EQ(rows.positions[0], 0);
  EXPECT_EQ(rows.positions[1], 4);
  EXPECT_EQ(rows.positions[2], 5);
  vq_layer_cache_free(layer);
  vq_config_free(config);
}

}  // namespace
