#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "quant/ggml_type.h"
#include "runtime/error.h"
#include "runtime/gguf/reader.h"
#include "runtime/gguf/value.h"
#include "runtime/gguf/writer.h"
#include "tests/support/reference.h"

namespace hetmoe::gguf {
namespace {

using quant::GgmlType;

constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();
constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
constexpr size_t kHeaderBytes = 24;  // magic, version, tensor count, metadata count

// A directory of its own for each test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            fmt::format("hetmoe-test-gguf-{}-{}-{}", ::getpid(), info->test_suite_name(), info->name());
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(std::string_view name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

template <typename T>
std::vector<uint8_t> le_bytes(std::initializer_list<T> values) {
  std::vector<uint8_t> out(values.size() * sizeof(T));
  size_t i = 0;
  for (T v : values) std::memcpy(out.data() + sizeof(T) * i++, &v, sizeof(T));
  return out;
}

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>((i * 31 + seed * 7 + (i >> 8)) & 0xff);
  return out;
}

// Where the fields of one tensor entry landed in a hand-built file, for the offsets errors must name.
struct TensorFields {
  size_t name_at = 0;
  size_t n_dims_at = 0;
  size_t ne_at = 0;
  size_t type_at = 0;
  size_t offset_at = 0;
};

// Little-endian GGUF bytes written field by field, for files that no writer would produce.
class ByteBuilder {
 public:
  template <typename T>
  ByteBuilder& pod(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    bytes_.insert(bytes_.end(), p, p + sizeof v);
    return *this;
  }
  ByteBuilder& u8(uint8_t v) { return pod(v); }
  ByteBuilder& u32(uint32_t v) { return pod(v); }
  ByteBuilder& u64(uint64_t v) { return pod(v); }
  ByteBuilder& i64(int64_t v) { return pod(v); }
  ByteBuilder& type(ValueType t) { return u32(static_cast<uint32_t>(t)); }
  ByteBuilder& str(std::string_view s) {
    u64(s.size());
    bytes_.insert(bytes_.end(), s.begin(), s.end());
    return *this;
  }
  ByteBuilder& raw(const std::vector<uint8_t>& b) {
    bytes_.insert(bytes_.end(), b.begin(), b.end());
    return *this;
  }
  ByteBuilder& zeros(size_t n) {
    bytes_.resize(bytes_.size() + n, 0);
    return *this;
  }
  ByteBuilder& pad_to(size_t alignment) { return zeros((alignment - bytes_.size() % alignment) % alignment); }

  ByteBuilder& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    return u32(kMagic).u32(version).u64(n_tensors).u64(n_kv);
  }
  // The key and value type of a metadata entry; the caller appends the value.
  ByteBuilder& key(std::string_view k, ValueType t) { return str(k).type(t); }
  ByteBuilder& kv_u32(std::string_view k, uint32_t v) { return key(k, ValueType::kUint32).u32(v); }

  // One tensor entry. `n_dims` overrides the dimension count written (the ne values written stay `ne`).
  TensorFields tensor(std::string_view name, const std::vector<int64_t>& ne, uint32_t raw_type, uint64_t offset,
                      std::optional<uint32_t> n_dims = std::nullopt) {
    TensorFields f;
    f.name_at = size();
    str(name);
    f.n_dims_at = size();
    u32(n_dims.value_or(static_cast<uint32_t>(ne.size())));
    f.ne_at = size();
    for (int64_t n : ne) i64(n);
    f.type_at = size();
    u32(raw_type);
    f.offset_at = size();
    u64(offset);
    return f;
  }
  TensorFields tensor(std::string_view name, const std::vector<int64_t>& ne, GgmlType type, uint64_t offset) {
    return tensor(name, ne, static_cast<uint32_t>(type), offset);
  }

