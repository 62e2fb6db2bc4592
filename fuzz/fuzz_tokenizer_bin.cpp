// A llama2.c tokenizer.bin, loaded for a 512-token vocabulary, then used to encode and decode.
#include "engine/tokenizers/tokenizer.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = vq::fuzz::write_file("tokenizer.bin", data, size);
  vq::fuzz::expect_clean([&] {
    const auto tok = vq::engine::load_llama2c_tokenizer(path, 512);
    const auto ids = tok->encode("Once upon a time, \xE2\x9C\x93 <0x0A> \n", true);
    for (std::size_t i = 1; i < ids.size(); ++i) (void)tok->piece(ids[i - 1], ids[i]);
  });
  return 0;
}
