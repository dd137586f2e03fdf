#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace hetmoe {

// A gpt2-type (byte-level BPE) vocabulary in the deepseek layout, built deterministically so generated models carry a
// tokenizer that llama.cpp and hetmoe both accept:
//   ids 0..2    CONTROL specials <｜begin▁of▁sentence｜> (bos), <｜end▁of▁sentence｜> (eos, padding),
//               <｜▁pad▁｜>
//   ids 3..258  the 256 byte-level characters in byte order (GPT-2's bytes_to_unicode)
//   then        tokens learnt by BPE from a fixed English paragraph (most frequent adjacent pair first), and, once
//               the paragraph has no pairs left, tokens made by extending merged tokens with one letter.
// Every token string is unique and every merge "a b" names two tokens whose concatenation is a token.
struct BpeVocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> token_types;  // llama.cpp's: 1 normal, 3 control
  std::vector<std::string> merges;   // rank order
};

struct BpeVocabParams {
  int64_t n_vocab = 512;  // total, specials included; at least kMinBpeVocab
};

inline constexpr int64_t kMinBpeVocab = 3 + 256;
inline constexpr int32_t kBosTokenId = 0;
inline constexpr int32_t kEosTokenId = 1;
inline constexpr int32_t kPadTokenId = 1;

// O(n_vocab): about 50 ms for the 129280 tokens of DeepSeek-V3.
BpeVocab build_bpe_vocab(const BpeVocabParams& params);

// GPT-2's bytes_to_unicode: the printable character (UTF-8) that stands for byte b in token strings.
std::string gpt2_byte_char(uint8_t b);

// GPT-2's pre-tokenizer split (contractions, " ?letters", " ?digits", " ?other", whitespace runs) for ASCII text.
std::vector<std::string> gpt2_pre_split(std::string_view text);

// The paragraph the merges are learnt from.
std::string_view bpe_training_text();

}  // namespace hetmoe
