#include "engine/formats/json_limits.h"

#include <algorithm>
#include <cstdio>

#include "veloxquant/errors.h"

namespace vq::engine {
namespace {

struct TooDeep {
  std::size_t depth;
};

}  // namespace

std::string text_excerpt(std::string_view text, std::size_t max_chars) {
  std::string out;
  for (std::size_t i = 0; i < text.size() && i < max_chars; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else if (c == '\\') {
      out += "\\\\";
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      out += buf;
    }
  }
  if (text.size() > max_chars) out += "...";
  return out;
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

nlohmann::json parse_json_limited(std::string_view text, const std::string& path,
                                  const std::string& what, int max_depth) {
  const auto limit = static_cast<std::size_t>(max_depth);
  // The callback sees the depth of each container as it opens (0 for the document itself);
  // throwing stops the parser before it builds anything deeper.
  auto check = [limit](int depth, nlohmann::json::parse_event_t event, nlohmann::json&) {
    if ((event == nlohmann::json::parse_event_t::object_start ||
         event == nlohmann::json::parse_event_t::array_start) &&
        static_cast<std::size_t>(depth) + 1 > limit) {
      throw TooDeep{static_cast<std::size_t>(depth) + 1};
    }
    return true;
  };
  try {
    return nlohmann::json::parse(text.begin(), text.end(), check);
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
