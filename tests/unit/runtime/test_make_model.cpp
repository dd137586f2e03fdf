#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <unordered_set>
#include <vector>

#include "runtime/error.h"
#include "runtime/gguf/reader.h"
#include "runtime/model/file_types.h"
#include "runtime/model/make_model.h"
#include "runtime/model/model.h"
#include "runtime/text/bpe_vocab.h"
#include "tests/support/reference.h"

namespace hetmoe {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;  // keeps the manifest's key order
using quant::GgmlType;

// A manifest of the reference models (manifest.json, or manifest-next.json of the files added later): tests/data
// keeps a copy, the shared folder has the original.
json read_manifest(const std::string& name) {
  for (const std::string& path :
       {std::string(HETMOE_TEST_DATA_DIR) + "/" + name, std::string(HETMOE_SHARED_REF) + "/models/" + name}) {
    std::ifstream in(path);
    if (in) return json::parse(in);
  }
  return json();
}

const json* manifest() {
  static const json m = read_manifest("manifest.json");
  return m.is_null() ? nullptr : &m;
}

const json* manifest_next() {
  static const json m = read_manifest("manifest-next.json");
  return m.is_null() ? nullptr : &m;
}

const json* reference(const std::string& file) {
  const json* m = manifest();
  if (!m) return nullptr;
  for (const json& entry : *m)
    if (entry.at("file") == file) return &entry;
  return nullptr;
}

#define REQUIRE_REFERENCE(var, file) \
  const json* var = reference(file); \
  if (!var)                          \
  HETMOE_MISSING_REFERENCE("no manifest.json (neither tests/data nor the shared reference folder) with " << (file))

class TempDir {
 public:
  TempDir() : path_(fs::temp_directory_path() / ("hetmoe_test_make_model_" + std::to_string(::getpid()))) {
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<int64_t> ne_of(const gguf::TensorInfo& t) { return {t.ne.begin(), t.ne.begin() + t.n_dims}; }

MakeModelOptions tiny(const std::string& out, const std::string& type, uint64_t seed = 1001) {
  return {.preset = "tiny-deepseek-v3", .out_path = out, .type = type, .layers = -1, .seed = seed, .threads = 2};
}

// Metadata of a generated tiny-deepseek-v3 file against the reference tiny-deepseek3 (converter order and values;
// only general.name and general.file_type may differ).
void expect_reference_metadata(const gguf::GgufFile& f, const json& ref, int64_t file_type) {
  std::vector<std::string> keys;
  for (const auto& [key, value] : f.metadata()) keys.push_back(key);
  std::vector<std::string> ref_keys;
  for (const auto& [key, value] : ref.at("metadata").items()) ref_keys.push_back(key);
  ASSERT_EQ(keys, ref_keys);

  for (const auto& [key, want] : ref.at("metadata").items()) {
    SCOPED_TRACE(key);
    if (key == "general.name") continue;
    if (key == "general.file_type") {
      EXPECT_EQ(f.get_int(key), file_type);
      continue;
    }
    const gguf::Value* v = f.find(key);
    ASSERT_NE(v, nullptr);
    if (want.is_boolean()) {
      EXPECT_EQ(v->as_bool(), want.get<bool>());
    } else if (want.is_number_integer()) {
      EXPECT_EQ(v->as_int(), want.get<int64_t>());
    } else if (want.is_number_float()) {
      EXPECT_EQ(v->type(), gguf::ValueType::kFloat32);
      EXPECT_EQ(static_cast<float>(*v->as_float()), static_cast<float>(want.get<double>()));
    } else {
      const std::string s = want.get<std::string>();
      if (s.starts_with("<array of ")) {
        EXPECT_EQ(std::to_string(v->array_size()), s.substr(10, s.size() - 11));
      } else {
        ASSERT_NE(v->as_string(), nullptr);
        EXPECT_EQ(*v->as_string(), s);
      }
    }
  }
}

TEST(MakeModel, TinyQ4KMMatchesReferenceLayoutAndTypes) {
  REQUIRE_REFERENCE(ref_f32, "tiny-deepseek3-F32.gguf");
  REQUIRE_REFERENCE(ref_q4, "tiny-deepseek3-Q4_K_M.gguf");
  TempDir dir;
  const std::string path = dir.file("tiny-q4km.gguf");
  make_model(tiny(path, "Q4_K_M"), nullptr);
  gguf::GgufFile f = gguf::GgufFile::open(path);
  expect_reference_metadata(f, *ref_f32, 15);

  // Converter order (the reference quantizer reorders; the F32 reference has the converter's order).
  std::vector<std::string> names;
  for (const gguf::TensorInfo& t : f.tensors()) names.push_back(t.name);
  std::vector<std::string> ref_names;
  for (const json& t : ref_f32->at("tensors")) ref_names.push_back(t.at("name"));
  EXPECT_EQ(names, ref_names);

  std::map<std::string, int> counts;
  for (const json& want : ref_q4->at("tensors")) {
    const std::string name = want.at("name");
    SCOPED_TRACE(name);
    const gguf::TensorInfo* t = f.find_tensor(name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(ne_of(*t), want.at("ne").get<std::vector<int64_t>>());
    EXPECT_EQ(quant::type_info(t->type).name, want.at("type").get<std::string>());
    ++counts[std::string(quant::type_info(t->type).name)];
  }
  EXPECT_EQ(f.tensors().size(), ref_q4->at("tensors").size());
  for (const auto& [type, n] : ref_q4->at("tensor_type_counts").items()) EXPECT_EQ(counts[type], n.get<int>()) << type;
}

// The tiny presets of the two newest families reproduce the reference tiny files (README section 10): every key
// of the architecture with its value, and the tensors in the converter's order with their shapes and types, in F16
// (what the converter keeps F32) and in Q4_K_M (llama-quantize's rules). Qwen3.5's reference file also holds an MTP
// block, which make-model does not write; the files load and run here.
TEST(MakeModel, TinyQwen35AndDeepseekV4MatchTheirReferenceFiles) {
  const json* next = manifest_next();
  if (!next) HETMOE_MISSING_REFERENCE("no manifest-next.json in tests/data or the shared reference folder");
  TempDir dir;
  struct Case {
    const char* preset;
    const char* type;
    const char* ref;
  };
  for (const Case c : {Case{"tiny-deepseek-v4", "F16", "tiny-deepseek4-F16.gguf"},
                       Case{"tiny-deepseek-v4", "Q4_K_M", "tiny-deepseek4-Q4_K_M.gguf"},
                       Case{"tiny-qwen3.5-moe", "F16", "tiny-qwen35moe-F16.gguf"},
                       Case{"tiny-qwen3.5-moe", "Q4_K_M", "tiny-qwen35moe-Q4_K_M.gguf"}}) {
    SCOPED_TRACE(std::string(c.preset) + " " + c.type);
    const json* ref = nullptr;
    for (const json& e : *next)
      if (e.at("file") == c.ref) ref = &e;
    ASSERT_NE(ref, nullptr);
    const std::string path = dir.file(std::string(c.preset) + c.type + ".gguf");
    make_model({.preset = c.preset, .out_path = path, .type = c.type, .threads = 2}, nullptr);
    const gguf::GgufFile f = gguf::GgufFile::open(path);
    std::vector<std::string> names;
    for (const gguf::TensorInfo& t : f.tensors()) names.push_back(t.name);
    std::vector<std::string> want;
    for (const json& t : ref->at("tensors")) {
      const std::string name = t.at("name");
      if (name.starts_with("blk.4.")) continue;  // Qwen3.5's MTP block
      want.push_back(name);
      const gguf::TensorInfo* mine = f.find_tensor(name);
      ASSERT_NE(mine, nullptr) << name;
      EXPECT_EQ(ne_of(*mine), t.at("ne").get<std::vector<int64_t>>()) << name;
      // llama-quantize counted Qwen3.5's MTP block among the blocks, so its extra bits for ffn_down (use_more_bits)
      // fell on other blocks than in the 4-block file.
      if (std::string(c.ref) == "tiny-qwen35moe-Q4_K_M.gguf" && name.find("ffn_down") != std::string::npos) continue;
      EXPECT_EQ(quant::type_info(mine->type).name, t.at("type").get<std::string>()) << name;
    }
    if (std::string(c.type) == "F16") {
      EXPECT_EQ(names, want);  // the quantizer reorders; the converter does not
    }
    EXPECT_EQ(names.size(), want.size());
    const std::string arch = ref->at("metadata").at("general.architecture");
    for (const auto& [key, value] : ref->at("metadata").items()) {
      if (!key.starts_with(arch + ".") || key.ends_with("block_count") || key.ends_with("nextn_predict_layers"))
        continue;
      const gguf::Value* v = f.find(key);
      ASSERT_NE(v, nullptr) << key;
      if (value.is_number()) {
        EXPECT_EQ(static_cast<float>(v->as_float().value_or(-1)), static_cast<float>(value.get<double>())) << key;
      }
      if (value.is_boolean()) {
        EXPECT_EQ(v->as_bool(), value.get<bool>()) << key;
      }
    }
    auto m = model::Model::load(path, 1);
    model::KvCache cache = m->make_cache(32);
    std::vector<float> logits;
    m->forward(std::vector<int32_t>{1, 2, 3, 4, 5}, 0, cache, false, logits);
    for (const float x : logits) ASSERT_TRUE(std::isfinite(x));
  }
}

TEST(MakeModel, TinyF32ValuesFollowTheRecipe) {
  REQUIRE_REFERENCE(ref_f32, "tiny-deepseek3-F32.gguf");
  TempDir dir;
  const std::string path = dir.file("tiny-f32.gguf");
  make_model(tiny(path, "F32"), nullptr);
  gguf::GgufFile f = gguf::GgufFile::open(path);
  expect_reference_metadata(f, *ref_f32, 0);
  ASSERT_EQ(f.tensors().size(), ref_f32->at("tensors").size());
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const gguf::TensorInfo& t = f.tensors()[i];
    const json& want = ref_f32->at("tensors")[i];
    EXPECT_EQ(t.name, want.at("name").get<std::string>());
    EXPECT_EQ(ne_of(t), want.at("ne").get<std::vector<int64_t>>()) << t.name;
    EXPECT_EQ(t.type, GgmlType::F32) << t.name;
  }

  // Mean and standard deviation of a matrix, a norm and the routing bias, against 0.05*N, 1+0.1*N, 0.05*N.
  struct Case {
    std::string name;
    double mean, sd;
  };
  for (const Case& c : {Case{"blk.1.ffn_up_exps.weight", 0.0, 0.05}, Case{"token_embd.weight", 0.0, 0.05},
                        Case{"blk.0.attn_kv_a_norm.weight", 1.0, 0.1}, Case{"blk.1.exp_probs_b.bias", 0.0, 0.05}}) {
    const gguf::TensorInfo* t = f.find_tensor(c.name);
    ASSERT_NE(t, nullptr) << c.name;
    const float* v = reinterpret_cast<const float*>(t->data);
    const int64_t n = t->n_elements();
    double sum = 0, sum2 = 0;
    for (int64_t i = 0; i < n; ++i) sum += v[i];
    const double mean = sum / static_cast<double>(n);
    for (int64_t i = 0; i < n; ++i) sum2 += (v[i] - mean) * (v[i] - mean);
    const double sd = std::sqrt(sum2 / static_cast<double>(n));
    // Sampling error of the mean is sd/sqrt(n); of the sd about sd/sqrt(2n). Allow 5 of each.
    EXPECT_NEAR(mean, c.mean, 5 * c.sd / std::sqrt(static_cast<double>(n))) << c.name;
    EXPECT_NEAR(sd, c.sd, 5 * c.sd / std::sqrt(2.0 * static_cast<double>(n))) << c.name;
  }

  // The bytes are generate_row's values, row by row.
  ModelPlan plan = plan_model(tiny(path, "F32"));
  EXPECT_EQ(plan.n_params(), 9'146'400u);  // README section 2.3
  for (const PlannedTensor& pt : plan.tensors) {
    const gguf::TensorInfo* t = f.find_tensor(pt.name);
    ASSERT_NE(t, nullptr);
    std::vector<float> row(static_cast<size_t>(pt.ne[0]));
    for (int64_t r : {int64_t{0}, pt.n_rows() - 1}) {
      generate_row(1001, pt, r, row.data());
      EXPECT_EQ(std::memcmp(t->row(r), row.data(), row.size() * sizeof(float)), 0) << pt.name << " row " << r;
    }
  }
}

TEST(MakeModel, TokenizerInTheFileIsTheBuiltVocab) {
  TempDir dir;
  const std::string path = dir.file("tiny-vocab.gguf");
  make_model(tiny(path, "Q8_0"), nullptr);
  gguf::GgufFile f = gguf::GgufFile::open(path);
  BpeVocab vocab = build_bpe_vocab({.n_vocab = 512});
  EXPECT_EQ(f.find("tokenizer.ggml.tokens")->strings(), vocab.tokens);
  EXPECT_EQ(f.find("tokenizer.ggml.merges")->strings(), vocab.merges);
  const gguf::Value* types = f.find("tokenizer.ggml.token_type");
  ASSERT_EQ(types->array_size(), vocab.token_types.size());
  for (size_t i = 0; i < vocab.token_types.size(); ++i) EXPECT_EQ(types->array_int(i), vocab.token_types[i]) << i;
  EXPECT_EQ(f.get_string("tokenizer.ggml.pre"), "deepseek-v3");
  EXPECT_EQ(f.get_int("general.file_type"), 7);
}

TEST(MakeModel, SameSeedSameBytesWhateverTheThreads) {
  TempDir dir;
  MakeModelOptions a = tiny(dir.file("a.gguf"), "Q4_K_M", 7);
  a.threads = 1;
  MakeModelOptions b = tiny(dir.file("b.gguf"), "Q4_K_M", 7);
  b.threads = 3;
  MakeModelOptions c = tiny(dir.file("c.gguf"), "Q4_K_M", 8);
  make_model(a, nullptr);
  make_model(b, nullptr);
  make_model(c, nullptr);
  const std::vector<char> ba = read_bytes(a.out_path);
  const std::vector<char> bb = read_bytes(b.out_path);
  const std::vector<char> bc = read_bytes(c.out_path);
  ASSERT_GT(ba.size(), 5'000'000u);
  EXPECT_TRUE(ba == bb) << "same seed, different thread count: files differ";
  ASSERT_EQ(ba.size(), bc.size());  // the layout does not depend on the seed
  EXPECT_FALSE(ba == bc) << "seeds 7 and 8 gave identical files";
  // Every tensor differs, not just one.
  gguf::GgufFile fa = gguf::GgufFile::open(a.out_path);
  gguf::GgufFile fc = gguf::GgufFile::open(c.out_path);
  for (const gguf::TensorInfo& t : fa.tensors())
    EXPECT_NE(std::memcmp(t.data, fc.find_tensor(t.name)->data, t.nbytes), 0) << t.name;
}

// Every merge joins two tokens into a token; token strings are unique; the layout is the deepseek one.
void expect_consistent_vocab(const BpeVocab& v, int64_t n_vocab) {
  ASSERT_EQ(static_cast<int64_t>(v.tokens.size()), n_vocab);
  ASSERT_EQ(v.token_types.size(), v.tokens.size());
  std::unordered_set<std::string> set(v.tokens.begin(), v.tokens.end());
  EXPECT_EQ(set.size(), v.tokens.size()) << "duplicate token strings";
  EXPECT_EQ(v.tokens[0],
            "<\xEF\xBD\x9C"
            "begin\xE2\x96\x81"
            "of\xE2\x96\x81"
            "sentence\xEF\xBD\x9C>");
  EXPECT_EQ(v.tokens[1],
            "<\xEF\xBD\x9C"
            "end\xE2\x96\x81"
            "of\xE2\x96\x81"
            "sentence\xEF\xBD\x9C>");
  EXPECT_EQ(v.tokens[2],
            "<\xEF\xBD\x9C\xE2\x96\x81"
            "pad\xE2\x96\x81\xEF\xBD\x9C>");
  for (int i = 0; i < 3; ++i) EXPECT_EQ(v.token_types[static_cast<size_t>(i)], 3);
  for (size_t i = 3; i < v.tokens.size(); ++i) ASSERT_EQ(v.token_types[i], 1) << i;
  for (int b = 0; b < 256; ++b)
    ASSERT_EQ(v.tokens[static_cast<size_t>(3 + b)], gpt2_byte_char(static_cast<uint8_t>(b)));
  // Every token after the bytes is made by exactly one merge, in rank order, or already existed.
  EXPECT_GE(v.merges.size(), v.tokens.size() - 259);
  std::set<std::string> merge_set;
  for (const std::string& m : v.merges) {
    const size_t sp = m.find(' ');
    ASSERT_NE(sp, std::string::npos) << m;
    ASSERT_EQ(m.find(' ', sp + 1), std::string::npos) << m;
    const std::string left = m.substr(0, sp), right = m.substr(sp + 1);
    ASSERT_TRUE(set.count(left)) << m;
    ASSERT_TRUE(set.count(right)) << m;
    ASSERT_TRUE(set.count(left + right)) << m;
    EXPECT_TRUE(merge_set.insert(m).second) << "duplicate merge " << m;
  }
}

TEST(BpeVocab, ConsistentAndFastAtEverySize) {
  for (int64_t n : {int64_t{259}, int64_t{512}, int64_t{4096}, int64_t{102400}, int64_t{129280}}) {
    SCOPED_TRACE(n);
    const auto start = std::chrono::steady_clock::now();
    BpeVocab v = build_bpe_vocab({.n_vocab = n});
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(secs, 2.0);
    expect_consistent_vocab(v, n);
  }
  BpeVocab a = build_bpe_vocab({.n_vocab = 512});
  BpeVocab b = build_bpe_vocab({.n_vocab = 512});
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.merges, b.merges);
  // The paragraph alone yields the 253 merges of a 512-token vocabulary, as the reference tiny files have.
  EXPECT_EQ(a.merges.size(), 253u);
  EXPECT_EQ(a.tokens[259], std::string("\xC4\xA0") + "t");  // "Ġt": the most frequent pair of an English text
  EXPECT_THROW(build_bpe_vocab({.n_vocab = 258}), Error);
}

TEST(BpeVocab, PreSplitLikeGpt2) {
  EXPECT_EQ(gpt2_pre_split("Hello world, it's 2024!  Yes"),
            (std::vector<std::string>{"Hello", " world", ",", " it", "'s", " 2024", "!", " ", " Yes"}));
  EXPECT_EQ(gpt2_byte_char(' '), "\xC4\xA0");   // Ġ
  EXPECT_EQ(gpt2_byte_char('\n'), "\xC4\x8A");  // Ċ
  EXPECT_EQ(gpt2_byte_char('A'), "A");
  EXPECT_EQ(gpt2_byte_char(0), "\xC4\x80");  // Ā
}

// The type rules against every quantized deepseek reference file (made by llama.cpp's quantizer) and the F16 one
// (made by the converter), tensor by tensor.
TEST(FileTypes, RulesReproduceTheReferenceFiles) {
  const json* m = manifest();
  const json* next = manifest_next();
  if (!m || !next)
    HETMOE_MISSING_REFERENCE("no manifest.json and manifest-next.json in tests/data or the shared reference folder");
  std::vector<const json*> entries;
  for (const json& entry : *m) entries.push_back(&entry);
  for (const json& entry : *next) entries.push_back(&entry);
  int checked_files = 0;
  for (const json* e : entries) {
    const json& entry = *e;
    const std::string file = entry.at("file");
    // deepseek2 files and the GQA families' quantized ones, the sharded copy aside (its shards hold parts of the
    // tensor list).
    const bool gqa = file.find("glm4moe") != std::string::npos || file.find("minimax") != std::string::npos ||
                     file.find("gptoss") != std::string::npos || file.find("qwen3moe") != std::string::npos ||
                     file.find("mixtral") != std::string::npos;
    if (file.find("deepseek2lite") == std::string::npos && file.find("deepseek3-") == std::string::npos && !gqa)
      continue;
    if (file.starts_with("sharded/")) continue;
    SCOPED_TRACE(file);
    const json& md = entry.at("metadata");
    const auto ftype = static_cast<LlamaFtype>(md.at("general.file_type").get<uint32_t>());
    const FileType* ft = nullptr;
    for (const FileType& cand : file_types())
      if (cand.ftype == ftype && !ft) ft = &cand;  // the plain mix, not a dynamic one of the same ftype
    ASSERT_NE(ft, nullptr);
    const std::string arch = md.at("general.architecture");
    const int64_t heads = md.at(arch + ".attention.head_count").get<int64_t>();
    const int64_t kv_heads = md.contains(arch + ".attention.head_count_kv")
                                 ? md.at(arch + ".attention.head_count_kv").get<int64_t>()
                                 : heads;
    TensorTypeWalk types(*ft, md.at(arch + ".block_count").get<int>(), md.at(arch + ".expert_count").get<int64_t>(),
                         heads / kv_heads);
    for (const json& t : entry.at("tensors")) {
      const std::string name = t.at("name");
      const std::vector<int64_t> ne = t.at("ne");
      EXPECT_EQ(quant::type_info(types.next(name, ne)).name, t.at("type").get<std::string>()) << name;
    }
    ++checked_files;
  }
  EXPECT_EQ(checked_files, 18);  // 6 deepseek2 (the IQ2_XXS one among them), 12 of the GQA families
}

TEST(FileTypes, FallbacksAndOutputRule) {
  const std::vector<int64_t> k_b{128, 512, 16};     // attn_k_b of the real models: rows of 128
  const std::vector<int64_t> exps{1408, 2048, 64};  // V2-Lite ffn_down_exps
  auto type_of = [](const char* ft, const char* name, const std::vector<int64_t>& ne) {
    return tensor_type_for(*find_file_type(ft), {.name = name, .ne = ne, .n_layer = 27, .n_expert = 64});
  };
  EXPECT_EQ(type_of("Q4_K_M", "blk.3.attn_k_b.weight", k_b), GgmlType::Q5_0);
  EXPECT_EQ(type_of("Q5_K_M", "blk.3.attn_k_b.weight", k_b), GgmlType::Q5_1);
  EXPECT_EQ(type_of("Q6_K", "blk.3.attn_k_b.weight", k_b), GgmlType::Q8_0);
  EXPECT_EQ(type_of("Q2_K", "blk.3.attn_k_b.weight", k_b), GgmlType::Q4_0);
  EXPECT_EQ(type_of("Q3_K_M", "blk.3.attn_k_b.weight", k_b), GgmlType::Q4_0);
  EXPECT_EQ(type_of("IQ4_XS", "blk.3.attn_k_b.weight", k_b), GgmlType::IQ4_NL);
  // ffn_down: Q2_K -> Q3_K -> (1408 rows) Q4_0; Q4_K_M keeps Q4_K (-> Q5_0) in layer 3, moves to Q6_K (-> Q8_0) in 2.
  EXPECT_EQ(type_of("Q2_K", "blk.3.ffn_down_exps.weight", exps), GgmlType::Q4_0);
  EXPECT_EQ(type_of("Q4_K_M", "blk.3.ffn_down_exps.weight", exps), GgmlType::Q5_0);
  EXPECT_EQ(type_of("Q4_K_M", "blk.2.ffn_down_exps.weight", exps), GgmlType::Q8_0);
  EXPECT_EQ(type_of("Q3_K_M", "blk.0.ffn_down_exps.weight", exps), GgmlType::Q5_1);  // 0 < 27/16: Q5_K
  EXPECT_EQ(type_of("Q3_K_M", "blk.1.ffn_down_exps.weight", exps), GgmlType::Q5_0);  // Q4_K
  EXPECT_EQ(type_of("IQ4_NL", "blk.2.ffn_down_exps.weight", exps), GgmlType::Q5_1);  // 2 < 27/8: Q5_K
  EXPECT_EQ(type_of("IQ4_NL", "blk.3.ffn_down_exps.weight", exps), GgmlType::IQ4_NL);
  const std::vector<int64_t> out{2048, 102400};
  EXPECT_EQ(type_of("Q4_0", "output.weight", out), GgmlType::Q6_K);
  EXPECT_EQ(type_of("Q8_0", "output.weight", out), GgmlType::Q8_0);
  EXPECT_EQ(type_of("IQ4_XS", "output.weight", out), GgmlType::Q6_K);
  EXPECT_EQ(type_of("BF16", "output.weight", out), GgmlType::BF16);
  EXPECT_EQ(type_of("Q2_K", "blk.3.attn_output.weight", {2048, 2048}), GgmlType::Q3_K);
  EXPECT_EQ(type_of("Q3_K_M", "blk.3.attn_output.weight", {2048, 2048}), GgmlType::Q4_K);
  EXPECT_EQ(type_of("Q2_K", "token_embd.weight", out), GgmlType::Q2_K);
  EXPECT_EQ(type_of("Q4_K_M", "blk.3.ffn_gate_inp.weight", {2048, 64}), GgmlType::F32);
  EXPECT_EQ(type_of("F16", "blk.3.ffn_gate_inp.weight", {2048, 64}), GgmlType::F32);
  EXPECT_EQ(type_of("F16", "blk.3.attn_kv_a_norm.weight", {512}), GgmlType::F32);
  EXPECT_EQ(type_of("F32", "blk.3.attn_q.weight", {2048, 3072}), GgmlType::F32);
  EXPECT_EQ(find_file_type("q4_k_m"), find_file_type("Q4_K_M"));
  EXPECT_EQ(find_file_type("Q4_K"), nullptr);
  EXPECT_EQ(file_type_names().size(), 27u);
  // The IQ mixes without an importance matrix, on V2-Lite's shapes (27 layers: the first 3 ffn_down tensors of the
  // file get more bits in the 2-bit mixes).
  auto iq = [](const char* ft, const char* name, const std::vector<int64_t>& ne, int ffn_down_index = 10) {
    return tensor_type_for(*find_file_type(ft),
                           {.name = name, .ne = ne, .n_layer = 27, .n_expert = 64, .ffn_down_index = ffn_down_index});
  };
  const std::vector<int64_t> down{2048, 7168, 256};  // V3's ffn_down_exps: whole 256-blocks
  EXPECT_EQ(iq("IQ2_XXS", "blk.5.ffn_down_exps.weight", down), GgmlType::IQ2_XXS);
  EXPECT_EQ(iq("IQ2_XXS", "blk.1.ffn_down_exps.weight", down, 2), GgmlType::Q2_K);
  EXPECT_EQ(iq("IQ2_M", "blk.1.ffn_down_exps.weight", down, 2), GgmlType::IQ3_S);
  EXPECT_EQ(iq("IQ2_S", "blk.5.ffn_up_exps.weight", {2048, 1408, 64}), GgmlType::IQ2_XS);
  EXPECT_EQ(iq("IQ1_S", "blk.5.attn_output.weight", {2048, 2048}), GgmlType::IQ2_XXS);
  EXPECT_EQ(iq("IQ1_M", "output.weight", out), GgmlType::Q5_K);
  EXPECT_EQ(iq("IQ2_M", "token_embd.weight", out), GgmlType::IQ3_S);
  EXPECT_EQ(iq("IQ3_XXS", "blk.5.ffn_down_exps.weight", down), GgmlType::Q3_K);
  EXPECT_EQ(iq("IQ3_XXS", "blk.1.ffn_down_exps.weight", down), GgmlType::Q4_K);
  EXPECT_EQ(iq("IQ3_XXS", "blk.5.attn_q.weight", {2048, 3072}), GgmlType::IQ2_S);
  EXPECT_EQ(iq("IQ3_S", "blk.5.ffn_gate_exps.weight", {2048, 1408, 64}), GgmlType::IQ3_S);
  EXPECT_EQ(iq("IQ3_S", "blk.3.attn_k_b.weight", k_b), GgmlType::IQ4_NL);
  // The unsloth-like dynamic mix: routed gate/up IQ2_XXS, routed down IQ2_S, K-quants around them.
  EXPECT_EQ(iq("UD-IQ2_XXS", "blk.5.ffn_gate_exps.weight", {2048, 1408, 64}), GgmlType::IQ2_XXS);
  EXPECT_EQ(iq("UD-IQ2_XXS", "blk.5.ffn_down_exps.weight", down, 2), GgmlType::IQ2_S);
  EXPECT_EQ(iq("UD-IQ2_XXS", "blk.5.ffn_down_shexp.weight", {2816, 2048}), GgmlType::Q5_K);
  EXPECT_EQ(iq("UD-IQ2_XXS", "blk.5.attn_output.weight", {2048, 2048}), GgmlType::Q4_K);
  EXPECT_EQ(iq("UD-IQ2_XXS", "blk.3.attn_k_b.weight", k_b), GgmlType::Q5_0);
  EXPECT_EQ(iq("UD-IQ2_XXS", "output.weight", out), GgmlType::Q6_K);
  EXPECT_EQ(iq("UD-IQ2_XXS", "blk.5.ffn_down_exps.weight", {1408, 2048, 64}), GgmlType::IQ4_NL);  // V2-Lite's rows
  // The ternary mixes: Q4_K embeddings, Q6_K output, Q4_0 where a row is not whole 256-blocks.
  EXPECT_EQ(type_of("TQ1_0", "blk.3.ffn_up_exps.weight", {2048, 1408, 64}), GgmlType::TQ1_0);
  EXPECT_EQ(type_of("TQ2_0", "blk.3.attn_output.weight", {2048, 2048}), GgmlType::TQ2_0);
  EXPECT_EQ(type_of("TQ2_0", "token_embd.weight", out), GgmlType::Q4_K);
  EXPECT_EQ(type_of("TQ1_0", "output.weight", out), GgmlType::Q6_K);
  EXPECT_EQ(type_of("TQ1_0", "blk.3.ffn_down_exps.weight", {1408, 2048, 64}), GgmlType::Q4_0);
  // gpt-oss's MXFP4_MOE mix: experts in MXFP4, every other weight (the output head too) in Q8_0, routers F32.
  EXPECT_EQ(type_of("MXFP4_MOE", "blk.3.ffn_up_exps.weight", {2048, 1408, 64}), GgmlType::MXFP4);
  EXPECT_EQ(type_of("MXFP4_MOE", "blk.3.ffn_down_exps.weight", {1408, 2048, 64}), GgmlType::MXFP4);
  EXPECT_EQ(type_of("MXFP4_MOE", "blk.3.attn_output.weight", {2048, 2048}), GgmlType::Q8_0);
  EXPECT_EQ(type_of("MXFP4_MOE", "blk.3.ffn_up_shexp.weight", {2048, 2816}), GgmlType::Q8_0);
  EXPECT_EQ(type_of("MXFP4_MOE", "output.weight", out), GgmlType::Q8_0);
  EXPECT_EQ(type_of("MXFP4_MOE", "token_embd.weight", out), GgmlType::Q8_0);
  EXPECT_EQ(type_of("MXFP4_MOE", "blk.3.ffn_gate_inp.weight", {2048, 64}), GgmlType::F32);
}

const PlannedTensor* find(const ModelPlan& plan, const std::string& name) {
  for (const PlannedTensor& t : plan.tensors)
    if (t.name == name) return &t;
  return nullptr;
}

TEST(MakeModel, DeepSeekV2LitePlanWithTwoLayers) {
  ModelPlan plan = plan_model({.preset = "deepseek-v2-lite", .out_path = "", .type = "Q4_K_M", .layers = 2});
  EXPECT_EQ(plan.n_layer, 2);
  EXPECT_EQ(plan.n_leading_dense, 1);
  struct Want {
    std::string name;
    std::vector<int64_t> ne;
    GgmlType type;
  };
  const std::vector<Want> want = {
      {"token_embd.weight", {2048, 102400}, GgmlType::Q4_K},
      {"blk.0.attn_q.weight", {2048, 3072}, GgmlType::Q4_K},
      {"blk.0.attn_kv_a_mqa.weight", {2048, 576}, GgmlType::Q4_K},
      {"blk.0.attn_kv_a_norm.weight", {512}, GgmlType::F32},
      {"blk.0.attn_k_b.weight", {128, 512, 16}, GgmlType::Q5_0},
      {"blk.0.attn_v_b.weight", {512, 128, 16}, GgmlType::Q4_K},
      {"blk.0.attn_output.weight", {2048, 2048}, GgmlType::Q4_K},
      {"blk.0.ffn_gate.weight", {2048, 10944}, GgmlType::Q4_K},
      {"blk.0.ffn_down.weight", {10944, 2048}, GgmlType::Q5_0},  // 10944 % 256 != 0
      {"blk.1.ffn_gate_inp.weight", {2048, 64}, GgmlType::F32},
      {"blk.1.ffn_gate_exps.weight", {2048, 1408, 64}, GgmlType::Q4_K},
      {"blk.1.ffn_up_exps.weight", {2048, 1408, 64}, GgmlType::Q4_K},
      {"blk.1.ffn_down_exps.weight", {1408, 2048, 64}, GgmlType::Q8_0},  // use_more_bits(1, 2): Q6_K -> Q8_0
      {"blk.1.ffn_up_shexp.weight", {2048, 2816}, GgmlType::Q4_K},
      {"blk.1.ffn_down_shexp.weight", {2816, 2048}, GgmlType::Q6_K},
      {"output.weight", {2048, 102400}, GgmlType::Q6_K},
  };
  for (const Want& w : want) {
    const PlannedTensor* t = find(plan, w.name);
    ASSERT_NE(t, nullptr) << w.name;
    EXPECT_EQ(t->ne, w.ne) << w.name;
    EXPECT_EQ(t->type, w.type) << w.name << " is " << quant::type_info(t->type).name;
  }
  EXPECT_EQ(find(plan, "blk.0.attn_q_a.weight"), nullptr);
  EXPECT_EQ(find(plan, "blk.1.exp_probs_b.bias"), nullptr);
  EXPECT_EQ(plan.tensors.size(), 1u + 11u + 15u + 2u);
  EXPECT_NEAR(find(plan, "blk.1.ffn_down_exps.weight")->scale, 1.0 / std::sqrt(1408.0), 1e-7);

  std::map<std::string, const gguf::Value*> md;
  for (const auto& [k, v] : plan.metadata) md[k] = &v;
  EXPECT_EQ(md.at("deepseek2.block_count")->as_int(), 2);
  EXPECT_EQ(md.at("deepseek2.leading_dense_block_count")->as_int(), 1);
  EXPECT_EQ(md.at("deepseek2.attention.q_lora_rank")->as_int(), 0);
  EXPECT_EQ(md.at("deepseek2.attention.key_length")->as_int(), 576);
  EXPECT_EQ(md.at("deepseek2.attention.value_length")->as_int(), 512);
  EXPECT_EQ(md.at("deepseek2.attention.key_length_mla")->as_int(), 192);
  EXPECT_EQ(md.at("deepseek2.attention.value_length_mla")->as_int(), 128);
  EXPECT_EQ(md.at("deepseek2.expert_gating_func")->as_int(), 1);
  EXPECT_EQ(md.at("deepseek2.expert_shared_count")->as_int(), 2);
  EXPECT_EQ(md.count("deepseek2.expert_weights_norm"), 0u);
  EXPECT_EQ(static_cast<float>(*md.at("deepseek2.rope.scaling.yarn_log_multiplier")->as_float()), 0.0707f);
  EXPECT_EQ(*md.at("tokenizer.ggml.pre")->as_string(), "deepseek-llm");
  EXPECT_EQ(md.at("tokenizer.ggml.tokens")->array_size(), 102400u);
  EXPECT_EQ(md.at("general.file_type")->as_int(), 15);
}

TEST(MakeModel, DeepSeekV3LayerCounts) {
  auto plan_for = [](int layers) {
    return plan_model({.preset = "deepseek-v3", .out_path = "", .type = "Q4_K_M", .layers = layers});
  };
  ModelPlan def = plan_for(-1);
  EXPECT_EQ(def.n_layer, 4);
  EXPECT_EQ(def.n_leading_dense, 3);
  ASSERT_NE(find(def, "blk.3.ffn_gate_exps.weight"), nullptr);
  EXPECT_EQ(find(def, "blk.3.ffn_gate_exps.weight")->ne, (std::vector<int64_t>{7168, 2048, 256}));
  EXPECT_EQ(find(def, "blk.0.attn_q_b.weight")->ne, (std::vector<int64_t>{1536, 128 * 192}));
  EXPECT_EQ(find(def, "blk.2.ffn_down.weight")->ne, (std::vector<int64_t>{18432, 7168}));
  EXPECT_EQ(find(def, "blk.3.exp_probs_b.bias")->ne, (std::vector<int64_t>{256}));
  EXPECT_EQ(plan_for(1).n_leading_dense, 0);
  EXPECT_EQ(plan_for(2).n_leading_dense, 1);
  EXPECT_EQ(plan_for(3).n_leading_dense, 2);
  EXPECT_EQ(plan_for(61).n_leading_dense, 3);
  EXPECT_EQ(plan_for(61).tensors.size(), 1u + 3u * 13u + 58u * 18u + 2u);
}

TEST(MakeModel, ErrorsAreOneLine) {
  auto message = [](const MakeModelOptions& o) -> std::string {
    try {
      make_model(o, nullptr);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  TempDir dir;
  EXPECT_NE(message({.preset = "tiny-llama", .out_path = dir.file("x")}).find("unknown preset 'tiny-llama'"),
            std::string::npos);
  EXPECT_NE(message(tiny(dir.file("x"), "Q4_K")).find("unknown file type 'Q4_K'"), std::string::npos);
  MakeModelOptions o = tiny(dir.file("x"), "F16");
  o.layers = 0;
  EXPECT_NE(message(o).find("out of range"), std::string::npos);
  o.preset = "deepseek-v3";
  o.layers = 62;
  EXPECT_NE(message(o).find("out of range"), std::string::npos);
  const std::string no_dir = message(tiny(dir.file("missing/x.gguf"), "F16"));
  EXPECT_NE(no_dir.find("cannot create"), std::string::npos) << no_dir;
  EXPECT_EQ(no_dir.find('\n'), std::string::npos);
  EXPECT_FALSE(fs::exists(dir.file("x")));
}

}  // namespace
}  // namespace hetmoe
