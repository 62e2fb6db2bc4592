#include "engine/run/qfilters_file.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "engine/formats/file_error.h"
#include "engine/model/transformer.h"
#include "veloxquant/errors.h"

namespace vq::engine {

namespace {

constexpr char kMagic[8] = {'V', 'Q', 'Q', 'F', 'I', 'L', 'T', '1'};
constexpr std::size_t kHeader = 40;
constexpr std::uint64_t kFnvOffset = 1469598103934665603ull;
constexpr std::uint64_t kFnvPrime = 1099511628211ull;

std::uint64_t fnv(std::uint64_t h, const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= kFnvPrime;
  }
  return h;
}

template <typename T>
void put(std::string& out, T v) {
  unsigned char b[sizeof(T)];
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    b[i] = static_cast<unsigned char>(static_cast<std::uint64_t>(v) >> (8 * i));
  }
  out.append(reinterpret_cast<const char*>(b), sizeof(T));
}

template <typename T>
T get(const std::string& in, std::size_t at) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    v |= static_cast<std::uint64_t>(static_cast<unsigned char>(in[at + i])) << (8 * i);
  }
  return static_cast<T>(v);
}

std::string shape_text(std::int64_t layers, std::int64_t heads, std::int64_t dim) {
  return std::to_string(layers) + " layers x " + std::to_string(heads) + " KV heads x head_dim " +
         std::to_string(dim);
}

std::string hex(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

std::uint64_t model_fingerprint(const Model& model) {
  const ModelConfig& c = model.config();
  std::uint64_t h = kFnvOffset;
  const std::int64_t fields[] = {c.dim,        c.hidden_dim, c.n_layers,   c.n_heads,
                                 c.n_kv_heads, c.head_dim,   c.vocab_size, c.seq_len};
  for (std::int64_t f : fields) {
    std::string le;
    put<std::uint64_t>(le, static_cast<std::uint64_t>(f));
    h = fnv(h, le.data(), le.size());
  }
  for (const LayerWeights& lw : model.weights().layers) {
    for (const WeightMatrix* w : {&lw.wq, &lw.wk}) {
      const auto n = static_cast<std::size_t>(std::min<std::int64_t>(4096, w->bytes()));
      if (w->data != nullptr) h = fnv(h, w->data, n);
    }
  }
  return h;
}

KeyFilters read_key_filters(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) file_error(path, "not a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) file_error(path, "cannot open");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() < kHeader + 8) {
    file_error(path, "too short for a Q-Filters file (" + std::to_string(bytes.size()) +
                         " bytes, the header alone is " + std::to_string(kHeader + 8) + ")");
  }
  if (std::memcmp(bytes.data(), kMagic, 8) != 0) {
    file_error(path, "not a Q-Filters file (magic 'VQQFILT1' expected)");
  }
  const auto version = get<std::uint32_t>(bytes, 8);
  if (version != kQFiltersVersion) {
    file_error(path, "Q-Filters file version " + std::to_string(version) + ", this build reads " +
                         std::to_string(kQFiltersVersion));
  }
  KeyFilters f;
  f.n_layers = get<std::uint32_t>(bytes, 12);
  f.n_kv_heads = get<std::uint32_t>(bytes, 16);
  f.head_dim = get<std::uint32_t>(bytes, 20);
  f.fingerprint = get<std::uint64_t>(bytes, 24);
  f.tokens = get<std::uint64_t>(bytes, 32);
  for (std::int64_t v : {f.n_layers, f.n_kv_heads, f.head_dim}) {
    if (v < 1 || v > kMaxCount * 16) {
      file_error(path, "header: a count (" + shape_text(f.n_layers, f.n_kv_heads, f.head_dim) +
                           ") outside [1, " + std::to_string(kMaxCount * 16) + "]");
    }
  }
  const std::int64_t n = f.n_layers * f.n_kv_heads * f.head_dim;
  const std::size_t want = kHeader + 4 * static_cast<std::size_t>(n) + 8;
  if (bytes.size() != want) {
    file_error(path, "is " + std::to_string(bytes.size()) + " bytes; its header (" +
                         shape_text(f.n_layers, f.n_kv_heads, f.head_dim) + ") says " +
                         std::to_string(want) + " (truncated or altered?)");
  }
  const std::uint64_t sum = fnv(kFnvOffset, bytes.data() + kHeader, 4 * static_cast<std::size_t>(n));
  if (sum != get<std::uint64_t>(bytes, kHeader + 4 * static_cast<std::size_t>(n))) {
    file_error(path, "checksum mismatch: the filters were altered or the file is damaged");
  }
  f.values.resize(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const auto bits = get<std::uint32_t>(bytes, kHeader + 4 * static_cast<std::size_t>(i));
    float v;
    std::memcpy(&v, &bits, 4);
    if (!std::isfinite(v)) file_error(path, "filter value " + std::to_string(i) + " is not finite");
    f.values[static_cast<std::size_t>(i)] = v;
  }
  return f;
}

