// KIVI storage: asymmetric low-bit quantization, really packed.
//
// Paper: Liu et al., "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache",
// ICML 2024.
//
// Layout per (batch, kv head). Rows are, in order, quantized rows followed by the fp16 tail.
//  - Keys are quantized per channel in groups of G consecutive tokens: each key group has a
//    scale and zero per channel (fp32). Values are quantized per token in groups of G
//    consecutive channels (the last group may be shorter): each row has a scale and zero per
//    value group (fp32).
//  - Codes are `bits` wide (2: four per byte; 4: two per byte), packed row by row:
//    ceil(D * bits / 8) bytes per row for keys and again for values.
//  - zero = min, scale = max((max - min) / (2^bits - 1), 1e-8),
//    q = clamp(floor((x - zero) / scale + 0.5), 0, 2^bits - 1), x' = q * scale + zero.
//  - The newest rows stay unquantized (the tail, in kv_dtype). Whenever the live tail holds
//    residual_length + G rows or more, its oldest G rows are quantized as one key group.
//  - bytes() = codes + scales + zeros + tail, counted from the containers that hold them.
// Evicting a quantized row removes its codes (its key group keeps its scale/zero, now over
// fewer rows); consecutive key groups whose remaining rows fit in one group are then
// re-quantized together from their dequantized keys (so evictions do not leave many sparse
// groups, each paying D scales and zeros). Merging into a quantized row re-quantizes its value
// groups and, for keys, its whole key group from the dequantized values.
// For attention and scoring the store keeps the dequantized rows in an fp32 workspace, reported
// by workspace_bytes() (an engine with a kernel that reads codes would not need it).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/kernels.h"
#include "core/store.h"
#include "veloxquant/errors.h"

namespace vq::detail {
namespace {

class KiviStore final : public RowStore {
 public:
  KiviStore(int bits, std::int64_t group, std::int64_t residual, DType tail, std::int64_t d)
      : bits_(bits), levels_((1 << bits) - 1), G_(group), R_(residual), D_(d), tail_dtype_(tail),
        tail_size_(static_cast<std::int64_t>(dtype_size(tail))),
        row_bytes_((d * bits + 7) / 8), n_vgroups_((d + group - 1) / group) {
    VQ_ASSERT(bits == 2 || bits == 4, "kivi bits must be 2 or 4");
  }

  std::int64_t size() const noexcept override { return static_cast<std::int64_t>(pos_.size()); }
  bool quantizing() const noexcept override { return true; }

  void append(const TensorRef& k, const TensorRef& v, std::int64_t b, std::int64_t h,
              std::int32_t first_pos) override {
    const std::int64_t S = k.tokens();
    std::vector<float> row(static_cast<std::size_t>(D_));
    for (std::int64_t s = 0; s < S; ++s) {
      const std::int64_t tail_slot = n_tail_slots();
      tk_.resize(static_cast<std::size_t>((tail_slot + 1) * D_ * tail_size_));
      tv_.resize(tk_.size());
      const std::int64_t phys = size();
      slot_.push_back(-tail_slot - 1);
      pos_.push_back(first_pos + static_cast<std::int32_t>(s));
      wk_.resize(static_cast<std::size_t>((phys + 1) * D_));
      wv_.resize(wk_.size());
      read_input(k, b, h, s, row.data());
      set_tail(tk_, tail_slot, row.data(), wk_.data() + phys * D_);
      read_input(v, b, h, s, row.data());
      set_tail(tv_, tail_slot, row.data(), wv_.data() + phys * D_);
    }
  }

  RowsRef rows() const noexcept override {
    return RowsRef{wk_.data(), wv_.data(), pos_.data(), DType::kF32, size(), D_};
  }
  void read_key(std::int64_t i, float* out) const noexcept override {
    std::memcpy(out, wk_.data() + i * D_, static_cast<std::size_t>(D_) * sizeof(float));
  }
  void read_value(std::int64_t i, float* out) const noexcept override {
    std::memcpy(out, wv_.data() + i * D_, static_cast<std::size_t>(D_) * sizeof(float));
  }

