// The command line on bad input: each case must end with exactly one line "hetmoe: error: ..." on stderr and
// exit status 1 (never a signal), and must leave the user's files as they were.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "quant/ggml_type.h"
#include "runtime/gguf/reader.h"
#include "runtime/gguf/writer.h"
#include "tests/support/cli.h"

namespace hetmoe {
namespace {

namespace fs = std::filesystem;

using test_support::Cli;
using test_support::kModel;
using test_support::read_all;
using test_support::Result;

const char* kTokens = "--tokens 3,17,42";

TEST_F(Cli, MissingFile) {
  expect_error(hetmoe("run -m " + (dir_ / "nope.gguf").string() + " " + kTokens), "nope.gguf");
}

TEST_F(Cli, TruncatedFile) {
  const std::string bytes = read_all(kModel);
  for (size_t cut : {size_t{3}, size_t{100}, bytes.size() / 2, bytes.size() - 1}) {
    const fs::path p = dir_ / "cut.gguf";
    std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(cut));
    expect_error(hetmoe("run -m " + p.string() + " " + kTokens), "offset");
  }
}

TEST_F(Cli, CorruptMagicAndVersion) {
  std::string bytes = read_all(kModel);
  const fs::path p = dir_ / "bad.gguf";
  bytes[0] = 'X';
  std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  expect_error(hetmoe("inspect -m " + p.string()), "magic");
  bytes[0] = 'G';
  bytes[4] = 9;  // version 9
  std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  expect_error(hetmoe("inspect -m " + p.string()), "version");
}

TEST_F(Cli, UnknownArchitecture) {
  const fs::path p = rewrite(
      "arch.gguf",
      [](std::string& key, gguf::Value& v) {
        if (key == "general.architecture") v = gguf::Value::string("gpt99");
        return true;
      },
      [](const gguf::TensorInfo&, gguf::GgufWriter&) { return true; });
  expect_error(hetmoe("run -m " + p.string() + " " + kTokens), "unsupported architecture 'gpt99'");
}

// A weight format hetmoe does not read (ggml's I8, type 24) is one line naming the tensor and the type.
TEST_F(Cli, UnknownWeightFormat) {
  std::string bytes = read_all(kModel);
  const std::string name = "output_norm.weight";
  const size_t at = bytes.find(name);  // the first occurrence is the tensor's info entry
  ASSERT_NE(at, std::string::npos);
  uint32_t n_dims = 0;
  std::memcpy(&n_dims, bytes.data() + at + name.size(), sizeof n_dims);
  ASSERT_EQ(n_dims, 1u);
  const uint32_t i8 = 24;
  std::memcpy(bytes.data() + at + name.size() + 4 + 8 * n_dims, &i8, sizeof i8);
  const fs::path p = dir_ / "i8.gguf";
  std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  expect_error(hetmoe("run -m " + p.string() + " " + kTokens),
               "tensor 'output_norm.weight' has unknown or unsupported type 24");
}

TEST_F(Cli, MissingTensor) {
  const fs::path p = rewrite(
      "missing.gguf", [](std::string&, gguf::Value&) { return true; },
      [](const gguf::TensorInfo& t, gguf::GgufWriter&) { return t.name != "blk.1.ffn_up_exps.weight"; });
  expect_error(hetmoe("run -m " + p.string() + " " + kTokens), "missing tensor 'blk.1.ffn_up_exps.weight'");
}

TEST_F(Cli, MisshapenTensor) {
  const fs::path p = rewrite(
      "shape.gguf", [](std::string&, gguf::Value&) { return true; },
      [](const gguf::TensorInfo& t, gguf::GgufWriter& w) {
        if (t.name != "blk.0.attn_output.weight") return true;
        // Same bytes, rows twice as long: {512, 128} instead of {256, 256}.
        w.add_tensor_bytes(t.name, t.type, {t.ne[0] * 2, t.ne[1] / 2}, std::vector<uint8_t>(t.data, t.data + t.nbytes));
        return false;
      });
  expect_error(hetmoe("run -m " + p.string() + " " + kTokens), "'blk.0.attn_output.weight' has shape");
}

// A weight stored in an activation format (Q8_K has no weight dot product) is refused at load, naming the tensor; found
// by fuzzing: the forward pass called a dot product the kernel table does not have.
TEST_F(Cli, WeightInAnActivationFormat) {
  const fs::path p = rewrite(
      "q8k.gguf", [](std::string&, gguf::Value&) { return true; },
      [](const gguf::TensorInfo& t, gguf::GgufWriter& w) {
        if (t.name != "blk.0.attn_output.weight") return true;
        const std::vector<int64_t> ne(t.ne.begin(), t.ne.begin() + t.n_dims);
        const size_t bytes = quant::row_bytes(quant::GgmlType::Q8_K, ne[0]) * static_cast<size_t>(t.n_rows);
        EXPECT_GT(bytes, 0u) << "rows of " << ne[0] << " are not whole Q8_K blocks";
        w.add_tensor_bytes(t.name, quant::GgmlType::Q8_K, ne, std::vector<uint8_t>(bytes));
        return false;
      });
  expect_error(hetmoe("run -m " + p.string() + " " + kTokens),
               "tensor 'blk.0.attn_output.weight' is stored as Q8_K, which hetmoe does not multiply with");
}

// Broken weights (NaN or infinity) stop generation with an error that says where, instead of running on and printing
// token 0 over and over; on the CPU and with the pass on the (emulated) device.
TEST_F(Cli, NonFiniteWeightsStopWithTheLayer) {
  // The tensor `name` with every byte 0xFF: an F32 tensor becomes NaNs, a quantized one NaN block scales.
  auto broken = [&](const std::string& file, const std::string& name) {
    return rewrite(
        file, [](std::string&, gguf::Value&) { return true; },
        [name](const gguf::TensorInfo& t, gguf::GgufWriter& w) {
          if (t.name != name) return true;
          w.add_tensor_bytes(t.name, t.type, std::vector<int64_t>(t.ne.begin(), t.ne.begin() + t.n_dims),
                             std::vector<uint8_t>(t.nbytes, 0xFF));
          return false;
        });
  };
  const fs::path norm = broken("norm.gguf", "blk.1.ffn_norm.weight");
  const fs::path embd = broken("embd.gguf", "token_embd.weight");
  const fs::path head = broken("head.gguf", "output.weight");
  // The device's notes come first on stderr; the error is the last line.
  auto last_line_error = [](const Result& r, const std::string& needle) {
    EXPECT_EQ(r.status, 1) << r.err;
    const size_t start = r.err.rfind('\n', r.err.size() - 2);
    const std::string line = r.err.substr(start == std::string::npos ? 0 : start + 1);
    EXPECT_EQ(line.rfind("hetmoe: error: ", 0), 0u) << r.err;
    EXPECT_NE(line.find(needle), std::string::npos) << "'" << needle << "' not in: " << r.err;
  };
  for (const std::string device : {"cpu", "emulated"}) {
    SCOPED_TRACE(device);
    const std::string run = " --tokens 3,17,42 -n 4 --temp 0 --print-ids --device " + device;
    last_line_error(hetmoe("run -m " + norm.string() + run), "NaN or infinity in layer 1 (the output of blk.1)");
    last_line_error(hetmoe("run -m " + embd.string() + run), "embedding of token 3");
    last_line_error(hetmoe("run -m " + head.string() + run), "NaN or infinity in the logits");
  }
}

// Hyperparameter errors name the key that is wrong (not a later check it upsets).
TEST_F(Cli, HyperparameterErrorsNameTheKey) {
  auto with = [&](const std::string& file, const std::string& key, gguf::Value value) {
    return rewrite(
        file,
        [&](std::string& k, gguf::Value& v) {
          if (k == key) v = value;
          return true;
        },
        [](const gguf::TensorInfo&, gguf::GgufWriter&) { return true; });
  };
  expect_error(hetmoe("inspect -m " + with("experts.gguf", "deepseek2.expert_count", gguf::Value::u32(0)).string()),
               "deepseek2.expert_count = 0 is out of range");
  expect_error(hetmoe("inspect -m " + with("key.gguf", "deepseek2.attention.key_length", gguf::Value::u32(0)).string()),
               "deepseek2.attention.key_length = 0 is out of range");
  expect_error(
      hetmoe("inspect -m " + with("groups.gguf", "deepseek2.expert_group_count", gguf::Value::u32(3)).string()),
      "deepseek2.expert_group_count = 3 does not divide");
  expect_error(hetmoe("inspect -m " + with("vocab.gguf", "deepseek2.vocab_size", gguf::Value::u32(1000)).string()),
               "deepseek2.vocab_size = 1000 differs from the 512 entries of tokenizer.ggml.tokens");
  expect_error(hetmoe("inspect -m " +
                      with("eps.gguf", "deepseek2.attention.layer_norm_rms_epsilon", gguf::Value::f32(-1)).string()),
               "deepseek2.attention.layer_norm_rms_epsilon = -1 is out of range");
  // Found by fuzzing: the shared experts' width overflowed.
  expect_error(
      hetmoe("inspect -m " +
             with("shared.gguf", "deepseek2.expert_shared_count", gguf::Value::u64(uint64_t{1} << 60)).string()),
      "deepseek2.expert_shared_count = 1152921504606846976 is out of range");
  // Found by fuzzing: a double epsilon too small for a float became 0.
  expect_error(
      hetmoe("inspect -m " +
             with("eps64.gguf", "deepseek2.attention.layer_norm_rms_epsilon", gguf::Value::f64(1e-50)).string()),
      "deepseek2.attention.layer_norm_rms_epsilon = 1e-50 is out of range");
  // Found by fuzzing: a huge YaRN log multiplier made the attention scale infinite.
  expect_error(
      hetmoe("inspect -m " +
             with("yarn.gguf", "deepseek2.rope.scaling.yarn_log_multiplier", gguf::Value::f32(1e30f)).string()),
      "deepseek2.rope.scaling.yarn_log_multiplier = 1e+30 is out of range");
}

// A tokenizer of fewer tokens than the embedding has rows is refused at load (it used to fail once such an id was
// sampled); a special token id outside the vocabulary is dropped with a warning.
TEST_F(Cli, VocabularyAndSpecialTokensAreCheckedAtLoad) {
  const fs::path small = rewrite(
      "small-vocab.gguf",
      [](std::string& key, gguf::Value& v) {
        if (key == "tokenizer.ggml.tokens") {
          std::vector<std::string> tokens = v.strings();
          tokens.resize(500);
          v = gguf::Value::string_array(std::move(tokens));
        }
        return key != "deepseek2.vocab_size";  // no key to disagree with: the embedding's rows must
      },
      [](const gguf::TensorInfo&, gguf::GgufWriter&) { return true; });
  expect_error(hetmoe("run -m " + small.string() + " " + kTokens), "token_embd.weight");
  const fs::path bos = rewrite(
      "bos.gguf",
      [](std::string& key, gguf::Value& v) {
        if (key == "tokenizer.ggml.eos_token_id") v = gguf::Value::u32(99999);
        return true;
      },
      [](const gguf::TensorInfo&, gguf::GgufWriter&) { return true; });
  const fs::path text = dir_ / "text.txt";
  std::ofstream(text) << "hello";
  const Result r = hetmoe("tokenize -m " + bos.string() + " -f " + text.string());
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("hetmoe: warning: " + bos.string() +
                       ": tokenizer.ggml.eos_token_id = 99999 is outside the vocabulary of 512 tokens"),
            std::string::npos)
      << r.err;
}

