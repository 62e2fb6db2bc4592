// Rows whose keys may keep only some of their channels (ThinK's key-channel pruning, think=;
// the decision is policies/think.cpp's, this store only holds the result).
//
// Layout, per (batch, kv head), rows in order:
//   the first n_pruned rows: keys of the kept channels only, [n_pruned][n_kept] of the storage
//     dtype (kv_dtype f16 or f32), the channel set chan_ [n_kept] (strictly increasing channel
//     indices, one set for the head);
//   the other rows: whole keys, [n - n_pruned][D];
//   values, whole: [n][D]; positions: [n].
// Pruned rows always form a prefix: pruning takes the rows held at the time (prune_keys), and
// every later row is appended after them; keep() never reorders rows.
//
// Rows are read through PackedRows (keys and values are not one uniform array): a pruned key
// reads as the key with its pruned channels zero, and attend_scores computes q . k over the kept
// channels only, which equals q . (k with the pruned channels zeroed). kept_bytes counts what is
// held: n_pruned x n_kept + (n - n_pruned) x D key elements, n x D value elements, and the
// channel set (2 bytes a channel, as an index < 65536 = kMaxHeadDim).
#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "base/kernels.h"
#include "store/growth.h"
#include "store/row_copy.h"
#include "store/store.h"
#include "veloxquant/errors.h"

namespace vq::detail {

namespace {

template <typename T>
class PrunedKeyStore final : public RowStore, public PackedRows {
  static constexpr DType kDtype = std::is_same_v<T, float> ? DType::kF32 : DType::kF16;
  // Kept channels up to which attend_scores gathers a query on the stack.
  static constexpr std::int64_t kGather = 1024;

 public:
  explicit PrunedKeyStore(std::int64_t d) : d_(d) {}

  std::int64_t size() const noexcept override { return n_; }
  void expect_rows(std::int64_t n) noexcept override { expected_rows_ = n > 0 ? n : 0; }

  void append(const TensorRef& k, const TensorRef& v, std::int64_t b, std::int64_t h,
              std::int32_t first_pos) override {
    const std::int64_t S = k.tokens();
    const std::size_t rows = static_cast<std::size_t>(n_ + S);
    // Bounded growth steps, capped by expect_rows (store/growth.h), as the plain rows.
    if (rows > pos_.capacity()) {
      reserve_rows(grown_rows(pos_.capacity(), rows, static_cast<std::size_t>(expected_rows_)));
    }
    const std::int64_t whole = n_ - n_pruned_;
    fk_.resize(static_cast<std::size_t>((whole + S) * d_));
    v_.resize(rows * static_cast<std::size_t>(d_));
    pos_.resize(rows);
    for (std::int64_t s = 0; s < S; ++s) {
      copy_row(k, b, h, s, fk_.data() + (whole + s) * d_);
      copy_row(v, b, h, s, v_.data() + (n_ + s) * d_);
      pos_[static_cast<std::size_t>(n_ + s)] = first_pos + static_cast<std::int32_t>(s);
    }
    n_ += S;
  }

  HeadRows rows() const noexcept override {
    return packed_rows(static_cast<const PackedRows*>(this), pos_.data(), n_, d_);
  }

  void read_key(std::int64_t i, float* out) const noexcept override { load_key(i, out); }
  void read_value(std::int64_t i, float* out) const noexcept override { load_value(i, out); }
  void write_key(std::int64_t i, const float* in) noexcept override {
    if (i >= n_pruned_) {
      kernels::store_row(in, kDtype, fk_.data() + (i - n_pruned_) * d_, d_);
      return;
    }
    // A pruned row keeps only its kept channels (a merged key is pruned like any other).
    T* row = pk_.data() + i * n_kept();
    for (std::int64_t c = 0; c < n_kept(); ++c) {
      const float x = in[chan_[static_cast<std::size_t>(c)]];
      kernels::store_row(&x, kDtype, row + c, 1);
    }
  }
  void write_value(std::int64_t i, const float* in) noexcept override {
    kernels::store_row(in, kDtype, v_.data() + i * d_, d_);
  }
  void set_position(std::int64_t i, std::int32_t pos) noexcept override {
    pos_[static_cast<std::size_t>(i)] = pos;
  }

