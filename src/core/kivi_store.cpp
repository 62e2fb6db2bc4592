// KIVI storage: asymmetric low-bit quantization, really packed, and nothing else held.
//
// Paper: Liu et al., "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache",
// ICML 2024 (and its CUDA/Triton kernels, which keep scales and zeros in fp16).
//
// Layout per (batch, kv head). Rows are, in order, quantized rows followed by the tail.
//  - Keys are quantized per channel in groups of G consecutive tokens: each key group has a
//    scale and zero per channel. Values are quantized per token in groups of G consecutive
//    channels (the last group may be shorter): each row has a scale and zero per value group.
//    Scales and zeros are fp16, as in KIVI's kernels.
//  - Codes are `bits` wide (2: four per byte; 4: two per byte), packed row by row:
//    ceil(D * bits / 8) bytes per row for keys and again for values; code c of a row sits at
//    bit (c * bits) % 8 of byte (c * bits) / 8.
//  - Parameters of a group with minimum lo and maximum hi (fp32 inputs):
//      zero  = lo rounded down to fp16 (the largest fp16 <= lo),
//      scale = max((hi - zero) / (2^bits - 1), 2^-14) rounded up to fp16,
//      q = clamp(floor((x - zero) / scale + 0.5), 0, 2^bits - 1),  x' = q * scale + zero.
//    The directed roundings keep [lo, hi] inside the grid [zero, zero + (2^bits - 1) * scale],
//    so every value is within scale / 2 of its code (up to fp32 rounding). The floor 2^-14 is
//    fp16's smallest normal number (methods.md's 1e-8 is below fp16's range): a group whose
//    range is under (2^bits - 1) * 2^-14 is quantized with step 2^-14 (error <= 2^-15); a
//    constant group is exact. Values beyond fp16's range (|x| > 65504) saturate the fp16
//    parameters (the codes then clamp).
//  - The newest rows stay unquantized (the tail, in kv_dtype). Whenever the live tail holds
//    residual_length + G rows or more, its oldest G rows are quantized as one key group (and
//    their values row by row).
//  - bytes() = codes + scales + zeros + tail (the payload, kept_bytes); resident_bytes() adds the
//    per-row bookkeeping (slots, key-group ids, positions) and counts every container by its
//    capacity. No dequantized copy is kept: readers dequantize rows on the fly (PackedRows).
// Re-quantization starts from the stored values (the codes dequantized once), never from a
// copy of the originals (none is kept):
//  - Evicting a quantized row removes its codes (its key group keeps its scale/zero, now over
//    fewer rows); consecutive key groups whose remaining rows fit in one group are then
//    re-quantized together (so evictions do not leave many sparse groups, each paying D scales
//    and zeros). Each such re-quantization moves a value by at most half the new group's step.
//  - Merging into a quantized row re-quantizes its value groups from the blended value. A merged
//    key replaces the row's codes; a channel of its key group is re-quantized only when the new
//    key falls outside that channel's current grid (the other rows keep their codes otherwise).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/kernels.h"
#include "core/store.h"
#include "veloxquant/errors.h"

