// The OpenAI request mapper (serve/openai.h parse_request): the function that turns a request
// body into a GenRequest. The first byte picks the endpoint (chat or completions); the rest is
// the body. A ServeError 400 is the expected answer to bad input, anything else (another
// exception, a crash, a stack overflow on deep nesting: issue 33) is a bug. An accepted request
// must hold what the parser promises.
#include <cmath>

#include "fuzz_util.h"
#include "serve/openai.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const bool chat = (data[0] & 1) != 0;
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  static const vq::CacheConfig def("full");
  constexpr std::int64_t kLimit = 512;
  constexpr std::int64_t kVocab = 512;
  vq::fuzz::expect_clean([&] {
    try {
      const vq::serve::ParsedRequest p = vq::serve::parse_request(body, chat, def, kLimit, kVocab);
      const vq::serve::GenRequest& g = p.gen;
      const bool ok = g.chat == chat && g.max_tokens >= 1 && g.max_tokens <= kLimit &&
                      std::isfinite(g.temperature) && g.temperature >= 0 && g.temperature <= 2 &&
                      (g.temperature == 0 || g.temperature >= 1e-30f) && g.top_p >= 0 &&
                      g.top_p <= 1 && g.seed != 0 && g.stop.size() <= 4 && p.n >= 1 &&
                      p.n <= vq::serve::kMaxChoices && std::fabs(g.presence_penalty) <= 2 &&
                      std::fabs(g.frequency_penalty) <= 2 && g.top_logprobs >= 0 &&
                      g.top_logprobs <= vq::serve::kMaxTopLogprobs &&
                      (chat ? !g.messages.empty() : g.messages.empty());
      if (!ok) {
        std::fprintf(stderr, "fuzz: parse_request accepted a request outside its contract\n");
        std::abort();
      }
      for (const auto& [id, b] : g.logit_bias) {
        if (id < 0 || id >= kVocab || !(std::fabs(b) <= 100)) std::abort();
      }
      for (const auto& m : g.messages) {
        if (m.role != "system" && m.role != "user" && m.role != "assistant") std::abort();
      }
      (void)vq::serve::dump(nlohmann::json(g.prompt));
    } catch (const vq::serve::ServeError& e) {
      if (e.status != 400 || e.message.empty()) std::abort();
      (void)vq::serve::error_json(e);  // the reply body is built without throwing
    }
  });
  return 0;
}