TEST_F(Cli, MissingMetadataKey) {
  const fs::path p = rewrite(
      "key.gguf", [](std::string& key, gguf::Value&) { return key != "deepseek2.embedding_length"; },
      [](const gguf::TensorInfo&, gguf::GgufWriter&) { return true; });
  expect_error(hetmoe("inspect -m " + p.string()), "deepseek2.embedding_length");
}

TEST_F(Cli, TokenOutOfRange) {
  expect_error(hetmoe("run -m " + kModel.string() + " --tokens 3,512"), "token id 512 is out of range");
  expect_error(hetmoe("run -m " + kModel.string() + " --tokens -1"), "token id -1 is out of range");
  expect_error(hetmoe("run -m " + kModel.string() + " --tokens 3,x"), "--tokens");
}

TEST_F(Cli, ContextOverflowKeepsWhatWasGenerated) {
  const Result r = hetmoe("run -m " + kModel.string() + " --tokens 3,17,42 -n 5 -c 4 --print-ids");
  expect_error(r, "context full");
  // The prompt fills 3 of 4 positions: two tokens come out (the second cannot be evaluated) before the error.
  std::istringstream ids(r.out);
  int count = 0, id;
  while (ids >> id) ++count;
  EXPECT_EQ(count, 2) << r.out;
  expect_error(hetmoe("run -m " + kModel.string() + " --tokens 3,17,42 -n 1 -c 2"), "context full");
}

TEST_F(Cli, FailedCommandsLeaveExistingFilesAlone) {
  const fs::path out = dir_ / "keep.bin";
  std::ofstream(out) << "precious";
  expect_error(hetmoe("logits -m " + kModel.string() + " --tokens 3,999 --out " + out.string()), "out of range");
  EXPECT_EQ(read_all(out), "precious");
  expect_error(hetmoe("make-model --preset tiny-deepseek-v3 --layers 100000 -o " + out.string()), "layers");
  EXPECT_EQ(read_all(out), "precious");
  EXPECT_EQ(hetmoe("logits -m " + kModel.string() + " --tokens 3 --out " + (dir_ / "no/such/dir/x").string()).status,
            1);
}