void write_key_filters(const std::string& path, const KeyFilters& f) {
  const std::int64_t n = f.n_layers * f.n_kv_heads * f.head_dim;
  if (n < 1 || static_cast<std::int64_t>(f.values.size()) != n) {
    throw Error(ErrorCode::kInvalidArgument,
                "[qfilters] " + std::to_string(f.values.size()) + " filter values for " +
                    shape_text(f.n_layers, f.n_kv_heads, f.head_dim));
  }
  std::string out(kMagic, 8);
  put<std::uint32_t>(out, kQFiltersVersion);
  put<std::uint32_t>(out, static_cast<std::uint32_t>(f.n_layers));
  put<std::uint32_t>(out, static_cast<std::uint32_t>(f.n_kv_heads));
  put<std::uint32_t>(out, static_cast<std::uint32_t>(f.head_dim));
  put<std::uint64_t>(out, f.fingerprint);
  put<std::uint64_t>(out, f.tokens);
  const std::size_t at = out.size();
  for (float v : f.values) {
    std::uint32_t bits;
    std::memcpy(&bits, &v, 4);
    put<std::uint32_t>(out, bits);
  }
  put<std::uint64_t>(out, fnv(kFnvOffset, out.data() + at, out.size() - at));

  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream o(tmp, std::ios::binary | std::ios::trunc);
    if (!o) file_error(path, "cannot create the temporary file '" + tmp + "'");
    o.write(out.data(), static_cast<std::streamsize>(out.size()));
    o.flush();
    if (!o) {
      o.close();
      std::remove(tmp.c_str());
      file_error(path, "write failed (disk full?)");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    file_error(path, "cannot rename the temporary file into place");
  }
}

std::vector<double> dominant_direction(const std::vector<double>& gram,
                                       const std::vector<double>& sum_q, std::int64_t D) {
  const auto d = static_cast<std::size_t>(D);
  std::vector<double> g(gram), g2(d * d), u(d, 0.0), w(d);
  double trace = 0;
  for (std::size_t i = 0; i < d; ++i) trace += g[i * d + i];
  if (!(trace > 0)) return u;
  for (double& x : g) x /= trace;
  // G <- G^2 / tr(G^2): the same eigenvectors, eigenvalue ratios raised to the power 2 each time.
  for (int k = 0; k < 8; ++k) {
    for (std::size_t i = 0; i < d; ++i) {
      for (std::size_t j = 0; j < d; ++j) {
        double s = 0;
        for (std::size_t m = 0; m < d; ++m) s += g[i * d + m] * g[m * d + j];
        g2[i * d + j] = s;
      }
    }
    double t = 0;
    for (std::size_t i = 0; i < d; ++i) t += g2[i * d + i];
    if (!(t > 0)) break;  // underflow: keep the last matrix
    for (std::size_t i = 0; i < d * d; ++i) g[i] = g2[i] / t;
  }
  auto normalise = [&](std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x * x;
    s = std::sqrt(s);
    if (!(s > 0)) return false;
    for (double& x : v) x /= s;
    return true;
  };
  u = sum_q;
  if (!normalise(u)) {
    std::size_t best = 0;
    for (std::size_t i = 1; i < d; ++i) {
      if (gram[i * d + i] > gram[best * d + best]) best = i;
    }
    std::fill(u.begin(), u.end(), 0.0);
    u[best] = 1.0;
  }
  for (int it = 0; it < 10000; ++it) {
    for (std::size_t i = 0; i < d; ++i) {
      double s = 0;
      for (std::size_t j = 0; j < d; ++j) s += g[i * d + j] * u[j];
      w[i] = s;
    }
    if (!normalise(w)) break;  // u is orthogonal to every dominant direction: keep it
    double moved = 0;
    for (std::size_t i = 0; i < d; ++i) moved = std::max(moved, std::fabs(w[i] - u[i]));
    u.swap(w);
    if (moved < 1e-13) break;
  }
  double proj = 0;
  for (std::size_t i = 0; i < d; ++i) proj += u[i] * sum_q[i];
  bool flip = proj < 0;
  if (proj == 0) {
    for (std::size_t i = 0; i < d; ++i) {
      if (u[i] != 0) {
        flip = u[i] < 0;
        break;
      }
    }
  }
  if (flip) {
    for (double& x : u) x = -x;
  }
  return u;
}

