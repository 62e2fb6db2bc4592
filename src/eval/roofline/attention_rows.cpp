#include "eval/roofline/attention_rows.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "base/cpu.h"
#include "engine/compute/ops.h"
#include "engine/compute/parallel.h"
#include "eval/roofline/counter_rng.h"
#include "store/packed_attention.h"
#include "veloxquant/types.h"

namespace vq::eval {
namespace {

using Clock = std::chrono::steady_clock;
namespace attn = vq::detail::attn;
constexpr std::int64_t kGroup = kAttentionGroup;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
std::size_t sz(std::int64_t n) { return static_cast<std::size_t>(n); }
std::int64_t round_up(std::int64_t a, std::int64_t b) { return (a + b - 1) / b * b; }

struct AttnFormat {
  const char* name;
  attn::Fmt fmt;
  bool kivi;  // keys per channel (groups of 32 tokens), values per token, asymmetric
};
constexpr AttnFormat kAttnFormats[] = {{"f16", attn::Fmt::kF16, false},
                                       {"q8_0", attn::Fmt::kQ8_0, false},
                                       {"q4_0", attn::Fmt::kQ4_0, false},
                                       {"kivi2", attn::Fmt::kU2, true},
                                       {"kivi4", attn::Fmt::kU4, true}};

std::int64_t code_row_bytes(attn::Fmt f, std::int64_t D) {
  switch (f) {
    case attn::Fmt::kF32:
      return 4 * D;
    case attn::Fmt::kF16:
      return 2 * D;
    case attn::Fmt::kQ8_0:
      return D;
    case attn::Fmt::kQ4_0:
    case attn::Fmt::kU4:
      return D / 2;
    case attn::Fmt::kU2:
      return D / 4;
  }
  return 0;
}

// One KV head's rows: codes, fp16 parameters and positions, as the stores keep them.
struct Head {
  std::vector<std::uint8_t> k, v;
  std::vector<std::uint16_t> kscale, kzero, vscale, vzero;
  std::vector<std::int32_t> pos;

