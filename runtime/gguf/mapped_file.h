#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace hetmoe::gguf {

// What MappedFile::settle_huge_pages found and did.
struct HugePages {
  bool available = false;    // transparent huge pages are on (always or madvise) and the file is large enough
  size_t sampled_bytes = 0;  // bytes of the 2 MB chunks touched to look
  size_t huge_before = 0;    // of the mapping, bytes mapped with 2 MB pages after the first look
  size_t huge_after = 0;     // ... after the page cache was dropped and the chunks touched again (= before if not)
  size_t sampled_after = 0;  // bytes of the chunks touched after the drop (= sampled_bytes if not dropped)
  bool dropped = false;      // the file's pages were dropped from the page cache to be read again as 2 MB pages
};

// A read-only private mapping of a whole file. The weights of a model are used in place from this mapping:
// nothing is copied, so their pages are file-backed and shared with the page cache. The mapping starts on a 2 MB
// boundary, so that the page cache's 2 MB folios of the file (file offsets on 2 MB boundaries) can map with one
// page-table entry each.
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

  // Bytes of this mapping mapped with 2 MB pages now (the kernel's FilePmdMapped; 0 where it does not say).
  size_t huge_mapped_bytes() const;
  // Makes the file's pages map as 2 MB pages where the kernel can, for files of at least `min_bytes`: advises
  // MADV_HUGEPAGE (faults then read the file in 2 MB folios), touches every 2 MB chunk the page cache holds (and a
  // few spread ones) and, when more than one in 16 of them maps in smaller pages because the page cache holds the
  // file so (it was written, copied or read without the advice), unmaps them and drops the file's clean pages from the
  // cache, so that the next faults read it again from disk, once, in 2 MB pages. A weight streamed through 2 MB pages
  // costs one TLB miss per 2 MB instead of one per 4 kB (docs/measurements.md: the bench model's decode 1.3-1.6x faster
  // in this VM).
  HugePages settle_huge_pages(size_t min_bytes);

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace hetmoe::gguf
