// The llama2.c tokenizer (tokenizer.bin / tok512.bin) with run.c's encode() and decode()
// semantics, reproduced exactly:
//  - encode: optional BOS (1); a dummy-prefix " " token when the text is non-empty; one token
//    per UTF-8 codepoint (at most 4 bytes, run.c's own grouping of stray continuation bytes),
//    or one byte-fallback token (byte + 3) per byte when the codepoint is not a piece; then,
//    repeatedly, merge the adjacent pair whose concatenation is the piece with the highest
//    score (leftmost on ties; scores must exceed -1e10). run.c rescans all pairs after every
//    merge (quadratic); here a heap with lazily invalidated entries makes the same choices in
//    O(n log n), so whole files can be encoded.
//  - decode: the piece of `token`, without its leading space right after BOS; "<0xNN>" pieces
//    are the raw byte; a single byte that is neither printable nor whitespace prints as
//    nothing (run.c's safe_printf).
// The text is read as a C string (up to its first NUL byte), as run.c does.
#include <cmath>
#include <cstring>
#include <queue>
#include <unordered_map>

#include "engine/formats/mapped_file.h"
#include "engine/formats/file_error.h"
#include "engine/tokenizers/tokenizer.h"

namespace vq::engine {
namespace {

class Llama2cTokenizer final : public Tokenizer {
 public:
  Llama2cTokenizer(const std::string& path, std::int64_t vocab_size) {
    path_ = path;
    kind_ = "llama2c";
    vocab_size_ = vocab_size;
    bos_id_ = 1;
    const std::string data = read_text_file(path);
    std::size_t at = 0;
    auto read_i32 = [&](const std::string& what) {
      if (data.size() - at < 4) {
        file_error(path,
                   "truncated llama2.c tokenizer: expected 4 more bytes for " + what +
                       " at offset " + std::to_string(at) + ", found " +
                       std::to_string(data.size() - at) +
                       (at == 0 ? "" : " (does the model's vocab_size match this tokenizer?)"));
      }
      std::int32_t v;
      std::memcpy(&v, data.data() + at, 4);
      at += 4;
      return v;
    };
    max_token_length_ = read_i32("max_token_length");
    if (max_token_length_ <= 0 || max_token_length_ > (1 << 20)) {
      file_error(path, "max_token_length must be in [1, 1048576], found " +
                           std::to_string(max_token_length_) + " (not a llama2.c tokenizer?)");
    }
    pieces_.reserve(static_cast<std::size_t>(vocab_size));
    scores_.reserve(static_cast<std::size_t>(vocab_size));
    for (std::int64_t i = 0; i < vocab_size; ++i) {
      const std::string which = "piece " + std::to_string(i) + " of " + std::to_string(vocab_size);
      std::int32_t score_bits = read_i32("the score of " + which);
      float score;
      std::memcpy(&score, &score_bits, 4);
      if (!std::isfinite(score)) file_error(path, "the score of " + which + " is not finite");
      const std::int32_t len = read_i32("the length of " + which);
      if (len < 0 || len > max_token_length_) {
        file_error(path, "the length of " + which + " must be in [0, max_token_length = " +
                             std::to_string(max_token_length_) + "], found " + std::to_string(len));
      }
      if (data.size() - at < static_cast<std::size_t>(len)) {
        file_error(path, "truncated llama2.c tokenizer: " + which + " needs " +
                             std::to_string(len) + " bytes at offset " + std::to_string(at) +
                             ", found " + std::to_string(data.size() - at) +
                             " (does the model's vocab_size match this tokenizer?)");
      }
      pieces_.emplace_back(data, at, static_cast<std::size_t>(len));
      scores_.push_back(score);
      at += static_cast<std::size_t>(len);
    }
    if (at != data.size()) {
      file_error(path,
                 "has " + std::to_string(data.size() - at) + " bytes after the " +
                     std::to_string(vocab_size) +
                     " pieces the model's vocab_size calls for (a tokenizer for another model?)");
    }
    // run.c looks pieces up by binary search over a sorted copy; with duplicate pieces it may
    // find any of them. Here the lowest id wins (tokenizers exported by llama2.c have none).
    for (std::int64_t i = vocab_size - 1; i >= 0; --i) {
      lookup_[pieces_[static_cast<std::size_t>(i)]] = static_cast<std::int32_t>(i);
    }
    const auto space = lookup_.find(" ");
    space_id_ = space == lookup_.end() ? -1 : space->second;
  }

  std::vector<std::int32_t> encode(std::string_view text_in, bool add_special) const override {
    const std::string_view text = text_in.substr(0, text_in.find('\0'));
    std::vector<std::int32_t> tokens;
    tokens.reserve(text.size() + 2);
    if (add_special) tokens.push_back(1);
    if (!text.empty()) {
      if (space_id_ < 0) file_error(path_, "has no \" \" piece for the dummy prefix");
      tokens.push_back(space_id_);
    }
    // One token per codepoint, grouped exactly like run.c.
    char buf[5];
    std::size_t len = 0;
    for (std::size_t i = 0; i < text.size(); ++i) {
      const auto c = static_cast<unsigned char>(text[i]);
      if ((c & 0xC0) != 0x80) len = 0;
      buf[len++] = static_cast<char>(c);
      const unsigned char next = i + 1 < text.size() ? static_cast<unsigned char>(text[i + 1]) : 0;
      if ((next & 0xC0) == 0x80 && len < 4) continue;
      const auto it = lookup_.find(std::string(buf, len));
      if (it != lookup_.end()) {
        tokens.push_back(it->second);
      } else {
        for (std::size_t k = 0; k < len; ++k) {
          const std::int32_t id = static_cast<unsigned char>(buf[k]) + 3;
          if (id >= vocab_size_) {
            file_error(path_, "has no byte-fallback piece for byte " + std::to_string(id - 3) +
                                  " (needs id " + std::to_string(id) + ", vocab_size " +
                                  std::to_string(vocab_size_) + ")");
          }
          tokens.push_back(id);
        }
      }
      len = 0;
    }
    merge(tokens);
    return tokens;
  }

