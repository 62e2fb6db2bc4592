#include "serve/session_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/model/model.h"
#include "engine/tokenizers/tokenizer.h"
#include "veloxquant/errors.h"

namespace vq::serve {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr char kMagic[8] = {'V', 'Q', 'S', 'E', 'S', 'S', '0', '1'};
constexpr int kFormat = 1;
constexpr const char* kSuffix = ".vqsession";
constexpr const char* kTmpPrefix = ".tmp-";
// The largest header a reader accepts (a conversation of --max-context tokens is far smaller).
constexpr std::uint64_t kMaxHeader = std::uint64_t{1} << 28;

// Writes the low `n` bytes of v at p, little-endian; returns p + n.
std::uint8_t* put_le(std::uint8_t* p, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
  return p + n;
}
std::uint64_t get_le(const std::uint8_t* p, int n) {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(p[i]) << (8 * i);
  return v;
}

std::string hex64(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// Hash of a file's size and of 16 evenly spaced 64 KiB blocks (the first and the last among
// them): enough to tell checkpoints apart without reading gigabytes at startup.
std::uint64_t sampled_file_hash(const std::string& path, std::uint64_t h) {
  std::error_code ec;
  if (path.empty() || !fs::is_regular_file(path, ec)) return h;
  const std::uint64_t size = fs::file_size(path, ec);
  if (ec) return h;
  h = fnv1a64(&size, sizeof size, h);
  std::ifstream in(path, std::ios::binary);
  if (!in) return h;
  constexpr std::uint64_t kBlock = 64 * 1024;
  constexpr int kBlocks = 16;
  std::vector<char> buf(kBlock);
  for (int i = 0; i < kBlocks; ++i) {
    const std::uint64_t span = size > kBlock ? size - kBlock : 0;
    const std::uint64_t at = span * static_cast<std::uint64_t>(i) / (kBlocks - 1);
    in.clear();
    in.seekg(static_cast<std::streamoff>(at));
    in.read(buf.data(), static_cast<std::streamsize>(std::min(kBlock, size - at)));
    h = fnv1a64(buf.data(), static_cast<std::size_t>(in.gcount()), h);
  }
  return h;
}

[[noreturn]] void corrupt(const std::string& path, const std::string& what) {
  throw Error(ErrorCode::kFileError, "session file '" + path + "': " + what, path);
}

}  // namespace

std::uint64_t fnv1a64(const void* data, std::size_t n, std::uint64_t h) {
  const auto* p = static_cast<const std::uint8_t*>(data);
  for (std::size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string model_identity(const engine::Model& model, const engine::Tokenizer& tokenizer) {
  const engine::ModelConfig& c = model.config();
  json j = {{"format", c.format},         {"dim", c.dim},
            {"hidden_dim", c.hidden_dim}, {"n_layers", c.n_layers},
            {"n_heads", c.n_heads},       {"n_kv_heads", c.n_kv_heads},
            {"head_dim", c.head_dim},     {"vocab_size", c.vocab_size},
            {"seq_len", c.seq_len},       {"norm_eps", c.norm_eps},
            {"rope_theta", c.rope_theta}, {"rope_freq_scale", c.rope_freq_scale},
            {"rope_freq_factors", c.rope_freq_factors},
            {"rope", static_cast<int>(c.rope)},
            {"tied", c.tied_classifier},  {"qkv_bias", c.qkv_bias},
            {"weights", c.weights_dtype}, {"bos", c.bos_id},
            {"eos", c.eos_id},            {"tok_vocab", tokenizer.vocab_size()},
            {"tok_kind", tokenizer.kind()}};
  const std::string text = j.dump();
  std::uint64_t h = fnv1a64(text.data(), text.size());
  h = sampled_file_hash(model.path(), h);
  for (std::int64_t id = 0; id < tokenizer.vocab_size(); ++id) {
    const std::string t = tokenizer.token_text(static_cast<std::int32_t>(id));
    h = fnv1a64(t.data(), t.size(), h);
    h = fnv1a64("\0", 1, h);
  }
  return hex64(h);
}

std::vector<std::uint8_t> encode_session(const SessionRecord& r, const std::string& model_id,
                                         const std::string& template_name) {
  json history = json::array();
  for (const auto& m : r.history) history.push_back({{"role", m.role}, {"content", m.content}});
  const json header = {{"format", kFormat},
                       {"model", model_id},
                       {"template", template_name},
                       {"spec", r.spec},
                       {"history", std::move(history)},
                       {"tail", r.tail},
                       {"ended_with_eot", r.ended_with_eot},
                       {"tokens_seen", r.tokens_seen},
                       {"state_bytes", r.state.size()}};
  // Replacement keeps invalid UTF-8 (never produced: history holds the replies as sent) from
  // throwing here.
  const std::string text = header.dump(-1, ' ', false, json::error_handler_t::replace);
  // One allocation, filled by memcpy (vector::insert of a char range trips GCC 12's
  // -Warray-bounds false positive).
  std::vector<std::uint8_t> out(8 + 4 + text.size() + 16 + r.state.size());
  std::uint8_t* p = out.data();
  std::memcpy(p, kMagic, 8);
  p += 8;
  p = put_le(p, text.size(), 4);
  std::memcpy(p, text.data(), text.size());
  p += text.size();
  p = put_le(p, fnv1a64(text.data(), text.size()), 8);
  p = put_le(p, r.state.size(), 8);
  if (!r.state.empty()) std::memcpy(p, r.state.data(), r.state.size());
  return out;
}

SessionRecord decode_session(const std::vector<std::uint8_t>& bytes, const std::string& path,
                             const std::string& model_id, const std::string& template_name) {
  const std::size_t n = bytes.size();
  if (n < 12) corrupt(path, "truncated: " + std::to_string(n) + " bytes, a header needs 12");
  if (std::memcmp(bytes.data(), kMagic, 8) != 0) corrupt(path, "not a session file (bad magic)");
  const std::uint64_t hlen = get_le(bytes.data() + 8, 4);
  if (hlen > kMaxHeader || 12 + hlen + 16 > n) {
    corrupt(path, "truncated: the header says " + std::to_string(hlen) + " bytes, the file has " +
                      std::to_string(n));
  }
  const char* htext = reinterpret_cast<const char*>(bytes.data() + 12);
  const std::uint64_t sum = get_le(bytes.data() + 12 + hlen, 8);
  if (sum != fnv1a64(htext, hlen)) corrupt(path, "header checksum mismatch");
  const std::uint64_t slen = get_le(bytes.data() + 12 + hlen + 8, 8);
  if (slen != n - (12 + hlen + 16)) {
    corrupt(path, "the cache state should be " + std::to_string(slen) + " bytes, the file holds " +
                      std::to_string(n - (12 + hlen + 16)));
  }
  SessionRecord r;
  try {
    const json h = json::parse(htext, htext + hlen);
    if (h.at("format").get<int>() != kFormat) {
      corrupt(path, "format " + h.at("format").dump() + ", this server reads " +
                        std::to_string(kFormat));
    }
    if (h.at("model").get<std::string>() != model_id)
      corrupt(path, "saved by another model or tokenizer");
    if (h.at("template").get<std::string>() != template_name)
      corrupt(path, "saved with chat template '" + h.at("template").get<std::string>() + "'");
    r.spec = h.at("spec").get<std::string>();
    for (const auto& m : h.at("history")) {
      r.history.push_back(
          engine::Message{m.at("role").get<std::string>(), m.at("content").get<std::string>()});
    }
    r.tail = h.at("tail").get<std::vector<std::int32_t>>();
    r.ended_with_eot = h.at("ended_with_eot").get<bool>();
    r.tokens_seen = h.at("tokens_seen").get<std::int64_t>();
    if (h.at("state_bytes").get<std::uint64_t>() != slen)
      corrupt(path, "the header and the state length disagree");
    if (r.tokens_seen < 1 || r.tail.size() > 1)
      corrupt(path, "tokens_seen " + std::to_string(r.tokens_seen) + ", tail of " +
                        std::to_string(r.tail.size()) + " tokens");
  } catch (const json::exception& e) {
    corrupt(path, std::string("malformed header: ") + e.what());
  }
  r.state.assign(bytes.begin() + static_cast<std::ptrdiff_t>(12 + hlen + 16), bytes.end());
  return r;
}

// ---- SessionStore --------------------------------------------------------------------------

SessionStore::SessionStore(std::string dir, std::int64_t max_bytes, std::string model_id,
                           std::string template_name)
    : dir_(std::move(dir)),
      max_bytes_(max_bytes),
      model_id_(std::move(model_id)),
      template_(std::move(template_name)) {
  auto bad = [](const std::string& m) { throw Error(ErrorCode::kInvalidArgument, m); };
  if (max_bytes_ < 1) bad("--session-dir-bytes must be positive, got " + std::to_string(max_bytes_));
  std::error_code ec;
  if (!fs::exists(dir_, ec)) fs::create_directories(dir_, ec);
  if (ec || !fs::is_directory(dir_, ec)) {
    bad("--session-dir '" + dir_ + "': expected a directory (or a path one can be made at)" +
        (ec ? ": " + ec.message() : std::string(", found another kind of file")));
  }
  if (::access(dir_.c_str(), W_OK | X_OK) != 0)
    bad("--session-dir '" + dir_ + "': not writable by this process: " + std::strerror(errno));
  const auto now = fs::file_time_type::clock::now();
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const std::string name = e.path().filename().string();
    std::error_code ec2;
    if (name.rfind(kTmpPrefix, 0) == 0) {
      // A writer that died mid-file (this or another replica); a live one renames within seconds.
      if (now - e.last_write_time(ec2) > std::chrono::hours(1)) fs::remove(e.path(), ec2);
      continue;
    }
    if (e.path().extension() != kSuffix || !e.is_regular_file(ec2)) continue;
    ++stats_.files;
    stats_.bytes += static_cast<std::int64_t>(e.file_size(ec2));
  }
  thread_ = std::thread([this] { loop(); });
}

SessionStore::~SessionStore() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::string SessionStore::path_of(const std::string& spec,
                                  const std::vector<engine::Message>& history) const {
  std::uint64_t h = fnv1a64(model_id_.data(), model_id_.size());
  auto mix = [&](const std::string& s) {
    const std::uint64_t len = s.size();
    h = fnv1a64(&len, sizeof len, h);
    h = fnv1a64(s.data(), s.size(), h);
  };
  mix(template_);
  mix(spec);
  for (const auto& m : history) {
    mix(m.role);
    mix(m.content);
  }
  return (fs::path(dir_) / (hex64(h) + kSuffix)).string();
}

bool SessionStore::put(SessionRecord r, std::function<void()> done) {
  {
    std::lock_guard lock(mu_);
    const auto size = static_cast<std::int64_t>(r.state.size());
    if (size > max_bytes_ || queued_bytes_ + size > std::max<std::int64_t>(max_bytes_ / 4, size)) {
      ++stats_.skipped;
      return false;
    }
    queued_bytes_ += size;
    queue_.emplace_back(std::move(r), std::move(done));
  }
  cv_.notify_all();
  return true;
}

SessionStoreStats SessionStore::stats() {
  std::lock_guard lock(mu_);
  return stats_;
}

void SessionStore::loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) break;  // stopping, everything written
    SessionRecord r = std::move(queue_.front().first);
    const std::function<void()> done = std::move(queue_.front().second);
    queue_.pop_front();
    queued_bytes_ -= static_cast<std::int64_t>(r.state.size());
    lock.unlock();
    const std::string path = path_of(r.spec, r.history);
    enum { kWritten, kSkipped, kFailed } outcome = kWritten;
    try {
      const std::vector<std::uint8_t> bytes = encode_session(r, model_id_, template_);
      if (static_cast<std::int64_t>(bytes.size()) > max_bytes_) {
        outcome = kSkipped;
      } else {
        write_one(path, bytes);
      }
    } catch (const std::exception& e) {
      outcome = kFailed;
      std::fprintf(stderr, "serve: writing session file '%s' failed: %s\n", path.c_str(), e.what());
    }
    if (done) done();  // the reply ends now; the directory's bound is kept after it
    enforce_bound();
    lock.lock();
    ++(outcome == kWritten ? stats_.writes : outcome == kSkipped ? stats_.skipped
                                                                 : stats_.write_errors);
  }
}

