// finch's question input through the C API (vq_layer_set_question_length,
// vq_model_cache_set_question_length); the rest of its tests: test_finch.cpp.
#include <gtest/gtest.h>

#include <string>

#include "veloxquant/veloxquant_c.h"

namespace {

TEST(FinchCApi, SetQuestionLengthChecksAndReports) {
  vq_config* config = nullptr;
  ASSERT_EQ(vq_config_parse("finch:budget=10,n_sink=1,obs_window=3", &config, nullptr), VQ_OK);
  vq_layer_shape shape{2, 4, 4, 0, 1};
  vq_layer_cache* layer = nullptr;
  ASSERT_EQ(vq_layer_cache_create(config, &shape, &layer, nullptr), VQ_OK);
  EXPECT_EQ(vq_layer_reads_question(layer), 1);
  EXPECT_EQ(vq_layer_set_question_length(layer, -1), VQ_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(vq_layer_last_error(layer)).find("set_question_length"),
            std::string::npos);
  EXPECT_EQ(vq_layer_set_question_length(layer, 5), VQ_OK);
  EXPECT_EQ(vq_layer_reads_question(nullptr), 0);
  vq_layer_cache_free(layer);
  vq_config_free(config);
  // A model cache: every layer.
  ASSERT_EQ(vq_config_parse("h2o", &config, nullptr), VQ_OK);
  vq_model_cache* model = nullptr;
  vq_model_shape mshape{2, 2, 4, 4};
  ASSERT_EQ(vq_model_cache_create(config, &mshape, &model, nullptr), VQ_OK);
  EXPECT_EQ(vq_model_cache_set_question_length(model, 3), VQ_OK);
  EXPECT_EQ(vq_model_cache_set_question_length(model, -3), VQ_ERR_INVALID_ARGUMENT);
  ASSERT_EQ(vq_model_cache_layer(model, 1, &layer), VQ_OK);
  EXPECT_EQ(vq_layer_reads_question(layer), 0);
  vq_model_cache_free(model);
  vq_config_free(config);
}

}  // namespace
