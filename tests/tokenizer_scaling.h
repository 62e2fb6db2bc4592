// Shared by the tokenizer scaling tests (test_gguf.cpp, test_hf_pretokenizers.cpp): a
// deterministic English-like text and a check that encoding time grows linearly with length.
//
// Why a time ratio and not a count: the quadratic cost this guards against (issue 23) was
// inside PCRE2 (re-validating the rest of the subject at every match), where nothing can be
// counted from outside. The check compares the best of three runs at 128K and at 1M characters:
// linear cost gives a ratio of 8, quadratic 64; the bound (24) leaves 3x for noise on a loaded
// machine and still fails a quadratic tokenizer, without an absolute time limit.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>

#include "engine/tokenizers/tokenizer.h"

namespace vq::test {

// `n` bytes of words (letters, some digits, punctuation, apostrophes, a two-byte letter),
// separated by spaces with a newline now and then: every pre-tokenizer regex alternative fires.
inline std::string scaling_text(std::size_t n) {
  static const char* const words[] = {"the", "cat's", "sat", "on", "1234", "mat,", "and",
                                      "caf\xC3\xA9", "went", "home!!", "it", "was", "(late)"};
  std::string out;
  std::uint64_t x = 88172645463325252ull;
  while (out.size() < n) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    out += words[x % 13];
    out += x % 17 == 0 ? "\n" : " ";
  }
  out.resize(n);
  while (!out.empty() && (static_cast<unsigned char>(out.back()) & 0xC0) != 0)
    out.pop_back();  // do not end inside the two-byte letter
  return out;
}

inline double best_encode_seconds(const engine::Tokenizer& tok, const std::string& text) {
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto ids = tok.encode(text, false);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_FALSE(ids.empty());
    best = std::min(best, s);
  }
  return best;
}

inline void expect_linear_encode(const engine::Tokenizer& tok) {
  const double small = best_encode_seconds(tok, scaling_text(std::size_t{1} << 17));
  const double large = best_encode_seconds(tok, scaling_text(std::size_t{1} << 20));
  std::printf("encode: 128K characters %.3f s, 1M characters %.3f s (ratio %.1f; linear 8)\n",
              small, large, large / small);
  EXPECT_LT(large, 24 * small + 0.05) << "encoding time grows faster than linearly";
}

}  // namespace vq::test
