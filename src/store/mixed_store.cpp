// Mixed precision (demote=kivi2|kivi4 on an eviction method): the method's rows stay in fp16
// (kv_dtype), and a row the method evicts is demoted to a low-bit tier instead of dropped.
//
// Paper: Yang et al., "No Token Left Behind: Reliable KV Cache Compression via Importance-Aware
// Mixed Precision Quantization", 2024 (MiKV). Deviation: MiKV keeps every evicted row; here the
// low-bit tier holds at most `cap` rows (demote_budget) so the cache stays bounded, and when it
// overflows the lowest-scored demoted rows are dropped.
//
// Layout per (batch, kv head), in physical order:
//   [fp16 rows kept at the last keep()] [demoted rows] [fp16 rows appended since]
// so the method's rows read as before (sinks first) and a step's new rows are the last S.
//  - Demoted rows are quantized per token: keys and values alike in groups of G consecutive
//    channels (the last group may be shorter), each group with an fp16 scale and zero, codes
//    `bits` wide packed row by row (ceil(D * bits / 8) bytes for the key, again for the value).
//    Per-channel key groups (KIVI's keys) would span G demoted rows; rows are demoted one at a
//    time in whatever order the method evicts them and leave the tier in score order, so such a
//    group would need rows held unquantized until it fills and re-quantization whenever a member
//    leaves. A per-token group is self-contained: each demoted row is quantized once, from its
//    fp16 values, and never re-quantized (no compounding error).
//  - Parameters of a group with minimum lo and maximum hi (as KIVI's store, kivi_store.cpp):
//      zero  = the largest fp16 <= lo,
//      scale = the smallest fp16 >= max((hi - zero) / (2^bits - 1), 2^-14),
//      q = clamp(floor((x - zero) / scale + 0.5), 0, 2^bits - 1),  x' = q * scale + zero,
//    so every value is within scale / 2 of its code (up to fp32 rounding).
//  - demote(i, score) during a step only records the row (physical indices stay valid for the
//    rest of the step, and the step view keeps reading it); keep() quantizes the recorded rows
//    into the tier, appended after the rows already there, then drops the tier's lowest rows
//    while it holds more than `cap`: lowest score first, NaN below everything, ties to the lowest
//    position (the oldest). The set kept is the top `cap` of every row ever demoted under that
//    order, whatever the order of the demotions, so a chunk of tokens gives the state of the
//    same tokens fed one at a time. A demoted row is never promoted back to fp16.
//  - bytes() = fp16 rows + codes + scales + zeros (kept_bytes); resident_bytes() adds positions
//    and the tier's scores, every container by capacity. No dequantized copy is kept: rows() of
//    a store holding demoted rows is packed (PackedRows, dispatching per row; attention reads the
//    tier's codes, packed_attention.h).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "base/kernels.h"
#include "store/lowbit_params.h"
#include "store/packed_attention.h"
#include "store/packed_codes.h"
#include "store/store.h"
#include "veloxquant/errors.h"

namespace vq::detail {
namespace {

class MixedStore final : public RowStore, public PackedRows {
 public:
  MixedStore(int bits, std::int64_t group, std::int64_t cap, DType dtype, std::int64_t d)
      : bits_(bits),
        levels_((1u << bits) - 1),
        G_(std::min(group, d)),
        cap_(cap),
        D_(d),
        dtype_(dtype),
        row_size_(d * static_cast<std::int64_t>(dtype_size(dtype))),
        code_bytes_((d * bits + 7) / 8),
        n_groups_((d + G_ - 1) / G_) {
    VQ_ASSERT(bits == 2 || bits == 4, "demote bits must be 2 or 4");
    VQ_ASSERT(cap >= 0 && group >= 1, "demote cap must be >= 0 and group >= 1");
  }

  std::int64_t size() const noexcept override { return static_cast<std::int64_t>(pos_.size()); }
  bool demotes() const noexcept override { return true; }
  std::int64_t n_demoted() const noexcept override { return n_demoted_; }
  float demoted_score(std::int64_t k) const noexcept override {
    return dscore_[static_cast<std::size_t>(k)];
  }
  std::int64_t dropped() const noexcept override { return dropped_; }

