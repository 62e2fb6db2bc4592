#include "serve/openai.h"

#include <algorithm>
#include <climits>
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
// OpenAI's answer to a parameter or value a model does not support.
[[noreturn]] void unsupported(const std::string& msg, const std::string& param,
                              const std::string& code) {
  throw ServeError{400, "invalid_request_error", msg, param, 0, code};
}

// A float request setting (temperature, top_p, penalties, biases): finite, in [lo, hi], and 0
// or at least validate::kMinRealMagnitude (the CLI's rule: 1e-45 would act as 0 in single
// precision).
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

std::string string_field(const json& j, const std::string& name) {
  if (!j.is_string())
    invalid(
        "'" + name + "' must be a string, got " + std::string(j.type_name()) + " " + quote_value(j),
        name);
  return j.get<std::string>();
}

bool boolean(const json& j, const std::string& name) {
  if (!j.is_boolean())
    invalid("'" + name + "' must be true or false, got " + std::string(j.type_name()) + " " +
                quote_value(j),
            name);
  return j.get<bool>();
}

// A message's content: a string, or a list of text parts (concatenated).
std::string message_content(const json& c, const std::string& at) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) {
    invalid("'" + at + "' must be a string or an array of content parts, got " +
                std::string(c.type_name()) + " " + quote_value(c),
            at);
  }
  std::string text;
  for (std::size_t j = 0; j < c.size(); ++j) {
    const json& part = c[j];
    const std::string pat = at + "[" + std::to_string(j) + "]";
    if (!part.is_object())
      invalid("'" + pat + "' must be an object like {\"type\": \"text\", \"text\": \"...\"}", pat);
    const auto type = part.find("type");
    if (type == part.end() || !type->is_string())
      invalid("'" + pat + ".type' is required (a string; only \"text\" is supported)",
              pat + ".type");
    if (type->get<std::string>() != "text") {
      unsupported("content parts of type '" + engine::text_excerpt(type->get<std::string>()) +
                      "' are not supported by this server (only \"text\" parts)",
                  pat + ".type", "unsupported_value");
    }
    bool has_text = false;
    for (auto f = part.begin(); f != part.end(); ++f) {
      if (f.key() == "type") continue;
      if (f.key() != "text")
        invalid("Unrecognized argument supplied: " + pat + "." + engine::text_excerpt(f.key()),
                pat + "." + engine::text_excerpt(f.key()));
      text += string_field(*f, pat + ".text");
      has_text = true;
    }
    if (!has_text) invalid("'" + pat + ".text' is required", pat + ".text");
  }
  return text;
}

// A null, empty or absent list of tool calls (what an SDK's reply carries) is accepted.
bool empty_or_null(const json& v) { return v.is_null() || (v.is_array() && v.empty()); }

Message parse_message(const json& m, const std::string& at) {
  if (!m.is_object()) invalid("'" + at + "' must be an object", at);
  const auto role_it = m.find("role");
  if (role_it == m.end()) invalid("'" + at + ".role' is required", at + ".role");
  Message msg;
  msg.role = string_field(*role_it, at + ".role");
  if (msg.role == "tool" || msg.role == "function") {
    unsupported("'" + at + ".role' " + msg.role +
                    ": tool messages are not supported by this server (it has no tools)",
                at + ".role", "unsupported_value");
  }
  if (msg.role == "developer") msg.role = "system";  // OpenAI's newer name for system
  if (msg.role != "system" && msg.role != "user" && msg.role != "assistant")
    invalid("'" + at + ".role' must be system, developer, user or assistant, got '" +
                engine::text_excerpt(msg.role) + "'",
            at + ".role");
  const bool assistant = msg.role == "assistant";
  bool has_content = false;
  for (auto f = m.begin(); f != m.end(); ++f) {
    const std::string& k = f.key();
    const std::string fat = at + "." + engine::text_excerpt(k);
    if (k == "role") continue;
    if (k == "content") {
      if (f->is_null() && assistant) continue;  // a reply with no text
      msg.content = message_content(*f, fat);
      has_content = true;
    } else if (k == "name") {
      if (!f->is_null()) string_field(*f, fat);
    } else if (assistant && k == "refusal") {
      if (!f->is_null()) string_field(*f, fat);  // text of a refusal: not model input
    } else if (assistant && k == "parsed") {
      // openai-node's stream helper and parse() add it (their parse of the content): ignored
    } else if (assistant && k == "annotations") {
      if (!f->is_null() && !f->is_array()) invalid("'" + fat + "' must be an array", fat);
    } else if (assistant && (k == "tool_calls" || k == "function_call" || k == "audio")) {
      if (!empty_or_null(*f)) {
        unsupported("'" + fat + "': " +
                        (k == "audio" ? std::string("audio replies")
                                      : std::string("tool and function calls")) +
                        " are not supported by this server",
                    fat, "unsupported_value");
      }
    } else {
      invalid("Unrecognized argument supplied: " + fat, fat);
    }
  }
  if (!has_content && !assistant) invalid("'" + at + ".content' is required", at + ".content");
  return msg;
}

