#include "runtime/text/bpe_vocab.h"

#include <algorithm>
#include <map>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "runtime/error.h"

namespace hetmoe {
namespace {

constexpr std::string_view kTrainingText =
    "The model reads a prompt, splits it into tokens and looks up an embedding for each token. "
    "Every layer then mixes the tokens with attention and transforms each of them with a feed forward network. "
    "In a mixture of experts, the feed forward network is replaced by many small experts, and a router selects "
    "only a few of them for every token, so the model can be large while each token pays for a small part of it. "
    "The router computes a score for each expert, keeps the best ones and weights their outputs by those scores. "
    "Shared experts are always active; routed experts are chosen again for every token in every layer. "
    "Latent attention compresses the keys and values into a short vector, which keeps the cache small even when "
    "the context grows to thousands of tokens. Rotary position embeddings rotate pairs of dimensions by an angle "
    "that depends on the position, so the score of a query and a key depends on their distance. "
    "The weights of this model are random numbers: it has never seen any text, and the words it generates are "
    "not meant to make sense. It is here to test the runtime, to measure its speed and to check that every "
    "operation matches the reference implementation to the last bits that the formats allow. "
    "Quantized weights store a scale for each block of 32 or 256 values and a few bits for every value. "
    "At the end, the last hidden state goes through a norm and the output matrix, which gives one logit for "
    "each entry of the vocabulary; greedy decoding simply takes the largest one, 10 or 20 times in a row. "
    "Yes, the quick brown fox jumps over the lazy dog, and questions about punctuation, quotes, brackets "
    "(like these), periods and numbers such as 0, 1, 3, 4, 12 or 2024 are evaluated as well. "
    "This tokenizer was built from a single paragraph of plain English text, nothing more.";

constexpr std::string_view kSpecials[] = {
    "<\xEF\xBD\x9C"
    "begin\xE2\x96\x81"
    "of\xE2\x96\x81"
    "sentence\xEF\xBD\x9C>",  // <｜begin▁of▁sentence｜>
    "<\xEF\xBD\x9C"
    "end\xE2\x96\x81"
    "of\xE2\x96\x81"
    "sentence\xEF\xBD\x9C>",  // <｜end▁of▁sentence｜>
    "<\xEF\xBD\x9C\xE2\x96\x81"
    "pad\xE2\x96\x81\xEF\xBD\x9C>",  // <｜▁pad▁｜>
};
constexpr int32_t kTypeNormal = 1;
constexpr int32_t kTypeControl = 3;

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool is_letter(unsigned char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c >= 0x80; }
bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
bool is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

// Token strings under construction: ids of the byte-level and merged tokens (specials are added at the end).
class TokenTable {
 public:
  int id_of(const std::string& s) const {
    auto it = index_.find(s);
    return it == index_.end() ? -1 : it->second;
  }
  int add(std::string s) {
    int id = static_cast<int>(tokens_.size());
    index_.emplace(s, id);
    tokens_.push_back(std::move(s));
    return id;
  }
  const std::string& operator[](int id) const { return tokens_[static_cast<size_t>(id)]; }
  size_t size() const { return tokens_.size(); }
  std::vector<std::string>& tokens() { return tokens_; }