  // Rows idx[0..n) stay, in order; every array is compacted towards the front (idx is strictly
  // increasing, so each row moves down or stays).
  void keep(const std::int64_t* idx, std::int64_t n) override {
    if (n == n_) return;
    for (std::int64_t j = 0; j < n; ++j) {
      VQ_ASSERT(idx[j] >= j && idx[j] < n_ && (j == 0 || idx[j] > idx[j - 1]),
                "keep() needs strictly increasing row indices within the store");
    }
    const std::int64_t kd = n_kept();
    std::int64_t kept_pruned = 0;
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int64_t r = idx[j];
      if (r != j) {
        std::memmove(v_.data() + j * d_, v_.data() + r * d_, static_cast<std::size_t>(d_) * sizeof(T));
        pos_[static_cast<std::size_t>(j)] = pos_[static_cast<std::size_t>(r)];
      }
      if (r < n_pruned_) {
        // Pruned rows come first in idx too (they are the lowest indices).
        if (r != kept_pruned) {
          std::memmove(pk_.data() + kept_pruned * kd, pk_.data() + r * kd,
                       static_cast<std::size_t>(kd) * sizeof(T));
        }
        ++kept_pruned;
      } else {
        const std::int64_t from = r - n_pruned_, to = j - kept_pruned;
        if (from != to) {
          std::memmove(fk_.data() + to * d_, fk_.data() + from * d_,
                       static_cast<std::size_t>(d_) * sizeof(T));
        }
      }
    }
    n_pruned_ = kept_pruned;
    n_ = n;
    pk_.resize(static_cast<std::size_t>(n_pruned_ * kd));
    fk_.resize(static_cast<std::size_t>((n_ - n_pruned_) * d_));
    v_.resize(static_cast<std::size_t>(n_ * d_));
    pos_.resize(static_cast<std::size_t>(n_));
    // A large cut (a prefill cut to the budget) gives the memory back; decode steps keep it.
    if (pos_.capacity() > 2 * pos_.size() + 64) {
      std::vector<T>(pk_.begin(), pk_.end()).swap(pk_);
      std::vector<T>(fk_.begin(), fk_.end()).swap(fk_);
      std::vector<T>(v_.begin(), v_.end()).swap(v_);
      std::vector<std::int32_t>(pos_.begin(), pos_.end()).swap(pos_);
      reserve_rows(static_cast<std::size_t>(n_ + 1));
    }
  }

  bool prunes_keys() const noexcept override { return true; }

  void prune_keys(const std::int32_t* channels, std::int64_t n_channels,
                  std::int64_t n_rows) override {
    VQ_ASSERT(n_channels >= 1 && n_channels <= d_, "prune_keys needs 1 to head_dim channels");
    VQ_ASSERT(n_rows >= n_pruned_ && n_rows <= n_, "prune_keys needs n_pruned <= n_rows <= rows");
    if (chan_.empty()) {
      for (std::int64_t c = 0; c < n_channels; ++c) {
        VQ_ASSERT(channels[c] >= 0 && channels[c] < d_ && (c == 0 || channels[c] > channels[c - 1]),
                  "prune_keys needs strictly increasing channels below head_dim");
      }
      chan_.resize(static_cast<std::size_t>(n_channels));
      for (std::int64_t c = 0; c < n_channels; ++c) {
        chan_[static_cast<std::size_t>(c)] = static_cast<std::uint16_t>(channels[c]);
      }
    } else {
      VQ_ASSERT(static_cast<std::int64_t>(chan_.size()) == n_channels &&
                    std::equal(chan_.begin(), chan_.end(), channels,
                               [](std::uint16_t a, std::int32_t b) { return a == b; }),
                "prune_keys: a head's channel set is fixed once chosen");
    }
    const std::int64_t kd = n_kept(), add = n_rows - n_pruned_;
    if (add == 0) return;
    pk_.resize(static_cast<std::size_t>(n_rows * kd));
    for (std::int64_t r = 0; r < add; ++r) {
      const T* src = fk_.data() + r * d_;
      T* dst = pk_.data() + (n_pruned_ + r) * kd;
      for (std::int64_t c = 0; c < kd; ++c) dst[c] = src[chan_[static_cast<std::size_t>(c)]];
    }
    fk_.erase(fk_.begin(), fk_.begin() + add * d_);
    n_pruned_ = n_rows;
    // The whole keys given up are given back (the point of pruning is the memory).
    if (fk_.capacity() > 2 * fk_.size() + 64 * static_cast<std::size_t>(d_)) {
      std::vector<T>(fk_.begin(), fk_.end()).swap(fk_);
      fk_.reserve(fk_.size() + static_cast<std::size_t>(d_));
    }
  }
  std::int64_t n_pruned_rows() const noexcept override { return n_pruned_; }
  std::vector<std::int32_t> kept_channels() const override {
    return std::vector<std::int32_t>(chan_.begin(), chan_.end());
  }

