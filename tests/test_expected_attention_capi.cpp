// expected_attention through the C API (vq_layer_set_rope, vq_layer_end_step_queries,
// vq_layer_reads_queries): the error cases and the kept rows of the reference's prefill case
// (tests/expected_attention_reference.py; the same inputs as tests/test_expected_attention.cpp).
// In veloxquant_api_tests, which compiles the C API in.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "veloxquant/veloxquant.h"
#include "veloxquant/veloxquant_c.h"

#include "expected_attention_inputs.h"

namespace vq {
namespace {

using namespace ea_ref;  // the reference inputs (expected_attention_inputs.h)

const std::string kBase =
    "expected_attention:budget=10,n_sink=2,n_future=5,n_window=16,interval=3,kv_dtype=f32";

TEST(ExpectedAttentionCApi, PassesQueriesAndRope) {
  vq_config* cfg = nullptr;
  vq_error* err = nullptr;
  ASSERT_EQ(vq_config_parse((kBase).c_str(), &cfg, &err), VQ_OK);
  vq_layer_shape shape{kHkv, kD, kHq, 0, 1};
  vq_layer_cache* layer = nullptr;
  ASSERT_EQ(vq_layer_cache_create(cfg, &shape, &layer, &err), VQ_OK);
  EXPECT_EQ(vq_layer_reads_queries(layer), 1);
  const Step st(0, 24);
  auto tensor = [](const std::vector<float>& x, std::int64_t H) {
    vq_tensor t{};
    t.data = x.data();
    t.dtype = VQ_DTYPE_F32;
    const std::int64_t S = static_cast<std::int64_t>(x.size()) / (H * kD);
    t.shape[0] = 1; t.shape[1] = H; t.shape[2] = S; t.shape[3] = kD;
    t.stride[0] = H * S * kD; t.stride[1] = S * kD; t.stride[2] = kD; t.stride[3] = 1;
    return t;
  };
  const vq_tensor k = tensor(st.k, kHkv), v = tensor(st.v, kHkv), q = tensor(st.q, kHq);
  vq_step_view view{};
  ASSERT_EQ(vq_layer_begin_step(layer, &k, &v, &view), VQ_OK);
  EXPECT_EQ(vq_layer_end_step_queries(layer, nullptr, &q), VQ_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(vq_layer_last_error(layer)).find("set_rope"), std::string::npos);
  const std::vector<float> f = ref_freq();
  vq_rope bad{f.data(), kD / 2, 7};
  EXPECT_EQ(vq_layer_set_rope(layer, &bad), VQ_ERR_INVALID_ARGUMENT);
  vq_rope rope{f.data(), kD / 2, VQ_ROPE_INTERLEAVED};
  ASSERT_EQ(vq_layer_set_rope(layer, &rope), VQ_OK);
  std::vector<float> inf_q = st.q;
  inf_q[5] = INFINITY;
  const vq_tensor qi = tensor(inf_q, kHq);
  EXPECT_EQ(vq_layer_end_step_queries(layer, nullptr, &qi), VQ_ERR_INVALID_ARGUMENT);
  ASSERT_EQ(vq_layer_end_step_queries(layer, nullptr, &q), VQ_OK);
  // The same rows as the C++ API (the prefill case of the reference).
  vq_head_rows rows{};
  ASSERT_EQ(vq_layer_stored(layer, 0, 0, &rows), VQ_OK);
  EXPECT_EQ(std::vector<std::int32_t>(rows.positions, rows.positions + rows.n_rows),
            (std::vector<std::int32_t>{0, 1, 4, 7, 10, 12, 15, 18, 19, 21}));
  vq_layer_cache_free(layer);
  vq_config_free(cfg);
}

}  // namespace
}  // namespace vq
