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
//  - The newest rows stay unquantized (the tail, in kv_dtype), keys and values leaving it as in
//    the paper: values one token at a time (whenever the live value tail holds more than
//    residual_length rows, its oldest rows are quantized until it holds residual_length), keys a
//    group at a time (whenever the live key tail holds residual_length + G rows or more, its
//    oldest G rows are quantized as one key group). So the tail holds the keys of
//    residual_length to residual_length + G - 1 rows and the values of residual_length rows
//    (fewer only while the cache is shorter).
//  - Quantized rows are indexed by their physical row (the quantized rows are the first rows),
//    tail rows by their offset past the quantized ones, and key groups by their first row: no
//    per-row bookkeeping besides the positions.
//  - bytes() = codes + scales + zeros + tail (the payload, kept_bytes); resident_bytes() adds the
//    positions and the key groups' first rows and counts every container by its capacity. No
//    dequantized copy is kept: attention reads the codes (attend_scores / attend_values, the
//    query or probability folded into the scales, packed_attention.h); other readers dequantize
//    rows on the fly (PackedRows).
//  - Capacity: the tails and the positions grow as the plain store's rows do (so while every
//    row is in the tail the store holds exactly what the plain store holds), the key tail's
//    growth capped at residual_length + G rows and the value tail's at residual_length + 1;
//    after a step that quantized rows a tail keeps room for its rows and one more, and a large
//    cut gives the rest back as the plain store does.
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

#include "base/kernels.h"
#include "store/lowbit_params.h"
#include "store/packed_attention.h"
#include "store/growth.h"
#include "store/packed_codes.h"
#include "store/store.h"
#include "veloxquant/errors.h"

