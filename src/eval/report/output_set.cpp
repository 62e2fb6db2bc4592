#include "eval/report/output_set.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "base/input_file.h"
#include "veloxquant/errors.h"

namespace vq::eval {
namespace fs = std::filesystem;

namespace {

[[noreturn]] void refuse(const std::string& flag, const std::string& path,
                         const std::string& what) {
  throw Error(ErrorCode::kIoError,
              (flag.empty() ? "" : flag + ": ") + "cannot write '" + path + "': " + what, path);
}

fs::path parent_of(const fs::path& p) {
  const fs::path parent = p.parent_path();
  return parent.empty() ? fs::path(".") : parent;
}

// What a non-regular file is, for messages.
const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "it is a directory";
  if (S_ISLNK(mode)) return "it is a symbolic link (name the file it points to instead)";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "it is a device, not a regular file";
  if (S_ISFIFO(mode)) return "it is a FIFO, not a regular file";
  if (S_ISSOCK(mode)) return "it is a socket, not a regular file";
  return "it is not a regular file";
}

// Refuses a target that exists and is not a regular file (symbolic links included).
void check_target(const std::string& flag, const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode)) refuse(flag, path, kind_of(st.st_mode));
    return;
  }
  if (errno != ENOENT && errno != ENOTDIR)
    refuse(flag, path, std::string("cannot inspect it: ") + std::strerror(errno));
}

// The nearest existing ancestor directory of `path`, and the missing directories below it
// (outermost first).
fs::path existing_ancestor(const fs::path& path, std::vector<fs::path>* missing) {
  fs::path dir = parent_of(path);
  std::vector<fs::path> below;
  while (true) {
    struct stat st {};
    if (::stat(dir.c_str(), &st) == 0) break;
    below.push_back(dir);
    const fs::path up = dir.parent_path();
    if (up.empty() || up == dir) {
      dir = fs::path(".");
      break;
    }
    dir = up;
  }
  if (missing != nullptr) missing->assign(below.rbegin(), below.rend());
  return dir;
}

// Removes what a failed commit made: temporary files, then created directories (innermost
// first). Best effort: this runs while another error is being reported.
void clean_up(const std::vector<std::string>& temps, const std::vector<fs::path>& dirs) {
  for (const auto& t : temps) ::unlink(t.c_str());
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) ::rmdir(it->c_str());
}

mode_t file_mode() {
  const mode_t mask = ::umask(0);
  ::umask(mask);
  return static_cast<mode_t>(0666 & ~mask);
}

}  // namespace

void check_output_path(const std::string& flag, const std::string& path) {
  if (path.empty()) refuse(flag, path, "the path is empty");
  const fs::path p(path);
  if (!p.has_filename()) refuse(flag, path, "the path names a directory, expected a file name");
  check_target(flag, path);
  const fs::path dir = existing_ancestor(p, nullptr);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    refuse(flag, path, "'" + dir.string() + "' is not a directory");
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    refuse(flag, path, "directory '" + dir.string() + "' is not writable: " + std::strerror(errno));
  }
}

void OutputSet::declare(const std::string& flag, const std::string& path) {
  if (has(flag)) {
    throw Error(ErrorCode::kInvalidState, "[outputs] " + flag + " declared twice");
  }
  check_output_path(flag, path);
  check_not_an_input(flag, path);  // the inputs named so far (base/input_file.h)
  std::error_code ec;
  fs::path key = fs::weakly_canonical(fs::absolute(path, ec), ec);
  if (ec) key = fs::absolute(path);
  for (const Output& o : outputs_) {
    if (o.key == key.string()) {
      throw Error(ErrorCode::kInvalidArgument,
                  o.flag + " and " + flag + " name the same file '" + path +
                      "' (each output needs its own file)",
                  path);
    }
  }
  outputs_.push_back(Output{flag, path, key.string(), {}, false});
}

bool OutputSet::has(const std::string& flag) const {
  for (const Output& o : outputs_) {
    if (o.flag == flag) return true;
  }
  return false;
}

OutputSet::Output& OutputSet::find(const std::string& flag) {
  for (Output& o : outputs_) {
    if (o.flag == flag) return o;
  }
  throw Error(ErrorCode::kInvalidState, "[outputs] " + flag + " was not declared");
}

const std::string& OutputSet::path(const std::string& flag) const {
  return const_cast<OutputSet*>(this)->find(flag).path;
}

void OutputSet::stage(const std::string& flag, std::string content) {
  Output& o = find(flag);
  o.content = std::move(content);
  o.staged = true;
}

std::string OutputSet::summary() const {
  std::string out;
  for (const Output& o : outputs_) out += (out.empty() ? "" : ", ") + o.path;
  return out;
}

void OutputSet::commit() {
  for (const Output& o : outputs_) {
    if (!o.staged) {
      throw Error(ErrorCode::kInvalidState, "[outputs] " + o.flag + " was declared but not staged");
    }
  }
  std::vector<fs::path> created;
  std::vector<std::string> temps(outputs_.size());
  const mode_t mode = file_mode();
  try {
    for (std::size_t i = 0; i < outputs_.size(); ++i) {
      const Output& o = outputs_[i];
      // The directory may have changed since declare(): check again, then create what is
      // missing, recording it so a failure removes it.
      check_output_path(o.flag, o.path);
      check_not_an_input(o.flag, o.path);  // every input the run read, found by the loaders
      std::vector<fs::path> missing;
      existing_ancestor(fs::path(o.path), &missing);
      for (const fs::path& d : missing) {
        if (::mkdir(d.c_str(), 0777) != 0 && errno != EEXIST) {
          refuse(o.flag, o.path,
                 "cannot create directory '" + d.string() + "': " + std::strerror(errno));
        }
        created.push_back(d);
      }
      std::string templ =
          (parent_of(fs::path(o.path)) / ("." + fs::path(o.path).filename().string() + ".XXXXXX"))
              .string();
      const int fd = ::mkstemp(templ.data());
      if (fd < 0) {
        refuse(o.flag, o.path,
               std::string("cannot create a temporary file: ") + std::strerror(errno));
      }
      temps[i] = templ;
      std::size_t done = 0;
      int err = 0;
      while (done < o.content.size()) {
        const ssize_t n = ::write(fd, o.content.data() + done, o.content.size() - done);
        if (n < 0) {
          if (errno == EINTR) continue;
          err = errno;
          break;
        }
        done += static_cast<std::size_t>(n);
      }
      if (err == 0 && ::fchmod(fd, mode) != 0) err = errno;
      if (err == 0 && ::fsync(fd) != 0) err = errno;
      if (::close(fd) != 0 && err == 0) err = errno;
      if (err != 0) refuse(o.flag, o.path, std::string("write failed: ") + std::strerror(err));
    }
    // Last check before anything is replaced: every target still absent or a regular file.
    for (const Output& o : outputs_) check_target(o.flag, o.path);
  } catch (...) {
    clean_up(temps, created);
    throw;
  }
  std::string replaced;
  for (std::size_t i = 0; i < outputs_.size(); ++i) {
    if (::rename(temps[i].c_str(), outputs_[i].path.c_str()) != 0) {
      const int e = errno;
      clean_up(
          std::vector<std::string>(temps.begin() + static_cast<std::ptrdiff_t>(i), temps.end()),
          {});
      refuse(outputs_[i].flag, outputs_[i].path,
             std::string("rename failed: ") + std::strerror(e) +
                 (replaced.empty() ? "" : " (already written: " + replaced + ")"));
    }
    replaced += (replaced.empty() ? "" : ", ") + outputs_[i].path;
  }
}

}  // namespace vq::eval
