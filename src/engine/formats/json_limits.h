// Parsing untrusted JSON (safetensors headers, config.json, tokenizer.json, result files)
// without recursion hazards, and quoting it in messages without dumping whole documents.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace vq::engine {

// Deepest nesting of arrays and objects accepted (a real config.json or tokenizer.json nests
// fewer than 10 levels). The parser itself is iterative; the limit keeps every later
// recursive walk (comparisons, copies, dump) shallow.
inline constexpr int kMaxJsonDepth = 128;

// Parses `text` as one JSON document. Throws Error(kFileError) naming `path` and `what` (e.g.
// "safetensors header") when it is not valid JSON or nests deeper than `max_depth`, checked
// while parsing, before any recursive walk. The message quotes at most a short escaped excerpt.
nlohmann::json parse_json_limited(std::string_view text, const std::string& path,
                                  const std::string& what, int max_depth = kMaxJsonDepth);

// The nesting of arrays/objects in `text` checked by one linear pass over the bytes (string
// contents and their escapes skipped; no recursion, no allocation): the byte offset just past
// the bracket that first goes deeper than `limit`, with that level in `depth`; 0 when the text
// never does. Malformed text is left to the parser.
std::size_t json_nesting_beyond(std::string_view text, std::size_t limit, std::size_t& depth);

// A short, printable rendering of a JSON value for an error message: its compact dump when it
// is at most `max_chars` long, else the first `max_chars` characters followed by "..."
// (non-ASCII and control bytes escaped). For values from parse_json_limited (shallow).
std::string json_excerpt(const nlohmann::json& value, std::size_t max_chars = 60);

// The same for raw text: at most `max_chars` characters, control and non-ASCII bytes as \xNN
// (validate::excerpt, base/validate.h).
std::string text_excerpt(std::string_view text, std::size_t max_chars = 60);

}  // namespace vq::engine