namespace vq::detail {
namespace {

// Grows v to n elements; capacity grows by an eighth (not doubled), so containers hold little
// slack.
template <typename T>
void grow(std::vector<T>& v, std::size_t n) {
  if (n > v.capacity()) v.reserve(n + n / 8);
  v.resize(n);
}

// Replaces v's buffer by one of exactly `cap` elements (>= v.size()) holding v's elements.
template <typename T>
void shrink_to(std::vector<T>& v, std::size_t cap) {
  std::vector<T> t;
  t.reserve(cap);
  t.assign(v.begin(), v.end());
  v.swap(t);
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
        tail_row_bytes_(static_cast<std::size_t>(d) * dtype_size(tail)),
        row_bytes_((d * bits + 7) / 8),
        n_vgroups_((d + group - 1) / group) {
    VQ_ASSERT(bits == 2 || bits == 4, "kivi bits must be 2 or 4");
  }

  std::int64_t size() const noexcept override { return static_cast<std::int64_t>(pos_.size()); }
  bool quantizing() const noexcept override { return true; }

  void append(const TensorRef& k, const TensorRef& v, std::int64_t b, std::int64_t h,
              std::int32_t first_pos) override {
    const std::int64_t S = k.tokens();
    const std::int64_t n0 = size();
    last_append_ = S;
    grow_tail(tk_, n0 + S - kbase_, R_ + G_);
    grow_tail(tv_, n0 + S - vbase_, R_ + 1);
    // The positions grow as the plain store's do (store/growth.h).
    const auto n_pos = static_cast<std::size_t>(n0 + S);
    if (n_pos > pos_.capacity()) pos_.reserve(grown_rows(pos_.capacity(), n_pos));
    pos_.resize(n_pos);
    for (std::int64_t s = 0; s < S; ++s) {
      copy_input(k, b, h, s, tail_row(tk_, n0 + s - kbase_));
      copy_input(v, b, h, s, tail_row(tv_, n0 + s - vbase_));
      pos_[static_cast<std::size_t>(n0 + s)] = first_pos + static_cast<std::int32_t>(s);
    }
  }

  HeadRows rows() const noexcept override { return packed_rows(this, pos_.data(), size(), D_); }

  // PackedRows / reads: dequantized on the fly.
  void load_key(std::int64_t i, float* out) const noexcept override {
    if (i >= kq_) {
      kernels::load_row(tail_row(tk_, i - kbase_), tail_dtype_, out, D_);
      return;
    }
    const std::int64_t g = group_of(i);
    dequantize_run(kcodes_.data() + i * row_bytes_, 0, D_, kscale_.data() + g * D_,
                   kzero_.data() + g * D_, 1, out);
  }
  void load_value(std::int64_t i, float* out) const noexcept override {
    if (i >= vq_) {
      kernels::load_row(tail_row(tv_, i - vbase_), tail_dtype_, out, D_);
      return;
    }
    const std::uint8_t* codes = vcodes_.data() + i * row_bytes_;
    for (std::int64_t g = 0; g < n_vgroups_; ++g) {
      const std::int64_t c0 = g * G_, c1 = std::min(D_, c0 + G_);
      dequantize_run(codes, c0, c1, vscale_.data() + i * n_vgroups_ + g,
                     vzero_.data() + i * n_vgroups_ + g, 0, out);
    }
  }
  float key_at(std::int64_t i, std::int64_t d) const noexcept override {
    if (i >= kq_) return tail_at(tk_, i - kbase_, d);
    const std::int64_t g = group_of(i);
    return dequantize(code_at(kcodes_.data() + i * row_bytes_, d),
                      half_to_float(kscale_[static_cast<std::size_t>(g * D_ + d)]),
                      half_to_float(kzero_[static_cast<std::size_t>(g * D_ + d)]));
  }
  float value_at(std::int64_t i, std::int64_t d) const noexcept override {
    if (i >= vq_) return tail_at(tv_, i - vbase_, d);
    const std::size_t p = static_cast<std::size_t>(i * n_vgroups_ + d / G_);
    return dequantize(code_at(vcodes_.data() + i * row_bytes_, d), half_to_float(vscale_[p]),
                      half_to_float(vzero_[p]));
  }
  // Bulk read (the engine's attention, a whole head per step): keys a key group at a time, its
  // scales and zeros converted once per block of channels; codes unpacked a byte at a time
  // (packed_codes.h); each element is q * scale + zero as in load_key / load_value.
  void load_rows(std::int64_t r0, std::int64_t r1, std::int64_t stride, float* keys,
                 float* values) const noexcept override {
    if (keys != nullptr) load_keys(r0, r1, stride, keys);
    if (values != nullptr) load_values(r0, r1, stride, values);
  }

  // Fused attention (packed_attention.h): quantized keys a key group at a time, the query folded
  // into the group's per-channel scales (channel_scores); quantized values per token, the
  // probability folded into each value group's scale and the zeros summed apart
  // (token_values); the tail rows as plain rows, in the same sums.
  void attend_scores(const float* q, std::int64_t n_q, std::int64_t pos, float* scores,
                     std::int64_t ld) const noexcept override {
    const cpu::Isa isa = cpu::best_isa();
    attn::RowSet k;
    k.fmt = bits_ == 2 ? attn::Fmt::kU2 : attn::Fmt::kU4;
    k.row_bytes = row_bytes_;
    const auto n_groups = static_cast<std::int64_t>(gstart_.size());
    for (std::int64_t g = 0; g < n_groups; ++g) {
      const std::int64_t a = group_begin(g), b = group_end(g);
      k.data = kcodes_.data() + a * row_bytes_;
      k.positions = pos_.data() + a;
      k.n = b - a;
      attn::channel_scores(isa, k, kscale_.data() + g * D_, kzero_.data() + g * D_, D_, q, n_q,
                           pos, scores + a, ld);
    }
    attn::token_scores(isa, tail_set(tk_, kq_, kbase_), D_, q, n_q, pos, scores + kq_, ld);
  }
  void attend_values(const float* probs, std::int64_t n_q, std::int64_t ld, std::int64_t pos,
                     float* out, float* scratch) const noexcept override {
    const cpu::Isa isa = cpu::best_isa();
    float* A = scratch;                // [n_q][4][D]
    float* Z = scratch + n_q * 4 * D_;  // [n_q][4][n_vgroups]
    std::fill(scratch, scratch + n_q * 4 * (D_ + n_vgroups_), 0.0f);
    attn::RowSet v;
    v.fmt = bits_ == 2 ? attn::Fmt::kU2 : attn::Fmt::kU4;
    v.data = vcodes_.data();
    v.row_bytes = row_bytes_;
    v.scale = vscale_.data();
    v.zero = vzero_.data();
    v.param_stride = n_vgroups_;
    v.group = G_;
    v.positions = pos_.data();
    v.n = vq_;
    attn::token_values(isa, v, 0, D_, probs, n_q, ld, pos, A, Z, n_vgroups_);
    attn::token_values(isa, tail_set(tv_, vq_, vbase_), vq_, D_, probs + vq_, n_q, ld, pos, A,
                       nullptr, 0);
    attn::finish_values(A, vq_ > 0 ? Z : nullptr, n_vgroups_, G_, n_q, D_, out);
  }

 private:
  void load_keys(std::int64_t r0, std::int64_t r1, std::int64_t stride,
                 float* keys) const noexcept {
    constexpr std::int64_t kBlock = 64;  // channels per block: a whole number of code bytes
    float sc[kBlock], zr[kBlock];
    const std::int64_t kend = std::min(r1, kq_);
    if (r0 < kend) {
      for (std::int64_t g = group_of(r0), a = r0; a < kend; ++g) {
        const std::int64_t b = std::min(kend, group_end(g));
        const std::uint16_t* scale = kscale_.data() + g * D_;
        const std::uint16_t* zero = kzero_.data() + g * D_;
        for (std::int64_t c0 = 0; c0 < D_; c0 += kBlock) {
          const std::int64_t n = std::min(kBlock, D_ - c0);
          kernels::f16_to_f32(scale + c0, sc, n);
          kernels::f16_to_f32(zero + c0, zr, n);
          for (std::int64_t r = a; r < b; ++r) {
            float* o = keys + (r - r0) * stride + c0;
            dequantize_codes<true>(kcodes_.data() + r * row_bytes_ + c0 * bits_ / 8, bits_, n,
                                   sc, zr, o);
          }
        }
        a = std::max(a, b);
      }
    }
    for (std::int64_t r = std::max(r0, kq_); r < r1; ++r) {
      kernels::load_row(tail_row(tk_, r - kbase_), tail_dtype_, keys + (r - r0) * stride, D_);
    }
  }

  void load_values(std::int64_t r0, std::int64_t r1, std::int64_t stride,
                   float* values) const noexcept {
    // Values: the rows' scales and zeros ([rows][n_vgroups], contiguous) converted kParams at a
    // time; params [p0, p1) are in vs / vz.
    constexpr std::int64_t kParams = 256;
    float vs[kParams], vz[kParams];
    const std::int64_t vend = std::min(r1, vq_), pend = vend * n_vgroups_;
    std::int64_t p0 = 0, p1 = 0;
    // Groups of a multiple of 8 channels start on a byte: dequantized group by group (SIMD);
    // otherwise the row's codes are unpacked at once and each group scaled.
    const bool byte_groups = G_ % 8 == 0;
    for (std::int64_t r = r0; r < vend; ++r) {
      float* o = values + (r - r0) * stride;
      if (!byte_groups) unpack_codes(vcodes_.data() + r * row_bytes_, bits_, D_, o);
      for (std::int64_t g = 0; g < n_vgroups_; ++g) {
        const std::int64_t p = r * n_vgroups_ + g;
        if (p >= p1) {
          p0 = p;
          p1 = std::min(pend, p + kParams);
          kernels::f16_to_f32(vscale_.data() + p0, vs, p1 - p0);
          kernels::f16_to_f32(vzero_.data() + p0, vz, p1 - p0);
        }
        const std::int64_t c0 = g * G_, c1 = std::min(D_, c0 + G_);
        if (byte_groups) {
          dequantize_codes<false>(vcodes_.data() + r * row_bytes_ + c0 * bits_ / 8, bits_,
                                  c1 - c0, vs + (p - p0), vz + (p - p0), o + c0);
        } else {
          const float sc = vs[p - p0], z = vz[p - p0];
          for (std::int64_t c = c0; c < c1; ++c) o[c] = o[c] * sc + z;
        }
      }
    }
    for (std::int64_t r = std::max(r0, vq_); r < r1; ++r) {
      kernels::load_row(tail_row(tv_, r - vbase_), tail_dtype_, values + (r - r0) * stride, D_);
    }
  }

 public:
  void read_key(std::int64_t i, float* out) const noexcept override { load_key(i, out); }
  void read_value(std::int64_t i, float* out) const noexcept override { load_value(i, out); }

  void write_value(std::int64_t i, const float* in) noexcept override {
    if (i >= vq_) {
      kernels::store_row(in, tail_dtype_, tail_row(tv_, i - vbase_), D_);
    } else {
      quantize_value_row(i, in);
    }
  }

  void write_key(std::int64_t i, const float* in) noexcept override {
    if (i >= kq_) {
      kernels::store_row(in, tail_dtype_, tail_row(tk_, i - kbase_), D_);
      return;
    }
    const std::int64_t g = group_of(i);
    std::vector<std::int64_t> members;  // the other rows of key group g
    for (std::int64_t r = group_begin(g); r < group_end(g); ++r) {
      if (r != i) members.push_back(r);
    }
    std::vector<float> x(members.size() + 1);
    for (std::int64_t c = 0; c < D_; ++c) {
      const std::size_t p = static_cast<std::size_t>(g * D_ + c);
      const float scale = half_to_float(kscale_[p]), zero = half_to_float(kzero_[p]);
      if (in[c] >= zero && in[c] <= dequantize(levels_, scale, zero)) {
        set_code(kcodes_.data() + i * row_bytes_, c, quantize(in[c], scale, zero));
        continue;
      }
      // Outside the channel's grid: re-quantize the channel from the stored values.
      for (std::size_t m = 0; m < members.size(); ++m) x[m] = key_at(members[m], c);
      x.back() = in[c];
      float sc, zr;
      params(x.data(), static_cast<std::int64_t>(x.size()), 1, &kscale_[p], &kzero_[p], &sc, &zr);
      for (std::size_t m = 0; m < members.size(); ++m) {
        set_code(kcodes_.data() + members[m] * row_bytes_, c, quantize(x[m], sc, zr));
      }
      set_code(kcodes_.data() + i * row_bytes_, c, quantize(in[c], sc, zr));
    }
  }

  void set_position(std::int64_t i, std::int32_t pos) noexcept override {
    pos_[static_cast<std::size_t>(i)] = pos;
  }

  void settle(const std::int64_t* live, std::int64_t n) override {
    settle_values(live, n);
    settle_keys(live, n);
  }

  // Every row alive: the same decisions as settle() + keep() with all rows, without a row list
  // (only the tails move).
  void settle_keep_all() override {
    if (kq_ < live_quantized_) {  // rows were evicted since the last settle: the general path
      RowStore::settle_keep_all();
      return;
    }
    const std::int64_t n = size();
    std::vector<std::int64_t> rows;
    if (n - vq_ > R_) {
      rows.resize(static_cast<std::size_t>(n - vq_ - R_));
      for (std::size_t j = 0; j < rows.size(); ++j) rows[j] = vq_ + static_cast<std::int64_t>(j);
      quantize_values(rows.data(), static_cast<std::int64_t>(rows.size()));
    }
    while (n - kq_ >= R_ + G_) {
      rows.resize(static_cast<std::size_t>(G_));
      for (std::size_t j = 0; j < rows.size(); ++j) rows[j] = kq_ + static_cast<std::int64_t>(j);
      quantize_keys(rows.data());
      live_quantized_ += G_;
    }
    const bool keys_left = kq_ > kbase_, values_left = vq_ > vbase_;
    if (keys_left) {
      drop_tail_front(tk_, kq_ - kbase_);
      kbase_ = kq_;
    }
    if (values_left) {
      drop_tail_front(tv_, vq_ - vbase_);
      vbase_ = vq_;
    }
    if (keys_left || values_left) give_back_capacity(keys_left, values_left);
  }

  // Values leave the tail one token at a time, as in the paper: the oldest live rows of the
  // value tail beyond residual_length are quantized, each on its own.
  void settle_values(const std::int64_t* live, std::int64_t n) {
    const std::int64_t* split =
        std::partition_point(live, live + n, [&](std::int64_t r) { return r < vq_; });
    const std::int64_t excess = (live + n - split) - R_;
    if (excess > 0) quantize_values(split, excess);
  }

  // Keys leave the tail a whole group at a time: whenever the live key tail holds
  // residual_length + G rows or more, its oldest G rows become one key group.
  void settle_keys(const std::int64_t* live, std::int64_t n) {
    const std::int64_t* split =
        std::partition_point(live, live + n, [&](std::int64_t r) { return r < kq_; });
    const std::int64_t n_quantized = split - live;
    if (n_quantized < live_quantized_) regroup(live, n);  // quantized rows were evicted
    live_quantized_ = n_quantized;
    for (const std::int64_t* first = split; live + n - first >= R_ + G_; first += G_) {
      quantize_keys(first);
      live_quantized_ += G_;
    }
  }

  // Quantizes the values of value-tail rows rows[0..count) (increasing, all >= vq_); vq_ moves
  // past the last. Tail rows evicted in between (dead until keep()) get zeroed parameters and
  // are never read.
  void quantize_values(const std::int64_t* rows, std::int64_t count) {
    const std::int64_t v_end = rows[count - 1] + 1;
    grow(vcodes_, static_cast<std::size_t>(v_end * row_bytes_));
    grow(vscale_, static_cast<std::size_t>(v_end * n_vgroups_));
    grow(vzero_, vscale_.size());
    std::vector<float> value(static_cast<std::size_t>(D_));
    for (std::int64_t j = 0; j < count; ++j) {
      load_value(rows[j], value.data());  // still the tail row: vq_ moves after the loop
      quantize_value_row(rows[j], value.data());
    }
    vq_ = v_end;
  }

  // Quantizes the keys of key-tail rows rows[0..G) (increasing, all >= kq_) as one new key
  // group. The group's physical range starts at kq_ and ends after its last row: tail rows
  // evicted in between (dead until keep()) fall inside it; their codes are copies of the
  // group's first row's, so they decode to a member's key and never widen a channel's range
  // (see write_key).
  void quantize_keys(const std::int64_t* rows) {
    std::vector<float> keys(static_cast<std::size_t>(G_ * D_));
    for (std::int64_t j = 0; j < G_; ++j) load_key(rows[j], keys.data() + j * D_);
    const std::int64_t q0 = kq_, r_end = rows[G_ - 1] + 1;
    grow(kcodes_, static_cast<std::size_t>(r_end * row_bytes_));
    grow(kscale_, kscale_.size() + static_cast<std::size_t>(D_));
    grow(kzero_, kzero_.size() + static_cast<std::size_t>(D_));
    grow(gstart_, gstart_.size() + 1);
    gstart_.back() = static_cast<std::int32_t>(q0);
    kq_ = r_end;
    quantize_key_group(static_cast<std::int64_t>(gstart_.size()) - 1, rows, G_, keys.data());
    const std::int64_t* member = rows;
    for (std::int64_t r = q0; r < r_end; ++r) {
      if (member < rows + G_ && *member == r) {
        ++member;
        continue;
      }
      std::memcpy(kcodes_.data() + r * row_bytes_, kcodes_.data() + rows[0] * row_bytes_,
                  static_cast<std::size_t>(row_bytes_));  // a dead row inside the range
    }
  }

  // Removes the first `n` slots of tail buffer `buf` (rows that left the tail).
  void drop_tail_front(std::vector<std::uint8_t>& buf, std::int64_t n) noexcept {
    const std::size_t drop = static_cast<std::size_t>(n) * tail_row_bytes_;
    std::memmove(buf.data(), buf.data() + drop, buf.size() - drop);
    buf.resize(buf.size() - drop);
  }

  // Evictions thin out key groups, and each group costs D scales and zeros whatever its size.
  // Consecutive groups whose live rows fit in one group together are re-quantized as one group
  // from their stored keys (left to right, greedily), so groups stay at least half full.
  void regroup(const std::int64_t* live, std::int64_t n) {
    struct Run {
      std::int64_t group;
      std::vector<std::int64_t> rows;
    };
    std::vector<Run> runs;  // live rows of each group with any, in order
    for (std::int64_t j = 0; j < n && live[j] < kq_; ++j) {
      const std::int64_t g = group_of(live[j]);
      if (runs.empty() || runs.back().group != g) runs.push_back(Run{g, {}});
      runs.back().rows.push_back(live[j]);
    }
    std::vector<std::pair<std::int64_t, std::int64_t>> merged_ranges;  // [first, last] groups
    std::vector<float> keys;
    std::size_t i = 0;
    while (i < runs.size()) {
      std::vector<std::int64_t> merged = runs[i].rows;
      std::size_t k = i + 1;
      while (k < runs.size() &&
             static_cast<std::int64_t>(merged.size() + runs[k].rows.size()) <= G_) {
        merged.insert(merged.end(), runs[k].rows.begin(), runs[k].rows.end());
        ++k;
      }
      if (k > i + 1) {
        keys.resize(merged.size() * static_cast<std::size_t>(D_));
        for (std::size_t j = 0; j < merged.size(); ++j) {
          load_key(merged[j], keys.data() + j * static_cast<std::size_t>(D_));
        }
        // The merged group keeps the first group's index (its parameters are overwritten);
        // the boundaries of the later groups up to the last merged one are removed below.
        quantize_key_group(runs[i].group, merged.data(), static_cast<std::int64_t>(merged.size()),
                           keys.data());
        merged_ranges.emplace_back(runs[i].group, runs[k - 1].group);
      }
      i = k;
    }
    for (auto it = merged_ranges.rbegin(); it != merged_ranges.rend(); ++it) {
      const auto from = static_cast<std::ptrdiff_t>(it->first + 1);
      const auto to = static_cast<std::ptrdiff_t>(it->second + 1);
      gstart_.erase(gstart_.begin() + from, gstart_.begin() + to);
      kscale_.erase(kscale_.begin() + from * D_, kscale_.begin() + to * D_);
      kzero_.erase(kzero_.begin() + from * D_, kzero_.begin() + to * D_);
    }
  }

  void keep(const std::int64_t* idx, std::int64_t n) override {
    // All rows kept (strictly increasing indices: the identity) and no tail row quantized
    // during the step: nothing moves.
    if (n == size() && kq_ == kbase_ && vq_ == vbase_) return;
    // Compaction in place: every array moves its kept entries towards the front (a kept row's
    // new index is never above its old one). Key groups are followed with a cursor:
    // gstart_[g + 1] is read before any write reaches index g + 1 (the ng-th kept group is
    // written at ng <= g).
    const std::int64_t n_groups = static_cast<std::int64_t>(gstart_.size());
    std::int64_t nqk = 0, nqv = 0, ntk = 0, ntv = 0, ng = 0, g = 0, last_group = -1;
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int64_t r = idx[j];
      VQ_ASSERT(r >= 0 && r < size() && (j == 0 || r > idx[j - 1]),
                "keep() needs strictly increasing row indices within the store");
      if (r < kq_) {
        while (g + 1 < n_groups && gstart_[static_cast<std::size_t>(g + 1)] <= r) ++g;
        if (g != last_group) {
          if (ng != g) {
            std::copy_n(kscale_.begin() + g * D_, D_, kscale_.begin() + ng * D_);
            std::copy_n(kzero_.begin() + g * D_, D_, kzero_.begin() + ng * D_);
          }
          gstart_[static_cast<std::size_t>(ng)] = static_cast<std::int32_t>(nqk);
          ++ng;
          last_group = g;
        }
        if (nqk != r) {
          std::memmove(kcodes_.data() + nqk * row_bytes_, kcodes_.data() + r * row_bytes_,
                       static_cast<std::size_t>(row_bytes_));
        }
        ++nqk;
      } else {
        const std::int64_t t = r - kbase_;
        if (ntk != t) std::memmove(tail_row(tk_, ntk), tail_row(tk_, t), tail_row_bytes_);
        ++ntk;
      }
      if (r < vq_) {
        if (nqv != r) {
          std::memmove(vcodes_.data() + nqv * row_bytes_, vcodes_.data() + r * row_bytes_,
                       static_cast<std::size_t>(row_bytes_));
          std::copy_n(vscale_.begin() + r * n_vgroups_, n_vgroups_,
                      vscale_.begin() + nqv * n_vgroups_);
          std::copy_n(vzero_.begin() + r * n_vgroups_, n_vgroups_,
                      vzero_.begin() + nqv * n_vgroups_);
        }
        ++nqv;
      } else {
        const std::int64_t t = r - vbase_;
        if (ntv != t) std::memmove(tail_row(tv_, ntv), tail_row(tv_, t), tail_row_bytes_);
        ++ntv;
      }
      pos_[static_cast<std::size_t>(j)] = pos_[static_cast<std::size_t>(r)];
    }
    kcodes_.resize(static_cast<std::size_t>(nqk * row_bytes_));
    vcodes_.resize(static_cast<std::size_t>(nqv * row_bytes_));
    vscale_.resize(static_cast<std::size_t>(nqv * n_vgroups_));
    vzero_.resize(vscale_.size());
    gstart_.resize(static_cast<std::size_t>(ng));
    kscale_.resize(static_cast<std::size_t>(ng * D_));
    kzero_.resize(kscale_.size());
    tk_.resize(static_cast<std::size_t>(ntk) * tail_row_bytes_);
    tv_.resize(static_cast<std::size_t>(ntv) * tail_row_bytes_);
    pos_.resize(static_cast<std::size_t>(n));
    const bool keys_left = kq_ > kbase_, values_left = vq_ > vbase_;
    kq_ = kbase_ = nqk;
    vq_ = vbase_ = nqv;
    give_back_capacity(keys_left, values_left);
  }

