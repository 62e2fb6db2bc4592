// Saving and restoring a cache's state (LayerCache::save_state, ModelCache::save_state;
// docs/api.md, "Saving and restoring a cache").
//
// Layout (little-endian, explicit widths; base/state_io.h):
//   magic "VQSTATE\0" (8 bytes) | u32 format version | u32 kind (1 layer, 2 model)
//   | u64 the state's size in bytes, this header and the checksum included
//   | text: the config's canonical spec, every field (CacheConfig::spec(true))
//   | kind 1: one layer section | kind 2: the model shape (4 x i64), the layer group, n_layers
//     layer sections | u32 CRC-32C of every byte before it.
// A layer section: its LayerShape (5 x i64), whether the first step fixed the shape, batch,
// tokens_seen, query_source, source_resolved, the score source in force, the waiting question
// length; per (b, kv head) store its rows (RowStore::state), the per-row scores, aux and
// history, draws, evictions and merges; then the policy's own state (Policy::state).
//
// Loading is all-or-nothing by reading twice: first into a fresh cache built from the same
// config and shape (every check, nothing of the target touched), then, once that succeeded,
// into the target after a reset() (the same bytes and the same checks: it cannot fail).
#include <array>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include "base/state_io.h"
#include "cache/store_access.h"
#include "policies/layer_state.h"
#include "policies/policy.h"
#include "policies/storage.h"
#include "veloxquant/builder.h"
#include "veloxquant/cache.h"
#include "veloxquant/errors.h"

