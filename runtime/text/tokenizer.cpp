// What every tokenizer model type shares: loading the vocabulary and its special tokens from GGUF metadata the way
// llama.cpp does (llama_vocab::impl::load), special-token partitioning, decoding and streaming.
#include "runtime/text/tokenizer.h"

#include <algorithm>
#include <array>
#include <bitset>
#include <string>
#include <utility>

#include "runtime/error.h"
#include "runtime/text/tokenizer_internal.h"

namespace hetmoe::text {
namespace {

using gguf::GgufFile;
using gguf::Value;
using gguf::ValueType;

// Texts llama.cpp recognises when the metadata does not name the token. Earlier entries win where a vocabulary has
// several (llama.cpp takes whichever its hash map yields first).
constexpr std::array kEotTexts = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",         "<|endoftext|>",     "<|end_of_text|>",
    "<EOT>",      "_<EOT>",     "[EOT]",   "<｜end▁of▁sentence｜>", "<end_of_utterance>"};
constexpr std::array kEomTexts = {"<|eom_id|>"};
constexpr std::array kFimPreTexts = {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",    "<｜fim▁begin｜>",
                                     "<PRE>",          "▁<PRE>",       "<|code_prefix|>", "<|prefix|>"};
constexpr std::array kFimSufTexts = {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",    "<｜fim▁hole｜>",
                                     "<SUF>",          "▁<SUF>",       "<|code_suffix|>", "<|suffix|>"};
constexpr std::array kFimMidTexts = {"<|fim_middle|>", "<fim-middle>", "<fim_middle>",    "<｜fim▁end｜>",
                                     "<MID>",          "▁<MID>",       "<|code_middle|>", "<|middle|>"};
constexpr std::array kFimPadTexts = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"};
constexpr std::array kFimRepTexts = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"};
constexpr std::array kFimSepTexts = {"<|file_sep|>"};
// Any token with one of these texts ends generation.
constexpr std::array kEndTexts = {"<|eot_id|>",
                                  "<|im_end|>",
                                  "<|end|>",
                                  "<|return|>",
                                  "<|call|>",
                                  "<|flush|>",
                                  "<|calls|>",
                                  "<end_of_turn>",
                                  "<|endoftext|>",
                                  "</s>",
                                  "<|eom_id|>",
                                  "<EOT>",
                                  "_<EOT>",
                                  "[EOT]",
                                  "[EOS]",
                                  "<|end_of_text|>",
                                  "<end_of_utterance>",
                                  "<eos>",
                                  "<turn|>",
                                  "<|tool_response>",
                                  "<｜end▁of▁sentence｜>",
                                  "[e~["};

TokenType to_token_type(int64_t raw) {
  return raw >= 0 && raw <= static_cast<int64_t>(TokenType::kByte) ? static_cast<TokenType>(raw)
                                                                   : TokenType::kUndefined;
}

bool is_special_type(TokenType t) { return t == TokenType::kControl || t == TokenType::kUnknown; }

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const gguf::GgufFile& file) {
  const std::optional<std::string> model = file.get_string("tokenizer.ggml.model");
  if (!model) fail("{}: no tokenizer in this file (tokenizer.ggml.model is missing)", file.path());
  if (*model == "gpt2") return detail::make_bpe_tokenizer(file);
  if (*model == "llama") return detail::make_spm_tokenizer(file);
  fail("{}: unsupported tokenizer model '{}' in tokenizer.ggml.model (hetmoe supports gpt2 and llama)", file.path(),
       *model);
}

