// The C API's step sequence driven by the input: a method spec (line 1), then one byte per
// call (begin_step with S new tokens whose values come from the input, NaN and inf included;
// view_head at any (b, h); end_step with or without probabilities of a right or wrong shape;
// stored; stats; kept_per_head; reset; config edits). Every call must return a status, never
// crash, abort or read out of bounds (ASan), whatever the order.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "veloxquant/veloxquant_c.h"

namespace {

struct Input : vq::fuzz::ByteReader {
  float value() { return ByteReader::value(32.0f); }  // mostly ordinary, sometimes NaN, inf or huge
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::uint8_t* nl = static_cast<const std::uint8_t*>(std::memchr(data, '\n', size));
  if (nl == nullptr) return 0;
  const std::string spec(reinterpret_cast<const char*>(data), static_cast<std::size_t>(nl - data));
  Input in{{nl + 1, size - static_cast<std::size_t>(nl + 1 - data)}};
  vq_config* config = nullptr;
  if (vq_config_parse(spec.c_str(), &config, nullptr) != VQ_OK) return 0;
  const std::int64_t H = 1 + in.byte() % 3, D = 1 + in.byte() % 16, G = 1 + in.byte() % 2;
  const vq_layer_shape shape = {H, D, H * G, 0, 1};
  vq_layer_cache* layer = nullptr;
  if (vq_layer_cache_create(config, &shape, &layer, nullptr) != VQ_OK) {
    vq_config_free(config);
    return 0;
  }
  std::vector<float> k, v, probs;
  vq_step_view view{};
  vq_head_rows rows{};
  vq_cache_stats stats{};
  std::int64_t counts[8];
  float key[64], value[64];
  for (int calls = 0; in.more() && calls < 400; ++calls) {
    const std::uint8_t op = in.byte();
    switch (op % 8) {
      case 0:
      case 1: {  // begin_step with S tokens; sometimes a wrong head count or dim
        const std::int64_t S = 1 + in.byte() % 8;
        const std::int64_t h = (op & 0x80) ? H + 1 : H, d = (op & 0x40) ? D + 1 : D;
        k.resize(static_cast<std::size_t>(h * S * d));
        v.resize(k.size());
        for (float& x : k) x = in.value();
        for (float& x : v) x = in.value();
        const vq_tensor tk = {k.data(), VQ_DTYPE_F32, {1, h, S, d}, {h * S * d, S * d, d, 1}};
        vq_tensor tv = tk;
        tv.data = v.data();
        (void)vq_layer_begin_step(layer, &tk, &tv, &view);
        break;
      }
      case 2:
        (void)vq_layer_view_head(layer, in.byte() % 3 - 1, in.byte() % (H + 2) - 1, &rows);
        break;
      case 3: {  // end_step: with probabilities of the view's shape, or off by one, or none
        if (op & 0x80) {
          (void)vq_layer_end_step(layer, nullptr);
          break;
        }
        const std::int64_t R = view.n_rows + ((op & 0x40) ? 1 : 0), S = view.n_new;
        if (R <= 0 || S <= 0 || R * S * H * G > 100000) {
          (void)vq_layer_end_step(layer, nullptr);
          break;
        }
        probs.resize(static_cast<std::size_t>(H * G * S * R));
        for (float& x : probs) x = (op & 0x20) ? in.value() : 1.0f / static_cast<float>(R);
        const vq_attention att = {probs.data(), 1, H * G, S, R};
        (void)vq_layer_end_step(layer, &att);
        break;
      }
      case 4:
        if (vq_layer_stored(layer, 0, in.byte() % H, &rows) == VQ_OK && rows.n_rows > 0 &&
            D <= 64) {
          (void)vq_head_rows_load(&rows, in.byte() % rows.n_rows, key, value);
        }
        break;
      case 5:
        (void)vq_layer_stats(layer, &stats);
        (void)vq_layer_kept_per_head(layer, counts, static_cast<std::size_t>(in.byte() % 9),
                                     nullptr);
        break;
      case 6: (void)vq_layer_reset(layer); break;
      default: {  // a config edit on a copy, then a new cache (the old one goes)
        const char* keys[] = {"budget", "seed", "kv_dtype", "demote_budget", "n_sink"};
        const char* values[] = {"0", "-1", "1", "f32", "9223372036854775807", "nan", "2"};
        (void)vq_config_set(config, keys[in.byte() % 5], values[in.byte() % 7]);
        vq_layer_cache* next = nullptr;
        if (vq_layer_cache_create(config, &shape, &next, nullptr) == VQ_OK) {
          vq_layer_cache_free(layer);
          layer = next;
          view = vq_step_view{};
        }
        break;
      }
    }
  }
  vq_layer_cache_free(layer);
  vq_config_free(config);
  return 0;
}
