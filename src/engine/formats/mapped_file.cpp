#include "engine/formats/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "veloxquant/errors.h"

namespace vq::engine {

namespace {
[[noreturn]] void file_error(const std::string& path, const std::string& what) {
  throw Error(ErrorCode::kFileError, "'" + path + "': " + what, path);
}
}  // namespace

MappedFile::MappedFile(std::string path) : path_(std::move(path)) {
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) file_error(path_, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    file_error(path_, std::string("cannot stat: ") + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    file_error(path_,
               S_ISDIR(st.st_mode) ? "is a directory, expected a file" : "is not a regular file");
  }
  size_ = static_cast<std::size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      file_error(path_, std::string("cannot memory-map: ") + std::strerror(e));
    }
    data_ = static_cast<const std::uint8_t*>(p);
  }
  ::close(fd);  // the mapping stays valid
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<std::uint8_t*>(data_), size_);
}

std::string read_text_file(const std::string& path, std::size_t max_bytes) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    file_error(path, "is a directory, expected a file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) file_error(path, std::string("cannot open: ") + std::strerror(errno));
  auto too_big = [&] {
    file_error(path, "is larger than the " + std::to_string(max_bytes >> 20) +
                         " MiB limit for text files (" + std::to_string(max_bytes) + " bytes)");
  };
  if (S_ISREG(st.st_mode) && static_cast<std::uint64_t>(st.st_size) > max_bytes) too_big();
  std::string out;
  std::vector<char> buf(std::size_t{1} << 16);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const auto got = static_cast<std::size_t>(in.gcount());
    if (got > max_bytes - out.size()) too_big();
    out.append(buf.data(), got);
  }
  if (in.bad()) file_error(path, "read failed");
  return out;
}

}  // namespace vq::engine
