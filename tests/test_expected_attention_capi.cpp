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

namespace vq {
namespace {

constexpr std::int64_t kHkv = 2, kHq = 4, kD = 8;

// The inputs of tests/expected_attention_reference.py (exact in fp32).
float ref_key(std::int64_t t, std::int64_t h, std::int64_t c) {
  return static_cast<float>((7 * t * t + 13 * t * c + 31 * h + 5 * c * c + 3) % 29 - 14) / 8.0f;
}
float ref_value(std::int64_t t, std::int64_t h, std::int64_t c) {
  return static_cast<float>((3 * t * t + 11 * t * c + 17 * h + 2 * c * c + 1) % 23 - 11) / 8.0f;
}
float ref_query(std::int64_t t, std::int64_t q, std::int64_t c) {
  return static_cast<float>((5 * t * t + 3 * t * c + 19 * q + 7 * c * c + 2) % 31 - 15) / 8.0f;
}
std::vector<float> ref_freq() {
  std::vector<float> f(kD / 2);
  for (std::int64_t i = 0; i < kD / 2; ++i) {
    f[static_cast<std::size_t>(i)] =
        static_cast<float>(std::pow(50.0, -2.0 * static_cast<double>(i) / kD));
  }
  return f;
}

// Tokens [t0, t0 + S) as [1, H, S, D] tensors (owned).
struct Step {
  std::vector<float> k, v, q;
  Step(std::int64_t t0, std::int64_t S)
      : k(static_cast<std::size_t>(kHkv * S * kD)), v(k.size()),
        q(static_cast<std::size_t>(kHq * S * kD)) {
    for (std::int64_t s = 0; s < S; ++s) {
      for (std::int64_t c = 0; c < kD; ++c) {
        for (std::int64_t h = 0; h < kHkv; ++h) {
          k[static_cast<std::size_t>((h * S + s) * kD + c)] = ref_key(t0 + s, h, c);
          v[static_cast<std::size_t>((h * S + s) * kD + c)] = ref_value(t0 + s, h, c);
        }
        for (std::int64_t h = 0; h < kHq; ++h) {
          q[static_cast<std::size_t>((h * S + s) * kD + c)] = ref_query(t0 + s, h, c);
        }
      }
    }
  }
  std::int64_t S() const { return static_cast<std::int64_t>(k.size()) / (kHkv * kD); }
  TensorRef keys() const { return TensorRef::f32(k.data(), 1, kHkv, S(), kD); }
  TensorRef values() const { return TensorRef::f32(v.data(), 1, kHkv, S(), kD); }
  TensorRef queries() const { return TensorRef::f32(q.data(), 1, kHq, S(), kD); }
};

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
