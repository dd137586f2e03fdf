#include "runtime/gguf/reader.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>

#include "runtime/error.h"

namespace hetmoe::gguf {

namespace {

// Nested arrays are legal GGUF; no real file nests more than once, and a bound keeps a hostile file from
// recursing the stack away.
constexpr int kMaxArrayDepth = 3;
// Each nested entry costs about 150 bytes of memory for 12 bytes of file; this caps what a hostile file of
// nested empty arrays can make the parser allocate (about 150 MB), far above anything a real file holds.
constexpr uint64_t kMaxNestedEntries = uint64_t{1} << 20;
// Longer names are not ggml tensors (GGML_MAX_NAME is 64); keys get the spec's limit of 2^16 - 1 bytes.
constexpr uint64_t kMaxTensorNameLen = 256;
constexpr uint64_t kMaxKeyLen = 65535;
constexpr uint64_t kInt64Max = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }

// Names from the file go into one-line error messages: bytes other than printable ASCII are escaped and long
// names are cut, so a hostile name can neither break the line nor flood the terminal.
std::string printable(std::string_view s) {
  constexpr size_t kMaxShown = 80;
  std::string out;
  for (size_t i = 0; i < s.size() && i < kMaxShown; ++i) {
    auto ch = static_cast<unsigned char>(s[i]);
    if (ch >= 0x20 && ch < 0x7f)
      out += static_cast<char>(ch);
    else
      out += fmt::format("\\x{:02x}", ch);
  }
  if (s.size() > kMaxShown) out += "...";
  return out;
}

// Bounds-checked cursor over the untrusted bytes. Every read names the offset where it failed.
class Cursor {
 public:
  Cursor(std::span<const uint8_t> bytes, const std::string& name) : bytes_(bytes), name_(name) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return bytes_.size() - pos_; }
  // Counts entries of nested arrays across the whole file; fails past kMaxNestedEntries.
  void count_nested(uint64_t n, uint64_t at) {
    nested_ += n;
    if (nested_ > kMaxNestedEntries) error_at(at, "nested arrays hold more than {} entries in all", kMaxNestedEntries);
  }

  template <typename... Args>
  [[noreturn]] void error_at(uint64_t at, fmt::format_string<Args...> format, Args&&... args) const {
    fail("{}: {} (at byte offset {})", name_, fmt::format(format, std::forward<Args>(args)...), at);
  }

  void need(uint64_t n, const char* what) const {
    if (n > remaining()) error_at(pos_, "file truncated: {} needs {} bytes, {} left", what, n, remaining());
  }

  template <typename T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof v);
    pos_ += sizeof v;
    return v;
  }

  std::string read_string(const char* what, uint64_t max_len) {
    uint64_t at = pos_;
    uint64_t len = read<uint64_t>(what);
    if (len > max_len) error_at(at, "{} length {} exceeds the limit of {}", what, len, max_len);
    need(len, what);
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), len);
    pos_ += len;
    return s;
  }

  std::vector<uint8_t> read_bytes(uint64_t n, const char* what) {
    need(n, what);
    std::vector<uint8_t> out(bytes_.data() + pos_, bytes_.data() + pos_ + n);
    pos_ += n;
    return out;
  }

 private:
  std::span<const uint8_t> bytes_;
  const std::string& name_;
  uint64_t pos_ = 0;
  uint64_t nested_ = 0;
};

ValueType read_value_type(Cursor& c, const char* what) {
  uint64_t at = c.pos();
  uint32_t raw = c.read<uint32_t>(what);
  if (!is_valid_value_type(raw)) c.error_at(at, "unknown metadata value type {}", raw);
  return static_cast<ValueType>(raw);
}

Value read_value(Cursor& c, ValueType type, int depth);

