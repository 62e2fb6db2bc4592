#include "eval/roofline/roofline.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>

#include "base/cpu.h"
#include "engine/compute/block_matmul.h"
#include "engine/compute/matmul.h"
#include "engine/compute/parallel.h"
#include "engine/model/shapes.h"
#include "engine/run/resources.h"
#include "eval/report/results.h"
#include "eval/roofline/attention_rows.h"
#include "eval/roofline/counter_rng.h"
#include "eval/roofline/peaks.h"
#include "veloxquant/errors.h"
#include "veloxquant/types.h"

namespace vq::eval {
namespace {

using Clock = std::chrono::steady_clock;
using engine::WeightType;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

[[noreturn]] void bad(const std::string& message) {
  throw Error(ErrorCode::kInvalidArgument, "bench kernels: " + message);
}

std::size_t sz(std::int64_t n) { return static_cast<std::size_t>(n); }

// Bytes of 8-byte-aligned storage (every weight and row type's alignment).
struct Buffer {
  std::unique_ptr<std::uint64_t[]> words;
  std::int64_t bytes = 0;
  explicit Buffer(std::int64_t n) : words(new std::uint64_t[sz((n + 7) / 8)]), bytes(n) {}
  std::uint8_t* data() { return reinterpret_cast<std::uint8_t*>(words.get()); }
};

// The offsets of a block type's fp16 scale fields (d, and dmin / m where the type has one), as
// engine/quants.h lays the blocks out: set to finite values after the random bytes.
std::vector<int> half_fields(WeightType t) {
  switch (t) {
    case WeightType::kQ8_0:
    case WeightType::kQ4_0:
    case WeightType::kQ5_0:
      return {0};
    case WeightType::kQ4_1:
    case WeightType::kQ5_1:
    case WeightType::kQ4_K:
    case WeightType::kQ5_K:
      return {0, 2};
    case WeightType::kQ2_K:
      return {80, 82};
    case WeightType::kQ3_K:
      return {108};
    case WeightType::kQ6_K:
      return {208};
    default:
      return {};
  }
}

// Random weights of `type`, [rows][cols] at `out`: float types uniform in [-a, a) with
// a = sqrt(3 / cols) (engine/model/shapes.h's scale), block types random codes with finite
// scales of the same order. Threaded over rows.
void fill_weights(WeightType type, std::int64_t rows, std::int64_t cols, std::uint64_t seed,
                  std::uint8_t* out) {
  const std::int64_t row_bytes = engine::weight_row_bytes(type, cols);
  const float a = std::sqrt(3.0f / static_cast<float>(cols));
  const std::int64_t block = engine::weight_block_size(type);
  const std::int64_t block_bytes = engine::weight_block_bytes(type);
  const std::vector<int> fields = half_fields(type);
  engine::parallel_for(rows, engine::threads(), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      std::uint8_t* row = out + r * row_bytes;
      const std::uint64_t base = static_cast<std::uint64_t>(r * cols);
      if (type == WeightType::kF32) {
        float* p = reinterpret_cast<float*>(row);
        for (std::int64_t c = 0; c < cols; ++c) p[c] = counter_uniform(seed, 1, base + c, a);
      } else if (type == WeightType::kF16 || type == WeightType::kBF16) {
        std::uint16_t* p = reinterpret_cast<std::uint16_t*>(row);
        for (std::int64_t c = 0; c < cols; ++c) {
          const float v = counter_uniform(seed, 1, base + c, a);
          p[c] = type == WeightType::kF16 ? float_to_half(v) : engine::float_to_bf16(v);
        }
      } else {
        for (std::int64_t i = 0; i < row_bytes; i += 8) {
          const std::uint64_t w =
              counter_mix(seed, 2, static_cast<std::uint64_t>(r * row_bytes + i));
          std::memcpy(row + i, &w,
                      static_cast<std::size_t>(std::min<std::int64_t>(8, row_bytes - i)));
        }
        const float scale = a / 8.0f;  // codes of a few bits times d: the float weights' order
        for (std::int64_t b = 0; b < cols / block; ++b) {
          for (const int f : fields) {
            const float d = scale * (1.0f + counter_uniform(seed, 3, base + b * 2 + f, 0.5f));
            const std::uint16_t h = float_to_half(d);
            std::memcpy(row + b * block_bytes + f, &h, 2);
          }
        }
      }
    }
  });
}

