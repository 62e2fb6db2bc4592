#include "base/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <vector>

#include "base/validate.h"
#include "veloxquant/errors.h"

namespace vq {
namespace {

[[noreturn]] void input_error(const std::string& path, const std::string& what) {
  throw Error(ErrorCode::kFileError, "'" + validate::excerpt(path, 200) + "': " + what, path);
}

std::mutex g_mutex;
std::vector<InputRecord> g_inputs;  // guarded by g_mutex
int g_recording = 0;                // live InputRecording scopes; guarded by g_mutex

// The absolute, lexically normalised path (no filesystem access beyond the current directory).
std::string normal_path(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path abs = std::filesystem::absolute(path, ec);
  return (ec ? std::filesystem::path(path) : abs).lexically_normal().string();
}

void record(const std::string& path, const std::string& flag, const struct stat& st) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_recording == 0) return;
  for (InputRecord& r : g_inputs) {
    if (r.dev == st.st_dev && r.ino == st.st_ino) {
      if (r.flag.empty()) r.flag = flag;
      return;
    }
  }
  g_inputs.push_back(InputRecord{path, flag, static_cast<std::uint64_t>(st.st_dev),
                                 static_cast<std::uint64_t>(st.st_ino)});
}

}  // namespace

const char* file_kind(unsigned mode) {
  const auto m = static_cast<mode_t>(mode);
  if (S_ISREG(m)) return "a regular file";
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISLNK(m)) return "a symbolic link";
  return "not a regular file";
}

InputFile InputFile::open(const std::string& path) {
  // O_NONBLOCK: open(2) of a FIFO with no writer returns at once instead of waiting; the
  // fstat below then refuses it before anything is read.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) input_error(path, std::string("cannot open: ") + std::strerror(errno));
  InputFile f;
  f.fd_ = fd;
  f.path_ = path;
  struct stat st {};
  if (::fstat(fd, &st) != 0) input_error(path, std::string("cannot stat: ") + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) input_error(path, "is a directory, expected a file");
  if (!S_ISREG(st.st_mode)) {
    input_error(path, std::string("is not a regular file (") + file_kind(st.st_mode) + ")");
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    input_error(path, std::string("cannot read: ") + std::strerror(errno));
  }
  f.size_ = static_cast<std::uint64_t>(st.st_size);
  f.dev_ = static_cast<std::uint64_t>(st.st_dev);
  f.ino_ = static_cast<std::uint64_t>(st.st_ino);
  f.mtime_ns_ = static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  record(path, "", st);
  return f;
}

InputFile::InputFile(InputFile&& other) noexcept
    : fd_(other.fd_),
      path_(std::move(other.path_)),
      size_(other.size_),
      dev_(other.dev_),
      ino_(other.ino_),
      mtime_ns_(other.mtime_ns_) {
  other.fd_ = -1;
}

InputFile& InputFile::operator=(InputFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
    path_ = std::move(other.path_);
    size_ = other.size_;
    dev_ = other.dev_;
    ino_ = other.ino_;
    mtime_ns_ = other.mtime_ns_;
  }
  return *this;
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

int InputFile::release() noexcept {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

std::string read_all(const InputFile& file, std::size_t max_bytes) {
  auto too_big = [&] {
    input_error(file.path(), "is larger than the " + std::to_string(max_bytes >> 20) +
                                 " MiB limit for text files (" + std::to_string(max_bytes) +
                                 " bytes)");
  };
  if (file.size() > max_bytes) too_big();
  std::string out;
  std::vector<char> buf(std::size_t{1} << 16);
  off_t offset = 0;
  while (true) {
    const ssize_t n = ::pread(file.fd(), buf.data(), buf.size(), offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      input_error(file.path(), std::string("read failed: ") + std::strerror(errno));
    }
    if (n == 0) break;
    const auto got = static_cast<std::size_t>(n);
    if (got > max_bytes - out.size()) too_big();  // a file that grew while being read
    out.append(buf.data(), got);
    offset += n;
  }
  return out;
}

InputRecording::InputRecording() {
  std::lock_guard<std::mutex> lock(g_mutex);
  ++g_recording;
}

InputRecording::~InputRecording() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (--g_recording == 0) g_inputs.clear();
}

void name_input(const std::string& flag, const std::string& path) {
  struct stat st {};
  if (path.empty() || ::stat(path.c_str(), &st) != 0) return;  // the loader reports it
  record(path, flag, st);
}

std::optional<InputRecord> input_named_by(const std::string& path) {
  struct stat st {};
  const bool exists = ::stat(path.c_str(), &st) == 0;
  const std::string norm = normal_path(path);
  std::lock_guard<std::mutex> lock(g_mutex);
  for (const InputRecord& r : g_inputs) {
    if (exists && r.dev == static_cast<std::uint64_t>(st.st_dev) &&
        r.ino == static_cast<std::uint64_t>(st.st_ino)) {
      return r;
    }
    if (normal_path(r.path) == norm) return r;
  }
  return std::nullopt;
}

void check_not_an_input(const std::string& flag, const std::string& path) {
  const std::optional<InputRecord> in = input_named_by(path);
  if (!in) return;
  const std::string origin = in->flag.empty() ? "" : " (" + in->flag + ")";
  throw Error(ErrorCode::kInvalidArgument,
              (flag.empty() ? "" : flag + ": ") + "cannot write '" +
                  validate::excerpt(path, 200) + "': it is the input '" +
                  validate::excerpt(in->path, 200) + "'" + origin +
                  " of this command; an output never replaces an input",
              path);
}

namespace {
std::atomic<std::uint64_t> g_memory_limit{0};
}  // namespace

std::uint64_t input_memory_limit() {
  const std::uint64_t m = g_memory_limit.load();
  return m == 0 ? kMaxHeaderBytes : std::min(m, kMaxHeaderBytes);
}

void set_input_memory_limit(std::uint64_t bytes) { g_memory_limit.store(bytes); }

void clear_inputs() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_inputs.clear();
}

}  // namespace vq
