#include "engine/run/resources.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <fstream>

#include "engine/compute/parallel.h"
#include "engine/model/transformer.h"
#include "veloxquant/builder.h"
#include "veloxquant/errors.h"

namespace vq::engine {

namespace {
// The room left under this process's cgroup (v2) memory limit: memory.max - memory.current;
// 0 when there is no limit or it cannot be read. A container's limit is often far below the
// machine's MemAvailable, and exceeding it gets the process killed without a message.
std::uint64_t cgroup_room_bytes() {
  std::ifstream self("/proc/self/cgroup");
  std::string line, rel;
  while (std::getline(self, line)) {
    if (line.rfind("0::", 0) == 0) rel = line.substr(3);
  }
  if (rel.empty()) return 0;
  const std::string dir = "/sys/fs/cgroup" + (rel == "/" ? std::string() : rel);
  std::ifstream max_in(dir + "/memory.max"), cur_in(dir + "/memory.current");
  std::string max_text;
  std::uint64_t current = 0;
  if (!(max_in >> max_text) || max_text == "max" || !(cur_in >> current)) return 0;
  std::uint64_t max = 0;
  try {
    max = std::stoull(max_text);
  } catch (const std::exception&) {
    return 0;
  }
  return max > current ? max - current : 1;
}
}  // namespace

std::uint64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::uint64_t value = 0, available = 0;
  std::string unit;
  while (in >> key >> value) {
    std::getline(in, unit);
    if (key == "MemAvailable:") {
      available = value * 1024;  // the file counts kB (KiB)
      break;
    }
  }
  const std::uint64_t room = cgroup_room_bytes();
  if (room != 0 && (available == 0 || room < available)) return room;
  return available;
}

std::uint64_t parse_memory_size(const std::string& text, const std::string& flag) {
  auto bad = [&](const std::string& why) {
    return Error(ErrorCode::kInvalidArgument,
                 flag +
                     " expects a size in bytes with an optional K, M, G or T suffix (e.g. "
                     "512M, 8G), " +
                     why);
  };
  std::uint64_t n = 0;
  const char* begin = text.data();
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(begin, end, n);
  if (ec == std::errc::result_out_of_range) throw bad("got '" + text + "' (too large)");
  if (ec != std::errc() || ptr == begin) throw bad("got '" + text + "'");
  std::string suffix(ptr, end);
  for (char& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  int shift = 0;
  if (suffix.empty() || suffix == "B") {
    shift = 0;
  } else if (suffix == "K" || suffix == "KB" || suffix == "KIB") {
    shift = 10;
  } else if (suffix == "M" || suffix == "MB" || suffix == "MIB") {
    shift = 20;
  } else if (suffix == "G" || suffix == "GB" || suffix == "GIB") {
    shift = 30;
  } else if (suffix == "T" || suffix == "TB" || suffix == "TIB") {
    shift = 40;
  } else {
    throw bad("got '" + text + "' (unknown suffix '" + std::string(ptr, end) + "')");
  }
  if (n == 0) throw bad("got '" + text + "' (must be > 0)");
  if (shift > 0 && n > (UINT64_MAX >> shift)) throw bad("got '" + text + "' (too large)");
  return n << shift;
}

std::string format_bytes(double bytes) {
  if (bytes >= 1024.0 * 1024 * 1024) return fmt::format("{:.1f} GiB", bytes / (1 << 30));
  if (bytes >= 1024.0 * 1024) return fmt::format("{:.1f} MiB", bytes / (1 << 20));
  if (bytes >= 1024.0) return fmt::format("{:.1f} KiB", bytes / 1024);
  return fmt::format("{:.0f} bytes", bytes);
}

void check_memory(const std::string& command, double estimate_bytes, const std::string& what,
                  std::uint64_t max_memory) {
  const std::uint64_t limit = max_memory != 0 ? max_memory : available_memory_bytes();
  if (limit == 0 || estimate_bytes <= static_cast<double>(limit)) return;
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("{}: the run needs about {} ({}), more than {} ({}); nothing was "
                          "allocated. Use smaller sizes{}",
                          command, format_bytes(estimate_bytes), what,
                          format_bytes(static_cast<double>(limit)),
                          max_memory != 0 ? "the --max-memory limit"
                                          : "the memory available: MemAvailable, or the room "
                                            "under the cgroup memory limit when smaller",
                          max_memory != 0 ? " or a larger --max-memory"
                                          : " (or --max-memory SIZE to set the limit yourself)"));
}

double model_weight_bytes(const engine::ModelConfig& c, engine::WeightType type) {
  const auto d = [](std::int64_t v) { return static_cast<double>(v); };
  const double per_elem = d(engine::weight_row_bytes(type, 1024)) / 1024.0;
  return d(c.n_params()) * per_elem + 4.0 * d(c.dim) * d(2 * c.n_layers + 1);
}

double engine_run_bytes(const engine::ModelConfig& c, std::int64_t chunk, std::int64_t context,
                        bool attention_probs) {
  const auto d = [](std::int64_t v) { return static_cast<double>(v); };
  const double S = d(chunk), R = d(context), T = d(context);
  const double per_position =
      3 * d(c.dim) + 2 * d(c.q_dim()) + 2 * d(c.kv_dim()) + 2 * d(c.hidden_dim) + d(c.vocab_size);
  // Per thread: a tile's scores [TG][R], queries, positions and partial sums (RunState).
  const std::int64_t G = c.n_heads / std::max<std::int64_t>(1, c.n_kv_heads);
  const double TG = d(engine::RunState::tile_tokens(G) * G);
  const double tile = d(engine::threads()) *
                      (TG * R + TG * 6 * d(c.head_dim) + 8 * d(G * c.head_dim) + d(c.head_dim));
  const double probs = attention_probs ? d(c.n_heads) * S * R : 0.0;
  const double work =
      4 * (S * per_position + probs + tile + R * d(c.head_dim) + 2 * d(c.vocab_size));
  // K and V rows (fp32 worst case) plus a position per row and head.
  const double cache = d(c.n_layers) * d(c.n_kv_heads) * T * (8 * d(c.head_dim) + 8);
  return work + cache;
}

bool reads_attention(const CacheConfig& method, const engine::ModelConfig& model) {
  const ModelCache cache = KVCacheBuilder::for_model(method, engine::model_shape(model));
  return cache.layer(0).reads_attention();
}

bool reads_attention(const std::string& method, const engine::ModelConfig& model) {
  try {
    return reads_attention(CacheConfig::parse(method), model);
  } catch (const Error&) {
    return true;
  }
}

}  // namespace vq::engine