QueryStats::QueryStats(const ModelConfig& c)
    : L_(c.n_layers), Hq_(c.n_heads), Hkv_(c.n_kv_heads), D_(c.head_dim),
      gram_(static_cast<std::size_t>(L_ * Hq_ * D_ * D_), 0.0),
      sum_(static_cast<std::size_t>(L_ * Hq_ * D_), 0.0) {}

void QueryStats::add(std::int64_t layer, const float* q, std::int64_t T) {
  const auto D = static_cast<std::size_t>(D_);
  std::vector<double> x(D);
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t h = 0; h < Hq_; ++h) {
      const float* row = q + (t * Hq_ + h) * D_;
      for (std::size_t i = 0; i < D; ++i) x[i] = row[i];
      const auto base = static_cast<std::size_t>(layer * Hq_ + h);
      double* g = gram_.data() + base * D * D;
      double* s = sum_.data() + base * D;
      for (std::size_t i = 0; i < D; ++i) {
        s[i] += x[i];
        for (std::size_t j = 0; j < D; ++j) g[i * D + j] += x[i] * x[j];
      }
    }
  }
  if (layer == 0) tokens_ += static_cast<std::uint64_t>(T);
}

std::vector<float> QueryStats::filters() const {
  const auto D = static_cast<std::size_t>(D_);
  const std::int64_t G = Hq_ / Hkv_;
  std::vector<float> out(static_cast<std::size_t>(L_ * Hkv_ * D_), 0.0f);
  std::vector<double> gram(D * D), sum(D), acc(D);
  for (std::int64_t l = 0; l < L_; ++l) {
    for (std::int64_t kv = 0; kv < Hkv_; ++kv) {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (std::int64_t g = 0; g < G; ++g) {
        const auto base = static_cast<std::size_t>(l * Hq_ + kv * G + g);
        std::copy_n(gram_.begin() + static_cast<std::ptrdiff_t>(base * D * D), D * D, gram.begin());
        std::copy_n(sum_.begin() + static_cast<std::ptrdiff_t>(base * D), D, sum.begin());
        const std::vector<double> u = dominant_direction(gram, sum, D_);
        for (std::size_t i = 0; i < D; ++i) acc[i] += u[i];
      }
      float* o = out.data() + (l * Hkv_ + kv) * D_;
      for (std::size_t i = 0; i < D; ++i) o[i] = static_cast<float>(acc[i] / static_cast<double>(G));
    }
  }
  return out;
}