  void write_value(std::int64_t i, const float* in) noexcept override {
    const std::int64_t slot = slot_[static_cast<std::size_t>(i)];
    if (slot < 0) {
      set_tail(tv_, -slot - 1, in, wv_.data() + i * D_);
    } else {
      quantize_value_row(slot, in, wv_.data() + i * D_);
    }
  }

  void write_key(std::int64_t i, const float* in) noexcept override {
    const std::int64_t slot = slot_[static_cast<std::size_t>(i)];
    if (slot < 0) {
      set_tail(tk_, -slot - 1, in, wk_.data() + i * D_);
      return;
    }
    // Re-quantize the whole key group from its dequantized rows with row i replaced.
    std::memcpy(wk_.data() + i * D_, in, static_cast<std::size_t>(D_) * sizeof(float));
    const std::int32_t g = kgroup_[static_cast<std::size_t>(slot)];
    std::vector<std::int64_t> members;
    for (std::int64_t r = 0; r < size(); ++r) {
      const std::int64_t s = slot_[static_cast<std::size_t>(r)];
      if (s >= 0 && kgroup_[static_cast<std::size_t>(s)] == g) members.push_back(r);
    }
    quantize_key_group(g, members);
  }

  void set_position(std::int64_t i, std::int32_t pos) noexcept override {
    pos_[static_cast<std::size_t>(i)] = pos;
  }

  void settle(const std::int64_t* live, std::int64_t n) override {
    // The live tail rows, oldest first, are the live rows without a quantized slot.
    std::vector<std::int64_t> tail;
    std::int64_t n_quantized = 0;
    for (std::int64_t j = 0; j < n; ++j) {
      if (slot_[static_cast<std::size_t>(live[j])] < 0) {
        tail.push_back(live[j]);
      } else {
        ++n_quantized;
      }
    }
    if (n_quantized < live_quantized_) regroup(live, n);  // quantized rows were evicted
    live_quantized_ = n_quantized;
    std::size_t first = 0;
    while (static_cast<std::int64_t>(tail.size() - first) >= R_ + G_) {
      const std::vector<std::int64_t> rows(tail.begin() + static_cast<std::ptrdiff_t>(first),
                                           tail.begin() + static_cast<std::ptrdiff_t>(first + G_));
      const std::int32_t g = static_cast<std::int32_t>(n_groups());
      kscale_.resize(kscale_.size() + static_cast<std::size_t>(D_));
      kzero_.resize(kzero_.size() + static_cast<std::size_t>(D_));
      for (std::int64_t r : rows) {
        const std::int64_t q = n_quantized_slots();
        kcodes_.resize(static_cast<std::size_t>((q + 1) * row_bytes_));
        vcodes_.resize(kcodes_.size());
        vscale_.resize(static_cast<std::size_t>((q + 1) * n_vgroups_));
        vzero_.resize(vscale_.size());
        kgroup_.push_back(g);
        slot_[static_cast<std::size_t>(r)] = q;  // its tail slot is dead until keep()
        ++dead_tail_;
        quantize_value_row(q, wv_.data() + r * D_, wv_.data() + r * D_);
      }
      quantize_key_group(g, rows);
      first += static_cast<std::size_t>(G_);
      live_quantized_ += G_;
    }
  }

  // Evictions thin out key groups, and each group costs D scales and zeros whatever its size.
  // Consecutive groups whose live rows fit in one group together are re-quantized as one group
  // from their dequantized keys (left to right, greedily), so groups stay at least half full.
  void regroup(const std::int64_t* live, std::int64_t n) {
    std::vector<std::vector<std::int64_t>> runs;  // live rows of each group, in order
    std::int32_t last = -1;
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int64_t s = slot_[static_cast<std::size_t>(live[j])];
      if (s < 0) continue;
      const std::int32_t g = kgroup_[static_cast<std::size_t>(s)];
      if (g != last) runs.emplace_back();
      runs.back().push_back(live[j]);
      last = g;
    }
    std::size_t i = 0;
    while (i < runs.size()) {
      std::vector<std::int64_t> merged = runs[i];
      std::size_t k = i + 1;
      while (k < runs.size() && static_cast<std::int64_t>(merged.size() + runs[k].size()) <= G_) {
        merged.insert(merged.end(), runs[k].begin(), runs[k].end());
        ++k;
      }
      if (k > i + 1) {
        const std::int32_t g = static_cast<std::int32_t>(n_groups());
        kscale_.resize(kscale_.size() + static_cast<std::size_t>(D_));
        kzero_.resize(kzero_.size() + static_cast<std::size_t>(D_));
        for (std::int64_t r : merged) kgroup_[static_cast<std::size_t>(slot_[static_cast<std::size_t>(r)])] = g;
        quantize_key_group(g, merged);
      }
      i = k;
    }
  }