TEST_F(Cli, TextPromptNeedsATokenizer) {
  const fs::path p = rewrite(
      "notok.gguf", [](std::string& key, gguf::Value&) { return key.rfind("tokenizer.", 0) != 0; },
      [](const gguf::TensorInfo&, gguf::GgufWriter&) { return true; });
  expect_error(hetmoe("run -m " + p.string() + " -p hello -n 2"), "tokenizer");
  // Token ids need no tokenizer.
  EXPECT_EQ(hetmoe("run -m " + p.string() + " --tokens 3,17 -n 2 --temp 0 --print-ids").status, 0);
}

TEST_F(Cli, PromptLongerThanTheContext) {
  expect_error(hetmoe("run -m " + kModel.string() + " -p 'a rather long prompt for four positions' -c 4 -n 1"),
               "context full");
  expect_error(hetmoe("run -m " + kModel.string() + " -p \"$(printf 'bad \\377 byte')\" -n 1"), "not valid UTF-8");
}

TEST_F(Cli, TokenizePrintsTheIdsOfTheFileBytes) {
  // tokenize-tiny.json: llama.cpp's ids for the tiny deepseek3 vocabulary, no BOS.
  const fs::path text = dir_ / "text.txt";
  std::ofstream(text, std::ios::binary) << "The quick brown fox jumps over the lazy dog.";
  const Result r = hetmoe("tokenize -m " + kModel.string() + " -f " + text.string() + " --no-bos");
  ASSERT_EQ(r.status, 0) << r.err;
  std::istringstream ids(r.out);
  std::vector<int> got;
  for (int id; ids >> id;) got.push_back(id);
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  const Result with_bos = hetmoe("tokenize -m " + kModel.string() + " -f " + text.string());
  ASSERT_EQ(with_bos.status, 0);
  EXPECT_EQ(with_bos.out, "0 " + r.out) << "the deepseek vocabulary asks for BOS 0";
  EXPECT_EQ(got, (std::vector<int>{305, 360, 464, 279, 494, 357, 123, 35, 476, 280, 353, 265, 298, 412, 356, 481, 49}));
  expect_error(hetmoe("tokenize -m " + kModel.string() + " -f " + (dir_ / "missing.txt").string()), "missing.txt");
}

TEST_F(Cli, BenchWritesTheAgreedJsonFields) {
  const fs::path json = dir_ / "bench.json";
  const fs::path svg = dir_ / "bench.svg";
  const Result r = hetmoe("bench -m " + kModel.string() + " --policies cpu --prompt 8 --gen 4 -t 1 --repeat 2 --json " +
                          json.string() + " --svg " + svg.string());
  ASSERT_EQ(r.status, 0) << r.err;
  // Without a profile the picture says that is why it has no curves (not "no device"), and nothing is emulated.
  const std::string picture = read_all(svg);
  EXPECT_NE(picture.find("no --profile given"), std::string::npos) << picture;
  EXPECT_EQ(picture.find("EMULATED"), std::string::npos) << picture;
  const std::string j = read_all(json);
  // The medians in the agreed fields, and every run kept: two of them here.
  size_t runs = 0;
  for (size_t at = j.find("\"runs\""); at != std::string::npos;) {
    at = j.find("\"decode_tok_s\"", at + 1);
    if (at != std::string::npos) ++runs;
  }
  EXPECT_EQ(runs, 2u) << j;
  // Later issues add fields; these names are fixed.
  for (const char* field :
       {"\"model\"", "\"results\"", "\"policy\": \"cpu\"", "\"device\"", "\"threads\": 1", "\"prefill_tok_s\"",
        "\"decode_tok_s\"", "\"bytes_per_token\": 2602256", "\"roofline_fraction\""})
    EXPECT_NE(j.find(field), std::string::npos) << field << " missing in " << j;
  expect_error(hetmoe("bench -m " + kModel.string() + " --policies gpu"), "unknown policy 'gpu'");
  EXPECT_EQ(hetmoe("bench -m " + kModel.string() + " --repeat 0").status, 2);  // a usage error (test_flags.cpp)
}

// Drafts change how many tokens a step evaluates, not which: run prints the plain greedy ids with them, and says
// how the drafts fared. N-gram drafts on any file; MTP drafts on a file with the block (GLM-4.5's NextN).
TEST_F(Cli, RunWithDraftsGivesThePlainGreedyTokens) {
  const std::string ngram_run = "run -m " + kModel.string() + " --tokens 3,17,42,3,17,42,3,17 -n 48 --temp 0 -t 1";
  const std::string mtp_run = "run -m " + (kModel.parent_path() / "tiny-glm4moe-Q4_K_M.gguf").string() +
                              " --tokens 11,64,128,5,11,64 -n 16 --temp 0 -t 1";
  for (const auto& [run, draft] : {std::pair{ngram_run, std::string(" --draft ngram --draft-max 4")},
                                   std::pair{mtp_run, std::string(" --draft mtp --draft-max 2")}}) {
    SCOPED_TRACE(draft);
    const Result plain = hetmoe(run + " --print-ids");
    const Result drafted = hetmoe(run + " --print-ids" + draft);
    ASSERT_EQ(plain.status, 0) << plain.err;
    ASSERT_EQ(drafted.status, 0) << drafted.err;
    EXPECT_EQ(drafted.out, plain.out);
    const Result said = hetmoe(run + draft);
    ASSERT_EQ(said.status, 0) << said.err;
    EXPECT_NE(said.err.find("accepted"), std::string::npos) << said.err;
  }
  EXPECT_EQ(hetmoe(ngram_run + " --draft lookahead").status, 2);  // not a source (a usage error)
  EXPECT_EQ(hetmoe(ngram_run + " --draft ngram --draft-max 0").status, 2);
  // This file has no MTP block: a one-line error before anything runs.
  expect_error(hetmoe(ngram_run + " --draft mtp"), "no MTP block");
}