void Tokenizer::load_vocab(const gguf::GgufFile& file, const VocabDefaults& defaults) {
  const Value* list = file.find("tokenizer.ggml.tokens");
  if (list == nullptr) fail("{}: no tokenizer vocabulary (tokenizer.ggml.tokens is missing)", file.path());
  if (!list->is_array() || list->elem_type() != ValueType::kString || list->strings().empty())
    fail("{}: tokenizer.ggml.tokens is not a non-empty array of strings", file.path());
  const size_t n = list->strings().size();

  const Value* type_list = file.find("tokenizer.ggml.token_type");
  if (type_list != nullptr &&
      (!type_list->is_array() || type_list->array_size() < n || !type_list->array_int(0).has_value()))
    fail("{}: tokenizer.ggml.token_type is not an integer array of at least {} entries", file.path(), n);

  tokens_.resize(n);
  types_.resize(n);
  token_to_id_.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    // llama.cpp renames empty tokens so that no text maps to them.
    const std::string& text = list->strings()[i];
    tokens_[i] = text.empty() ? "[EMPTY_" + std::to_string(i) + "]" : text;
    token_to_id_.emplace(tokens_[i], static_cast<int32_t>(i));
    types_[i] = type_list ? to_token_type(type_list->array_int(i).value_or(0)) : TokenType::kNormal;
  }

  // A metadata id outside the vocabulary is dropped with a warning, and so is a default that is (llama.cpp's rule).
  const auto n_tokens = static_cast<int64_t>(n);
  auto read_id = [&](std::string_view key, std::optional<int32_t> fallback) -> std::optional<int32_t> {
    if (fallback && *fallback >= n_tokens) fallback.reset();
    const std::optional<int64_t> v = file.get_int(key);
    if (v && (*v < 0 || *v >= n_tokens)) {
      warnings_.push_back(fmt::format("{}: {} = {} is outside the vocabulary of {} tokens; {}", file.path(), key, *v,
                                      n_tokens,
                                      fallback ? fmt::format("using the default id {}", *fallback) : "ignored"));
      return fallback;
    }
    return v ? std::optional<int32_t>(static_cast<int32_t>(*v)) : fallback;
  };
  bos_ = read_id("tokenizer.ggml.bos_token_id", defaults.bos);
  eos_ = read_id("tokenizer.ggml.eos_token_id", defaults.eos);
  eot_ = read_id("tokenizer.ggml.eot_token_id", std::nullopt);
  unk_ = read_id("tokenizer.ggml.unknown_token_id", defaults.unk);
  std::optional<int32_t> eom = read_id("tokenizer.ggml.eom_token_id", std::nullopt);
  std::optional<int32_t> fim_pre = read_id("tokenizer.ggml.fim_pre_token_id", std::nullopt);
  std::optional<int32_t> fim_suf = read_id("tokenizer.ggml.fim_suf_token_id", std::nullopt);
  std::optional<int32_t> fim_mid = read_id("tokenizer.ggml.fim_mid_token_id", std::nullopt);
  std::optional<int32_t> fim_pad = read_id("tokenizer.ggml.fim_pad_token_id", std::nullopt);
  std::optional<int32_t> fim_rep = read_id("tokenizer.ggml.fim_rep_token_id", std::nullopt);
  std::optional<int32_t> fim_sep = read_id("tokenizer.ggml.fim_sep_token_id", std::nullopt);
  fim_pre = read_id("tokenizer.ggml.prefix_token_id", fim_pre);  // older names, read after the new ones
  fim_suf = read_id("tokenizer.ggml.suffix_token_id", fim_suf);
  fim_mid = read_id("tokenizer.ggml.middle_token_id", fim_mid);

  add_bos_ = file.get_bool("tokenizer.ggml.add_bos_token").value_or(defaults.add_bos);
  add_eos_ = file.get_bool("tokenizer.ggml.add_eos_token").value_or(false);
  add_space_prefix_ = file.get_bool("tokenizer.ggml.add_space_prefix").value_or(defaults.add_space_prefix);
  if (add_bos_ && !bos_)
    fail("{}: tokenizer.ggml.add_bos_token is true, but tokenizer.ggml.bos_token_id is not set", file.path());
  if (add_eos_ && !eos_)
    fail("{}: tokenizer.ggml.add_eos_token is true, but tokenizer.ggml.eos_token_id is not set", file.path());

  // Tokens found by their text are control tokens whatever their stored type, as in llama.cpp.
  auto mark_control = [&](int32_t id) { types_[static_cast<size_t>(id)] = TokenType::kControl; };
  auto detect = [&](std::optional<int32_t>& id, const auto& texts) {
    if (id) return;
    for (const char* text : texts) {
      if (auto found = find(text)) {
        id = *found;
        mark_control(*found);
        return;
      }
    }
  };
  detect(eot_, kEotTexts);
  detect(eom, kEomTexts);
  detect(fim_pre, kFimPreTexts);
  detect(fim_suf, kFimSufTexts);
  detect(fim_mid, kFimMidTexts);
  detect(fim_pad, kFimPadTexts);
  detect(fim_rep, kFimRepTexts);
  detect(fim_sep, kFimSepTexts);

  std::vector<int32_t> end;
  for (const std::optional<int32_t>& id : {fim_pad, fim_rep, fim_sep})
    if (id) end.push_back(*id);
  for (const char* text : kEndTexts) {
    if (auto id = find(text)) {
      end.push_back(*id);
      mark_control(*id);
    }
  }
  // gpt-oss: these always render, so they are not control tokens.
  for (const char* text : {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"})
    if (auto id = find(text)) types_[static_cast<size_t>(*id)] = TokenType::kUserDefined;
  for (const std::optional<int32_t>& id : {eos_, eot_, eom})
    if (id) end.push_back(*id);
  std::sort(end.begin(), end.end());
  end.erase(std::unique(end.begin(), end.end()), end.end());

  auto has_end = [&](std::string_view text) {
    auto id = find(text);
    return id && std::binary_search(end.begin(), end.end(), *id);
  };
  auto drop_end = [&](std::string_view text, TokenType type) {
    const int32_t id = *find(text);
    end.erase(std::find(end.begin(), end.end(), id));
    types_[static_cast<size_t>(id)] = type;
  };
  // o200k_harmony and solar-open end turns with <|return|>/<|call|> (<|calls|>/<|flush|>); their <|end|> only
  // separates messages.
  if (has_end("<|end|>") && ((has_end("<|return|>") && has_end("<|call|>")) ||
                             ((has_end("<|call|>") || has_end("<|calls|>")) && has_end("<|flush|>"))))
    drop_end("<|end|>", TokenType::kUserDefined);
  // Gemma 4 and PaddleOCR use </s> as ordinary text.
  if (has_end("<|tool_response>") && has_end("</s>")) drop_end("</s>", TokenType::kNormal);
  end_tokens_ = std::move(end);

  for (size_t id = 0; id < n; ++id) {
    const TokenType t = types_[id];
    if (t == TokenType::kControl || t == TokenType::kUserDefined || t == TokenType::kUnknown)
      special_tokens_.push_back(static_cast<int32_t>(id));
  }
  std::stable_sort(special_tokens_.begin(), special_tokens_.end(), [&](int32_t a, int32_t b) {
    return tokens_[static_cast<size_t>(a)].size() > tokens_[static_cast<size_t>(b)].size();
  });
}

std::vector<Tokenizer::Fragment> Tokenizer::partition_special(std::string_view text, bool parse_special) const {
  std::vector<Fragment> fragments, next;
  if (text.empty()) return fragments;
  fragments.push_back({.text = text});
  // Vocabularies carry thousands of user-defined tokens (deepseek-llm: 2398); most cannot occur in a given text,
  // and their first byte tells.
  std::bitset<256> present;
  for (char c : text) present.set(static_cast<uint8_t>(c));
  for (int32_t id : special_tokens_) {
    const std::string& s = tokens_[static_cast<size_t>(id)];
    if (!parse_special && is_special_type(types_[static_cast<size_t>(id)])) continue;
    if (!present.test(static_cast<uint8_t>(s[0])) || s.size() > text.size()) continue;
    next.clear();
    for (const Fragment& f : fragments) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      std::string_view rest = f.text;
      for (size_t pos; (pos = rest.find(s)) != std::string_view::npos;) {
        if (pos > 0) next.push_back({.text = rest.substr(0, pos)});
        next.push_back({.text = {}, .token = id});
        rest.remove_prefix(pos + s.size());
      }
      if (!rest.empty()) next.push_back({.text = rest});
    }
    fragments.swap(next);
  }
  return fragments;
}

