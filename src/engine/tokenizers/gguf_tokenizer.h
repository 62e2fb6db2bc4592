// Tokenizers read from GGUF metadata (tokenizer.ggml.*): "llama" (SentencePiece BPE with
// scores) and "gpt2" (byte-level BPE with merges and a pre-tokenizer regex).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/tokenizers/tokenizer.h"

namespace vq::engine {

class GgufFile;

// The tokenizer.ggml.* values, checked (arrays one entry per token, ids inside the vocabulary).
struct GgufVocab {
  std::string model;  // "llama", "gpt2", ...
  std::string pre;    // tokenizer.ggml.pre ("default" when absent)
  std::vector<std::string> tokens;
  std::vector<float> scores;        // empty when absent
  std::vector<std::int32_t> types;  // llama.cpp token types; empty when absent
  std::vector<std::string> merges;  // "left right", by rank
  std::int32_t bos_id = -1, eos_id = -1, unk_id = -1;
  bool add_bos = false, add_eos = false;
};
// Throws Error(kFileError) naming the file and key when a value is missing or malformed.
GgufVocab read_gguf_vocab(const GgufFile& g);

std::unique_ptr<Tokenizer> load_gguf_tokenizer(const GgufFile& g);
// The "gpt2" (byte-level BPE) tokenizer of `vocab` (gguf_bpe_tokenizer.cpp).
std::unique_ptr<Tokenizer> make_gguf_bpe_tokenizer(const GgufFile& g, GgufVocab vocab);
std::unique_ptr<Tokenizer> load_gguf_tokenizer(const std::string& path);

}  // namespace vq::engine