namespace vq::detail {
namespace {

constexpr float kScaleFloor = 6.103515625e-05f;  // 2^-14, fp16's smallest normal
constexpr std::uint16_t kHalfMax = 0x7BFF;       // 65504
constexpr std::uint16_t kHalfLowest = 0xFBFF;    // -65504

std::uint16_t half_next_down(std::uint16_t h) noexcept {
  if (h == 0x0000) return 0x8001;
  return (h & 0x8000) != 0 ? static_cast<std::uint16_t>(h + 1) : static_cast<std::uint16_t>(h - 1);
}
std::uint16_t half_next_up(std::uint16_t h) noexcept {
  if (h == 0x8000) return 0x0001;
  return (h & 0x8000) != 0 ? static_cast<std::uint16_t>(h - 1) : static_cast<std::uint16_t>(h + 1);
}
// The largest finite fp16 <= x (saturating at -65504).
std::uint16_t half_down(float x) noexcept {
  std::uint16_t h = float_to_half(x);
  if (half_to_float(h) > x) h = half_next_down(h);
  if (h == 0xFC00) h = kHalfLowest;
  if (h == 0x7C00) h = kHalfMax;
  return h;
}
// The smallest finite fp16 >= x (saturating at 65504).
std::uint16_t half_up(float x) noexcept {
  std::uint16_t h = float_to_half(x);
  if (half_to_float(h) < x) h = half_next_up(h);
  if (h == 0x7C00) h = kHalfMax;
  if (h == 0xFC00) h = kHalfLowest;
  return h;
}

// Grows v to n elements; capacity grows by an eighth (not doubled), so containers hold little
// slack.
template <typename T>
void grow(std::vector<T>& v, std::size_t n) {
  if (n > v.capacity()) v.reserve(n + n / 8);
  v.resize(n);
}

template <typename T>
std::int64_t cap_bytes(const std::vector<T>& v) noexcept {
  return static_cast<std::int64_t>(v.capacity() * sizeof(T));
}

class KiviStore final : public RowStore, public PackedRows {
 public:
  KiviStore(int bits, std::int64_t group, std::int64_t residual, DType tail, std::int64_t d)
      : bits_(bits),
        levels_((1u << bits) - 1),
        G_(group),
        R_(residual),
        D_(d),
        tail_dtype_(tail),
        tail_size_(static_cast<std::int64_t>(dtype_size(tail))),
        row_bytes_((d * bits + 7) / 8),
        n_vgroups_((d + group - 1) / group),
        row_(static_cast<std::size_t>(d)) {
    VQ_ASSERT(bits == 2 || bits == 4, "kivi bits must be 2 or 4");
  }

  std::int64_t size() const noexcept override { return static_cast<std::int64_t>(pos_.size()); }
  bool quantizing() const noexcept override { return true; }

  void append(const TensorRef& k, const TensorRef& v, std::int64_t b, std::int64_t h,
              std::int32_t first_pos) override {
    const std::int64_t S = k.tokens();
    for (std::int64_t s = 0; s < S; ++s) {
      const std::int64_t tail_slot = n_tail_slots();
      const std::size_t tail_end = static_cast<std::size_t>((tail_slot + 1) * D_ * tail_size_);
      grow(tk_, tail_end);
      grow(tv_, tail_end);
      grow(slot_, slot_.size() + 1);
      grow(pos_, pos_.size() + 1);
      slot_.back() = static_cast<std::int32_t>(-tail_slot - 1);
      pos_.back() = first_pos + static_cast<std::int32_t>(s);
      read_input(k, b, h, s, row_.data());
      kernels::store_row(row_.data(), tail_dtype_, tail_row(tk_, tail_slot), D_);
      read_input(v, b, h, s, row_.data());
      kernels::store_row(row_.data(), tail_dtype_, tail_row(tv_, tail_slot), D_);
    }
  }

  RowsRef rows() const noexcept override {
    RowsRef r;
    r.positions = pos_.data();
    r.dtype = DType::kF32;
    r.n_rows = size();
    r.stride = D_;
    r.packed = this;
    return r;
  }

  // PackedRows / reads: dequantized on the fly.
  void load_key(std::int64_t i, float* out) const noexcept override {
    const std::int32_t s = slot_[static_cast<std::size_t>(i)];
    if (s < 0) {
      kernels::load_row(tail_row(tk_, -s - 1), tail_dtype_, out, D_);
      return;
    }
    const std::int64_t g = kgroup_[static_cast<std::size_t>(s)];
    dequantize_run(kcodes_.data() + s * row_bytes_, 0, D_, kscale_.data() + g * D_,
                   kzero_.data() + g * D_, 1, out);
  }
  void load_value(std::int64_t i, float* out) const noexcept override {
    const std::int32_t s = slot_[static_cast<std::size_t>(i)];
    if (s < 0) {
      kernels::load_row(tail_row(tv_, -s - 1), tail_dtype_, out, D_);
      return;
    }
    const std::uint8_t* codes = vcodes_.data() + s * row_bytes_;
    for (std::int64_t g = 0; g < n_vgroups_; ++g) {
      const std::int64_t c0 = g * G_, c1 = std::min(D_, c0 + G_);
      dequantize_run(codes, c0, c1, vscale_.data() + s * n_vgroups_ + g,
                     vzero_.data() + s * n_vgroups_ + g, 0, out);
    }
  }
  float key_at(std::int64_t i, std::int64_t d) const noexcept override {
    const std::int32_t s = slot_[static_cast<std::size_t>(i)];
    if (s < 0) return tail_at(tk_, -s - 1, d);
    const std::int64_t g = kgroup_[static_cast<std::size_t>(s)];
    return dequantize(code_at(kcodes_.data() + s * row_bytes_, d),
                      half_to_float(kscale_[static_cast<std::size_t>(g * D_ + d)]),
                      half_to_float(kzero_[static_cast<std::size_t>(g * D_ + d)]));
  }
  float value_at(std::int64_t i, std::int64_t d) const noexcept override {
    const std::int32_t s = slot_[static_cast<std::size_t>(i)];
    if (s < 0) return tail_at(tv_, -s - 1, d);
    const std::size_t p = static_cast<std::size_t>(s * n_vgroups_ + d / G_);
    return dequantize(code_at(vcodes_.data() + s * row_bytes_, d), half_to_float(vscale_[p]),
                      half_to_float(vzero_[p]));
  }
  void read_key(std::int64_t i, float* out) const noexcept override { load_key(i, out); }
  void read_value(std::int64_t i, float* out) const noexcept override { load_value(i, out); }

