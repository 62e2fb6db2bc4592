// ggml's KV types (kv_dtype=q8_0 | q4_0): every kept row quantized per token in blocks of 32
// channels with an fp16 scale, as llama.cpp's --cache-type-k/-v q8_0|q4_0 (block_format.h).
//
// Layout per (batch, kv head), rows in physical order:
//  - keys and values alike: codes [n][code_bytes] (q8_0: head_dim bytes, one int8 per channel;
//    q4_0: head_dim / 2 bytes, ggml's nibble order within each block) and scales [n][blocks]
//    (fp16 bits, blocks = head_dim / 32). ggml interleaves each block's scale with its codes
//    (block_q8_0 = {d, qs[32]}); here the codes and the scales are two arrays (the same numbers,
//    the same bytes in all), so the attention kernels read a row's codes contiguously.
//  - A row is quantized when it is appended (as llama.cpp writes its KV cache), so the step's
//    own attention already reads the quantized row; per-token blocks depend on no other row, so
//    a chunk of tokens gives the state of the same tokens fed one at a time.
//  - A row written back (a merge blending an evicted row into a survivor, write_key /
//    write_value) is re-quantized from the blended fp32 row, which the cache computed from the
//    stored (dequantized) rows: one more rounding per merge, never a kept fp32 copy.
//  - bytes() = codes + scales (kept_bytes); resident_bytes() adds the positions; every container
//    by capacity. Containers grow as std::vector grows; a large cut (a prefill cut to a budget)
//    gives the memory back, keeping room for one more row.
// Attention reads the codes directly (packed_attention.h): per block, the query (scores) or the
// probability (value sums) is multiplied by the block's scale once.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "base/kernels.h"
#include "store/block_format.h"
#include "store/lowbit_params.h"
#include "store/packed_attention.h"
#include "store/store.h"
#include "veloxquant/errors.h"

namespace vq::detail {
namespace {

class BlockStore final : public RowStore, public PackedRows {
 public:
  BlockStore(bool q4, std::int64_t d)
      : q4_(q4), D_(d), nb_(d / kBlock32), code_bytes_(q4 ? d / 2 : d) {}

  std::int64_t size() const noexcept override { return static_cast<std::int64_t>(pos_.size()); }

  void append(const TensorRef& k, const TensorRef& v, std::int64_t b, std::int64_t h,
              std::int32_t first_pos) override {
    const std::int64_t S = k.tokens(), n0 = size();
    resize(n0 + S);
    std::vector<float> row(static_cast<std::size_t>(D_));
    for (std::int64_t s = 0; s < S; ++s) {
      read_input(k, b, h, s, row.data());
      quantize(row.data(), kc_, ks_, n0 + s);
      read_input(v, b, h, s, row.data());
      quantize(row.data(), vc_, vs_, n0 + s);
      pos_[static_cast<std::size_t>(n0 + s)] = first_pos + static_cast<std::int32_t>(s);
    }
  }

  HeadRows rows() const noexcept override { return packed_rows(this, pos_.data(), size(), D_); }

  void load_key(std::int64_t i, float* out) const noexcept override {
    for (std::int64_t c = 0; c < D_; ++c) out[c] = at(kc_, ks_, i, c);
  }
  void load_value(std::int64_t i, float* out) const noexcept override {
    for (std::int64_t c = 0; c < D_; ++c) out[c] = at(vc_, vs_, i, c);
  }
  float key_at(std::int64_t i, std::int64_t d) const noexcept override { return at(kc_, ks_, i, d); }
  float value_at(std::int64_t i, std::int64_t d) const noexcept override {
    return at(vc_, vs_, i, d);
  }

  void attend_scores(const float* q, std::int64_t n_q, std::int64_t pos, float* scores,
                     std::int64_t ld) const noexcept override {
    attn::token_scores(cpu::best_isa(), set(kc_, ks_), D_, q, n_q, pos, scores, ld);
  }
  void attend_values(const float* probs, std::int64_t n_q, std::int64_t ld, std::int64_t pos,
                     float* out, float* scratch) const noexcept override {
    std::fill(scratch, scratch + n_q * 4 * D_, 0.0f);
    attn::token_values(cpu::best_isa(), set(vc_, vs_), 0, D_, probs, n_q, ld, pos, scratch,
                       nullptr, 0);
    attn::finish_values(scratch, nullptr, 0, D_, n_q, D_, out);
  }

  void read_key(std::int64_t i, float* out) const noexcept override { load_key(i, out); }
  void read_value(std::int64_t i, float* out) const noexcept override { load_value(i, out); }
  void write_key(std::int64_t i, const float* in) noexcept override { quantize(in, kc_, ks_, i); }
  void write_value(std::int64_t i, const float* in) noexcept override {
    quantize(in, vc_, vs_, i);
  }
  void set_position(std::int64_t i, std::int32_t pos) noexcept override {
    pos_[static_cast<std::size_t>(i)] = pos;
  }

  void keep(const std::int64_t* idx, std::int64_t n) override {
    const auto cb = static_cast<std::size_t>(code_bytes_), nb = static_cast<std::size_t>(nb_);
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int64_t r = idx[j];
      VQ_ASSERT(r >= 0 && r < size() && (j == 0 || r > idx[j - 1]),
                "keep() needs strictly increasing row indices within the store");
      if (r == j) continue;
      const auto f = static_cast<std::size_t>(r), t = static_cast<std::size_t>(j);
      std::memmove(kc_.data() + t * cb, kc_.data() + f * cb, cb);
      std::memmove(vc_.data() + t * cb, vc_.data() + f * cb, cb);
      std::memmove(ks_.data() + t * nb, ks_.data() + f * nb, nb * sizeof(std::uint16_t));
      std::memmove(vs_.data() + t * nb, vs_.data() + f * nb, nb * sizeof(std::uint16_t));
      pos_[t] = pos_[f];
    }
    resize(n);
    if (pos_.capacity() > 2 * pos_.size() + 64) {  // a large cut: room for one more row
      shrink(kc_, (pos_.size() + 1) * cb);
      shrink(vc_, (pos_.size() + 1) * cb);
      shrink(ks_, (pos_.size() + 1) * nb);
      shrink(vs_, (pos_.size() + 1) * nb);
      shrink(pos_, pos_.size() + 1);
    }
  }

