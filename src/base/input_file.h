// Every file a command reads is opened here (issue 33): without blocking, checked as a regular
// file before a byte is read, and recorded, so that no output of the same run can replace it.
//
//   InputFile f = InputFile::open(path);     // a FIFO, device, socket or directory: refused
//   ... read f.fd() or mmap it ...           // the descriptor is blocking again after the check
//
//   check_not_an_input("--json", out_path);  // before writing: refuses an output that is an
//                                            // input of this run (same path, or same device
//                                            // and inode: a hard link, a symlinked directory)
//
// A FIFO given as an input used to block forever in open(2) (which waits for a writer) or in
// the first read; open() here passes O_NONBLOCK, so open returns at once, and fstat(2) on the
// descriptor refuses everything but a regular file. The record is process-wide and
// thread-safe; the CLI also names its input flags (name_input) so a refusal can say which flag
// the input came from.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

namespace vq {

// What a file of mode `mode` is, for messages: "a directory", "a FIFO", "a character device",
// "a block device", "a socket", "a symbolic link", "a regular file", "not a regular file".
const char* file_kind(unsigned mode);

class InputFile {
 public:
  // Opens `path` read-only and non-blocking, checks it with fstat, records it as an input of
  // this process and makes the descriptor blocking again. Throws Error(kFileError) naming the
  // path: "'/dev/zero' is not a regular file (a character device)", "'d' is a directory,
  // expected a file", "cannot open: No such file or directory".
  static InputFile open(const std::string& path);
  InputFile(InputFile&& other) noexcept;
  InputFile& operator=(InputFile&& other) noexcept;
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  ~InputFile();

  int fd() const noexcept { return fd_; }
  const std::string& path() const noexcept { return path_; }
  std::uint64_t size() const noexcept { return size_; }
  std::int64_t mtime_ns() const noexcept { return mtime_ns_; }
  std::uint64_t device() const noexcept { return dev_; }
  std::uint64_t inode() const noexcept { return ino_; }
  // Gives up ownership of the descriptor (the caller closes it).
  int release() noexcept;

 private:
  InputFile() = default;
  int fd_ = -1;
  std::string path_;
  std::uint64_t size_ = 0, dev_ = 0, ino_ = 0;
  std::int64_t mtime_ns_ = 0;
};

// Reads the whole of `file` from offset 0 (at most `max_bytes`, else Error(kFileError) naming
// the path and the limit).
std::string read_all(const InputFile& file, std::size_t max_bytes);

// Inputs are recorded only while an InputRecording is alive: the command-line tool keeps one for
// its one command (tools/main.cpp). A library user (tests, the Python module, a server that loads
// and writes many files in one process) records nothing unless it opts in the same way, so a
// file read by one task never blocks a later, unrelated write. Nestable; not for concurrent
// unrelated scopes (the record is process-wide).
class InputRecording {
 public:
  InputRecording();
  ~InputRecording();
  InputRecording(const InputRecording&) = delete;
  InputRecording& operator=(const InputRecording&) = delete;
};

// Records `path` as the input named by `flag` (e.g. "--model") when it exists; a directory
// records every regular file found by later opens under it only through InputFile::open.
// Nothing is opened (a FIFO is only stat'ed).
void name_input(const std::string& flag, const std::string& path);

struct InputRecord {
  std::string path;  // as opened
  std::string flag;  // the flag that named it, or "" for a file found by a loader
  std::uint64_t dev = 0, ino = 0;
};

// The recorded input that `path` names, by device and inode (when `path` exists) or by its
// absolute, normalised path; nullopt when `path` is no input of this process.
std::optional<InputRecord> input_named_by(const std::string& path);

// Throws Error(kInvalidArgument) when `path` is an input of this run: "<flag>: cannot write
// '<path>': it is the input '<input>' (--model) of this command; an output never replaces an
// input". `flag` may be "" (the message then starts with "cannot write").
void check_not_an_input(const std::string& flag, const std::string& path);

// Forgets every recorded input (tests; a long-running server that reloads).
void clear_inputs();

// The most memory the parsed header of one input file may take (GGUF metadata and tensor
// directory): kMaxHeaderBytes, or the command's --max-memory when smaller. Parsers charge what
// they will allocate against it before allocating and refuse the file past it.
inline constexpr std::uint64_t kMaxHeaderBytes = std::uint64_t{256} << 20;  // 256 MiB
std::uint64_t input_memory_limit();
// Sets the command's memory limit (--max-memory; 0: none beyond kMaxHeaderBytes).
void set_input_memory_limit(std::uint64_t bytes);

}  // namespace vq