  void write_value(std::int64_t i, const float* in) noexcept override {
    const std::int32_t s = slot_[static_cast<std::size_t>(i)];
    if (s < 0) {
      kernels::store_row(in, tail_dtype_, tail_row(tv_, -s - 1), D_);
    } else {
      quantize_value_row(s, in);
    }
  }

  void write_key(std::int64_t i, const float* in) noexcept override {
    const std::int32_t s = slot_[static_cast<std::size_t>(i)];
    if (s < 0) {
      kernels::store_row(in, tail_dtype_, tail_row(tk_, -s - 1), D_);
      return;
    }
    const std::int32_t g = kgroup_[static_cast<std::size_t>(s)];
    std::vector<std::int64_t> members;  // the other rows of key group g
    for (std::int64_t r = 0; r < size(); ++r) {
      const std::int32_t sr = slot_[static_cast<std::size_t>(r)];
      if (r != i && sr >= 0 && kgroup_[static_cast<std::size_t>(sr)] == g) members.push_back(r);
    }
    std::vector<float> x(members.size() + 1);
    for (std::int64_t c = 0; c < D_; ++c) {
      const std::size_t p = static_cast<std::size_t>(g * D_ + c);
      const float scale = half_to_float(kscale_[p]), zero = half_to_float(kzero_[p]);
      if (in[c] >= zero && in[c] <= dequantize(levels_, scale, zero)) {
        set_code(kcodes_.data() + s * row_bytes_, c, quantize(in[c], scale, zero));
        continue;
      }
      // Outside the channel's grid: re-quantize the channel from the stored values.
      for (std::size_t m = 0; m < members.size(); ++m) x[m] = key_at(members[m], c);
      x.back() = in[c];
      float sc, zr;
      params(x.data(), static_cast<std::int64_t>(x.size()), 1, &kscale_[p], &kzero_[p], &sc, &zr);
      for (std::size_t m = 0; m < members.size(); ++m) {
        const std::int32_t sm = slot_[static_cast<std::size_t>(members[m])];
        set_code(kcodes_.data() + sm * row_bytes_, c, quantize(x[m], sc, zr));
      }
      set_code(kcodes_.data() + s * row_bytes_, c, quantize(in[c], sc, zr));
    }
  }

  void set_position(std::int64_t i, std::int32_t pos) noexcept override {
    pos_[static_cast<std::size_t>(i)] = pos;
  }