void SessionStore::write_one(const std::string& path, const std::vector<std::uint8_t>& bytes) {
  char host[64] = {0};
  ::gethostname(host, sizeof host - 1);
  const std::string tmp = (fs::path(dir_) / (std::string(kTmpPrefix) + host + "-" +
                                             std::to_string(::getpid()) + "-" +
                                             std::to_string(tmp_counter_++)))
                              .string();
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throw Error(ErrorCode::kIoError, "cannot create '" + tmp + "': " + std::strerror(errno), tmp);
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      ::unlink(tmp.c_str());
      throw Error(ErrorCode::kIoError, "cannot write '" + tmp + "': " + why, tmp);
    }
    done += static_cast<std::size_t>(w);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw Error(ErrorCode::kIoError, "cannot flush '" + tmp + "': " + why, tmp);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw Error(ErrorCode::kIoError, "cannot rename '" + tmp + "' to '" + path + "': " + why, path);
  }
}

// Recounts DIR (other replicas write to it too) and removes the oldest session files until the
// rest fit --session-dir-bytes.
void SessionStore::enforce_bound() {
  struct Entry {
    fs::path path;
    fs::file_time_type time;
    std::int64_t size;
  };
  std::vector<Entry> files;
  std::int64_t total = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    std::error_code ec2;
    if (e.path().extension() != kSuffix || !e.is_regular_file(ec2)) continue;
    const auto size = static_cast<std::int64_t>(e.file_size(ec2));
    const auto time = e.last_write_time(ec2);
    if (ec2) continue;  // removed meanwhile
    files.push_back({e.path(), time, size});
    total += size;
  }
  std::int64_t removed = 0;
  if (total > max_bytes_) {
    std::sort(files.begin(), files.end(),
              [](const Entry& a, const Entry& b) { return a.time < b.time; });
    for (const auto& f : files) {
      if (total <= max_bytes_) break;
      std::error_code ec2;
      if (fs::remove(f.path, ec2)) ++removed;
      total -= f.size;
    }
  }
  std::lock_guard lock(mu_);
  stats_.removed += removed;
  stats_.files = static_cast<std::int64_t>(files.size()) - removed;
  stats_.bytes = total;
}

std::vector<std::pair<std::string, std::size_t>> SessionStore::candidates(
    const std::string& spec, const std::vector<engine::Message>& messages) const {
  std::vector<std::pair<std::string, std::size_t>> out;
  for (std::size_t k = messages.size(); k-- > 1;) {
    if (messages[k - 1].role != "assistant") continue;
    const std::vector<engine::Message> prefix(messages.begin(),
                                              messages.begin() + static_cast<std::ptrdiff_t>(k));
    std::string path = path_of(spec, prefix);
    std::error_code ec;
    if (fs::is_regular_file(path, ec)) out.emplace_back(std::move(path), k);
  }
  return out;
}

std::optional<SessionRecord> SessionStore::read(const std::string& path, const std::string& spec,
                                                const std::vector<engine::Message>& history) const {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  const std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                                        std::istreambuf_iterator<char>());
  if (in.bad()) corrupt(path, "read failed");
  SessionRecord r = decode_session(bytes, path, model_id_, template_);
  if (r.spec != spec || r.history != history) return std::nullopt;
  return r;
}

}  // namespace vq::serve
