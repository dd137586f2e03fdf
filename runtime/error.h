#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace hetmoe {

// Every user-facing failure (bad file, bad argument, full context) is an Error with a one-line message. The
// command line catches it, prints it to stderr and exits non-zero; nothing below the CLI prints or exits.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// A computation stopped on request (Ctrl-C) before it finished; what it had started is discarded.
class Cancelled : public Error {
 public:
  Cancelled() : Error("stopped") {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace hetmoe
