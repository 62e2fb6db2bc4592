#include "veloxquant/rows.h"

#include "base/kernels.h"

namespace vq {

float HeadRows::key(std::int64_t row, std::int64_t d) const noexcept {
  if (packed != nullptr) return packed->key_at(row, d);
  const std::int64_t off = row * row_stride + d;
  return dtype == DType::kF32 ? static_cast<const float*>(keys)[off]
                              : half_to_float(static_cast<const std::uint16_t*>(keys)[off]);
}

float HeadRows::value(std::int64_t row, std::int64_t d) const noexcept {
  if (packed != nullptr) return packed->value_at(row, d);
  const std::int64_t off = row * row_stride + d;
  return dtype == DType::kF32 ? static_cast<const float*>(values)[off]
                              : half_to_float(static_cast<const std::uint16_t*>(values)[off]);
}

void HeadRows::load_key(std::int64_t row, float* out) const noexcept {
  if (packed != nullptr) {
    packed->load_key(row, out);
  } else {
    kernels::load_row(key_row(row), dtype, out, row_stride);
  }
}

void PackedRows::load_rows(std::int64_t r0, std::int64_t r1, std::int64_t stride, float* keys,
                           float* values) const noexcept {
  for (std::int64_t r = r0; r < r1; ++r) {
    if (keys != nullptr) load_key(r, keys + (r - r0) * stride);
    if (values != nullptr) load_value(r, values + (r - r0) * stride);
  }
}

HeadRows dequantized(const HeadRows& rows, std::vector<float>& keys, std::vector<float>& values) {
  if (rows.packed == nullptr) return rows;
  const std::int64_t D = rows.row_stride;
  keys.resize(static_cast<std::size_t>(rows.n_rows * D));
  values.resize(keys.size());
  rows.packed->load_rows(0, rows.n_rows, D, keys.data(), values.data());
  HeadRows out = rows;
  out.keys = keys.data();
  out.values = values.data();
  out.dtype = DType::kF32;
  out.packed = nullptr;
  return out;
}

}  // namespace vq