  void demote(std::int64_t i, float score) override {
    VQ_ASSERT(is_fp16(i), "demote() needs an fp16 row");
    pending_.push_back(Pending{i, score});
  }

  void append(const TensorRef& k, const TensorRef& v, std::int64_t b, std::int64_t h,
              std::int32_t first_pos) override {
    const std::int64_t S = k.tokens();
    const std::int64_t slots = n_fp16_slots();
    fk_.resize(static_cast<std::size_t>((slots + S) * row_size_));
    fv_.resize(fk_.size());
    std::vector<float> row(static_cast<std::size_t>(D_));
    for (std::int64_t s = 0; s < S; ++s) {
      read_input(k, b, h, s, row.data());
      kernels::store_row(row.data(), dtype_, fk_.data() + (slots + s) * row_size_, D_);
      read_input(v, b, h, s, row.data());
      kernels::store_row(row.data(), dtype_, fv_.data() + (slots + s) * row_size_, D_);
      pos_.push_back(first_pos + static_cast<std::int32_t>(s));
    }
  }

  HeadRows rows() const noexcept override {
    if (n_demoted_ == 0) {  // every row is fp16: physical row i is fp16 slot i
      return HeadRows{fk_.data(), fv_.data(), pos_.data(), dtype_, size(), D_};
    }
    return packed_rows(this, pos_.data(), size(), D_);
  }

  void load_key(std::int64_t i, float* out) const noexcept override {
    if (is_fp16(i)) {
      kernels::load_row(fk_.data() + fp16_slot(i) * row_size_, dtype_, out, D_);
    } else {
      dequantize_row(kc_, ks_, kz_, i - n_front_, out);
    }
  }
  void load_value(std::int64_t i, float* out) const noexcept override {
    if (is_fp16(i)) {
      kernels::load_row(fv_.data() + fp16_slot(i) * row_size_, dtype_, out, D_);
    } else {
      dequantize_row(vc_, vs_, vz_, i - n_front_, out);
    }
  }
  float key_at(std::int64_t i, std::int64_t d) const noexcept override {
    return element(fk_, kc_, ks_, kz_, i, d);
  }
  float value_at(std::int64_t i, std::int64_t d) const noexcept override {
    return element(fv_, vc_, vs_, vz_, i, d);
  }
  // Fused attention (packed_attention.h), three runs of rows: the fp16 rows before the tier,
  // the tier (per token: the query / probability folded into each group's scale, the zeros
  // summed apart), the fp16 rows after it.
  void attend_scores(const float* q, std::int64_t n_q, std::int64_t pos, float* scores,
                     std::int64_t ld) const noexcept override {
    const cpu::Isa isa = cpu::best_isa();
    for (const Run& run : runs(true)) {
      attn::token_scores(isa, run.rows, D_, q, n_q, pos, scores + run.first, ld);
    }
  }
  void attend_values(const float* probs, std::int64_t n_q, std::int64_t ld, std::int64_t pos,
                     float* out, float* scratch) const noexcept override {
    const cpu::Isa isa = cpu::best_isa();
    float* A = scratch;                // [n_q][4][D]
    float* Z = scratch + n_q * 4 * D_;  // [n_q][4][n_groups]
    std::fill(scratch, scratch + n_q * 4 * (D_ + n_groups_), 0.0f);
    for (const Run& run : runs(false)) {
      attn::token_values(isa, run.rows, run.first, D_, probs + run.first, n_q, ld, pos, A,
                         run.rows.fmt == attn::Fmt::kU2 || run.rows.fmt == attn::Fmt::kU4 ? Z
                                                                                         : nullptr,
                         n_groups_);
    }
    attn::finish_values(A, n_demoted_ > 0 ? Z : nullptr, n_groups_, G_, n_q, D_, out);
  }

