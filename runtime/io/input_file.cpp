#include "runtime/io/input_file.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "runtime/error.h"

namespace hetmoe::io {
namespace {

// "1 GiB", "256 MiB"
std::string bytes_text(uint64_t n) {
  if (n >= (uint64_t{1} << 30) && n % (uint64_t{1} << 30) == 0) return fmt::format("{} GiB", n >> 30);
  return fmt::format("{} MiB", n >> 20);
}

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a pipe (FIFO)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISBLK(mode)) return "a block device";
  return "not a regular file";
}

// Closes a descriptor however the function that opened it ends.
struct Descriptor {
  int fd = -1;
  ~Descriptor() {
    if (fd >= 0) ::close(fd);
  }
};

// Opens without blocking (opening a FIFO no one writes would wait forever), then checks the kind: regular files
// always, block devices and pipes where the caller takes them. A pipe is then read as usual: reads wait while a
// writer holds it (`-f /dev/stdin`, `<(cmd)`), and a FIFO nobody has open for writing reads as empty at once.
int open_checked(const std::string& path, const char* what, bool allow_block_device, bool allow_pipe, struct stat* st) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) fail("cannot open {} ({}): {}", path, what, std::strerror(errno));
  Descriptor guard{fd};
  if (::fstat(fd, st) != 0) fail("cannot stat {}: {}", path, std::strerror(errno));
  const bool ok =
      S_ISREG(st->st_mode) || (allow_block_device && S_ISBLK(st->st_mode)) || (allow_pipe && S_ISFIFO(st->st_mode));
  if (!ok)
    fail("{} is {}, not {} (hetmoe reads {} only)", path, kind_of(st->st_mode), what,
         allow_block_device ? "regular files and block devices" : "regular files and pipes");
  // Reads block as usual from here on (O_NONBLOCK means nothing for regular files, but say what is meant).
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  guard.fd = -1;
  return fd;
}

[[noreturn]] void too_large(const std::string& path, const char* what, double bytes, uint64_t max_bytes) {
  fail("{} ({}) has {}{:.1f} MiB, more than the {} hetmoe reads", path, what, bytes > max_bytes ? "more than " : "",
       bytes / (1 << 20), bytes_text(max_bytes));
}

}  // namespace

std::string read_file(const std::string& path, uint64_t max_bytes, const char* what) {
  struct stat st {};
  const Descriptor f{open_checked(path, what, false, true, &st)};
  const bool regular = S_ISREG(st.st_mode);
  if (regular && static_cast<uint64_t>(st.st_size) > max_bytes)
    too_large(path, what, static_cast<double>(st.st_size), max_bytes);
  // A regular file in one read of its size; a pipe in chunks, refused once it passes the limit.
  std::string text(regular ? static_cast<size_t>(st.st_size) : size_t{1} << 16, '\0');
  size_t done = 0;
  for (;;) {
    if (done == text.size()) {
      if (regular) break;
      if (text.size() > max_bytes) too_large(path, what, static_cast<double>(text.size()), max_bytes);
      text.resize(std::min<size_t>(text.size() * 2, max_bytes + 1));
    }
    const ssize_t n = ::read(f.fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("cannot read {}: {}", path, std::strerror(errno));
    if (n == 0) break;  // the end (a regular file that shrank while being read: what is there)
    done += static_cast<size_t>(n);
  }
  if (done > max_bytes) too_large(path, what, static_cast<double>(done), max_bytes);
  text.resize(done);
  return text;
}

int open_model_file(const std::string& path, uint64_t* size) {
  struct stat st {};
  const int fd = open_checked(path, "a GGUF model", true, false, &st);
  *size = static_cast<uint64_t>(st.st_size);
  if (S_ISBLK(st.st_mode) && ::ioctl(fd, BLKGETSIZE64, size) != 0) {
    const int err = errno;
    ::close(fd);
    fail("cannot read the size of the block device {}: {}", path, std::strerror(err));
  }
  return fd;
}

}  // namespace hetmoe::io
