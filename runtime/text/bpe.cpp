// Byte-level BPE ("gpt2" in tokenizer.ggml.model): pre-tokenize, map bytes to GPT-2's alphabet, merge by rank.
// Mirrors llama.cpp's llm_tokenizer_bpe_session: same merge order (lowest rank first, leftmost on ties) and the same
// fallback for a symbol that is not a token (its bytes looked up one by one).
#include <algorithm>
#include <queue>
#include <string>
#include <unordered_map>

#include "runtime/error.h"
#include "runtime/text/tokenizer_internal.h"

namespace hetmoe::text::detail {
namespace {

using gguf::Value;
using gguf::ValueType;

// llama.cpp's BOS/EOS for a gpt2 vocabulary whose metadata names none (llama_vocab::impl::load).
constexpr int32_t kDefaultBpeSpecial = 11;

struct Bigram {
  int32_t rank;
  int left, right;
  size_t size;
  bool operator>(const Bigram& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
};

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(const gguf::GgufFile& file) {
    model_ = "gpt2";
    pre_ = file.get_string("tokenizer.ggml.pre").value_or("");
    const PreTokenizerInfo* info = find_pre_tokenizer(pre_);
    if (info == nullptr) {
      std::string known;
      for (std::string_view name : pre_tokenizer_names()) known += (known.empty() ? "" : ", ") + std::string(name);
      fail("{}: unknown pre-tokenizer '{}' in tokenizer.ggml.pre (hetmoe knows: {})", file.path(), pre_, known);
    }
    if (pre_.empty()) pre_ = "default";
    ignore_merges_ = info->ignore_merges;
    load_vocab(file, {.bos = info->no_default_bos ? std::nullopt : std::optional<int32_t>(kDefaultBpeSpecial),
                      .eos = kDefaultBpeSpecial,
                      .unk = std::nullopt,
                      .add_bos = info->add_bos,
                      .add_space_prefix = false});
    // Byte-level BPE never adds a space, so whatever tokenizer.ggml.add_space_prefix says, decode removes none.
    add_space_prefix_ = false;

    const Value* merges = file.find("tokenizer.ggml.merges");
    // Kimi-K2 files may come without merges: llama.cpp accepts that for this one family.
    if (merges == nullptr && pre_ != "kimi-k2") fail("{}: tokenizer.ggml.merges is missing", file.path());
    if (merges != nullptr) {
      if (!merges->is_array() || merges->elem_type() != ValueType::kString)
        fail("{}: tokenizer.ggml.merges is not an array of strings", file.path());
      const std::vector<std::string>& list = merges->strings();
      ranks_.reserve(list.size());
      // "left right", split at the first space after the first character. Byte-level symbols never hold a space, so
      // the merge string itself is the look-up key of the pair.
      for (size_t i = 0; i < list.size(); ++i)
        if (list[i].find(' ', 1) != std::string::npos) ranks_.emplace(list[i], static_cast<int32_t>(i));
    }

    pieces_.resize(tokens_.size());
    for (size_t id = 0; id < tokens_.size(); ++id) pieces_[id] = render_piece(id);
    pre_tokenizer_ = std::make_unique<PreTokenizer>(*info);
  }

  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const override {
    return encode_fragments(text, add_special, parse_special);
  }

  std::string token_to_piece(int32_t id, bool render_special) const override {
    if (id < 0 || id >= n_vocab()) fail("token id {} is outside the vocabulary (0..{})", id, n_vocab() - 1);
    const TokenType t = types_[static_cast<size_t>(id)];
    if (t == TokenType::kControl || t == TokenType::kUnknown)
      return render_special ? tokens_[static_cast<size_t>(id)] : std::string();
    return pieces_[static_cast<size_t>(id)];
  }

 private:
  void encode_text(std::string_view text, bool /*after_special*/, std::vector<int32_t>& out) const override {
    std::string word;
    for (std::string_view piece : pre_tokenizer_->split(text)) {
      word.clear();
      for (char c : piece) word += gpt2_byte_text(static_cast<uint8_t>(c));
      encode_word(word, out);
    }
  }

  void encode_word(const std::string& word, std::vector<int32_t>& out) const {
    if (ignore_merges_) {
      if (auto it = token_to_id_.find(word); it != token_to_id_.end()) {
        out.push_back(it->second);
        return;
      }
    }
    std::vector<Symbol> symbols;
    for (size_t offset = 0; offset < word.size();) {
      const size_t len = std::min(word.size() - offset, utf8_lead_length(static_cast<uint8_t>(word[offset])));
      const int index = static_cast<int>(symbols.size());
      symbols.push_back({.start = offset, .len = len, .prev = index - 1});
      offset += len;
      symbols.back().next = offset == word.size() ? -1 : index + 1;
    }

    std::priority_queue<Bigram, std::vector<Bigram>, std::greater<>> queue;
    std::string key;
    auto add_bigram = [&](int left, int right) {
      if (left < 0 || right < 0) return;
      const Symbol& l = symbols[static_cast<size_t>(left)];
      const Symbol& r = symbols[static_cast<size_t>(right)];
      key.assign(word, l.start, l.len);
      key += ' ';
      key.append(word, r.start, r.len);
      if (auto it = ranks_.find(key); it != ranks_.end())
        queue.push({.rank = it->second, .left = left, .right = right, .size = l.len + r.len});
    };
    for (int i = 1; i < static_cast<int>(symbols.size()); ++i) add_bigram(i - 1, i);

    merge_symbols(symbols, queue, add_bigram);

    for (int i = symbols.empty() ? -1 : 0; i != -1; i = symbols[static_cast<size_t>(i)].next) {
      const Symbol& s = symbols[static_cast<size_t>(i)];
      const std::string text = word.substr(s.start, s.len);
      if (auto it = token_to_id_.find(text); it != token_to_id_.end()) {
        out.push_back(it->second);
        continue;
      }
      // llama.cpp looks each byte of the symbol up as a one-byte token and drops the ones that are not.
      for (char c : text)
        if (auto it = token_to_id_.find(std::string(1, c)); it != token_to_id_.end()) out.push_back(it->second);
    }
  }

  // The bytes a token stands for, control tokens aside.
  std::string render_piece(size_t id) const {
    const std::string& text = tokens_[id];
    switch (types_[id]) {
      case TokenType::kUserDefined:
        return text;
      case TokenType::kNormal: {
        // Each character of GPT-2's alphabet is one byte; llama.cpp marks anything else as unknown, hetmoe keeps it.
        std::string bytes;
        for (size_t pos = 0; pos < text.size();) {
          const size_t len = std::max<size_t>(1, utf8_sequence_length(text, pos));
          const int b =
              len == 1 && static_cast<uint8_t>(text[pos]) >= 0x80 ? -1 : gpt2_char_byte(utf8_decode(text, pos, len));
          if (b >= 0)
            bytes += static_cast<char>(b);
          else
            bytes.append(text, pos, len);
          pos += len;
        }
        return bytes;
      }
      case TokenType::kByte: {
        const int b = parse_byte_token(text);
        return b < 0 ? text : std::string(1, static_cast<char>(b));
      }
      default:
        return {};
    }
  }

  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  bool ignore_merges_ = false;
  std::unordered_map<std::string, int32_t> ranks_;  // "left right" -> merge rank
  std::vector<std::string> pieces_;                 // token_to_piece of every token, control tokens unrendered
};

}  // namespace

std::unique_ptr<Tokenizer> make_bpe_tokenizer(const gguf::GgufFile& file) {
  return std::make_unique<BpeTokenizer>(file);
}

}  // namespace hetmoe::text::detail