  std::string piece(std::int32_t prev, std::int32_t token) const override {
    if (token < 0 || token >= vocab_size_) return {};
    std::string p = pieces_[static_cast<std::size_t>(token)];
    if (prev == 1 && !p.empty() && p[0] == ' ') p.erase(0, 1);
    // "<0xNN>": the raw byte (run.c: sscanf(piece, "<0x%02hhX>", &byte)).
    if (p.size() >= 4 && p.compare(0, 3, "<0x") == 0 && hex(p[3]) >= 0) {
      int v = hex(p[3]);
      if (p.size() >= 5 && hex(p[4]) >= 0) v = v * 16 + hex(p[4]);
      p.assign(1, static_cast<char>(v));
    }
    if (p.size() == 1) {
      const auto b = static_cast<unsigned char>(p[0]);
      const bool printable = b >= 0x20 && b <= 0x7E;
      const bool space = b == ' ' || (b >= '\t' && b <= '\r');
      if (!printable && !space) return {};
    }
    return p;
  }

  std::string decode(const std::vector<std::int32_t>& ids) const override {
    std::string out;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] == 1) continue;  // BOS delimits sequences; run.c never prints it
      out += piece(i == 0 ? -1 : ids[i - 1], ids[i]);
    }
    return out;
  }

  std::string token_text(std::int32_t id) const override {
    return id >= 0 && id < vocab_size_ ? pieces_[static_cast<std::size_t>(id)] : std::string();
  }

 private:
  static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  using PairMemo = std::unordered_map<std::uint64_t, std::int32_t>;

  // The id of the piece pieces[a] + pieces[b], or -1 (memoized per encode call).
  std::int32_t pair_id(std::int32_t a, std::int32_t b, PairMemo& memo) const {
    const std::uint64_t key = (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) |
                              static_cast<std::uint32_t>(b);
    const auto it = memo.find(key);
    if (it != memo.end()) return it->second;
    const auto found =
        lookup_.find(pieces_[static_cast<std::size_t>(a)] + pieces_[static_cast<std::size_t>(b)]);
    const std::int32_t id = found == lookup_.end() ? -1 : found->second;
    memo.emplace(key, id);
    return id;
  }

  void merge(std::vector<std::int32_t>& tokens) const {
    const std::int64_t n = static_cast<std::int64_t>(tokens.size());
    if (n < 2) return;
    std::vector<std::int64_t> prev(static_cast<std::size_t>(n)), next(static_cast<std::size_t>(n));
    std::vector<char> alive(static_cast<std::size_t>(n), 1);
    PairMemo memo;
    for (std::int64_t i = 0; i < n; ++i) {
      prev[static_cast<std::size_t>(i)] = i - 1;
      next[static_cast<std::size_t>(i)] = i + 1 < n ? i + 1 : -1;
    }
    struct Cand {
      float score;
      std::int64_t left, right;
      std::int32_t left_id, right_id, merged;
    };
    // Highest score first; on equal scores the leftmost pair (run.c keeps the first best).
    auto worse = [](const Cand& a, const Cand& b) {
      return a.score != b.score ? a.score < b.score : a.left > b.left;
    };
    std::priority_queue<Cand, std::vector<Cand>, decltype(worse)> heap(worse);
    auto push = [&](std::int64_t l) {
      if (l < 0) return;
      const std::int64_t r = next[static_cast<std::size_t>(l)];
      if (r < 0) return;
      const std::int32_t a = tokens[static_cast<std::size_t>(l)],
                         b = tokens[static_cast<std::size_t>(r)];
      const std::int32_t id = pair_id(a, b, memo);
      if (id < 0) return;
      const float s = scores_[static_cast<std::size_t>(id)];
      if (!(s > -1e10f)) return;  // run.c's best_score starts at -1e10
      heap.push(Cand{s, l, r, a, b, id});
    };
    for (std::int64_t i = 0; i + 1 < n; ++i) push(i);
    while (!heap.empty()) {
      const Cand c = heap.top();
      heap.pop();
      const auto l = static_cast<std::size_t>(c.left), r = static_cast<std::size_t>(c.right);
      if (!alive[l] || !alive[r] || next[l] != c.right || tokens[l] != c.left_id ||
          tokens[r] != c.right_id) {
        continue;  // stale: one side has merged since
      }
      tokens[l] = c.merged;
      alive[r] = 0;
      next[l] = next[r];
      if (next[r] >= 0) prev[static_cast<std::size_t>(next[r])] = c.left;
      push(prev[l]);
      push(c.left);
    }
    std::size_t w = 0;
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      if (alive[i]) tokens[w++] = tokens[i];
    }
    tokens.resize(w);
  }

  std::int32_t max_token_length_ = 0;
  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::unordered_map<std::string, std::int32_t> lookup_;
  std::int32_t space_id_ = -1;
};

}  // namespace

std::unique_ptr<Tokenizer> load_llama2c_tokenizer(const std::string& path,
                                                  std::int64_t vocab_size) {
  return std::make_unique<Llama2cTokenizer>(path, vocab_size);
}

}  // namespace vq::engine
