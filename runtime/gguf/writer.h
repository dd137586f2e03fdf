#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "quant/ggml_type.h"
#include "runtime/gguf/value.h"

namespace hetmoe::io {
class OutputFile;
}

namespace hetmoe::gguf {

// Writes a GGUF v3 file. Metadata and tensor descriptions are collected first; the data is then streamed one
// tensor at a time through a fill callback, so writing a model never holds more than one tensor in memory.
// The file (or each shard) is written under a temporary name and renamed at the end: a failed write or a signal
// leaves no partial file and the old one as it was.
class GgufWriter {
 public:
  // Fills `out` (exactly the tensor's byte size) with the tensor's data in its GGUF type: every byte of it (the
  // writer hands over a reused buffer, not cleared).
  using FillFn = std::function<void(std::span<uint8_t> out)>;

  // Setting `general.alignment` (a u32 power of two) also sets the alignment of the tensor data: the data
  // section and every tensor offset are padded to it, as readers expect. Without it the alignment is 32.
  void set(std::string key, Value value);
  void add_tensor(std::string name, quant::GgmlType type, std::vector<int64_t> ne, FillFn fill);
  // Convenience: a tensor whose bytes are already in memory (copied when written).
  void add_tensor_bytes(std::string name, quant::GgmlType type, std::vector<int64_t> ne, std::vector<uint8_t> bytes);

  // Writes the file, or with max_shard_bytes > 0 and more data than that, a set of shards named
  // <path without .gguf>-NNNNN-of-MMMMM.gguf (llama.cpp's gguf-split layout: the first shard holds the metadata, every
  // shard the split keys, tensors in order, each shard at most max_shard_bytes of data unless one tensor is larger).
  // Returns the paths written. Nothing is renamed into place until every file is written. Fills run in tensor order,
  // each while the tensor before it is being written (two tensors' bytes in memory at once).
  std::vector<std::string> write(const std::string& path, uint64_t max_shard_bytes = 0) const;
  uint32_t alignment() const { return alignment_; }

 private:
  struct PendingTensor {
    std::string name;
    quant::GgmlType type;
    std::vector<int64_t> ne;
    size_t nbytes;
    FillFn fill;
  };

  // One file of tensors [first, end) with metadata kv.
  void write_file(io::OutputFile& file, const std::vector<std::pair<std::string, Value>>& kv, size_t first,
                  size_t end) const;

  std::vector<std::pair<std::string, Value>> kv_;
  std::vector<PendingTensor> tensors_;
  uint32_t alignment_ = 32;
};

}  // namespace hetmoe::gguf
