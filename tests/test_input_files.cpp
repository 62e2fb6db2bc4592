// Issue 33, files: every input opened non-blocking and checked as a regular file, outputs that
// are inputs refused, mapped files that change noticed, GGUF headers that amplify refused,
// convert's round trip leaving nothing behind, and messages printable.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/input_file.h"
#include "base/validate.h"
#include "engine/formats/gguf.h"
#include "engine/formats/gguf_writer.h"
#include "engine/formats/mapped_file.h"
#include "veloxquant/errors.h"

namespace {
namespace fs = std::filesystem;

class InputFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("vq_input_files_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    vq::clear_inputs();
    recording_ = std::make_unique<vq::InputRecording>();
  }
  void TearDown() override {
    recording_.reset();
    vq::clear_inputs();
    vq::set_input_memory_limit(0);
    fs::remove_all(dir_);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  void write(const std::string& name, const std::string& bytes) const {
    std::ofstream(path(name), std::ios::binary) << bytes;
  }
  static std::string message_of(const std::function<void()>& f) {
    try {
      f();
    } catch (const vq::Error& e) {
      return e.what();
    }
    return "(no error)";
  }
  fs::path dir_;
  std::unique_ptr<vq::InputRecording> recording_;  // as the CLI does for its command
};

TEST_F(InputFiles, FifoIsRefusedWithoutBlocking) {
  const std::string fifo = path("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto t0 = std::chrono::steady_clock::now();
  // No writer ever opens the FIFO: a blocking open would never return.
  const std::string m = message_of([&] { vq::InputFile::open(fifo); });
  EXPECT_EQ(m, "'" + fifo + "': is not a regular file (a FIFO)");
  EXPECT_EQ(message_of([&] { vq::engine::read_text_file(fifo); }), m);
  EXPECT_EQ(message_of([&] { vq::engine::MappedFile f(fifo); }), m);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

TEST_F(InputFiles, DevicesAndDirectoriesAreRefused) {
  EXPECT_EQ(message_of([] { vq::InputFile::open("/dev/zero"); }),
            "'/dev/zero': is not a regular file (a character device)");
  EXPECT_EQ(message_of([&] { vq::InputFile::open(dir_.string()); }),
            "'" + dir_.string() + "': is a directory, expected a file");
  EXPECT_NE(message_of([&] { vq::InputFile::open(path("missing")); })
                .find("cannot open: No such file or directory"),
            std::string::npos);
}

TEST_F(InputFiles, ReadAllReadsTheWholeFileAndHoldsTheLimit) {
  write("a.txt", "hello\nworld");
  EXPECT_EQ(vq::read_all(vq::InputFile::open(path("a.txt")), 100), "hello\nworld");
  EXPECT_NE(message_of([&] { vq::read_all(vq::InputFile::open(path("a.txt")), 5); })
                .find("is larger than the 0 MiB limit for text files (5 bytes)"),
            std::string::npos);
}

TEST_F(InputFiles, AnOutputThatIsAnInputIsRefusedByPathAndByInode) {
  write("model.bin", "weights");
  ASSERT_EQ(::link(path("model.bin").c_str(), path("hard.bin").c_str()), 0);
  vq::name_input("--model", path("model.bin"));
  // The same file by path, through "..", and by a hard link (same device and inode).
  for (const std::string& out : {path("model.bin"), path("sub/../model.bin"), path("hard.bin")}) {
    EXPECT_EQ(message_of([&] { vq::check_not_an_input("--json", out); }),
              "--json: cannot write '" + out + "': it is the input '" + path("model.bin") +
                  "' (--model) of this command; an output never replaces an input")
        << out;
  }
  // A file a loader opened (no flag) is recorded too.
  write("config.json", "{}");
  (void)vq::InputFile::open(path("config.json"));
  EXPECT_EQ(message_of([&] { vq::check_not_an_input("--plot", path("config.json")); }),
            "--plot: cannot write '" + path("config.json") + "': it is the input '" +
                path("config.json") + "' of this command; an output never replaces an input");
  // Other files, existing or not, pass.
  write("other.json", "{}");
  EXPECT_NO_THROW(vq::check_not_an_input("--json", path("other.json")));
  EXPECT_NO_THROW(vq::check_not_an_input("--json", path("new.json")));
  vq::clear_inputs();
  EXPECT_NO_THROW(vq::check_not_an_input("--json", path("model.bin")));
}

TEST_F(InputFiles, NothingIsRecordedOutsideARecordingScope) {
  recording_.reset();  // a library user that did not opt in
  write("model.bin", "weights");
  (void)vq::InputFile::open(path("model.bin"));
  vq::name_input("--model", path("model.bin"));
  EXPECT_NO_THROW(vq::check_not_an_input("--json", path("model.bin")));
  {
    const vq::InputRecording scope;
    (void)vq::InputFile::open(path("model.bin"));
    EXPECT_THROW(vq::check_not_an_input("--json", path("model.bin")), vq::Error);
  }
  EXPECT_NO_THROW(vq::check_not_an_input("--json", path("model.bin")));  // forgotten at the end
}

TEST_F(InputFiles, AMappedFileThatChangesIsNoticed) {
  write("w.bin", std::string(4096, 'x'));
  vq::engine::MappedFile f(path("w.bin"));
  EXPECT_EQ(f.change(), "");
  EXPECT_NO_THROW(f.check_unchanged());
  ASSERT_EQ(::truncate(path("w.bin").c_str(), 100), 0);
  EXPECT_EQ(f.change(), "its size changed from 4096 to 100 bytes since it was loaded");
  EXPECT_NE(message_of([&] { f.check_unchanged(); })
                .find("'" + path("w.bin") + "': its size changed from 4096 to 100 bytes"),
            std::string::npos);
}

TEST_F(InputFiles, AMappedFileRewrittenInPlaceIsNoticed) {
  write("w.bin", std::string(64, 'x'));
  vq::engine::MappedFile f(path("w.bin"));
  // Same size, new modification time (set explicitly: a rewrite within the clock's tick would
  // keep it).
  const int fd = ::open(path("w.bin").c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  const struct timespec times[2] = {{0, UTIME_OMIT}, {12345, 0}};
  ASSERT_EQ(::futimens(fd, times), 0);
  ::close(fd);
  EXPECT_EQ(f.change(), "it was modified since it was loaded");
}

TEST_F(InputFiles, GgufWriteLeavesNothingWhenTheRoundTripFails) {
  write("out.gguf", "OLD");
  vq::engine::GgufWriter w;
  w.set("general.architecture", vq::engine::GgufValue::str("llama"));
  const std::string m = message_of([&] {
    w.write(path("out.gguf"), [](const std::string& temporary) {
      // The temporary file is complete when verify runs.
      const vq::engine::GgufFile g = vq::engine::GgufFile::open(temporary);
      EXPECT_EQ(g.get_string("general.architecture"), "llama");
      throw vq::Error(vq::ErrorCode::kFileError, "the loader refuses it");
    });
  });
  EXPECT_EQ(m, "the loader refuses it");
  std::ifstream in(path("out.gguf"));
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "OLD");
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename());
  EXPECT_EQ(names, std::vector<std::string>{"out.gguf"});  // no temporary file left
}

TEST_F(InputFiles, GgufWriteRefusesToReplaceAnInput) {
  write("in.gguf", "INPUT");
  (void)vq::InputFile::open(path("in.gguf"));
  vq::engine::GgufWriter w;
  w.set("general.architecture", vq::engine::GgufValue::str("llama"));
  EXPECT_NE(message_of([&] { w.write(path("in.gguf")); }).find("it is the input"),
            std::string::npos);
  std::ifstream in(path("in.gguf"));
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "INPUT");
}

// A GGUF header with one metadata array of `n` empty strings (8 bytes each in the file).
std::vector<std::uint8_t> string_array_gguf(std::uint64_t n) {
  std::vector<std::uint8_t> b;
  auto put = [&](const void* p, std::size_t k) {
    const auto* c = static_cast<const std::uint8_t*>(p);
    b.insert(b.end(), c, c + k);
  };
  auto u32 = [&](std::uint32_t v) { put(&v, 4); };
  auto u64 = [&](std::uint64_t v) { put(&v, 8); };
  put("GGUF", 4);
  u32(3);
  u64(0);  // tensors
  u64(1);  // metadata pairs
  u64(5);
  put("a.arr", 5);
  u32(9);  // array
  u32(8);  // of strings
  u64(n);
  b.resize(b.size() + 8 * n, 0);
  return b;
}

TEST_F(InputFiles, GgufMetadataThatAmplifiesIsRefusedBeforeAllocating) {
  // 100,000 empty strings: 800 KB in the file, 100,000 std::string objects (3.2 MB) parsed.
  const std::vector<std::uint8_t> bomb = string_array_gguf(100000);
  vq::set_input_memory_limit(std::uint64_t{1} << 20);
  const std::string m = message_of(
      [&] { vq::engine::GgufFile::parse(bomb.data(), bomb.size(), "bomb.gguf"); });
  EXPECT_NE(m.find("'bomb.gguf': the metadata and tensor directory would take more than 1 MiB "
                   "in memory (1048576 bytes; reached at 'a.arr'"),
            std::string::npos)
      << m;
  // The fixed cap applies without a --max-memory, and the same file parses under it.
  vq::set_input_memory_limit(0);
  EXPECT_EQ(vq::input_memory_limit(), vq::kMaxHeaderBytes);
  const vq::engine::GgufFile g = vq::engine::GgufFile::parse(bomb.data(), bomb.size(), "b.gguf");
  EXPECT_EQ(g.find("a.arr")->strings.size(), 100000u);
  // A --max-memory above the cap leaves the cap.
  vq::set_input_memory_limit(std::uint64_t{1} << 40);
  EXPECT_EQ(vq::input_memory_limit(), vq::kMaxHeaderBytes);
}

TEST_F(InputFiles, GgufElementErrorsStillNameTheElement) {
  std::vector<std::uint8_t> b = string_array_gguf(3);
  // Element 1's length: 1000 bytes, past the end of the file.
  const std::size_t at = b.size() - 16;
  const std::uint64_t len = 1000;
  std::memcpy(b.data() + at, &len, 8);
  const std::string m =
      message_of([&] { vq::engine::GgufFile::parse(b.data(), b.size(), "e.gguf"); });
  EXPECT_NE(m.find("the length of element 1 of 'a.arr'"), std::string::npos) << m;
}

TEST(Printable, EscapesControlAndBidiAndKeepsText) {
  using vq::validate::printable;
  EXPECT_EQ(printable("plain ± text"), "plain ± text");
  EXPECT_EQ(printable("a\x1b[31mb"), "a\\x1B[31mb");
  EXPECT_EQ(printable("line\nnext\ttab"), "line\\x0Anext\\x09tab");
  EXPECT_EQ(printable("x\xe2\x80\xaey"), "x\\xE2\\x80\\xAEy");      // U+202E RLO
  EXPECT_EQ(printable("x\xe2\x81\xa6y"), "x\\xE2\\x81\\xA6y");      // U+2066 LRI
  EXPECT_EQ(printable("x\xe2\x80\x8by"), "x\\xE2\\x80\\x8By");      // U+200B ZWSP
  EXPECT_EQ(printable("x\xc2\x85y"), "x\\xC2\\x85y");               // U+0085 NEL (C1)
  EXPECT_EQ(printable("bad \xff and \xc3"), "bad \\xFF and \\xC3");  // malformed UTF-8
  EXPECT_EQ(printable("\xe6\xa8\xa1\xe5\x9e\x8b"), "\xe6\xa8\xa1\xe5\x9e\x8b");  // 模型 kept
}

}  // namespace
