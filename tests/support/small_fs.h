#pragma once

#include <sys/mount.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

namespace hetmoe::test_support {

// A tmpfs of `kib` KiB mounted at `dir` (created), for "disk full" tests; unmounted when destroyed. Mounting needs
// root (or CAP_SYS_ADMIN): where it is refused, `error` says why and the test skips with it.
class SmallFs {
 public:
  SmallFs(const std::filesystem::path& dir, int kib) : dir_(dir) {
    std::filesystem::create_directories(dir_);
    const std::string options = "size=" + std::to_string(kib) + "k";
    if (::mount("tmpfs", dir_.c_str(), "tmpfs", 0, options.c_str()) == 0) {
      mounted_ = true;
    } else {
      error_ = std::string("cannot mount a small tmpfs for the disk-full case (") + std::strerror(errno) +
               "); run the tests as root to cover it";
    }
  }
  ~SmallFs() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  SmallFs(const SmallFs&) = delete;
  SmallFs& operator=(const SmallFs&) = delete;

  bool mounted() const { return mounted_; }
  const std::string& error() const { return error_; }
  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path dir_;
  bool mounted_ = false;
  std::string error_;
};

}  // namespace hetmoe::test_support
