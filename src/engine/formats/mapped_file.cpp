#include "engine/formats/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/input_file.h"
#include "engine/formats/file_error.h"
#include "veloxquant/errors.h"

namespace vq::engine {


MappedFile::MappedFile(std::string path) : path_(std::move(path)) {
  // Non-blocking open and a regular-file check before anything is read (base/input_file.h).
  InputFile in = InputFile::open(path_);
  size_ = static_cast<std::size_t>(in.size());
  mtime_ns_ = in.mtime_ns();
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, in.fd(), 0);
    if (p == MAP_FAILED) file_error(path_, std::string("cannot memory-map: ") + std::strerror(errno));
    data_ = static_cast<const std::uint8_t*>(p);
  }
  fd_ = in.release();  // kept to notice a file that changes under the mapping (check_unchanged)
}

std::string MappedFile::change() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) return std::string("cannot stat it: ") + std::strerror(errno);
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size != size_) {
    return "its size changed from " + std::to_string(size_) + " to " + std::to_string(size) +
           " bytes since it was loaded";
  }
  const std::int64_t mtime =
      static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  if (mtime != mtime_ns_) return "it was modified since it was loaded";
  return {};
}

void MappedFile::check_unchanged() const {
  const std::string what = change();
  if (!what.empty()) {
    file_error(path_, what + "; a mapped model file must not change while it is in use "
                             "(restart to load the new file)");
  }
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<std::uint8_t*>(data_), size_);
  if (fd_ >= 0) ::close(fd_);
}

std::string read_text_file(const std::string& path, std::size_t max_bytes) {
  return read_all(InputFile::open(path), max_bytes);
}

}  // namespace vq::engine
