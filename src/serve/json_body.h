// The server's one JSON reading layer: every request body is read here, before any field is
// looked at. Nesting is bounded by a linear scan of the bytes before the parser runs, so nothing
// later (field checks, error messages that quote a value, dump, comparisons, destruction) walks a
// deep tree: a body whose field is an array nested 52,000 deep used to overflow the stack in the
// error message that dumped it (issue 33). Values quoted in messages are short excerpts.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace vq::serve {

// Deepest nesting of arrays and objects a request may use. An OpenAI request nests at most 4
// levels (messages[i].content parts, response_format schemas go deeper, up to ~10 in practice).
inline constexpr int kMaxBodyDepth = 32;

// Parses a request body. Throws ServeError 400 (invalid_request_error, param "") for a body that
// is not JSON ("the request body is not valid JSON (syntax error at byte N near '...')") or that
// nests arrays/objects deeper than kMaxBodyDepth ("... deeper than 32 levels (level 33 at byte
// N)"); the depth is checked first, on the raw bytes. A number past double's range (1e400) is
// a 400 whose param is the path of the value holding it ("temperature", "logit_bias.5",
// "stop[1]").
nlohmann::json parse_body(std::string_view body);

// A value as an error message quotes it: its compact JSON, at most 60 characters then "...",
// control and non-ASCII bytes escaped. For values from parse_body (shallow, so never deep work).
std::string quote_value(const nlohmann::json& value);

}  // namespace vq::serve
