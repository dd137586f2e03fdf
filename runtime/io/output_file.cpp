#include "runtime/io/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <vector>

#include "runtime/error.h"

namespace hetmoe::io {

namespace {

// The temporary files not yet committed, for the signal handler. A fixed table of lock-free pointers: the handler
// may read it at any moment, on any thread, so registering publishes a complete copy of the name, and a name is never
// freed (a removed one is cleared from the table, but a handler on another thread may still be reading it; a few
// bytes per file written). 4096 files at once (a sharded model writes one per shard) is far past any real use.
constexpr int kPendingSlots = 4096;
std::atomic<char*> g_pending[kPendingSlots];
std::atomic<void (*)(int)> g_interrupt_hook{nullptr};
static_assert(std::atomic<char*>::is_always_lock_free);

int register_pending(const std::string& path) {
  char* copy = strdup(path.c_str());
  if (!copy) throw std::bad_alloc();
  for (int i = 0; i < kPendingSlots; ++i) {
    char* expected = nullptr;
    if (g_pending[i].compare_exchange_strong(expected, copy)) return i;
  }
  std::free(copy);
  return -1;  // not covered by the signal handler; every other guarantee holds
}

// Names taken out of the table, kept (and reachable, so that leak checkers see no leak): a handler on another thread
// may still be reading one.
void unregister_pending(int slot) {
  if (slot < 0) return;
  static std::mutex mutex;
  static auto* retired = new std::vector<char*>();
  if (char* name = g_pending[slot].exchange(nullptr)) {
    const std::lock_guard<std::mutex> lock(mutex);
    retired->push_back(name);
  }
}

void remove_pending() {
  for (std::atomic<char*>& slot : g_pending)
    if (const char* path = slot.load()) ::unlink(path);  // async-signal-safe
}

void on_signal(int sig) {
  if (sig == SIGINT) {
    if (void (*hook)(int) = g_interrupt_hook.load()) {
      hook(sig);
      return;
    }
  }
  const int saved = errno;
  remove_pending();
  errno = saved;
  // End as the signal would have: the default action, raised again once this handler returns.
  std::signal(sig, SIG_DFL);
  ::raise(sig);
}

// Permissions for a new file: 0666 less the umask, read once (umask() can only be read by setting it).
mode_t new_file_mode() {
  static const mode_t mode = [] {
    const mode_t mask = ::umask(022);
    ::umask(mask);
    return static_cast<mode_t>(0666 & ~mask);
  }();
  return mode;
}

std::string parent_dir(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

constexpr size_t kBufferBytes = size_t{1} << 20;  // writes below this are gathered; larger ones go straight through
// With O_DIRECT every write is gathered here first: whole blocks of this alignment (the largest logical block size
// of Linux block devices), from memory of that alignment.
constexpr size_t kDirectAlign = 4096;
constexpr size_t kDirectBufferBytes = size_t{16} << 20;

// Memory of `bytes` aligned to kDirectAlign (bytes is a multiple of it).
char* aligned_buffer(size_t bytes) {
  void* p = std::aligned_alloc(kDirectAlign, bytes);
  if (!p) throw std::bad_alloc();
  return static_cast<char*>(p);
}

}  // namespace

OutputFile::OutputFile(std::string target, Caching caching) : target_(std::move(target)) {
  if (target_.empty()) fail("no output file name given");
  if (target_.back() == '/') fail("{} names a folder, not a file", target_);
  struct stat st {};
  if (::stat(target_.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) fail("{} is a folder, not a file", target_);
    if (!S_ISREG(st.st_mode)) {
      // A device or a pipe (/dev/stdout, /dev/null, a FIFO): nothing to replace, so written in place.
      fd_ = ::open(target_.c_str(), O_WRONLY | O_CLOEXEC | O_NOCTTY);
      if (fd_ < 0) fail("cannot open {}: {}", target_, std::strerror(errno));
      buffer_.reset(aligned_buffer(kBufferBytes));
      capacity_ = kBufferBytes;
      return;
    }
  }
  // A symbolic link stays one: the file it points to is the one replaced, from beside it.
  std::string real = target_;
  if (char* resolved = ::realpath(target_.c_str(), nullptr)) {
    real = resolved;
    std::free(resolved);
  }
  final_ = real;
  std::string name = real + ".XXXXXX.tmp";
  const int fd = ::mkostemps(name.data(), 4, O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    fail("cannot create a file in {} for {}: {}", parent_dir(target_), target_, std::strerror(err));
  }
  fd_ = fd;
  temporary_ = std::move(name);
  try {
    slot_ = register_pending(temporary_);
    capacity_ = caching == Caching::kBypass ? kDirectBufferBytes : kBufferBytes;
    buffer_.reset(aligned_buffer(capacity_));
    if (caching == Caching::kBypass) start_direct();
  } catch (...) {
    discard();
    throw;
  }
}

OutputFile::~OutputFile() {
  if (!committed_) discard();
}

void OutputFile::discard() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!temporary_.empty()) ::unlink(temporary_.c_str());
  temporary_.clear();
  unregister_pending(slot_);
  slot_ = -1;
}