// One distinct projection shape of the model: out N, in K, the projections sharing it and how
// often a forward runs it (per layer times layers; the classifier once).
struct Projection {
  std::vector<std::string> names;
  std::int64_t N = 0, K = 0;
  std::int64_t per_forward = 0;
};

std::vector<Projection> projections(const engine::ModelConfig& c) {
  std::vector<Projection> out;
  const auto add = [&](const std::string& name, std::int64_t N, std::int64_t K, std::int64_t n) {
    for (Projection& p : out) {
      if (p.N == N && p.K == K) {
        p.names.push_back(name);
        p.per_forward += n;
        return;
      }
    }
    out.push_back({{name}, N, K, n});
  };
  const std::int64_t L = c.n_layers;
  add("q", c.q_dim(), c.dim, L);
  add("k", c.kv_dim(), c.dim, L);
  add("v", c.kv_dim(), c.dim, L);
  add("o", c.dim, c.q_dim(), L);
  add("gate", c.hidden_dim, c.dim, L);
  add("up", c.hidden_dim, c.dim, L);
  add("down", c.dim, c.hidden_dim, L);
  add("classifier", c.vocab_size, c.dim, 1);
  return out;
}

// The sizes a run uses, from the options (quick or full).
struct Plan {
  engine::ModelConfig config;
  std::vector<WeightType> types;
  std::vector<std::int64_t> contexts;
  std::int64_t tokens = 0;
  int repeats = 0;
  std::int64_t working_set = 0;  // bytes each decode and attention measurement cycles through
  PeakOptions peaks;
};

std::int64_t last_level_cache_bytes() {
  long l3 = 0;
#ifdef _SC_LEVEL3_CACHE_SIZE
  l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
  return l3 > 0 ? l3 : std::int64_t{32} << 20;
}

Plan make_plan(const RooflineOptions& o) {
  Plan p;
  try {
    p.config = engine::find_shape(o.shape).config;
  } catch (const Error& e) {
    bad(std::string("--shape: ") + e.what());
  }
  p.types = o.types.empty() ? roofline_weight_types() : o.types;
  p.contexts = o.contexts;
  if (p.contexts.empty())
    p.contexts =
        o.quick ? std::vector<std::int64_t>{512, 2048} : std::vector<std::int64_t>{8192, 32768};
  p.tokens = o.tokens;
  p.repeats = o.repeats;
  p.working_set =
      o.quick ? std::int64_t{8} << 20
              : std::max<std::int64_t>(4 * last_level_cache_bytes(), std::int64_t{256} << 20);
  p.peaks.threads = {1};
  if (o.threads > 1) p.peaks.threads.push_back(o.threads);
  p.peaks.repeats = o.quick ? 2 : 5;
  p.peaks.target_seconds = o.quick ? 0.005 : 0.05;
  p.peaks.bandwidth_bytes = o.bandwidth_mib << 20;
  return p;
}

// ---- peaks ----

const Peak* find_peak(const std::vector<Peak>& peaks, const std::string& name) {
  for (const Peak& p : peaks) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

// The rate of `name` at `threads`, or 0 when absent.
double peak_at(const std::vector<Peak>& peaks, const std::string& name, int threads) {
  const Peak* p = find_peak(peaks, name);
  if (p == nullptr || !p->available) return 0;
  const auto it = p->per_threads.find(threads);
  return it == p->per_threads.end() ? 0 : it->second;
}

// The best of several peaks at `threads`: its name and rate ("" and 0 when none is present).
std::pair<std::string, double> best_peak(const std::vector<Peak>& peaks,
                                         std::initializer_list<const char*> names, int threads) {
  std::pair<std::string, double> best{"", 0.0};
  for (const char* n : names) {
    const double r = peak_at(peaks, n, threads);
    if (r > best.second) best = {n, r};
  }
  return best;
}

struct PeaksUsed {
  std::pair<std::string, double> fma, integer, bandwidth;
  std::string integer_reason;
};

nlohmann::json fraction_json(double rate, const std::pair<std::string, double>& peak) {
  if (peak.second <= 0) return nullptr;
  return rate / peak.second;
}

void set_peak(nlohmann::json& row, double rate, const std::pair<std::string, double>& peak,
              const std::string& why) {
  row["rate"] = rate;
  row["peak"] = peak.first.empty() ? nlohmann::json() : nlohmann::json(peak.first);
  row["peak_value"] = peak.second > 0 ? nlohmann::json(peak.second) : nlohmann::json();
  row["fraction"] = fraction_json(rate, peak);
  row["peak_reason"] = why;
}

bool float_path(WeightType t) {
  if (t == WeightType::kF32 || t == WeightType::kF16 || t == WeightType::kBF16) return true;
  return t == WeightType::kQ8_0 && engine::q8_0_activations() == engine::Q8_0Activations::kF32;
}

std::string activations_of(WeightType t) {
  if (float_path(t)) return "f32";
  if (t == WeightType::kQ8_0) return "q8_0";
  return engine::to_string(engine::activation_type(t));
}

}  // namespace