Value read_array(Cursor& c, int depth) {
  uint64_t at = c.pos();
  if (depth >= kMaxArrayDepth) c.error_at(at, "arrays nested deeper than {}", kMaxArrayDepth);
  ValueType elem = read_value_type(c, "array element type");
  uint64_t count = c.read<uint64_t>("array length");
  if (elem == ValueType::kString) {
    // Each string needs at least its 8-byte length, so a count beyond remaining/8 cannot be real.
    if (count > c.remaining() / 8) c.error_at(at, "string array of {} entries does not fit in the file", count);
    std::vector<std::string> items;
    for (uint64_t i = 0; i < count; ++i) items.push_back(c.read_string("array string", c.remaining()));
    return Value::string_array(std::move(items));
  }
  if (elem == ValueType::kArray) {
    if (count > c.remaining() / 12) c.error_at(at, "nested array of {} entries does not fit in the file", count);
    c.count_nested(count, at);
    std::vector<Value> items;
    for (uint64_t i = 0; i < count; ++i) items.push_back(read_array(c, depth + 1));
    return Value::nested_array(elem, std::move(items));
  }
  uint64_t bytes = 0;
  if (mul_overflows(count, value_type_size(elem), &bytes) || bytes > c.remaining())
    c.error_at(at, "array of {} {} does not fit in the file", count, value_type_name(elem));
  uint64_t data_at = c.pos();
  std::vector<uint8_t> raw = c.read_bytes(bytes, "array data");
  // The spec makes any bool byte other than 0 and 1 invalid, in arrays as in scalars.
  if (elem == ValueType::kBool)
    for (uint64_t i = 0; i < raw.size(); ++i)
      if (raw[i] > 1) c.error_at(data_at + i, "bool array element {} is {}, neither 0 nor 1", i, raw[i]);
  return Value::numeric_array(elem, std::move(raw));
}

Value read_value(Cursor& c, ValueType type, int depth) {
  switch (type) {
    case ValueType::kUint8:
      return Value::u8(c.read<uint8_t>("u8 value"));
    case ValueType::kInt8:
      return Value::i8(c.read<int8_t>("i8 value"));
    case ValueType::kUint16:
      return Value::u16(c.read<uint16_t>("u16 value"));
    case ValueType::kInt16:
      return Value::i16(c.read<int16_t>("i16 value"));
    case ValueType::kUint32:
      return Value::u32(c.read<uint32_t>("u32 value"));
    case ValueType::kInt32:
      return Value::i32(c.read<int32_t>("i32 value"));
    case ValueType::kFloat32:
      return Value::f32(c.read<float>("f32 value"));
    case ValueType::kUint64:
      return Value::u64(c.read<uint64_t>("u64 value"));
    case ValueType::kInt64:
      return Value::i64(c.read<int64_t>("i64 value"));
    case ValueType::kFloat64:
      return Value::f64(c.read<double>("f64 value"));
    case ValueType::kBool: {
      uint64_t at = c.pos();
      uint8_t b = c.read<uint8_t>("bool value");
      if (b > 1) c.error_at(at, "bool value {} is neither 0 nor 1", b);
      return Value::boolean(b != 0);
    }
    case ValueType::kString:
      return Value::string(c.read_string("string value", c.remaining()));
    case ValueType::kArray:
      return read_array(c, depth);
  }
  c.error_at(c.pos(), "unknown metadata value type");
}

}  // namespace

std::string TensorInfo::shape_string() const {
  std::string s = "[";
  for (int d = 0; d < n_dims; ++d) s += fmt::format("{}{}", d ? ", " : "", ne[d]);
  return s + "]";
}

std::string shard_path(const std::string& prefix, int no, int count) {
  return fmt::format("{}-{:05d}-of-{:05d}.gguf", prefix, no, count);
}

GgufFile GgufFile::open_one(const std::string& path) {
  GgufFile f;
  f.mapping_ = MappedFile::open(path);
  f.bytes_ = f.mapping_.bytes();
  f.name_ = path;
  f.parse_all();
  return f;
}

GgufFile GgufFile::open(const std::string& path) {
  GgufFile f = open_one(path);
  const std::optional<int64_t> count = f.get_int(kSplitCountKey);
  if (!count || *count == 1) return f;
  const std::optional<int64_t> no = f.get_int(kSplitNoKey);
  if (*count < 1 || *count > 99999 || !no || *no < 0 || *no >= *count)
    fail("{}: {} is {} and {} is {}: not a shard of a split set", path, kSplitCountKey, *count, kSplitNoKey,
         no ? std::to_string(*no) : "missing");
  // The set's first shard, named after this one.
  const std::string suffix = fmt::format("-{:05d}-of-{:05d}.gguf", *no + 1, *count);
  if (path.size() <= suffix.size() || path.compare(path.size() - suffix.size(), suffix.size(), suffix) != 0)
    fail("{}: shard {} of {}, but not named <prefix>{}", path, *no + 1, *count, suffix);
  const std::string prefix = path.substr(0, path.size() - suffix.size());
  GgufFile first = *no == 0 ? std::move(f) : open_one(shard_path(prefix, 1, static_cast<int>(*count)));
  first.join_shards();
  return first;
}