// logit_bias: {"token id": bias in [-100, 100]}, ids ascending.
std::vector<std::pair<std::int32_t, float>> parse_logit_bias(const json& v,
                                                             std::int64_t vocab_size) {
  const std::string k = "logit_bias";
  if (!v.is_object())
    invalid(
        "'logit_bias' must be an object mapping token ids (as strings) to numbers in "
        "[-100, 100], got " +
            std::string(v.type_name()) + " " + quote_value(v),
        k);
  std::vector<std::pair<std::int32_t, float>> out;
  for (auto f = v.begin(); f != v.end(); ++f) {
    const std::string& key = f.key();
    const bool digits = !key.empty() && key.size() <= 18 &&
                        std::all_of(key.begin() + (key[0] == '-' ? 1 : 0), key.end(),
                                    [](char ch) { return ch >= '0' && ch <= '9'; }) &&
                        key != "-";
    if (!digits) {
      invalid("'logit_bias' keys must be token ids (integers written as strings), got '" +
                  engine::text_excerpt(key) + "'",
              k);
    }
    const long long id = std::stoll(key);
    if (id < 0 || id >= vocab_size) {
      invalid("'logit_bias' key '" + key + "' is not a token id of this model's vocabulary (0 to " +
                  std::to_string(vocab_size - 1) + ")",
              k);
    }
    const double b = number(*f, "logit_bias." + key, -100, 100);
    out.emplace_back(static_cast<std::int32_t>(id), static_cast<float>(b));
  }
  std::sort(out.begin(), out.end());
  // Keys that name the same id ("7" and "07"): the last one written wins, as for a JSON key.
  out.erase(std::unique(out.begin(), out.end(),
                        [](const auto& a, const auto& b) { return a.first == b.first; }),
            out.end());
  out.erase(std::remove_if(out.begin(), out.end(), [](const auto& e) { return e.second == 0.0f; }),
            out.end());
  return out;
}
}  // namespace

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::uint64_t sampler_seed(std::int64_t seed) {
  if (seed == 0) return 0x9E3779B97F4A7C15ull;
  return static_cast<std::uint64_t>(seed);
}

std::uint64_t choice_seed(std::uint64_t state, int index) {
  if (index == 0) return state;
  std::uint64_t z = state + static_cast<std::uint64_t>(index) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return z == 0 ? 0x9E3779B97F4A7C15ull : z;
}