// bench --draft: the verification cost curve from one token (cost 1) to --draft-max drafts, and --draft-text's
// replay of a reply that repeats its prompt: drafts accepted, never more than were drafted.
TEST_F(Cli, BenchMeasuresVerificationCostsAndReplaysADraftText) {
  const fs::path json = dir_ / "bench.json", text = dir_ / "repeat.txt";
  const std::string passage = "the cat sat on the mat and the dog lay by the door of the old house\n";
  std::ofstream(text) << "Repeat: " << passage << "\n===\n" << passage;
  const Result r = hetmoe("bench -m " + kModel.string() + " --prompt 8 --gen 8 -t 1 --repeat 1 --draft ngram " +
                          "--draft-max 3 --draft-text " + text.string() + " --json " + json.string());
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(read_all(json));
  ASSERT_EQ(j["verification"].size(), 4u) << j.dump();
  EXPECT_EQ(j["verification"][0]["cost"], 1.0);
  for (const auto& v : j["verification"]) EXPECT_GT(v["seconds"].get<double>(), 0.0);
  const nlohmann::json& replay = j["draft_text"];
  EXPECT_GT(replay["reply_tokens"].get<int>(), 10);
  EXPECT_GT(replay["accepted"].get<int>(), replay["drafted"].get<int>() / 2) << replay.dump();
  EXPECT_LE(replay["accepted"].get<int>(), replay["drafted"].get<int>());
  EXPECT_LT(replay["steps"].get<int>(), replay["reply_tokens"].get<int>());
  EXPECT_NE(r.out.find("verification step"), std::string::npos) << r.out;
  expect_error(hetmoe("bench -m " + kModel.string() + " --draft-text " + text.string()), "--draft ngram");
  // MTP drafts: each step's cost counts the block's proposal too, and the replay runs the model for its hidden states.
  const Result mtp = hetmoe("bench -m " + (kModel.parent_path() / "tiny-glm4moe-Q4_K_M.gguf").string() +
                            " --prompt 8 --gen 8 -t 1 --repeat 1 --draft mtp --draft-max 2 --draft-text " +
                            text.string() + " --json " + json.string());
  ASSERT_EQ(mtp.status, 0) << mtp.err;
  const nlohmann::json jm = nlohmann::json::parse(read_all(json));
  ASSERT_EQ(jm["verification"].size(), 3u) << jm.dump();
  EXPECT_EQ(jm["verification"][0]["draft_seconds"], 0.0);
  for (int k : {1, 2}) {
    const double verify = jm["verification"][k]["seconds"], draft = jm["verification"][k]["draft_seconds"];
    EXPECT_GT(draft, 0.0);
    EXPECT_NEAR(jm["verification"][k]["cost"].get<double>(),
                (verify + draft) / jm["verification"][0]["seconds"].get<double>(), 1e-9);
  }
  EXPECT_LE(jm["draft_text"]["accepted"].get<int>(), jm["draft_text"]["drafted"].get<int>());
  EXPECT_GT(jm["draft_text"]["drafted"].get<int>(), 0);
  std::ofstream(text) << "no separator";
  expect_error(hetmoe("bench -m " + kModel.string() + " --draft ngram --draft-text " + text.string()), "'==='");
}

// --vs-llama-bench runs the given llama-bench (here a script printing llama-bench's JSON: 100 tok/s prefill, 25 tok/s
// decode) with the same file, threads, lengths and depth, alternating with hetmoe's runs, and prints both with ratios;
// a llama-bench that fails is reported with its last line.
TEST_F(Cli, BenchSideBySideWithLlamaBench) {
  const fs::path fake = dir_ / "llama-bench", args = dir_ / "args.txt", json = dir_ / "vs.json";
  std::ofstream(fake) << "#!/bin/sh\necho \"$@\" >> " << args.string() << "\n"
                      << "echo 'main: loading model'\n"
                      << "echo '[\n  {\"n_prompt\": 8, \"n_gen\": 0, \"avg_ts\": 100.0},\n"
                      << "  {\"n_prompt\": 0, \"n_gen\": 4, \"avg_ts\": 25.0}\n]'\n";
  fs::permissions(fake, fs::perms::owner_all);
  const Result r = hetmoe("bench -m " + kModel.string() + " --prompt 8 --gen 4 -t 1 --repeat 2 --vs-llama-bench " +
                          fake.string() + " --json " + json.string());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("llama.cpp"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("100.0 [100.0-100.0]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("25.0 [25.0-25.0]"), std::string::npos) << r.out;
  // A warm-up and two measured runs, each with the model, threads and lengths of hetmoe's.
  const std::string called = read_all(args);
  EXPECT_EQ(std::count(called.begin(), called.end(), '\n'), 3) << called;
  EXPECT_NE(called.find("-m " + kModel.string() + " -t 1 -p 8 -n 4 -r 1 -o json"), std::string::npos) << called;
  const nlohmann::json j = nlohmann::json::parse(read_all(json));
  EXPECT_EQ(j["llama_decode_tok_s"], nlohmann::json::array({25.0, 25.0}));
  EXPECT_EQ(j["hetmoe_decode_tok_s"].size(), 2u);
  EXPECT_EQ(j["depth_tokens"], 0);
  // --depth: both after that many tokens of context, llama-bench through its -d.
  fs::remove(args);
  const Result deep = hetmoe("bench -m " + kModel.string() + " --prompt 8 --gen 4 --depth 6 -t 1 --repeat 1 " +
                             "--vs-llama-bench " + fake.string() + " --json " + json.string());
  ASSERT_EQ(deep.status, 0) << deep.err;
  EXPECT_NE(deep.out.find("at depth 6"), std::string::npos) << deep.out;
  EXPECT_NE(read_all(args).find("-p 8 -n 4 -d 6 -r 1"), std::string::npos) << read_all(args);
  EXPECT_EQ(nlohmann::json::parse(read_all(json))["depth_tokens"], 6);
  expect_error(hetmoe("bench -m " + kModel.string() + " --depth 4 --concurrency 2"), "--depth");
  std::ofstream(fake) << "#!/bin/sh\necho 'error: failed to load model'\nexit 1\n";
  expect_error(hetmoe("bench -m " + kModel.string() + " --vs-llama-bench " + fake.string()), "failed to load model");
  expect_error(hetmoe("bench -m " + kModel.string() + " --vs-llama-bench " + (dir_ / "none").string()), "exit status");
  expect_error(hetmoe("bench -m " + kModel.string() + " --concurrency 2 --vs-llama-bench " + fake.string()),
               "--vs-llama-bench");
}

TEST_F(Cli, BenchComparesPoliciesOnTheEmulatedDevice) {
  const fs::path json = dir_ / "bench.json";
  const fs::path svg = dir_ / "bench.svg";
  const fs::path profile = fs::path(HETMOE_SOURCE_DIR) / "profiles" / "xeon-amx-4090.json";
  const Result r = hetmoe("bench -m " + kModel.string() +
                          " --policies cpu,static,kt,crossover --device emulated --prompt 8 --gen 2 -t 1 --repeat 1 "
                          "--json " +
                          json.string() + " --svg " + svg.string() + " --profile " + profile.string());
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string picture = read_all(svg);
  for (const char* part :
       {"<svg ", ">crossover<", "CPU amx", "move + RTX 4090", "measured by hetmoe bench", "the device is EMULATED"})
    EXPECT_NE(picture.find(part), std::string::npos) << part;
  for (const char* policy : {"\ncpu ", "\nstatic ", "\nkt ", "\ncrossover "})
    EXPECT_NE(r.out.find(policy), std::string::npos) << policy << " missing in " << r.out;
  EXPECT_NE(r.out.find("CPU expert weights"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("energy per decoded token"), std::string::npos) << r.out;
  const std::string j = read_all(json);
  for (const char* field :
       {"\"policy\": \"kt\"", "\"ttft_s\"", "\"device_memory_bytes\"", "\"cpu_expert_bytes_per_token\"",
        "\"h2d_bytes_per_token\"", "\"energy_j_per_token\"", "\"energy_source\""})
    EXPECT_NE(j.find(field), std::string::npos) << field << " missing in " << j;
  // Every median is filled in: speeds, time to first token and energy are positive for every policy.
  const nlohmann::json parsed = nlohmann::json::parse(j);
  ASSERT_EQ(parsed["results"].size(), 4u);
  for (const nlohmann::json& x : parsed["results"]) {
    for (const char* field : {"prefill_tok_s", "decode_tok_s", "ttft_s", "energy_j_per_token"})
      EXPECT_GT(x[field].get<double>(), 0) << x["policy"] << " " << field;
    // Each run says where its energy figure comes from (measured by RAPL/NVML, or modelled).
    for (const nlohmann::json& run : x["runs"])
      EXPECT_EQ(run.value("energy_source", ""), x["energy_source"].get<std::string>()) << run;
  }
  // Synthetic Zipf routing: runs, says so, and refuses a spec it cannot read.
  const Result zipf =
      hetmoe("bench -m " + kModel.string() +
             " --policies kt --device emulated --synthetic zipf:1.2 --prompt 8 --gen 2 -t 1 --repeat 1");
  ASSERT_EQ(zipf.status, 0) << zipf.err;
  EXPECT_NE(zipf.out.find("routing: synthetic, Zipf s = 1.2"), std::string::npos) << zipf.out;
  expect_error(hetmoe("bench -m " + kModel.string() + " --synthetic zipf:-1"), "zipf:S");
  expect_error(hetmoe("bench -m " + kModel.string() + " --synthetic pareto"), "zipf:S");
  expect_error(hetmoe("bench -m " + kModel.string() + " --policies static --device cpu --prompt 4 --gen 1"),
               "needs a device");
  expect_error(hetmoe("bench -m " + kModel.string() + " --policies split --device emulated --prompt 4 --gen 1"),
               "needs a split model");
}

TEST_F(Cli, CalibrateWritesBandwidthAndExpertCurves) {
  const fs::path out = dir_ / "profile.json";
  const Result r = hetmoe("calibrate -m " + kModel.string() + " -o " + out.string() + " --max-rows 8 -t 1");
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string j = read_all(out);
  for (const char* field : {"\"bandwidth\"", "\"bytes_per_s\"", "\"expert_ffn\"", "\"isa\": \"ref\"", "\"rows\"",
                            "\"seconds\"", "\"bytes\": 110592.0"})
    EXPECT_NE(j.find(field), std::string::npos) << field << " missing in " << j;
  expect_error(hetmoe("calibrate -m " + (fs::path(HETMOE_TEST_DATA_DIR) / "models" / "nope.gguf").string()),
               "nope.gguf");
}

TEST_F(Cli, CalibratePrintsEachTiersCrossoverAgainstAHardwareProfilesGpu) {
  const fs::path hw = dir_ / "hw.json", out = dir_ / "profile.json";
  std::ofstream(hw) << R"({"format": "hetmoe-hw/1", "name": "box", "cpu": {"dram_bytes_per_s": 1e11, "tiers": [
    {"isa": "avx2", "bytes_per_s": 1e11, "flops_per_s": 1e12}]},
    "link": {"bytes_per_s": 2.5e10, "latency_s": 1e-5},
    "gpu": {"name": "big gpu", "memory_bytes": 2.4e10, "bytes_per_s": 1e12, "flops_per_s": 1e14}})";
  const Result r =
      hetmoe("calibrate -m " + kModel.string() + " -o " + out.string() + " --max-rows 4 -t 1 --hw " + hw.string());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("crossover: rows from which moving one expert"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("big gpu"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" rows\n"), std::string::npos) << r.out;
  std::ofstream(hw) << "{}";
  expect_error(
      hetmoe("calibrate -m " + kModel.string() + " -o " + out.string() + " --max-rows 2 -t 1 --hw " + hw.string()),
      "unknown format");
}

