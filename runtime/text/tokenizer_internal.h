#pragma once
// Pieces shared by the tokenizer's source files (utf8.cpp, pre_tokenize.cpp, bpe.cpp, spm.cpp, tokenizer.cpp).
// Not part of the public API.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/gguf/reader.h"
#include "runtime/text/tokenizer.h"

namespace hetmoe::text::detail {

// ---- UTF-8 (utf8.cpp) ----

inline constexpr uint32_t kReplacementChar = 0xFFFD;

// Length of the well-formed UTF-8 sequence at s[pos] (1..4), or 0 when the bytes there do not start one
// (stray continuation byte, overlong form, surrogate, beyond U+10FFFF, truncated).
size_t utf8_sequence_length(std::string_view s, size_t pos);
// The code point of a sequence utf8_sequence_length accepted.
uint32_t utf8_decode(std::string_view s, size_t pos, size_t len);
void utf8_append(std::string& out, uint32_t cpt);
// llama.cpp's unicode_len_utf8: the length a lead byte announces, judged by its top four bits alone. SentencePiece
// and BPE symbols are cut with it, so malformed input is cut exactly as llama.cpp cuts it.
size_t utf8_lead_length(uint8_t lead);
// Bytes at the end of `s` that begin a character the next bytes may still complete (0..3).
size_t utf8_incomplete_tail(std::string_view s);

// The byte of a byte-fallback token text "<0xHH>", or -1 when the text has another form.
int parse_byte_token(std::string_view text);

// Unicode White_Space, the set llama.cpp's pre-tokenizers treat as whitespace.
bool is_unicode_whitespace(uint32_t cpt);

// GPT-2's bytes_to_unicode: the character (as UTF-8) that stands for byte b in byte-level BPE token texts.
const std::string& gpt2_byte_text(uint8_t b);
// The byte a byte-level character stands for, or -1 for a code point outside the 256.
int gpt2_char_byte(uint32_t cpt);

// ---- Pre-tokenizers (pre_tokenize.cpp) ----

// One tokenizer.ggml.pre family: llama.cpp's regex list for it and the flags it sets.
struct PreTokenizerInfo {
  std::vector<std::string_view> names;
  std::vector<std::string_view> regexes;  // applied in order, each one splitting the pieces of the previous one
  bool ignore_merges = false;             // a piece that is itself a token is taken whole
  bool add_bos = false;                   // default when tokenizer.ggml.add_bos_token is absent
  bool no_default_bos = false;            // the family has no BOS unless tokenizer.ggml.bos_token_id names one
};

// The family `pre` names, or nullptr when hetmoe does not know it. "" means "default", as in llama.cpp.
const PreTokenizerInfo* find_pre_tokenizer(std::string_view pre);
// Every name find_pre_tokenizer accepts, for messages and tests.
std::vector<std::string_view> pre_tokenizer_names();

// Splits text into words with PCRE2 (UTF mode, JIT) the way llama.cpp's unicode_regex_split does: each regex cuts
// every piece of the previous one into its matches and the runs between them. Input that is not valid UTF-8 is
// matched as if each bad byte were U+FFFD (llama.cpp's reading) but the words keep the original bytes.
class PreTokenizer {
 public:
  explicit PreTokenizer(const PreTokenizerInfo& info);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Thread-safe; each word is a non-empty view into `text`.
  std::vector<std::string_view> split(std::string_view text) const;

 private:
  struct Regex;
  std::vector<std::unique_ptr<Regex>> regexes_;
};

// ---- Model types (bpe.cpp, spm.cpp) ----

std::unique_ptr<Tokenizer> make_bpe_tokenizer(const gguf::GgufFile& file);
std::unique_ptr<Tokenizer> make_spm_tokenizer(const gguf::GgufFile& file);

// A piece of a word during BPE or SentencePiece merging: a byte range of the word in a doubly linked list.
struct Symbol {
  size_t start = 0, len = 0;
  int prev = -1, next = -1;
};

// Pops the best queued pair and merges it until the queue is empty, queueing the pairs the merge creates with
// add_bigram(left, right). Queue entries carry left, right and size (the pair's byte length); a pair one of
// whose symbols merged since it was queued is stale: symbols only grow rightwards, so the length tells.
template <typename Queue, typename AddBigram>
void merge_symbols(std::vector<Symbol>& symbols, Queue& queue, AddBigram add_bigram) {
  while (!queue.empty()) {
    const auto b = queue.top();
    queue.pop();
    Symbol& left = symbols[static_cast<size_t>(b.left)];
    Symbol& right = symbols[static_cast<size_t>(b.right)];
    if (left.len == 0 || right.len == 0 || left.len + right.len != b.size) continue;
    left.len += right.len;
    right.len = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = b.left;
    add_bigram(left.prev, b.left);
    add_bigram(b.left, left.next);
  }
}

}  // namespace hetmoe::text::detail
