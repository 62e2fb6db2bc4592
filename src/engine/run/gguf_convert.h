// Writing a loaded Model (llama2.c or Hugging Face checkpoint, or GGUF) and its tokenizer as a
// GGUF file llama.cpp can run (architecture `llama`).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/formats/gguf_writer.h"
#include "engine/compute/quants.h"

namespace vq::engine {

class Model;

struct ConvertReport {
  std::int64_t n_tensors = 0;
  std::int64_t file_bytes = 0;
  std::string vocab_model;               // tokenizer.ggml.model written: "llama" or "gpt2"
  std::vector<std::string> kept_as_f32;  // matrices whose rows do not fit the block size
};

// Converts `model` with its tokenizer (`tokenizer_path`; "" = the default next to the model)
// to GGUF at `out_path`, storing 2-D weights as `type` (F32, F16, BF16 or Q8_0; a matrix whose
// rows are not a multiple of the block size stays F32, as llama.cpp's quantizer also falls
// back) and 1-D norms as F32. Rotate-half (Hugging Face) q/k rows are permuted to llama.cpp's
// interleaved pairs. The file is written atomically (see GgufWriter::write).
// Throws Error(kFileError) for an unusable tokenizer, Error(kIoError) when writing fails.
ConvertReport convert_to_gguf(const Model& model, const std::string& tokenizer_path, GgmlType type,
                              const std::string& out_path);

// Tokenizer metadata (tokenizer.ggml.*) for `vocab_size` ids:
//  - from a llama2.c tokenizer.bin: model "llama", pieces with ' ' written as U+2581,
//    BOS/EOS pieces "<s>"/"</s>", scores, token types (unknown 0, control 1 and 2, bytes
//    "<0xNN>"), add_bos_token true;
//  - from a Hugging Face tokenizer.json: see gguf_convert.cpp. Returns the model name written.
void add_llama2c_vocab(GgufWriter& w, const std::string& tokenizer_bin, std::int64_t vocab_size);
std::string add_hf_vocab(GgufWriter& w, const std::string& tokenizer_json, std::int64_t vocab_size,
                         std::int32_t bos_id, std::int32_t eos_id);

// The permutation llama.cpp's converter applies to HF q/k weights: within each head of
// `head_dim` rows, interleaved row 2i + j takes rotate-half row j * head_dim/2 + i.
// `w` is [n_heads * head_dim][cols]; returns the permuted copy.
std::vector<float> rotate_half_to_interleaved(const float* w, std::int64_t n_heads,
                                              std::int64_t head_dim, std::int64_t cols);

}  // namespace vq::engine