  void clear() noexcept override {
    kcodes_.clear(), vcodes_.clear(), vscale_.clear(), vzero_.clear(), kscale_.clear(),
        kzero_.clear(), gstart_.clear(), pos_.clear(), tk_.clear(), tv_.clear();
    kq_ = kbase_ = vq_ = vbase_ = 0;
    live_quantized_ = last_append_ = 0;
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
    return allocated_bytes() + cap_bytes(gstart_) + cap_bytes(pos_);
  }

 private:
  // Room for `rows` rows in tail buffer `buf`. The tail grows as the plain store's rows do
  // (store/growth.h, from the tail's capacity in rows), so while every row is in the tail the
  // store holds what the plain fp16 store holds; the step is capped at `cap` rows, the most the
  // tail holds after one decode token's append (keys: residual_length + G, values:
  // residual_length + 1).
  void grow_tail(std::vector<std::uint8_t>& buf, std::int64_t rows, std::int64_t cap) {
    const std::size_t need = static_cast<std::size_t>(rows) * tail_row_bytes_;
    if (need > buf.capacity()) {
      const std::size_t have = buf.capacity() / tail_row_bytes_;
      const std::size_t step = std::min(grown_rows(have, static_cast<std::size_t>(rows)),
                                        static_cast<std::size_t>(cap));
      buf.reserve(std::max(static_cast<std::size_t>(rows), step) * tail_row_bytes_);
    }
    buf.resize(need);
  }