const std::vector<WeightType>& roofline_weight_types() {
  static const std::vector<WeightType> types = {
      WeightType::kF32,  WeightType::kF16,  WeightType::kBF16, WeightType::kQ8_0, WeightType::kQ4_0,
      WeightType::kQ4_1, WeightType::kQ5_0, WeightType::kQ5_1, WeightType::kQ2_K, WeightType::kQ3_K,
      WeightType::kQ4_K, WeightType::kQ5_K, WeightType::kQ6_K};
  return types;
}

std::string weight_type_flag_name(WeightType type) {
  std::string s = engine::to_string(type);
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return s;
}

WeightType parse_roofline_weight_type(const std::string& text, const std::string& flag) {
  std::string known;
  for (const WeightType t : roofline_weight_types()) {
    if (weight_type_flag_name(t) == text) return t;
    known += (known.empty() ? "" : ", ") + weight_type_flag_name(t);
  }
  throw Error(ErrorCode::kInvalidArgument,
              flag + " must be one of " + known + ", got '" + text + "'");
}

void validate_roofline_options(const RooflineOptions& o) {
  const Plan p = make_plan(o);  // checks --shape
  if (o.tokens < 1 || o.tokens > kMaxRooflineTokens) {
    bad(fmt::format("--tokens must be an integer in [1, {}], got {}", kMaxRooflineTokens,
                    o.tokens));
  }
  if (o.threads < 1) bad(fmt::format("--threads must be at least 1, got {}", o.threads));
  if (o.repeats < 1 || o.repeats > 1000) {
    bad(fmt::format("--repeats must be an integer in [1, 1000], got {}", o.repeats));
  }
  if (o.bandwidth_mib < 1 || o.bandwidth_mib > kMaxRooflineBandwidthMib) {
    bad(fmt::format("--bandwidth-mib must be an integer in [1, {}], got {}",
                    kMaxRooflineBandwidthMib, o.bandwidth_mib));
  }
  for (const std::int64_t n : p.contexts) {
    if (n < kAttentionGroup || n > kMaxRooflineContext || n % kAttentionGroup != 0) {
      bad(fmt::format("--context values must be multiples of {} in [{}, {}], got {}",
                      kAttentionGroup, kAttentionGroup, kMaxRooflineContext, n));
    }
  }
  const engine::ModelConfig& c = p.config;
  if (c.head_dim % kAttentionGroup != 0) {
    bad(fmt::format("--shape {}: head_dim {} is not a multiple of {} (the q8_0/q4_0 blocks)",
                    o.shape, c.head_dim, kAttentionGroup));
  }
  // Every type's blocks must tile each projection's rows (the K-quants: 256 values).
  for (const Projection& pr : projections(c)) {
    for (const WeightType t : p.types) {
      const std::int64_t block = engine::weight_block_size(t);
      if (pr.K % block != 0) {
        bad(
            fmt::format("--shape {}: its {} projection has rows of {} values, not a multiple of "
                        "{}'s {}-value blocks; leave {} out of --types",
                        o.shape, pr.names.front(), pr.K, weight_type_flag_name(t), block,
                        weight_type_flag_name(t)));
      }
    }
  }
  // Memory: the phases run one after another; the largest decides.
  double largest_matrix = 0, widest_in = 0;
  for (const Projection& pr : projections(c)) {
    for (const WeightType t : p.types) {
      largest_matrix =
          std::max(largest_matrix, static_cast<double>(pr.N) * engine::weight_row_bytes(t, pr.K));
    }
    widest_in = std::max(widest_in, static_cast<double>(std::max(pr.N, pr.K)));
  }
  const double matmul_bytes = largest_matrix + static_cast<double>(p.working_set) +
                              8.0 * static_cast<double>(p.tokens) * widest_in * 2;
  double attention_bytes = 0;
  for (const std::int64_t n : p.contexts) {
    const double head = static_cast<double>(n) * (4.0 * c.head_dim + 4);  // f16, the widest
    attention_bytes = std::max(attention_bytes, static_cast<double>(p.working_set) + 2 * head);
  }
  const double need =
      std::max({static_cast<double>(p.peaks.bandwidth_bytes), matmul_bytes, attention_bytes}) +
      64.0 * 1024 * 1024;
  engine::check_memory("bench kernels", need,
                       "the bandwidth buffer, the largest weight matrix with its decode copies, "
                       "and the attention heads",
                       o.max_memory);
}