std::vector<int32_t> Tokenizer::encode_fragments(std::string_view text, bool add_special, bool parse_special) const {
  std::vector<int32_t> out;
  if (add_special && add_bos_) out.push_back(*bos_);
  bool after_special = true;
  for (const Fragment& f : partition_special(text, parse_special)) {
    if (f.token >= 0) {
      out.push_back(f.token);
      after_special = true;
    } else {
      encode_text(f.text, after_special, out);
      after_special = false;
    }
  }
  if (add_special && add_eos_) out.push_back(*eos_);
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool render_special) const {
  std::string out;
  // The space SentencePiece put before the text is not part of it: drop it from the first piece after BOS.
  bool strip_space = add_space_prefix_;
  for (size_t i = 0; i < ids.size(); ++i) {
    std::string piece = token_to_piece(ids[i], render_special);
    if (strip_space && !(i == 0 && bos_ && ids[i] == *bos_)) {
      if (!piece.empty() && piece[0] == ' ') piece.erase(0, 1);
      strip_space = false;
    }
    out += piece;
  }
  return out;
}

std::optional<int32_t> Tokenizer::find(std::string_view text) const {
  auto it = token_to_id_.find(std::string(text));
  return it == token_to_id_.end() ? std::nullopt : std::optional<int32_t>(it->second);
}

bool Tokenizer::is_end_of_generation(int32_t id) const {
  return std::binary_search(end_tokens_.begin(), end_tokens_.end(), id);
}

std::string StreamDecoder::push(int32_t id) {
  pending_ += tokenizer_.token_to_piece(id, render_special_);
  const size_t ready = pending_.size() - detail::utf8_incomplete_tail(pending_);
  std::string out = pending_.substr(0, ready);
  pending_.erase(0, ready);
  return out;
}

std::string StreamDecoder::flush() { return std::exchange(pending_, {}); }

}  // namespace hetmoe::text
