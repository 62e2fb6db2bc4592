#include "engine/run/generate.h"

#include <algorithm>
#include <chrono>

#include "base/validate.h"
#include "engine/run/sampler.h"
#include "engine/model/transformer.h"
#include "engine/run/qfilters_file.h"
#include "engine/model/weights_check.h"
#include "veloxquant/builder.h"
#include "veloxquant/errors.h"
#include "veloxquant/registry.h"

namespace vq::engine {

std::int64_t generate_positions(const ModelConfig& config, std::int64_t steps,
                                const std::string& name) {
  validate::check_int(steps, name, 0, config.seq_len);
  return steps == 0 ? config.seq_len : steps;
}

RepeatPrompt repeat_prompt(const Tokenizer& tokenizer) {
  RepeatPrompt p;
  p.first = tokenizer.encode_plain("\n\nRepeat the previous context exactly.");
  p.next = tokenizer.encode_plain("\n\nRepeat the part of the previous context exactly, starting with");
  p.suffix = tokenizer.encode_plain("\n");
  p.carry = 8;
  return p;
}

std::pair<std::int64_t, std::int64_t> reconstruction_room(const ModelConfig& config,
                                                          const RepeatPrompt& repeat,
                                                          std::int64_t prompt,
                                                          std::int64_t reconstruction_chunk,
                                                          std::int64_t chunk, std::int64_t rows) {
  const auto head = static_cast<std::int64_t>(
      std::max(repeat.first.size(), repeat.next.size() + static_cast<std::size_t>(repeat.carry)) +
      repeat.suffix.size());
  const std::int64_t step = head + std::min(prompt, reconstruction_chunk);
  const std::int64_t max_rows = std::min(config.seq_len, std::max(rows, prompt + step));
  return {std::min(std::max(chunk, step), max_rows), max_rows};
}

GenerateResult generate(const Model& model, const Tokenizer& tokenizer, const GenerateOptions& o,
                        const std::function<void(const std::string&)>& on_text) {
  using clock = std::chrono::steady_clock;
  const ModelConfig& c = model.config();
  const std::int64_t steps = generate_positions(c, o.steps, "[generate] steps");
  std::vector<std::int32_t> prompt = tokenizer.encode(o.prompt + o.question, true);
  // The question's tokens: past the longest common prefix with the prompt's own.
  std::int64_t question = 0;
  if (!o.question.empty()) {
    const std::vector<std::int32_t> head = tokenizer.encode(o.prompt, true);
    std::size_t common = 0;
    while (common < head.size() && common < prompt.size() && head[common] == prompt[common]) {
      ++common;
    }
    question = static_cast<std::int64_t>(prompt.size() - common);
  }
  if (prompt.empty()) {
    if (c.bos_id < 0) {
      throw Error(ErrorCode::kInvalidArgument,
                  "[generate] the prompt is empty and the model names no BOS token to start from");
    }
    prompt.push_back(c.bos_id);
  }
  const std::int32_t stop = c.format == "llama2c" ? 1 : c.eos_id;
  Sampler sampler(c.vocab_size, o.temperature, o.top_p, o.seed);
  ModelCache cache = make_model_cache(o.method, model);  // loads qfilters' key filters
  if (!o.head_pattern.empty() && o.method.info().head_types) cache.set_head_pattern(o.head_pattern);
  cache.expect_positions(steps);  // memory only: the stores grow no further than the run's rows
  if (question > 0) {
    if (static_cast<std::int64_t>(prompt.size()) > steps) {
      throw Error(ErrorCode::kInvalidArgument,
                  "[generate] the prompt and its question take " + std::to_string(prompt.size()) +
                      " tokens, more than the " + std::to_string(steps) +
                      " positions of the run (steps): the question would be cut off; raise steps");
    }
    cache.set_question_length(question);
  }

  GenerateResult res;
  res.n_prompt = static_cast<std::int64_t>(prompt.size());
  res.ids.push_back(prompt[0]);
  auto emit = [&](std::int32_t prev, std::int32_t next) {
    const std::string p = tokenizer.piece(prev, next);
    res.text += p;
    if (on_text && !p.empty()) on_text(p);
  };

  // Prefill: positions 0 .. chunk-1 in one step. Each position's successor is the next prompt
  // token (forced) while there is one; the last position's is sampled.
  const std::int64_t chunk = std::min<std::int64_t>(res.n_prompt, steps);
  // Buffers sized by this run (steps positions), not by the model's trained context.
  // kvzip: the prompt's rows wait for the reconstruction pass, whose steps get room.
  const bool reconstructs = chunk >= 2 && cache.reads_reconstruction();
  const RepeatPrompt repeat = reconstructs ? repeat_prompt(tokenizer) : RepeatPrompt{};
  std::pair<std::int64_t, std::int64_t> room{std::max<std::int64_t>(1, chunk), steps};
  if (reconstructs) {
    cache.set_reconstruction(true);
    room = reconstruction_room(c, repeat, chunk, cache.reconstruction_chunk(), room.first,
                               room.second);
  }
  Transformer tf(model, room.first, room.second);
  auto t0 = clock::now();
  std::vector<float> work(static_cast<std::size_t>(c.vocab_size));  // the sampler scales in place
  auto sample = [&](const float* logits) {
    if (!all_finite(logits, c.vocab_size)) {
      check_finite(logits, c.vocab_size,
                   "[generate] logits after position " + std::to_string(res.ids.size() - 1));
    }
    std::copy(logits, logits + c.vocab_size, work.begin());
    return sampler.sample(work.data());
  };
  const float* logits = tf.forward(prompt.data(), chunk, cache, Logits::kLast);
  std::int64_t pos = chunk;
  std::int32_t token = prompt[0];
  // Takes the next token: false at the stop token, else prints it and makes it current.
  auto take = [&](std::int32_t next) {
    if (next == stop) {
      res.stopped = true;
      return false;
    }
    emit(token, next);
    res.ids.push_back(next);
    token = next;
    return true;
  };
  for (std::int64_t p = 0; p < chunk; ++p) {
    const std::int32_t next =
        p < res.n_prompt - 1 ? prompt[static_cast<std::size_t>(p + 1)] : sample(logits);
    if (!take(next)) break;
  }
  res.prefill_seconds = std::chrono::duration<double>(clock::now() - t0).count();
  if (reconstructs) res.reconstruction_seconds = tf.reconstruct(prompt.data(), chunk, cache, repeat);
  tf.release_chunk_buffers();  // decoding needs one token's activations, not the prompt's

  // Decode: one token per step.
  t0 = clock::now();
  while (!res.stopped && pos < steps) {
    logits = tf.forward(&token, 1, cache, Logits::kLast);
    ++pos;
    ++res.n_decode;
    if (!take(sample(logits))) break;
  }
  res.decode_seconds = std::chrono::duration<double>(clock::now() - t0).count();
  res.cache = cache.stats();
  return res;
}

}  // namespace vq::engine