  void keep(const std::int64_t* idx, std::int64_t n) override {
    // All rows kept (strictly increasing indices: the identity) and no dead tail slots: no copy.
    if (n == size() && dead_tail_ == 0) return;
    dead_tail_ = 0;
    std::vector<std::uint8_t> kc, vc;
    std::vector<float> vs, vz, ks, kz, wk, wv;
    std::vector<std::int32_t> kg, pos;
    std::vector<std::int64_t> slots;
    std::vector<std::uint8_t> tk, tv;
    std::vector<std::int32_t> group_map(static_cast<std::size_t>(n_groups()), -1);
    std::int32_t n_new_groups = 0;
    const std::size_t tail_row = static_cast<std::size_t>(D_ * tail_size_);
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int64_t r = idx[j];
      VQ_ASSERT(r >= 0 && r < size() && (j == 0 || r > idx[j - 1]),
                "keep() needs strictly increasing row indices within the store");
      const std::int64_t s = slot_[static_cast<std::size_t>(r)];
      if (s >= 0) {
        const std::int32_t g = kgroup_[static_cast<std::size_t>(s)];
        if (group_map[static_cast<std::size_t>(g)] < 0) {
          group_map[static_cast<std::size_t>(g)] = n_new_groups++;
          ks.insert(ks.end(), kscale_.begin() + g * D_, kscale_.begin() + (g + 1) * D_);
          kz.insert(kz.end(), kzero_.begin() + g * D_, kzero_.begin() + (g + 1) * D_);
        }
        slots.push_back(static_cast<std::int64_t>(kg.size()));
        kg.push_back(group_map[static_cast<std::size_t>(g)]);
        kc.insert(kc.end(), kcodes_.begin() + s * row_bytes_, kcodes_.begin() + (s + 1) * row_bytes_);
        vc.insert(vc.end(), vcodes_.begin() + s * row_bytes_, vcodes_.begin() + (s + 1) * row_bytes_);
        vs.insert(vs.end(), vscale_.begin() + s * n_vgroups_, vscale_.begin() + (s + 1) * n_vgroups_);
        vz.insert(vz.end(), vzero_.begin() + s * n_vgroups_, vzero_.begin() + (s + 1) * n_vgroups_);
      } else {
        const std::size_t t = static_cast<std::size_t>(-s - 1);
        slots.push_back(-static_cast<std::int64_t>(tk.size() / tail_row) - 1);
        tk.insert(tk.end(), tk_.begin() + static_cast<std::ptrdiff_t>(t * tail_row),
                  tk_.begin() + static_cast<std::ptrdiff_t>((t + 1) * tail_row));
        tv.insert(tv.end(), tv_.begin() + static_cast<std::ptrdiff_t>(t * tail_row),
                  tv_.begin() + static_cast<std::ptrdiff_t>((t + 1) * tail_row));
      }
      pos.push_back(pos_[static_cast<std::size_t>(r)]);
      wk.insert(wk.end(), wk_.begin() + r * D_, wk_.begin() + (r + 1) * D_);
      wv.insert(wv.end(), wv_.begin() + r * D_, wv_.begin() + (r + 1) * D_);
    }
    kcodes_ = std::move(kc), vcodes_ = std::move(vc), vscale_ = std::move(vs),
    vzero_ = std::move(vz), kscale_ = std::move(ks), kzero_ = std::move(kz),
    kgroup_ = std::move(kg), pos_ = std::move(pos), slot_ = std::move(slots), tk_ = std::move(tk),
    tv_ = std::move(tv), wk_ = std::move(wk), wv_ = std::move(wv);
  }

  void clear() noexcept override {
    kcodes_.clear(), vcodes_.clear(), vscale_.clear(), vzero_.clear(), kscale_.clear(),
        kzero_.clear(), kgroup_.clear(), pos_.clear(), slot_.clear(), tk_.clear(), tv_.clear(),
        wk_.clear(), wv_.clear();
    dead_tail_ = 0;
    live_quantized_ = 0;
  }

