// Every numeric flag is checked (finite, in range, with its unit in the message), llama.cpp's offload flags are
// read as hetmoe's settings or refused with the equivalent, and thread counts are bounded by the machine.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/support/cli.h"

namespace hetmoe {
namespace {

namespace fs = std::filesystem;
using test_support::Cli;
using test_support::kModel;
using test_support::Result;

// A usage error: one line, exit status 2, naming the flag and what it accepts.
void expect_usage_error(const Result& r, const std::string& needle) {
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_EQ(r.err.rfind("hetmoe: error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "not one line: " << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "'" << needle << "' not in: " << r.err;
  EXPECT_EQ(r.err.find("e+308"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("1.79"), std::string::npos) << r.err;
}

TEST_F(Cli, NumericFlagsAreFiniteAndInRange) {
  const std::string run = "run -m " + kModel.string() + " --tokens 3 -n 1 ";
  const fs::path hw = fs::path(HETMOE_SOURCE_DIR) / "profiles" / "xeon-amx-4090.json";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {run + "--temp nan", "--temp: nan is not a finite number"},
      {run + "--temp inf", "--temp: inf is not a finite number"},
      {run + "--min-p nan", "--min-p: nan is not a finite number"},
      {run + "--top-p 2", "--top-p: 2 is out of range: use 0 to 1"},
      {run + "--top-k -5", "--top-k: -5 is out of range: use 0 tokens or more"},
      {run + "--repeat-penalty 0", "--repeat-penalty: 0 is out of range"},
      {run + "--presence-penalty 1e300", "--presence-penalty: 1e300 is out of range: use -2 to 2"},
      {run + "--device-memory 1e12", "--device-memory: 1e12 is out of range: use 0 to 100000 GB"},
      {run + "--device-memory nan", "--device-memory: nan is not a finite number"},
      {run + "--link-gbs -1", "--link-gbs: -1 is out of range: use 0 to 10000 GB/s"},
      {run + "--move-slots 1e9", "--move-slots: 1e9 is out of range: use 0 to 4096 slots"},
      {run + "-c -3", "--ctx-size: -3 is out of range"},
      {run + "--temp abc", "--temp: 'abc' is not a number"},
      {"chat -m " + kModel.string() + " -n -5", "--n-predict: -5 is out of range: use -1 to 1000000000 tokens"},
      {"make-model --preset tiny-deepseek-v3 --layers -1 -o x.gguf", "--layers: -1 is out of range: use 1 to"},
      {"simulate --hw " + hw.string() + " --zipf nan", "--zipf: nan is not a finite number"},
      {"simulate --hw " + hw.string() + " --prompt 0", "--prompt: 0 is out of range"},
      {"bench -m " + kModel.string() + " --repeat 0", "--repeat: 0 is out of range: use 1 to 1000 runs"},
      {"calibrate -m " + kModel.string() + " --max-rows 1e9", "--max-rows: 1e9 is out of range"},
  };
  for (const auto& [args, needle] : cases) {
    SCOPED_TRACE(args);
    expect_usage_error(hetmoe(args), needle);
  }
}

TEST_F(Cli, LlamaCppOffloadFlagsMapOrPointToTheEquivalent) {
  const std::string run = "run -m " + kModel.string() + " --tokens 3,17,42 -n 3 --temp 0 --print-ids ";
  const Result plain = hetmoe(run + "--device emulated");
  ASSERT_EQ(plain.status, 0) << plain.err;

  // -ngl with the layer count or more: the pass on the device, as without it; never "-n gl".
  for (const std::string ngl : {"-ngl 99", "-ngl=3", "--n-gpu-layers 3"}) {
    const Result r = hetmoe(run + "--device emulated " + ngl);
    ASSERT_EQ(r.status, 0) << ngl << ": " << r.err;
    EXPECT_EQ(r.out, plain.out) << ngl;
    EXPECT_NE(r.err.find("the forward pass on the device"), std::string::npos) << r.err;
  }
  const Result none = hetmoe(run + "-ngl 0");
  ASSERT_EQ(none.status, 0) << none.err;
  EXPECT_NE(none.err.find("-ngl 0 -> --device cpu"), std::string::npos) << none.err;
  expect_usage_error(hetmoe(run + "-ngl 0 --device emulated"), "contradicts --device emulated");
  expect_usage_error(hetmoe(run + "-ngl 99 --device cpu"), "contradicts --device cpu");
  // bench compares the policies its --policies names: llama.cpp's policy flags are not its to take.
  expect_usage_error(hetmoe("bench -m " + kModel.string() + " --cpu-moe"), "--cpu-moe");
  expect_error(hetmoe(run + "-ngl 2 --device emulated"), "has 3 layers");

  // Routed experts on the CPU: --cpu-moe and -ot exps=CPU are --policy static.
  for (const std::string flag : {"--cpu-moe", "-ot exps=CPU", "--override-tensor '\\.ffn_.*_exps\\.=CPU'"}) {
    const Result r = hetmoe(run + "--device emulated " + flag);
    ASSERT_EQ(r.status, 0) << flag << ": " << r.err;
    EXPECT_NE(r.err.find("-> --policy static"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("): policy static: "), std::string::npos) << "the engine did not open static:\n" << r.err;
  }
  expect_usage_error(hetmoe(run + "--device emulated --cpu-moe --policy crossover"), "contradicts --policy crossover");
  expect_usage_error(hetmoe(run + "--n-cpu-moe 2"), "use --cpu-moe");
  expect_usage_error(hetmoe(run + "-ot 'blk\\.1\\.ffn_.*_exps=CPU'"), "does not pin some layers' experts");
  expect_usage_error(hetmoe(run + "-ot attn=CUDA0"), "places tensors by kind");
  expect_usage_error(hetmoe(run + "-ot exps"), "PATTERN=DEVICE");
  expect_usage_error(hetmoe(run + "-ot '(=CPU'"), "not a regular expression");
}

TEST_F(Cli, ThreadCountsAreBoundedByTheMachine) {
  const unsigned hardware = std::max(1u, std::thread::hardware_concurrency());
  const Result r = hetmoe("run -m " + kModel.string() + " --tokens 3 -n 1 --temp 0 --print-ids -t 9999");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find(fmt::format("-t 9999 is more than the {} hardware threads here; using {}", hardware, hardware)),
            std::string::npos)
      << r.err;
  for (const std::string bad : {"abc", "-1", "1e3", "1.5", "99999999999"})
    expect_usage_error(hetmoe("run -m " + kModel.string() + " --tokens 3 -t " + bad), "is not a thread count");
  // Commands that run on one thread do not take -t rather than ignore it.
  expect_usage_error(hetmoe("inspect -m " + kModel.string() + " -t 2"), "-t");
  expect_usage_error(hetmoe("tokenize -m " + kModel.string() + " -f x -t 2"), "-t");
}

TEST_F(Cli, RunAndChatShareTheLongNames) {
  for (const std::string n : {"-n 2", "--n-predict 2", "--max-tokens 2"}) {
    const Result r = hetmoe("run -m " + kModel.string() + " --tokens 3 --temp 0 --print-ids " + n);
    ASSERT_EQ(r.status, 0) << n << ": " << r.err;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), ' '), 1) << r.out;  // two ids
    const Result c = hetmoe("chat -m " + kModel.string() + " -t 1 " + n + " </dev/null");
    EXPECT_EQ(c.status, 0) << n << ": " << c.err;
  }
}

// Inputs that would block or grow without bound: a FIFO as the model (opened without blocking and refused), a
// character device or an oversized file as text or profile. `timeout` turns a hang into a failure.
TEST_F(Cli, InputsThatBlockOrNeverEndAreRefused) {
  const fs::path fifo = dir_ / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_error(hetmoe("inspect -m " + fifo.string(), "timeout 20"), "is a pipe (FIFO), not a GGUF model");
  expect_error(hetmoe("run --tokens 3 -m " + fifo.string(), "timeout 20"), "is a pipe (FIFO)");
  expect_error(hetmoe("tokenize -m " + kModel.string() + " -f /dev/zero", "timeout 20"),
               "/dev/zero is a character device, not a text file");
  // A pipe is read as it comes, within the same bound.
  const fs::path fox = dir_ / "fox.txt";
  std::ofstream(fox) << "The quick brown fox";
  const Result from_file = hetmoe("tokenize -m " + kModel.string() + " --no-bos -f " + fox.string());
  const Result piped =
      hetmoe("tokenize -m " + kModel.string() + " --no-bos -f /dev/stdin", "printf 'The quick brown fox' |");
  EXPECT_EQ(piped.status, 0) << piped.err;
  EXPECT_EQ(piped.out, from_file.out);
  const fs::path big = dir_ / "big.txt";
  fs::resize_file((std::ofstream(big), big), (uint64_t{256} << 20) + 1);  // sparse: no disk space taken
  expect_error(hetmoe("tokenize -m " + kModel.string() + " -f " + big.string(), "timeout 20"),
               "more than the 256 MiB hetmoe reads");
  expect_error(
      hetmoe("run --tokens 3 -m " + kModel.string() + " --device emulated --profile " + fifo.string(), "timeout 20"),
      fifo.string() + ": not valid JSON");  // a FIFO nobody writes is an empty input, not a wait
  expect_error(
      hetmoe("run --tokens 3 -m " + kModel.string() + " --device emulated --warm-trace /dev/zero", "timeout 20"),
      "a routing trace");
}

// kl compares distributions over one vocabulary: models of another architecture, hidden size or vocabulary are
// refused before any number is printed.
TEST_F(Cli, KlRefusesModelsThatCannotBeCompared) {
  const fs::path data = fs::path(HETMOE_TEST_DATA_DIR) / "models";
  const std::string kl = "kl --n-tokens 4 -t 1 --base " + kModel.string() + " -m ";
  const Result other_arch = hetmoe(kl + (data / "tiny-qwen3moe-Q4_K_M.gguf").string());
  expect_error(other_arch, "is a qwen3moe model and");
  EXPECT_EQ(other_arch.out, "");
  // The same model with one token's text changed: same sizes, another vocabulary.
  const fs::path renamed = rewrite(
      "renamed.gguf",
      [](std::string& key, gguf::Value& v) {
        if (key == "tokenizer.ggml.tokens") {
          std::vector<std::string> tokens = v.strings();
          tokens[100] = "<renamed>";
          v = gguf::Value::string_array(std::move(tokens));
        }
        return true;
      },
      [](const gguf::TensorInfo&, gguf::GgufWriter&) { return true; });
  const Result other_vocab = hetmoe(kl + renamed.string());
  expect_error(other_vocab, "different vocabularies (token 100 differs)");
  EXPECT_EQ(other_vocab.out, "");
  EXPECT_EQ(hetmoe(kl + kModel.string()).status, 0);
}

}  // namespace
}  // namespace hetmoe