namespace vq {

static_assert(std::endian::native == std::endian::little,
              "the state format is little-endian; StateIO copies values as the host holds them");

namespace detail {

std::uint32_t crc32c(const std::uint8_t* data, std::size_t size, std::uint32_t crc) noexcept {
  static const auto table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  crc = ~crc;
  for (std::size_t i = 0; i < size; ++i) crc = table[(crc ^ data[i]) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

}  // namespace detail

using detail::HeadState;
using detail::LayerState;
using detail::StateCorrupt;
using detail::StateIO;
using detail::StoreAccess;

namespace {

constexpr char kMagic[8] = {'V', 'Q', 'S', 'T', 'A', 'T', 'E', '\0'};
constexpr std::uint32_t kVersion = 1;
constexpr std::uint32_t kKindLayer = 1, kKindModel = 2;
constexpr std::size_t kHeaderBytes = 24, kCrcBytes = 4;
constexpr std::uint64_t kMaxSpec = 1 << 16;
constexpr std::int64_t kMaxPos = std::numeric_limits<std::int32_t>::max();
// The fewest bytes one head's section takes (seven counts and values, a store's positions
// count): a count of heads past remaining / this is corrupt before anything is allocated.
constexpr std::size_t kMinHeadBytes = 64;

const char* kind_name(std::uint32_t kind) { return kind == kKindLayer ? "LayerCache" : "ModelCache"; }

[[noreturn]] void mismatch(const std::string& msg) {
  throw Error(ErrorCode::kInvalidArgument, "[state] " + msg);
}

// The header (magic, version, kind), then the checksum of the whole; returns the payload's
// reader (after the header, before the checksum).
StateIO open_state(const std::uint8_t* data, std::size_t size, std::uint32_t kind) {
  if (data == nullptr && size > 0) StateIO::fail("null data with a size of " + std::to_string(size));
  auto too_short = [&] {
    StateIO::fail("expected at least " + std::to_string(kHeaderBytes + kCrcBytes) +
                  " bytes (header and checksum), found " + std::to_string(size));
  };
  if (size < kHeaderBytes) too_short();
  if (std::memcmp(data, kMagic, sizeof kMagic) != 0) {
    StateIO::fail("not a VeloxQuant cache state (expected the magic \"VQSTATE\")");
  }
  std::uint32_t version = 0, got_kind = 0;
  std::memcpy(&version, data + 8, 4);
  std::memcpy(&got_kind, data + 12, 4);
  if (version != kVersion) {
    StateIO::fail("format version " + std::to_string(version) + " is not supported: this build "
                  "reads version " + std::to_string(kVersion));
  }
  std::uint64_t total = 0;
  std::memcpy(&total, data + 16, 8);
  if (total != size) {
    StateIO::fail(std::string(total > size ? "truncated: " : "") + "the header gives a size of " +
                  std::to_string(total) + " bytes, found " + std::to_string(size));
  }
  if (size < kHeaderBytes + kCrcBytes) too_short();
  std::uint32_t stored = 0;
  std::memcpy(&stored, data + size - kCrcBytes, 4);
  const std::uint32_t crc = detail::crc32c(data, size - kCrcBytes);
  if (stored != crc) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "checksum mismatch (stored CRC-32C %08x, computed %08x)",
                  stored, crc);
    StateIO::fail(buf);
  }
  if (got_kind != kKindLayer && got_kind != kKindModel) {
    StateIO::fail("unknown state kind " + std::to_string(got_kind));
  }
  if (got_kind != kind) {
    mismatch(std::string("a ") + kind_name(got_kind) + " state cannot be loaded into a " +
             kind_name(kind));
  }
  return StateIO(data + kHeaderBytes, size - kHeaderBytes - kCrcBytes);
}

void write_header(std::vector<std::uint8_t>& out, std::uint32_t kind) {
  out.insert(out.end(), kMagic, kMagic + sizeof kMagic);
  StateIO io(&out);
  std::uint32_t version = kVersion;
  io.value(version, "version");
  io.value(kind, "kind");
  std::uint64_t size = 0;  // set by write_checksum
  io.value(size, "size");
}

void write_checksum(std::vector<std::uint8_t>& out) {
  const std::uint64_t size = out.size() + kCrcBytes;
  std::memcpy(out.data() + 16, &size, 8);
  std::uint32_t crc = detail::crc32c(out.data(), out.size());
  StateIO io(&out);
  io.value(crc, "checksum");
}

// The config's spec: equal, or a valid state of another config.
void spec_section(StateIO& io, const CacheConfig& config) {
  std::string spec = config.spec(true);
  const std::string own = spec;
  io.text(spec, kMaxSpec, "spec");
  if (io.loading() && spec != own) {
    mismatch("the state was saved from config \"" + spec + "\", this cache has \"" + own + "\"");
  }
}

// One shape field: equal (0 on either side: not fixed yet, which a step would fix).
void shape_field(StateIO& io, std::int64_t& field, std::int64_t lo, std::int64_t hi,
                 const char* name, bool must_equal) {
  const std::int64_t own = field;
  std::int64_t v = field;
  io.bounded<std::int64_t>(v, lo, hi, name);
  if (!io.loading()) return;
  if (v != own && (must_equal || (v != 0 && own != 0))) {
    mismatch(std::string("the state's ") + name + " is " + std::to_string(v) +
             ", this cache's is " + std::to_string(own));
  }
  if (v != 0) field = v;
}

// A layer's state; `st` and `policy` are a fresh or reset cache's when loading.
void layer_section(StateIO& io, LayerState& st, detail::Policy& policy) {
  LayerShape& shape = st.shape;
  shape_field(io, shape.n_layers, 1, kMaxLayers, "n_layers", true);
  shape_field(io, shape.layer, 0, kMaxLayers - 1, "layer", true);
  shape_field(io, shape.n_kv_heads, 0, kMaxHeads, "n_kv_heads", false);
  shape_field(io, shape.head_dim, 0, kMaxHeadDim, "head_dim", false);
  shape_field(io, shape.n_query_heads, 0, kMaxHeads, "n_query_heads", false);
  io.value(st.shaped, "shaped");
  io.bounded<std::int64_t>(st.batch, 0, kMaxBatchHeads, "batch");
  io.bounded<std::int64_t>(st.tokens_seen, 0, kMaxPos, "tokens_seen");
  io.bounded<int>(st.query_source, -1, 1, "query_source");
  io.value(st.source_resolved, "source_resolved");
  std::string source = policy.source_name();
  io.text(source, 16, "score source");
  io.bounded<std::int64_t>(st.question, 0, kMaxPos, "question length");
  if (io.loading()) {
    if (source == "attention" || source == "proxy") policy.resolve_source(source == "attention");
    io.check(source == policy.source_name(),
             std::string("score source: the state says \"") + source + "\", this config gives \"" +
                 policy.source_name() + "\"");
  }
  if (io.loading()) {
    const std::int64_t H = shape.n_kv_heads, D = shape.head_dim;
    if (!st.shaped) {
      io.check(st.batch == 0 && st.tokens_seen == 0,
               "a cache whose shape is not fixed holds no tokens (found " +
                   std::to_string(st.tokens_seen) + " tokens, batch " + std::to_string(st.batch) + ")");
      st.heads.clear();
      st.rngs.clear();
      st.view_rows.clear();
    } else {
      io.check(st.batch >= 1 && H >= 1 && D >= 1 && st.batch * H <= kMaxBatchHeads &&
                   shape.n_query_heads >= H && shape.n_query_heads % H == 0,
               "shape: expected batch, n_kv_heads, head_dim >= 1, batch x n_kv_heads <= " +
                   std::to_string(kMaxBatchHeads) + " and n_query_heads a multiple of n_kv_heads, "
                   "found batch " + std::to_string(st.batch) + ", n_kv_heads " +
                   std::to_string(H) + ", head_dim " + std::to_string(D) + ", n_query_heads " +
                   std::to_string(shape.n_query_heads));
      const auto n = static_cast<std::size_t>(st.batch * H);
      io.check(n <= io.remaining() / kMinHeadBytes,
               std::to_string(n) + " heads need at least " + std::to_string(n * kMinHeadBytes) +
                   " bytes, only " + std::to_string(io.remaining()) + " are left");
      detail::build_heads(st, st.batch, H, D, shape.layer);
    }
  }
  for (HeadState& hs : st.heads) {
    detail::RowStore& store = StoreAccess::of(hs);
    store.state(io, st.tokens_seen);
    const auto rows = static_cast<std::uint64_t>(store.size() - store.n_demoted());
    io.bounded<std::int64_t>(hs.hist_stride, 0, kMaxPos, "history stride");
    io.value(hs.draws, "draws");
    io.bounded<std::int64_t>(hs.evictions, 0, std::numeric_limits<std::int64_t>::max(), "evictions");
    io.bounded<std::int64_t>(hs.merges, 0, hs.evictions, "merges");
    io.vec(hs.score, rows, "row scores");
    io.vec(hs.aux, rows, "row aux values");
    io.vec(hs.hist, rows * static_cast<std::uint64_t>(hs.hist_stride), "row history");
    if (io.loading()) {
      io.check((hs.score.empty() || hs.score.size() == rows) &&
                   (hs.aux.empty() || hs.aux.size() == hs.score.size()) &&
                   (hs.hist.empty() ||
                    hs.hist.size() == hs.score.size() * static_cast<std::uint64_t>(hs.hist_stride)),
               "per-row values: expected 0 or " + std::to_string(rows) + " scores (aux alike, " +
                   std::to_string(hs.hist_stride) + " history values each), found " +
                   std::to_string(hs.score.size()) + " scores, " + std::to_string(hs.aux.size()) +
                   " aux, " + std::to_string(hs.hist.size()) + " history");
      hs.live.clear();
      hs.prev = 0;
    }
  }
  policy.state(io, st);
  if (io.loading()) {
    for (std::size_t i = 0; i < st.heads.size(); ++i) st.view_rows[i] = st.heads[i].store()->rows();
  }
}

void group_section(StateIO& io, detail::LayerGroup& g) {
  const auto L = static_cast<std::uint64_t>(g.n_layers);
  io.vec_exact(g.signal, L, "group signals");
  std::vector<std::uint8_t> reported(g.reported.begin(), g.reported.end());
  io.vec_exact(reported, L, "group reports");
  io.vec_exact(g.external, L, "group similarity sums");
  io.vec_exact(g.external_count, L, "group similarity counts");
  io.vec(g.budgets, L, "group budgets");
  if (!io.loading()) return;
  io.check(g.budgets.empty() || g.budgets.size() == L,
           "group budgets: expected 0 or " + std::to_string(L) + ", found " +
               std::to_string(g.budgets.size()));
  for (std::uint8_t r : reported) io.check(r <= 1, "group reports: expected 0 or 1");
  for (std::int64_t c : g.external_count) io.check(c >= 0, "group similarity counts: expected >= 0");
  for (std::int64_t b : g.budgets) {
    io.check(b >= 0 && b <= kMaxPos, "group budgets: expected values in [0, 2^31 - 1], found " +
                                         std::to_string(b));
  }
  g.reported.assign(reported.begin(), reported.end());
}

void require_closed(const LayerState& st, const char* what) {
  if (st.step_open) {
    throw Error(ErrorCode::kInvalidState,
                std::string("[state] ") + what + " called while a step is open; call end_step() first");
  }
}

// Reads the whole file.
std::vector<std::uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw Error(ErrorCode::kFileError,
                "[state] " + path + ": cannot open for reading: " + std::strerror(errno), path);
  }
  std::vector<std::uint8_t> data((std::istreambuf_iterator<char>(in)),
                                 std::istreambuf_iterator<char>());
  if (in.bad()) throw Error(ErrorCode::kFileError, "[state] " + path + ": read failed", path);
  return data;
}