  std::int64_t bytes() const noexcept override {
    return static_cast<std::int64_t>(kcodes_.size() + vcodes_.size() +
                                     4 * (vscale_.size() + vzero_.size() + kscale_.size() +
                                          kzero_.size()) +
                                     tk_.size() + tv_.size());
  }
  std::int64_t allocated_bytes() const noexcept override {
    return static_cast<std::int64_t>(kcodes_.capacity() + vcodes_.capacity() +
                                     4 * (vscale_.capacity() + vzero_.capacity() +
                                          kscale_.capacity() + kzero_.capacity()) +
                                     tk_.capacity() + tv_.capacity());
  }
  std::int64_t workspace_bytes() const noexcept override {
    return static_cast<std::int64_t>(4 * (wk_.capacity() + wv_.capacity()));
  }

 private:
  std::int64_t n_tail_slots() const noexcept {
    return static_cast<std::int64_t>(tk_.size()) / (D_ * tail_size_);
  }
  std::int64_t n_quantized_slots() const noexcept {
    return static_cast<std::int64_t>(kgroup_.size());
  }
  std::int64_t n_groups() const noexcept { return static_cast<std::int64_t>(kscale_.size()) / D_; }

  void read_input(const TensorRef& t, std::int64_t b, std::int64_t h, std::int64_t s, float* out) {
    const std::int64_t off = b * t.stride[0] + h * t.stride[1] + s * t.stride[2];
    const void* src = static_cast<const char*>(t.data) + off * static_cast<std::int64_t>(dtype_size(t.dtype));
    kernels::load_row(src, t.dtype, out, D_);
  }

  // Stores an fp32 row in tail slot `slot` (rounded to the tail dtype) and writes the stored
  // value back to `view` as fp32.
  void set_tail(std::vector<std::uint8_t>& buf, std::int64_t slot, const float* in, float* view) {
    void* dst = buf.data() + slot * D_ * tail_size_;
    kernels::store_row(in, tail_dtype_, dst, D_);
    kernels::load_row(dst, tail_dtype_, view, D_);
  }

  std::uint8_t code_at(const std::uint8_t* row, std::int64_t c) const noexcept {
    const std::int64_t bit = c * bits_;
    return static_cast<std::uint8_t>((row[bit / 8] >> (bit % 8)) & levels_);
  }
  void set_code(std::uint8_t* row, std::int64_t c, std::uint32_t q) const noexcept {
    const std::int64_t bit = c * bits_;
    const auto mask = static_cast<std::uint8_t>(levels_ << (bit % 8));
    row[bit / 8] = static_cast<std::uint8_t>((row[bit / 8] & ~mask) | ((q << (bit % 8)) & mask));
  }

  // zero = min, scale = max((max - min) / levels, 1e-8).
  void params(const float* x, std::int64_t n, std::int64_t stride, float* scale, float* zero) const {
    float lo = x[0], hi = x[0];
    for (std::int64_t i = 1; i < n; ++i) {
      lo = std::min(lo, x[i * stride]);
      hi = std::max(hi, x[i * stride]);
    }
    *zero = lo;
    *scale = std::max((hi - lo) / static_cast<float>(levels_), 1e-8f);
  }
  std::uint32_t quantize(float x, float scale, float zero) const {
    const float q = std::floor((x - zero) / scale + 0.5f);
    return static_cast<std::uint32_t>(std::clamp(q, 0.0f, static_cast<float>(levels_)));
  }
  static float dequantize(std::uint32_t q, float scale, float zero) {
    return static_cast<float>(q) * scale + zero;
  }

