// A result file as `bench table` reads it: parsed with the JSON limits, then tabulated.
#include "engine/formats/json_limits.h"
#include "eval/perturb/perturb_bench.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  vq::fuzz::expect_clean([&] {
    const nlohmann::json doc = vq::engine::parse_json_limited(text, "fuzz.json", "result file");
    try {
      (void)vq::eval::perturb_markdown({doc});
    } catch (const nlohmann::json::exception& e) {
      // bench table turns these into a vq::Error naming the file (tools/cmd_bench.cpp).
      throw vq::Error(vq::ErrorCode::kFileError, e.what());
    }
  });
  return 0;
}
