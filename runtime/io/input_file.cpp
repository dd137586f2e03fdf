#include "runtime/io/input_file.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

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

// Opens without blocking (a FIFO with no writer would wait forever), then checks the kind.
int open_checked(const std::string& path, const char* what, bool allow_block_device, struct stat* st) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) fail("cannot open {} ({}): {}", path, what, std::strerror(errno));
  if (::fstat(fd, st) != 0) {
    const int err = errno;
    ::close(fd);
    fail("cannot stat {}: {}", path, std::strerror(err));
  }
  if (!S_ISREG(st->st_mode) && !(allow_block_device && S_ISBLK(st->st_mode))) {
    ::close(fd);
    fail("{} is {}, not {} (hetmoe reads {} only)", path, kind_of(st->st_mode), what,
         allow_block_device ? "regular files and block devices" : "regular files");
  }
  // Reads block as usual from here on (O_NONBLOCK means nothing for regular files, but say what is meant).
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

}  // namespace

std::string read_file(const std::string& path, uint64_t max_bytes, const char* what) {
  struct stat st {};
  const int fd = open_checked(path, what, false, &st);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes) {
    ::close(fd);
    fail("{} ({}) has {:.1f} MiB, more than the {} hetmoe reads", path, what, static_cast<double>(size) / (1 << 20),
         bytes_text(max_bytes));
  }
  std::string text(size, '\0');
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::read(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : 0;
      ::close(fd);
      if (err) fail("cannot read {}: {}", path, std::strerror(err));
      text.resize(done);  // the file shrank while being read: what is there
      return text;
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return text;
}

int open_model_file(const std::string& path, uint64_t* size) {
  struct stat st {};
  const int fd = open_checked(path, "a GGUF model", true, &st);
  *size = static_cast<uint64_t>(st.st_size);
  if (S_ISBLK(st.st_mode) && ::ioctl(fd, BLKGETSIZE64, size) != 0) {
    const int err = errno;
    ::close(fd);
    fail("cannot read the size of the block device {}: {}", path, std::strerror(err));
  }
  return fd;
}

}  // namespace hetmoe::io
