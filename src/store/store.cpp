#include "store/store.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "base/kernels.h"
#include "store/growth.h"
#include "store/row_copy.h"
#include "veloxquant/errors.h"

namespace vq::detail {

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
  void expect_rows(std::int64_t n) noexcept override { expected_rows_ = n > 0 ? n : 0; }

  void append(const TensorRef& k, const TensorRef& v, std::int64_t b, std::int64_t h,
              std::int32_t first_pos) override {
    const std::int64_t S = k.tokens();
    // Free slots in front are reclaimed before the vectors would grow for them.
    if (base_ > 0 && base_ + n_ + S > static_cast<std::int64_t>(pos_.capacity())) reclaim_front();
    const std::size_t rows = static_cast<std::size_t>(base_ + n_ + S);
    // The capacity grows in bounded steps at every size (store/growth.h): a full cache of N rows
    // holds fewer than N + max(N / 8, 16) rows of capacity, where std::vector's doubling held up
    // to 2N (issue 23: 585 MiB for 288 MiB of K/V at 8k tokens), and never more than the rows
    // the caller said to expect (expect_rows), so a cache fed exactly that many holds exactly
    // its rows. Appending stays amortised O(1) per row.
    if (rows > pos_.capacity()) {
      const std::size_t cap =
          grown_rows(pos_.capacity(), rows, static_cast<std::size_t>(expected_rows_));
      k_.reserve(cap * static_cast<std::size_t>(d_));
      v_.reserve(cap * static_cast<std::size_t>(d_));
      pos_.reserve(cap);
    }
    k_.resize(rows * static_cast<std::size_t>(d_));
    v_.resize(rows * static_cast<std::size_t>(d_));
    pos_.resize(rows);
    for (std::int64_t s = 0; s < S; ++s) {
      copy_row(k, b, h, s, key_row(n_ + s));
      copy_row(v, b, h, s, value_row(n_ + s));
      pos_[static_cast<std::size_t>(base_ + n_ + s)] = first_pos + static_cast<std::int32_t>(s);
    }
    n_ += S;
  }

  HeadRows rows() const noexcept override {
    return HeadRows{k_.data() + base_ * d_, v_.data() + base_ * d_, pos_.data() + base_, kDtype,
                    n_, d_};
  }
  void read_key(std::int64_t i, float* out) const noexcept override {
    kernels::load_row(key_row(i), kDtype, out, d_);
  }
  void read_value(std::int64_t i, float* out) const noexcept override {
    kernels::load_row(value_row(i), kDtype, out, d_);
  }
  void write_key(std::int64_t i, const float* in) noexcept override {
    kernels::store_row(in, kDtype, key_row(i), d_);
  }
  void write_value(std::int64_t i, const float* in) noexcept override {
    kernels::store_row(in, kDtype, value_row(i), d_);
  }
  void set_position(std::int64_t i, std::int32_t pos) noexcept override {
    pos_[static_cast<std::size_t>(base_ + i)] = pos;
  }

  // The kept rows stay in order and contiguous. A row leaving the middle makes the rows on one
  // side of it move: those after it down (towards the front), or those before it up (towards
  // the end, the first row's slot advancing by the rows dropped), whichever side moves fewer
  // rows. An eviction just after a few sink rows (StreamingLLM) then moves the sinks, not the
  // window. The free slots in front are reclaimed (every row moved to slot 0) once there are
  // more than front_slack() of them, about 3% of the rows: held, unused, and counted in
  // allocated_bytes (after a large cut the capacity is exactly the rows, one step's row and
  // that slack).
  void keep(const std::int64_t* idx, std::int64_t n) override {
    // n strictly increasing indices below n_ == n: the identity, nothing moves.
    if (n == n_) return;
    for (std::int64_t j = 0; j < n; ++j) {
      VQ_ASSERT(idx[j] >= j && idx[j] < n_ && (j == 0 || idx[j] > idx[j - 1]),
                "keep() needs strictly increasing row indices within the store");
    }
    std::int64_t prefix = 0, suffix = 0;  // rows that stay where they are, at each end
    while (prefix < n && idx[prefix] == prefix) ++prefix;
    while (suffix < n && idx[n - 1 - suffix] == n_ - 1 - suffix) ++suffix;
    if (n - suffix < n - prefix) {
      // Towards the end: row j goes to slot n_ - n + j, from the last row to the first.
      const std::int64_t shift = n_ - n;
      for (std::int64_t j = n - 1 - suffix; j >= 0;) {
        std::int64_t e = j;  // rows e .. j are consecutive in the source too
        while (e > 0 && idx[e - 1] == idx[j] - (j - e + 1)) --e;
        move_rows(base_ + shift + e, base_ + idx[e], j - e + 1);
        j = e - 1;
      }
      base_ += shift;
    } else {
      for (std::int64_t j = prefix; j < n;) {
        std::int64_t e = j + 1;  // rows j .. e - 1 are consecutive in the source too
        while (e < n && idx[e] == idx[j] + (e - j)) ++e;
        move_rows(base_ + j, base_ + idx[j], e - j);
        j = e;
      }
    }
    n_ = n;
    if (base_ > front_slack(n_)) {
      reclaim_front();
    } else {
      const std::size_t rows = static_cast<std::size_t>(base_ + n_);
      k_.resize(rows * static_cast<std::size_t>(d_));
      v_.resize(rows * static_cast<std::size_t>(d_));
      pos_.resize(rows);
    }
    // A large cut (a prefill cut to the budget) gives the memory back: a cache holds what it
    // keeps, not the capacity of its largest step. Small cuts (decode steps) keep the capacity,
    // so the steady state reallocates nothing.
    if (pos_.capacity() > 2 * pos_.size() + 64) {
      if (base_ > 0) reclaim_front();
      // Room for the kept rows, one decode step's row and the front slack, exactly (not the
      // vector's doubling).
      const std::int64_t cap = n_ + 1 + front_slack(n_);
      std::vector<T>(k_.begin(), k_.end()).swap(k_);
      std::vector<T>(v_.begin(), v_.end()).swap(v_);
      std::vector<std::int32_t>(pos_.begin(), pos_.end()).swap(pos_);
      k_.reserve(static_cast<std::size_t>(cap * d_));
      v_.reserve(static_cast<std::size_t>(cap * d_));
      pos_.reserve(static_cast<std::size_t>(cap));
    }
  }