nlohmann::json run_roofline(const RooflineOptions& o, const std::string& command,
                            const std::function<void(const std::string&)>& progress) {
  validate_roofline_options(o);
  const Plan p = make_plan(o);
  const engine::ModelConfig& c = p.config;
  const auto say = [&](const std::string& line) {
    if (progress) progress(line);
  };
  engine::set_threads(o.threads);
  const int T = o.threads;

  nlohmann::json settings = {{"shape", o.shape},
                             {"tokens", p.tokens},
                             {"threads", T},
                             {"quick", o.quick},
                             {"repeats", p.repeats},
                             {"bandwidth_mib", o.bandwidth_mib},
                             {"working_set_bytes", p.working_set},
                             {"contexts", p.contexts},
                             {"seed", o.seed},
                             {"q8_activations", engine::to_string(engine::q8_0_activations())}};
  nlohmann::json types = nlohmann::json::array();
  for (const WeightType t : p.types) types.push_back(weight_type_flag_name(t));
  settings["types"] = types;
  nlohmann::json doc = results_envelope("kernels", command, settings);
  doc["cpu"] = {{"model", machine_description()},
                {"features", cpu_feature_names()},
                {"kernel_family", cpu::to_string(cpu::best_isa())},
                {"load_average", [] {
                   double l[3] = {0, 0, 0};
                   return getloadavg(l, 3) == 3 ? nlohmann::json(l[0]) : nlohmann::json();
                 }()}};

  // 1. Peaks.
  say(fmt::format("[kernels] measuring peaks at {} thread(s)", T));
  const std::vector<Peak> peaks = measure_peaks(p.peaks);
  nlohmann::json peaks_json = nlohmann::json::array();
  for (const Peak& pk : peaks) {
    nlohmann::json j = {{"name", pk.name},
                        {"unit", pk.unit},
                        {"instruction", pk.instruction},
                        {"available", pk.available},
                        {"note", pk.note}};
    nlohmann::json per = nlohmann::json::object();
    for (const auto& [t, r] : pk.per_threads) per[std::to_string(t)] = r;
    j["per_threads"] = per;
    peaks_json.push_back(j);
    if (pk.available) {
      std::string rates;
      for (const auto& [t, r] : pk.per_threads) rates += fmt::format(" {:.1f} at {}T", r, t);
      say(fmt::format("[kernels] peak {} ({}):{} {}", pk.name, pk.instruction, rates, pk.unit));
    } else {
      say(fmt::format("[kernels] peak {}: {}", pk.name, pk.note));
    }
  }
  doc["peaks"] = peaks_json;
  PeaksUsed used;
  used.fma = best_peak(peaks, {"fma_avx2", "fma_avx512"}, T);
  used.integer = best_peak(peaks, {"vnni_avx512", "vnni_avx"}, T);
  used.integer_reason = "quantized activations: int8 x int8 block dots (the VNNI peak)";
  if (used.integer.second <= 0) {
    used.integer = used.fma;
    used.integer_reason =
        "quantized activations: int8 block dots; this CPU has no VNNI, so the FMA peak";
  }
  used.bandwidth = {"read_bw", peak_at(peaks, "read_bw", T)};
  const std::string float_reason = "float weights: fp32 multiply-adds (the FMA peak)";

  // 2. Prefill GEMM and decode GEMV per weight type and projection.
  const std::vector<Projection> projs = projections(c);
  Buffer x(p.tokens * 4 * std::max(c.hidden_dim, c.dim) + 64);
  Buffer out(p.tokens * 4 * std::max({c.vocab_size, c.hidden_dim, c.dim}) + 64);
  for (std::int64_t i = 0; i < p.tokens * std::max(c.hidden_dim, c.dim); ++i) {
    reinterpret_cast<float*>(x.data())[i] =
        counter_uniform(o.seed, 9, static_cast<std::uint64_t>(i), 1.0f);
  }
  const float* xf = reinterpret_cast<const float*>(x.data());
  float* of = reinterpret_cast<float*>(out.data());
  const std::int64_t M = p.tokens;
  for (const WeightType type : p.types) {
    const std::string tname = weight_type_flag_name(type);
    const bool is_float = float_path(type);
    double shape_flops = 0, shape_prefill_s = 0, shape_bytes = 0, shape_decode_s = 0;
    for (const Projection& pr : projs) {
      const std::int64_t bytes = pr.N * engine::weight_row_bytes(type, pr.K);
      const std::int64_t copies = std::max<std::int64_t>(1, (p.working_set + bytes - 1) / bytes);
      Buffer w(copies * bytes);
      fill_weights(type, pr.N, pr.K, o.seed ^ static_cast<std::uint64_t>(pr.N * 131 + pr.K),
                   w.data());
      for (std::int64_t k = 1; k < copies; ++k)
        std::memcpy(w.data() + k * bytes, w.data(), sz(bytes));
      const auto matrix = [&](std::int64_t k) {
        return engine::WeightMatrix{type, pr.N, pr.K, w.data() + k * bytes};
      };
      std::string names;
      for (const std::string& n : pr.names) names += (names.empty() ? "" : ",") + n;

      // Prefill: M tokens through one copy.
      const engine::WeightMatrix w0 = matrix(0);
      engine::matmul(of, xf, w0, M);  // untimed
      double best = 1e300;
      for (int r = 0; r < p.repeats; ++r) {
        const auto t0 = Clock::now();
        engine::matmul(of, xf, w0, M);
        best = std::min(best, seconds_since(t0));
      }
      const double flops =
          2.0 * static_cast<double>(M) * static_cast<double>(pr.N) * static_cast<double>(pr.K);
      nlohmann::json row = {{"kind", "prefill"},
                            {"type", tname},
                            {"projections", pr.names},
                            {"M", M},
                            {"N", pr.N},
                            {"K", pr.K},
                            {"activations", activations_of(type)},
                            {"path", is_float ? "float" : "integer"},
                            {"flops", flops},
                            {"time_s", best},
                            {"rate_unit", is_float ? "GFLOP/s" : "GOP/s"}};
      set_peak(row, flops / best / 1e9, is_float ? used.fma : used.integer,
               is_float ? float_reason : used.integer_reason);
      nlohmann::json others = nlohmann::json::object();
      const auto other = [&](const char* name) {
        const double v = peak_at(peaks, name, T);
        if (v > 0) others[name] = flops / best / 1e9 / v;
      };
      if (is_float) {
        other("muladd_avx2");
        if (type == WeightType::kBF16) other("bf16_avx512");
        if (type != WeightType::kF32) other("amx_bf16");
      } else {
        other("amx_int8");
      }
      row["fraction_of_other_peaks"] = others;
      doc["rows"].push_back(row);
      say(fmt::format("[kernels] prefill {} {} M={} {}x{}: {:.3f} ms, {:.1f} {}, {:.3f} of {}",
                      tname, names, M, pr.N, pr.K, best * 1e3, row["rate"].get<double>(),
                      row["rate_unit"].get<std::string>(),
                      row["fraction"].is_number() ? row["fraction"].get<double>() : 0.0,
                      row["peak"].is_string() ? row["peak"].get<std::string>() : "-"));
      shape_flops += flops * static_cast<double>(pr.per_forward);
      shape_prefill_s += best * static_cast<double>(pr.per_forward);

      // Decode: one token through every copy in turn, so each call reads its weights from
      // memory. Each call is timed: the median call, robust to a thread of the pair being
      // descheduled by another job for a few calls (a shared machine), and the best pass's mean.
      std::vector<double> calls;
      calls.reserve(sz(copies * p.repeats));
      double best_pass = 1e300;
      for (int r = -1; r < p.repeats; ++r) {  // pass -1 is untimed
        const auto pass0 = Clock::now();
        for (std::int64_t k = 0; k < copies; ++k) {
          const auto t0 = Clock::now();
          engine::matmul(of, xf, matrix(k), 1);
          if (r >= 0) calls.push_back(seconds_since(t0));
        }
        if (r >= 0) best_pass = std::min(best_pass, seconds_since(pass0));
      }
      std::nth_element(calls.begin(), calls.begin() + static_cast<std::ptrdiff_t>(calls.size() / 2),
                       calls.end());
      const double per_call = calls[calls.size() / 2];
      nlohmann::json drow = {{"kind", "decode"},
                             {"type", tname},
                             {"projections", pr.names},
                             {"M", 1},
                             {"N", pr.N},
                             {"K", pr.K},
                             {"activations", activations_of(type)},
                             {"bytes", bytes},
                             {"copies", copies},
                             {"time_s", per_call},
                             {"time_s_pass_mean", best_pass / static_cast<double>(copies)},
                             {"rate_unit", "GB/s"}};
      set_peak(drow, static_cast<double>(bytes) / per_call / 1e9, used.bandwidth,
               "decode reads every weight once: memory-bound (the read bandwidth)");
      doc["rows"].push_back(drow);
      say(fmt::format("[kernels] decode {} {} {}x{}: {:.3f} ms, {:.1f} GB/s, {:.3f} of read_bw",
                      tname, names, pr.N, pr.K, per_call * 1e3, drow["rate"].get<double>(),
                      drow["fraction"].is_number() ? drow["fraction"].get<double>() : 0.0));
      shape_bytes += static_cast<double>(bytes) * static_cast<double>(pr.per_forward);
      shape_decode_s += per_call * static_cast<double>(pr.per_forward);
    }
    // The whole forward's projections (every layer's and the classifier), from the rows above.
    nlohmann::json srow = {{"kind", "prefill_forward"},
                           {"type", tname},
                           {"M", M},
                           {"layers", c.n_layers},
                           {"flops", shape_flops},
                           {"time_s", shape_prefill_s},
                           {"path", is_float ? "float" : "integer"},
                           {"rate_unit", is_float ? "GFLOP/s" : "GOP/s"}};
    set_peak(srow, shape_flops / shape_prefill_s / 1e9, is_float ? used.fma : used.integer,
             is_float ? float_reason : used.integer_reason);
    doc["rows"].push_back(srow);
    nlohmann::json drow = {
        {"kind", "decode_forward"}, {"type", tname},        {"M", 1},
        {"layers", c.n_layers},     {"bytes", shape_bytes}, {"time_s", shape_decode_s},
        {"rate_unit", "GB/s"}};
    set_peak(drow, shape_bytes / shape_decode_s / 1e9, used.bandwidth,
             "decode reads every weight once: memory-bound (the read bandwidth)");
    doc["rows"].push_back(drow);
  }

  // 3. Packed-KV attention: one query step per head, heads in parallel (attention_rows.h).
  AttentionPlan ap{c, p.contexts, T, p.repeats, p.working_set, o.seed};
  measure_attention(ap, [&](const AttentionMeasure& m) {
    nlohmann::json row = {{"kind", "attention"},
                          {"format", m.format},
                          {"positions", m.positions},
                          {"head_dim", m.head_dim},
                          {"queries_per_head", m.queries_per_head},
                          {"heads", m.heads},
                          {"heads_per_step", m.heads_per_step},
                          {"bytes_per_head", m.bytes_per_head},
                          {"bytes", m.bytes},
                          {"time_s", m.time_s},
                          {"time_per_head_us", m.time_s / static_cast<double>(m.heads) * 1e6},
                          {"rate_unit", "GB/s"}};
    set_peak(row, static_cast<double>(m.bytes) / m.time_s / 1e9, used.bandwidth,
             "one query step reads every kept row once: bounded by the read bandwidth");
    doc["rows"].push_back(row);
    say(
        fmt::format("[kernels] attention {} N={} x {} heads: {:.3f} ms, {:.1f} GB/s, {:.3f} of "
                    "read_bw",
                    m.format, m.positions, m.heads, m.time_s * 1e3, row["rate"].get<double>(),
                    row["fraction"].is_number() ? row["fraction"].get<double>() : 0.0));
  });
  doc["cpu"]["load_average_end"] = [] {
    double l[3] = {0, 0, 0};
    return getloadavg(l, 3) == 3 ? nlohmann::json(l[0]) : nlohmann::json();
  }();
  return doc;
}