  void settle(const std::int64_t* live, std::int64_t n) override {
    // The live tail rows, oldest first, are the live rows without a quantized slot. Physical
    // rows are always the quantized rows followed by the tail rows (the tail's oldest rows are
    // the ones quantized; appends go to the end), and `live` is increasing: the tail is a
    // suffix of `live`.
    const std::int64_t* split = std::partition_point(
        live, live + n, [&](std::int64_t r) { return slot_[static_cast<std::size_t>(r)] >= 0; });
    const std::vector<std::int64_t> tail(split, live + n);
    const std::int64_t n_quantized = split - live;
    if (n_quantized < live_quantized_) regroup(live, n);  // quantized rows were evicted
    live_quantized_ = n_quantized;
    std::size_t first = 0;
    std::vector<float> keys(static_cast<std::size_t>(G_ * D_));
    while (static_cast<std::int64_t>(tail.size() - first) >= R_ + G_) {
      const std::vector<std::int64_t> rows(tail.begin() + static_cast<std::ptrdiff_t>(first),
                                           tail.begin() + static_cast<std::ptrdiff_t>(first + G_));
      const std::int32_t g = static_cast<std::int32_t>(n_groups());
      grow(kscale_, kscale_.size() + static_cast<std::size_t>(D_));
      grow(kzero_, kzero_.size() + static_cast<std::size_t>(D_));
      for (std::size_t j = 0; j < rows.size(); ++j) {
        const std::int64_t r = rows[j];
        const std::int32_t q = static_cast<std::int32_t>(n_quantized_slots());
        grow(kcodes_, static_cast<std::size_t>((q + 1) * row_bytes_));
        grow(vcodes_, kcodes_.size());
        grow(vscale_, static_cast<std::size_t>((q + 1) * n_vgroups_));
        grow(vzero_, vscale_.size());
        grow(kgroup_, kgroup_.size() + 1);
        kgroup_.back() = g;
        load_key(r, keys.data() + j * static_cast<std::size_t>(D_));  // still the tail row
        load_value(r, row_.data());
        slot_[static_cast<std::size_t>(r)] = q;  // its tail slot is dead until keep()
        ++dead_tail_;
        quantize_value_row(q, row_.data());
      }
      quantize_key_group(g, rows, keys.data());
      first += static_cast<std::size_t>(G_);
      live_quantized_ += G_;
    }
  }

  // Evictions thin out key groups, and each group costs D scales and zeros whatever its size.
  // Consecutive groups whose live rows fit in one group together are re-quantized as one group
  // from their stored keys (left to right, greedily), so groups stay at least half full.
  void regroup(const std::int64_t* live, std::int64_t n) {
    std::vector<std::vector<std::int64_t>> runs;  // live rows of each group, in order
    std::int32_t last = -1;
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int32_t s = slot_[static_cast<std::size_t>(live[j])];
      if (s < 0) continue;
      const std::int32_t g = kgroup_[static_cast<std::size_t>(s)];
      if (g != last) runs.emplace_back();
      runs.back().push_back(live[j]);
      last = g;
    }
    std::size_t i = 0;
    std::vector<float> keys;
    while (i < runs.size()) {
      std::vector<std::int64_t> merged = runs[i];
      std::size_t k = i + 1;
      while (k < runs.size() && static_cast<std::int64_t>(merged.size() + runs[k].size()) <= G_) {
        merged.insert(merged.end(), runs[k].begin(), runs[k].end());
        ++k;
      }
      if (k > i + 1) {
        keys.resize(merged.size() * static_cast<std::size_t>(D_));
        for (std::size_t j = 0; j < merged.size(); ++j) {
          load_key(merged[j], keys.data() + j * static_cast<std::size_t>(D_));
        }
        const std::int32_t g = static_cast<std::int32_t>(n_groups());
        grow(kscale_, kscale_.size() + static_cast<std::size_t>(D_));
        grow(kzero_, kzero_.size() + static_cast<std::size_t>(D_));
        for (std::int64_t r : merged) {
          kgroup_[static_cast<std::size_t>(slot_[static_cast<std::size_t>(r)])] = g;
        }
        quantize_key_group(g, merged, keys.data());
      }
      i = k;
    }
  }

