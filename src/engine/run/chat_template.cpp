#include "engine/run/chat_template.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/formats/gguf.h"
#include "engine/formats/json_limits.h"
#include "engine/formats/mapped_file.h"
#include "veloxquant/errors.h"

namespace vq::engine {

namespace {
[[noreturn]] void invalid(const std::string& msg) {
  throw Error(ErrorCode::kInvalidArgument, msg);
}
bool has(const std::string& s, const char* needle) { return s.find(needle) != std::string::npos; }
}  // namespace

const char* to_string(TemplateKind kind) noexcept {
  switch (kind) {
    case TemplateKind::kPlain: return "plain";
    case TemplateKind::kLlama2: return "llama2";
    case TemplateKind::kMistral: return "mistral";
    case TemplateKind::kLlama3: return "llama3";
    case TemplateKind::kChatML: return "chatml";
  }
  return "?";
}

TemplateKind parse_template_name(const std::string& name) {
  for (TemplateKind k : {TemplateKind::kPlain, TemplateKind::kLlama2, TemplateKind::kMistral,
                         TemplateKind::kLlama3, TemplateKind::kChatML}) {
    if (name == to_string(k)) return k;
  }
  invalid("--chat-template must be one of plain, llama2, mistral, llama3, chatml; got '" + name +
          "'");
}

TemplateKind detect_template(const std::string& t) {
  if (t.empty()) return TemplateKind::kPlain;
  if (has(t, "<|start_header_id|>")) return TemplateKind::kLlama3;
  if (has(t, "<|im_start|>")) return TemplateKind::kChatML;
  if (has(t, "[INST]")) return has(t, "<<SYS>>") ? TemplateKind::kLlama2 : TemplateKind::kMistral;
  std::string head = t.substr(0, 120);
  for (char& ch : head) {
    if (ch == '\n') ch = ' ';
  }
  invalid("the model's chat template is none this server can render (it recognises Llama 2 "
          "'[INST]' + '<<SYS>>', Mistral '[INST]', Llama 3 '<|start_header_id|>', ChatML "
          "'<|im_start|>'); it begins: \"" + head +
          "\". Force one with --chat-template plain|llama2|mistral|llama3|chatml");
}

std::string model_chat_template(const std::string& model_path, const std::string& model_dir,
                                const std::string& format) {
  if (format == "gguf") {
    const GgufFile f = GgufFile::open(model_path);
    const GgufValue* v = f.find("tokenizer.chat_template");
    return v == nullptr ? std::string() : v->s;
  }
  if (format != "hf") return {};
  const std::filesystem::path p = std::filesystem::path(model_dir) / "tokenizer_config.json";
  std::error_code ec;
  if (!std::filesystem::exists(p, ec)) return {};
  const std::string text = read_text_file(p.string());  // a FIFO is refused, not waited on
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kFileError, p.string() + ": not valid JSON (" + e.what() + ")");
  }
  const auto it = j.find("chat_template");
  if (it == j.end() || it->is_null()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    for (const auto& e : *it) {
      if (e.is_object() && e.value("name", "") == "default" && e.contains("template") &&
          e["template"].is_string())
        return e["template"].get<std::string>();
    }
  }
  throw Error(ErrorCode::kFileError, p.string() +
                                         ": chat_template must be a string or a list holding "
                                         "{\"name\": \"default\", \"template\": ...}");
}

