// Every file hetmoe writes appears whole or not at all: on a full disk the command fails with one line and the old
// file stays; a signal mid-write leaves no temporary file; two writers of one name do not mix their bytes.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "runtime/gguf/reader.h"
#include "tests/support/cli.h"
#include "tests/support/small_fs.h"

namespace hetmoe {
namespace {

namespace fs = std::filesystem;
using test_support::Cli;
using test_support::kModel;
using test_support::read_all;
using test_support::Result;

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

class FullDisk : public Cli {
 protected:
  void SetUp() override {
    Cli::SetUp();
    small_ = std::make_unique<test_support::SmallFs>(dir_ / "small", 64);
    if (!small_->mounted()) GTEST_SKIP() << small_->error();
    // Whatever the command is about to replace, and filler up to the last byte the file system has.
    std::ofstream(small_->dir() / "old") << "precious";
    const int fd = ::open((small_->dir() / "filler").c_str(), O_WRONLY | O_CREAT, 0644);
    const std::string page(4096, 'f');
    while (::write(fd, page.data(), page.size()) > 0) {
    }
    ::close(fd);
  }
  void TearDown() override {
    small_.reset();
    Cli::TearDown();
  }

  // The command failed with a last line naming `old` (progress lines may come before it), which is as it was, and
  // nothing else appeared.
  void expect_old_file_kept(const Result& r) {
    EXPECT_EQ(r.status, 1) << r.err;
    const size_t last = r.err.rfind('\n', r.err.size() - 2);
    const std::string line = r.err.substr(last == std::string::npos ? 0 : last + 1);
    EXPECT_EQ(line.rfind("hetmoe: error: cannot write " + old() + ": No space left", 0), 0u) << r.err;
    EXPECT_EQ(read_all(small_->dir() / "old"), "precious");
    EXPECT_EQ(names_in(small_->dir()), (std::vector<std::string>{"filler", "old"}));
  }
  std::string old() const { return (small_->dir() / "old").string(); }

  std::unique_ptr<test_support::SmallFs> small_;
};

TEST_F(FullDisk, CalibrateDoesNotClaimAProfileWasWritten) {
  const Result r = hetmoe("calibrate -m " + kModel.string() + " --max-rows 2 -t 1 -o " + old());
  expect_old_file_kept(r);
  EXPECT_EQ(r.out.find("profile written"), std::string::npos) << r.out;
}

TEST_F(FullDisk, BenchJson) {
  expect_old_file_kept(hetmoe("bench -m " + kModel.string() + " --prompt 4 --gen 2 --repeat 1 -t 1 --json " + old()));
}

TEST_F(FullDisk, SimulateJsonAndSvg) {
  const fs::path hw = fs::path(HETMOE_SOURCE_DIR) / "profiles" / "xeon-amx-4090.json";
  const std::string sim = "simulate --hw " + hw.string() + " --prompt 16 --gen 2 --layers 3 ";
  expect_old_file_kept(hetmoe(sim + "--json " + old()));
  expect_old_file_kept(hetmoe(sim + "--svg " + old()));
}

TEST_F(FullDisk, RoutingTraceAndLogits) {
  expect_old_file_kept(
      hetmoe("run -m " + kModel.string() + " --tokens 3,17,42 -n 8 --temp 0 --print-ids --trace-routing " + old()));
  expect_old_file_kept(hetmoe("logits -m " + kModel.string() + " --tokens 3,17,42,9,11 --out " + old()));
}

TEST_F(FullDisk, SplitAndMakeModel) {
  expect_old_file_kept(hetmoe("split -m " + kModel.string() + " -t 1 -o " + old()));
  expect_old_file_kept(hetmoe("make-model --preset tiny-deepseek-v3 --layers 2 -t 1 -o " + old()));
}

// Two conversions to one name at once: each writes its own temporary file, so the one renamed last is whole.
TEST_F(Cli, TwoSplitsToOneNameDoNotMix) {
  const fs::path out = dir_ / "split.gguf";
  const std::string one = std::string(HETMOE_BIN) + " split -t 1 -m " + kModel.string() + " -o " + out.string();
  const std::string both = "(" + one + " --gpu-bits 2 >/dev/null 2>&1; echo $? >" + (dir_ / "a").string() + ") & (" +
                           one + " --gpu-bits 4 >/dev/null 2>&1; echo $? >" + (dir_ / "b").string() + ") & wait";
  ASSERT_EQ(std::system(both.c_str()), 0);
  EXPECT_EQ(read_all(dir_ / "a"), "0\n");
  EXPECT_EQ(read_all(dir_ / "b"), "0\n");
  const gguf::GgufFile f = gguf::GgufFile::open(out.string());  // throws on a mixed file
  const gguf::GgufFile src = gguf::GgufFile::open(kModel.string());
  EXPECT_GT(f.tensors().size(), src.tensors().size());
  for (const std::string& name : names_in(dir_)) EXPECT_EQ(name.find(".tmp"), std::string::npos) << name;
}

// Ctrl-C (or a kill) while make-model writes: the program ends by the signal, the temporary file is gone and the
// file it was replacing is as it was.
TEST_F(Cli, ASignalDuringMakeModelLeavesNoTemporaryFile) {
  for (const int sig : {SIGINT, SIGTERM}) {
    const fs::path out = dir_ / "model.gguf";
    std::ofstream(out) << "precious";
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      // The default dispositions, whatever the test runner left (an ignored SIGINT stays ignored in hetmoe).
      std::signal(SIGINT, SIG_DFL);
      std::signal(SIGTERM, SIG_DFL);
      const int null = ::open("/dev/null", O_WRONLY);
      ::dup2(null, 1);
      ::dup2(null, 2);
      ::execl(HETMOE_BIN, HETMOE_BIN, "make-model", "--preset", "deepseek-v2-lite", "--layers", "1", "--type", "Q4_0",
              "-t", "1", "-o", out.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    // Wait until its temporary file has data in it, then interrupt.
    bool writing = false;
    for (int i = 0; i < 3000 && !writing; ++i) {
      std::error_code ec;  // a file may go between listing and asking its size
      for (const auto& e : fs::directory_iterator(dir_, ec))
        if (e.path().string().ends_with(".tmp") && fs::file_size(e.path(), ec) > (1 << 20) && !ec) writing = true;
      if (!writing) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_TRUE(writing) << "make-model never wrote its temporary file";
    ::kill(child, sig);
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status)) << "status " << status;
    EXPECT_EQ(WTERMSIG(status), sig);
    EXPECT_EQ(read_all(out), "precious");
    for (const std::string& name : names_in(dir_)) EXPECT_EQ(name.find(".tmp"), std::string::npos) << name;
  }
}

}  // namespace
}  // namespace hetmoe
