// io::OutputFile: a file is replaced whole or not at all, whatever stops the writer (an error, a full disk, a
// signal), and two writers of one target never share a temporary file.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/error.h"
#include "runtime/io/output_file.h"
#include "tests/support/small_fs.h"

namespace hetmoe::io {
namespace {

namespace fs = std::filesystem;

std::string read_all(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

class OutputFileTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("hetmoe_out_" + std::to_string(::getpid()) + "_" +
                                        testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(OutputFileTest, CommitReplacesTheTargetAndKeepsItsPermissions) {
  const fs::path target = dir_ / "out.json";
  std::ofstream(target) << "old";
  ::chmod(target.c_str(), 0640);
  OutputFile f(target.string());
  EXPECT_EQ(fs::path(f.temporary()).parent_path(), dir_);
  EXPECT_NE(f.temporary(), target.string() + ".tmp");
  f.print("{} {}", "new", 42);
  EXPECT_EQ(read_all(target), "old");  // nothing shows before the commit
  f.commit();
  EXPECT_EQ(read_all(target), "new 42");
  EXPECT_EQ(names_in(dir_), std::vector<std::string>{"out.json"});
  struct stat st {};
  ASSERT_EQ(::stat(target.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0640u);
}

TEST_F(OutputFileTest, NewFilesAreReadableAsUsual) {
  const fs::path target = dir_ / "new.bin";
  write_file(target.string(), std::string(3 << 20, 'x'));  // larger than the buffer: written straight through
  EXPECT_EQ(fs::file_size(target), 3u << 20);
  struct stat st {};
  ASSERT_EQ(::stat(target.c_str(), &st), 0);
  const mode_t mask = ::umask(0);
  ::umask(mask);
  EXPECT_EQ(st.st_mode & 07777, 0666u & ~mask);
}

// Bypassing the page cache (O_DIRECT where the file system takes it, as usual where not) writes the same bytes:
// pieces of every size, a piece past the aligned buffer's 16 MiB, and a tail that is no whole block.
void write_and_check_bypass(const fs::path& target) {
  std::string want;
  {
    OutputFile f(target.string(), OutputFile::Caching::kBypass);
    uint32_t state = 7;
    for (size_t piece : {size_t{1}, size_t{4095}, size_t{70000}, size_t{17} << 20, size_t{3}, size_t{5} << 20}) {
      std::string bytes(piece, '\0');
      for (char& c : bytes) c = static_cast<char>((state = state * 1664525u + 1013904223u) >> 24);
      f.write(bytes);
      want += bytes;
      EXPECT_EQ(f.size(), want.size());
    }
    f.commit();
  }
  EXPECT_EQ(fs::file_size(target), want.size());
  EXPECT_TRUE(read_all(target) == want);
}

TEST_F(OutputFileTest, BypassingThePageCacheWritesTheSameBytes) {
  write_and_check_bypass(dir_ / "direct.bin");
  test_support::SmallFs tmpfs(dir_ / "tmpfs", 64 << 10);  // tmpfs refuses O_DIRECT: the fallback
  if (!tmpfs.mounted()) GTEST_SKIP() << tmpfs.error();
  write_and_check_bypass(tmpfs.dir() / "buffered.bin");
}

TEST_F(OutputFileTest, AnExceptionBeforeTheCommitLeavesTheOldFile) {
  const fs::path target = dir_ / "chat.json";
  std::ofstream(target) << "precious";
  try {
    OutputFile f(target.string());
    f.write(std::string(5000, 'y'));
    throw std::runtime_error("the writer stopped");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(read_all(target), "precious");
  EXPECT_EQ(names_in(dir_), std::vector<std::string>{"chat.json"});
}

TEST_F(OutputFileTest, TwoWritersOfOneTargetDoNotShareATemporaryFile) {
  const fs::path target = dir_ / "model.gguf";
  OutputFile a(target.string()), b(target.string());
  EXPECT_NE(a.temporary(), b.temporary());
  a.write(std::string(100, 'a'));
  b.write(std::string(200, 'b'));
  a.commit();
  EXPECT_EQ(read_all(target), std::string(100, 'a'));
  b.commit();
  EXPECT_EQ(read_all(target), std::string(200, 'b'));  // each commit is one writer's whole file
  EXPECT_EQ(names_in(dir_), std::vector<std::string>{"model.gguf"});
}

TEST_F(OutputFileTest, AFolderOrAMissingFolderIsAClearError) {
  EXPECT_THROW(OutputFile(dir_.string()), Error);
  try {
    OutputFile f((dir_ / "no" / "such" / "file").string());
    FAIL() << "created a file in a missing folder";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no/such"), std::string::npos) << e.what();
  }
}

// A device or a pipe has nothing to replace: it is written in place. A symbolic link stays a link, and the file it
// points to is the one replaced.
TEST_F(OutputFileTest, DevicesAreWrittenInPlaceAndLinksStayLinks) {
  write_file("/dev/null", "discarded");
  struct stat st {};
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));

  const fs::path real = dir_ / "real.json", link = dir_ / "link.json";
  std::ofstream(real) << "old";
  fs::create_symlink(real, link);
  write_file(link.string(), "new");
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(read_all(real), "new");
  EXPECT_EQ(names_in(dir_), (std::vector<std::string>{"link.json", "real.json"}));
}

// The disk fills up: the write or the commit fails with a message naming the file, the old file is intact and no
// temporary file is left taking the space.
TEST_F(OutputFileTest, AFullDiskLeavesTheOldFile) {
  test_support::SmallFs fs(dir_ / "small", 64);
  if (!fs.mounted()) GTEST_SKIP() << fs.error();
  const fs::path target = fs.dir() / "profile.json";
  std::ofstream(target) << "precious";
  for (const size_t size : {size_t{100} << 10, size_t{4} << 20}) {  // fails at the commit / at the write
    try {
      OutputFile f(target.string());
      f.write(std::string(size, 'z'));
      f.commit();
      FAIL() << size << " bytes fit a 64 KiB file system";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("profile.json"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("No space left"), std::string::npos) << e.what();
    }
    EXPECT_EQ(read_all(target), "precious");
    EXPECT_EQ(names_in(fs.dir()), std::vector<std::string>{"profile.json"});
  }
}

// A signal in the middle of a write ends the program as the signal would, with the temporary file removed.
TEST_F(OutputFileTest, ASignalMidWriteRemovesTheTemporaryFile) {
  const fs::path target = dir_ / "split.gguf";
  std::ofstream(target) << "precious";
  for (const int sig : {SIGINT, SIGTERM}) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      std::signal(sig, SIG_DFL);  // whatever the test runner left: an ignored signal stays ignored
      install_signal_cleanup();
      OutputFile f(target.string());
      f.write(std::string(3 << 20, 'w'));
      ::raise(sig);
      f.commit();
      ::_exit(0);  // not reached
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status)) << "status " << status;
    EXPECT_EQ(WTERMSIG(status), sig);
    EXPECT_EQ(read_all(target), "precious");
    EXPECT_EQ(names_in(dir_), std::vector<std::string>{"split.gguf"});
  }
}

std::atomic<int> g_hooked{0};

// With an interrupt hook (chat stopping a reply), SIGINT only calls it: the program and its files go on.
TEST_F(OutputFileTest, AnInterruptHookKeepsTheProgramAndItsFiles) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::signal(SIGINT, SIG_DFL);
    install_signal_cleanup();
    set_interrupt_hook([](int) { g_hooked = 1; });
    OutputFile f((dir_ / "saved.json").string());
    f.write("{}");
    ::raise(SIGINT);
    f.commit();
    ::_exit(g_hooked == 1 ? 7 : 8);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 7);
  EXPECT_EQ(read_all(dir_ / "saved.json"), "{}");
}

}  // namespace
}  // namespace hetmoe::io