KeyFilters calibrate_key_filters(const Model& model, const std::vector<std::int32_t>& tokens,
                                 std::int64_t chunk) {
  const ModelConfig& c = model.config();
  const auto T = static_cast<std::int64_t>(tokens.size());
  if (T < 1) throw Error(ErrorCode::kInvalidArgument, "[calibrate] no tokens to calibrate on");
  // Windows of at most the model's context, each from an empty cache.
  const std::int64_t window = std::min(T, c.seq_len);
  chunk = std::max<std::int64_t>(1, std::min(chunk, window));
  QueryStats stats(c);
  Transformer tf(model, chunk, window);
  tf.set_query_tap([&](std::int64_t layer, const float* q, std::int64_t n) { stats.add(layer, q, n); });
  ModelCache cache = KVCacheBuilder::for_model(CacheConfig::parse("full"), model_shape(c));
  cache.expect_positions(window);
  for (std::int64_t w0 = 0; w0 < T; w0 += window) {
    cache.reset();
    const std::int64_t end = std::min(T, w0 + window);
    for (std::int64_t t = w0; t < end; t += chunk) {
      const std::int64_t S = std::min(chunk, end - t);
      tf.forward(tokens.data() + t, S, cache, Logits::kNone);
    }
  }
  KeyFilters f;
  f.n_layers = c.n_layers;
  f.n_kv_heads = c.n_kv_heads;
  f.head_dim = c.head_dim;
  f.fingerprint = model_fingerprint(model);
  f.tokens = stats.tokens();
  f.values = stats.filters();
  return f;
}

std::vector<float> random_key_filters(std::int64_t count, std::int64_t D, std::uint64_t seed) {
  std::vector<float> f(static_cast<std::size_t>(count * D));
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& v : f) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v = static_cast<float>(static_cast<double>(x >> 11) / 9007199254740992.0 - 0.5);
  }
  for (std::int64_t h = 0; h < count; ++h) {
    float* u = f.data() + h * D;
    double n2 = 0;
    for (std::int64_t i = 0; i < D; ++i) n2 += static_cast<double>(u[i]) * u[i];
    const double inv = n2 > 0 ? 1.0 / std::sqrt(n2) : 1.0;
    for (std::int64_t i = 0; i < D; ++i) u[i] = static_cast<float>(u[i] * inv);
  }
  return f;
}

void give_random_key_filters(LayerCache& cache, std::uint64_t seed) {
  if (!cache.needs_key_filters()) return;
  const LayerShape& s = cache.shape();
  const std::vector<float> f = random_key_filters(s.n_kv_heads, s.head_dim, seed);
  cache.set_key_filters(f.data(), static_cast<std::int64_t>(f.size()));
}

void give_random_key_filters(ModelCache& cache, std::uint64_t seed) {
  if (!cache.needs_key_filters()) return;
  const ModelShape& s = cache.shape();
  const std::vector<float> f = random_key_filters(s.n_layers * s.n_kv_heads, s.head_dim, seed);
  cache.set_key_filters(f.data(), static_cast<std::int64_t>(f.size()));
}

void attach_key_filters(ModelCache& cache, const Model& model) {
  if (!cache.needs_key_filters()) return;
  const std::string path = model.qfilters_path();
  const std::string method = cache.config().method();
  const std::string how = "make it with `veloxquant calibrate --model " +
                          (model.path().empty() ? std::string("MODEL") : model.path()) +
                          " --text FILE` (or name one with --qfilters FILE)";
  if (path.empty()) {
    throw Error(ErrorCode::kInvalidArgument,
                "[" + method + "] this model has no file, so no key-filter file next to it: " +
                    how);
  }
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    file_error(path, "no such key-filter file, which method " + method + " needs: " + how);
  }
  const KeyFilters f = read_key_filters(path);
  const ModelConfig& c = model.config();
  if (f.n_layers != c.n_layers || f.n_kv_heads != c.n_kv_heads || f.head_dim != c.head_dim) {
    file_error(path, "key filters for " + shape_text(f.n_layers, f.n_kv_heads, f.head_dim) +
                         ", but the model '" + model.path() + "' is " +
                         shape_text(c.n_layers, c.n_kv_heads, c.head_dim) + ": " + how);
  }
  const std::uint64_t fp = model_fingerprint(model);
  if (f.fingerprint != fp) {
    file_error(path, "key filters calibrated for another model of this shape (fingerprint " +
                         hex(f.fingerprint) + ", the model '" + model.path() + "' has " + hex(fp) +
                         "): " + how);
  }
  cache.set_key_filters(f.values.data(), static_cast<std::int64_t>(f.values.size()));
}

ModelCache make_model_cache(const CacheConfig& method, const Model& model) {
  ModelCache cache = KVCacheBuilder::for_model(method, model_shape(model.config()));
  attach_key_filters(cache, model);
  return cache;
}

}  // namespace vq::engine