 private:
  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int> index_;
};

struct Word {
  std::vector<int> symbols;
  int count = 0;
};

// Greedy BPE on the training text until the table holds `target` tokens or no adjacent pair is left. Ties between
// equally frequent pairs go to the smaller (left id, right id), which keeps the result independent of hash order.
void learn_merges(TokenTable& table, size_t target, std::vector<std::string>& merges) {
  std::map<std::string, int> counts;
  for (const std::string& piece : gpt2_pre_split(kTrainingText)) ++counts[piece];
  std::vector<Word> words;
  for (const auto& [piece, count] : counts) {
    Word w{.symbols = {}, .count = count};
    for (unsigned char c : piece) w.symbols.push_back(static_cast<int>(c));
    words.push_back(std::move(w));
  }

  std::map<std::pair<int, int>, int> pairs;
  while (table.size() < target) {
    pairs.clear();
    for (const Word& w : words)
      for (size_t i = 0; i + 1 < w.symbols.size(); ++i) pairs[{w.symbols[i], w.symbols[i + 1]}] += w.count;
    if (pairs.empty()) return;
    auto best = pairs.begin();
    for (auto it = pairs.begin(); it != pairs.end(); ++it)
      if (it->second > best->second) best = it;
    const auto [left, right] = best->first;

    std::string joined = table[left] + table[right];
    int merged = table.id_of(joined);  // another split of the same string may have made it already
    if (merged < 0) merged = table.add(joined);
    merges.push_back(table[left] + " " + table[right]);

    for (Word& w : words) {
      std::vector<int>& s = w.symbols;
      size_t out = 0;
      for (size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && s[i] == left && s[i + 1] == right) {
          s[out++] = merged;
          ++i;
        } else {
          s[out++] = s[i];
        }
      }
      s.resize(out);
    }
  }
}

// Fills the table up to `target` once the paragraph is exhausted: merged tokens, oldest first (and the new ones in
// turn), each extended by the letters a..z, skipping strings that exist. Lengths grow only logarithmically.
void pad_with_extensions(TokenTable& table, size_t first_merged, size_t target, std::vector<std::string>& merges) {
  std::vector<int> letters;
  for (char c = 'a'; c <= 'z'; ++c) letters.push_back(static_cast<unsigned char>(c));
  std::vector<int> lefts;
  for (size_t id = first_merged; id < table.size(); ++id) lefts.push_back(static_cast<int>(id));
  if (lefts.empty()) lefts = letters;
  for (size_t next = 0; table.size() < target; ++next) {
    if (next == lefts.size()) fail("cannot extend the vocabulary to {} tokens", target);
    const int left = lefts[next];
    for (int right : letters) {
      if (table.size() >= target) break;
      std::string joined = table[left] + table[right];
      if (table.id_of(joined) >= 0) continue;
      lefts.push_back(table.add(std::move(joined)));
      merges.push_back(table[left] + " " + table[right]);
    }
  }
}

}  // namespace

std::string gpt2_byte_char(uint8_t b) {
  // Printable bytes stand for themselves; the others take the code points 256, 257, ... in byte order.
  auto printable = [](int c) { return (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF); };
  std::string out;
  if (printable(b)) {
    append_utf8(out, b);
    return out;
  }
  uint32_t n = 0;
  for (int c = 0; c < b; ++c)
    if (!printable(c)) ++n;
  append_utf8(out, 256 + n);
  return out;
}

std::vector<std::string> gpt2_pre_split(std::string_view text) {
  static constexpr std::string_view kContractions[] = {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"};
  std::vector<std::string> pieces;
  size_t i = 0;
  const size_t n = text.size();
  while (i < n) {
    bool matched = false;
    for (std::string_view c : kContractions) {
      if (text.substr(i, c.size()) == c) {
        pieces.emplace_back(c);
        i += c.size();
        matched = true;
        break;
      }
    }
    if (matched) continue;
    const auto ch = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
    size_t j = (ch(i) == ' ' && i + 1 < n && !is_space(ch(i + 1))) ? i + 1 : i;
    if (!is_space(ch(j))) {
      auto same_class = [&](unsigned char c) {
        if (is_letter(ch(j))) return is_letter(c);
        if (is_digit(ch(j))) return is_digit(c);
        return !is_space(c) && !is_letter(c) && !is_digit(c);
      };
      size_t k = j + 1;
      while (k < n && same_class(ch(k))) ++k;
      pieces.emplace_back(text.substr(i, k - i));
      i = k;
      continue;
    }
    size_t k = i;
    while (k < n && is_space(ch(k))) ++k;
    if (k < n && k - i > 1) --k;  // \s+(?!\S): the last space goes with the next word
    pieces.emplace_back(text.substr(i, k - i));
    i = k;
  }
  return pieces;
}

std::string_view bpe_training_text() { return kTrainingText; }

BpeVocab build_bpe_vocab(const BpeVocabParams& params) {
  if (params.n_vocab < kMinBpeVocab)
    fail("vocabulary of {} tokens is below the minimum of {}", params.n_vocab, kMinBpeVocab);
  const size_t n_specials = std::size(kSpecials);
  const size_t target = static_cast<size_t>(params.n_vocab) - n_specials;

  TokenTable table;
  for (int b = 0; b < 256; ++b) table.add(gpt2_byte_char(static_cast<uint8_t>(b)));
  BpeVocab vocab;
  learn_merges(table, target, vocab.merges);
  pad_with_extensions(table, 256, target, vocab.merges);

  vocab.tokens.reserve(static_cast<size_t>(params.n_vocab));
  for (std::string_view s : kSpecials) vocab.tokens.emplace_back(s);
  for (std::string& s : table.tokens()) vocab.tokens.push_back(std::move(s));
  vocab.token_types.assign(vocab.tokens.size(), kTypeNormal);
  std::fill(vocab.token_types.begin(), vocab.token_types.begin() + static_cast<ptrdiff_t>(n_specials), kTypeControl);
  return vocab;
}

}  // namespace hetmoe
