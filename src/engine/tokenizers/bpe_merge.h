// The BPE merge loop both GGUF tokenizers run (engine/gguf_tokenizer.cpp's SentencePiece-style
// "llama" model and engine/gguf_bpe_tokenizer.cpp's byte-level "gpt2" model), as llama.cpp's
// tokenizers do: the text starts as one symbol per UTF-8 character (a truncated sequence at the
// end is one symbol of what is left; a stray continuation byte is a symbol of its own); then,
// repeatedly, the adjacent pair with the best priority is merged, the leftmost on ties, until no
// pair has one. A heap of candidate pairs holds each pair's merged length at push time, so a
// pair whose side has grown since is recognised as stale and skipped.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <queue>
#include <string_view>
#include <vector>

namespace vq::engine {

// Bytes of the UTF-8 sequence a lead byte starts (1 for ASCII and for bytes that start none).
inline std::size_t utf8_seq_len(unsigned char c) noexcept {
  return c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
}

// One final symbol: text.substr(start, len).
struct BpeSymbol {
  std::size_t start, len;
};

// Merges `text` as described above. priority(left, right) gives the merge priority of two
// adjacent symbols (views into `text`, right directly after left) as a value of type P, larger
// first, or std::nullopt when they never merge. Returns the final symbols in text order (none for
// an empty text).
template <typename P, typename Priority>
std::vector<BpeSymbol> bpe_merge(std::string_view text, Priority&& priority) {
  struct Sym {
    std::size_t start, len;
    std::int64_t prev, next;
  };
  std::vector<Sym> syms;
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t n =
        std::min(utf8_seq_len(static_cast<unsigned char>(text[i])), text.size() - i);
    syms.push_back({i, n, static_cast<std::int64_t>(syms.size()) - 1,
                    static_cast<std::int64_t>(syms.size()) + 1});
    i += n;
  }
  if (syms.empty()) return {};
  syms.back().next = -1;
  struct Pair {
    P priority;
    std::int64_t left;
    std::size_t len;  // bytes of the merged text when pushed (stale when it changed)
    bool operator<(const Pair& o) const {
      return priority < o.priority || (priority == o.priority && left > o.left);
    }
  };
  std::priority_queue<Pair> heap;
  auto try_pair = [&](std::int64_t left) {
    if (left < 0 || syms[static_cast<std::size_t>(left)].next < 0) return;
    const Sym& a = syms[static_cast<std::size_t>(left)];
    const Sym& b = syms[static_cast<std::size_t>(a.next)];
    const std::optional<P> p = priority(text.substr(a.start, a.len), text.substr(b.start, b.len));
    if (p) heap.push({*p, left, a.len + b.len});
  };
  for (std::size_t i = 0; i + 1 < syms.size(); ++i) try_pair(static_cast<std::int64_t>(i));
  while (!heap.empty()) {
    const Pair top = heap.top();
    heap.pop();
    Sym& a = syms[static_cast<std::size_t>(top.left)];
    if (a.len == 0 || a.next < 0) continue;
    Sym& b = syms[static_cast<std::size_t>(a.next)];
    if (a.len + b.len != top.len) continue;  // stale: one side changed since the push
    a.len += b.len;
    b.len = 0;
    a.next = b.next;
    if (a.next >= 0) syms[static_cast<std::size_t>(a.next)].prev = top.left;
    try_pair(a.prev);
    try_pair(top.left);
  }
  std::vector<BpeSymbol> out;
  for (std::int64_t i = 0; i >= 0; i = syms[static_cast<std::size_t>(i)].next) {
    out.push_back({syms[static_cast<std::size_t>(i)].start, syms[static_cast<std::size_t>(i)].len});
  }
  return out;
}

}  // namespace vq::engine