  // Bytes the kernels read for one step (the header's formula, from the sizes held).
  std::int64_t bytes() const {
    const auto b = [](const auto& a) { return static_cast<std::int64_t>(a.size() * sizeof(a[0])); };
    return b(k) + b(v) + b(kscale) + b(kzero) + b(vscale) + b(vzero) + b(pos);
  }
};

Head make_head(const AttnFormat& f, std::int64_t N, std::int64_t D, std::uint64_t seed,
               std::uint64_t key) {
  Head h;
  const std::int64_t rb = code_row_bytes(f.fmt, D);
  h.k.resize(sz(N * rb));
  h.v.resize(sz(N * rb));
  if (f.fmt == attn::Fmt::kF16) {
    auto* k = reinterpret_cast<std::uint16_t*>(h.k.data());
    auto* v = reinterpret_cast<std::uint16_t*>(h.v.data());
    for (std::int64_t i = 0; i < N * D; ++i) {
      k[i] = float_to_half(counter_uniform(seed, key, 2 * i, 1.0f));
      v[i] = float_to_half(counter_uniform(seed, key, 2 * i + 1, 1.0f));
    }
  } else {
    for (std::size_t i = 0; i < h.k.size(); ++i) {
      const std::uint64_t w = counter_mix(seed, key, i);
      h.k[i] = static_cast<std::uint8_t>(w);
      h.v[i] = static_cast<std::uint8_t>(w >> 8);
    }
  }
  const auto halves = [&](std::int64_t n, float base, float spread, std::uint64_t k2) {
    std::vector<std::uint16_t> out(sz(n));
    for (std::int64_t i = 0; i < n; ++i)
      out[sz(i)] = float_to_half(base + counter_uniform(seed, k2, i, spread));
    return out;
  };
  const std::int64_t groups = (D + kGroup - 1) / kGroup;  // per-token parameter groups
  if (f.kivi) {
    const std::int64_t key_groups = (N + kGroup - 1) / kGroup;
    h.kscale = halves(key_groups * D, 0.02f, 0.01f, key + 100);
    h.kzero = halves(key_groups * D, 0.0f, 0.5f, key + 101);
    h.vscale = halves(N * groups, 0.02f, 0.01f, key + 102);
    h.vzero = halves(N * groups, 0.0f, 0.5f, key + 103);
  } else if (f.fmt != attn::Fmt::kF16) {
    h.kscale = halves(N * groups, 0.02f, 0.01f, key + 100);
    h.vscale = halves(N * groups, 0.02f, 0.01f, key + 102);
  }
  h.pos.resize(sz(N));
  for (std::int64_t i = 0; i < N; ++i) h.pos[sz(i)] = static_cast<std::int32_t>(i);
  return h;
}

// Per-thread scratch of one attention step.
struct AttnScratch {
  std::vector<float> scores, acc, out;
};

// One query step over one head: scores (per key group for KIVI), softmax, value sums. The
// softmax is the engine's (ops::softmax with the 1/sqrt(D) scale, as Transformer's attention
// calls it between the two packed kernels), so the row times what a decode step runs.
void attend(const AttnFormat& f, const Head& h, std::int64_t N, std::int64_t D, const float* q,
            std::int64_t n_q, AttnScratch& s) {
  const cpu::Isa isa = cpu::best_isa();
  const std::int64_t rb = code_row_bytes(f.fmt, D);
  const std::int64_t groups = (D + kGroup - 1) / kGroup;
  const std::int64_t pos = N;  // every row visible
  float* scores = s.scores.data();
  attn::RowSet k;
  k.fmt = f.fmt;
  k.row_bytes = rb;
  if (f.kivi) {
    for (std::int64_t a = 0, g = 0; a < N; a += kGroup, ++g) {
      k.data = h.k.data() + a * rb;
      k.positions = h.pos.data() + a;
      k.n = std::min(kGroup, N - a);
      attn::channel_scores(isa, k, h.kscale.data() + g * D, h.kzero.data() + g * D, D, q, n_q, pos,
                           scores + a, N);
    }
  } else {
    k.data = h.k.data();
    k.positions = h.pos.data();
    k.n = N;
    k.scale = h.kscale.empty() ? nullptr : h.kscale.data();
    k.param_stride = groups;
    k.group = f.fmt == attn::Fmt::kF16 ? D : kGroup;
    attn::token_scores(isa, k, D, q, n_q, pos, scores, N);
  }
  const float scale = std::sqrt(static_cast<float>(D));
  for (std::int64_t j = 0; j < n_q; ++j) engine::ops::softmax(scores + j * N, N, scale);
  attn::RowSet v;
  v.fmt = f.fmt;
  v.row_bytes = rb;
  v.data = h.v.data();
  v.positions = h.pos.data();
  v.n = N;
  v.scale = h.vscale.empty() ? nullptr : h.vscale.data();
  v.zero = h.vzero.empty() ? nullptr : h.vzero.data();
  v.param_stride = groups;
  v.group = f.fmt == attn::Fmt::kF16 ? D : kGroup;
  float* A = s.acc.data();
  float* Z = f.kivi ? A + n_q * 4 * D : nullptr;
  std::fill(s.acc.begin(), s.acc.end(), 0.0f);
  attn::token_values(isa, v, 0, D, scores, n_q, N, pos, A, Z, f.kivi ? groups : 0);
  attn::finish_values(A, Z, f.kivi ? groups : 0, v.group, n_q, D, s.out.data());
}

}  // namespace

void measure_attention(const AttentionPlan& p,
                       const std::function<void(const AttentionMeasure&)>& row) {
  const engine::ModelConfig& c = p.config;
  const int T = p.threads;
  const std::int64_t D = c.head_dim;
  const std::int64_t n_q = c.n_heads / c.n_kv_heads;
  const std::int64_t heads_per_step = c.n_layers * c.n_kv_heads;
  std::vector<float> q(sz(n_q * D));
  for (std::int64_t i = 0; i < n_q * D; ++i)
    q[sz(i)] = counter_uniform(p.seed, 7, static_cast<std::uint64_t>(i), 1.0f);
  for (const std::int64_t N : p.contexts) {
    for (const AttnFormat& f : kAttnFormats) {
      const std::int64_t head_bytes = make_head(f, kGroup, D, 0, 0).bytes() / kGroup * N;
      const std::int64_t h = std::min(
          heads_per_step, std::max<std::int64_t>(T, (p.working_set + head_bytes - 1) / head_bytes));
      std::vector<Head> heads;
      heads.reserve(sz(h));
      for (std::int64_t i = 0; i < h; ++i) {
        heads.push_back(make_head(f, N, D, p.seed, 1000 + static_cast<std::uint64_t>(i) * 8));
      }
      const int threads = static_cast<int>(std::min<std::int64_t>(T, h));
      std::vector<AttnScratch> scratch(sz(threads));
      for (AttnScratch& s : scratch) {
        s.scores.assign(sz(n_q * N), 0.0f);
        s.acc.assign(sz(n_q * 4 * (D + round_up(D, kGroup) / kGroup)), 0.0f);
        s.out.assign(sz(n_q * D), 0.0f);
      }
      const auto step = [&] {
        engine::parallel_for(threads, threads, [&](std::int64_t t0, std::int64_t t1) {
          for (std::int64_t t = t0; t < t1; ++t) {
            for (std::int64_t i = h * t / threads; i < h * (t + 1) / threads; ++i) {
              attend(f, heads[sz(i)], N, D, q.data(), n_q, scratch[sz(t)]);
            }
          }
        });
      };
      step();  // untimed
      double best = 1e300;
      for (int r = 0; r < p.repeats; ++r) {
        const auto t0 = Clock::now();
        step();
        best = std::min(best, seconds_since(t0));
      }
      std::int64_t measured_bytes = 0;
      for (const Head& hd : heads) measured_bytes += hd.bytes();
      row({f.name, N, D, n_q, h, heads_per_step, head_bytes, measured_bytes, best});
    }
  }
}

}  // namespace vq::eval
