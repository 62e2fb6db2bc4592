// OpenAI's request and response JSON for /v1/completions and /v1/chat/completions.
//
// Requests are checked field by field; an unknown field, a wrong type or a value out of range is
// a ServeError 400 naming the field (OpenAI answers "Unrecognized request argument supplied" for
// unknown fields, so this server does too). Accepted: model, messages (chat) / prompt
// (completions: a string), max_tokens (or max_completion_tokens), temperature [0, 2] (default 1),
// top_p [0, 1] (default 1), seed (default 42; at least 1: the sampler's xorshift needs a nonzero
// state), stop (a string or up to 4 strings),
// stream, stream_options.include_usage, n (only 1), user (ignored), and the extension
// "veloxquant": {"method": SPEC}.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "serve/scheduler.h"

namespace vq::serve {

struct ParsedRequest {
  GenRequest gen;
  bool stream = false;
  bool include_usage = false;
};

// `body` is the raw request body. Throws ServeError (400) for anything invalid.
ParsedRequest parse_request(const std::string& body, bool chat, const CacheConfig& default_method,
                            std::int64_t max_tokens_limit);

// {"error": {"message", "type", "param", "code"}}.
std::string error_json(const ServeError& e);

// The response object (non-streaming) and one streaming chunk.
nlohmann::json completion_json(const std::string& id, bool chat, const std::string& model,
                               std::int64_t created, const std::string& text,
                               const Job::Snapshot& s);
nlohmann::json chunk_json(const std::string& id, bool chat, const std::string& model,
                          std::int64_t created, const std::string& text, const char* finish,
                          const Job::Snapshot& s, bool first);
// The veloxquant extension of a response: session id and K/V bytes (resident, full, reserved).
nlohmann::json kv_json(const Job::Snapshot& s);
// JSON text that never throws on invalid UTF-8 (replaced by U+FFFD).
std::string dump(const nlohmann::json& j);

}  // namespace vq::serve
