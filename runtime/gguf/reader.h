#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "quant/ggml_type.h"
#include "runtime/gguf/mapped_file.h"
#include "runtime/gguf/value.h"

namespace hetmoe::gguf {

inline constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
inline constexpr uint32_t kDefaultAlignment = 32;
inline constexpr int kMaxDims = 4;

// One tensor of the file. `data` points into the mapping: the weights are used where they lie.
struct TensorInfo {
  std::string name;
  quant::GgmlType type = quant::GgmlType::F32;
  int n_dims = 0;
  std::array<int64_t, kMaxDims> ne{1, 1, 1, 1};  // ggml order: ne[0] is the contiguous row length
  uint64_t offset = 0;                           // from the start of the data section
  size_t row_bytes = 0;                          // bytes of one row of ne[0] elements
  int64_t n_rows = 0;                            // ne[1] * ne[2] * ne[3]
  size_t nbytes = 0;
  const uint8_t* data = nullptr;

  int64_t n_elements() const { return ne[0] * n_rows; }
  const uint8_t* row(int64_t r) const { return data + static_cast<size_t>(r) * row_bytes; }
  std::string shape_string() const;
};

// The metadata keys of a sharded file (llama.cpp's gguf-split; hetmoe's writer): every shard carries them, the first
// shard also carries the model's metadata.
inline constexpr std::string_view kSplitCountKey = "split.count";            // shards in the set (u16)
inline constexpr std::string_view kSplitNoKey = "split.no";                  // this shard's index, from 0 (u16)
inline constexpr std::string_view kSplitTensorsKey = "split.tensors.count";  // tensors over all shards (i32)

// "<prefix>-NNNNN-of-MMMMM.gguf": the name of shard `no` (from 1) of `count`.
std::string shard_path(const std::string& prefix, int no, int count);

// A parsed GGUF v2/v3 file. The file is untrusted: parsing checks every count, length, offset, shape product
// and byte size against the file's size before using it, and reports the first problem as an Error naming the
// file, the problem and its byte offset. Metadata is copied out (small); tensor data stays in the mapping.
class GgufFile {
 public:
  // A shard of a split set (split.count > 1, named <prefix>-NNNNN-of-MMMMM.gguf; any shard may be given) opens the
  // whole set as one file: the first shard's metadata and path, the tensors of every shard in order, each in place
  // in its own shard's mapping. A missing, truncated, mismatched or extra shard, a tensor in two shards or a tensor
  // count that does not add up is an Error naming the shard.
  static GgufFile open(const std::string& path);
  // Parses bytes owned by the caller (they must outlive the result); used by the fuzzer and tests.
  static GgufFile parse(std::span<const uint8_t> bytes, const std::string& name);

  const std::string& path() const { return name_; }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  // Bytes of the file, or of every shard together.
  size_t file_size() const;
  // The whole file (of a sharded set: the first shard): the mapping for open(), the caller's bytes for parse().
  std::span<const uint8_t> bytes() const { return bytes_; }
  // The files the model was read from: its own path, or every shard's in order.
  std::vector<std::string> shard_paths() const;

  // MappedFile::settle_huge_pages for the file, or for every shard (the sums).
  HugePages settle_huge_pages(size_t min_bytes);

  // Metadata in file order.
  const std::vector<std::pair<std::string, Value>>& metadata() const { return kv_; }
  const Value* find(std::string_view key) const;
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;

  // Typed look-ups. The get_ forms return nullopt when the key is absent and fail when it has the wrong type;
  // the require_ forms also fail when it is absent.
  std::optional<int64_t> get_int(std::string_view key) const;
  std::optional<double> get_float(std::string_view key) const;
  std::optional<bool> get_bool(std::string_view key) const;
  std::optional<std::string> get_string(std::string_view key) const;
  int64_t require_int(std::string_view key) const;
  double require_float(std::string_view key) const;
  std::string require_string(std::string_view key) const;

 private:
  GgufFile() = default;
  void parse_all();
  static GgufFile open_one(const std::string& path);
  // Opens the rest of the set this shard belongs to and takes their tensors in.
  void join_shards();

  MappedFile mapping_;
  std::span<const uint8_t> bytes_;
  std::string name_;
  uint32_t version_ = 0;
  uint32_t alignment_ = kDefaultAlignment;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, Value>> kv_;
  std::map<std::string, size_t, std::less<>> kv_index_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
  std::vector<GgufFile> shards_;  // of a split set: the shards after the first, kept mapped (tensors point into them)
};

}  // namespace hetmoe::gguf