TEST_F(Cli, RunWritesTheRoutingTraceOnTheCpuAndWithTheDevicePass) {
  for (const std::string device : {"cpu", "emulated"}) {
    const fs::path trace = dir_ / ("routing-" + device + ".jsonl");
    const Result r = hetmoe("run -m " + kModel.string() + " --tokens 3,17,42 -n 2 --temp 0 --print-ids --device " +
                            device + " --trace-routing " + trace.string());
    ASSERT_EQ(r.status, 0) << r.err;
    std::ifstream f(trace);
    std::string line;
    std::vector<std::string> lines;
    while (std::getline(f, line)) lines.push_back(line);
    // The header, then per forward call (prompt, then one decode step; the last token is not evaluated) the two MoE
    // layers of the tiny DeepSeek-V3 (layer 0 is dense).
    ASSERT_EQ(lines.size(), 1u + 2u * 2u) << device;
    EXPECT_NE(lines[0].find("\"format\":\"hetmoe-routing/1\""), std::string::npos) << lines[0];
    EXPECT_NE(lines[1].find("\"layer\":1,\"n\":3"), std::string::npos) << lines[1];
    EXPECT_NE(lines[4].find("\"layer\":2,\"n\":1"), std::string::npos) << lines[4];
  }
  expect_error(hetmoe("run -m " + kModel.string() + " --tokens 3 -n 1 --trace-routing /nonexistent/dir/t.jsonl"),
               "/nonexistent/dir/t.jsonl");
}

// bench --trace replays a recorded routing for every policy (its counts place the experts), and refuses a trace of
// another model's shape.
TEST_F(Cli, BenchReplaysARoutingTrace) {
  const fs::path trace = dir_ / "replay.jsonl", json = dir_ / "replay.json";
  ASSERT_EQ(hetmoe("run -m " + kModel.string() + " --tokens 3,17,42,9 -n 4 --temp 0 --trace-routing " + trace.string())
                .status,
            0);
  const Result r =
      hetmoe("bench -m " + kModel.string() + " --trace " + trace.string() +
             " --policies cpu,crossover --device emulated --prompt 6 --gen 3 -t 1 --repeat 1 --json " + json.string());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("routing: replayed from " + trace.string()), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("crossover: run 1/1"), std::string::npos) << r.err;  // the progress line
  const nlohmann::json parsed = nlohmann::json::parse(read_all(json));
  ASSERT_EQ(parsed["results"].size(), 2u);
  EXPECT_TRUE(parsed["results"][1]["scheduler"].contains("admissions"));
  // What the CPU streamed: the model's active weights alone, nothing routed with every expert on the device.
  EXPECT_EQ(parsed["results"][0]["dram_read_bytes_per_token"], parsed["results"][0]["bytes_per_token"]);
  EXPECT_EQ(parsed["results"][1]["dram_read_bytes_per_token"].get<double>(), 0);
  const fs::path other = dir_ / "other.jsonl";
  std::ofstream(other) << R"({"format":"hetmoe-routing/1","model":"x","n_layer":3,"n_expert":8,"n_used":2})"
                       << "\n";
  expect_error(hetmoe("bench -m " + kModel.string() + " --trace " + other.string() + " --prompt 4 --gen 1"),
               "recorded for 3 layers, 8 experts");
  expect_error(hetmoe("bench -m " + kModel.string() + " --trace " + trace.string() + " --synthetic zipf:1"),
               "use one of them");
}

