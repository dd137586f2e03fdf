#include "runtime/text/terminal_safe.h"

#include <fmt/format.h>

#include "runtime/text/tokenizer_internal.h"

namespace hetmoe::text {

namespace {
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD
}

std::string TerminalSafe::push(std::string_view bytes) {
  std::string text = std::move(pending_);
  pending_.clear();
  text.append(bytes);
  // Held back: an incomplete character, or a CR whose next byte decides whether it ends a line.
  const size_t held = !text.empty() && text.back() == '\r' ? 1 : detail::utf8_incomplete_tail(text);
  const size_t end = text.size() - held;
  std::string out;
  out.reserve(end);
  for (size_t i = 0; i < end;) {
    const auto b = static_cast<uint8_t>(text[i]);
    if (b < 0x80) {
      if (b == '\n' || b == '\t' || (b >= 0x20 && b < 0x7F) || (b == '\r' && i + 1 < end && text[i + 1] == '\n'))
        out += static_cast<char>(b);
      else
        out += fmt::format("\\x{:02x}", b);
      ++i;
      continue;
    }
    const size_t len = detail::utf8_sequence_length(text, i);
    if (len == 0) {
      out += kReplacement;
      // Skip the broken sequence: the lead and any continuation bytes that follow it.
      ++i;
      while (i < end && (static_cast<uint8_t>(text[i]) & 0xC0) == 0x80) ++i;
      continue;
    }
    const uint32_t cpt = detail::utf8_decode(text, i, len);
    if (cpt >= 0x80 && cpt <= 0x9F)
      out += fmt::format("\\u{:04x}", cpt);
    else
      out.append(text, i, len);
    i += len;
  }
  pending_.assign(text, end, held);
  return out;
}

std::string TerminalSafe::flush() {
  std::string out;
  if (pending_ == "\r")
    out = "\\x0d";  // a CR at the very end: it would send the cursor back over the line
  else if (!pending_.empty())
    out = kReplacement;
  pending_.clear();
  return out;
}

}  // namespace hetmoe::text
