// A safetensors file (the 8-byte header length, the JSON header, the data section).
#include "engine/formats/safetensors.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = vq::fuzz::write_file("model.safetensors", data, size);
  vq::fuzz::expect_clean([&] { vq::engine::SafetensorsFile f(path); });
  return 0;
}