  void clear() noexcept override {
    n_ = n_pruned_ = 0;
    pk_.clear();
    fk_.clear();
    v_.clear();
    pos_.clear();
    chan_.clear();
  }

  std::int64_t bytes() const noexcept override {
    const auto s = static_cast<std::int64_t>(sizeof(T));
    return (n_pruned_ * n_kept() + (n_ - n_pruned_) * d_ + n_ * d_) * s + channel_set_bytes();
  }
  std::int64_t allocated_bytes() const noexcept override {
    return static_cast<std::int64_t>((pk_.capacity() + fk_.capacity() + v_.capacity()) *
                                         sizeof(T) +
                                     chan_.capacity() * sizeof(std::uint16_t));
  }
  std::int64_t resident_bytes() const noexcept override {
    return allocated_bytes() + static_cast<std::int64_t>(pos_.capacity() * sizeof(std::int32_t));
  }

  // PackedRows.
  void load_key(std::int64_t row, float* out) const noexcept override {
    if (row >= n_pruned_) {
      kernels::load_row(fk_.data() + (row - n_pruned_) * d_, kDtype, out, d_);
      return;
    }
    std::fill(out, out + d_, 0.0f);
    const T* k = pk_.data() + row * n_kept();
    for (std::int64_t c = 0; c < n_kept(); ++c) out[chan_[static_cast<std::size_t>(c)]] = elem(k[c]);
  }
  void load_value(std::int64_t row, float* out) const noexcept override {
    kernels::load_row(v_.data() + row * d_, kDtype, out, d_);
  }
  float key_at(std::int64_t row, std::int64_t d) const noexcept override {
    if (row >= n_pruned_) return elem(fk_[static_cast<std::size_t>((row - n_pruned_) * d_ + d)]);
    const auto it = std::lower_bound(chan_.begin(), chan_.end(), d,
                                     [](std::uint16_t a, std::int64_t b) { return a < b; });
    if (it == chan_.end() || *it != d) return 0.0f;
    return elem(pk_[static_cast<std::size_t>(row * n_kept() + (it - chan_.begin()))]);
  }
  float value_at(std::int64_t row, std::int64_t d) const noexcept override {
    return elem(v_[static_cast<std::size_t>(row * d_ + d)]);
  }

  // scores[j * ld + r] = q_j . key_r: over the kept channels of a pruned row (the query's kept
  // channels gathered, then kernels::dot's order over them; a scalar sum in channel order when
  // more than kGather channels are kept), over all D channels of a whole row (kernels::dot's
  // order); -inf where row r's position is > pos.
  void attend_scores(const float* q, std::int64_t n_q, std::int64_t pos, float* scores,
                     std::int64_t ld) const noexcept override {
    const float neg_inf = -std::numeric_limits<float>::infinity();
    const std::int64_t kd = n_kept();
    float gathered[kGather];  // the query's kept channels (no allocation inside the forward)
    for (std::int64_t j = 0; j < n_q; ++j) {
      const float* qj = q + j * d_;
      float* s = scores + j * ld;
      if (n_pruned_ > 0 && kd <= kGather) {
        for (std::int64_t c = 0; c < kd; ++c) gathered[c] = qj[chan_[static_cast<std::size_t>(c)]];
        kernels::dot_rows(pk_.data(), kDtype, kd, gathered, kd, n_pruned_, s);
      } else {
        for (std::int64_t r = 0; r < n_pruned_; ++r) {
          const T* k = pk_.data() + r * kd;
          float acc = 0.0f;
          for (std::int64_t c = 0; c < kd; ++c) acc += qj[chan_[static_cast<std::size_t>(c)]] * elem(k[c]);
          s[r] = acc;
        }
      }
      kernels::dot_rows(fk_.data(), kDtype, d_, qj, d_, n_ - n_pruned_, s + n_pruned_);
      for (std::int64_t r = 0; r < n_; ++r) {
        if (pos_[static_cast<std::size_t>(r)] > pos) s[r] = neg_inf;
      }
    }
  }

