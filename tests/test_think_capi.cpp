// ThinK (think=) through the C API: the queries and RoPE of expected_attention's interface
// (vq_layer_set_rope, vq_layer_end_step_queries, vq_layer_reads_queries), the pruned keys read
// through vq_head_rows_load and the bytes held, as tests/think_reference.py gives them for the
// same inputs (the queries case of tests/test_think.cpp). In veloxquant_api_tests, which
// compiles the C API in.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "veloxquant/veloxquant.h"
#include "veloxquant/veloxquant_c.h"

#include "expected_attention_inputs.h"

namespace vq {
namespace {

using namespace ea_ref;  // the inputs (the same formulas as tests/think_reference.py)

vq_tensor tensor(const std::vector<float>& x, std::int64_t H) {
  vq_tensor t{};
  t.data = x.data();
  t.dtype = VQ_DTYPE_F32;
  const std::int64_t S = static_cast<std::int64_t>(x.size()) / (H * kD);
  t.shape[0] = 1; t.shape[1] = H; t.shape[2] = S; t.shape[3] = kD;
  t.stride[0] = H * S * kD; t.stride[1] = S * kD; t.stride[2] = kD; t.stride[3] = 1;
  return t;
}

TEST(ThinkCApi, PrunesTheReferenceChannelsFromTheQueries) {
  vq_config* cfg = nullptr;
  vq_error* err = nullptr;
  ASSERT_EQ(vq_config_parse("think:think_window=3,kv_dtype=f32", &cfg, &err), VQ_OK);
  vq_layer_shape shape{kHkv, kD, kHq, 0, 1};
  vq_layer_cache* layer = nullptr;
  ASSERT_EQ(vq_layer_cache_create(cfg, &shape, &layer, &err), VQ_OK);
  EXPECT_EQ(vq_layer_reads_queries(layer), 1);
  const std::vector<float> f = ref_freq();
  vq_rope rope{f.data(), kD / 2, VQ_ROPE_INTERLEAVED};
  ASSERT_EQ(vq_layer_set_rope(layer, &rope), VQ_OK);
  const Step prompt(0, 6);
  const vq_tensor k = tensor(prompt.k, kHkv), v = tensor(prompt.v, kHkv),
                  q = tensor(prompt.q, kHq);
  vq_step_view view{};
  ASSERT_EQ(vq_layer_begin_step(layer, &k, &v, &view), VQ_OK);
  ASSERT_EQ(vq_layer_end_step_queries(layer, nullptr, &q), VQ_OK);
  EXPECT_EQ(vq_layer_reads_queries(layer), 0);  // the channels are chosen
  const Step decode(6, 1);
  const vq_tensor kd = tensor(decode.k, kHkv), vd = tensor(decode.v, kHkv);
  ASSERT_EQ(vq_layer_begin_step(layer, &kd, &vd, &view), VQ_OK);
  ASSERT_EQ(vq_layer_end_step(layer, nullptr), VQ_OK);
  // tests/think_reference.py, queries case: head 0 keeps channels {0, 1, 3, 4}, head 1
  // {0, 1, 4, 6}; the 6 prompt rows read 0 elsewhere, the decode row is whole.
  const std::vector<std::vector<std::int64_t>> kept = {{0, 1, 3, 4}, {0, 1, 4, 6}};
  for (std::int64_t h = 0; h < kHkv; ++h) {
    vq_head_rows rows{};
    ASSERT_EQ(vq_layer_stored(layer, 0, h, &rows), VQ_OK);
    ASSERT_EQ(rows.n_rows, 7);
    EXPECT_NE(rows.packed, 0);
    std::vector<float> key(kD), value(kD);
    for (std::int64_t r = 0; r < 7; ++r) {
      ASSERT_EQ(vq_head_rows_load(&rows, r, key.data(), value.data()), VQ_OK);
      for (std::int64_t c = 0; c < kD; ++c) {
        const auto& kc = kept[static_cast<std::size_t>(h)];
        const bool keep = r == 6 || std::find(kc.begin(), kc.end(), c) != kc.end();
        EXPECT_EQ(key[static_cast<std::size_t>(c)], keep ? ref_key(r, h, c) : 0.0f) << h << " " << r << " " << c;
        EXPECT_EQ(value[static_cast<std::size_t>(c)], ref_value(r, h, c));
      }
    }
  }
  vq_cache_stats stats{};
  ASSERT_EQ(vq_layer_stats(layer, &stats), VQ_OK);
  EXPECT_EQ(stats.kept_bytes, 720);  // the reference's kept_bytes (f32 rows)
  vq_layer_cache_free(layer);
  vq_config_free(cfg);
}

}  // namespace
}  // namespace vq
