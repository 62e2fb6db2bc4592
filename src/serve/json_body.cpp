#include "serve/json_body.h"

#include <algorithm>
#include <vector>

#include "engine/formats/json_limits.h"
#include "serve/scheduler.h"

namespace vq::serve {

namespace {
using json = nlohmann::json;

// nlohmann's DOM built through its SAX interface, keeping the path of the value being read
// (`messages[0].content`), so an error inside a value (a number past double's range: 1e400)
// names the field.
class PathSax {
 public:
  json root;
  std::string error_path;  // the path of the value at the error
  int error_id = 0;        // nlohmann's exception id
  std::size_t error_byte = 0;
  std::string error_what;

  bool null() { return put(json(nullptr)); }
  bool boolean(bool v) { return put(json(v)); }
  bool number_integer(json::number_integer_t v) { return put(json(v)); }
  bool number_unsigned(json::number_unsigned_t v) { return put(json(v)); }
  bool number_float(json::number_float_t v, const json::string_t&) { return put(json(v)); }
  bool string(json::string_t& v) { return put(json(std::move(v))); }
  bool binary(json::binary_t& v) { return put(json(json::binary_t(std::move(v)))); }
  bool start_object(std::size_t) { return open(json::object()); }
  bool key(json::string_t& k) {
    levels_.back().key = k;
    return true;
  }
  bool end_object() { return close(); }
  bool start_array(std::size_t) { return open(json::array()); }
  bool end_array() { return close(); }
  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception& ex) {
    error_id = ex.id;
    error_byte = position;
    error_what = ex.what();
    error_path = path();
    return false;
  }

 private:
  struct Level {
    json* value;
    std::string key;  // objects: the key being read
  };
  std::vector<Level> levels_;  // the open arrays and objects, outermost first
  bool has_root_ = false;

  json* place(json v) {
    if (levels_.empty()) {
      root = std::move(v);
      has_root_ = true;
      return &root;
    }
    json& parent = *levels_.back().value;
    if (parent.is_array()) {
      parent.push_back(std::move(v));
      return &parent.back();
    }
    json& slot = parent[levels_.back().key];
    slot = std::move(v);
    return &slot;
  }
  bool put(json v) {
    place(std::move(v));
    return true;
  }
  // An open container is the last element of its parent array (or a key's value, stable in
  // the object's map), so its address holds until it is closed.
  bool open(json v) {
    levels_.push_back(Level{place(std::move(v)), ""});
    return true;
  }
  bool close() {
    levels_.pop_back();
    return true;
  }
  std::string path() const {
    std::string p;
    for (std::size_t i = 0; i < levels_.size(); ++i) {
      const Level& l = levels_[i];
      if (l.value->is_array()) {
        // An outer array's element being read is its last (already placed); the innermost
        // one's is the next.
        const std::size_t n = l.value->size();
        p += "[" + std::to_string(i + 1 < levels_.size() ? n - 1 : n) + "]";
      } else {
        if (!p.empty()) p += ".";
        p += engine::text_excerpt(l.key, 40);
      }
    }
    return p;
  }
};
}  // namespace

nlohmann::json parse_body(std::string_view body) {
  auto invalid = [](const std::string& msg, const std::string& param = "") {
    return ServeError{400, "invalid_request_error", msg, param, 0};
  };
  std::size_t depth = 0;
  const std::size_t at = engine::json_nesting_beyond(body, kMaxBodyDepth, depth);
  if (at != 0) {
    throw invalid("the request body nests arrays/objects deeper than " +
                  std::to_string(kMaxBodyDepth) + " levels (level " + std::to_string(depth) +
                  " at byte " + std::to_string(at) + ")");
  }
  PathSax sax;
  bool ok = false;
  try {
    ok = json::sax_parse(body.begin(), body.end(), &sax);
  } catch (const json::exception& e) {
    throw invalid("the request body is not valid JSON (" + engine::text_excerpt(e.what(), 120) +
                  ")");
  }
  if (ok) return std::move(sax.root);
  if (sax.error_id == 406) {  // out_of_range.406: a number past double's range
    const std::string where =
        sax.error_path.empty() ? "the request body" : "'" + sax.error_path + "'";
    throw invalid(where + " is a number outside the range of a double (about +-1.8e308)",
                  sax.error_path);
  }
  if (sax.error_id >= 100 && sax.error_id < 200) {  // parse_error: a syntax error
    const std::size_t pos = sax.error_byte > 0 ? sax.error_byte - 1 : 0;
    const std::size_t from = std::min(pos > 20 ? pos - 20 : 0, body.size());
    throw invalid("the request body is not valid JSON (syntax error at byte " +
                  std::to_string(sax.error_byte) + " near '" +
                  engine::text_excerpt(body.substr(from, 40), 40) + "')");
  }
  throw invalid("the request body is not valid JSON (" + engine::text_excerpt(sax.error_what, 120) +
                ")");
}

std::string quote_value(const nlohmann::json& value) { return engine::json_excerpt(value, 60); }

}  // namespace vq::serve
