// A cache state's bytes (LayerCache::save_state, docs/api.md "Saving and restoring a cache"):
// one archive type that either writes or reads, so every object describes its state once, in
// one function, and save and load cannot drift apart. Little-endian, explicit widths, floats
// by their bit patterns; a vector is its element count (u64) then its elements.
//
// Reading trusts nothing: a count is checked against the caller's bound and against the bytes
// left before anything is allocated (so a state can never make the reader allocate more than
// its own size), and every failure throws StateCorrupt with what was expected and found.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace vq::detail {

// A state that is not what its header says it is (truncated, corrupt, inconsistent). The
// cache turns it into Error(kInvalidArgument) for a buffer, Error(kFileError) for a file.
struct StateCorrupt {
  std::string message;
};

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as iSCSI and ext4 use it:
// crc32c("123456789") == 0xE3069283.
std::uint32_t crc32c(const std::uint8_t* data, std::size_t size, std::uint32_t crc = 0) noexcept;

class StateIO {
 public:
  // Writing into *out (appends).
  explicit StateIO(std::vector<std::uint8_t>* out) : out_(out) {}
  // Reading data[0, size).
  StateIO(const std::uint8_t* data, std::size_t size) : in_(data), end_(data + size) {}

  bool loading() const noexcept { return out_ == nullptr; }
  std::size_t remaining() const noexcept { return static_cast<std::size_t>(end_ - in_); }
  [[noreturn]] static void fail(const std::string& message) { throw StateCorrupt{message}; }
  void check(bool ok, const std::string& message) const {
    if (!ok) fail(message);
  }

  // One arithmetic value (bool as one byte, 0 or 1).
  template <class T>
  void value(T& v, const char* what) {
    static_assert(std::is_arithmetic_v<T>);
    if constexpr (std::is_same_v<T, bool>) {
      std::uint8_t b = v ? 1 : 0;
      raw(&b, 1, what);
      if (loading()) {
        check(b <= 1, std::string(what) + ": expected a bool (0 or 1), found " + std::to_string(b));
        v = b != 0;
      }
    } else {
      raw(&v, sizeof(T), what);
    }
  }
  // An integer that must lie in [lo, hi] when read.
  template <class T>
  void bounded(T& v, T lo, T hi, const char* what) {
    value(v, what);
    if (loading() && (v < lo || v > hi)) {
      fail(std::string(what) + ": expected a value in [" + std::to_string(lo) + ", " +
           std::to_string(hi) + "], found " + std::to_string(v));
    }
  }
  // A vector of arithmetic values, at most max_n of them when read.
  template <class T>
  void vec(std::vector<T>& v, std::uint64_t max_n, const char* what) {
    static_assert(std::is_arithmetic_v<T> && !std::is_same_v<T, bool>);
    std::uint64_t n = v.size();
    value(n, what);
    if (loading()) {
      reserve_check(n, sizeof(T), max_n, what);
      v.resize(static_cast<std::size_t>(n));
    }
    if (n > 0) raw(v.data(), static_cast<std::size_t>(n) * sizeof(T), what);
  }
  // The values v[offset, size()) as a vector (saving; a store whose rows start past free slots),
  // read back into v as a whole (loading; offset ignored).
  template <class T>
  void vec_from(std::vector<T>& v, std::size_t offset, std::uint64_t max_n, const char* what) {
    if (loading() || offset == 0) return vec(v, max_n, what);
    std::uint64_t n = v.size() - offset;
    value(n, what);
    if (n > 0) raw(v.data() + offset, static_cast<std::size_t>(n) * sizeof(T), what);
  }
  // A vector that must hold exactly n values when read.
  template <class T>
  void vec_exact(std::vector<T>& v, std::uint64_t n, const char* what) {
    vec(v, n, what);
    if (loading() && v.size() != n) {
      fail(std::string(what) + ": expected " + std::to_string(n) + " values, found " +
           std::to_string(v.size()));
    }
  }
  // A vector of vectors: the outer count (at most max_outer), then each inner vector (at most
  // max_inner values).
  template <class T>
  void vec2(std::vector<std::vector<T>>& v, std::uint64_t max_outer, std::uint64_t max_inner,
            const char* what) {
    std::uint64_t n = v.size();
    value(n, what);
    if (loading()) {
      reserve_check(n, sizeof(std::uint64_t), max_outer, what);
      v.assign(static_cast<std::size_t>(n), {});
    }
    for (auto& inner : v) vec(inner, max_inner, what);
  }
  // A string of at most max_n bytes.
  void text(std::string& s, std::uint64_t max_n, const char* what) {
    std::uint64_t n = s.size();
    value(n, what);
    if (loading()) {
      reserve_check(n, 1, max_n, what);
      s.assign(static_cast<std::size_t>(n), '\0');
    }
    if (n > 0) raw(s.data(), static_cast<std::size_t>(n), what);
  }
  // Positions: each in [0, limit).
  void positions(std::vector<std::int32_t>& pos, std::int64_t limit, const char* what) const {
    if (!loading()) return;
    for (std::int32_t p : pos) {
      if (p < 0 || p >= limit) {
        fail(std::string(what) + ": expected positions in [0, " + std::to_string(limit) +
             "), found " + std::to_string(p));
      }
    }
  }
  // Raw bytes (a fixed-width little-endian value on a little-endian host; checked in state.cpp).
  void raw(void* p, std::size_t n, const char* what) {
    if (!loading()) {
      const auto* b = static_cast<const std::uint8_t*>(p);
      out_->insert(out_->end(), b, b + n);
      return;
    }
    if (remaining() < n) {
      fail(std::string(what) + ": the state ends early (" + std::to_string(n) +
           " bytes needed, " + std::to_string(remaining()) + " left)");
    }
    std::memcpy(p, in_, n);
    in_ += n;
  }

 private:
  // A count read from the state: within its bound and within the bytes left (each element
  // takes at least `elem` bytes), before anything is allocated for it.
  void reserve_check(std::uint64_t n, std::size_t elem, std::uint64_t max_n, const char* what) const {
    if (n > max_n) {
      fail(std::string(what) + ": expected at most " + std::to_string(max_n) +
           " values, found a count of " + std::to_string(n));
    }
    if (n > remaining() / elem) {
      fail(std::string(what) + ": a count of " + std::to_string(n) + " needs " +
           std::to_string(elem) + " bytes each, but only " + std::to_string(remaining()) +
           " bytes are left");
    }
  }

  std::vector<std::uint8_t>* out_ = nullptr;
  const std::uint8_t* in_ = nullptr;
  const std::uint8_t* end_ = nullptr;
};

}  // namespace vq::detail