ChatTemplate::ChatTemplate(TemplateKind kind, const Tokenizer& tokenizer,
                           std::int32_t bos_id, std::int32_t eos_id, bool parse_special)
    : kind_(kind), tok_(&tokenizer), parse_special_(parse_special) {
  auto lookup = [&](const std::string& marker) {
    for (std::int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
      if (tokenizer.token_text(id) == marker) return id;
    }
    invalid("the " + std::string(to_string(kind)) + " chat template needs the token '" + marker +
            "', which is not in the tokenizer's vocabulary (" + tokenizer.path() + ")");
  };
  switch (kind) {
    case TemplateKind::kPlain:
      bos_ = bos_id;
      break;
    case TemplateKind::kLlama2:
    case TemplateKind::kMistral:
      if (bos_id < 0 || eos_id < 0) invalid("the [INST] chat templates need BOS and EOS tokens");
      bos_ = bos_id;
      end_of_turn_ = eos_id;
      markers_["<s>"] = bos_id;
      markers_["</s>"] = eos_id;
      break;
    case TemplateKind::kLlama3:
      bos_ = bos_id;
      for (const char* m : {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"})
        markers_[m] = lookup(m);
      end_of_turn_ = markers_["<|eot_id|>"];
      break;
    case TemplateKind::kChatML:
      for (const char* m : {"<|im_start|>", "<|im_end|>"}) markers_[m] = lookup(m);
      end_of_turn_ = markers_["<|im_end|>"];
      break;
  }
}

std::vector<ChatSpan> ChatTemplate::render_spans(const std::vector<Message>& m,
                                                std::size_t first) const {
  if (m.empty() || first >= m.size()) invalid("messages: the conversation is empty");
  std::size_t system = m.size(), first_user = m.size();
  for (std::size_t i = 0; i < m.size(); ++i) {
    const std::string& r = m[i].role;
    if (r != "system" && r != "user" && r != "assistant") {
      invalid("messages[" + std::to_string(i) + "].role must be system, user or assistant, got '" +
              text_excerpt(r) + "'");
    }
    if (r == "system") {
      if (i != 0) invalid("messages[" + std::to_string(i) + "]: a system message must come first");
      system = i;
    }
    if (r == "user" && first_user == m.size()) first_user = i;
  }
  const bool has_system = system < m.size() && !m[system].content.empty();
  std::vector<ChatSpan> out;
  auto text = [&](std::string t) {
    if (t.empty()) return;
    if (!out.empty() && !out.back().content) {
      out.back().text += t;
    } else {
      out.push_back({std::move(t), false});
    }
  };
  auto content = [&](const std::string& c) {
    if (!c.empty()) out.push_back({c, true});
  };
  for (std::size_t i = first; i < m.size(); ++i) {
    const Message& msg = m[i];
    switch (kind_) {
      case TemplateKind::kPlain:
        if (i > 0) text("\n");
        content(msg.content);
        break;
      case TemplateKind::kLlama2:
        if (msg.role == "system") break;
        if (msg.role == "user") {
          if (i != first_user) text("<s>");
          text("[INST] ");
          if (i == first_user && has_system) {
            text("<<SYS>>\n");
            content(m[system].content);
            text("\n<</SYS>>\n\n");
          }
          content(msg.content);
          text(" [/INST]");
        } else {
          text(" ");
          content(msg.content);
          text(" </s>");
        }
        break;
      case TemplateKind::kMistral:
        if (msg.role == "system") break;
        if (msg.role == "user") {
          text("[INST] ");
          if (i == first_user && has_system) {
            content(m[system].content);
            text("\n\n");
          }
          content(msg.content);
          text(" [/INST]");
        } else {
          content(msg.content);
          text("</s>");
        }
        break;
      case TemplateKind::kLlama3:
        text("<|start_header_id|>" + msg.role + "<|end_header_id|>\n\n");
        content(msg.content);
        text("<|eot_id|>");
        break;
      case TemplateKind::kChatML:
        text("<|im_start|>" + msg.role + "\n");
        content(msg.content);
        text("<|im_end|>\n");
        break;
    }
  }
  if (kind_ == TemplateKind::kLlama3) text("<|start_header_id|>assistant<|end_header_id|>\n\n");
  if (kind_ == TemplateKind::kChatML) text("<|im_start|>assistant\n");
  return out;
}

std::string ChatTemplate::render(const std::vector<Message>& m, std::size_t first) const {
  std::string out;
  for (const ChatSpan& s : render_spans(m, first)) out += s.text;
  return out;
}

std::string ChatTemplate::close_after_end() const {
  return kind_ == TemplateKind::kChatML ? "\n" : "";
}

std::string ChatTemplate::close_without_end() const {
  switch (kind_) {
    case TemplateKind::kPlain: return "";
    case TemplateKind::kLlama2: return " </s>";
    case TemplateKind::kMistral: return "</s>";
    case TemplateKind::kLlama3: return "<|eot_id|>";
    case TemplateKind::kChatML: return "<|im_end|>\n";
  }
  return "";
}

std::vector<std::int32_t> ChatTemplate::tokenize(const std::vector<ChatSpan>& spans,
                                                 bool start) const {
  std::vector<std::int32_t> ids;
  if (start && bos_ >= 0) ids.push_back(bos_);
  std::string run;  // text since the last marker: template text and content, encoded together
  auto flush = [&] {
    if (run.empty()) return;
    const auto part = parse_special_ ? tok_->encode(run, false) : tok_->encode_plain(run);
    ids.insert(ids.end(), part.begin(), part.end());
    run.clear();
  };
  for (const ChatSpan& span : spans) {
    if (span.content && !parse_special_) {
      run += span.text;
      continue;
    }
    const std::string& text = span.text;
    std::size_t at = 0;
    while (at < text.size()) {
      // The leftmost marker from `at` (the longest of those starting there).
      std::size_t best = std::string::npos;
      const std::pair<const std::string, std::int32_t>* hit = nullptr;
      for (const auto& mk : markers_) {
        const std::size_t p = text.find(mk.first, at);
        if (p < best || (p == best && hit != nullptr && mk.first.size() > hit->first.size())) {
          best = p;
          hit = &mk;
        }
      }
      if (hit == nullptr || best == std::string::npos) {
        run.append(text, at, std::string::npos);
        break;
      }
      run.append(text, at, best - at);
      flush();
      ids.push_back(hit->second);
      at = best + hit->first.size();
    }
  }
  flush();
  return ids;
}

std::vector<std::int32_t> ChatTemplate::tokenize(const std::string& template_text,
                                                 bool start) const {
  return tokenize(std::vector<ChatSpan>{{template_text, false}}, start);
}

}  // namespace vq::engine