  size_t size() const { return bytes_.size(); }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

// Parses `bytes` from a heap buffer of exactly their size, so that a read past the end is an overflow that
// AddressSanitizer reports, and returns the error message; nullopt when the bytes parse.
std::optional<std::string> parse_error(const std::vector<uint8_t>& bytes) {
  auto buffer = std::make_unique<uint8_t[]>(bytes.size());
  if (!bytes.empty()) std::memcpy(buffer.get(), bytes.data(), bytes.size());
  try {
    GgufFile::parse({buffer.get(), bytes.size()}, "bad.gguf");
  } catch (const Error& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

// The file must be rejected with one line: the file's name, a message containing `problem`, and the byte offset
// (exactly `offset` when given).
void expect_error(const std::vector<uint8_t>& bytes, std::string_view problem,
                  std::optional<uint64_t> offset = std::nullopt) {
  std::optional<std::string> msg = parse_error(bytes);
  ASSERT_TRUE(msg.has_value()) << "parsed without error; expected: " << problem;
  EXPECT_TRUE(msg->starts_with("bad.gguf: ")) << *msg;
  EXPECT_NE(msg->find(problem), std::string::npos) << *msg;
  EXPECT_EQ(msg->find('\n'), std::string::npos) << *msg;
  if (offset)
    EXPECT_TRUE(msg->ends_with(fmt::format("(at byte offset {})", *offset))) << *msg;
  else
    EXPECT_NE(msg->find("(at byte offset "), std::string::npos) << *msg;
}

// A valid file with one F32 tensor of `n` elements at offset 0 and no metadata.
std::vector<uint8_t> one_tensor_file(int64_t n, uint32_t version = 3) {
  ByteBuilder b;
  b.header(1, 0, version);
  b.tensor("w", {n}, GgmlType::F32, 0);
  b.pad_to(kDefaultAlignment);
  b.raw(pattern(static_cast<size_t>(n) * 4, 1));
  return b.bytes();
}

// ---------------------------------------------------------------------------------------------------------------
// Writer -> reader round trips

struct NumericArray {
  std::string key;
  ValueType elem;
  std::vector<uint8_t> raw;
};

std::vector<NumericArray> numeric_arrays() {
  return {
      {"arr.u8", ValueType::kUint8, le_bytes<uint8_t>({0, 200, 255})},
      {"arr.i8", ValueType::kInt8, le_bytes<int8_t>({-128, 0, 127})},
      {"arr.u16", ValueType::kUint16, le_bytes<uint16_t>({0, 65535, 7})},
      {"arr.i16", ValueType::kInt16, le_bytes<int16_t>({-32768, 32767})},
      {"arr.u32", ValueType::kUint32, le_bytes<uint32_t>({0, 4000000000u})},
      {"arr.i32", ValueType::kInt32, le_bytes<int32_t>({-2000000000, 5, 17})},
      {"arr.f32", ValueType::kFloat32, le_bytes<float>({1.5f, -0.25f, 3e38f})},
      {"arr.bool", ValueType::kBool, le_bytes<uint8_t>({1, 0, 1, 1})},
      {"arr.u64", ValueType::kUint64, le_bytes<uint64_t>({0, kU64Max})},
      {"arr.i64", ValueType::kInt64, le_bytes<int64_t>({std::numeric_limits<int64_t>::min(), kI64Max})},
      {"arr.f64", ValueType::kFloat64, le_bytes<double>({-2.25e300, 1e-300})},
      {"arr.empty_u32", ValueType::kUint32, {}},
  };
}

TEST(GgufRoundTrip, EveryMetadataValueType) {
  TempDir dir;
  const std::string nul_string("a\0b", 3);
  const std::string long_string(100000, 'x');
  GgufWriter w;
  w.set("s.u8", Value::u8(200));
  w.set("s.i8", Value::i8(-5));
  w.set("s.u16", Value::u16(60000));
  w.set("s.i16", Value::i16(-300));
  w.set("s.u32", Value::u32(4000000000u));
  w.set("s.i32", Value::i32(-2000000000));
  w.set("s.u64", Value::u64(kU64Max));
  w.set("s.i64", Value::i64(std::numeric_limits<int64_t>::min()));
  w.set("s.f32", Value::f32(1.5f));
  w.set("s.f64", Value::f64(-2.25e300));
  w.set("s.true", Value::boolean(true));
  w.set("s.false", Value::boolean(false));
  w.set("s.str", Value::string("hello\tworld\n"));
  w.set("s.empty", Value::string(""));
  w.set("s.utf8", Value::string("Привет, 世界"));
  w.set("s.nul", Value::string(nul_string));
  w.set("s.long", Value::string(long_string));
  for (const NumericArray& a : numeric_arrays()) w.set(a.key, Value::numeric_array(a.elem, a.raw));
  w.set("arr.str", Value::string_array({"", "a", "<|endoftext|>", std::string(1000, 'y')}));
  w.set("arr.str_empty", Value::string_array({}));
  w.set("arr.nested",
        Value::nested_array(ValueType::kArray,
                            {Value::i32_array({1, 2, 3}), Value::i32_array({}), Value::string_array({"x", "y"}),
                             Value::nested_array(ValueType::kArray, {Value::f32_array({2.5f})})}));
  const std::string path = dir.file("meta.gguf");
  w.write(path);

  GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_TRUE(f.tensors().empty());

  auto get = [&](std::string_view key) -> const Value& {
    const Value* v = f.find(key);
    EXPECT_NE(v, nullptr) << key;
    static const Value kMissing;
    return v ? *v : kMissing;
  };
  EXPECT_EQ(get("s.u8").type(), ValueType::kUint8);
  EXPECT_EQ(get("s.u8").as_int(), 200);
  EXPECT_EQ(get("s.i8").type(), ValueType::kInt8);
  EXPECT_EQ(get("s.i8").as_int(), -5);
  EXPECT_EQ(get("s.u16").type(), ValueType::kUint16);
  EXPECT_EQ(get("s.u16").as_int(), 60000);
  EXPECT_EQ(get("s.i16").type(), ValueType::kInt16);
  EXPECT_EQ(get("s.i16").as_int(), -300);
  EXPECT_EQ(get("s.u32").type(), ValueType::kUint32);
  EXPECT_EQ(get("s.u32").as_int(), 4000000000);
  EXPECT_EQ(get("s.i32").type(), ValueType::kInt32);
  EXPECT_EQ(get("s.i32").as_int(), -2000000000);
  EXPECT_EQ(get("s.u64").type(), ValueType::kUint64);
  EXPECT_EQ(get("s.u64").u64_value(), kU64Max);
  EXPECT_EQ(get("s.u64").as_int(), std::nullopt);  // does not fit int64
  EXPECT_EQ(get("s.i64").type(), ValueType::kInt64);
  EXPECT_EQ(get("s.i64").as_int(), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(get("s.f32").type(), ValueType::kFloat32);
  EXPECT_EQ(get("s.f32").as_float(), 1.5);
  EXPECT_EQ(get("s.f32").as_int(), std::nullopt);
  EXPECT_EQ(get("s.f64").type(), ValueType::kFloat64);
  EXPECT_EQ(get("s.f64").as_float(), -2.25e300);
  EXPECT_EQ(get("s.true").as_bool(), true);
  EXPECT_EQ(get("s.false").as_bool(), false);
  EXPECT_EQ(*get("s.str").as_string(), "hello\tworld\n");
  EXPECT_EQ(get("s.str").to_display(), "\"hello world \"");
  EXPECT_EQ(*get("s.empty").as_string(), "");
  EXPECT_EQ(*get("s.utf8").as_string(), "Привет, 世界");
  EXPECT_EQ(*get("s.nul").as_string(), nul_string);
  EXPECT_EQ(*get("s.long").as_string(), long_string);

  for (const NumericArray& a : numeric_arrays()) {
    const Value& v = get(a.key);
    ASSERT_TRUE(v.is_array()) << a.key;
    EXPECT_EQ(v.elem_type(), a.elem) << a.key;
    EXPECT_EQ(v.raw(), a.raw) << a.key;
    EXPECT_EQ(v.array_size(), a.raw.size() / value_type_size(a.elem)) << a.key;
  }
  EXPECT_EQ(get("arr.u8").array_int(1), 200);
  EXPECT_EQ(get("arr.i16").array_int(0), -32768);
  EXPECT_EQ(get("arr.f32").array_float(1), -0.25);
  EXPECT_EQ(get("arr.u64").array_int(1), std::nullopt);  // does not fit int64
  EXPECT_EQ(get("arr.i64").array_int(1), kI64Max);
  EXPECT_EQ(get("arr.f64").array_float(0), -2.25e300);
  EXPECT_EQ(get("arr.bool").array_int(2), 1);
  EXPECT_EQ(get("arr.u8").array_int(3), std::nullopt);  // out of range

  const Value& strings = get("arr.str");
  EXPECT_EQ(strings.elem_type(), ValueType::kString);
  EXPECT_EQ(strings.strings(), (std::vector<std::string>{"", "a", "<|endoftext|>", std::string(1000, 'y')}));
  EXPECT_EQ(get("arr.str_empty").array_size(), 0u);

  const Value& nested = get("arr.nested");
  EXPECT_EQ(nested.elem_type(), ValueType::kArray);
  ASSERT_EQ(nested.items().size(), 4u);
  EXPECT_EQ(nested.items()[0].elem_type(), ValueType::kInt32);
  EXPECT_EQ(nested.items()[0].array_int(2), 3);
  EXPECT_EQ(nested.items()[1].array_size(), 0u);
  EXPECT_EQ(nested.items()[2].strings(), (std::vector<std::string>{"x", "y"}));
  ASSERT_EQ(nested.items()[3].items().size(), 1u);
  EXPECT_EQ(nested.items()[3].items()[0].array_float(0), 2.5);

  // File order is kept.
  ASSERT_GE(f.metadata().size(), 3u);
  EXPECT_EQ(f.metadata()[0].first, "s.u8");
  EXPECT_EQ(f.metadata()[1].first, "s.i8");
  EXPECT_EQ(f.metadata().back().first, "arr.nested");

  // Typed look-ups.
  EXPECT_EQ(f.get_int("s.u16"), 60000);
  EXPECT_EQ(f.get_float("s.i8"), -5.0);
  EXPECT_EQ(f.get_bool("s.true"), true);
  EXPECT_EQ(f.get_string("s.str"), "hello\tworld\n");
  EXPECT_EQ(f.get_int("absent"), std::nullopt);
  EXPECT_THROW(f.get_int("s.str"), Error);
  EXPECT_THROW(f.get_bool("s.u8"), Error);
  try {
    f.require_int("absent.key");
    ADD_FAILURE() << "require_int of a missing key returned";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("absent.key"), std::string::npos) << e.what();
  }
}

TEST(GgufRoundTrip, TensorsOfSeveralTypes) {
  struct Spec {
    std::string name;
    GgmlType type;
    std::vector<int64_t> ne;
    size_t row_bytes;
    int64_t rows;
  };
  const std::vector<Spec> specs = {
      {"f32", GgmlType::F32, {17, 3}, 68, 3},
      {"f16", GgmlType::F16, {37}, 74, 1},
      {"q8_0", GgmlType::Q8_0, {64, 2}, 68, 2},
      {"q4_k", GgmlType::Q4_K, {256, 2, 3}, 144, 6},
      {"q6_k.4d", GgmlType::Q6_K, {256, 1, 2, 2}, 210, 4},
  };
  TempDir dir;
  GgufWriter w;
  w.set("general.architecture", Value::string("test"));
  std::vector<std::vector<uint8_t>> data;
  for (size_t i = 0; i < specs.size(); ++i) {
    data.push_back(pattern(specs[i].row_bytes * static_cast<size_t>(specs[i].rows), static_cast<uint32_t>(i)));
    w.add_tensor_bytes(specs[i].name, specs[i].type, specs[i].ne, data.back());
  }
  const std::string path = dir.file("tensors.gguf");
  w.write(path);

  GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.alignment(), kDefaultAlignment);
  EXPECT_EQ(f.data_offset() % kDefaultAlignment, 0u);
  ASSERT_EQ(f.tensors().size(), specs.size());
  uint64_t expected_offset = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorInfo& t = f.tensors()[i];
    const Spec& s = specs[i];
    EXPECT_EQ(t.name, s.name);
    EXPECT_EQ(t.type, s.type) << s.name;
    EXPECT_EQ(t.n_dims, static_cast<int>(s.ne.size())) << s.name;
    for (size_t d = 0; d < 4; ++d) EXPECT_EQ(t.ne[d], d < s.ne.size() ? s.ne[d] : 1) << s.name << " dim " << d;
    EXPECT_EQ(t.row_bytes, s.row_bytes) << s.name;
    EXPECT_EQ(t.n_rows, s.rows) << s.name;
    EXPECT_EQ(t.nbytes, data[i].size()) << s.name;
    EXPECT_EQ(t.offset, expected_offset) << s.name;
    expected_offset += (t.nbytes + kDefaultAlignment - 1) / kDefaultAlignment * kDefaultAlignment;
    ASSERT_NE(t.data, nullptr);
    EXPECT_EQ(std::vector<uint8_t>(t.data, t.data + t.nbytes), data[i]) << s.name;
    EXPECT_EQ(t.row(1), t.data + s.row_bytes);
    EXPECT_EQ(f.find_tensor(s.name), &t);
  }
  EXPECT_EQ(f.tensors()[0].shape_string(), "[17, 3]");
  EXPECT_EQ(f.tensors()[3].n_elements(), 256 * 6);
  EXPECT_EQ(f.find_tensor("absent"), nullptr);
}

TEST(GgufRoundTrip, CustomAlignment) {
  for (uint32_t alignment : {1u, 8u, 64u, 4096u}) {
    SCOPED_TRACE(alignment);
    TempDir dir;
    GgufWriter w;
    w.set("general.alignment", Value::u32(alignment));
    EXPECT_EQ(w.alignment(), alignment);
    const std::vector<uint8_t> a = pattern(68, 1), b = pattern(20, 2);
    w.add_tensor_bytes("a", GgmlType::F32, {17}, a);
    w.add_tensor_bytes("b", GgmlType::F32, {5}, b);
    const std::string path = dir.file("aligned.gguf");
    w.write(path);

    GgufFile f = GgufFile::open(path);
    EXPECT_EQ(f.alignment(), alignment);
    EXPECT_EQ(f.get_int("general.alignment"), alignment);
    EXPECT_EQ(f.data_offset() % alignment, 0u);
    ASSERT_EQ(f.tensors().size(), 2u);
    // The 68 bytes of `a` round up to the alignment: 68 for 1, 72 for 8, 128 for 64 (where 32 would give 96).
    EXPECT_EQ(f.tensors()[1].offset, (68 + alignment - 1) / alignment * alignment);
    EXPECT_EQ(f.file_size() % alignment, 0u);
    EXPECT_EQ(std::vector<uint8_t>(f.tensors()[0].data, f.tensors()[0].data + 68), a);
    EXPECT_EQ(std::vector<uint8_t>(f.tensors()[1].data, f.tensors()[1].data + 20), b);
  }
}

TEST(GgufWriter, RejectsBadAlignmentAndShapes) {
  GgufWriter w;
  EXPECT_THROW(w.set("general.alignment", Value::u32(0)), Error);
  EXPECT_THROW(w.set("general.alignment", Value::u32(48)), Error);
  EXPECT_THROW(w.set("general.alignment", Value::i32(64)), Error);
  EXPECT_EQ(w.alignment(), kDefaultAlignment);
  EXPECT_THROW(w.add_tensor_bytes("zero", GgmlType::F32, {0}, {}), Error);
  EXPECT_THROW(w.add_tensor_bytes("neg", GgmlType::F32, {4, -1}, {}), Error);
  EXPECT_THROW(w.add_tensor_bytes("no_dims", GgmlType::F32, {}, {}), Error);
  EXPECT_THROW(w.add_tensor_bytes("five", GgmlType::F32, {1, 1, 1, 1, 1}, {}), Error);
  EXPECT_THROW(w.add_tensor_bytes("block", GgmlType::Q4_K, {100}, {}), Error);
  EXPECT_THROW(w.add_tensor_bytes("huge", GgmlType::F32, {1 << 20, int64_t{1} << 40, int64_t{1} << 40}, {}), Error);
  w.add_tensor_bytes("ok", GgmlType::F32, {1}, {0, 0, 0, 0});
  EXPECT_THROW(w.add_tensor_bytes("ok", GgmlType::F32, {1}, {0, 0, 0, 0}), Error);
}

TEST(GgufReader, HandBuiltVersion2) {
  // Version 2 has the same 64-bit counts and lengths as version 3.
  ByteBuilder b;
  b.header(1, 2, 2);
  b.key("general.architecture", ValueType::kString).str("test");
  b.key("v2.flag", ValueType::kBool).u8(1);
  b.tensor("w", {4, 2}, GgmlType::F32, 0);
  b.pad_to(kDefaultAlignment);
  const size_t data_at = b.size();
  b.raw(le_bytes<float>({1, 2, 3, 4, 5, 6, 7, 8}));

  const std::vector<uint8_t> bytes = b.bytes();
  GgufFile f = GgufFile::parse(bytes, "v2.gguf");
  EXPECT_EQ(f.version(), 2u);
  EXPECT_EQ(f.data_offset(), data_at);
  EXPECT_EQ(f.get_string("general.architecture"), "test");
  EXPECT_EQ(f.get_bool("v2.flag"), true);
  ASSERT_EQ(f.tensors().size(), 1u);
  float last = 0;
  std::memcpy(&last, f.tensors()[0].row(1) + 12, 4);
  EXPECT_EQ(last, 8.0f);
}

TEST(GgufReader, RejectsVersion1) {
  // Version 1 had 32-bit counts.
  ByteBuilder b;
  b.u32(kMagic).u32(1).u32(0).u32(0).zeros(16);
  expect_error(b.bytes(), "GGUF version 1 is not supported", 4);
}

TEST(GgufReader, VocabOnlyFileWithoutPadding) {
  ByteBuilder b;
  b.header(0, 1);
  b.key("tokenizer.ggml.tokens", ValueType::kArray).type(ValueType::kString).u64(2).str("a").str("bc");
  ASSERT_NE(b.size() % kDefaultAlignment, 0u);
  GgufFile f = GgufFile::parse(b.bytes(), "vocab.gguf");
  EXPECT_EQ(f.data_offset(), f.file_size());
  EXPECT_EQ(f.find("tokenizer.ggml.tokens")->strings(), (std::vector<std::string>{"a", "bc"}));
}

TEST(GgufReader, TensorDataIsZeroCopy) {
  TempDir dir;
  GgufWriter w;
  const std::vector<uint8_t> data = pattern(4096, 3);
  w.add_tensor_bytes("t", GgmlType::F16, {2048}, data);
  const std::string path = dir.file("mapped.gguf");
  w.write(path);

  GgufFile f = GgufFile::open(path);
  const TensorInfo& t = f.tensors().at(0);
  EXPECT_EQ(t.data, f.bytes().data() + f.data_offset() + t.offset);
  EXPECT_EQ(std::vector<uint8_t>(t.data, t.data + t.nbytes), data);

  // The pointer lies in a mapping of the file itself, not in a heap copy.
  const auto address = reinterpret_cast<uintptr_t>(t.data);
  const std::string canonical = std::filesystem::canonical(path).string();
  std::ifstream maps("/proc/self/maps");
  bool found = false;
  for (std::string line; std::getline(maps, line);) {
    uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::istringstream in(line);
    in >> std::hex >> begin >> dash >> end;
    if (address < begin || address + t.nbytes > end) continue;
    EXPECT_TRUE(line.ends_with(canonical)) << line;
    found = true;
  }
  EXPECT_TRUE(found) << "no mapping of " << canonical << " holds the tensor data";

  // parse() uses the caller's bytes in place too.
  const std::vector<uint8_t> bytes = read_all(path);
  GgufFile g = GgufFile::parse(bytes, "buffer");
  EXPECT_EQ(g.tensors()[0].data, bytes.data() + g.data_offset() + g.tensors()[0].offset);
}

// ---------------------------------------------------------------------------------------------------------------
// Bad input

TEST(GgufBadInput, TruncatedAtEveryLength) {
  TempDir dir;
  GgufWriter w;
  w.set("general.architecture", Value::string("test"));
  w.set("a.u32", Value::u32(7));
  w.set("a.flag", Value::boolean(true));
  w.set("a.f32s", Value::f32_array({1, 2, 3}));
  w.set("a.strings", Value::string_array({"x", "", "yz"}));
  w.set("a.nested", Value::nested_array(ValueType::kArray, {Value::i32_array({4, 5})}));
  w.add_tensor_bytes("q", GgmlType::Q8_0, {32}, pattern(34, 1));
  w.add_tensor_bytes("f", GgmlType::F32, {8}, pattern(32, 2));  // 32 bytes: the file ends with its last byte
  const std::string path = dir.file("small.gguf");
  w.write(path);
  const std::vector<uint8_t> bytes = read_all(path);

  GgufFile whole = GgufFile::parse(bytes, "whole.gguf");
  const TensorInfo& last = whole.tensors().back();
  ASSERT_EQ(whole.data_offset() + last.offset + last.nbytes, bytes.size()) << "the file must end with tensor data";

  for (size_t n = 0; n < bytes.size(); ++n) {
    SCOPED_TRACE(n);
    expect_error(std::vector<uint8_t>(bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(n)), "");
  }
}

TEST(GgufBadInput, BadMagic) {
  ByteBuilder b;
  b.u32(0x4c4d4747).u32(3).u64(0).u64(0);  // "GGML"
  expect_error(b.bytes(), "not a GGUF file (bad magic 0x4c4d4747)", 0);
}

TEST(GgufBadInput, UnsupportedVersion) {
  expect_error(ByteBuilder().header(0, 0, 4).bytes(), "unsupported GGUF version 4", 4);
  expect_error(ByteBuilder().header(0, 0, 0).bytes(), "unsupported GGUF version 0", 4);
  expect_error(ByteBuilder().header(0, 0, 0x03000000).bytes(), "big-endian GGUF file (version 3)", 4);
}

TEST(GgufBadInput, HugeCounts) {
  expect_error(ByteBuilder().header(kU64Max, 0).zeros(64).bytes(), "tensor count 18446744073709551615", 8);
  expect_error(ByteBuilder().header(uint64_t{1} << 40, 0).zeros(64).bytes(), "tensor count 1099511627776", 8);
  expect_error(ByteBuilder().header(0, kU64Max).zeros(64).bytes(), "metadata count 18446744073709551615", 16);
  expect_error(ByteBuilder().header(0, 1000).zeros(64).bytes(), "metadata count 1000", 16);
}

TEST(GgufBadInput, HugeStringLengths) {
  ByteBuilder key;
  key.header(0, 1).u64(kU64Max).zeros(32);
  expect_error(key.bytes(), "metadata key length 18446744073709551615 exceeds the limit of 65535", kHeaderBytes);

  ByteBuilder value;
  value.header(0, 1).key("k", ValueType::kString);
  const size_t at = value.size();
  value.u64(kU64Max).zeros(32);
  expect_error(value.bytes(), "string value length 18446744073709551615 exceeds the limit", at);

  ByteBuilder one_past;
  one_past.header(0, 1).key("k", ValueType::kString);
  const size_t len_at = one_past.size();
  one_past.u64(5).raw({'a', 'b', 'c', 'd'});
  expect_error(one_past.bytes(), "file truncated: string value needs 5 bytes, 4 left", len_at + 8);

  ByteBuilder in_array;
  in_array.header(0, 1).key("k", ValueType::kArray).type(ValueType::kString).u64(1);
  const size_t s_at = in_array.size();
  in_array.u64(uint64_t{1} << 62).zeros(16);
  expect_error(in_array.bytes(), "array string length 4611686018427387904 exceeds the limit", s_at);

  ByteBuilder name;
  name.header(1, 0).str(std::string(300, 'n')).zeros(64);
  expect_error(name.bytes(), "tensor name length 300 exceeds the limit of 256", kHeaderBytes);
}

TEST(GgufBadInput, HugeArrayLengths) {
  ByteBuilder u8s;
  u8s.header(0, 1).key("k", ValueType::kArray);
  const size_t at = u8s.size();
  u8s.type(ValueType::kUint8).u64(kU64Max).zeros(16);
  expect_error(u8s.bytes(), "array of 18446744073709551615 u8 does not fit in the file", at);

  // count * 8 wraps to 8 and count * 4 wraps to 4: a reader multiplying without checking would accept these.
  ByteBuilder u64s;
  u64s.header(0, 1).key("k", ValueType::kArray).type(ValueType::kUint64).u64((uint64_t{1} << 61) + 1).u64(0);
  expect_error(u64s.bytes(), "array of 2305843009213693953 u64 does not fit in the file", at);
  ByteBuilder i32s;
  i32s.header(0, 1).key("k", ValueType::kArray).type(ValueType::kInt32).u64((uint64_t{1} << 62) + 1).u32(0);
  expect_error(i32s.bytes(), "array of 4611686018427387905 i32 does not fit in the file", at);

  ByteBuilder strings;
  strings.header(0, 1).key("k", ValueType::kArray).type(ValueType::kString).u64(kU64Max).zeros(16);
  expect_error(strings.bytes(), "string array of 18446744073709551615 entries does not fit", at);

  ByteBuilder nested;
  nested.header(0, 1).key("k", ValueType::kArray).type(ValueType::kArray).u64(kU64Max).zeros(16);
  expect_error(nested.bytes(), "nested array of 18446744073709551615 entries does not fit", at);
}

TEST(GgufBadInput, ArraysNestedTooDeep) {
  ByteBuilder ok;
  ok.header(0, 1).key("k", ValueType::kArray);
  ok.type(ValueType::kArray).u64(1).type(ValueType::kArray).u64(1).type(ValueType::kUint8).u64(1).u8(9);
  EXPECT_EQ(GgufFile::parse(ok.bytes(), "ok.gguf").find("k")->items()[0].items()[0].array_int(0), 9);

  ByteBuilder b;
  b.header(0, 1).key("k", ValueType::kArray);
  b.type(ValueType::kArray).u64(1).type(ValueType::kArray).u64(1).type(ValueType::kArray).u64(1);
  const size_t at = b.size();
  b.type(ValueType::kUint8).u64(1).u8(9);
  expect_error(b.bytes(), "arrays nested deeper than 3", at);
}

TEST(GgufBadInput, UnknownValueType) {
  ByteBuilder b;
  b.header(0, 1).str("k");
  const size_t at = b.size();
  b.u32(13).u32(0);
  expect_error(b.bytes(), "unknown metadata value type 13", at);

  ByteBuilder elem;
  elem.header(0, 1).key("k", ValueType::kArray);
  const size_t elem_at = elem.size();
  elem.u32(99).u64(0);
  expect_error(elem.bytes(), "unknown metadata value type 99", elem_at);
}

TEST(GgufBadInput, BoolNotZeroOrOne) {
  ByteBuilder b;
  b.header(0, 1).key("k", ValueType::kBool);
  const size_t at = b.size();
  b.u8(2);
  expect_error(b.bytes(), "bool value 2 is neither 0 nor 1", at);

  ByteBuilder arr;
  arr.header(0, 1).key("k", ValueType::kArray).type(ValueType::kBool).u64(3);
  const size_t data_at = arr.size();
  arr.u8(1).u8(0).u8(255);
  expect_error(arr.bytes(), "bool array element 2 is 255, neither 0 nor 1", data_at + 2);
}

TEST(GgufBadInput, DuplicateOrEmptyKey) {
  ByteBuilder b;
  b.header(0, 2).kv_u32("a", 1);
  const size_t at = b.size();
  b.kv_u32("a", 2);
  expect_error(b.bytes(), "duplicate metadata key 'a'", at);

  ByteBuilder empty;
  empty.header(0, 1).kv_u32("", 1);
  expect_error(empty.bytes(), "empty metadata key", kHeaderBytes);
}

TEST(GgufBadInput, HostileNamesStayOnOneLine) {
  ByteBuilder b;
  b.header(0, 2).kv_u32("a\nb\x1b[2J", 1);
  const size_t at = b.size();
  b.kv_u32("a\nb\x1b[2J", 2);
  expect_error(b.bytes(), "duplicate metadata key 'a\\x0ab\\x1b[2J'", at);

  ByteBuilder long_name;
  long_name.header(1, 0);
  TensorFields f = long_name.tensor(std::string(200, 'n'), {4}, 1000u, 0);
  long_name.pad_to(32).zeros(32);
  expect_error(long_name.bytes(),
               fmt::format("tensor '{}...' has unknown or unsupported type 1000", std::string(80, 'n')), f.type_at);
}

TEST(GgufBadInput, BadAlignment) {
  for (uint32_t alignment : {0u, 3u, 48u}) {
    SCOPED_TRACE(alignment);
    ByteBuilder b;
    b.header(0, 1).key("general.alignment", ValueType::kUint32);
    const size_t at = b.size();
    b.u32(alignment);
    expect_error(b.bytes(), fmt::format("general.alignment must be a u32 power of two, got u32 {}", alignment), at);
  }
  ByteBuilder wrong_type;
  wrong_type.header(0, 1).key("general.alignment", ValueType::kInt32);
  const size_t at = wrong_type.size();
  wrong_type.u32(64);
  expect_error(wrong_type.bytes(), "general.alignment must be a u32 power of two, got i32 64", at);
}

TEST(GgufBadInput, UnknownTensorType) {
  for (uint32_t raw : {4u, 5u, 24u, 1000u, 0xffffffffu}) {
    SCOPED_TRACE(raw);
    ByteBuilder b;
    b.header(1, 0);
    TensorFields f = b.tensor("w", {32}, raw, 0);
    b.pad_to(32).zeros(128);
    expect_error(b.bytes(), fmt::format("tensor 'w' has unknown or unsupported type {}", raw), f.type_at);
  }
}

TEST(GgufBadInput, DimensionCount) {
  for (uint32_t n_dims : {0u, 5u, 0xffffffffu}) {
    SCOPED_TRACE(n_dims);
    ByteBuilder b;
    b.header(1, 0);
    TensorFields f = b.tensor("w", {1, 1, 1, 1, 1}, static_cast<uint32_t>(GgmlType::F32), 0, n_dims);
    b.pad_to(32).zeros(32);
    expect_error(b.bytes(), fmt::format("tensor 'w' has {} dimensions (1..4 allowed)", n_dims), f.n_dims_at);
  }
}

TEST(GgufBadInput, DimensionNotPositive) {
  for (int64_t ne : {int64_t{0}, int64_t{-1}, std::numeric_limits<int64_t>::min()}) {
    SCOPED_TRACE(ne);
    ByteBuilder b;
    b.header(1, 0);
    TensorFields f = b.tensor("w", {4, ne}, GgmlType::F32, 0);
    b.pad_to(32).zeros(32);
    expect_error(b.bytes(), fmt::format("tensor 'w' dimension 1 has size {} (must be positive)", ne), f.ne_at + 8);
  }
}

TEST(GgufBadInput, ShapeProductOverflow) {
  struct Case {
    std::vector<int64_t> ne;
    GgmlType type;
  };
  const std::vector<Case> cases = {
      {{int64_t{1} << 62}, GgmlType::F32},                         // row bytes 2^64 wrap to 0
      {{int64_t{1} << 31, int64_t{1} << 31}, GgmlType::F32},       // 2^62 elements fit; bytes 2^64 wrap to 0
      {{kI64Max - kI64Max % 256, 2}, GgmlType::Q4_K},              // bytes fit u64; elements pass int64
      {{int64_t{1} << 62, 4}, GgmlType::F16},                      // elements 2^64 wrap to 0
      {{32, int64_t{1} << 40, int64_t{1} << 40}, GgmlType::Q8_0},  // rows 2^80 wrap to 0
      {{2, kI64Max, kI64Max, kI64Max}, GgmlType::F32},             // rows wrap
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::PrintToString(c.ne));
    ByteBuilder b;
    b.header(1, 0);
    TensorFields f = b.tensor("w", c.ne, c.type, 0);
    b.pad_to(32).zeros(64);
    expect_error(b.bytes(), "has an element count or byte size that overflows", f.n_dims_at);
  }
  ByteBuilder big;
  big.header(1, 0);
  TensorFields f = big.tensor("w", {1 << 20, 1 << 20}, GgmlType::F32, 0);
  big.pad_to(32).zeros(64);
  expect_error(big.bytes(),
               "tensor 'w' of shape [1048576, 1048576] (4398046511104 bytes of F32) is larger than the file",
               f.n_dims_at);
}

TEST(GgufBadInput, RowNotMultipleOfBlockSize) {
  ByteBuilder b;
  b.header(1, 0);
  TensorFields f = b.tensor("w", {100, 2}, GgmlType::Q4_K, 0);
  b.pad_to(32).zeros(512);
  expect_error(b.bytes(), "tensor 'w' row of 100 elements is not a multiple of the Q4_K block size 256", f.ne_at);
}

TEST(GgufBadInput, OffsetNotAligned) {
  ByteBuilder b;
  b.header(1, 0);
  TensorFields f = b.tensor("w", {4}, GgmlType::F32, 4);
  b.pad_to(32).zeros(64);
  expect_error(b.bytes(), "tensor 'w' data offset 4 is not aligned to 32", f.offset_at);

  ByteBuilder custom;
  custom.header(1, 1).kv_u32("general.alignment", 64);
  TensorFields g = custom.tensor("w", {4}, GgmlType::F32, 32);
  custom.pad_to(64).zeros(128);
  expect_error(custom.bytes(), "tensor 'w' data offset 32 is not aligned to 64", g.offset_at);
}

TEST(GgufBadInput, TensorDataBeyondFileEnd) {
  for (uint64_t offset : {uint64_t{1024}, uint64_t{32}, kU64Max - 31}) {
    SCOPED_TRACE(offset);
    ByteBuilder b;
    b.header(1, 0);
    TensorFields f = b.tensor("w", {8}, GgmlType::F32, offset);
    b.pad_to(32).zeros(32);
    expect_error(b.bytes(), fmt::format("tensor 'w' data [{}, +32) runs past the end of the file", offset),
                 f.offset_at);
  }
  // Partly inside: 64 bytes declared, 40 present.
  ByteBuilder partial;
  partial.header(1, 0);
  TensorFields f = partial.tensor("w", {16}, GgmlType::F32, 0);
  partial.pad_to(32).zeros(40);
  expect_error(partial.bytes(), "runs past the end of the file (data section holds 40 bytes)", f.offset_at);

  // The header claims a tensor but the file ends before the data section starts.
  ByteBuilder no_data;
  no_data.header(1, 0);
  no_data.tensor("w", {1}, GgmlType::F32, 0);
  const size_t header_end = no_data.size();
  expect_error(no_data.bytes(), "data section starts at 64 beyond the end of the file", header_end);
}

TEST(GgufBadInput, OverlappingTensors) {
  ByteBuilder b;
  b.header(2, 0);
  b.tensor("a", {16}, GgmlType::F32, 0);
  b.tensor("b", {8}, GgmlType::F32, 32);
  b.pad_to(32);
  const size_t data_at = b.size();
  b.zeros(64);
  expect_error(b.bytes(), "tensors 'a' and 'b' overlap", data_at + 32);

  ByteBuilder same;
  same.header(2, 0);
  same.tensor("a", {8}, GgmlType::F32, 32);
  same.tensor("b", {8}, GgmlType::F32, 32);
  same.pad_to(32).zeros(64);
  expect_error(same.bytes(), "overlap");
}

TEST(GgufBadInput, DuplicateTensorName) {
  ByteBuilder b;
  b.header(2, 0);
  b.tensor("w", {8}, GgmlType::F32, 0);
  TensorFields second = b.tensor("w", {8}, GgmlType::F32, 32);
  b.pad_to(32).zeros(64);
  expect_error(b.bytes(), "duplicate tensor name 'w'", second.name_at);
}

TEST(GgufBadInput, ValidFileParsesBeforeCorruption) {
  // The base of the hand-built cases is itself valid in both versions, so each failure above is the one change.
  for (uint32_t version : {2u, 3u}) {
    GgufFile f = GgufFile::parse(one_tensor_file(8, version), "good.gguf");
    EXPECT_EQ(f.tensors().size(), 1u);
  }
}

TEST(GgufBadInput, MissingOrNonRegularFile) {
  const std::string missing = "/nonexistent-hetmoe-dir/model.gguf";
  try {
    GgufFile::open(missing);
    ADD_FAILURE() << "opened a missing file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
  TempDir dir;
  const std::string folder = dir.file("");
  try {
    GgufFile::open(folder);
    ADD_FAILURE() << "opened a directory";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is a folder, not a GGUF model"), std::string::npos) << e.what();
  }
  const std::string empty = dir.file("empty.gguf");
  std::ofstream(empty).close();
  try {
    GgufFile::open(empty);
    ADD_FAILURE() << "opened an empty file";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), empty + ": file truncated: magic needs 4 bytes, 0 left (at byte offset 0)");
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Reference files from llama.cpp

std::filesystem::path shared_ref() { return HETMOE_SHARED_REF; }

TEST(GgufReference, ModelsMatchManifest) {
  const std::filesystem::path models = shared_ref() / "models";
  if (!std::filesystem::exists(models / "manifest.json"))
    HETMOE_MISSING_REFERENCE("reference models not found at " << models.string());
  std::ifstream in(models / "manifest.json");
  const nlohmann::json manifest = nlohmann::json::parse(in);
  ASSERT_FALSE(manifest.empty());
  for (const nlohmann::json& entry : manifest) {
    const std::string file = entry.at("file").get<std::string>();
    SCOPED_TRACE(file);
    GgufFile f = GgufFile::open((models / file).string());

    const nlohmann::json& tensors = entry.at("tensors");
    ASSERT_EQ(f.tensors().size(), tensors.size());
    using TypeCounts = std::map<std::string, int>;
    TypeCounts type_counts;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const TensorInfo& t = f.tensors()[i];
      const std::string type_name(quant::type_info(t.type).name);
      EXPECT_EQ(t.name, tensors[i].at("name").get<std::string>());
      EXPECT_EQ(type_name, tensors[i].at("type").get<std::string>()) << t.name;
      const auto ne = tensors[i].at("ne").get<std::vector<int64_t>>();
      ASSERT_EQ(t.n_dims, static_cast<int>(ne.size())) << t.name;
      for (size_t d = 0; d < ne.size(); ++d) EXPECT_EQ(t.ne[d], ne[d]) << t.name;
      EXPECT_EQ(t.nbytes, t.row_bytes * static_cast<size_t>(t.n_rows)) << t.name;
      EXPECT_LE(t.data + t.nbytes, f.bytes().data() + f.file_size()) << t.name;
      ++type_counts[type_name];
    }
    EXPECT_EQ(type_counts, entry.at("tensor_type_counts").get<TypeCounts>());

    const nlohmann::json& metadata = entry.at("metadata");
    EXPECT_EQ(f.metadata().size(), metadata.size());
    for (const auto& [key, expected] : metadata.items()) {
      const Value* v = f.find(key);
      ASSERT_NE(v, nullptr) << key;
      if (v->is_array()) {
        EXPECT_EQ(expected.get<std::string>(), fmt::format("<array of {}>", v->array_size())) << key;
      } else if (expected.is_boolean()) {
        EXPECT_EQ(v->as_bool(), expected.get<bool>()) << key;
      } else if (expected.is_number_integer()) {
        EXPECT_EQ(v->as_int(), expected.get<int64_t>()) << key;
      } else if (expected.is_number_float()) {
        ASSERT_TRUE(v->as_float().has_value()) << key;
        EXPECT_FLOAT_EQ(static_cast<float>(*v->as_float()), expected.get<float>()) << key;
      } else {
        ASSERT_NE(v->as_string(), nullptr) << key;
        EXPECT_EQ(*v->as_string(), expected.get<std::string>()) << key;
      }
    }
  }
}

TEST(GgufReference, VocabFilesParse) {
  const std::filesystem::path vocab = shared_ref() / "vocab";
  if (!std::filesystem::is_directory(vocab))
    HETMOE_MISSING_REFERENCE("reference vocab files not found at " << vocab.string());
  int parsed = 0;
  for (const auto& entry : std::filesystem::directory_iterator(vocab)) {
    if (entry.path().extension() != ".gguf") continue;
    SCOPED_TRACE(entry.path().string());
    GgufFile f = GgufFile::open(entry.path().string());
    EXPECT_TRUE(f.tensors().empty());
    const Value* tokens = f.find("tokenizer.ggml.tokens");
    ASSERT_NE(tokens, nullptr);
    EXPECT_EQ(tokens->elem_type(), ValueType::kString);
    EXPECT_GT(tokens->array_size(), 1000u);
    ++parsed;
  }
  EXPECT_GT(parsed, 0);
}

// A writer of `n` F32 tensors of 64 values each (256 bytes of data, 288 with the alignment), metadata first.
GgufWriter sharded_writer(int n) {
  GgufWriter w;
  w.set("general.architecture", Value::string("test"));
  w.set("test.value", Value::u32(7));
  for (int i = 0; i < n; ++i)
    w.add_tensor_bytes(fmt::format("t{}", i), GgmlType::F32, {64}, pattern(256, static_cast<uint32_t>(i)));
  return w;
}

std::string error_of(const std::string& path) {
  try {
    GgufFile::open(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(GgufShards, WrittenAndReadAsOneFileFromAnyShard) {
  TempDir dir;
  // At most 600 bytes of data a shard: two tensors each, the last one alone.
  const std::vector<std::string> paths = sharded_writer(5).write(dir.file("m.gguf"), 600);
  ASSERT_EQ(paths, (std::vector<std::string>{dir.file("m-00001-of-00003.gguf"), dir.file("m-00002-of-00003.gguf"),
                                             dir.file("m-00003-of-00003.gguf")}));
  EXPECT_FALSE(std::filesystem::exists(dir.file("m.gguf")));
  for (const std::string& given : paths) {
    const GgufFile f = GgufFile::open(given);
    EXPECT_EQ(f.path(), paths.front());
    EXPECT_EQ(f.shard_paths(), paths);
    EXPECT_EQ(f.get_int("test.value"), 7);
    EXPECT_EQ(f.get_int(kSplitCountKey), 3);
    EXPECT_EQ(f.get_int(kSplitTensorsKey), 5);
    ASSERT_EQ(f.tensors().size(), 5u);
    size_t total = 0;
    for (const std::string& p : paths) total += std::filesystem::file_size(p);
    EXPECT_EQ(f.file_size(), total);
    for (int i = 0; i < 5; ++i) {
      const TensorInfo* t = f.find_tensor(fmt::format("t{}", i));
      ASSERT_NE(t, nullptr);
      EXPECT_EQ(std::vector<uint8_t>(t->data, t->data + t->nbytes), pattern(256, static_cast<uint32_t>(i)));
    }
  }
  // Each shard is a GGUF file of its own: the later ones carry only the split keys.
  const GgufFile second = GgufFile::parse(read_all(paths[1]), "second");
  EXPECT_EQ(second.metadata().size(), 3u);
  EXPECT_EQ(second.get_int(kSplitNoKey), 1);
  EXPECT_EQ(second.tensors().size(), 2u);
  // Without a limit, or with a large one, one plain file.
  EXPECT_EQ(sharded_writer(5).write(dir.file("one.gguf"), 1 << 20), std::vector<std::string>{dir.file("one.gguf")});
  EXPECT_FALSE(GgufFile::open(dir.file("one.gguf")).find(kSplitCountKey));
}

TEST(GgufShards, BadSetsAreOneLineErrorsNamingTheShard) {
  TempDir dir;
  const std::vector<std::string> paths = sharded_writer(5).write(dir.file("m.gguf"), 600);
  const std::vector<uint8_t> middle = read_all(paths[1]);
  auto restore = [&] {
    std::ofstream(paths[1], std::ios::binary).write(reinterpret_cast<const char*>(middle.data()), middle.size());
  };
  // Missing.
  std::filesystem::remove(paths[1]);
  EXPECT_NE(error_of(paths[2]).find("shard 2 of 3 is missing (" + paths[1] + ")"), std::string::npos);
  // Truncated.
  std::ofstream(paths[1], std::ios::binary).write(reinterpret_cast<const char*>(middle.data()), middle.size() - 100);
  EXPECT_EQ(error_of(paths[0]).rfind(paths[1] + ": ", 0), 0u) << error_of(paths[0]);
  restore();
  EXPECT_EQ(error_of(paths[0]), "");
  // Another set's shard in its place (split.count 2), or one whose split.no is not its position.
  const std::vector<std::string> other = sharded_writer(4).write(dir.file("o.gguf"), 600);
  ASSERT_EQ(other.size(), 2u);
  std::filesystem::copy_file(other[1], paths[1], std::filesystem::copy_options::overwrite_existing);
  EXPECT_NE(error_of(paths[0]).find(paths[1] + ": split.count is 2, the first shard's is 3"), std::string::npos);
  std::filesystem::copy_file(paths[2], paths[1], std::filesystem::copy_options::overwrite_existing);
  EXPECT_NE(error_of(paths[0]).find(paths[1] + ": split.no is 2, expected 1"), std::string::npos);
  restore();
  // A shard renamed out of its set's pattern.
  std::filesystem::copy_file(paths[2], dir.file("renamed.gguf"));
  EXPECT_NE(error_of(dir.file("renamed.gguf")).find("not named <prefix>-00003-of-00003.gguf"), std::string::npos);
  // A tensor in two shards, and a tensor count that does not add up (shards built by hand: the writer decides the
  // split keys itself).
  auto shard = [&](const std::string& name, uint16_t no, int32_t total, std::string_view tensor) {
    ByteBuilder b;
    b.header(1, 3);
    b.key(kSplitNoKey, ValueType::kUint16).pod<uint16_t>(no);
    b.key(kSplitTensorsKey, ValueType::kInt32).pod<int32_t>(total);
    b.key(kSplitCountKey, ValueType::kUint16).pod<uint16_t>(2);
    b.tensor(tensor, {64}, GgmlType::F32, 0);
    b.pad_to(kDefaultAlignment);
    b.raw(pattern(256, no));
    std::ofstream(dir.file(name), std::ios::binary)
        .write(reinterpret_cast<const char*>(b.bytes().data()), static_cast<std::streamsize>(b.size()));
  };
  shard("d-00001-of-00002.gguf", 0, 2, "same");
  shard("d-00002-of-00002.gguf", 1, 2, "same");
  EXPECT_NE(error_of(dir.file("d-00001-of-00002.gguf")).find("tensor 'same' is in two shards"), std::string::npos);
  shard("d-00002-of-00002.gguf", 1, 2, "other");
  EXPECT_EQ(error_of(dir.file("d-00001-of-00002.gguf")), "");
  shard("c-00001-of-00002.gguf", 0, 3, "a");
  shard("c-00002-of-00002.gguf", 1, 3, "b");
  EXPECT_NE(error_of(dir.file("c-00002-of-00002.gguf")).find("split.tensors.count says 3 tensors, the 2 shards hold 2"),
            std::string::npos);
  // Every message is one line.
  EXPECT_EQ(error_of(dir.file("c-00002-of-00002.gguf")).find('\n'), std::string::npos);
}

// A file of `bytes` at `path`, mapped.
MappedFile written_and_mapped(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  return MappedFile::open(path);
}

// The mapping starts on a 2 MB boundary (so 2 MB folios of the page cache can map whole), and settling it into huge
// pages (where the kernel has them: the advice, a look, maybe the cache dropped and read again) leaves every byte as
// the file has it.
TEST(MappedFile, AlignedAndUnchangedBySettlingIntoHugePages) {
  TempDir dir;
  const std::vector<uint8_t> bytes = pattern(size_t{9} << 20, 7);  // 4.5 chunks of 2 MB
  MappedFile file = written_and_mapped(dir.file("big.bin"), bytes);
  ASSERT_EQ(file.bytes().size(), bytes.size());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(file.bytes().data()) % (size_t{2} << 20), 0u);
  // Below its size limit nothing is done.
  EXPECT_FALSE(file.settle_huge_pages(size_t{16} << 20).available);
  const HugePages h = file.settle_huge_pages(0);
  if (h.available) {
    EXPECT_EQ(h.sampled_bytes, size_t{8} << 20);  // the 4 whole chunks
    EXPECT_LE(h.huge_after, bytes.size());
    if (!h.dropped) {
      EXPECT_EQ(h.huge_after, h.huge_before);
    }
  }
  EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), file.bytes().begin()));
  EXPECT_LE(file.huge_mapped_bytes(), bytes.size());
}

// Settling looks at every 2 MB chunk the page cache holds, not at a sample: a file just written is cached whole, so
// all of its 40 chunks are touched (a sample of 32 fixed chunks missed a cache two thirds of which still held the
// file's writes in small pages).
TEST(MappedFile, SettlingLooksAtEveryCachedChunk) {
  TempDir dir;
  const std::vector<uint8_t> bytes = pattern(size_t{80} << 20, 11);  // 40 chunks of 2 MB
  MappedFile file = written_and_mapped(dir.file("cached.bin"), bytes);
  const HugePages h = file.settle_huge_pages(0);
  if (h.available) {
    EXPECT_EQ(h.sampled_bytes, bytes.size());
    EXPECT_LE(h.huge_before, h.sampled_bytes);
    if (h.dropped) {
      EXPECT_GE(h.sampled_after, size_t{64} << 20);  // at least the 32 spread chunks, read again
    } else {
      EXPECT_EQ(h.sampled_after, h.sampled_bytes);
    }
  }
  EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), file.bytes().begin()));
}

}  // namespace
}  // namespace hetmoe::gguf
