// Writes the seed corpus of fuzz_gguf: small valid files covering every metadata value type, several tensor
// types, a custom alignment and version 2, plus a miniature of each model given on the command line (its full
// metadata, tokenizer included, and every tensor cut to one block so the file stays small) where the reader takes it.
//
//   gguf_fuzz_seeds OUT_DIR [MODEL.gguf ...]
//   gguf_fuzz_seeds --shards OUT_DIR      (fuzz_gguf_shards' seeds: small sets of 2 to 4 shards)

#include <fmt/format.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "quant/ggml_type.h"
#include "runtime/error.h"
#include "runtime/gguf/reader.h"
#include "runtime/gguf/value.h"
#include "runtime/gguf/writer.h"

namespace hetmoe::gguf {
namespace {

using quant::GgmlType;

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(i * 13 + seed);
  return out;
}

std::vector<uint8_t> raw_of(size_t n, size_t width) { return pattern(n * width, static_cast<uint32_t>(width)); }

void add_tensor(GgufWriter& w, const std::string& name, GgmlType type, std::vector<int64_t> ne, uint32_t seed) {
  size_t bytes = quant::row_bytes(type, ne[0]);
  for (size_t d = 1; d < ne.size(); ++d) bytes *= static_cast<size_t>(ne[d]);
  w.add_tensor_bytes(name, type, std::move(ne), pattern(bytes, seed));
}

void write_synthetic(const std::filesystem::path& dir) {
  GgufWriter all;
  all.set("general.architecture", Value::string("seed"));
  all.set("u8", Value::u8(1));
  all.set("i8", Value::i8(-1));
  all.set("u16", Value::u16(2));
  all.set("i16", Value::i16(-2));
  all.set("u32", Value::u32(3));
  all.set("i32", Value::i32(-3));
  all.set("f32", Value::f32(0.5f));
  all.set("bool", Value::boolean(true));
  all.set("str", Value::string("text"));
  all.set("u64", Value::u64(4));
  all.set("i64", Value::i64(-4));
  all.set("f64", Value::f64(0.25));
  for (ValueType t :
       {ValueType::kUint8, ValueType::kInt8, ValueType::kUint16, ValueType::kInt16, ValueType::kUint32,
        ValueType::kInt32, ValueType::kFloat32, ValueType::kUint64, ValueType::kInt64, ValueType::kFloat64})
    all.set(fmt::format("arr.{}", value_type_name(t)), Value::numeric_array(t, raw_of(3, value_type_size(t))));
  all.set("arr.bool", Value::numeric_array(ValueType::kBool, {0, 1, 1}));
  all.set("arr.str", Value::string_array({"a", "", "bc"}));
  all.set("arr.nested", Value::nested_array(ValueType::kArray, {Value::i32_array({1, 2}), Value::string_array({"x"})}));
  all.write((dir / "metadata.gguf").string());

  GgufWriter tensors;
  tensors.set("general.architecture", Value::string("seed"));
  add_tensor(tensors, "f32", GgmlType::F32, {17, 3}, 1);
  add_tensor(tensors, "f16", GgmlType::F16, {8}, 2);
  add_tensor(tensors, "bf16", GgmlType::BF16, {4, 2}, 3);
  add_tensor(tensors, "q8_0", GgmlType::Q8_0, {32, 2}, 4);
  add_tensor(tensors, "q4_0", GgmlType::Q4_0, {32}, 5);
  add_tensor(tensors, "q4_k", GgmlType::Q4_K, {256}, 6);
  add_tensor(tensors, "q6_k", GgmlType::Q6_K, {256, 1, 1, 2}, 7);
  tensors.write((dir / "tensors.gguf").string());

  GgufWriter aligned;
  aligned.set("general.alignment", Value::u32(64));
  add_tensor(aligned, "a", GgmlType::F32, {5}, 8);
  add_tensor(aligned, "b", GgmlType::F16, {3, 3}, 9);
  aligned.write((dir / "aligned64.gguf").string());

  GgufWriter vocab;
  vocab.set("tokenizer.ggml.model", Value::string("gpt2"));
  vocab.set("tokenizer.ggml.tokens", Value::string_array({"<s>", "</s>", "a", "b"}));
  vocab.set("tokenizer.ggml.token_type", Value::i32_array({3, 3, 1, 1}));
  vocab.write((dir / "vocab.gguf").string());

  GgufWriter empty;
  empty.write((dir / "empty.gguf").string());

  // Version 2 has the version 3 layout: the same file with its version field changed.
  std::filesystem::path v2 = dir / "v2.gguf";
  std::filesystem::copy_file(dir / "aligned64.gguf", v2, std::filesystem::copy_options::overwrite_existing);
  std::fstream f(v2, std::ios::in | std::ios::out | std::ios::binary);
  const uint32_t version = 2;
  f.seekp(4);
  f.write(reinterpret_cast<const char*>(&version), sizeof version);
}

// The model's metadata unchanged and each tensor cut to one block per row and a single row, keeping its name,
// type and dimension count, with the first bytes of its real data.
void write_miniature(const std::string& model, const std::filesystem::path& dir) {
  GgufFile src = GgufFile::open(model);
  GgufWriter w;
  for (const auto& [key, value] : src.metadata()) w.set(key, value);
  for (const TensorInfo& t : src.tensors()) {
    const quant::TypeInfo& info = quant::type_info(t.type);
    std::vector<int64_t> ne(static_cast<size_t>(t.n_dims), 1);
    ne[0] = info.block_size;
    w.add_tensor_bytes(t.name, t.type, ne, std::vector<uint8_t>(t.data, t.data + info.type_size));
  }
  w.write((dir / ("mini-" + std::filesystem::path(model).filename().string())).string());
}

// Shard sets in fuzz_gguf_shards' input form: a small model written by the writer in 2, 3 and 4 shards.
void write_shard_seeds(const std::filesystem::path& dir) {
  for (int tensors : {2, 3, 4}) {
    GgufWriter w;
    w.set("general.architecture", Value::string("seed"));
    for (int i = 0; i < tensors; ++i)
      add_tensor(w, fmt::format("t{}", i), GgmlType::F32, {16}, static_cast<uint32_t>(i));
    const std::filesystem::path tmp = dir / fmt::format("set{}.gguf", tensors);
    const std::vector<std::string> shards = w.write(tmp.string(), 64);
    std::vector<std::vector<uint8_t>> bytes;
    for (const std::string& p : shards) {
      std::ifstream in(p, std::ios::binary);
      bytes.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      std::filesystem::remove(p);
    }
    std::vector<uint8_t> seed{static_cast<uint8_t>(shards.size() - 2)};
    for (size_t i = 0; i + 1 < bytes.size(); ++i) {
      seed.push_back(static_cast<uint8_t>(bytes[i].size() & 0xff));
      seed.push_back(static_cast<uint8_t>(bytes[i].size() >> 8));
    }
    for (const std::vector<uint8_t>& b : bytes) seed.insert(seed.end(), b.begin(), b.end());
    std::ofstream(dir / fmt::format("shards-{}", tensors), std::ios::binary)
        .write(reinterpret_cast<const char*>(seed.data()), static_cast<std::streamsize>(seed.size()));
  }
}

}  // namespace
}  // namespace hetmoe::gguf

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR [MODEL.gguf ...] | --shards OUT_DIR\n", argv[0]);
    return 2;
  }
  try {
    if (std::string(argv[1]) == "--shards" && argc == 3) {
      std::filesystem::create_directories(argv[2]);
      hetmoe::gguf::write_shard_seeds(argv[2]);
      return 0;
    }
    std::filesystem::path dir = argv[1];
    std::filesystem::create_directories(dir);
    hetmoe::gguf::write_synthetic(dir);
    // A model this reader refuses (a weight type hetmoe does not run yet, say) gives no miniature; its raw head,
    // which fuzz.sh copies, still seeds the corpus.
    for (int i = 2; i < argc; ++i) {
      try {
        hetmoe::gguf::write_miniature(argv[i], dir);
      } catch (const hetmoe::Error& e) {
        std::fprintf(stderr, "gguf_fuzz_seeds: no miniature of %s\n", e.what());
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gguf_fuzz_seeds: %s\n", e.what());
    return 1;
  }
  return 0;
}
