#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "runtime/gguf/reader.h"

namespace hetmoe::text {

// Token attributes as GGUF's tokenizer.ggml.token_type stores them.
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

// A tokenizer built from a GGUF file's tokenizer metadata alone (a vocab-only file works): byte-level BPE
// ("gpt2") with the pre-tokenizer its tokenizer.ggml.pre names, or SentencePiece ("llama") with byte fallback.
// Tokenization equals llama.cpp's, id for id.
class Tokenizer {
 public:
  // Fails with a one-line hetmoe::Error when the file has no tokenizer, an unsupported model type, or an unknown
  // pre-tokenizer (the message names it).
  static std::unique_ptr<Tokenizer> from_gguf(const gguf::GgufFile& file);
  virtual ~Tokenizer() = default;

  // add_special: add BOS/EOS as the metadata asks (add_bos_token, add_eos_token).
  // parse_special: text equal to a special or control token's text becomes that token; otherwise it is plain text.
  // Any byte sequence is accepted (invalid UTF-8 included); nothing here throws on user text.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const = 0;

  // The bytes one token stands for. Control tokens give "" unless render_special (then their text).
  virtual std::string token_to_piece(int32_t id, bool render_special = false) const = 0;
  // Concatenated pieces (SentencePiece drops the leading space the encoder added when remove_leading_space).
  std::string decode(std::span<const int32_t> ids, bool render_special = false) const;

  int32_t n_vocab() const { return static_cast<int32_t>(tokens_.size()); }
  const std::string& token_text(int32_t id) const { return tokens_.at(static_cast<size_t>(id)); }
  TokenType token_type(int32_t id) const { return types_.at(static_cast<size_t>(id)); }
  std::optional<int32_t> find(std::string_view text) const;

  std::optional<int32_t> bos() const { return bos_; }
  std::optional<int32_t> eos() const { return eos_; }
  std::optional<int32_t> eot() const { return eot_; }
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  // End of generation: EOS, EOT and the other end tokens the vocabulary marks (e.g. <|im_end|>, <|eot_id|>).
  bool is_end_of_generation(int32_t id) const;
  const std::string& model() const { return model_; }  // "gpt2" or "llama"
  const std::string& pre() const { return pre_; }
  // What loading the metadata set aside, one line each (a special token id outside the vocabulary): the caller
  // shows them (nothing below the command line prints).
  const std::vector<std::string>& warnings() const { return warnings_; }

 protected:
  // What a model type assumes when the metadata is silent (llama.cpp's defaults per tokenizer.ggml.model/pre).
  struct VocabDefaults {
    std::optional<int32_t> bos, eos, unk;
    bool add_bos = false;
    bool add_space_prefix = false;
  };
  // A run of input text, or a special token found in it (token >= 0, text empty).
  struct Fragment {
    std::string_view text;
    int32_t token = -1;
  };

  // Reads what every model type shares: token texts and types, special ids, BOS/EOS rules, end-of-generation set.
  void load_vocab(const gguf::GgufFile& file, const VocabDefaults& defaults);
  // Cuts `text` at special tokens, longest token first, as llama.cpp does: user-defined tokens always, control and
  // unknown tokens only when parse_special.
  std::vector<Fragment> partition_special(std::string_view text, bool parse_special) const;
  // encode() around a model's own text tokenizer: BOS, special fragments, EOS.
  std::vector<int32_t> encode_fragments(std::string_view text, bool add_special, bool parse_special) const;
  // Tokenizes one run of plain text; `after_special` is true at the start and right after a special token.
  virtual void encode_text(std::string_view text, bool after_special, std::vector<int32_t>& out) const = 0;

  std::string model_, pre_;
  std::vector<std::string> tokens_;
  std::vector<TokenType> types_;
  std::optional<int32_t> bos_, eos_, eot_, unk_;
  std::vector<int32_t> end_tokens_;  // sorted
  bool add_bos_ = false, add_eos_ = false;
  bool add_space_prefix_ = false;  // SentencePiece: a space is prepended to text at the start and after specials
  std::unordered_map<std::string, int32_t> token_to_id_;
  std::vector<int32_t> special_tokens_;  // candidates for partition_special, longest text first
  std::vector<std::string> warnings_;
};

// Turns a stream of token ids into text that is safe to print as it comes: a multi-byte UTF-8 character split
// across tokens is held back until it is complete.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool render_special = false)
      : tokenizer_(tokenizer), render_special_(render_special) {}
  // The complete characters that token `id` finishes.
  std::string push(int32_t id);
  // Whatever is still held back (an incomplete character at the end), as is.
  std::string flush();

 private:
  const Tokenizer& tokenizer_;
  bool render_special_;
  std::string pending_;
};

// Byte offset of the first invalid UTF-8 sequence, or nullopt when `s` is valid UTF-8.
std::optional<size_t> find_invalid_utf8(std::string_view s);

}  // namespace hetmoe::text