  void clear() noexcept override {
    kc_.clear();
    vc_.clear();
    ks_.clear();
    vs_.clear();
    pos_.clear();
  }

  std::int64_t bytes() const noexcept override {
    return static_cast<std::int64_t>(kc_.size() + vc_.size()) +
           2 * static_cast<std::int64_t>(ks_.size() + vs_.size());
  }
  std::int64_t allocated_bytes() const noexcept override {
    return cap_bytes(kc_) + cap_bytes(vc_) + cap_bytes(ks_) + cap_bytes(vs_);
  }
  std::int64_t resident_bytes() const noexcept override {
    return allocated_bytes() + cap_bytes(pos_);
  }

 private:
  template <typename T>
  static void shrink(std::vector<T>& v, std::size_t room) {
    std::vector<T>(v.begin(), v.end()).swap(v);
    v.reserve(room);
  }

  void resize(std::int64_t n) {
    const auto rows = static_cast<std::size_t>(n);
    kc_.resize(rows * static_cast<std::size_t>(code_bytes_));
    vc_.resize(kc_.size());
    ks_.resize(rows * static_cast<std::size_t>(nb_));
    vs_.resize(ks_.size());
    pos_.resize(rows);
  }

  attn::RowSet set(const std::vector<std::uint8_t>& codes,
                   const std::vector<std::uint16_t>& scales) const noexcept {
    attn::RowSet s;
    s.fmt = q4_ ? attn::Fmt::kQ4_0 : attn::Fmt::kQ8_0;
    s.data = codes.data();
    s.row_bytes = code_bytes_;
    s.scale = scales.data();
    s.param_stride = nb_;
    s.group = kBlock32;
    s.positions = pos_.data();
    s.n = size();
    return s;
  }

  // Row i's channel c, dequantized: code * d (q8_0) or (code - 8) * d (q4_0).
  float at(const std::vector<std::uint8_t>& codes, const std::vector<std::uint16_t>& scales,
           std::int64_t i, std::int64_t c) const noexcept {
    const std::uint8_t* row = codes.data() + i * code_bytes_;
    const float d = half_to_float(scales[static_cast<std::size_t>(i * nb_ + c / kBlock32)]);
    if (!q4_) return static_cast<float>(static_cast<std::int8_t>(row[c])) * d;
    const std::int64_t j = c % kBlock32;
    const std::uint8_t byte = row[(c / kBlock32) * 16 + j % 16];
    return static_cast<float>((j < 16 ? byte & 15 : byte >> 4) - 8) * d;
  }

  void quantize(const float* in, std::vector<std::uint8_t>& codes,
                std::vector<std::uint16_t>& scales, std::int64_t i) noexcept {
    std::uint8_t* row = codes.data() + i * code_bytes_;
    std::uint16_t* d = scales.data() + i * nb_;
    for (std::int64_t blk = 0; blk < nb_; ++blk) {
      if (q4_) {
        quantize_q4_0_block(in + blk * kBlock32, row + blk * 16, d + blk);
      } else {
        quantize_q8_0_block(in + blk * kBlock32, reinterpret_cast<std::int8_t*>(row) + blk * 32,
                            d + blk);
      }
    }
  }

  void read_input(const TensorRef& t, std::int64_t b, std::int64_t h, std::int64_t s, float* out) {
    const std::int64_t off = b * t.stride[0] + h * t.stride[1] + s * t.stride[2];
    const void* src =
        static_cast<const char*>(t.data) + off * static_cast<std::int64_t>(dtype_size(t.dtype));
    kernels::load_row(src, t.dtype, out, D_);
  }

  void state(StateIO& io, std::int64_t max_pos) override {
    io.vec(pos_, static_cast<std::uint64_t>(max_pos), "store positions");
    io.positions(pos_, max_pos, "store positions");
    const std::uint64_t n = pos_.size();
    io.vec_exact(kc_, n * static_cast<std::uint64_t>(code_bytes_), "store key codes");
    io.vec_exact(vc_, n * static_cast<std::uint64_t>(code_bytes_), "store value codes");
    io.vec_exact(ks_, n * static_cast<std::uint64_t>(nb_), "store key scales");
    io.vec_exact(vs_, n * static_cast<std::uint64_t>(nb_), "store value scales");
  }

  bool q4_;
  std::int64_t D_, nb_, code_bytes_;
  std::vector<std::uint8_t> kc_, vc_;   // [n][code_bytes]
  std::vector<std::uint16_t> ks_, vs_;  // [n][blocks] fp16 scales
  std::vector<std::int32_t> pos_;       // [n]
};

}  // namespace

std::unique_ptr<RowStore> make_block_store(bool q4_0, std::int64_t head_dim) {
  if (head_dim % kBlock32 != 0) {
    throw Error(ErrorCode::kInvalidConfig,
                std::string("kv_dtype=") + (q4_0 ? "q4_0" : "q8_0") +
                    " stores rows in blocks of 32 channels (ggml's format): head_dim must be a "
                    "multiple of 32, got " +
                    std::to_string(head_dim));
  }
  return std::make_unique<BlockStore>(q4_0, head_dim);
}

}  // namespace vq::detail
