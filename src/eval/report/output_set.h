// The output files of one command run, committed together at the end or not at all.
//
// Usage (every command that writes files):
//   eval::OutputSet out;
//   out.declare("--json", json_path);   // before the run: validated now, nothing created
//   out.declare("--plot", plot_path);   // (an empty path from an unset optional flag: skip it
//                                       //  with `if (!path.empty())`; declare refuses "")
//   ... the run ...
//   out.stage("--json", doc.dump(2) + "\n");
//   out.stage("--plot", svg);
//   out.commit();                       // every declared output, or none
//
// Guarantees:
//  - declare() refuses, before any work, with Error(kIoError) naming the flag and the path: an
//    empty path; a path another declared output names (after resolving "." / ".." / symlinked
//    directories); a target that exists and is not a regular file (directory, device such as
//    /dev/null, FIFO, socket) or is a symbolic link; a path whose nearest existing ancestor is
//    not a writable directory; a path that is an input of this run (base/input_file.h: the
//    same file as the model, a shard, the tokenizer, the text or a selection file, by path or
//    by device and inode), checked again in commit() once the run has read every input. It
//    creates nothing.
//  - commit() creates the missing parent directories, writes each output to a new temporary
//    file (mkstemp, mode 0666 & ~umask) in its target's directory, flushes it to disk, checks
//    every target again (still absent or a regular file), then renames each temporary over its
//    target. If anything fails before the renames, every temporary file and every directory it
//    created are removed and every existing file is left as it was. A rename of the same
//    filesystem does not fail in practice; if one does, the message lists the outputs already
//    replaced.
//  - A run that throws before commit() leaves nothing behind (nothing was created).
#pragma once

#include <string>
#include <vector>

namespace vq::eval {

class OutputSet {
 public:
  // Validates `path` as the output of `flag` (e.g. "--json"); throws Error(kIoError).
  void declare(const std::string& flag, const std::string& path);
  // True when `flag` was declared.
  bool has(const std::string& flag) const;
  // The path declared for `flag` (throws Error(kInvalidState) when not declared).
  const std::string& path(const std::string& flag) const;
  // Sets the content of a declared output (replacing earlier content).
  void stage(const std::string& flag, std::string content);
  // Writes every declared output; each must have been staged (Error(kInvalidState) otherwise).
  // Throws Error(kIoError) naming the flag and path on failure, leaving nothing behind.
  void commit();
  // "FLAG PATH, FLAG PATH" for a closing "wrote ..." line.
  std::string summary() const;

 private:
  struct Output {
    std::string flag, path, key;  // key: the canonical path, to detect two flags on one file
    std::string content;
    bool staged = false;
  };
  Output& find(const std::string& flag);
  std::vector<Output> outputs_;
};

// Checks that `path` could be declared as an output (the checks of OutputSet::declare, alone).
void check_output_path(const std::string& flag, const std::string& path);

}  // namespace vq::eval
