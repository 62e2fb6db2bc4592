// The chat template renderer (engine/run/chat_template.h): every template, conversations of any
// roles and contents, tokenized with a vocabulary that holds every template's marker tokens.
// Byte 0 picks the template and --special; the rest is messages separated by '\0', each led by a
// byte that picks its role. vq::Error (a bad role or order) is fine. Checked: render() is the
// spans joined, and without --special the marker tokens a conversation tokenizes to do not
// depend on what its messages say (typed markers stay text: issue 33).
#include <algorithm>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "engine/run/chat_template.h"
#include "engine/tokenizers/tokenizer.h"
#include "fuzz_util.h"

namespace {
using vq::engine::ChatSpan;
using vq::engine::ChatTemplate;
using vq::engine::Message;
using vq::engine::TemplateKind;

constexpr const char* kMarkers[] = {"<s>", "</s>", "<|im_start|>", "<|im_end|>",
                                    "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"};

// Printable ASCII one token per character, "\n", <unk>, then the markers as special added
// tokens (ids 97 ...).
const vq::engine::Tokenizer& tokenizer() {
  static const std::unique_ptr<vq::engine::Tokenizer> tok = [] {
    nlohmann::json vocab = nlohmann::json::object();
    for (int c = 32; c < 127; ++c) vocab[std::string(1, static_cast<char>(c))] = c - 32;
    vocab["\n"] = 95;
    vocab["<unk>"] = 96;
    nlohmann::json added = nlohmann::json::array();
    for (int i = 0; i < 7; ++i) {
      added.push_back({{"id", 97 + i}, {"content", kMarkers[i]}, {"special", true},
                       {"normalized", false}});
    }
    const nlohmann::json j = {
        {"added_tokens", added},
        {"model",
         {{"type", "BPE"}, {"unk_token", "<unk>"}, {"byte_fallback", false}, {"vocab", vocab},
          {"merges", nlohmann::json::array()}}}};
    const std::string text = j.dump();
    const std::string path = vq::fuzz::write_file(
        "tokenizer.json", reinterpret_cast<const std::uint8_t*>(text.data()), text.size());
    return vq::engine::load_hf_tokenizer(path);
  }();
  return *tok;
}

std::map<std::int32_t, int> marker_counts(const std::vector<std::int32_t>& ids) {
  std::map<std::int32_t, int> n;
  for (const std::int32_t id : ids) {
    if (id >= 97) ++n[id];
  }
  return n;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0 || size > 4096) return 0;
  const TemplateKind kinds[] = {TemplateKind::kPlain, TemplateKind::kLlama2, TemplateKind::kMistral,
                                TemplateKind::kLlama3, TemplateKind::kChatML};
  const TemplateKind kind = kinds[data[0] % 5];
  const bool special = (data[0] & 0x80) != 0;
  static const char* roles[] = {"system", "user", "assistant", "tool"};
  std::vector<Message> conv;
  std::size_t at = 1;
  while (at < size && conv.size() < 64) {
    const char* role = roles[data[at] % 4];
    ++at;
    std::size_t end = at;
    while (end < size && data[end] != 0) ++end;
    conv.push_back({role, std::string(reinterpret_cast<const char*>(data + at), end - at)});
    at = end + 1;
  }
  vq::fuzz::expect_clean([&] {
    const ChatTemplate chat(kind, tokenizer(), 97, 98, special);
    const std::size_t first = conv.empty() ? 0 : data[size - 1] % conv.size();
    const std::vector<ChatSpan> spans = chat.render_spans(conv, first);
    std::string joined;
    for (const ChatSpan& s : spans) joined += s.text;
    if (joined != chat.render(conv, first)) std::abort();
    const auto ids = chat.tokenize(spans, true);
    for (const std::int32_t id : ids) {
      if (id < 0 || id >= tokenizer().vocab_size()) std::abort();
    }
    if (!special) {
      std::vector<Message> bland = conv;
      for (Message& m : bland) m.content = "x";
      if (marker_counts(ids) != marker_counts(chat.tokenize(chat.render_spans(bland, first), true))) {
        std::fprintf(stderr, "fuzz: a message's content changed the marker tokens\n");
        std::abort();
      }
    }
  });
  return 0;
}