TEST_F(Cli, SimulatePredictsEveryPolicyOnAShippedProfile) {
  const fs::path json = dir_ / "sim.json";
  const fs::path hw = fs::path(HETMOE_SOURCE_DIR) / "profiles" / "ktransformers-2x6454s-4090d.json";
  const fs::path svg = dir_ / "sim.svg";
  const Result r =
      hetmoe("simulate --hw " + hw.string() + " --model-config deepseek-v2-lite --prompt 64 --gen 4 --json " +
             json.string() + " --svg " + svg.string());
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string picture = read_all(svg);
  EXPECT_EQ(picture.rfind("<svg ", 0), 0u);
  // The figures are predictions, said on a line of their own; the long title is fitted to the width, not clipped.
  EXPECT_NE(picture.find(">predicted by hetmoe simulate"), std::string::npos) << picture;
  const size_t title = picture.find("<text x=\"20\" y=\"24\"");
  ASSERT_NE(title, std::string::npos);
  EXPECT_NE(picture.substr(title, picture.find('>', title) - title).find("textLength=\"920\""), std::string::npos);
  for (const char* part : {"prefill tokens/s", "decode tokens/s", "CPU avx512", "CPU amx", "move + RTX 4090D", ">kt<"})
    EXPECT_NE(picture.find(part), std::string::npos) << part;
  for (const char* policy : {"cpu ", "static ", "kt ", "crossover ", "split "})
    EXPECT_NE(r.out.find(std::string("\n") + policy), std::string::npos) << policy << " missing in " << r.out;
  EXPECT_NE(r.out.find("assumes: "), std::string::npos) << r.out;
  const std::string j = read_all(json);
  for (const char* field : {"\"results\"", "\"policy\": \"kt\"", "\"prefill_tok_s\"", "\"decode_tok_s\"",
                            "\"dram_bytes\"", "\"vram_bytes\"", "\"predicted\": true"})
    EXPECT_NE(j.find(field), std::string::npos) << field << " missing in " << j;
  // The real models of every family the runtime reads have presets: their sizes are the published shapes at
  // Q4_K_M (DRAM GB column, about 4.8 bits per weight).
  for (const auto& [preset, dram_gb] :
       {std::pair{"glm-4.5", 213.1}, std::pair{"glm-4.5-air", 70.4}, std::pair{"gpt-oss-120b", 87.8},
        std::pair{"minimax-m2", 138.3}, std::pair{"deepseek-v3.2", 405.0}, std::pair{"qwen3-235b", 142.1}}) {
    const Result sim = hetmoe(
        fmt::format("simulate --hw {} --model-config {} --policies cpu --prompt 16 --gen 2", hw.string(), preset));
    ASSERT_EQ(sim.status, 0) << preset << ": " << sim.err;
    EXPECT_NE(sim.out.find(fmt::format("{:.1f}", dram_gb)), std::string::npos) << preset << ": " << sim.out;
  }
  expect_error(hetmoe("simulate --hw " + (dir_ / "none.json").string()), "none.json (a machine profile)");
  expect_error(hetmoe("simulate --hw " + hw.string() + " --model-config gpt-5"), "not a preset");
  expect_error(hetmoe("simulate --hw " + hw.string() + " --policies fastest"), "unknown policy");
  // The split with critical rows from the source: DRAM is the file (deepseek-v2-lite Q4_K_M, as the cpu policy's).
  const Result source =
      hetmoe("simulate --hw " + hw.string() +
             " --model-config deepseek-v2-lite --policies cpu split --critical-from source --prompt 16"
             " --gen 2 --experts-per-token 4");
  ASSERT_EQ(source.status, 0) << source.err;
  EXPECT_NE(source.out.find("critical rows from the source"), std::string::npos) << source.out;
  EXPECT_NE(source.out.find("4 experts per token"), std::string::npos) << source.out;
  expect_error(hetmoe("simulate --hw " + hw.string() + " --model-config deepseek-v2-lite --experts-per-token 65"),
               "the model has 64 experts");
}

// tune: every setting simulated once, the best first by the objective, each with the commands that run it; what the
// machine cannot hold, what --exact and --min-critical leave out, and a profile without a GPU (one setting: cpu).
// The candidates of a tune --json file (held by the caller: a range-for over a temporary's member would not be).
nlohmann::json candidates(const fs::path& json) { return nlohmann::json::parse(read_all(json)).at("candidates"); }