std::string roofline_table(const nlohmann::json& doc) {
  std::string s;
  const auto num = [](const nlohmann::json& v, const char* f) {
    return v.is_number() ? fmt::format(fmt::runtime(f), v.get<double>()) : std::string("-");
  };
  s += fmt::format("CPU: {}; features: ", doc["cpu"]["model"].get<std::string>());
  std::string feats;
  for (const auto& f : doc["cpu"]["features"])
    feats += (feats.empty() ? "" : ", ") + f.get<std::string>();
  s += feats + "\n";
  const std::string T = std::to_string(doc["settings"]["threads"].get<int>());
  // With --threads 1 the peaks are measured once: the second column is left out.
  const bool two = T != "1";
  s += fmt::format("\n{:<12} {:>9} {:>12} {:>12}  {}\n", "peak", "unit", "1 thread",
                   two ? T + " threads" : "", "instruction / note");
  for (const auto& p : doc["peaks"]) {
    const auto& per = p["per_threads"];
    s +=
        fmt::format("{:<12} {:>9} {:>12} {:>12}  {}\n", p["name"].get<std::string>(),
                    p["unit"].get<std::string>(), per.contains("1") ? num(per["1"], "{:.1f}") : "-",
                    !two              ? ""
                    : per.contains(T) ? num(per[T], "{:.1f}")
                                      : "-",
                    p["available"].get<bool>() ? p["instruction"].get<std::string>()
                                               : p["note"].get<std::string>());
  }
  s += fmt::format(
      "\nWhole forward ({}, every layer and the classifier; prefill M = {}; {} "
      "thread(s)), per weight type:\n",
      doc["settings"]["shape"].get<std::string>(), doc["settings"]["tokens"].get<std::int64_t>(),
      T);
  s += fmt::format("{:<6} {:>8} {:>10} {:>9} {:<12} {:>10} {:>9} {:>9}\n", "type", "path",
                   "prefill", "unit", "x peak", "decode", "GB/s", "x BW");
  const auto& rows = doc["rows"];
  for (const auto& r : rows) {
    if (r["kind"] != "prefill_forward") continue;
    const nlohmann::json* d = nullptr;
    for (const auto& r2 : rows) {
      if (r2["kind"] == "decode_forward" && r2["type"] == r["type"]) d = &r2;
    }
    s += fmt::format(
        "{:<6} {:>8} {:>10} {:>9} {:<12} {:>8} ms {:>9} {:>9}\n", r["type"].get<std::string>(),
        r["path"].get<std::string>(), num(r["rate"], "{:.1f}"), r["rate_unit"].get<std::string>(),
        num(r["fraction"], "{:.3f}") + " " +
            (r["peak"].is_string() ? r["peak"].get<std::string>() : "-"),
        d ? num((*d)["time_s"].get<double>() * 1e3, "{:.2f}") : "-",
        d ? num((*d)["rate"], "{:.1f}") : "-", d ? num((*d)["fraction"], "{:.3f}") : "-");
  }
  s += fmt::format(
      "\nPacked-KV attention, one query step per head:\n{:<6} {:>9} {:>6} {:>12} "
      "{:>12} {:>9} {:>9}\n",
      "format", "positions", "heads", "bytes/head", "us/head", "GB/s", "x BW");
  for (const auto& r : rows) {
    if (r["kind"] != "attention") continue;
    s +=
        fmt::format("{:<6} {:>9} {:>6} {:>12} {:>12} {:>9} {:>9}\n", r["format"].get<std::string>(),
                    r["positions"].get<std::int64_t>(), r["heads"].get<std::int64_t>(),
                    r["bytes_per_head"].get<std::int64_t>(), num(r["time_per_head_us"], "{:.1f}"),
                    num(r["rate"], "{:.1f}"), num(r["fraction"], "{:.3f}"));
  }
  return s;
}

}  // namespace vq::eval
