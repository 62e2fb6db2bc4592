#include "serve/openai.h"

#include <cmath>
#include <set>

#include "base/validate.h"
#include "engine/formats/json_limits.h"
#include "serve/json_body.h"
#include "veloxquant/errors.h"

namespace vq::serve {

namespace {
using json = nlohmann::json;

[[noreturn]] void invalid(const std::string& msg, const std::string& param) {
  throw ServeError{400, "invalid_request_error", msg, param, 0};
}

// A float request setting (temperature, top_p): finite, in [lo, hi], and 0 or at least
// validate::kMinRealMagnitude (the CLI's rule: 1e-45 would act as 0 in single precision).
double number(const json& j, const std::string& name, double lo, double hi) {
  if (!j.is_number()) {
    invalid("'" + name + "' must be a number, got " + std::string(j.type_name()) + " " +
                quote_value(j),
            name);
  }
  const double v = j.get<double>();
  const std::string why = validate::float_real_problem(v, lo, hi);
  if (!why.empty()) invalid("'" + name + "' " + why, name);
  return v;
}

std::int64_t integer(const json& j, const std::string& name, std::int64_t lo, std::int64_t hi) {
  const std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  if (!j.is_number_integer()) {
    invalid("'" + name + "' must be an integer in " + range + ", got " +
                std::string(j.type_name()) + " " + quote_value(j),
            name);
  }
  if (j.is_number_unsigned() && j.get<std::uint64_t>() > static_cast<std::uint64_t>(hi))
    invalid("'" + name + "' must be in " + range + ", got " + quote_value(j), name);
  const std::int64_t v = j.get<std::int64_t>();
  if (v < lo || v > hi) invalid("'" + name + "' must be in " + range + ", got " + quote_value(j), name);
  return v;
}
}  // namespace

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

ParsedRequest parse_request(const std::string& body, bool chat, const CacheConfig& default_method,
                            std::int64_t max_tokens_limit) {
  const json j = parse_body(body);  // depth-bounded before anything walks it
  if (!j.is_object()) invalid("the request body must be a JSON object", "");
  static const std::set<std::string> common = {
      "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop",
      "stream", "stream_options", "n", "user", "veloxquant"};
  ParsedRequest p;
  p.gen.chat = chat;
  p.gen.method = default_method;
  p.gen.max_tokens = std::min<std::int64_t>(256, max_tokens_limit);
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    const json& v = it.value();
    if (chat && k == "messages") {
      if (!v.is_array() || v.empty()) invalid("'messages' must be a non-empty array", k);
      for (std::size_t i = 0; i < v.size(); ++i) {
        const json& m = v[i];
        const std::string at = "messages[" + std::to_string(i) + "]";
        if (!m.is_object()) invalid("'" + at + "' must be an object", at);
        Message msg;
        for (auto f = m.begin(); f != m.end(); ++f) {
          if (f.key() == "role") {
            if (!f->is_string()) invalid("'" + at + ".role' must be a string", at + ".role");
            msg.role = f->get<std::string>();
          } else if (f.key() == "content") {
            if (!f->is_string()) invalid("'" + at + ".content' must be a string", at + ".content");
            msg.content = f->get<std::string>();
          } else if (f.key() != "name") {
            invalid("Unrecognized argument supplied: " + at + "." + engine::text_excerpt(f.key()),
                    at + "." + engine::text_excerpt(f.key()));
          }
        }
        if (msg.role != "system" && msg.role != "user" && msg.role != "assistant")
          invalid("'" + at + ".role' must be system, user or assistant, got '" +
                      engine::text_excerpt(msg.role) + "'",
                  at + ".role");
        p.gen.messages.push_back(std::move(msg));
      }
    } else if (!chat && k == "prompt") {
      if (!v.is_string()) invalid("'prompt' must be a string", k);
      p.gen.prompt = v.get<std::string>();
    } else if (!common.count(k)) {
      invalid("Unrecognized request argument supplied: " + engine::text_excerpt(k),
              engine::text_excerpt(k));
    } else if (k == "model") {
      if (!v.is_string()) invalid("'model' must be a string", k);
    } else if (k == "max_tokens" || k == "max_completion_tokens") {
      p.gen.max_tokens = integer(v, k, 1, max_tokens_limit);
    } else if (k == "temperature") {
      p.gen.temperature = static_cast<float>(number(v, k, 0, 2));
    } else if (k == "top_p") {
      p.gen.top_p = static_cast<float>(number(v, k, 0, 1));
    } else if (k == "seed") {
      p.gen.seed = static_cast<std::uint64_t>(integer(v, k, 1, INT64_MAX));
    } else if (k == "stop") {
      if (v.is_string()) {
        if (!v.get<std::string>().empty()) p.gen.stop.push_back(v.get<std::string>());
      } else if (v.is_array() && v.size() <= 4) {
        for (const json& s : v) {
          if (!s.is_string() || s.get<std::string>().empty())
            invalid("'stop' must be a non-empty string or up to 4 of them", k);
          p.gen.stop.push_back(s.get<std::string>());
        }
      } else if (!v.is_null()) {
        invalid("'stop' must be a string or an array of up to 4 strings", k);
      }
    } else if (k == "stream") {
      if (!v.is_boolean()) invalid("'stream' must be true or false", k);
      p.stream = v.get<bool>();
    } else if (k == "stream_options") {
      if (!v.is_object()) invalid("'stream_options' must be an object", k);
      for (auto f = v.begin(); f != v.end(); ++f) {
        if (f.key() != "include_usage" || !f->is_boolean())
          invalid("'stream_options' takes only include_usage (a boolean)", k);
        p.include_usage = f->get<bool>();
      }
    } else if (k == "n") {
      if (integer(v, k, 1, 1) != 1) invalid("'n' must be 1", k);
    } else if (k == "user") {
      if (!v.is_string()) invalid("'user' must be a string", k);
    } else if (k == "veloxquant") {
      if (!v.is_object()) invalid("'veloxquant' must be an object like {\"method\": \"h2o:budget=512\"}", k);
      for (auto f = v.begin(); f != v.end(); ++f) {
        if (f.key() != "method") {
          invalid("Unrecognized argument supplied: veloxquant." + engine::text_excerpt(f.key()),
                  "veloxquant." + engine::text_excerpt(f.key()));
        }
        if (!f->is_string()) invalid("'veloxquant.method' must be a method spec string", "veloxquant.method");
        try {
          p.gen.method = CacheConfig::parse(f->get<std::string>());
        } catch (const Error& e) {
          invalid(std::string("'veloxquant.method': ") + e.what(), "veloxquant.method");
        }
      }
    }
  }
  if (chat && !j.contains("messages")) invalid("'messages' is required", "messages");
  if (!chat && !j.contains("prompt")) invalid("'prompt' is required", "prompt");
  return p;
}

