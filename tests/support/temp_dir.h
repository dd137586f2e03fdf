#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace hetmoe::test_support {

// A folder for one test binary's generated files, named after `prefix` and the process, removed at exit.
inline const std::filesystem::path& temp_dir(const std::string& prefix) {
  struct Dir {
    std::filesystem::path path;
    explicit Dir(const std::string& p)
        : path(std::filesystem::temp_directory_path() / (p + std::to_string(::getpid()))) {
      std::filesystem::create_directories(path);
    }
    ~Dir() {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
  };
  static const Dir dir(prefix);
  return dir.path;
}

}  // namespace hetmoe::test_support
