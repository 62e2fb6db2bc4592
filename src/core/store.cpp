#include "core/store.h"

#include <cstring>
#include <type_traits>
#include <vector>

#include "core/kernels.h"
#include "veloxquant/errors.h"

namespace vq::detail {

void RowsRef::load_key(std::int64_t i, float* out) const noexcept {
  if (packed != nullptr) {
    packed->load_key(i, out);
  } else {
    kernels::load_row(key(i), dtype, out, stride);
  }
}

void RowStore::settle_keep_all() {
  std::vector<std::int64_t> live(static_cast<std::size_t>(size()));
  for (std::size_t i = 0; i < live.size(); ++i) live[i] = static_cast<std::int64_t>(i);
  settle(live.data(), size());
  keep(live.data(), size());
}

namespace {

template <typename T>
class PlainStore final : public RowStore {
  static constexpr DType kDtype = std::is_same_v<T, float> ? DType::kF32 : DType::kF16;

 public:
  explicit PlainStore(std::int64_t d) : d_(d) {}

  std::int64_t size() const noexcept override { return n_; }

  void append(const TensorRef& k, const TensorRef& v, std::int64_t b, std::int64_t h,
              std::int32_t first_pos) override {
    const std::int64_t S = k.tokens();
    const std::size_t rows = static_cast<std::size_t>(n_ + S);
    k_.resize(rows * static_cast<std::size_t>(d_));
    v_.resize(rows * static_cast<std::size_t>(d_));
    pos_.resize(rows);
    for (std::int64_t s = 0; s < S; ++s) {
      copy_row(k, b, h, s, k_.data() + (n_ + s) * d_);
      copy_row(v, b, h, s, v_.data() + (n_ + s) * d_);
      pos_[static_cast<std::size_t>(n_ + s)] = first_pos + static_cast<std::int32_t>(s);
    }
    n_ += S;
  }

  RowsRef rows() const noexcept override {
    return RowsRef{k_.data(), v_.data(), pos_.data(), kDtype, n_, d_};
  }
  void read_key(std::int64_t i, float* out) const noexcept override {
    kernels::load_row(k_.data() + i * d_, kDtype, out, d_);
  }
  void read_value(std::int64_t i, float* out) const noexcept override {
    kernels::load_row(v_.data() + i * d_, kDtype, out, d_);
  }
  void write_key(std::int64_t i, const float* in) noexcept override {
    kernels::store_row(in, kDtype, k_.data() + i * d_, d_);
  }
  void write_value(std::int64_t i, const float* in) noexcept override {
    kernels::store_row(in, kDtype, v_.data() + i * d_, d_);
  }
  void set_position(std::int64_t i, std::int32_t pos) noexcept override {
    pos_[static_cast<std::size_t>(i)] = pos;
  }

  void keep(const std::int64_t* idx, std::int64_t n) override {
    // n strictly increasing indices below n_ == n: the identity, nothing moves.
    if (n == n_) return;
    const std::size_t row_bytes = static_cast<std::size_t>(d_) * sizeof(T);
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int64_t src = idx[j];
      VQ_ASSERT(src >= j && src < n_ && (j == 0 || src > idx[j - 1]),
                "keep() needs strictly increasing row indices within the store");
      if (src == j) continue;
      std::memcpy(k_.data() + j * d_, k_.data() + src * d_, row_bytes);
      std::memcpy(v_.data() + j * d_, v_.data() + src * d_, row_bytes);
      pos_[static_cast<std::size_t>(j)] = pos_[static_cast<std::size_t>(src)];
    }
    n_ = n;
    k_.resize(static_cast<std::size_t>(n_ * d_));
    v_.resize(static_cast<std::size_t>(n_ * d_));
    pos_.resize(static_cast<std::size_t>(n_));
    // A large cut (a prefill cut to the budget) gives the memory back: a cache holds what it
    // keeps, not the capacity of its largest step. Small cuts (decode steps) keep the capacity,
    // so the steady state reallocates nothing.
    if (pos_.capacity() > 2 * pos_.size() + 64) {
      // Room for the kept rows and one decode step's row, exactly (not the vector's doubling).
      std::vector<T>(k_.begin(), k_.end()).swap(k_);
      std::vector<T>(v_.begin(), v_.end()).swap(v_);
      std::vector<std::int32_t>(pos_.begin(), pos_.end()).swap(pos_);
      k_.reserve(static_cast<std::size_t>((n_ + 1) * d_));
      v_.reserve(static_cast<std::size_t>((n_ + 1) * d_));
      pos_.reserve(static_cast<std::size_t>(n_ + 1));
    }
  }

  void clear() noexcept override {
    n_ = 0;
    k_.clear();
    v_.clear();
    pos_.clear();
  }

  std::int64_t bytes() const noexcept override {
    return n_ * d_ * 2 * static_cast<std::int64_t>(sizeof(T));
  }
  std::int64_t allocated_bytes() const noexcept override {
    return static_cast<std::int64_t>((k_.capacity() + v_.capacity()) * sizeof(T));
  }
  std::int64_t resident_bytes() const noexcept override {
    return allocated_bytes() + static_cast<std::int64_t>(pos_.capacity() * sizeof(std::int32_t));
  }

 private:
  void copy_row(const TensorRef& t, std::int64_t b, std::int64_t h, std::int64_t s, T* out) {
    const std::int64_t off = b * t.stride[0] + h * t.stride[1] + s * t.stride[2];
    if (t.dtype == DType::kF32) {
      const float* src = static_cast<const float*>(t.data) + off;
      if constexpr (std::is_same_v<T, float>) {
        std::memcpy(out, src, static_cast<std::size_t>(d_) * sizeof(float));
      } else {
        kernels::f32_to_f16(src, out, d_);
      }
    } else {
      const std::uint16_t* src = static_cast<const std::uint16_t*>(t.data) + off;
      if constexpr (std::is_same_v<T, float>) {
        kernels::f16_to_f32(src, out, d_);
      } else {
        std::memcpy(out, src, static_cast<std::size_t>(d_) * sizeof(std::uint16_t));
      }
    }
  }

  std::int64_t d_;
  std::int64_t n_ = 0;
  std::vector<T> k_, v_;           // [n_][d_]
  std::vector<std::int32_t> pos_;  // [n_]
};

}  // namespace

std::unique_ptr<RowStore> make_plain_store(DType storage, std::int64_t head_dim) {
  if (storage == DType::kF32) return std::make_unique<PlainStore<float>>(head_dim);
  return std::make_unique<PlainStore<std::uint16_t>>(head_dim);
}

}  // namespace vq::detail