  void clear() noexcept override {
    n_ = 0;
    base_ = 0;
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
    copy_step_row(t, b, h, s, d_, out);
  }

  // The most free slots kept in front of the rows: a 32nd of them, so reclaiming them (moving
  // every row) costs about 32 row moves per row dropped from the front.
  static std::int64_t front_slack(std::int64_t n) noexcept { return n / 32; }

  void reclaim_front() noexcept {
    move_rows(0, base_, n_);
    base_ = 0;
    k_.resize(static_cast<std::size_t>(n_ * d_));
    v_.resize(static_cast<std::size_t>(n_ * d_));
    pos_.resize(static_cast<std::size_t>(n_));
  }

  T* key_row(std::int64_t i) noexcept { return k_.data() + (base_ + i) * d_; }
  T* value_row(std::int64_t i) noexcept { return v_.data() + (base_ + i) * d_; }
  const T* key_row(std::int64_t i) const noexcept { return k_.data() + (base_ + i) * d_; }
  const T* value_row(std::int64_t i) const noexcept { return v_.data() + (base_ + i) * d_; }

  // Slots [from, from + count) to [to, to + count) (overlap allowed), keys, values, positions.
  void move_rows(std::int64_t to, std::int64_t from, std::int64_t count) noexcept {
    if (to == from || count == 0) return;
    const std::size_t bytes = static_cast<std::size_t>(count * d_) * sizeof(T);
    std::memmove(k_.data() + to * d_, k_.data() + from * d_, bytes);
    std::memmove(v_.data() + to * d_, v_.data() + from * d_, bytes);
    std::memmove(pos_.data() + to, pos_.data() + from,
                 static_cast<std::size_t>(count) * sizeof(std::int32_t));
  }

  void state(StateIO& io, std::int64_t max_pos) override {
    // Rows are slots [base_, base_ + n_): saved from there, read back to slot 0.
    const auto off = static_cast<std::size_t>(base_);
    const auto d = static_cast<std::size_t>(d_);
    io.vec_from(pos_, off, static_cast<std::uint64_t>(max_pos), "store positions");
    io.positions(pos_, max_pos, "store positions");
    if (io.loading()) {
      base_ = 0;
      n_ = static_cast<std::int64_t>(pos_.size());
      io.vec_exact(k_, pos_.size() * d, "store keys");
      io.vec_exact(v_, pos_.size() * d, "store values");
    } else {
      io.vec_from(k_, off * d, 0, "store keys");
      io.vec_from(v_, off * d, 0, "store values");
    }
  }

  std::int64_t d_;
  std::int64_t n_ = 0;
  std::int64_t expected_rows_ = 0;  // expect_rows(): a ceiling on growth steps (0: none)
  std::int64_t base_ = 0;          // the first row's slot: rows are slots [base_, base_ + n_)
  std::vector<T> k_, v_;           // [base_ + n_][d_] (slots before base_: free)
  std::vector<std::int32_t> pos_;  // [base_ + n_]
};

}  // namespace

std::unique_ptr<RowStore> make_plain_store(DType storage, std::int64_t head_dim) {
  if (storage == DType::kF32) return std::make_unique<PlainStore<float>>(head_dim);
  return std::make_unique<PlainStore<std::uint16_t>>(head_dim);
}

}  // namespace vq::detail
