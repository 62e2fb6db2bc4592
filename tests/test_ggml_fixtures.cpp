// Blocks written by llama.cpp's own quantizer, with ggml's own dequantization of them
// (data/ggml_blocks/<TYPE>.txt, made by scripts/make_ggml_block_fixtures.sh from the npm
// prebuilt llama.cpp; provenance in data/PROVENANCE.md): VeloxQuant's dequantization must give
// ggml's fp32 values bit for bit, every kernel family must agree with the scalar definition on
// them, and the product must be close to the double-precision product of ggml's values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/compute/block_matmul.h"
#include "engine/compute/matmul.h"
#include "engine/compute/quants.h"
#include "engine_test_util.h"

namespace vq {
namespace {
using engine::GgmlType;
using cpu::Isa;
using engine::WeightMatrix;

struct Fixture {
  std::string tensor, type_name;
  std::uint32_t type_id = 0;
  std::int64_t values = 0;
  std::vector<std::uint8_t> blocks;
  std::vector<float> floats;
};

std::vector<std::uint8_t> unhex(const std::string& h) {
  std::vector<std::uint8_t> out(h.size() / 2);
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<std::uint8_t>(std::stoi(h.substr(2 * i, 2), nullptr, 16));
  return out;
}

Fixture load(const std::string& name) {
  const std::string path = test::data("ggml_blocks/" + name + ".txt");
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "missing fixture " << path;
  Fixture f;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string key;
    ls >> key;
    if (key == "tensor") {
      ls >> f.tensor;
    } else if (key == "type") {
      ls >> f.type_id >> f.type_name;
    } else if (key == "values") {
      ls >> f.values;
    } else if (key == "blocks") {
      std::string h;
      ls >> h;
      f.blocks = unhex(h);
    } else if (key == "floats") {
      std::string h;
      ls >> h;
      for (std::size_t i = 0; i + 8 <= h.size(); i += 8) {
        const auto u = static_cast<std::uint32_t>(std::stoul(h.substr(i, 8), nullptr, 16));
        float v;
        std::memcpy(&v, &u, 4);
        f.floats.push_back(v);
      }
    }
  }
  return f;
}

class GgmlFixture : public ::testing::TestWithParam<const char*> {};

TEST_P(GgmlFixture, DequantizationIsGgmlsBitForBitAndKernelsAgree) {
  const Fixture f = load(GetParam());
  ASSERT_EQ(static_cast<std::int64_t>(f.floats.size()), f.values);
  const auto type = engine::ggml_type_from_id(f.type_id);
  ASSERT_TRUE(type.has_value());
  ASSERT_STREQ(engine::type_info(*type).name, GetParam()) << "ggml calls it " << f.type_name;
  ASSERT_EQ(static_cast<std::int64_t>(f.blocks.size()), engine::type_bytes(*type, f.values));
  std::vector<float> got(static_cast<std::size_t>(f.values));
  engine::dequantize(*type, f.blocks.data(), got.data(), f.values);
  for (std::int64_t i = 0; i < f.values; ++i) {
    ASSERT_EQ(std::memcmp(&got[static_cast<std::size_t>(i)], &f.floats[static_cast<std::size_t>(i)], 4), 0)
        << f.type_name << " value " << i << ": " << got[static_cast<std::size_t>(i)] << " vs ggml "
        << f.floats[static_cast<std::size_t>(i)];
  }
  // The blocks as a [values / 256][256] matrix, times random activations: matmul (the best
  // family, threaded) equals the scalar definition, and the result is close to
  // sum_j ggml_w_j * (d_x q_j) in double.
  const std::int64_t cols = 256, rows = f.values / cols;
  const WeightMatrix w{engine::weight_type_of(*type), rows, cols, f.blocks.data()};
  const std::int64_t S = 3;
  const auto x = test::randn(static_cast<std::size_t>(S * cols), 4);
  std::vector<float> ref(static_cast<std::size_t>(S * rows)), got_mm(ref.size());
  engine::matmul(got_mm.data(), x.data(), w, S);
  if (w.type != engine::WeightType::kQ8_0) {
    const engine::ActType at = engine::activation_type(w.type);
    std::vector<std::int8_t> q(static_cast<std::size_t>(S * cols));
    std::vector<float> d(static_cast<std::size_t>(S * cols / 32)), s(d.size());
    std::vector<std::int16_t> bs(static_cast<std::size_t>(S * cols / 16));
    if (at == engine::ActType::kQ8_K) {
      engine::quantize_activations_q8_k(x.data(), S * cols, q.data(), d.data(), bs.data());
    } else {
      engine::quantize_activations_q8_1(x.data(), S * cols, q.data(), d.data(), s.data());
    }
    const engine::BlockActs a{at, cols, q.data(), d.data(), s.data(), bs.data()};
    engine::matmul_rows_blocks(Isa::kScalar, ref.data(), a, w, S, 0, rows);
    EXPECT_EQ(std::memcmp(ref.data(), got_mm.data(), ref.size() * 4), 0) << f.type_name;
    const std::int64_t xb = engine::act_block_size(at);
    for (std::int64_t t = 0; t < S; ++t) {
      for (std::int64_t i = 0; i < rows; ++i) {
        double r = 0, mag = 0;
        for (std::int64_t j = 0; j < cols; ++j) {
          const double term = static_cast<double>(f.floats[static_cast<std::size_t>(i * cols + j)]) *
                              d[static_cast<std::size_t>((t * cols + j) / xb)] *
                              q[static_cast<std::size_t>(t * cols + j)];
          r += term;
          mag += std::fabs(term);
        }
        EXPECT_NEAR(ref[static_cast<std::size_t>(t * rows + i)], r,
                    (at == engine::ActType::kQ8_1 ? 2e-3 : 1e-5) * mag)
            << f.type_name << " token " << t << " row " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryType, GgmlFixture,
                         ::testing::Values("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K",
                                           "Q4_K", "Q5_K", "Q6_K"));

}  // namespace
}  // namespace vq