void GgufFile::join_shards() {
  const int count = static_cast<int>(require_int(kSplitCountKey));
  const std::string suffix = fmt::format("-{:05d}-of-{:05d}.gguf", 1, count);
  if (name_.size() <= suffix.size() || name_.compare(name_.size() - suffix.size(), suffix.size(), suffix) != 0)
    fail("{}: the first shard of {}, but not named <prefix>{}", name_, count, suffix);
  const std::string prefix = name_.substr(0, name_.size() - suffix.size());
  const int64_t total = require_int(kSplitTensorsKey);
  auto check = [&](const GgufFile& shard, int index) {
    const int64_t c = shard.require_int(kSplitCountKey), n = shard.require_int(kSplitNoKey);
    const int64_t t = shard.require_int(kSplitTensorsKey);
    if (c != count) fail("{}: {} is {}, the first shard's is {}", shard.name_, kSplitCountKey, c, count);
    if (n != index) fail("{}: {} is {}, expected {} for its name", shard.name_, kSplitNoKey, n, index);
    if (t != total) fail("{}: {} is {}, the first shard's is {}", shard.name_, kSplitTensorsKey, t, total);
  };
  check(*this, 0);
  for (int i = 1; i < count; ++i) {
    const std::string path = shard_path(prefix, i + 1, count);
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) fail("{}: shard {} of {} is missing ({})", name_, i + 1, count, path);
    GgufFile shard = open_one(path);
    check(shard, i);
    for (TensorInfo& t : shard.tensors_) {
      if (const TensorInfo* other = find_tensor(t.name))
        fail("{}: tensor '{}' is in two shards (also in the shard of tensor '{}')", path, printable(t.name),
             printable(other->name));
      tensor_index_.emplace(t.name, tensors_.size());
      tensors_.push_back(t);
    }
    shard.tensors_.clear();
    shard.tensor_index_.clear();
    shards_.push_back(std::move(shard));
  }
  if (static_cast<int64_t>(tensors_.size()) != total)
    fail("{}: {} says {} tensors, the {} shards hold {}", name_, kSplitTensorsKey, total, count, tensors_.size());
}

size_t GgufFile::file_size() const {
  size_t total = bytes_.size();
  for (const GgufFile& s : shards_) total += s.file_size();
  return total;
}

HugePages GgufFile::settle_huge_pages(size_t min_bytes) {
  HugePages total = mapping_.settle_huge_pages(min_bytes);
  for (GgufFile& s : shards_) {
    const HugePages h = s.settle_huge_pages(min_bytes);
    total.available = total.available || h.available;
    total.sampled_bytes += h.sampled_bytes;
    total.huge_before += h.huge_before;
    total.huge_after += h.huge_after;
    total.sampled_after += h.sampled_after;
    total.dropped = total.dropped || h.dropped;
  }
  return total;
}

std::vector<std::string> GgufFile::shard_paths() const {
  std::vector<std::string> paths{name_};
  for (const GgufFile& s : shards_) paths.push_back(s.name_);
  return paths;
}

GgufFile GgufFile::parse(std::span<const uint8_t> bytes, const std::string& name) {
  GgufFile f;
  f.bytes_ = bytes;
  f.name_ = name;
  f.parse_all();
  return f;
}

