#include "serve/json_body.h"

#include <algorithm>

#include "engine/formats/json_limits.h"
#include "serve/scheduler.h"

namespace vq::serve {

nlohmann::json parse_body(std::string_view body) {
  auto invalid = [](const std::string& msg) {
    return ServeError{400, "invalid_request_error", msg, "", 0};
  };
  std::size_t depth = 0;
  const std::size_t at = engine::json_nesting_beyond(body, kMaxBodyDepth, depth);
  if (at != 0) {
    throw invalid("the request body nests arrays/objects deeper than " +
                  std::to_string(kMaxBodyDepth) + " levels (level " + std::to_string(depth) +
                  " at byte " + std::to_string(at) + ")");
  }
  try {
    return nlohmann::json::parse(body.begin(), body.end());
  } catch (const nlohmann::json::parse_error& e) {
    const std::size_t pos = e.byte > 0 ? e.byte - 1 : 0;
    const std::size_t from = std::min(pos > 20 ? pos - 20 : 0, body.size());
    throw invalid("the request body is not valid JSON (syntax error at byte " +
                  std::to_string(e.byte) + " near '" +
                  engine::text_excerpt(body.substr(from, 40), 40) + "')");
  } catch (const nlohmann::json::exception& e) {
    throw invalid("the request body is not valid JSON (" + engine::text_excerpt(e.what(), 120) +
                  ")");
  }
}

std::string quote_value(const nlohmann::json& value) { return engine::json_excerpt(value, 60); }

}  // namespace vq::serve