TEST_F(Cli, TuneRanksTheSettingsAndPrintsTheirCommands) {
  const fs::path hw = fs::path(HETMOE_SOURCE_DIR) / "profiles" / "xeon-amx-rtx-pro-6000.json";
  const fs::path json = dir_ / "tune.json";
  const std::string common = "tune --hw " + hw.string() + " --model-config deepseek-v2-lite --prompt 32 --gen 8";
  const Result r = hetmoe(common + " --top 3 --json " + json.string());
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(read_all(json));
  const nlohmann::json& c = j.at("candidates");
  ASSERT_GT(c.size(), 20u);
  std::set<std::string> policies;
  for (size_t i = 0; i < c.size(); ++i) {
    policies.insert(c[i].at("policy").get<std::string>());
    if (i > 0) {
      EXPECT_GE(c[i - 1].at("decode_tok_s").get<double>(), c[i].at("decode_tok_s").get<double>()) << i;
    }
    const std::vector<std::string> lines = c[i].at("commands").get<std::vector<std::string>>();
    ASSERT_FALSE(lines.empty());
    EXPECT_NE(lines.back().find("hetmoe serve -m "), std::string::npos) << lines.back();
    if (c[i].at("policy") == "split") {
      ASSERT_EQ(lines.size(), 2u);  // the split file first
      EXPECT_NE(lines[0].find(fmt::format("--gpu-bits {}", c[i].at("gpu_bits").get<int>())), std::string::npos);
      EXPECT_NE(lines[1].find(fmt::format("--critical {}", c[i].at("critical").get<int>())), std::string::npos);
      EXPECT_EQ(c[i].at("exact").get<bool>(),
                c[i].at("critical_from") == "source" && c[i].at("critical").get<int>() >= 6);  // 6 experts per token
    } else {
      EXPECT_TRUE(c[i].at("exact").get<bool>());
    }
  }
  EXPECT_EQ(policies, (std::set<std::string>{"cpu", "static", "kt", "crossover", "split"}));
  // The second round varies the best adaptive settings' ring and admissions; their commands say so.
  bool varied = false;
  for (const nlohmann::json& e : c) {
    if (!e.contains("move_slots")) continue;
    const std::string serve = e.at("commands").back().get<std::string>();
    const int slots = e.at("move_slots").get<int>(), admissions = e.at("admissions").get<int>();
    EXPECT_EQ(serve.find(fmt::format("--move-slots {}", slots)) != std::string::npos, slots != 2) << serve;
    EXPECT_EQ(serve.find(fmt::format("--admissions {}", admissions)) != std::string::npos, admissions != 1) << serve;
    EXPECT_LE(e.at("prefetch").get<int>(), slots / 2) << serve;
    varied = varied || slots != 2 || admissions != 1;
  }
  EXPECT_TRUE(varied);
  EXPECT_NE(r.out.find("of them varying the best ones' move slots and admissions"), std::string::npos) << r.out;
  // The table shows the best three, each followed by its commands, and whether the split pays here.
  EXPECT_NE(r.out.find("\n 1  "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\n 3  "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("\n 4  "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(fmt::format("{:.2f}", c[0].at("decode_tok_s").get<double>())), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(c[0].at("commands").back().get<std::string>()), std::string::npos) << r.out;
  EXPECT_TRUE(r.out.find("split pays here") != std::string::npos ||
              r.out.find("split does not pay here") != std::string::npos)
      << r.out;

  // --exact: only settings that compute the source model.
  const Result exact = hetmoe(common + " --exact --json " + json.string());
  ASSERT_EQ(exact.status, 0) << exact.err;
  for (const nlohmann::json& e : candidates(json)) EXPECT_TRUE(e.at("exact").get<bool>()) << e.dump();
  // --min-critical 2: no split with fewer.
  const Result two = hetmoe(common + " --min-critical 2 --json " + json.string());
  ASSERT_EQ(two.status, 0) << two.err;
  for (const nlohmann::json& e : candidates(json))
    if (e.at("policy") == "split") {
      EXPECT_GE(e.at("critical").get<int>(), 2) << e.dump();
    }
  // A residual split holds more than the source file (10.4 GB): 12 GB of DRAM leaves only settings that hold the file.
  const Result small = hetmoe(common + " --max-dram-gb 12 --json " + json.string());
  ASSERT_EQ(small.status, 0) << small.err;
  EXPECT_NE(small.out.find("need more than the 12 GB of DRAM allowed"), std::string::npos) << small.out;
  for (const nlohmann::json& e : candidates(json)) {
    EXPECT_LE(e.at("dram_bytes").get<double>(), 12e9) << e.dump();
    EXPECT_NE(e.value("critical_from", ""), "residual") << e.dump();
  }
  expect_error(hetmoe(common + " --max-dram-gb 1"), "no setting fits");
  // From a model file, on a profile without a GPU: the cpu policy alone.
  const fs::path cpu_hw = fs::path(HETMOE_SOURCE_DIR) / "profiles" / "this-machine.json";
  const Result file = hetmoe("tune --hw " + cpu_hw.string() + " -m " + kModel.string() + " --prompt 16 --gen 4");
  ASSERT_EQ(file.status, 0) << file.err;
  EXPECT_NE(file.out.find("the profile has no GPU"), std::string::npos) << file.out;
  EXPECT_NE(file.out.find("hetmoe serve -m " + kModel.string() + " --device cpu"), std::string::npos) << file.out;
  expect_error(hetmoe("tune --hw " + hw.string()), "give a model");

  // --verify benches the printed settings on the profile's device (here the emulated one this machine was calibrated
  // with), split files written for them in a temporary folder that goes away after.
  const fs::path emulated = fs::path(HETMOE_SOURCE_DIR) / "profiles" / "this-machine-emulated.json";
  const Result v = hetmoe("tune --hw " + emulated.string() + " -m " + kModel.string() +
                          " --prompt 16 --gen 4 --top 3 --verify -t 2");
  ASSERT_EQ(v.status, 0) << v.err;
  const size_t table = v.out.find("predicted against measured on this machine");
  ASSERT_NE(table, std::string::npos) << v.out;
  const std::string rows = v.out.substr(table);
  for (const char* rank : {"\n 1  ", "\n 2  ", "\n 3  "}) EXPECT_NE(rows.find(rank), std::string::npos) << rows;
  size_t benched = 0;
  for (size_t at = v.out.find("\nverify: "); at != std::string::npos; at = v.out.find("\nverify: ", at + 1)) ++benched;
  EXPECT_EQ(benched, 3u) << v.out;
  // A split setting among them was benched on a split file written for it.
  EXPECT_EQ(v.out.find("verify: split") != std::string::npos, v.err.find("tune: writing ") != std::string::npos)
      << v.out << v.err;
  for (const auto& entry : fs::directory_iterator(fs::temp_directory_path()))
    EXPECT_EQ(entry.path().filename().string().rfind("hetmoe-tune-", 0), std::string::npos) << entry.path();
  expect_error(hetmoe("tune --hw " + emulated.string() + " --model-config deepseek-v2-lite --verify"),
               "give the model file");
}

// The two published KTransformers figures the shipped profiles were fitted to (docs/scheduler.md): a change to the
// cost model or the profiles that moves them shows here. Only these two; every other published figure is a check.
TEST_F(Cli, SimulatorReproducesTheFiguresItsProfilesWereFittedTo) {
  const fs::path profiles = fs::path(HETMOE_SOURCE_DIR) / "profiles";
  auto kt = [&](const std::string& profile, const std::string& args) {
    const fs::path json = dir_ / "fit.json";
    const Result r =
        hetmoe("simulate --hw " + (profiles / profile).string() +
               " --model-config deepseek-v3 --kt-experts 0 --policies kt --json " + json.string() + " " + args);
    EXPECT_EQ(r.status, 0) << r.err;
    return nlohmann::json::parse(read_all(json))["results"][0];
  };
  // V0.2, one socket, Q4_K_M, 500-token prompt, 8 experts: 54.21 prefill, 8.73 decode tokens/s.
  const nlohmann::json single = kt("ktransformers-1x6454s-4090d.json", "--isa avx512 --prompt 500 --gen 128");
  EXPECT_NEAR(single["prefill_tok_s"].get<double>(), 54.21, 0.02 * 54.21);
  EXPECT_NEAR(single["decode_tok_s"].get<double>(), 8.73, 0.02 * 8.73);
  // V0.3-preview, two sockets with AMX, int8 experts, a 2K (1930-token) prompt, 8 experts: 255.26 prefill.
  const nlohmann::json amx = kt("ktransformers-2x6454s-4090d.json",
                                "--type Q8_0 --isa amx --kt-prefill-tokens 1000000 --prompt 1930 --gen 16");
  EXPECT_NEAR(amx["prefill_tok_s"].get<double>(), 255.26, 0.02 * 255.26);
}

// A device policy where no device runs it, or a device a policy does not use, is an error that says so.
TEST_F(Cli, DevicePoliciesNeedADevice) {
  expect_error(hetmoe("run -m " + kModel.string() + " --tokens 3,17 -n 1 --device cpu --policy crossover"),
               "--device cpu");
  expect_error(hetmoe("run -m " + kModel.string() + " --tokens 3,17 -n 1 --device emulated --policy cpu"),
               "--device emulated");
  expect_error(hetmoe("run -m " + kModel.string() + " --tokens 3,17 -n 1 --device emulated --policy fastest"),
               "unknown policy 'fastest'");
}

// The CUDA device is a library loaded only when asked for: --version maps none of CUDA, and a library that does not
// load is one line saying why.
TEST_F(Cli, CudaIsLoadedOnlyWhenUsed) {
  const Result v = hetmoe("--version");
  ASSERT_EQ(v.status, 0) << v.err;
  // Resident memory of the command, from the kernel's accounting of the finished child.
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::freopen("/dev/null", "w", stdout);
    execl(HETMOE_BIN, HETMOE_BIN, "--version", static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  struct rusage usage {};
  ASSERT_EQ(wait4(pid, &status, 0, &usage), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
#if !defined(HETMOE_SANITIZED)  // a sanitizer's shadow memory makes the resident size meaningless
  EXPECT_LT(usage.ru_maxrss, 50 * 1024) << "hetmoe --version peaked at " << usage.ru_maxrss / 1024 << " MB";
#endif

  const fs::path bogus = dir_ / "libhetmoe_cuda.so";
  std::ofstream(bogus) << "not a shared object";
  expect_error(hetmoe("run -m " + kModel.string() + " --tokens 3,17 -n 1 --device cuda",
                      "HETMOE_CUDA_LIBRARY=" + bogus.string()),
               "--device cuda: cannot load " + bogus.string());
}

// A model in shards opens from any of them as the whole model; a broken set is one line naming the shard.
TEST_F(Cli, ShardedModelsRunAsTheWholeFile) {
  const gguf::GgufFile src = gguf::GgufFile::open(kModel.string());
  gguf::GgufWriter w;
  for (const auto& [key, value] : src.metadata()) w.set(key, value);
  for (const gguf::TensorInfo& t : src.tensors())
    w.add_tensor_bytes(t.name, t.type, std::vector<int64_t>(t.ne.begin(), t.ne.begin() + t.n_dims),
                       std::vector<uint8_t>(t.data, t.data + t.nbytes));
  const std::vector<std::string> shards = w.write((dir_ / "m.gguf").string(), 1'500'000);
  ASSERT_GE(shards.size(), 3u);
  const Result inspect = hetmoe("inspect -m " + shards[1]);
  ASSERT_EQ(inspect.status, 0) << inspect.err;
  EXPECT_NE(inspect.out.find(fmt::format("{} tensors", src.tensors().size())), std::string::npos) << inspect.out;
  EXPECT_NE(inspect.out.find(fmt::format("shards        {} files", shards.size())), std::string::npos) << inspect.out;
  const std::string args = " --tokens 3,17,42,100,7 -n 8 --temp 0 --print-ids -t 1";
  const Result whole = hetmoe("run -m " + kModel.string() + args);
  const Result sharded = hetmoe("run -m " + shards.back() + args);
  ASSERT_EQ(whole.status, 0) << whole.err;
  EXPECT_EQ(sharded.out, whole.out);
  fs::remove(shards[1]);
  expect_error(hetmoe("run -m " + shards.front() + args),
               "shard 2 of " + std::to_string(shards.size()) + " is missing (" + shards[1] + ")");
}

// The IQ mixes end to end: make-model writes them, the CPU and the emulated device give the same ids, and split takes
// an IQ file as its source.
TEST_F(Cli, IqMixesRunOnTheCpuAndTheEmulatedDeviceAndSplit) {
  const std::string args = " --tokens 3,17,42,100,7 -n 6 --temp 0 --print-ids -t 1";
  for (const char* type : {"IQ2_XXS", "UD-IQ2_XXS", "IQ1_M", "IQ3_XXS"}) {
    SCOPED_TRACE(type);
    const fs::path model = dir_ / (std::string(type) + ".gguf");
    const Result made =
        hetmoe(fmt::format("make-model --preset tiny-deepseek-v3 --type {} --seed 2 -t 1 -o {}", type, model.string()));
    ASSERT_EQ(made.status, 0) << made.err;
    const Result cpu = hetmoe("run -m " + model.string() + args);
    ASSERT_EQ(cpu.status, 0) << cpu.err;
    const Result device = hetmoe("run -m " + model.string() + args + " --device emulated");
    ASSERT_EQ(device.status, 0) << device.err;
    EXPECT_EQ(device.out, cpu.out);
  }
  const fs::path split = dir_ / "ud.split.gguf";
  const Result s = hetmoe("split -m " + (dir_ / "UD-IQ2_XXS.gguf").string() + " -o " + split.string() +
                          " --gpu-bits 2 --residual-bits 4 -t 1");
  ASSERT_EQ(s.status, 0) << s.err;
  const Result r = hetmoe("run -m " + split.string() + args + " --device emulated");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), ' ') + 1, 6) << r.out;
}

// make-model's presets of every architecture: the file opens as that architecture, and the CPU and the emulated
// device (with the forward pass on it) give the same ids. Ten prompt tokens pass the tiny indexer's top 8.
TEST_F(Cli, EveryArchitecturesPresetRunsOnTheCpuAndTheEmulatedDevice) {
  const std::string args = " --tokens 3,17,42,100,7,9,11,13,15,17 -n 4 --temp 0 --print-ids -t 1";
  struct Case {
    const char* preset;
    const char* arch;
  };
  for (const Case c : {Case{"tiny-glm4moe", "glm4moe"}, Case{"tiny-gpt-oss", "gpt-oss"},
                       Case{"tiny-minimax-m2", "minimax-m2"}, Case{"tiny-deepseek-v3.2", "deepseek32"}}) {
    SCOPED_TRACE(c.preset);
    const fs::path model = dir_ / (std::string(c.preset) + ".gguf");
    const Result made = hetmoe(fmt::format("make-model --preset {} --seed 4 -t 1 -o {}", c.preset, model.string()));
    ASSERT_EQ(made.status, 0) << made.err;
    const Result inspect = hetmoe("inspect -m " + model.string());
    ASSERT_EQ(inspect.status, 0) << inspect.err;
    EXPECT_NE(inspect.out.find(std::string("architecture  ") + c.arch), std::string::npos) << inspect.out;
    const Result cpu = hetmoe("run -m " + model.string() + args);
    ASSERT_EQ(cpu.status, 0) << cpu.err;
    const Result device = hetmoe("run -m " + model.string() + args + " --device emulated");
    ASSERT_EQ(device.status, 0) << device.err;
    EXPECT_EQ(device.out, cpu.out);
  }
}

TEST_F(Cli, LogitsWritesOneRowPerToken) {
  const fs::path out = dir_ / "logits.bin";
  const Result r = hetmoe("logits -m " + kModel.string() + " --tokens 3,17,42 --out " + out.string());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(fs::file_size(out), 3u * 512u * sizeof(float));
}

TEST_F(Cli, RunPrintsOnlyIds) {
  const Result r = hetmoe("run -m " + kModel.string() + " --tokens 3,17,42 -n 4 --temp 0 --print-ids");
  ASSERT_EQ(r.status, 0) << r.err;
  std::istringstream ids(r.out);
  int count = 0, id;
  while (ids >> id) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, 512);
    ++count;
  }
  EXPECT_TRUE(ids.eof()) << "stdout holds more than ids: " << r.out;
  EXPECT_EQ(count, 4);
}

}  // namespace
}  // namespace hetmoe
