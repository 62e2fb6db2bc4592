// A GGUF file: the header, metadata and tensor directory parsed from memory, then (when that
// succeeds) loaded as a model from a file with its tokenizer from the metadata, used to encode
// and decode.
#include "engine/formats/gguf.h"
#include "engine/model/model.h"
#include "engine/tokenizers/tokenizer.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  bool parsed = false;
  vq::fuzz::expect_clean([&] {
    (void)vq::engine::GgufFile::parse(data, size, "fuzz.gguf");
    parsed = true;
  });
  if (!parsed) return 0;
  const std::string path = vq::fuzz::write_file("model.gguf", data, size);
  vq::fuzz::expect_clean([&] {
    const vq::engine::Model model = vq::engine::Model::load_gguf(path);
    const auto tok = vq::engine::load_tokenizer("", model);
    const auto ids = tok->encode("Once upon a time, \xE2\x9C\x93 <0x0A> \n", true);
    for (std::size_t i = 1; i < ids.size(); ++i) (void)tok->piece(ids[i - 1], ids[i]);
  });
  return 0;
}
