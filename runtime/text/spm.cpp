// SentencePiece-style BPE ("llama" in tokenizer.ggml.model; LLaMA 1/2, Mistral, Mixtral): spaces become U+2581,
// adjacent symbols merge while their concatenation is a token, highest score first, and whatever is left that is
// not a token is spelled out with the <0xHH> byte tokens. Mirrors llama.cpp's llm_tokenizer_spm_session.
#include <algorithm>
#include <array>
#include <queue>
#include <string>

#include "runtime/error.h"
#include "runtime/text/tokenizer_internal.h"

namespace hetmoe::text::detail {
namespace {

using gguf::Value;
using gguf::ValueType;

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's visible space

struct Bigram {
  float score;
  int left, right;
  size_t size;
  // Highest score first; leftmost on ties.
  bool operator<(const Bigram& o) const { return score != o.score ? score < o.score : left > o.left; }
};

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size());
  for (size_t pos = 0;;) {
    const size_t hit = s.find(from, pos);
    out.append(s.substr(pos, hit - pos));
    if (hit == std::string_view::npos) return out;
    out += to;
    pos = hit + from.size();
  }
}

class SpmTokenizer final : public Tokenizer {
 public:
  explicit SpmTokenizer(const gguf::GgufFile& file) {
    model_ = "llama";
    // SentencePiece vocabularies have no pre-tokenizer; llama.cpp ignores the key.
    pre_ = file.get_string("tokenizer.ggml.pre").value_or("default");
    // tokenizer.ggml.remove_extra_whitespaces is read by llama.cpp but only its T5 (UGM) tokenizer applies it.
    load_vocab(file, {.bos = 1, .eos = 2, .unk = 0, .add_bos = true, .add_space_prefix = true});

    scores_.assign(tokens_.size(), 0.0f);
    if (const Value* scores = file.find("tokenizer.ggml.scores")) {
      if (!scores->is_array() ||
          (scores->elem_type() != ValueType::kFloat32 && scores->elem_type() != ValueType::kInt32) ||
          scores->array_size() < tokens_.size())
        fail("{}: tokenizer.ggml.scores is not a float32 or int32 array of at least {} entries", file.path(),
             tokens_.size());
      for (size_t i = 0; i < tokens_.size(); ++i) scores_[i] = static_cast<float>(scores->array_float(i).value_or(0));
    }

    // Byte fallback: <0xHH>, else the byte itself as a one-character token (llama_vocab::byte_to_token).
    for (int b = 0; b < 256; ++b) {
      static constexpr char kHex[] = "0123456789ABCDEF";
      const std::string hex = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
      auto id = find(hex);
      if (!id) id = find(std::string(1, static_cast<char>(b)));
      byte_tokens_[static_cast<size_t>(b)] = id.value_or(-1);
    }
  }

  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const override {
    return encode_fragments(text, add_special, parse_special);
  }

  std::string token_to_piece(int32_t id, bool render_special) const override {
    if (id < 0 || id >= n_vocab()) fail("token id {} is outside the vocabulary (0..{})", id, n_vocab() - 1);
    const std::string& text = tokens_[static_cast<size_t>(id)];
    switch (types_[static_cast<size_t>(id)]) {
      case TokenType::kControl:
      case TokenType::kUnknown:
        return render_special ? text : std::string();
      case TokenType::kUserDefined:
        return text;
      case TokenType::kNormal:
        return replace_all(text, kSpace, " ");
      case TokenType::kByte: {
        const int b = parse_byte_token(text);
        return b < 0 ? text : std::string(1, static_cast<char>(b));
      }
      default:
        return {};
    }
  }

 private:
  void encode_text(std::string_view text, bool after_special, std::vector<int32_t>& out) const override {
    const std::string s =
        replace_all(add_space_prefix_ && after_special ? " " + std::string(text) : std::string(text), " ", kSpace);
    // One symbol per character, cut by lead bytes alone as llama.cpp does, so malformed UTF-8 gives the same
    // symbols (and byte tokens) there as here.
    std::vector<Symbol> symbols;
    for (size_t offset = 0; offset < s.size();) {
      const size_t len = std::min(s.size() - offset, utf8_lead_length(static_cast<uint8_t>(s[offset])));
      const int index = static_cast<int>(symbols.size());
      symbols.push_back({.start = offset, .len = len, .prev = index - 1});
      offset += len;
      symbols.back().next = offset == s.size() ? -1 : index + 1;
    }

    std::priority_queue<Bigram> queue;
    auto add_bigram = [&](int left, int right) {
      if (left < 0 || right < 0) return;
      const Symbol& l = symbols[static_cast<size_t>(left)];
      const Symbol& r = symbols[static_cast<size_t>(right)];
      auto it = token_to_id_.find(s.substr(l.start, l.len + r.len));
      if (it == token_to_id_.end()) return;
      queue.push(
          {.score = scores_[static_cast<size_t>(it->second)], .left = left, .right = right, .size = l.len + r.len});
    };
    for (int i = 1; i < static_cast<int>(symbols.size()); ++i) add_bigram(i - 1, i);

    merge_symbols(symbols, queue, add_bigram);

    // Every merged symbol is a token by construction; only single characters can be missing from the vocabulary
    // (llama.cpp's resegment() then reaches its byte fallback).
    for (int i = symbols.empty() ? -1 : 0; i != -1; i = symbols[static_cast<size_t>(i)].next) {
      const Symbol& sym = symbols[static_cast<size_t>(i)];
      if (auto it = token_to_id_.find(s.substr(sym.start, sym.len)); it != token_to_id_.end()) {
        out.push_back(it->second);
        continue;
      }
      for (size_t k = 0; k < sym.len; ++k) {
        // llama.cpp aborts on a byte the vocabulary cannot spell; hetmoe writes the unknown token (or nothing).
        const int32_t id = byte_tokens_[static_cast<uint8_t>(s[sym.start + k])];
        if (id >= 0)
          out.push_back(id);
        else if (unk_)
          out.push_back(*unk_);
      }
    }
  }

  std::vector<float> scores_;
  std::array<int32_t, 256> byte_tokens_{};
};

}  // namespace

std::unique_ptr<Tokenizer> make_spm_tokenizer(const gguf::GgufFile& file) {
  return std::make_unique<SpmTokenizer>(file);
}

}  // namespace hetmoe::text::detail
