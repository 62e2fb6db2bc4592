// GGUF tokenizer metadata (tokenizer.ggml.*) built from a text description, loaded as a
// tokenizer and used to encode and decode: the GGUF reader's byte-level fuzzing (fuzz_gguf)
// rarely produces a well-formed vocabulary, so this target reaches the tokenizers themselves
// (scores, token types, merges, special ids, pre-tokenizers) with arbitrary values.
//
// Input, one item per line:
//   line 1: tokenizer.ggml.model (llama, gpt2, or anything)
//   line 2: tokenizer.ggml.pre
//   line 3: the text to encode
//   then:   t TOKEN SCORE TYPE   a token (SCORE parsed by strtof: nan, inf, 1e40 included;
//                                TYPE an integer), in id order
//           m LEFT RIGHT         a merge
//           b ID / e ID          bos / eos token id (any integer)
//           a 0|1                add_bos_token
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "engine/formats/gguf.h"
#include "engine/formats/gguf_writer.h"
#include "engine/tokenizers/gguf_tokenizer.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using vq::engine::GgufValue;
  if (size > 200000) return 0;
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  std::string model, pre, text, line;
  std::getline(in, model);
  std::getline(in, pre);
  std::getline(in, text);
  std::vector<std::string> tokens, merges;
  std::vector<float> scores;
  std::vector<std::int32_t> types;
  vq::engine::GgufWriter w;
  while (std::getline(in, line)) {
    if (line.size() < 2 || line[1] != ' ') continue;
    std::istringstream item(line.substr(2));
    switch (line[0]) {
      case 't': {
        std::string tok, score;
        std::int64_t type = 1;
        item >> tok >> score >> type;
        tokens.push_back(tok);
        scores.push_back(std::strtof(score.c_str(), nullptr));
        types.push_back(static_cast<std::int32_t>(type));
        break;
      }
      case 'm': merges.push_back(line.substr(2)); break;
      case 'b':
      case 'e': {
        std::int64_t id = 0;
        item >> id;
        w.set(line[0] == 'b' ? "tokenizer.ggml.bos_token_id" : "tokenizer.ggml.eos_token_id",
              GgufValue::u32(static_cast<std::uint32_t>(id)));
        break;
      }
      case 'a': w.set("tokenizer.ggml.add_bos_token", GgufValue::boolean(line[2] == '1')); break;
      default: break;
    }
  }
  w.set("tokenizer.ggml.model", GgufValue::str(model));
  w.set("tokenizer.ggml.pre", GgufValue::str(pre));
  w.set("tokenizer.ggml.tokens", GgufValue::string_array(tokens));
  w.set("tokenizer.ggml.scores", GgufValue::f32_array(scores));
  w.set("tokenizer.ggml.token_type", GgufValue::i32_array(types));
  if (!merges.empty()) w.set("tokenizer.ggml.merges", GgufValue::string_array(merges));
  const auto bytes = w.serialize();
  vq::fuzz::expect_clean([&] {
    const vq::engine::GgufFile g =
        vq::engine::GgufFile::parse(bytes.data(), bytes.size(), "fuzz.gguf");
    const auto tok = vq::engine::load_gguf_tokenizer(g);
    const auto ids = tok->encode(text, true);
    (void)tok->decode(ids);
    for (std::size_t i = 1; i < ids.size(); ++i) (void)tok->piece(ids[i - 1], ids[i]);
  });
  return 0;
}
