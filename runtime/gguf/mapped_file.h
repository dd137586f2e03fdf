#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace hetmoe::gguf {

// A read-only private mapping of a whole file. The weights of a model are used in place from this mapping:
// nothing is copied, so their pages are file-backed and shared with the page cache.
class MappedFile {
 public:
  static MappedFile open(const std::string& path);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace hetmoe::gguf