  void keep(const std::int64_t* idx, std::int64_t n) override {
    // All rows kept (strictly increasing indices: the identity) and no dead tail slots: no copy.
    if (n == size() && dead_tail_ == 0) return;
    dead_tail_ = 0;
    if (n == size()) {
      // All rows kept, some tail rows were quantized: only the tail moves (in place, towards
      // the front; tail slots are in physical order).
      const std::size_t row_bytes = static_cast<std::size_t>(D_ * tail_size_);
      std::int32_t next = 0;
      for (std::int32_t& s : slot_) {
        if (s >= 0) continue;
        const std::size_t from = static_cast<std::size_t>(-s - 1);
        if (from != static_cast<std::size_t>(next)) {
          std::memmove(tk_.data() + next * row_bytes, tk_.data() + from * row_bytes, row_bytes);
          std::memmove(tv_.data() + next * row_bytes, tv_.data() + from * row_bytes, row_bytes);
        }
        s = -next - 1;
        ++next;
      }
      tk_.resize(static_cast<std::size_t>(next) * row_bytes);
      tv_.resize(tk_.size());
      return;
    }
    std::int64_t n_q = 0;
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int64_t r = idx[j];
      VQ_ASSERT(r >= 0 && r < size() && (j == 0 || r > idx[j - 1]),
                "keep() needs strictly increasing row indices within the store");
      if (slot_[static_cast<std::size_t>(r)] >= 0) ++n_q;
    }
    const std::int64_t n_t = n - n_q;
    const std::size_t tail_row_bytes = static_cast<std::size_t>(D_ * tail_size_);
    std::vector<std::uint8_t> kc, vc, tk, tv;
    std::vector<std::uint16_t> vs, vz, ks, kz;
    std::vector<std::int32_t> kg, pos, slots;
    kc.reserve(static_cast<std::size_t>(n_q * row_bytes_));
    vc.reserve(kc.capacity());
    vs.reserve(static_cast<std::size_t>(n_q * n_vgroups_));
    vz.reserve(vs.capacity());
    kg.reserve(static_cast<std::size_t>(n_q));
    tk.reserve(static_cast<std::size_t>(n_t) * tail_row_bytes);
    tv.reserve(tk.capacity());
    pos.reserve(static_cast<std::size_t>(n));
    slots.reserve(static_cast<std::size_t>(n));
    std::vector<std::int32_t> group_map(static_cast<std::size_t>(n_groups()), -1);
    std::int64_t n_new_groups = 0;
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int64_t r = idx[j];
      const std::int32_t s = slot_[static_cast<std::size_t>(r)];
      if (s >= 0) {
        const std::int32_t g = kgroup_[static_cast<std::size_t>(s)];
        if (group_map[static_cast<std::size_t>(g)] < 0) {
          group_map[static_cast<std::size_t>(g)] = static_cast<std::int32_t>(n_new_groups++);
        }
        slots.push_back(static_cast<std::int32_t>(kg.size()));
        kg.push_back(group_map[static_cast<std::size_t>(g)]);
        kc.insert(kc.end(), kcodes_.begin() + s * row_bytes_,
                  kcodes_.begin() + (s + 1) * row_bytes_);
        vc.insert(vc.end(), vcodes_.begin() + s * row_bytes_,
                  vcodes_.begin() + (s + 1) * row_bytes_);
        vs.insert(vs.end(), vscale_.begin() + s * n_vgroups_,
                  vscale_.begin() + (s + 1) * n_vgroups_);
        vz.insert(vz.end(), vzero_.begin() + s * n_vgroups_, vzero_.begin() + (s + 1) * n_vgroups_);
      } else {
        const std::size_t t = static_cast<std::size_t>(-s - 1);
        slots.push_back(-static_cast<std::int32_t>(tk.size() / tail_row_bytes) - 1);
        tk.insert(tk.end(), tk_.begin() + static_cast<std::ptrdiff_t>(t * tail_row_bytes),
                  tk_.begin() + static_cast<std::ptrdiff_t>((t + 1) * tail_row_bytes));
        tv.insert(tv.end(), tv_.begin() + static_cast<std::ptrdiff_t>(t * tail_row_bytes),
                  tv_.begin() + static_cast<std::ptrdiff_t>((t + 1) * tail_row_bytes));
      }
      pos.push_back(pos_[static_cast<std::size_t>(r)]);
    }
    // Key-group parameters of the groups still used, in their new order.
    ks.resize(static_cast<std::size_t>(n_new_groups * D_));
    kz.resize(ks.size());
    for (std::size_t g = 0; g < group_map.size(); ++g) {
      const std::int32_t to = group_map[g];
      if (to < 0) continue;
      std::copy_n(kscale_.begin() + static_cast<std::ptrdiff_t>(g) * D_, D_, ks.begin() + to * D_);
      std::copy_n(kzero_.begin() + static_cast<std::ptrdiff_t>(g) * D_, D_, kz.begin() + to * D_);
    }
    kcodes_ = std::move(kc), vcodes_ = std::move(vc), vscale_ = std::move(vs),
    vzero_ = std::move(vz), kscale_ = std::move(ks), kzero_ = std::move(kz),
    kgroup_ = std::move(kg), pos_ = std::move(pos), slot_ = std::move(slots), tk_ = std::move(tk),
    tv_ = std::move(tv);
  }

  void clear() noexcept override {
    kcodes_.clear(), vcodes_.clear(), vscale_.clear(), vzero_.clear(), kscale_.clear(),
        kzero_.clear(), kgroup_.clear(), pos_.clear(), slot_.clear(), tk_.clear(), tv_.clear();
    dead_tail_ = 0;
    live_quantized_ = 0;
  }

  std::int64_t bytes() const noexcept override {
    return static_cast<std::int64_t>(
        kcodes_.size() + vcodes_.size() +
        2 * (vscale_.size() + vzero_.size() + kscale_.size() + kzero_.size()) + tk_.size() +
        tv_.size());
  }
  std::int64_t allocated_bytes() const noexcept override {
    return cap_bytes(kcodes_) + cap_bytes(vcodes_) + cap_bytes(vscale_) + cap_bytes(vzero_) +
           cap_bytes(kscale_) + cap_bytes(kzero_) + cap_bytes(tk_) + cap_bytes(tv_);
  }
  std::int64_t resident_bytes() const noexcept override {
    return allocated_bytes() + cap_bytes(kgroup_) + cap_bytes(slot_) + cap_bytes(pos_) +
           cap_bytes(row_);
  }

 private:
  std::int64_t n_tail_slots() const noexcept {
    return static_cast<std::int64_t>(tk_.size()) / (D_ * tail_size_);
  }
  std::int64_t n_quantized_slots() const noexcept {
    return static_cast<std::int64_t>(kgroup_.size());
  }
  std::int64_t n_groups() const noexcept { return static_cast<std::int64_t>(kscale_.size()) / D_; }

  void* tail_row(std::vector<std::uint8_t>& buf, std::int64_t slot) noexcept {
    return buf.data() + slot * D_ * tail_size_;
  }
  const void* tail_row(const std::vector<std::uint8_t>& buf, std::int64_t slot) const noexcept {
    return buf.data() + slot * D_ * tail_size_;
  }
  float tail_at(const std::vector<std::uint8_t>& buf, std::int64_t slot,
                std::int64_t d) const noexcept {
    const auto* row = static_cast<const std::uint8_t*>(tail_row(buf, slot));
    if (tail_dtype_ == DType::kF32) {
      float x;
      std::memcpy(&x, row + d * 4, sizeof(float));
      return x;
    }
    std::uint16_t h;
    std::memcpy(&h, row + d * 2, sizeof(h));
    return half_to_float(h);
  }

  void read_input(const TensorRef& t, std::int64_t b, std::int64_t h, std::int64_t s, float* out) {
    const std::int64_t off = b * t.stride[0] + h * t.stride[1] + s * t.stride[2];
    const void* src =
        static_cast<const char*>(t.data) + off * static_cast<std::int64_t>(dtype_size(t.dtype));
    kernels::load_row(src, t.dtype, out, D_);
  }

  std::uint32_t code_at(const std::uint8_t* row, std::int64_t c) const noexcept {
    const std::int64_t bit = c * bits_;
    return static_cast<std::uint32_t>((row[bit / 8] >> (bit % 8)) & levels_);
  }
  void set_code(std::uint8_t* row, std::int64_t c, std::uint32_t q) const noexcept {
    const std::int64_t bit = c * bits_;
    const auto mask = static_cast<std::uint8_t>(levels_ << (bit % 8));
    row[bit / 8] = static_cast<std::uint8_t>((row[bit / 8] & ~mask) | ((q << (bit % 8)) & mask));
  }

  // Dequantizes codes [c0, c1) of `codes` into out[c0, c1): parameters scale[k], zero[k] with
  // k = (c - c0) * param_step (1: one per channel; 0: one for the run).
  void dequantize_run(const std::uint8_t* codes, std::int64_t c0, std::int64_t c1,
                      const std::uint16_t* scale, const std::uint16_t* zero,
                      std::int64_t param_step, float* out) const noexcept {
    constexpr std::int64_t kBlock = 64;
    float sc[kBlock], zr[kBlock];
    for (std::int64_t b0 = c0; b0 < c1; b0 += kBlock) {
      const std::int64_t n = std::min(kBlock, c1 - b0);
      if (param_step == 0) {
        std::fill_n(sc, n, half_to_float(scale[0]));
        std::fill_n(zr, n, half_to_float(zero[0]));
      } else {
        kernels::f16_to_f32(scale + (b0 - c0), sc, n);
        kernels::f16_to_f32(zero + (b0 - c0), zr, n);
      }
      for (std::int64_t j = 0; j < n; ++j)
        out[b0 + j] = dequantize(code_at(codes, b0 + j), sc[j], zr[j]);
    }
  }

  // Parameters of the n values x[0], x[stride], ...: fp16 bits to *scale_h / *zero_h, their
  // fp32 values to *scale / *zero (see the header comment).
  void params(const float* x, std::int64_t n, std::int64_t stride, std::uint16_t* scale_h,
              std::uint16_t* zero_h, float* scale, float* zero) const noexcept {
    float lo = x[0], hi = x[0];
    for (std::int64_t i = 1; i < n; ++i) {
      lo = std::min(lo, x[i * stride]);
      hi = std::max(hi, x[i * stride]);
    }
    *zero_h = half_down(lo);
    *zero = half_to_float(*zero_h);
    *scale_h = half_up(std::max((hi - *zero) / static_cast<float>(levels_), kScaleFloor));
    *scale = half_to_float(*scale_h);
  }
  std::uint32_t quantize(float x, float scale, float zero) const noexcept {
    const float q = std::floor((x - zero) / scale + 0.5f);
    return static_cast<std::uint32_t>(std::clamp(q, 0.0f, static_cast<float>(levels_)));
  }
  static float dequantize(std::uint32_t q, float scale, float zero) noexcept {
    return static_cast<float>(q) * scale + zero;
  }

  // Quantizes value row `in` into quantized slot q (per token, groups of G channels).
  void quantize_value_row(std::int64_t q, const float* in) noexcept {
    std::uint8_t* codes = vcodes_.data() + q * row_bytes_;
    for (std::int64_t g = 0; g < n_vgroups_; ++g) {
      const std::int64_t c0 = g * G_, c1 = std::min(D_, c0 + G_);
      const std::size_t p = static_cast<std::size_t>(q * n_vgroups_ + g);
      float scale, zero;
      params(in + c0, c1 - c0, 1, &vscale_[p], &vzero_[p], &scale, &zero);
      for (std::int64_t c = c0; c < c1; ++c) set_code(codes, c, quantize(in[c], scale, zero));
    }
  }

  // Quantizes the keys x ([rows.size()][D] fp32) of physical rows `rows` as key group g, per
  // channel.
  void quantize_key_group(std::int32_t g, const std::vector<std::int64_t>& rows, const float* x) {
    const auto n = static_cast<std::int64_t>(rows.size());
    for (std::int64_t c = 0; c < D_; ++c) {
      const std::size_t p = static_cast<std::size_t>(g * D_ + c);
      float scale, zero;
      params(x + c, n, D_, &kscale_[p], &kzero_[p], &scale, &zero);
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int32_t slot =
            slot_[static_cast<std::size_t>(rows[static_cast<std::size_t>(i)])];
        set_code(kcodes_.data() + slot * row_bytes_, c, quantize(x[i * D_ + c], scale, zero));
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
  std::vector<std::uint16_t> vscale_, vzero_;  // [n_quantized][n_vgroups] fp16
  std::vector<std::int32_t> kgroup_;           // [n_quantized] key group of each slot
  std::vector<std::uint16_t> kscale_, kzero_;  // [n_groups][D] fp16
  // Tail slots, raw bytes of the tail dtype.
  std::vector<std::uint8_t> tk_, tv_;  // [n_tail][D * tail_size]
  // Physical rows.
  std::vector<std::int32_t> slot_;   // [n]: >= 0 quantized slot, < 0: tail slot -s - 1
  std::vector<std::int32_t> pos_;    // [n]
  std::vector<float> row_;           // [D] one input row as fp32 (append/settle scratch)
  std::int64_t dead_tail_ = 0;       // tail slots whose rows were quantized since the last keep()
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
  if (bits == 0 && config.has("demote") && config.get_enum("demote") != "none") {
    return make_mixed_store(config.get_enum("demote") == "kivi2" ? 2 : 4,
                            config.get_int("demote_group"), demote_cap(config), config.kv_dtype(),
                            head_dim);
  }
  if (bits == 0) return make_plain_store(config.kv_dtype(), head_dim);
  return make_kivi_store(bits, config.get_int("kivi_group_size"), config.get_int("residual_length"),
                         config.kv_dtype(), head_dim);
}

}  // namespace vq::detail
