// Tokenizer conformance with llama.cpp v0.5.0 (README of ../shared/ref, sections 4.4 and 5): every test string of
// llama.cpp's six vocabularies, and the tokenize-tiny strings of every tiny model, id for id.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/gguf/reader.h"
#include "runtime/text/tokenizer.h"
#include "tests/support/reference.h"

namespace hetmoe {
namespace {

namespace fs = std::filesystem;
using text::Tokenizer;

// Where a reference file lies: the suite's own copy in tests/data, else ../shared/ref.
std::optional<fs::path> find_ref(const std::string& sub, const std::string& name) {
  for (const fs::path& root : {fs::path(HETMOE_TEST_DATA_DIR), fs::path(HETMOE_SHARED_REF)}) {
    fs::path p = root / sub / name;
    if (fs::exists(p)) return p;
  }
  return std::nullopt;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The .inp strings: each one is followed by the separator, so the file ends with one.
std::vector<std::string> read_inputs(const fs::path& p) {
  const std::string all = read_file(p);
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> out;
  for (size_t pos = 0; pos < all.size();) {
    const size_t hit = all.find(sep, pos);
    if (hit == std::string::npos) break;
    out.push_back(all.substr(pos, hit - pos));
    pos = hit + sep.size();
  }
  return out;
}

std::vector<std::vector<int32_t>> read_outputs(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<std::vector<int32_t>> out;
  for (std::string line; std::getline(in, line);) {
    std::istringstream ids(line);
    out.emplace_back();
    for (int32_t id; ids >> id;) out.back().push_back(id);
  }
  return out;
}

std::string ids_string(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += (s.empty() ? "" : " ") + std::to_string(id);
  return s;
}

// Printable form of a test string for failure messages.
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '\n')
      out += "\\n";
    else if (c == '\t')
      out += "\\t";
    else if (c == '\r')
      out += "\\r";
    else if (c < 0x20)
      out += fmt::format("\\x{:02x}", c);
    else
      out += static_cast<char>(c);
  }
  return out + "\"";
}

class VocabTest : public testing::TestWithParam<std::string> {};

TEST_P(VocabTest, EveryCaseMatchesLlamaCpp) {
  const std::string name = "ggml-vocab-" + GetParam() + ".gguf";
  const auto gguf_path = find_ref("vocab", name);
  const auto inp_path = find_ref("vocab", name + ".inp");
  const auto out_path = find_ref("vocab", name + ".out");
  if (!gguf_path || !inp_path || !out_path)
    HETMOE_MISSING_REFERENCE(name << " and its .inp/.out are in neither tests/data/vocab nor " << HETMOE_SHARED_REF
                                  << "/vocab");

  const gguf::GgufFile file = gguf::GgufFile::open(gguf_path->string());
  const std::unique_ptr<Tokenizer> tokenizer = Tokenizer::from_gguf(file);
  const std::vector<std::string> inputs = read_inputs(*inp_path);
  const std::vector<std::vector<int32_t>> expected = read_outputs(*out_path);
  ASSERT_EQ(inputs.size(), expected.size()) << "the .inp and .out files of " << name << " disagree in length";
  ASSERT_FALSE(inputs.empty());

  size_t passed = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::vector<int32_t> ids = tokenizer->encode(inputs[i], /*add_special=*/false, /*parse_special=*/false);
    if (ids == expected[i]) {
      ++passed;
      continue;
    }
    ADD_FAILURE() << name << " case " << i << " " << quoted(inputs[i]) << "\n  expected: " << ids_string(expected[i])
                  << "\n  got:      " << ids_string(ids);
  }
  std::cout << "[ vocab    ] " << GetParam() << ": " << passed << "/" << inputs.size() << " cases match\n";
  RecordProperty("cases_passed", static_cast<int>(passed));
  RecordProperty("cases_total", static_cast<int>(inputs.size()));
}

INSTANTIATE_TEST_SUITE_P(LlamaCpp, VocabTest,
                         testing::Values("deepseek-llm", "deepseek-coder", "qwen2", "llama-bpe", "llama-spm", "gpt-2"),
                         [](const testing::TestParamInfo<std::string>& info) {
                           std::string s = info.param;
                           for (char& c : s)
                             if (c == '-') c = '_';
                           return s;
                         });

// expected/tokenize-tiny.json and tokenize-next.json (the models added later): 8 strings per tiny model file, no
// BOS/EOS, specials not parsed.
class TinyTokenizeTest : public testing::TestWithParam<std::string> {};

TEST_P(TinyTokenizeTest, EveryStringMatchesLlamaCpp) {
  const std::string model = GetParam() + ".gguf";
  nlohmann::json ref;
  for (const char* name : {"tokenize-tiny.json", "tokenize-next.json"}) {
    const auto json_path = find_ref("expected", name);
    ASSERT_TRUE(json_path) << name << " is missing from tests/data/expected";
    nlohmann::json j = nlohmann::json::parse(read_file(*json_path));
    if (j.contains(model)) ref = std::move(j);
  }
  ASSERT_TRUE(ref.contains(model)) << model << " is in neither tokenize-tiny.json nor tokenize-next.json";
  const auto model_path = find_ref("models", model);
  if (!model_path)
    HETMOE_MISSING_REFERENCE(model << " is in neither tests/data/models nor " << HETMOE_SHARED_REF << "/models");

  const gguf::GgufFile file = gguf::GgufFile::open(model_path->string());
  const std::unique_ptr<Tokenizer> tokenizer = Tokenizer::from_gguf(file);
  ASSERT_EQ(ref[model].size(), 8u);
  for (const auto& item : ref[model]) {
    const std::string text = item["text"];
    const std::vector<int32_t> expected = item["ids"];
    EXPECT_EQ(tokenizer->encode(text, false, false), expected) << model << " " << quoted(text);
    EXPECT_EQ(tokenizer->decode(expected), text) << model << " decodes " << quoted(text);
  }
}

INSTANTIATE_TEST_SUITE_P(LlamaCpp, TinyTokenizeTest,
                         testing::Values("tiny-deepseek3-F32", "tiny-deepseek3-Q8_0", "tiny-deepseek3-Q4_K_M",
                                         "tiny-deepseek2lite-F16", "tiny-deepseek2lite-Q4_K_M", "tiny-qwen3moe-F16",
                                         "tiny-qwen3moe-Q4_K_M", "tiny-mixtral-F16", "tiny-mixtral-Q4_K_M",
                                         "tiny-deepseek3-IQ2_XXS", "tiny-qwen3moe-IQ3_S", "tiny-glm4moe-F16",
                                         "tiny-glm4moe-Q4_K_M", "tiny-minimax-m2-F16", "tiny-minimax-m2-Q4_K_M",
                                         "tiny-gptoss-F16", "tiny-gptoss-Q4_K_M", "tiny-gptoss-MXFP4_MOE",
                                         "tiny-deepseek32-F16", "tiny-deepseek32-Q4_K_M", "tiny-qwen35moe-F16",
                                         "tiny-qwen35moe-Q4_K_M", "tiny-deepseek4-F16", "tiny-deepseek4-Q4_K_M"),
                         [](const testing::TestParamInfo<std::string>& info) {
                           std::string s = info.param;
                           for (char& c : s)
                             if (c == '-') c = '_';
                           return s;
                         });

}  // namespace
}  // namespace hetmoe
