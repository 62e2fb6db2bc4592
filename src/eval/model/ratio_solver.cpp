#include "eval/model/ratio_solver.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "veloxquant/errors.h"
#include "veloxquant/registry.h"
#include "veloxquant/types.h"

namespace vq::eval {

namespace {

// Bits of the KIVI storage `config` uses, or 0 for plain rows.
int kivi_bits(const CacheConfig& c) {
  if (c.has("bit_width_inlier")) return static_cast<int>(c.get_int("bit_width_inlier"));
  if (c.has("quantize")) {
    const std::string& q = c.get_enum("quantize");
    if (q == "kivi2") return 2;
    if (q == "kivi4") return 4;
  }
  return 0;
}

// Key channels ThinK keeps of head_dim d (policies/fields.h, think_kept_channels).
std::int64_t think_kept(const CacheConfig& c, std::int64_t d) {
  const double r = c.has("think") ? c.get_float("think") : 0.0;
  const auto pruned = static_cast<std::int64_t>(std::floor(r * static_cast<double>(d) + 1e-9));
  return d - std::min(pruned, d);
}

}  // namespace

std::int64_t full_cache_bytes(const KvShape& s, std::int64_t rows) {
  return rows * s.n_layers * s.n_kv_heads * s.head_dim * 2 * 2;
}

std::int64_t store_bytes(const CacheConfig& c, std::int64_t d, std::int64_t rows,
                         std::int64_t pruned_rows) {
  const auto row_size = static_cast<std::int64_t>(dtype_size(c.kv_dtype()));
  const int bits = kivi_bits(c);
  const std::int64_t kept = think_kept(c, d);
  if (bits == 0 && kept < d && pruned_rows > 0) {
    return pruned_rows * (kept + d) * row_size + (rows - pruned_rows) * 2 * d * row_size +
           2 * kept;
  }
  if (bits == 0) return rows * 2 * d * row_size;
  const std::int64_t g = c.get_int("kivi_group_size");
  const std::int64_t r = c.get_int("residual_length");
  // Keys leave the tail a group at a time, values one token at a time (kivi_store.cpp).
  const std::int64_t qk = rows > r ? g * ((rows - r) / g) : 0;
  const std::int64_t qv = rows > r ? rows - r : 0;
  const std::int64_t code_row = (d * bits + 7) / 8;
  const std::int64_t value_groups = (d + g - 1) / g;
  const std::int64_t keys = qk * code_row + (qk / g) * d * 4 + (rows - qk) * d * row_size;
  const std::int64_t values = qv * code_row + qv * value_groups * 4 + (rows - qv) * d * row_size;
  return keys + values;
}

std::int64_t demoted_row_bytes(const CacheConfig& c, std::int64_t head_dim) {
  if (!c.has("demote") || c.get_enum("demote") == "none") return 0;
  const std::int64_t bits = c.get_enum("demote") == "kivi2" ? 2 : 4;
  const std::int64_t group = std::min(c.get_int("demote_group"), head_dim);
  return 2 * ((head_dim * bits + 7) / 8) + 8 * ((head_dim + group - 1) / group);
}

std::int64_t predicted_kept_bytes(const CacheConfig& c, const KvShape& s, std::int64_t rows_seen) {
  const std::int64_t rows = has_token_budget(c) ? std::min(token_budget(c), rows_seen) : rows_seen;
  const std::int64_t pruned = s.prefill_rows >= 2 ? std::min(rows, s.prefill_rows) : 0;
  std::int64_t per_head = store_bytes(c, s.head_dim, rows, pruned);
  if (const std::int64_t row = demoted_row_bytes(c, s.head_dim); row > 0) {
    const std::int64_t cap = c.get_int("demote_budget") < 0 ? token_budget(c) : c.get_int("demote_budget");
    per_head += row * std::min(cap, rows_seen - rows);
  }
  return s.n_layers * s.n_kv_heads * per_head;
}

std::optional<BudgetChoice> solve_budget(const CacheConfig& config, const KvShape& shape,
                                         std::int64_t rows_seen, double ratio, std::int64_t offset,
                                         std::int64_t below, std::string* why) {
  if (!(ratio >= 1.0) || !std::isfinite(ratio)) {
    throw Error(ErrorCode::kInvalidArgument,
                "[eval] --ratio must be a finite number >= 1, got " + std::to_string(ratio));
  }
  const double target = static_cast<double>(full_cache_bytes(shape, rows_seen)) / ratio;
  std::string first_reason;
  std::int64_t smallest = -1;
  // Linear, from the largest budget down: a KIVI store's bytes are not monotone in its rows
  // (a key group leaving the fp16 tail shrinks it), so no bisection.
  const std::int64_t top = below > 0 ? std::min(rows_seen, below - 1) : rows_seen;
  for (std::int64_t b = top; b >= 1; --b) {
    CacheConfig c = config;
    try {
      c = with_token_budget(config, b);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kInvalidConfig) throw;
      if (first_reason.empty()) first_reason = e.what();  // the largest budget refused
      continue;
    }
    const std::int64_t bytes = predicted_kept_bytes(c, shape, rows_seen);
    if (smallest < 0 || bytes + offset < smallest) smallest = bytes + offset;
    if (static_cast<double>(bytes + offset) <= target) return BudgetChoice{c, b, bytes};
  }
  if (why != nullptr) {
    if (smallest >= 0) {
      *why = fmt::format(
          "every budget the method accepts holds at least {} bytes at the end of the text, more "
          "than full_bytes / {:g} = {:.0f}",
          smallest, ratio, target);
      if (!first_reason.empty()) *why += "; smaller budgets are refused: " + first_reason;
    } else {
      *why = first_reason.empty() ? "no budget below the ones already tried" : first_reason;
    }
  }
  return std::nullopt;
}

std::vector<WidthChoice> width_variants(const CacheConfig& config, const KvShape& shape,
                                        std::int64_t rows_seen) {
  std::vector<std::pair<std::string, std::string>> sets;
  if (config.has("bit_width_inlier")) {
    sets = {{"bit_width_inlier", "2"}, {"bit_width_inlier", "4"}};
  } else if (config.has("think") && config.get_float("think") > 0.0) {
    sets = {{"think", "0.25"}, {"think", "0.5"}, {"think", "0.75"}};
  } else if (config.has("quantize")) {
    sets = {{"quantize", "none"}, {"quantize", "kivi2"}, {"quantize", "kivi4"}};
  }
  std::vector<WidthChoice> out;
  const auto full = static_cast<double>(full_cache_bytes(shape, rows_seen));
  for (const auto& [key, value] : sets) {
    CacheConfig c = config;
    c.set_text(key, value);
    try {
      c.validate();
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kInvalidConfig) throw;
      continue;
    }
    const auto kept = static_cast<double>(predicted_kept_bytes(c, shape, rows_seen));
    out.push_back({c, kept > 0 ? full / kept : 1.0});
  }
  return out;
}

const WidthChoice& nearest_width(const std::vector<WidthChoice>& variants, double ratio) {
  VQ_ASSERT(!variants.empty(), "nearest_width needs at least one variant");
  std::size_t best = 0;
  for (std::size_t i = 1; i < variants.size(); ++i) {
    if (std::abs(std::log(variants[i].predicted_ratio / ratio)) <
        std::abs(std::log(variants[best].predicted_ratio / ratio)))
      best = i;
  }
  return variants[best];
}

}  // namespace vq::eval
