// Shared pieces of the libFuzzer targets (README "Robustness"): a target feeds the input to one
// reader; vq::Error is the expected answer to bad input, anything else is a bug.
#pragma once

#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "veloxquant/errors.h"

namespace vq::fuzz {

// Runs `f`; a vq::Error is fine (a clear rejection), any other exception aborts so libFuzzer
// records the input as a crash.
template <typename F>
void expect_clean(F&& f) {
  try {
    f();
  } catch (const vq::Error&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz: exception other than vq::Error: %s\n", e.what());
    std::abort();
  } catch (...) {
    std::fprintf(stderr, "fuzz: unknown exception\n");
    std::abort();
  }
}

// A per-process scratch directory (removed at exit) for readers that take paths.
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    // In memory when /dev/shm is there: a disk-backed /tmp costs most of the run time.
    char shm[] = "/dev/shm/vq-fuzz-XXXXXX";
    char tmp[] = "/tmp/vq-fuzz-XXXXXX";
    const char* d = ::mkdtemp(shm);
    if (d == nullptr) d = ::mkdtemp(tmp);
    if (d == nullptr) std::abort();
    return std::string(d);
  }();
  static const struct Cleanup {
    ~Cleanup() { std::system(("rm -rf '" + dir + "'").c_str()); }
  } cleanup;
  (void)cleanup;
  return dir;
}

// Writes bytes to `name` in the scratch directory and returns its path.
inline std::string write_file(const std::string& name, const std::uint8_t* data, std::size_t size) {
  const std::string path = scratch_dir() + "/" + name;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return path;
}

inline std::string write_file(const std::string& name, const std::string& text) {
  return write_file(name, reinterpret_cast<const std::uint8_t*>(text.data()), text.size());
}

// The input read as a stream of decisions: bytes (0 past the end) and float values that are
// mostly ordinary ((b - 128) / scale) and sometimes NaN, +-inf or 3e38.
struct ByteReader {
  const std::uint8_t* p;
  std::size_t n, at = 0;
  bool more() const { return at < n; }
  std::uint8_t byte() { return at < n ? p[at++] : 0; }
  float value(float scale) {
    const std::uint8_t b = byte();
    switch (b & 15) {
      case 0: return std::nanf("");
      case 1: return INFINITY;
      case 2: return -INFINITY;
      case 3: return 3e38f;
      default: return (static_cast<float>(b) - 128.0f) / scale;
    }
  }
};

}  // namespace vq::fuzz
