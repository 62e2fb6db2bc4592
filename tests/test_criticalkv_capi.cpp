// criticalkv's output projection through the C API (vq_layer_set_output_gram).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "veloxquant/veloxquant_c.h"

namespace {

TEST(CriticalKVCApi, SetOutputGramChecksAndReports) {
  const std::vector<float> g(4 * 4 * 4, 0.25f);
  vq_config* config = nullptr;
  ASSERT_EQ(vq_config_parse("criticalkv:budget=8,obs_window=2", &config, nullptr), VQ_OK);
  vq_layer_shape shape{2, 4, 4, 0, 1};
  vq_layer_cache* layer = nullptr;
  ASSERT_EQ(vq_layer_cache_create(config, &shape, &layer, nullptr), VQ_OK);
  EXPECT_EQ(vq_layer_reads_output_gram(layer), 1);
  EXPECT_EQ(vq_layer_set_output_gram(layer, g.data(), 4, 4), VQ_OK);
  EXPECT_EQ(vq_layer_set_output_gram(layer, nullptr, 4, 4), VQ_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(vq_layer_last_error(layer)).find("set_output_gram"), std::string::npos);
  EXPECT_EQ(vq_layer_reads_output_gram(nullptr), 0);
  vq_layer_cache_free(layer);
  vq_config_free(config);
  // A method that reads none: checked, accepted, and it reads none.
  ASSERT_EQ(vq_config_parse("h2o", &config, nullptr), VQ_OK);
  ASSERT_EQ(vq_layer_cache_create(config, &shape, &layer, nullptr), VQ_OK);
  EXPECT_EQ(vq_layer_reads_output_gram(layer), 0);
  EXPECT_EQ(vq_layer_set_output_gram(layer, g.data(), 4, 4), VQ_OK);
  EXPECT_EQ(vq_layer_set_output_gram(layer, g.data(), 4, 3), VQ_ERR_INVALID_ARGUMENT);
  vq_layer_cache_free(layer);
  vq_config_free(config);
}

}  // namespace