void GgufFile::parse_all() {
  Cursor c(bytes_, name_);
  uint32_t magic = c.read<uint32_t>("magic");
  if (magic != kMagic) c.error_at(0, "not a GGUF file (bad magic 0x{:08x})", magic);
  version_ = c.read<uint32_t>("version");
  // Version 1 had 32-bit counts and lengths; this reader only knows the 64-bit layout of versions 2 and 3.
  if (version_ == 1) c.error_at(4, "GGUF version 1 is not supported (only 2 and 3)");
  if (version_ == __builtin_bswap32(2u) || version_ == __builtin_bswap32(3u))
    c.error_at(4, "big-endian GGUF file (version {}) is not supported", __builtin_bswap32(version_));
  if (version_ != 2 && version_ != 3) c.error_at(4, "unsupported GGUF version {}", version_);

  uint64_t at = c.pos();
  uint64_t n_tensors = c.read<uint64_t>("tensor count");
  uint64_t n_kv = c.read<uint64_t>("metadata count");
  // A key-value pair takes at least 8 (key length) + 4 (type) + 1 bytes, a tensor entry 8 + 4 + 8 + 4 + 8.
  if (n_kv > c.remaining() / 13) c.error_at(at + 8, "metadata count {} cannot fit in the file", n_kv);
  if (n_tensors > c.remaining() / 32) c.error_at(at, "tensor count {} cannot fit in the file", n_tensors);

  // No reserve() from the untrusted counts: a count that passes the size bound can still ask for far more memory
  // than its entries take in the file. The vectors grow only as entries actually parse.
  uint64_t alignment_at = 0;
  for (uint64_t i = 0; i < n_kv; ++i) {
    uint64_t key_at = c.pos();
    std::string key = c.read_string("metadata key", kMaxKeyLen);
    if (key.empty()) c.error_at(key_at, "empty metadata key");
    ValueType type = read_value_type(c, "metadata value type");
    uint64_t value_at = c.pos();
    Value value = read_value(c, type, 0);
    if (!kv_index_.emplace(key, kv_.size()).second) c.error_at(key_at, "duplicate metadata key '{}'", printable(key));
    if (key == "general.alignment") alignment_at = value_at;
    kv_.emplace_back(std::move(key), std::move(value));
  }

  if (const Value* a = find("general.alignment")) {
    auto v = a->as_int();
    if (a->type() != ValueType::kUint32 || !v || *v == 0 || (*v & (*v - 1)) != 0)
      c.error_at(alignment_at, "general.alignment must be a u32 power of two, got {} {}", value_type_name(a->type()),
                 a->to_display());
    alignment_ = static_cast<uint32_t>(*v);
  }

  // Where each tensor's offset field lies, for errors found once the data section is known.
  std::vector<uint64_t> offset_field_at;
  for (uint64_t i = 0; i < n_tensors; ++i) {
    uint64_t t_at = c.pos();
    TensorInfo t;
    t.name = c.read_string("tensor name", kMaxTensorNameLen);
    uint64_t dims_at = c.pos();
    uint32_t n_dims = c.read<uint32_t>("tensor dimension count");
    if (n_dims == 0 || n_dims > kMaxDims)
      c.error_at(dims_at, "tensor '{}' has {} dimensions (1..{} allowed)", printable(t.name), n_dims, kMaxDims);
    t.n_dims = static_cast<int>(n_dims);
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t ne_at = c.pos();
      int64_t ne = c.read<int64_t>("tensor dimension");
      if (ne <= 0)
        c.error_at(ne_at, "tensor '{}' dimension {} has size {} (must be positive)", printable(t.name), d, ne);
      t.ne[d] = ne;
    }
    uint64_t type_at = c.pos();
    uint32_t raw_type = c.read<uint32_t>("tensor type");
    const quant::TypeInfo* info = quant::type_info(raw_type);
    if (!info) c.error_at(type_at, "tensor '{}' has unknown or unsupported type {}", printable(t.name), raw_type);
    t.type = info->type;
    uint64_t offset_at = c.pos();
    t.offset = c.read<uint64_t>("tensor data offset");

    if (t.ne[0] % info->block_size != 0)
      c.error_at(dims_at + 4, "tensor '{}' row of {} elements is not a multiple of the {} block size {}",
                 printable(t.name), t.ne[0], info->name, info->block_size);
    // Every product is checked: a wrapped element count or byte size would let a huge shape pass as a small
    // one and send kernels far past the mapping (the ne-product class of llama.cpp's GGUF CVEs). The element
    // count must fit int64 for n_elements(); the bytes must fit the file.
    uint64_t rows = 1, elements = 0, row_bytes = 0, bytes = 0;
    bool overflow = false;
    for (int d = 1; d < kMaxDims; ++d) overflow |= mul_overflows(rows, static_cast<uint64_t>(t.ne[d]), &rows);
    overflow |= mul_overflows(static_cast<uint64_t>(t.ne[0]), rows, &elements) || elements > kInt64Max;
    overflow |= mul_overflows(static_cast<uint64_t>(t.ne[0] / info->block_size), info->type_size, &row_bytes);
    overflow |= mul_overflows(row_bytes, rows, &bytes);
    if (overflow)
      c.error_at(dims_at, "tensor '{}' of shape {} has an element count or byte size that overflows", printable(t.name),
                 t.shape_string());
    if (bytes > bytes_.size())
      c.error_at(dims_at, "tensor '{}' of shape {} ({} bytes of {}) is larger than the file", printable(t.name),
                 t.shape_string(), bytes, info->name);
    t.row_bytes = row_bytes;
    t.n_rows = static_cast<int64_t>(rows);
    t.nbytes = bytes;
    if (t.offset % alignment_ != 0)
      c.error_at(offset_at, "tensor '{}' data offset {} is not aligned to {}", printable(t.name), t.offset, alignment_);
    if (!tensor_index_.emplace(t.name, tensors_.size()).second)
      c.error_at(t_at, "duplicate tensor name '{}'", printable(t.name));
    tensors_.push_back(std::move(t));
    offset_field_at.push_back(offset_at);
  }

  // The data section starts at the next multiple of the alignment after the header. A file without tensors
  // (a vocab-only file) may end right after its header, unpadded; its empty data section is put at the end of
  // the file so that file_size() - data_offset() cannot wrap.
  uint64_t header_end = c.pos();
  data_offset_ = header_end + (alignment_ - header_end % alignment_) % alignment_;
  if (data_offset_ > bytes_.size()) {
    if (!tensors_.empty())
      c.error_at(header_end, "data section starts at {} beyond the end of the file ({} bytes)", data_offset_,
                 bytes_.size());
    data_offset_ = bytes_.size();
  }

  uint64_t data_size = bytes_.size() - data_offset_;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    TensorInfo& t = tensors_[i];
    if (t.offset > data_size || t.nbytes > data_size - t.offset)
      c.error_at(offset_field_at[i],
                 "tensor '{}' data [{}, +{}) runs past the end of the file (data section holds {} bytes)",
                 printable(t.name), t.offset, t.nbytes, data_size);
    t.data = bytes_.data() + data_offset_ + t.offset;
  }

  // Overlapping tensors would let a write to one (a future in-place tool) corrupt another; no writer makes them.
  std::vector<const TensorInfo*> by_offset;
  for (const TensorInfo& t : tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i)
    if (by_offset[i - 1]->offset + by_offset[i - 1]->nbytes > by_offset[i]->offset)
      c.error_at(data_offset_ + by_offset[i]->offset, "tensors '{}' and '{}' overlap",
                 printable(by_offset[i - 1]->name), printable(by_offset[i]->name));
}