  // out[j * D + d] = sum over rows r (increasing) with position <= pos of
  // probs[j * ld + r] * value_r[d]. scratch: the first D floats hold a converted row.
  void attend_values(const float* probs, std::int64_t n_q, std::int64_t ld, std::int64_t pos,
                     float* out, float* scratch) const noexcept override {
    std::fill(out, out + n_q * d_, 0.0f);
    for (std::int64_t r = 0; r < n_; ++r) {
      if (pos_[static_cast<std::size_t>(r)] > pos) continue;
      kernels::load_row(v_.data() + r * d_, kDtype, scratch, d_);
      for (std::int64_t j = 0; j < n_q; ++j) {
        const float p = probs[j * ld + r];
        float* o = out + j * d_;
        for (std::int64_t c = 0; c < d_; ++c) o[c] += p * scratch[c];
      }
    }
  }

 private:
  std::int64_t n_kept() const noexcept { return static_cast<std::int64_t>(chan_.size()); }
  std::int64_t channel_set_bytes() const noexcept {
    return static_cast<std::int64_t>(chan_.size()) * 2;
  }
  static float elem(T x) noexcept {
    if constexpr (std::is_same_v<T, float>) {
      return x;
    } else {
      return half_to_float(x);
    }
  }

  void reserve_rows(std::size_t rows) {
    const auto d = static_cast<std::size_t>(d_);
    v_.reserve(rows * d);
    pos_.reserve(rows);
    fk_.reserve((rows - static_cast<std::size_t>(n_pruned_)) * d);
  }

  void copy_row(const TensorRef& t, std::int64_t b, std::int64_t h, std::int64_t s, T* out) {
    copy_step_row(t, b, h, s, d_, out);
  }

  void state(StateIO& io, std::int64_t max_pos) override {
    io.vec(pos_, static_cast<std::uint64_t>(max_pos), "think positions");
    io.positions(pos_, max_pos, "think positions");
    n_ = static_cast<std::int64_t>(pos_.size());
    io.bounded<std::int64_t>(n_pruned_, 0, n_, "think pruned rows");
    io.vec(chan_, static_cast<std::uint64_t>(d_), "think channels");
    for (std::size_t c = 0; c < chan_.size(); ++c) {
      io.check(chan_[c] < d_ && (c == 0 || chan_[c] > chan_[c - 1]),
               "think channels: expected increasing channels below " + std::to_string(d_) +
                   ", found " + std::to_string(chan_[c]));
    }
    io.check(n_pruned_ == 0 || !chan_.empty(), "think: pruned rows without kept channels");
    const auto d = static_cast<std::uint64_t>(d_);
    io.vec_exact(pk_, static_cast<std::uint64_t>(n_pruned_) * chan_.size(), "think pruned keys");
    io.vec_exact(fk_, static_cast<std::uint64_t>(n_ - n_pruned_) * d, "think keys");
    io.vec_exact(v_, static_cast<std::uint64_t>(n_) * d, "think values");
  }

  std::int64_t d_;
  std::int64_t n_ = 0;         // rows held
  std::int64_t n_pruned_ = 0;  // the first n_pruned_ rows hold pruned keys
  std::int64_t expected_rows_ = 0;
  std::vector<std::uint16_t> chan_;  // [n_kept] kept channels, increasing (empty: none pruned)
  std::vector<T> pk_;               // [n_pruned][n_kept]
  std::vector<T> fk_;               // [n - n_pruned][D]
  std::vector<T> v_;                // [n][D]
  std::vector<std::int32_t> pos_;   // [n]
};

}  // namespace

std::unique_ptr<RowStore> make_pruned_key_store(DType storage, std::int64_t head_dim) {
  if (storage == DType::kF32) return std::make_unique<PrunedKeyStore<float>>(head_dim);
  return std::make_unique<PrunedKeyStore<std::uint16_t>>(head_dim);
}

}  // namespace vq::detail
