// A method of your own, registered from outside the library (docs/adding-a-method.md).
//
// `vnorm` keeps the rows whose values have the largest L2 norm: a row's score is
// |v|^vnorm_power, fixed when it arrives; over budget the lowest score leaves (the shared
// eviction loop), the first n_sink rows never do. scored_method() gives it vnorm_budget,
// vnorm_n_sink and the guard n_sink < budget; we add one field, vnorm_power, and its doc.
// register_method() adds the shared options it declares nowhere (the merge rule,
// quantize/demote, seed, kv_dtype), as for every method of the library.
// Built by CMake as `custom_method_example` and run by the test suite, which checks the rows
// it keeps against the ones derived by hand below.
#include <cmath>
#include <cstdio>
#include <vector>

#include "veloxquant/veloxquant.h"

int main() {
  // 1. Describe the method and register it (once, at start-up).
  vq::MethodInfo m = vq::scored_method(
      "vnorm", "vnorm", "keep the rows with the largest value norms",
      [](const vq::CacheConfig& config) -> vq::RowScorer {
        const double power = config.get_float("vnorm_power");  // validated before this runs
        return [power](const float* /*key*/, const float* value, std::int64_t d) {
          double sum = 0;
          for (std::int64_t i = 0; i < d; ++i) sum += static_cast<double>(value[i]) * value[i];
          return static_cast<float>(std::pow(std::sqrt(sum), power));
        };
      },
      /*default_budget=*/256);
  m.paper = "-";
  m.score_signal = "value norm";
  m.deviations = "-";
  m.fields.push_back(vq::FieldSpec{"vnorm_power", vq::FieldType::kFloat, 2.0, 0.5, 8.0, {},
                                   "score = |v|^power"});
  vq::register_method(m);

  // 2. Use it like any method: spec strings drop the prefix, configs are validated.
  const vq::CacheConfig config = vq::CacheConfig::parse("vnorm:budget=8,n_sink=2,power=2");
  vq::LayerCache cache(config, vq::LayerShape{/*n_kv_heads=*/1, /*head_dim=*/4});
  // Token t has value (a_t, 0, 0, 0) with a_t = (7 t mod 20) + 1: 1, 8, 15, 2, 9, 16, ...
  std::vector<float> k(4), v(4, 0.0f);
  for (int t = 0; t < 20; ++t) {
    k = {1.0f, static_cast<float>(t), 0.0f, 0.0f};
    v[0] = static_cast<float>((7 * t) % 20 + 1);
    cache.update(vq::TensorRef::f32(k.data(), 1, 1, 1, 4),
                 vq::TensorRef::f32(v.data(), 1, 1, 1, 4));
  }
  // By hand: the sinks (positions 0, 1) and the 6 largest a_t of positions 2..19, which are 20,
  // 19, 18, 17, 16, 15 at positions 17, 14, 11, 8, 5, 2 (static scores: evicting the lowest row
  // one at a time keeps the top 6).
  const vq::HeadRows rows = cache.stored(0, 0);
  std::printf("kept positions:");
  for (std::int64_t i = 0; i < rows.n_rows; ++i) std::printf(" %d", rows.positions[i]);
  std::printf("\n%s: %zu fields, budget %lld\n", config.method().c_str(),
              vq::find_method("vnorm").fields.size(),
              static_cast<long long>(vq::token_budget(config)));

  // 3. The shared options came with the registration: a merge rule, for instance.
  const vq::CacheConfig merging = vq::CacheConfig::parse("vnorm:budget=8,merge=mean");
  std::printf("shared options: merge=%s (default %s)\n", merging.get_enum("merge").c_str(),
              vq::CacheConfig("vnorm").get_enum("merge").c_str());
  return 0;
}
