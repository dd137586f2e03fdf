#pragma once

// The fixture of the command-line tests: runs the hetmoe binary in a folder of its own per test and checks the
// error contract (one line "hetmoe: error: ...", exit status 1, never a signal).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/gguf/reader.h"
#include "runtime/gguf/writer.h"

namespace hetmoe::test_support {

namespace fs = std::filesystem;

inline const fs::path kModel = fs::path(HETMOE_TEST_DATA_DIR) / "models" / "tiny-deepseek3-Q4_K_M.gguf";

struct Result {
  int status = -1;  // exit status, or 128 + signal
  std::string out, err;
};

inline std::string read_all(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

class Cli : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("hetmoe_cli_" + std::to_string(::getpid()) + "_" +
                                        testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Runs hetmoe with `args` (and `env`, "NAME=value ..." in front of it).
  Result hetmoe(const std::string& args, const std::string& env = "") {
    const fs::path out = dir_ / "stdout", err = dir_ / "stderr";
    const std::string cmd =
        env + " " + std::string(HETMOE_BIN) + " " + args + " >" + out.string() + " 2>" + err.string();
    const int raw = std::system(cmd.c_str());
    Result r;
    r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
    r.out = read_all(out);
    r.err = read_all(err);
    return r;
  }

  // Asserts the one-line error contract and that the message contains `needle`.
  static void expect_error(const Result& r, const std::string& needle) {
    EXPECT_EQ(r.status, 1) << r.err;
    EXPECT_EQ(r.err.rfind("hetmoe: error: ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "not one line: " << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << "'" << needle << "' not in: " << r.err;
  }

  // A copy of the test model with its metadata or tensors changed on the way.
  fs::path rewrite(const std::string& name, const std::function<bool(std::string&, gguf::Value&)>& kv,
                   const std::function<bool(const gguf::TensorInfo&, gguf::GgufWriter&)>& tensor) {
    const gguf::GgufFile src = gguf::GgufFile::open(kModel.string());
    gguf::GgufWriter w;
    for (auto [key, value] : src.metadata())
      if (kv(key, value)) w.set(key, value);
    for (const gguf::TensorInfo& t : src.tensors()) {
      if (!tensor(t, w)) continue;
      w.add_tensor_bytes(t.name, t.type, std::vector<int64_t>(t.ne.begin(), t.ne.begin() + t.n_dims),
                         std::vector<uint8_t>(t.data, t.data + t.nbytes));
    }
    const fs::path p = dir_ / name;
    w.write(p.string());
    return p;
  }

  fs::path dir_;
};

}  // namespace hetmoe::test_support
