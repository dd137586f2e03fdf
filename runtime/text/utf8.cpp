// UTF-8 helpers of the tokenizer and the byte-level alphabet of GPT-2-style BPE vocabularies.
#include <array>
#include <optional>
#include <string>
#include <string_view>

#include "runtime/text/tokenizer.h"
#include "runtime/text/tokenizer_internal.h"

namespace hetmoe::text {
namespace detail {
namespace {

// The first continuation byte's range depends on the lead (RFC 3629): it is what rules out overlong forms,
// surrogates and code points beyond U+10FFFF. Returns the number of continuation bytes, 0 for ASCII, -1 for a byte
// that cannot lead.
int continuation_count(uint8_t lead, uint8_t* lo, uint8_t* hi) {
  *lo = 0x80;
  *hi = 0xBF;
  if (lead < 0x80) return 0;
  if (lead >= 0xC2 && lead <= 0xDF) return 1;
  if (lead == 0xE0) {
    *lo = 0xA0;
    return 2;
  }
  if (lead == 0xED) {
    *hi = 0x9F;
    return 2;
  }
  if (lead >= 0xE1 && lead <= 0xEF) return 2;
  if (lead == 0xF0) {
    *lo = 0x90;
    return 3;
  }
  if (lead >= 0xF1 && lead <= 0xF3) return 3;
  if (lead == 0xF4) {
    *hi = 0x8F;
    return 3;
  }
  return -1;
}

struct Gpt2Alphabet {
  std::array<std::string, 256> byte_text;
  std::array<int16_t, 512> char_byte;  // indexed by code point; the alphabet ends below U+0144

  Gpt2Alphabet() {
    char_byte.fill(-1);
    // Printable Latin-1 bytes stand for themselves; the others take the code points 256, 257, ... in byte order.
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const int cpt = printable ? b : next++;
      utf8_append(byte_text[static_cast<size_t>(b)], static_cast<uint32_t>(cpt));
      char_byte[static_cast<size_t>(cpt)] = static_cast<int16_t>(b);
    }
  }
};

const Gpt2Alphabet& gpt2_alphabet() {
  static const Gpt2Alphabet alphabet;
  return alphabet;
}

}  // namespace

size_t utf8_sequence_length(std::string_view s, size_t pos) {
  uint8_t lo, hi;
  const int n = continuation_count(static_cast<uint8_t>(s[pos]), &lo, &hi);
  if (n < 0) return 0;
  if (n == 0) return 1;
  if (pos + static_cast<size_t>(n) >= s.size()) return 0;  // truncated
  for (int k = 1; k <= n; ++k) {
    const auto b = static_cast<uint8_t>(s[pos + static_cast<size_t>(k)]);
    if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return 0;
  }
  return static_cast<size_t>(n) + 1;
}

uint32_t utf8_decode(std::string_view s, size_t pos, size_t len) {
  const auto b0 = static_cast<uint8_t>(s[pos]);
  if (len == 1) return b0;
  uint32_t cpt = b0 & (0x7Fu >> len);
  for (size_t k = 1; k < len; ++k) cpt = (cpt << 6) | (static_cast<uint8_t>(s[pos + k]) & 0x3Fu);
  return cpt;
}

void utf8_append(std::string& out, uint32_t cpt) {
  if (cpt < 0x80) {
    out += static_cast<char>(cpt);
  } else if (cpt < 0x800) {
    out += static_cast<char>(0xC0 | (cpt >> 6));
    out += static_cast<char>(0x80 | (cpt & 0x3F));
  } else if (cpt < 0x10000) {
    out += static_cast<char>(0xE0 | (cpt >> 12));
    out += static_cast<char>(0x80 | ((cpt >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cpt & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cpt >> 18));
    out += static_cast<char>(0x80 | ((cpt >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cpt >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cpt & 0x3F));
  }
}

size_t utf8_lead_length(uint8_t lead) {
  static constexpr std::array<uint8_t, 16> kLength = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLength[lead >> 4];
}

size_t utf8_incomplete_tail(std::string_view s) {
  // Find the lead byte among the last three; a tail with no lead, or a lead whose sequence is already complete or
  // already broken, holds nothing back.
  for (size_t back = 1; back <= 3 && back <= s.size(); ++back) {
    const size_t pos = s.size() - back;
    const auto b = static_cast<uint8_t>(s[pos]);
    if ((b & 0xC0) == 0x80) continue;
    uint8_t lo, hi;
    const int n = continuation_count(b, &lo, &hi);
    if (n <= 0 || static_cast<size_t>(n) < back) return 0;
    for (size_t k = 1; k < back; ++k) {
      const auto c = static_cast<uint8_t>(s[pos + k]);
      if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xBF)) return 0;
    }
    return back;
  }
  return 0;
}

int parse_byte_token(std::string_view text) {
  if (text.size() != 6 || !text.starts_with("<0x") || text.back() != '>') return -1;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  const int hi = hex(text[3]), lo = hex(text[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

bool is_unicode_whitespace(uint32_t cpt) {
  if (cpt < 0x80) return (cpt >= 0x09 && cpt <= 0x0D) || cpt == 0x20;
  switch (cpt) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cpt >= 0x2000 && cpt <= 0x200A;
  }
}

const std::string& gpt2_byte_text(uint8_t b) { return gpt2_alphabet().byte_text[b]; }

int gpt2_char_byte(uint32_t cpt) {
  const auto& table = gpt2_alphabet().char_byte;
  return cpt < table.size() ? table[cpt] : -1;
}

}  // namespace detail

std::optional<size_t> find_invalid_utf8(std::string_view s) {
  for (size_t pos = 0; pos < s.size();) {
    const size_t len = detail::utf8_sequence_length(s, pos);
    if (len == 0) return pos;
    pos += len;
  }
  return std::nullopt;
}

}  // namespace hetmoe::text