std::string error_json(const ServeError& e) {
  json j = {{"error",
             {{"message", e.message},
              {"type", e.type},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", nullptr}}}};
  return dump(j);
}

json kv_json(const Job::Snapshot& s) {
  return {{"session", s.session},
          {"kv_bytes", s.kv_resident},
          {"kv_full_bytes", s.kv_full},
          {"kv_reserved_bytes", s.kv_reserved}};
}

namespace {
json usage(const Job::Snapshot& s) {
  return {{"prompt_tokens", s.prompt_tokens},
          {"completion_tokens", s.completion_tokens},
          {"total_tokens", s.prompt_tokens + s.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", s.cached_tokens}}}};
}
}  // namespace

json completion_json(const std::string& id, bool chat, const std::string& model,
                     std::int64_t created, const std::string& text, const Job::Snapshot& s) {
  json choice = {{"index", 0}, {"finish_reason", s.finish_reason}, {"logprobs", nullptr}};
  if (chat) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
  }
  return {{"id", id},
          {"object", chat ? "chat.completion" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", json::array({choice})},
          {"usage", usage(s)},
          {"veloxquant", kv_json(s)}};
}

json chunk_json(const std::string& id, bool chat, const std::string& model, std::int64_t created,
                const std::string& text, const char* finish, const Job::Snapshot& s, bool first) {
  json choice = {{"index", 0},
                 {"finish_reason", finish == nullptr ? json(nullptr) : json(finish)},
                 {"logprobs", nullptr}};
  if (chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || finish == nullptr) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  return {{"id", id},
          {"object", chat ? "chat.completion.chunk" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", json::array({choice})},
          {"veloxquant", kv_json(s)}};
}

}  // namespace vq::serve
