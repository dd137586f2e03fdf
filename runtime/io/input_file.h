#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace hetmoe::io {

// Files hetmoe reads come from users: a FIFO, a terminal or /dev/zero named by mistake must not block or grow
// without bound. Both functions open without blocking (O_NONBLOCK) and fail (hetmoe::Error, one line naming the path
// and `what` it was meant to be) for anything but what they accept.

// A whole text or JSON input (profile, trace, saved chat, text to tokenize): a regular file or a pipe (`-f
// /dev/stdin`, read as it comes) of at most `max_bytes`, the limit stated in the message when it is larger.
std::string read_file(const std::string& path, uint64_t max_bytes, const char* what);

// A model: a regular file or a block device. Returns an open descriptor (O_RDONLY, close-on-exec, blocking again)
// and its size.
int open_model_file(const std::string& path, uint64_t* size);

// Limits of the inputs, stated in their messages.
inline constexpr uint64_t kMaxProfileBytes = uint64_t{16} << 20;  // machine profiles (JSON)
inline constexpr uint64_t kMaxTraceBytes = uint64_t{1} << 30;     // routing traces (JSON lines)
inline constexpr uint64_t kMaxChatBytes = uint64_t{256} << 20;    // saved conversations
inline constexpr uint64_t kMaxTextBytes = uint64_t{256} << 20;    // text to tokenize

}  // namespace hetmoe::io