ParsedRequest parse_request(const std::string& body, bool chat, const CacheConfig& default_method,
                            std::int64_t max_tokens_limit, std::int64_t vocab_size) {
  const json j = parse_body(body);  // depth-bounded before anything walks it
  if (!j.is_object()) invalid("the request body must be a JSON object", "");
  // clang-format off
  static const std::set<std::string> common = {
      "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop",
      "stream", "stream_options", "n", "user", "veloxquant", "presence_penalty",
      "frequency_penalty", "logit_bias", "logprobs"};
  static const std::set<std::string> chat_only = {
      "messages", "top_logprobs", "response_format", "tools", "tool_choice", "functions",
      "function_call"};
  // clang-format on
  ParsedRequest p;
  p.gen.chat = chat;
  p.gen.method = default_method;
  p.gen.max_tokens = std::min<std::int64_t>(256, max_tokens_limit);
  p.gen.seed = sampler_seed(42);
  bool has_body = false;  // messages or prompt
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    const json& v = it.value();
    if (!common.count(k) && !(chat ? chat_only.count(k) : k == "prompt")) {
      invalid("Unrecognized request argument supplied: " + engine::text_excerpt(k),
              engine::text_excerpt(k));
    }
    if (k == "messages") {
      if (!v.is_array() || v.empty()) invalid("'messages' must be a non-empty array", k);
      for (std::size_t i = 0; i < v.size(); ++i)
        p.gen.messages.push_back(parse_message(v[i], "messages[" + std::to_string(i) + "]"));
      has_body = true;
    } else if (k == "prompt") {
      if (!v.is_string()) invalid("'prompt' must be a string", k);
      p.gen.prompt = v.get<std::string>();
      has_body = true;
    } else if (v.is_null()) {
      continue;  // null: the field's default
    } else if (k == "model") {
      string_field(v, k);
    } else if (k == "max_tokens" || k == "max_completion_tokens") {
      p.gen.max_tokens = integer(v, k, 1, max_tokens_limit);
    } else if (k == "temperature") {
      p.gen.temperature = static_cast<float>(number(v, k, 0, 2));
    } else if (k == "top_p") {
      p.gen.top_p = static_cast<float>(number(v, k, 0, 1));
    } else if (k == "seed") {
      p.gen.seed = sampler_seed(integer(v, k, INT64_MIN, INT64_MAX));
    } else if (k == "stop") {
      if (v.is_string()) {
        if (!v.get<std::string>().empty()) p.gen.stop.push_back(v.get<std::string>());
      } else if (v.is_array() && v.size() <= 4) {
        for (const json& s : v) {
          if (!s.is_string() || s.get<std::string>().empty())
            invalid("'stop' must be a non-empty string or up to 4 of them", k);
          p.gen.stop.push_back(s.get<std::string>());
        }
      } else {
        invalid("'stop' must be a string or an array of up to 4 strings", k);
      }
    } else if (k == "stream") {
      p.stream = boolean(v, k);
    } else if (k == "stream_options") {
      if (!v.is_object()) invalid("'stream_options' must be an object", k);
      for (auto f = v.begin(); f != v.end(); ++f) {
        if (f.key() != "include_usage" || !(f->is_boolean() || f->is_null()))
          invalid("'stream_options' takes only include_usage (a boolean)", k);
        p.include_usage = f->is_boolean() && f->get<bool>();
      }
    } else if (k == "n") {
      p.n = static_cast<int>(integer(v, k, 1, kMaxChoices));
    } else if (k == "user") {
      string_field(v, k);
    } else if (k == "presence_penalty") {
      p.gen.presence_penalty = static_cast<float>(number(v, k, -2, 2));
    } else if (k == "frequency_penalty") {
      p.gen.frequency_penalty = static_cast<float>(number(v, k, -2, 2));
    } else if (k == "logit_bias") {
      p.gen.logit_bias = parse_logit_bias(v, vocab_size);
    } else if (k == "logprobs" && chat) {
      p.gen.logprobs = boolean(v, k);
    } else if (k == "logprobs") {  // completions: how many alternatives, the chosen ones too
      p.gen.logprobs = true;
      p.gen.top_logprobs = static_cast<int>(integer(v, k, 0, kMaxCompletionLogprobs));
    } else if (k == "top_logprobs") {
      p.gen.top_logprobs = static_cast<int>(integer(v, k, 0, kMaxTopLogprobs));
    } else if (k == "response_format") {
      if (!v.is_object())
        invalid("'response_format' must be an object like {\"type\": \"text\"}", k);
      const auto type = v.find("type");
      if (type == v.end() || !type->is_string())
        invalid("'response_format.type' is required (\"text\")", k);
      const std::string t = type->get<std::string>();
      if (t == "json_object" || t == "json_schema") {
        unsupported("Unsupported value: 'response_format.type' '" + t +
                        "' is not supported by this server (only \"text\": it has no "
                        "constrained decoding)",
                    k, "unsupported_value");
      }
      if (t != "text")
        invalid("'response_format.type' must be \"text\", got '" + engine::text_excerpt(t) + "'",
                k);
      for (auto f = v.begin(); f != v.end(); ++f) {
        if (f.key() != "type")
          invalid(
              "Unrecognized argument supplied: response_format." + engine::text_excerpt(f.key()),
              k);
      }
    } else if (k == "tools" || k == "functions") {
      if (!v.is_array() || !v.empty()) {
        unsupported("Unsupported parameter: '" + k +
                        "' is not supported by this server (no tool calling); send it empty or "
                        "leave it out",
                    k, "unsupported_parameter");
      }
    } else if (k == "tool_choice" || k == "function_call") {
      if (!(v.is_string() && v.get<std::string>() == "none")) {
        unsupported("Unsupported parameter: '" + k +
                        "' is not supported by this server (no tool calling); only \"none\"",
                    k, "unsupported_parameter");
      }
    } else if (k == "veloxquant") {
      if (!v.is_object()) invalid("'veloxquant' must be an object like {\"method\": \"h2o:budget=512\"}", k);
      for (auto f = v.begin(); f != v.end(); ++f) {
        if (f.key() != "method") {
          invalid("Unrecognized argument supplied: veloxquant." + engine::text_excerpt(f.key()),
                  "veloxquant." + engine::text_excerpt(f.key()));
        }
        if (f->is_null()) continue;
        if (!f->is_string()) invalid("'veloxquant.method' must be a method spec string", "veloxquant.method");
        try {
          p.gen.method = CacheConfig::parse(f->get<std::string>());
        } catch (const Error& e) {
          invalid(std::string("'veloxquant.method': ") + e.what(), "veloxquant.method");
        }
      }
    }
  }
  if (!has_body)
    invalid(chat ? "'messages' is required" : "'prompt' is required", chat ? "messages" : "prompt");
  if (chat && p.gen.top_logprobs > 0 && !p.gen.logprobs)
    invalid("'top_logprobs' needs 'logprobs': true", "top_logprobs");
  return p;
}