  void read_key(std::int64_t i, float* out) const noexcept override { load_key(i, out); }
  void read_value(std::int64_t i, float* out) const noexcept override { load_value(i, out); }
  void write_key(std::int64_t i, const float* in) noexcept override {
    if (is_fp16(i)) {
      kernels::store_row(in, dtype_, fk_.data() + fp16_slot(i) * row_size_, D_);
    } else {
      quantize_row(in, kc_, ks_, kz_, i - n_front_);
    }
  }
  void write_value(std::int64_t i, const float* in) noexcept override {
    if (is_fp16(i)) {
      kernels::store_row(in, dtype_, fv_.data() + fp16_slot(i) * row_size_, D_);
    } else {
      quantize_row(in, vc_, vs_, vz_, i - n_front_);
    }
  }
  void set_position(std::int64_t i, std::int32_t pos) noexcept override {
    pos_[static_cast<std::size_t>(i)] = pos;
  }

  void keep(const std::int64_t* idx, std::int64_t n) override {
    // Physical rows map to fp16 slots by the layout before this call (idx and pending_ are
    // physical), so the tier's new size is applied only at the end.
    const std::int64_t old_demoted = n_demoted_;
    std::int64_t tier = old_demoted;
    // 1. The rows demoted this step join the tier, after the rows already there.
    std::vector<std::int32_t> dpos(pos_.begin() + n_front_, pos_.begin() + n_front_ + old_demoted);
    if (!pending_.empty()) {
      std::vector<float> row(static_cast<std::size_t>(D_));
      for (const Pending& p : pending_) {
        const std::int64_t k = tier++;
        grow_tier(tier);
        kernels::load_row(fk_.data() + fp16_slot(p.row) * row_size_, dtype_, row.data(), D_);
        quantize_row(row.data(), kc_, ks_, kz_, k);
        kernels::load_row(fv_.data() + fp16_slot(p.row) * row_size_, dtype_, row.data(), D_);
        quantize_row(row.data(), vc_, vs_, vz_, k);
        dscore_[static_cast<std::size_t>(k)] = p.score;
        dpos.push_back(pos_[static_cast<std::size_t>(p.row)]);
      }
      pending_.clear();
    }
    // 2. Over the cap: drop the lowest (NaN first, then by score, ties to the oldest position).
    if (tier > cap_) {
      std::vector<std::int64_t> order(static_cast<std::size_t>(tier));
      std::iota(order.begin(), order.end(), std::int64_t{0});
      std::sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
        const float x = dscore_[static_cast<std::size_t>(a)],
                    y = dscore_[static_cast<std::size_t>(b)];
        if (std::isnan(x) != std::isnan(y)) return std::isnan(x);
        if (!std::isnan(x) && x != y) return x < y;
        return dpos[static_cast<std::size_t>(a)] < dpos[static_cast<std::size_t>(b)];
      });
      std::vector<char> drop(static_cast<std::size_t>(tier), 0);
      for (std::int64_t j = 0; j < tier - cap_; ++j)
        drop[static_cast<std::size_t>(order[static_cast<std::size_t>(j)])] = 1;
      std::int64_t out = 0;
      for (std::int64_t k = 0; k < tier; ++k) {
        if (drop[static_cast<std::size_t>(k)] != 0) continue;
        if (k != out) move_tier_row(k, out);
        dpos[static_cast<std::size_t>(out)] = dpos[static_cast<std::size_t>(k)];
        ++out;
      }
      dropped_ += tier - out;
      tier = out;
      dpos.resize(static_cast<std::size_t>(out));
      grow_tier(tier);
    }
    // 3. The fp16 rows kept, compacted in order; positions rebuilt in the new physical order.
    std::vector<std::int32_t> fpos(static_cast<std::size_t>(n));
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int64_t src = idx[j];
      VQ_ASSERT(is_fp16(src) && (j == 0 || src > idx[j - 1]),
                "keep() needs strictly increasing fp16 rows");
      fpos[static_cast<std::size_t>(j)] = pos_[static_cast<std::size_t>(src)];
      const std::int64_t slot = fp16_slot(src);
      if (slot == j) continue;
      std::memcpy(fk_.data() + j * row_size_, fk_.data() + slot * row_size_,
                  static_cast<std::size_t>(row_size_));
      std::memcpy(fv_.data() + j * row_size_, fv_.data() + slot * row_size_,
                  static_cast<std::size_t>(row_size_));
    }
    fk_.resize(static_cast<std::size_t>(n * row_size_));
    fv_.resize(fk_.size());
    pos_.assign(fpos.begin(), fpos.end());
    pos_.insert(pos_.end(), dpos.begin(), dpos.end());
    n_front_ = n;
    n_demoted_ = tier;
    // A large cut (a prefill cut to the budget) gives the memory back, keeping room for one
    // more fp16 row (as the plain store does).
    if (pos_.capacity() > 2 * pos_.size() + 64) {
      shrink(fk_, static_cast<std::size_t>((n + 1) * row_size_));
      shrink(fv_, static_cast<std::size_t>((n + 1) * row_size_));
      shrink(pos_, pos_.size() + 1);
    }
    // The same for the tier (a prefill demotes every evicted prompt row before the cap cuts it)
    // and the demotion list, with room for one more demoted row.
    if (dscore_.capacity() > 2 * dscore_.size() + 64) {
      const auto rows = static_cast<std::size_t>(tier + 1);
      shrink(kc_, rows * static_cast<std::size_t>(code_bytes_));
      shrink(vc_, rows * static_cast<std::size_t>(code_bytes_));
      for (auto* p : {&ks_, &kz_, &vs_, &vz_})
        shrink(*p, rows * static_cast<std::size_t>(n_groups_));
      shrink(dscore_, rows);
    }
    if (pending_.capacity() > 64) shrink(pending_, 1);
  }

  void clear() noexcept override {
    fk_.clear();
    fv_.clear();
    pos_.clear();
    kc_.clear();
    vc_.clear();
    ks_.clear();
    kz_.clear();
    vs_.clear();
    vz_.clear();
    dscore_.clear();
    pending_.clear();
    n_front_ = n_demoted_ = dropped_ = 0;
  }

  std::int64_t bytes() const noexcept override {
    return static_cast<std::int64_t>(fk_.size() + fv_.size() + kc_.size() + vc_.size()) +
           2 * static_cast<std::int64_t>(ks_.size() + kz_.size() + vs_.size() + vz_.size());
  }
  std::int64_t allocated_bytes() const noexcept override {
    return cap_bytes(fk_) + cap_bytes(fv_) + cap_bytes(kc_) + cap_bytes(vc_) + cap_bytes(ks_) +
           cap_bytes(kz_) + cap_bytes(vs_) + cap_bytes(vz_);
  }
  std::int64_t resident_bytes() const noexcept override {
    return allocated_bytes() + cap_bytes(pos_) + cap_bytes(dscore_) + cap_bytes(pending_);
  }

 private:
  struct Pending {
    std::int64_t row;  // physical fp16 row
    float score;       // the method's score when it demoted the row
  };

  struct Run {
    std::int64_t first;  // physical index of the run's first row
    attn::RowSet rows;
  };
  // The rows in physical order as three runs (keys or values).
  std::array<Run, 3> runs(bool keys) const noexcept {
    const attn::Fmt plain = dtype_ == DType::kF32 ? attn::Fmt::kF32 : attn::Fmt::kF16;
    const std::uint8_t* fp = keys ? fk_.data() : fv_.data();
    std::array<Run, 3> r{};
    r[0].first = 0;
    r[0].rows.fmt = plain;
    r[0].rows.data = fp;
    r[0].rows.row_bytes = row_size_;
    r[0].rows.positions = pos_.data();
    r[0].rows.n = n_front_;
    r[1].first = n_front_;
    r[1].rows.fmt = bits_ == 2 ? attn::Fmt::kU2 : attn::Fmt::kU4;
    r[1].rows.data = keys ? kc_.data() : vc_.data();
    r[1].rows.row_bytes = code_bytes_;
    r[1].rows.scale = keys ? ks_.data() : vs_.data();
    r[1].rows.zero = keys ? kz_.data() : vz_.data();
    r[1].rows.param_stride = n_groups_;
    r[1].rows.group = G_;
    r[1].rows.positions = pos_.data() + n_front_;
    r[1].rows.n = n_demoted_;
    r[2].first = n_front_ + n_demoted_;
    r[2].rows = r[0].rows;
    r[2].rows.data = fp + n_front_ * row_size_;
    r[2].rows.positions = pos_.data() + r[2].first;
    r[2].rows.n = size() - r[2].first;
    return r;
  }

  std::int64_t n_fp16_slots() const noexcept {
    return static_cast<std::int64_t>(fk_.size()) / row_size_;
  }
  bool is_fp16(std::int64_t i) const noexcept { return i < n_front_ || i >= n_front_ + n_demoted_; }
  std::int64_t fp16_slot(std::int64_t i) const noexcept {
    return i < n_front_ ? i : i - n_demoted_;
  }

  template <typename T>
  static void shrink(std::vector<T>& v, std::size_t room) {
    std::vector<T>(v.begin(), v.end()).swap(v);
    v.reserve(room);
  }

  // Sizes the tier's containers for n rows.
  void grow_tier(std::int64_t n) {
    const auto rows = static_cast<std::size_t>(n);
    kc_.resize(rows * static_cast<std::size_t>(code_bytes_));
    vc_.resize(kc_.size());
    ks_.resize(rows * static_cast<std::size_t>(n_groups_));
    kz_.resize(ks_.size());
    vs_.resize(ks_.size());
    vz_.resize(ks_.size());
    dscore_.resize(rows);
  }
  void move_tier_row(std::int64_t from, std::int64_t to) noexcept {
    const auto cb = static_cast<std::size_t>(code_bytes_), g = static_cast<std::size_t>(n_groups_);
    const auto f = static_cast<std::size_t>(from), t = static_cast<std::size_t>(to);
    std::memcpy(kc_.data() + t * cb, kc_.data() + f * cb, cb);
    std::memcpy(vc_.data() + t * cb, vc_.data() + f * cb, cb);
    for (auto* p : {&ks_, &kz_, &vs_, &vz_}) {
      std::memcpy(p->data() + t * g, p->data() + f * g, g * sizeof(std::uint16_t));
    }
    dscore_[t] = dscore_[f];
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

  // Quantizes row `in` [D] into tier row k of (codes, scale, zero).
  void quantize_row(const float* in, std::vector<std::uint8_t>& codes,
                    std::vector<std::uint16_t>& scale, std::vector<std::uint16_t>& zero,
                    std::int64_t k) noexcept {
    std::uint8_t* row = codes.data() + k * code_bytes_;
    std::memset(row, 0, static_cast<std::size_t>(code_bytes_));
    for (std::int64_t g = 0; g < n_groups_; ++g) {
      const std::int64_t c0 = g * G_, c1 = std::min(D_, c0 + G_);
      const std::size_t p = static_cast<std::size_t>(k * n_groups_ + g);
      float s, z;
      lowbit_params(in + c0, c1 - c0, 1, levels_, &scale[p], &zero[p], &s, &z);
      for (std::int64_t c = c0; c < c1; ++c) {
        const std::int64_t bit = c * bits_;
        row[bit / 8] = static_cast<std::uint8_t>(row[bit / 8] |
                                                 (lowbit_code(in[c], s, z, levels_) << (bit % 8)));
      }
    }
  }
  void dequantize_row(const std::vector<std::uint8_t>& codes,
                      const std::vector<std::uint16_t>& scale,
                      const std::vector<std::uint16_t>& zero, std::int64_t k,
                      float* out) const noexcept {
    unpack_codes(codes.data() + k * code_bytes_, bits_, D_, out);  // out[c] = code c
    for (std::int64_t g = 0; g < n_groups_; ++g) {
      const std::size_t p = static_cast<std::size_t>(k * n_groups_ + g);
      const float s = half_to_float(scale[p]), z = half_to_float(zero[p]);
      const std::int64_t c1 = std::min(D_, (g + 1) * G_);
      for (std::int64_t c = g * G_; c < c1; ++c) out[c] = out[c] * s + z;
    }
  }
  float element(const std::vector<std::uint8_t>& fp16, const std::vector<std::uint8_t>& codes,
                const std::vector<std::uint16_t>& scale, const std::vector<std::uint16_t>& zero,
                std::int64_t i, std::int64_t d) const noexcept {
    if (is_fp16(i)) {
      float x;
      kernels::load_row(fp16.data() + fp16_slot(i) * row_size_ +
                            d * static_cast<std::int64_t>(dtype_size(dtype_)),
                        dtype_, &x, 1);
      return x;
    }
    const std::int64_t k = i - n_front_;
    const std::size_t p = static_cast<std::size_t>(k * n_groups_ + d / G_);
    return static_cast<float>(code_at(codes.data() + k * code_bytes_, d)) *
               half_to_float(scale[p]) +
           half_to_float(zero[p]);
  }

  void state(StateIO& io, std::int64_t max_pos) override {
    VQ_ASSERT(pending_.empty(), "mixed store: nothing is pending between steps");
    io.vec(pos_, static_cast<std::uint64_t>(max_pos), "mixed positions");
    io.positions(pos_, max_pos, "mixed positions");
    const std::int64_t n = static_cast<std::int64_t>(pos_.size());
    io.bounded<std::int64_t>(n_demoted_, 0, std::min(n, cap_), "mixed demoted rows");
    io.bounded<std::int64_t>(n_front_, 0, n - n_demoted_, "mixed front rows");
    io.bounded<std::int64_t>(dropped_, 0, max_pos, "mixed dropped rows");
    const auto nd = static_cast<std::uint64_t>(n_demoted_);
    const auto fp = static_cast<std::uint64_t>(n - n_demoted_) * static_cast<std::uint64_t>(row_size_);
    io.vec_exact(fk_, fp, "mixed keys");
    io.vec_exact(fv_, fp, "mixed values");
    io.vec_exact(kc_, nd * static_cast<std::uint64_t>(code_bytes_), "mixed key codes");
    io.vec_exact(vc_, nd * static_cast<std::uint64_t>(code_bytes_), "mixed value codes");
    const auto ng = nd * static_cast<std::uint64_t>(n_groups_);
    io.vec_exact(ks_, ng, "mixed key scales");
    io.vec_exact(kz_, ng, "mixed key zeros");
    io.vec_exact(vs_, ng, "mixed value scales");
    io.vec_exact(vz_, ng, "mixed value zeros");
    io.vec_exact(dscore_, nd, "mixed demoted scores");
  }

  int bits_;
  std::uint32_t levels_;
  std::int64_t G_, cap_, D_;
  DType dtype_;
  std::int64_t row_size_;  // bytes of one fp16 (kv_dtype) row
  std::int64_t code_bytes_, n_groups_;
  // fp16 tier: slots [0, n_front_) are physical rows [0, n_front_), later slots follow the
  // demoted rows.
  std::vector<std::uint8_t> fk_, fv_;  // [n_fp16_slots][D] in kv_dtype
  // Demoted tier, physical rows [n_front_, n_front_ + n_demoted_).
  std::vector<std::uint8_t> kc_, vc_;             // [n_demoted][code_bytes]
  std::vector<std::uint16_t> ks_, kz_, vs_, vz_;  // [n_demoted][n_groups] fp16
  std::vector<float> dscore_;                     // [n_demoted] the method's score at demotion
  std::vector<std::int32_t> pos_;                 // [n] physical order
  std::vector<Pending> pending_;                  // rows demoted during the open step
  std::int64_t n_front_ = 0, n_demoted_ = 0;
  std::int64_t dropped_ = 0;  // rows dropped from the tier since clear()
};

}  // namespace

std::unique_ptr<RowStore> make_mixed_store(int bits, std::int64_t group_size, std::int64_t cap,
                                           DType fp16_dtype, std::int64_t head_dim) {
  return std::make_unique<MixedStore>(bits, group_size, cap, fp16_dtype, head_dim);
}

}  // namespace vq::detail