  // Gives capacity back after a cut. The positions and the quantized rows after a large cut (a
  // prefill cut to the budget), as the plain store does, keeping room for one more position and
  // one more key group. The tails: after a step of several rows (a prompt) exactly their rows,
  // so a prompt costs no more than the plain store's exact prompt capacity; after a decode step
  // in which rows left a tail, its rows and one more (the key tail regrows to residual_length +
  // G rows at the next step but one, twice per G tokens; the value tail, which loses one row a
  // step, keeps residual_length + 1). Otherwise capacity is kept, so the steady state
  // reallocates nothing.
  void give_back_capacity(bool keys_left, bool values_left) {
    if (pos_.capacity() > 2 * pos_.size() + 64) shrink_to(pos_, pos_.size() + 1);
    const bool prompt = last_append_ > 1;
    const std::int64_t room = prompt ? 0 : 1;
    if (keys_left || prompt) shrink_tail(tk_, size() - kq_ + room);
    if (values_left || prompt) shrink_tail(tv_, size() - vq_ + room);
    const auto bytes_per_row = static_cast<std::size_t>(row_bytes_);
    if (kcodes_.capacity() / bytes_per_row > 2 * static_cast<std::size_t>(kq_) + 64) {
      shrink_to(kcodes_, static_cast<std::size_t>(kq_ + G_) * bytes_per_row);
    }
    if (vcodes_.capacity() / bytes_per_row > 2 * static_cast<std::size_t>(vq_) + 64) {
      shrink_to(vcodes_, static_cast<std::size_t>(vq_ + 1) * bytes_per_row);
      shrink_to(vscale_, static_cast<std::size_t>((vq_ + 1) * n_vgroups_));
      shrink_to(vzero_, vscale_.capacity());
    }
    if (gstart_.capacity() > 2 * gstart_.size() + 8) {
      shrink_to(gstart_, gstart_.size() + 1);
      shrink_to(kscale_, (gstart_.size() + 1) * static_cast<std::size_t>(D_));
      shrink_to(kzero_, kscale_.capacity());
    }
  }
  void shrink_tail(std::vector<std::uint8_t>& buf, std::int64_t rows) {
    const std::size_t cap = static_cast<std::size_t>(rows) * tail_row_bytes_;
    if (buf.capacity() > cap) shrink_to(buf, cap);
  }