std::string error_json(const ServeError& e) {
  json j = {{"error",
             {{"message", e.message},
              {"type", e.type},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
  return dump(j);
}

json kv_json(const Job::Snapshot& s) {
  return {{"session", s.session},
          {"kv_bytes", s.kv_resident},
          {"kv_payload_bytes", s.kv_payload},
          {"kv_full_bytes", s.kv_full},
          {"kv_reserved_bytes", s.kv_reserved}};
}

json usage_json(const std::vector<Job::Snapshot>& choices) {
  std::int64_t completion = 0;
  for (const auto& s : choices) completion += s.completion_tokens;
  const std::int64_t prompt = choices.empty() ? 0 : choices[0].prompt_tokens;
  const std::int64_t cached = choices.empty() ? 0 : choices[0].cached_tokens;
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

namespace {
json token_bytes(const std::string& t) {
  json b = json::array();
  for (const char ch : t) b.push_back(static_cast<int>(static_cast<unsigned char>(ch)));
  return b;
}
}  // namespace

json logprobs_json(bool chat, const std::vector<TokenLogprob>& entries) {
  if (chat) {
    json content = json::array();
    for (const auto& e : entries) {
      json top = json::array();
      for (const auto& [t, l] : e.top)
        top.push_back({{"token", t}, {"logprob", l}, {"bytes", token_bytes(t)}});
      content.push_back({{"token", e.token},
                         {"logprob", e.logprob},
                         {"bytes", token_bytes(e.token)},
                         {"top_logprobs", std::move(top)}});
    }
    return {{"content", std::move(content)}, {"refusal", nullptr}};
  }
  json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  for (const auto& e : entries) {
    tokens.push_back(e.token);
    lps.push_back(e.logprob);
    json top = json::object();
    for (const auto& [t, l] : e.top) {
      if (!top.contains(t)) top[t] = l;  // two ids with the same text: the more probable
    }
    tops.push_back(std::move(top));
    offsets.push_back(e.text_offset);
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(lps)},
          {"top_logprobs", std::move(tops)},
          {"text_offset", std::move(offsets)}};
}

json completion_json(const std::string& id, bool chat, const std::string& model,
                     std::int64_t created, const std::vector<ChoiceOutput>& choices,
                     bool logprobs) {
  json out = json::array();
  std::vector<Job::Snapshot> snaps;
  for (std::size_t i = 0; i < choices.size(); ++i) {
    const ChoiceOutput& c = choices[i];
    json choice = {{"index", i},
                   {"finish_reason", c.last.finish_reason},
                   {"logprobs", logprobs ? logprobs_json(chat, c.logprobs) : json(nullptr)}};
    if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}, {"refusal", nullptr}};
    } else {
      choice["text"] = c.text;
    }
    out.push_back(std::move(choice));
    snaps.push_back(c.last);
  }
  return {{"id", id},
          {"object", chat ? "chat.completion" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", std::move(out)},
          {"usage", usage_json(snaps)},
          {"veloxquant", choices.empty() ? json(nullptr) : kv_json(choices[0].last)}};
}

json chunk_json(const std::string& id, bool chat, const std::string& model, std::int64_t created,
                int index, const std::string& text, const std::vector<TokenLogprob>* logprobs,
                const char* finish, const Job::Snapshot& s, bool first) {
  json choice = {
      {"index", index},
      {"finish_reason", finish == nullptr ? json(nullptr) : json(finish)},
      {"logprobs", logprobs == nullptr ? json(nullptr) : logprobs_json(chat, *logprobs)}};
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