const Value* GgufFile::find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const TensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

std::optional<int64_t> GgufFile::get_int(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  auto i = v->as_int();
  if (!i)
    fail("{}: metadata key {} should be an integer, got {} {}", name_, key, value_type_name(v->type()),
         v->to_display());
  return i;
}

std::optional<double> GgufFile::get_float(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  auto f = v->as_float();
  if (!f)
    fail("{}: metadata key {} should be a number, got {} {}", name_, key, value_type_name(v->type()), v->to_display());
  return f;
}

std::optional<bool> GgufFile::get_bool(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  auto b = v->as_bool();
  if (!b)
    fail("{}: metadata key {} should be a bool, got {} {}", name_, key, value_type_name(v->type()), v->to_display());
  return b;
}

std::optional<std::string> GgufFile::get_string(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  const std::string* s = v->as_string();
  if (!s) fail("{}: metadata key {} should be a string, got {}", name_, key, value_type_name(v->type()));
  return *s;
}

int64_t GgufFile::require_int(std::string_view key) const {
  auto v = get_int(key);
  if (!v) fail("{}: required metadata key {} is missing", name_, key);
  return *v;
}

double GgufFile::require_float(std::string_view key) const {
  auto v = get_float(key);
  if (!v) fail("{}: required metadata key {} is missing", name_, key);
  return *v;
}

std::string GgufFile::require_string(std::string_view key) const {
  auto v = get_string(key);
  if (!v) fail("{}: required metadata key {} is missing", name_, key);
  return *v;
}

}  // namespace hetmoe::gguf