  // Key group of quantized physical row i: the last group starting at or before it.
  std::int64_t group_of(std::int64_t i) const noexcept {
    return (std::upper_bound(gstart_.begin(), gstart_.end(), i) - gstart_.begin()) - 1;
  }
  std::int64_t group_begin(std::int64_t g) const noexcept {
    return gstart_[static_cast<std::size_t>(g)];
  }
  std::int64_t group_end(std::int64_t g) const noexcept {
    return g + 1 < static_cast<std::int64_t>(gstart_.size())
               ? gstart_[static_cast<std::size_t>(g + 1)]
               : kq_;
  }

  // Rows [first, size()) of a tail buffer whose slot 0 is row `base`, as plain rows.
  attn::RowSet tail_set(const std::vector<std::uint8_t>& buf, std::int64_t first,
                        std::int64_t base) const noexcept {
    attn::RowSet t;
    t.fmt = tail_dtype_ == DType::kF32 ? attn::Fmt::kF32 : attn::Fmt::kF16;
    t.data = buf.data() + static_cast<std::size_t>(first - base) * tail_row_bytes_;
    t.row_bytes = static_cast<std::int64_t>(tail_row_bytes_);
    t.positions = pos_.data() + first;
    t.n = size() - first;
    return t;
  }

  void* tail_row(std::vector<std::uint8_t>& buf, std::int64_t t) noexcept {
    return buf.data() + static_cast<std::size_t>(t) * tail_row_bytes_;
  }
  const void* tail_row(const std::vector<std::uint8_t>& buf, std::int64_t t) const noexcept {
    return buf.data() + static_cast<std::size_t>(t) * tail_row_bytes_;
  }
  float tail_at(const std::vector<std::uint8_t>& buf, std::int64_t t,
                std::int64_t d) const noexcept {
    const auto* row = static_cast<const std::uint8_t*>(tail_row(buf, t));
    if (tail_dtype_ == DType::kF32) {
      float x;
      std::memcpy(&x, row + d * 4, sizeof(float));
      return x;
    }
    std::uint16_t h;
    std::memcpy(&h, row + d * 2, sizeof(h));
    return half_to_float(h);
  }

