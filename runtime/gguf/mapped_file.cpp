#include "runtime/gguf/mapped_file.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <utility>
#include <vector>

#include "runtime/error.h"
#include "runtime/io/input_file.h"

namespace hetmoe::gguf {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

// Transparent huge pages for mappings that ask for them: "always" or "madvise" selected, not "never".
bool huge_pages_enabled() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  return std::getline(in, line) && line.find("[never]") == std::string::npos;
}

uintptr_t page_size() {
  static const uintptr_t size = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  return size;
}

// One read of the first byte of each whole 2 MB chunk that the page cache holds already (its first page; mincore
// tells without reading), and of up to 32 chunks spread over the mapping: faults them in, so that FilePmdMapped
// then says how much of what is cached maps in 2 MB pages. Every cached chunk, not a sample of them: a cache
// filled partly through this mapping (2 MB folios) and partly by the writes that made the file (small folios)
// looked fine to a fixed sample that earlier loads had read again themselves, while two thirds of the file mapped in
// 4 kB pages. Chunks not cached are not read (a 400 GB file is not read at load), besides the spread ones. Returns
// the bytes of the chunks touched.
size_t touch_cached_chunks(const uint8_t* data, size_t size) {
  const size_t chunks = size / kHugePage, spread = std::min<size_t>(32, chunks);
  const size_t pages_per_chunk = kHugePage / page_size();
  constexpr size_t kBatch = 512;  // chunks per mincore call: 1 GB, a vector of 256 kB with 4 kB pages
  std::vector<unsigned char> resident(kBatch * pages_per_chunk);
  size_t touched = 0, next_spread = 0;
  for (size_t c0 = 0; c0 < chunks; c0 += kBatch) {
    const size_t n = std::min(kBatch, chunks - c0);
    const bool known = ::mincore(const_cast<uint8_t*>(data) + c0 * kHugePage, n * kHugePage, resident.data()) == 0;
    for (size_t c = c0; c < c0 + n; ++c) {
      const bool spread_chunk = next_spread < spread && c == next_spread * chunks / spread;
      if (spread_chunk) ++next_spread;
      if (!spread_chunk && !(known && (resident[(c - c0) * pages_per_chunk] & 1))) continue;
      (void)*static_cast<const volatile uint8_t*>(data + c * kHugePage);
      touched += kHugePage;
    }
  }
  return touched;
}

}  // namespace

MappedFile MappedFile::open(const std::string& path) {
  uint64_t size = 0;
  const int fd = io::open_model_file(path, &size);
  MappedFile file;
  file.path_ = path;
  file.size_ = static_cast<size_t>(size);
  struct statfs fs {};
  // hugetlbfs rounds a mapping up to its own page size (up to 1 GB): such a file is mapped where the kernel likes.
  const bool hugetlbfs = ::fstatfs(fd, &fs) == 0 && fs.f_type == static_cast<decltype(fs.f_type)>(HUGETLBFS_MAGIC);
  if (file.size_ > 0 && hugetlbfs) {
    void* p = ::mmap(nullptr, file.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      fail("cannot map {}: {}", path, std::strerror(err));
    }
    file.data_ = static_cast<const uint8_t*>(p);
  } else if (file.size_ > 0) {
    // Reserve 2 MB more address space than the file, map the file at the first 2 MB boundary in it, give back the
    // rest.
    void* reserved =
        ::mmap(nullptr, file.size_ + kHugePage, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    void* p = MAP_FAILED;
    if (reserved != MAP_FAILED) {
      const uintptr_t begin = reinterpret_cast<uintptr_t>(reserved), end = begin + file.size_ + kHugePage;
      const uintptr_t at = (begin + kHugePage - 1) & ~(kHugePage - 1);
      p = ::mmap(reinterpret_cast<void*>(at), file.size_, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0);
      if (p == MAP_FAILED) {
        const int err = errno;
        ::munmap(reserved, file.size_ + kHugePage);
        errno = err;
      } else {
        const uintptr_t mapped_end = (at + file.size_ + page_size() - 1) & ~(page_size() - 1);
        if (at > begin) ::munmap(reserved, at - begin);
        if (end > mapped_end) ::munmap(reinterpret_cast<void*>(mapped_end), end - mapped_end);
      }
    }
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      fail("cannot map {}: {}", path, std::strerror(err));
    }
    file.data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return file;
}

size_t MappedFile::huge_mapped_bytes() const {
  if (!data_) return 0;
  std::ifstream in("/proc/self/smaps");
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data_), end = begin + size_;
  std::string line;
  bool ours = false;
  size_t kb_total = 0;
  while (std::getline(in, line)) {
    unsigned long lo = 0, hi = 0;
    size_t kb = 0;
    // A mapping's first line: "lo-hi perms offset dev inode path"; its fields: "Name:   value kB".
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2) {
      ours = lo >= begin && hi <= ((end + page_size() - 1) & ~(page_size() - 1));
    } else if (ours && std::sscanf(line.c_str(), "FilePmdMapped: %zu kB", &kb) == 1) {
      kb_total += kb;
    }
  }
  return kb_total * 1024;
}

HugePages MappedFile::settle_huge_pages(size_t min_bytes) {
  HugePages h;
  if (!data_ || size_ < std::max(min_bytes, 2 * kHugePage) || !huge_pages_enabled()) return h;
  if (::madvise(const_cast<uint8_t*>(data_), size_, MADV_HUGEPAGE) != 0) return h;
  h.available = true;
  h.sampled_bytes = h.sampled_after = touch_cached_chunks(data_, size_);
  h.huge_before = h.huge_after = huge_mapped_bytes();
  if (h.huge_before * 16 >= h.sampled_bytes * 15) return h;
  // Chunks map as smaller pages: the cache holds (part of) the file in small folios, or the file system cannot hold
  // it in 2 MB ones. Unmapping pages loses nothing (the mapping is read-only, never written) and dropping clean
  // cached pages only costs reading them again. First one chunk: dropped and read again, does it come back as one
  // 2 MB page? Only then the whole file, so that a file system without 2 MB folios is not read again at every load.
  // A regular file only: a block device's cache may hold far more than the model.
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return h;
  struct stat st {};
  auto drop = [&](size_t offset, size_t bytes) {
    return ::madvise(const_cast<uint8_t*>(data_) + offset, bytes, MADV_DONTNEED) == 0 &&
           ::posix_fadvise(fd, static_cast<off_t>(offset), static_cast<off_t>(bytes), POSIX_FADV_DONTNEED) == 0;
  };
  const size_t probe = size_ / kHugePage / 2 * kHugePage;
  bool ok = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && drop(probe, kHugePage);
  if (ok) {
    const size_t unmapped = huge_mapped_bytes();
    (void)*static_cast<const volatile uint8_t*>(data_ + probe);
    ok = huge_mapped_bytes() >= unmapped + kHugePage && drop(0, size_);
  }
  ::close(fd);
  if (!ok) {
    h.huge_after = huge_mapped_bytes();
    return h;
  }
  h.dropped = true;
  h.sampled_after = touch_cached_chunks(data_, size_);
  h.huge_after = huge_mapped_bytes();
  return h;
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)), data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace hetmoe::gguf
