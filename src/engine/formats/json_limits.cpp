#include "engine/formats/json_limits.h"

#include <algorithm>
#include <cstdio>

#include "base/validate.h"
#include "veloxquant/errors.h"

namespace vq::engine {
namespace {

struct TooDeep {
  std::size_t depth;
};

}  // namespace

std::string text_excerpt(std::string_view text, std::size_t max_chars) {
  return validate::excerpt(text, max_chars);
}

std::string json_excerpt(const nlohmann::json& value, std::size_t max_chars) {
  // A big array or object is summarised before it is dumped, so a huge document never becomes
  // a huge string here.
  if ((value.is_array() || value.is_object()) && value.size() > max_chars) {
    return std::string(value.is_array() ? "an array of " : "an object of ") +
           std::to_string(value.size()) + " entries";
  }
  if (value.is_string() && value.get_ref<const std::string&>().size() > 4 * max_chars) {
    return "\"" + text_excerpt(value.get_ref<const std::string&>(), max_chars) + "\"";
  }
  const std::string dumped = value.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
  return text_excerpt(dumped, max_chars);
}

std::size_t json_nesting_beyond(std::string_view text, std::size_t limit, std::size_t& depth_out) {
  std::size_t depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped byte (\" or \\) cannot end the string
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) {
        depth_out = depth;
        return i + 1;
      }
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return 0;
}

nlohmann::json parse_json_limited(std::string_view text, const std::string& path,
                                  const std::string& what, int max_depth) {
  const auto limit = static_cast<std::size_t>(max_depth);
  // The depth is checked by a linear scan before parsing. (nlohmann's parser callback did the
  // same while parsing, but costs time quadratic in an object's entries: 200,000 tensors in a
  // safetensors header took over 20 minutes.)
  try {
    std::size_t depth = 0;
    if (json_nesting_beyond(text, limit, depth) != 0) throw TooDeep{depth};
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const TooDeep& e) {
    throw Error(ErrorCode::kFileError,
                "'" + path + "': " + what + " nests arrays/objects deeper than " +
                    std::to_string(limit) + " levels (found level " + std::to_string(e.depth) +
                    "); not a valid " + what,
                path);
  } catch (const nlohmann::json::parse_error& e) {
    // nlohmann's message quotes the last token read; keep ours short and say where.
    const std::size_t at = e.byte > 0 ? e.byte - 1 : 0;
    const std::size_t from = at > 20 ? at - 20 : 0;
    throw Error(ErrorCode::kFileError,
                "'" + path + "': " + what + " is not valid JSON (syntax error at byte " +
                    std::to_string(e.byte) + " near '" +
                    text_excerpt(text.substr(std::min(from, text.size()), 40), 40) + "')",
                path);
  } catch (const nlohmann::json::exception& e) {
    throw Error(
        ErrorCode::kFileError,
        "'" + path + "': " + what + " is not valid JSON (" + text_excerpt(e.what(), 120) + ")",
        path);
  }
}

}  // namespace vq::engine