  // Input row (b, h, s) of t converted straight into tail row `out` (no fp32 scratch).
  void copy_input(const TensorRef& t, std::int64_t b, std::int64_t h, std::int64_t s, void* out) {
    const std::int64_t off = b * t.stride[0] + h * t.stride[1] + s * t.stride[2];
    const void* src =
        static_cast<const char*>(t.data) + off * static_cast<std::int64_t>(dtype_size(t.dtype));
    if (t.dtype == tail_dtype_) {
      std::memcpy(out, src, tail_row_bytes_);
    } else if (t.dtype == DType::kF32) {
      kernels::f32_to_f16(static_cast<const float*>(src), static_cast<std::uint16_t*>(out), D_);
    } else {
      kernels::f16_to_f32(static_cast<const std::uint16_t*>(src), static_cast<float*>(out), D_);
    }
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

  // Parameters of the n values x[0], x[stride], ... (lowbit_params.h, see the header comment).
  void params(const float* x, std::int64_t n, std::int64_t stride, std::uint16_t* scale_h,
              std::uint16_t* zero_h, float* scale, float* zero) const noexcept {
    lowbit_params(x, n, stride, levels_, scale_h, zero_h, scale, zero);
  }
  std::uint32_t quantize(float x, float scale, float zero) const noexcept {
    return lowbit_code(x, scale, zero, levels_);
  }
  static float dequantize(std::uint32_t q, float scale, float zero) noexcept {
    return static_cast<float>(q) * scale + zero;
  }

  // Quantizes value row `in` into quantized row i (per token, groups of G channels).
  void quantize_value_row(std::int64_t i, const float* in) noexcept {
    std::uint8_t* codes = vcodes_.data() + i * row_bytes_;
    for (std::int64_t g = 0; g < n_vgroups_; ++g) {
      const std::int64_t c0 = g * G_, c1 = std::min(D_, c0 + G_);
      const std::size_t p = static_cast<std::size_t>(i * n_vgroups_ + g);
      float scale, zero;
      params(in + c0, c1 - c0, 1, &vscale_[p], &vzero_[p], &scale, &zero);
      for (std::int64_t c = c0; c < c1; ++c) set_code(codes, c, quantize(in[c], scale, zero));
    }
  }

  // Quantizes the keys x ([n][D] fp32) of quantized physical rows rows[0..n) as key group g,
  // per channel.
  void quantize_key_group(std::int64_t g, const std::int64_t* rows, std::int64_t n,
                          const float* x) noexcept {
    for (std::int64_t c = 0; c < D_; ++c) {
      const std::size_t p = static_cast<std::size_t>(g * D_ + c);
      float scale, zero;
      params(x + c, n, D_, &kscale_[p], &kzero_[p], &scale, &zero);
      for (std::int64_t i = 0; i < n; ++i) {
        set_code(kcodes_.data() + rows[i] * row_bytes_, c, quantize(x[i * D_ + c], scale, zero));
      }
    }
  }

  void state(StateIO& io, std::int64_t max_pos) override {
    io.vec(pos_, static_cast<std::uint64_t>(max_pos), "kivi positions");
    io.positions(pos_, max_pos, "kivi positions");
    const std::int64_t n = static_cast<std::int64_t>(pos_.size());
    io.bounded<std::int64_t>(kq_, 0, n, "kivi quantized keys");
    io.bounded<std::int64_t>(vq_, kq_, n, "kivi quantized values");
    io.bounded<std::int64_t>(live_quantized_, 0, n, "kivi live quantized rows");
    io.bounded<std::int64_t>(last_append_, 0, max_pos, "kivi last append");
    if (io.loading()) kbase_ = kq_, vbase_ = vq_;
    VQ_ASSERT(kbase_ == kq_ && vbase_ == vq_, "kivi: the tails start at the quantized rows between steps");
    const auto rb = static_cast<std::uint64_t>(row_bytes_);
    io.vec_exact(kcodes_, static_cast<std::uint64_t>(kq_) * rb, "kivi key codes");
    io.vec_exact(vcodes_, static_cast<std::uint64_t>(vq_) * rb, "kivi value codes");
    const auto vg = static_cast<std::uint64_t>(vq_ * n_vgroups_);
    io.vec_exact(vscale_, vg, "kivi value scales");
    io.vec_exact(vzero_, vg, "kivi value zeros");
    io.vec(gstart_, static_cast<std::uint64_t>(kq_), "kivi key groups");
    for (std::size_t g = 0; g < gstart_.size(); ++g) {
      const std::int64_t lo = g == 0 ? 0 : gstart_[g - 1] + 1;
      io.check((g != 0 || gstart_[0] == 0) && gstart_[g] >= lo && gstart_[g] < kq_,
               "kivi key groups: expected increasing group starts from 0 below " +
                   std::to_string(kq_) + ", found " + std::to_string(gstart_[g]));
    }
    const auto kg = static_cast<std::uint64_t>(gstart_.size()) * static_cast<std::uint64_t>(D_);
    io.vec_exact(kscale_, kg, "kivi key scales");
    io.vec_exact(kzero_, kg, "kivi key zeros");
    io.vec_exact(tk_, static_cast<std::uint64_t>(n - kq_) * tail_row_bytes_, "kivi key tail");
    io.vec_exact(tv_, static_cast<std::uint64_t>(n - vq_) * tail_row_bytes_, "kivi value tail");
  }

  int bits_;
  std::uint32_t levels_;
  std::int64_t G_, R_, D_;
  DType tail_dtype_;
  std::size_t tail_row_bytes_;  // D * tail_size
  std::int64_t row_bytes_, n_vgroups_;
  // Keys of physical rows [0, kq_) are quantized, of [kq_, size()) in the key tail; values of
  // rows [0, vq_) are quantized, of [vq_, size()) in the value tail; vq_ >= kq_ (values leave
  // the tail first). Between steps the quantized rows are exactly the first rows; during a
  // step, tail rows evicted before they left the tail may lie below kq_ / vq_ (dead until
  // keep()).
  std::int64_t kq_ = 0, vq_ = 0;
  // Key tail row r (r >= kbase_) is key tail slot r - kbase_, value tail row r (r >= vbase_)
  // value tail slot r - vbase_; kbase_ == kq_ and vbase_ == vq_ between steps, below them while
  // rows quantized during a step still occupy (dead) tail slots.
  std::int64_t kbase_ = 0, vbase_ = 0;
  // Quantized rows, indexed by physical row.
  std::vector<std::uint8_t> kcodes_;           // [kq_][row_bytes]
  std::vector<std::uint8_t> vcodes_;           // [vq_][row_bytes]
  std::vector<std::uint16_t> vscale_, vzero_;  // [vq_][n_vgroups] fp16
  // Key groups: group g is the physical rows [gstart_[g], gstart_[g + 1]) (the last one ends
  // at kq_), consecutive and in order.
  std::vector<std::int32_t> gstart_;           // [n_groups]
  std::vector<std::uint16_t> kscale_, kzero_;  // [n_groups][D] fp16
  // Tail rows, raw bytes of the tail dtype.
  std::vector<std::uint8_t> tk_;     // [size() - kbase_][D * tail_size]
  std::vector<std::uint8_t> tv_;     // [size() - vbase_][D * tail_size]
  std::vector<std::int32_t> pos_;    // [size()]
  std::int64_t live_quantized_ = 0;  // quantized rows alive at the last settle()
  std::int64_t last_append_ = 0;     // rows of the last append (> 1: a prompt step)
};

}  // namespace

std::unique_ptr<RowStore> make_kivi_store(int bits, std::int64_t group_size,
                                          std::int64_t residual_length, DType tail,
                                          std::int64_t head_dim) {
  return std::make_unique<KiviStore>(bits, group_size, residual_length, tail, head_dim);
}

}  // namespace vq::detail