void OutputFile::fail_io(const char* what, int err) {
  discard();
  fail("cannot {} {}: {}{}", what, target_, std::strerror(err),
       err == ENOSPC || err == EDQUOT || err == EFBIG ? " (the old file, if any, is unchanged)" : "");
}

void OutputFile::start_direct() {
  const int flags = ::fcntl(fd_, F_GETFL);
  direct_ = flags >= 0 && ::fcntl(fd_, F_SETFL, flags | O_DIRECT) == 0;  // refused (tmpfs): written as usual
}

void OutputFile::stop_direct() {
  if (!direct_) return;
  const int flags = ::fcntl(fd_, F_GETFL);
  if (flags < 0 || ::fcntl(fd_, F_SETFL, flags & ~O_DIRECT) != 0) fail_io("write", errno);
  direct_ = false;
}

void OutputFile::write_fd(const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd_, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      // A file system that takes O_DIRECT at open but not these writes (some FUSE file systems): as usual then.
      if (errno == EINVAL && direct_) {
        stop_direct();
        continue;
      }
      fail_io("write", errno);
    }
    if (n == 0) fail_io("write", ENOSPC);
    data += n;
    size -= static_cast<size_t>(n);
    written_ += static_cast<uint64_t>(n);
  }
}

void OutputFile::flush_buffer() {
  const size_t n = buffered_;
  buffered_ = 0;
  // O_DIRECT takes whole blocks: the tail of the file (the last flush) goes through the page cache.
  if (direct_ && n % kDirectAlign != 0) stop_direct();
  write_fd(buffer_.get(), n);
}

void OutputFile::write(const void* data, size_t size) {
  if (fd_ < 0) fail("{}: written after it was committed or failed", target_);
  const char* p = static_cast<const char*>(data);
  if (direct_) {  // everything through the aligned buffer, written when full
    while (size > 0) {
      const size_t n = std::min(size, capacity_ - buffered_);
      std::memcpy(buffer_.get() + buffered_, p, n);
      buffered_ += n;
      p += n;
      size -= n;
      if (buffered_ == capacity_) flush_buffer();
    }
    return;
  }
  if (buffered_ + size <= capacity_) {
    if (size) std::memcpy(buffer_.get() + buffered_, p, size);
    buffered_ += size;
    return;
  }
  flush_buffer();
  if (size >= capacity_) {
    write_fd(p, size);
  } else {
    std::memcpy(buffer_.get(), p, size);
    buffered_ = size;
  }
}

void OutputFile::prepare() {
  if (fd_ < 0 || prepared_) fail("{}: committed twice or after a failure", target_);
  flush_buffer();
  if (temporary_.empty()) {  // a device or a pipe, written in place
    ::close(fd_);
    fd_ = -1;
    prepared_ = true;
    return;
  }
  if (::fsync(fd_) != 0 && errno != EINVAL) fail_io("write", errno);
  struct stat st {};
  const mode_t mode = ::stat(final_.c_str(), &st) == 0 ? (st.st_mode & 07777) : new_file_mode();
  if (::fchmod(fd_, mode) != 0) fail_io("set the permissions of", errno);
  const int fd = fd_;
  fd_ = -1;
  // Linux releases the descriptor even when close() is interrupted, and the data is already synced.
  if (::close(fd) != 0 && errno != EINTR) fail_io("write", errno);
  prepared_ = true;
}

void OutputFile::publish() {
  if (!prepared_ || committed_) fail("{}: published before it was prepared, or twice", target_);
  if (!temporary_.empty() && ::rename(temporary_.c_str(), final_.c_str()) != 0) fail_io("replace", errno);
  committed_ = true;
  unregister_pending(slot_);
  slot_ = -1;
  if (temporary_.empty()) return;
  // The rename is durable once the folder is: sync it too (a failure here cannot be undone, and the data is written).
  const int dir = ::open(parent_dir(final_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

void OutputFile::commit() {
  prepare();
  publish();
}

void write_file(const std::string& path, std::string_view bytes) {
  OutputFile f(path);
  f.write(bytes);
  f.commit();
}

void install_signal_cleanup() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    // Interrupted reads and writes resume (select() returns on a signal whatever this says, so a chat at its prompt
    // still sees Ctrl-C at once).
    sa.sa_flags = SA_RESTART;
    // SIGPIPE: `hetmoe run ... --trace-routing t.jsonl | head -1`; SIGXFSZ: a file size limit reached mid-write.
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGXFSZ}) {
      struct sigaction old {};
      // A signal the parent told this process to ignore (nohup, a shell's background job) stays ignored.
      if (::sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
      ::sigaction(sig, &sa, nullptr);
    }
    // An exception nobody catches ends the program through std::terminate: the temporary files go first.
    static const std::terminate_handler previous = std::set_terminate([] {
      remove_pending();
      if (previous) previous();
      std::abort();
    });
  });
}

void set_interrupt_hook(void (*hook)(int)) { g_interrupt_hook.store(hook); }

}  // namespace hetmoe::io