  // Quantizes value row `in` into quantized slot q (per token, groups of G channels) and writes
  // the dequantized row to `view` (may alias `in`).
  void quantize_value_row(std::int64_t q, const float* in, float* view) {
    std::vector<float> x(in, in + D_);
    std::uint8_t* codes = vcodes_.data() + q * row_bytes_;
    for (std::int64_t g = 0; g < n_vgroups_; ++g) {
      const std::int64_t c0 = g * G_, c1 = std::min(D_, c0 + G_);
      float scale, zero;
      params(x.data() + c0, c1 - c0, 1, &scale, &zero);
      vscale_[static_cast<std::size_t>(q * n_vgroups_ + g)] = scale;
      vzero_[static_cast<std::size_t>(q * n_vgroups_ + g)] = zero;
      for (std::int64_t c = c0; c < c1; ++c) {
        const std::uint32_t code = quantize(x[static_cast<std::size_t>(c)], scale, zero);
        set_code(codes, c, code);
        view[c] = dequantize(code, scale, zero);
      }
    }
  }

  // Quantizes the keys of physical rows `rows` (all in key group g) per channel from their
  // current fp32 values in the workspace, which then receives the dequantized keys.
  void quantize_key_group(std::int32_t g, const std::vector<std::int64_t>& rows) {
    std::vector<float> x(rows.size() * static_cast<std::size_t>(D_));
    for (std::size_t i = 0; i < rows.size(); ++i) {
      std::memcpy(x.data() + i * static_cast<std::size_t>(D_), wk_.data() + rows[i] * D_,
                  static_cast<std::size_t>(D_) * sizeof(float));
    }
    for (std::int64_t c = 0; c < D_; ++c) {
      float scale, zero;
      params(x.data() + c, static_cast<std::int64_t>(rows.size()), D_, &scale, &zero);
      kscale_[static_cast<std::size_t>(g * D_ + c)] = scale;
      kzero_[static_cast<std::size_t>(g * D_ + c)] = zero;
      for (std::size_t i = 0; i < rows.size(); ++i) {
        const std::int64_t slot = slot_[static_cast<std::size_t>(rows[i])];
        const std::uint32_t code = quantize(x[i * static_cast<std::size_t>(D_) + static_cast<std::size_t>(c)], scale, zero);
        set_code(kcodes_.data() + slot * row_bytes_, c, code);
        wk_[static_cast<std::size_t>(rows[i] * D_ + c)] = dequantize(code, scale, zero);
      }
    }
  }

  int bits_;
  std::uint32_t levels_;
  std::int64_t G_, R_, D_;
  DType tail_dtype_;
  std::int64_t tail_size_;
  std::int64_t row_bytes_, n_vgroups_;
  // Quantized slots.
  std::vector<std::uint8_t> kcodes_, vcodes_;  // [n_quantized][row_bytes]
  std::vector<float> vscale_, vzero_;          // [n_quantized][n_vgroups]
  std::vector<std::int32_t> kgroup_;           // [n_quantized] key group of each slot
  std::vector<float> kscale_, kzero_;          // [n_groups][D]
  // Tail slots, raw bytes of the tail dtype.
  std::vector<std::uint8_t> tk_, tv_;  // [n_tail][D * tail_size]
  // Physical rows.
  std::vector<std::int64_t> slot_;  // [n]: >= 0 quantized slot, < 0: tail slot -s - 1
  std::vector<std::int32_t> pos_;   // [n]
  std::vector<float> wk_, wv_;      // [n][D] dequantized / converted rows (workspace)
  std::int64_t dead_tail_ = 0;      // tail slots whose rows were quantized since the last keep()
  std::int64_t live_quantized_ = 0;  // quantized rows alive at the last settle()
};

}  // namespace

std::unique_ptr<RowStore> make_kivi_store(int bits, std::int64_t group_size,
                                          std::int64_t residual_length, DType tail,
                                          std::int64_t head_dim) {
  return std::make_unique<KiviStore>(bits, group_size, residual_length, tail, head_dim);
}

std::unique_ptr<RowStore> make_store(const CacheConfig& config, std::int64_t head_dim) {
  int bits = 0;
  if (config.method() == "kivi") {
    bits = static_cast<int>(config.get_int("bit_width_inlier"));
  } else if (config.has("quantize")) {
    const std::string& q = config.get_enum("quantize");
    bits = q == "kivi2" ? 2 : q == "kivi4" ? 4 : 0;
  }
  if (bits == 0) return make_plain_store(config.kv_dtype(), head_dim);
  return make_kivi_store(bits, config.get_int("kivi_group_size"), config.get_int("residual_length"),
                         config.kv_dtype(), head_dim);
}

}  // namespace vq::detail
