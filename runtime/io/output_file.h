#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace hetmoe::io {

// A file written whole or not at all; every file hetmoe writes goes through one.
//
// A target that exists and is not a regular file (/dev/stdout, /dev/null, a FIFO) is written in place: there is
// nothing to replace. A symbolic link stays one: the file it points to is replaced, from beside it.
//
// The bytes go to a temporary file beside the target, named "<target>.XXXXXX.tmp" and created with O_EXCL (mkstemp),
// so two writers of one target never share it. Every write is checked; commit() writes what is buffered, fsyncs the
// file, gives it the target's permissions (or 0666 less the umask for a new file), renames it over the target and
// fsyncs the folder. Until commit() returns, the target is untouched: a failed write or close, an exception (the
// destructor) and a SIGINT, SIGTERM or SIGHUP that ends the program (install_signal_cleanup) remove the temporary
// file. Errors are hetmoe::Error, one line naming the target.
//
// Caching::kBypass is for files of gigabytes (a converted model): the bytes gather in an aligned buffer and go to the
// disk with O_DIRECT, not through the page cache. Copying into the page cache cost the writer a sixth of a model
// split's processor time, and a file that size would push the model being read out of memory. Where the file system
// refuses O_DIRECT (tmpfs), the file is written as usual.
class OutputFile {
 public:
  enum class Caching { kPageCache, kBypass };
  explicit OutputFile(std::string target, Caching caching = Caching::kPageCache);
  ~OutputFile();  // not committed: the temporary file is removed
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void write(const void* data, size_t size);
  void write(std::string_view text) { write(text.data(), text.size()); }
  template <typename... Args>
  void print(fmt::format_string<Args...> format, Args&&... args) {
    write(fmt::format(format, std::forward<Args>(args)...));
  }
  // Bytes written so far.
  uint64_t size() const { return written_ + buffered_; }

  // Makes the file the target. After a failure the target is as it was and the temporary file is gone.
  void commit();
  // commit() in two steps, for a set of files that should appear together (a sharded model): prepare() writes out,
  // syncs and closes (what can fail for want of space fails here), publish() renames into place.
  void prepare();
  void publish();

  const std::string& target() const { return target_; }
  const std::string& temporary() const { return temporary_; }

 private:
  void flush_buffer();
  void write_fd(const char* data, size_t size);
  void start_direct();
  void stop_direct();
  [[noreturn]] void fail_io(const char* what, int err);
  void discard();

  std::string target_, temporary_;
  std::string final_;  // the path renamed over: the target, or the file a symbolic link points to
  int fd_ = -1;
  int slot_ = -1;  // the signal handler's record of temporary_
  std::unique_ptr<char[], void (*)(void*)> buffer_{nullptr, std::free};
  size_t capacity_ = 0, buffered_ = 0;
  bool direct_ = false;  // the descriptor has O_DIRECT: writes of whole aligned blocks from buffer_ only
  uint64_t written_ = 0;
  bool prepared_ = false, committed_ = false;
};

// Writes `bytes` to `path` whole or not at all.
void write_file(const std::string& path, std::string_view bytes);

// SIGINT, SIGTERM and SIGHUP remove every uncommitted temporary file, then end the program as the signal would have.
// Called once at start-up, before any thread is made (the handlers apply to the whole process).
void install_signal_cleanup();

// While set, SIGINT calls `hook` instead (from the signal handler: it may only touch lock-free atomics) and the
// program goes on; files being written are kept. Null restores the default. Chat uses it to stop a reply.
void set_interrupt_hook(void (*hook)(int));

}  // namespace hetmoe::io