// tmp file beside `path`, fsync, rename over `path`, fsync the directory.
void write_file_atomic(const std::string& path, const std::vector<std::uint8_t>& data) {
  auto fail = [&](const std::string& what) {
    throw Error(ErrorCode::kIoError, "[state] " + path + ": " + what + ": " + std::strerror(errno),
                path);
  };
  std::string tmp = path + ".tmp.XXXXXX";
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0) fail("cannot create a temporary file beside it");
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      errno = e;
      fail("write failed");
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    errno = e;
    fail("fsync failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    errno = e;
    fail("rename failed");
  }
  const std::size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);  // best effort: the rename is durable on most file systems without it
    ::close(dfd);
  }
}

// Runs `load` and turns a corrupt state into the caller's error: kInvalidArgument for a buffer,
// kFileError naming the file for a file.
template <class Load>
void guarded(const std::string* path, Load&& load) {
  try {
    load();
  } catch (const StateCorrupt& e) {
    if (path == nullptr) throw Error(ErrorCode::kInvalidArgument, "[state] " + e.message);
    throw Error(ErrorCode::kFileError, "[state] " + *path + ": " + e.message, *path);
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// LayerCache

std::vector<std::uint8_t> LayerCache::save_state() const {
  require_closed(*state_, "save_state");
  if (policy_->awaits_compress(*state_)) {
    throw Error(ErrorCode::kInvalidState,
                "[state] save_state called while a prompt waits for its reconstruction pass; "
                "run it and call compress() first");
  }
  std::vector<std::uint8_t> out;
  // Every byte held between steps bounds the state (rows, positions, per-row values): one
  // allocation, no regrowth.
  out.reserve(static_cast<std::size_t>(stats().resident_bytes) + 4096);
  write_header(out, kKindLayer);
  StateIO io(&out);
  spec_section(io, state_->config);
  layer_section(io, *state_, *policy_);
  write_checksum(out);
  return out;
}

void LayerCache::load_state_impl(const std::uint8_t* data, std::size_t size,
                                 const std::string* path) {
  require_closed(*state_, "load_state");
  guarded(path, [&] {
    // Pass 1: every check, on a fresh cache of the same config and shape.
    {
      StateIO io = open_state(data, size, kKindLayer);
      LayerCache fresh(state_->config, state_->shape);
      fresh.state_->expected_rows = state_->expected_rows;
      spec_section(io, state_->config);
      layer_section(io, *fresh.state_, *fresh.policy_);
      io.check(io.remaining() == 0, std::to_string(io.remaining()) +
                                        " bytes follow the last section before the checksum");
    }
    // Pass 2: the same bytes into this cache, reset.
    reset();
    StateIO io = open_state(data, size, kKindLayer);
    spec_section(io, state_->config);
    layer_section(io, *state_, *policy_);
  });
}

void LayerCache::load_state(const std::uint8_t* data, std::size_t size) {
  load_state_impl(data, size, nullptr);
}

void LayerCache::save_state_file(const std::string& path) const {
  write_file_atomic(path, save_state());
}

void LayerCache::load_state_file(const std::string& path) {
  const std::vector<std::uint8_t> data = read_file(path);
  load_state_impl(data.data(), data.size(), &path);
}

// ---------------------------------------------------------------------------------------------
// ModelCache

namespace {
void model_shape_section(StateIO& io, ModelShape& shape) {
  for (auto [field, name] : {std::pair{&shape.n_layers, "n_layers"},
                             std::pair{&shape.n_kv_heads, "n_kv_heads"},
                             std::pair{&shape.head_dim, "head_dim"},
                             std::pair{&shape.n_query_heads, "n_query_heads"}}) {
    std::int64_t v = *field;
    io.value(v, name);
    if (io.loading() && v != *field) {
      mismatch(std::string("the state's model ") + name + " is " + std::to_string(v) +
               ", this cache's is " + std::to_string(*field));
    }
  }
}
}  // namespace

std::vector<std::uint8_t> ModelCache::save_state() const {
  for (const LayerCache& l : layers_) {
    require_closed(*l.state_, "save_state");
    if (l.policy_->awaits_compress(*l.state_)) {
      throw Error(ErrorCode::kInvalidState,
                  "[state] save_state called while a prompt waits for its reconstruction pass; "
                  "run it and call compress() first");
    }
  }
  std::vector<std::uint8_t> out;
  out.reserve(static_cast<std::size_t>(stats().resident_bytes) + 4096 * layers_.size());
  write_header(out, kKindModel);
  StateIO io(&out);
  spec_section(io, config_);
  ModelShape shape = shape_;
  model_shape_section(io, shape);
  group_section(io, *group_);
  for (const LayerCache& l : layers_) layer_section(io, *l.state_, *l.policy_);
  write_checksum(out);
  return out;
}

void ModelCache::load_state_impl(const std::uint8_t* data, std::size_t size,
                                 const std::string* path) {
  for (const LayerCache& l : layers_) require_closed(*l.state_, "load_state");
  guarded(path, [&] {
    {
      StateIO io = open_state(data, size, kKindModel);
      ModelCache fresh(config_, shape_);
      spec_section(io, config_);
      ModelShape shape = shape_;
      model_shape_section(io, shape);
      group_section(io, *fresh.group_);
      for (std::size_t i = 0; i < layers_.size(); ++i) {
        LayerCache& l = fresh.layers_[i];
        l.state_->expected_rows = layers_[i].state_->expected_rows;
        layer_section(io, *l.state_, *l.policy_);
      }
      io.check(io.remaining() == 0, std::to_string(io.remaining()) +
                                        " bytes follow the last section before the checksum");
    }
    for (LayerCache& l : layers_) l.reset();
    StateIO io = open_state(data, size, kKindModel);
    spec_section(io, config_);
    ModelShape shape = shape_;
    model_shape_section(io, shape);
    group_section(io, *group_);
    for (LayerCache& l : layers_) layer_section(io, *l.state_, *l.policy_);
  });
}

void ModelCache::load_state(const std::uint8_t* data, std::size_t size) {
  load_state_impl(data, size, nullptr);
}

void ModelCache::save_state_file(const std::string& path) const {
  write_file_atomic(path, save_state());
}

void ModelCache::load_state_file(const std::string& path) {
  const std::vector<std::uint8_t> data = read_file(path);
  load_state_impl(data.data(), data.size(), &path);
}

}  // namespace vq
