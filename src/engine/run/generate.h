// Text generation with llama2.c run.c's loop: the prompt (BOS first) is forced, then tokens
// are sampled until `steps` positions have run or a stop token comes (BOS for llama2.c
// checkpoints, as run.c; the configured EOS for Hugging Face ones). The prompt runs as one
// prefill step through the cache; each generated token is one decode step.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "engine/model/model.h"
#include "engine/model/transformer.h"
#include "engine/tokenizers/tokenizer.h"
#include "veloxquant/cache.h"
#include "veloxquant/config.h"

namespace vq::engine {

// The ranges of generate's settings, checked by every front end (the CLI's flags, the Python
// arguments) with base/validate.h: steps in [0, min(kMaxGenerateSteps, seq_len)] (see
// generate_positions), temperature in [0, kMaxTemperature], top_p in [0, 1], any seed.
inline constexpr std::int64_t kMaxGenerateSteps = std::int64_t{1} << 20;  // the largest context
inline constexpr double kMaxTemperature = 1e6;

// The positions a run of `steps` holds: the model's context for 0, else `steps`. A value outside
// [0, seq_len] throws Error(kInvalidArgument) "<name> must be an integer in [0, 512], got 600"
// (run.c silently ran seq_len positions instead: a value the user wrote is not replaced).
std::int64_t generate_positions(const ModelConfig& config, std::int64_t steps,
                                const std::string& name);

struct GenerateOptions {
  std::string prompt;        // "" = BOS only (run.c without -i)
  // The prompt's question (finch, docs/methods.md): appended to `prompt` as is (put a space or
  // newline at its start yourself), and its tokens (those of prompt + question past the longest
  // common prefix with the prompt's own tokens) declared to the cache as the question
  // (ModelCache::set_question_length). "" = none.
  std::string question;
  std::int64_t steps = 256;  // positions to run, prompt included (run.c -n); 0 = seq_len;
                             // at most seq_len (generate_positions)
  float temperature = 0.0f;  // 0 = argmax
  float top_p = 0.9f;        // nucleus sampling when in (0, 1)
  std::uint64_t seed = 42;   // xorshift state (run.c -s); must be nonzero
  CacheConfig method = CacheConfig("full");
  // A head pattern for methods with head types (duoattention); empty: none (others ignore it).
  HeadPattern head_pattern;
};

struct GenerateResult {
  std::vector<std::int32_t> ids;  // the prompt's tokens (BOS first) and the generated ones
  std::string text;               // everything printed (the prompt's pieces included)
  std::int64_t n_prompt = 0;      // prompt tokens, BOS included
  std::int64_t n_decode = 0;      // decode forward steps
  double prefill_seconds = 0;     // the prompt's forward step (+ first sample)
  double decode_seconds = 0;      // the decode steps (forward + sampling)
  double reconstruction_seconds = 0;  // kvzip's reconstruction pass after the prompt (0: none)
  bool stopped = false;           // a stop token ended generation before `steps`
  CacheStats cache;               // at the end
};

// kvzip's reconstruction instruction (Transformer::reconstruct) in `tokenizer`'s ids, plain text
// without a chat template: "\n\nRepeat the previous context exactly." before the first chunk,
// "\n\nRepeat the part of the previous context exactly, starting with" and the previous chunk's
// last 8 tokens before the others, then "\n".
RepeatPrompt repeat_prompt(const Tokenizer& tokenizer);

// The room a run needs for a reconstruction pass after a prompt of `prompt` tokens (kvzip):
// {max_chunk, max_rows} for the Transformer, at least {chunk, rows} (its values without the
// pass), so that a step of the instruction and min(prompt, reconstruction_chunk) context tokens
// fits, within the model's context.
std::pair<std::int64_t, std::int64_t> reconstruction_room(const ModelConfig& config,
                                                          const RepeatPrompt& repeat,
                                                          std::int64_t prompt,
                                                          std::int64_t reconstruction_chunk,
                                                          std::int64_t chunk, std::int64_t rows);

// `on_text` receives each piece as it is produced (for streaming to stdout).
GenerateResult generate(const Model& model, const Tokenizer& tokenizer,
                        const GenerateOptions& options,
                        const std::function<void(const std::string&)>& on_text = {});

}  // namespace vq::engine
