// OpenAI's request and response JSON for /v1/completions and /v1/chat/completions.
//
// Requests are checked field by field; an unknown top-level field, a wrong type or a value out
// of range is a ServeError 400 naming the field (OpenAI answers "Unrecognized request argument
// supplied" for unknown fields, so this server does too). `null` for any optional field means
// its default. Accepted (docs/serve.md lists the same):
//   model (ignored), max_tokens or max_completion_tokens, temperature [0, 2] (default 1),
//   top_p [0, 1] (default 1; 0 is greedy), seed (any 64-bit signed integer, default 42:
//   sampler_seed maps it to the sampler's nonzero state), stop (a string or up to 4), stream,
//   stream_options.include_usage, n [1, kMaxChoices] (independent choices, seeds from
//   choice_seed), presence_penalty and frequency_penalty [-2, 2], logit_bias ({"token id":
//   bias in [-100, 100]}, ids within the vocabulary), user (ignored), and the extension
//   "veloxquant": {"method": SPEC}.
//   Chat: messages (roles system, developer (= system), user, assistant; content a string, or a
//   list of {"type": "text", "text"} parts, concatenated; an assistant message may carry the
//   keys the SDKs return with a reply (refusal, annotations, parsed, audio, function_call,
//   tool_calls: null or empty) and name, all ignored), logprobs (bool) and top_logprobs [0, 20],
//   response_format {"type": "text"}; tools, functions (null or empty), tool_choice and
//   function_call (null or "none").
//   Completions: prompt (a string), logprobs (an integer [0, 5]: the chosen tokens' log
//   probabilities and that many alternatives).
// Refused with OpenAI's error for unsupported features (400, param named, code
// "unsupported_parameter" / "unsupported_value"): non-empty tools/functions, a tool_choice or
// function_call other than "none", response_format json_object and json_schema, tool messages,
// tool calls in a message, and content parts other than text.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "serve/scheduler.h"

namespace vq::serve {

inline constexpr int kMaxChoices = 8;             // n
inline constexpr int kMaxTopLogprobs = 20;        // chat's top_logprobs
inline constexpr int kMaxCompletionLogprobs = 5;  // completions' logprobs

struct ParsedRequest {
  GenRequest gen;
  bool stream = false;
  bool include_usage = false;
  int n = 1;  // choices, each a job of its own (seed choice_seed(gen.seed, index))
};

// `body` is the raw request body; logit_bias ids must be below `vocab_size`. Throws ServeError
// (400) for anything invalid.
ParsedRequest parse_request(const std::string& body, bool chat, const CacheConfig& default_method,
                            std::int64_t max_tokens_limit, std::int64_t vocab_size);

// A request's seed as the sampler's xorshift state, which must be nonzero: a positive seed is
// itself, a negative one its two's-complement bits, and 0 is 0x9E3779B97F4A7C15 (the state of
// seed -7046029254386353131 too).
std::uint64_t sampler_seed(std::int64_t seed);
// Choice `index`'s state for a request whose state is `state`: choice 0 is `state` itself (so
// n = 2's first choice is the n = 1 reply), choice i > 0 splitmix64(state + i * 0x9E3779B97F4A7C15)
// (0x9E3779B97F4A7C15 if that is 0).
std::uint64_t choice_seed(std::uint64_t state, int index);

// {"error": {"message", "type", "param", "code"}}.
std::string error_json(const ServeError& e);

// One choice's whole output (non-streaming).
struct ChoiceOutput {
  std::string text;
  std::vector<TokenLogprob> logprobs;
  Job::Snapshot last;  // its final snapshot (finish reason, counts, session)
};
// The response object (non-streaming): choices in order, usage (the prompt counted once, the
// completions summed), "veloxquant" of choice 0. `logprobs`: whether each choice carries them.
nlohmann::json completion_json(const std::string& id, bool chat, const std::string& model,
                               std::int64_t created, const std::vector<ChoiceOutput>& choices,
                               bool logprobs);
// One streaming chunk of choice `index`; `logprobs` null (nullptr) or the entries of its tokens.
nlohmann::json chunk_json(const std::string& id, bool chat, const std::string& model,
                          std::int64_t created, int index, const std::string& text,
                          const std::vector<TokenLogprob>* logprobs, const char* finish,
                          const Job::Snapshot& s, bool first);
// The `logprobs` object of a choice: chat {"content": [{token, logprob, bytes, top_logprobs}],
// "refusal": null}; completions {"tokens", "token_logprobs", "top_logprobs", "text_offset"}.
nlohmann::json logprobs_json(bool chat, const std::vector<TokenLogprob>& entries);
// usage: prompt_tokens (and cached) of the first snapshot, completion_tokens summed.
nlohmann::json usage_json(const std::vector<Job::Snapshot>& choices);
// The veloxquant extension of a response: session id and K/V bytes (resident, full, reserved).
nlohmann::json kv_json(const Job::Snapshot& s);
// JSON text that never throws on invalid UTF-8 (replaced by U+FFFD).
std::string dump(const nlohmann::json& j);

}  // namespace vq::serve
