#include "runtime/engine/conversation.h"

#include <algorithm>
#include <iterator>
#include <span>

#include "cpu_kernels/kernel_table.h"

namespace hetmoe::engine {

Conversation::Conversation(Session& session, const text::Tokenizer& tokenizer, const text::ChatTemplate& chat_template,
                           text::RenderOptions options)
    : session_(session), tokenizer_(tokenizer), template_(chat_template), options_(options) {
  session_.clear();
}

void Conversation::set_system(std::string system) {
  if (!messages_.empty() && messages_.front().role == "system") messages_.erase(messages_.begin());
  if (!system.empty()) messages_.insert(messages_.begin(), {"system", std::move(system)});
}

void Conversation::clear() {
  std::erase_if(messages_, [](const text::ChatMessage& m) { return m.role != "system"; });
  session_.clear();
  cached_text_.clear();
  segments_.clear();
}

void Conversation::set_messages(std::vector<text::ChatMessage> messages) {
  messages_ = std::move(messages);
  session_.clear();
  cached_text_.clear();
  segments_.clear();
}

Conversation::CacheRecord Conversation::cache_record() const {
  CacheRecord r{.tokens = session_.tokens(), .text = cached_text_};
  for (const Segment& g : segments_) {
    r.segment_tokens.push_back(g.n_tokens);
    r.segment_ends.push_back(g.text_end);
  }
  return r;
}

void Conversation::restore(std::vector<text::ChatMessage> messages, const CacheRecord& record) {
  if (record.segment_tokens.size() != record.segment_ends.size()) fail("the saved cache's segments do not pair up");
  int64_t n = 0;
  size_t end = 0;
  for (size_t i = 0; i < record.segment_tokens.size(); ++i) {
    if (record.segment_tokens[i] < 0 || record.segment_ends[i] < end || record.segment_ends[i] > record.text.size())
      fail("the saved cache's segment {} does not follow the one before it", i);
    n += record.segment_tokens[i];
    end = record.segment_ends[i];
  }
  if (n != static_cast<int64_t>(record.tokens.size()) || end != record.text.size())
    fail("the saved cache's segments hold {} tokens and {} bytes of text, not its {} tokens and {} bytes", n, end,
         record.tokens.size(), record.text.size());
  if (n > session_.n_ctx()) fail("the saved conversation holds {} tokens; the context has {}", n, session_.n_ctx());
  for (int32_t t : record.tokens)
    if (t < 0 || t >= tokenizer_.n_vocab()) fail("the saved cache holds token {}, outside the vocabulary", t);
  session_.clear();
  segments_.clear();
  cached_text_.clear();
  messages_ = std::move(messages);
  // The tokens go in as they went in the first time, so the cache holds the same values: each prefilled chunk as
  // one batch; generated tokens, one segment each, in runs of fewer than cpu::kTileMinActs, which compute every
  // product as a single token's decode does.
  const std::span<const int32_t> all(record.tokens);
  int64_t at = 0;
  for (size_t i = 0; i < record.segment_tokens.size();) {
    int64_t count = record.segment_tokens[i++];
    if (count == 1)
      while (count < cpu::kTileMinActs - 1 && i < record.segment_tokens.size() && record.segment_tokens[i] == 1) {
        ++count;
        ++i;
      }
    if (count > 0) session_.eval(all.subspan(static_cast<size_t>(at), static_cast<size_t>(count)), cancel_);
    at += count;
  }
  cached_text_ = record.text;
  for (size_t i = 0; i < record.segment_tokens.size(); ++i)
    segments_.push_back({record.segment_tokens[i], record.segment_ends[i]});
}

int64_t Conversation::n_turns() const {
  return std::count_if(messages_.begin(), messages_.end(), [](const text::ChatMessage& m) { return m.role == "user"; });
}

std::vector<text::ChatMessage> Conversation::last_turns(int64_t n) const {
  std::vector<size_t> users;
  for (size_t i = 0; i < messages_.size(); ++i)
    if (messages_[i].role == "user") users.push_back(i);
  if (n < 0 || n >= static_cast<int64_t>(users.size())) return messages_;
  // Everything from the first kept user message on stays, and the system message before it.
  const size_t first = n == 0 ? messages_.size() : users[users.size() - static_cast<size_t>(n)];
  std::vector<text::ChatMessage> kept;
  if (!messages_.empty() && messages_.front().role == "system") kept.push_back(messages_.front());
  kept.insert(kept.end(), messages_.begin() + static_cast<std::ptrdiff_t>(first), messages_.end());
  return kept;
}

void Conversation::keep_last_turns(int64_t n) { messages_ = last_turns(n); }

bool Conversation::undo() {
  const auto last_user =
      std::find_if(messages_.rbegin(), messages_.rend(), [](const text::ChatMessage& m) { return m.role == "user"; });
  if (last_user == messages_.rend()) return false;
  messages_.erase(std::prev(last_user.base()), messages_.end());
  return true;
}

Conversation::Plan Conversation::plan(const std::vector<text::ChatMessage>& messages) const {
  Plan p;
  p.text = template_.render(messages, options_);
  // The cache keeps every segment whose text lies entirely inside the common prefix of the old and new texts,
  // except that something must be evaluated to have logits for the reply (at worst the last segment again).
  const size_t common =
      static_cast<size_t>(std::mismatch(cached_text_.begin(), cached_text_.end(), p.text.begin(), p.text.end()).first -
                          cached_text_.begin());
  while (p.keep_segments < segments_.size() && segments_[p.keep_segments].text_end <= common &&
         segments_[p.keep_segments].text_end < p.text.size()) {
    p.keep += segments_[p.keep_segments].n_tokens;
    ++p.keep_segments;
  }
  p.from = p.keep_segments > 0 ? segments_[p.keep_segments - 1].text_end : 0;
  p.tokens = tokenizer_.encode(std::string_view(p.text).substr(p.from), /*add_special=*/false, /*parse_special=*/true);
  // A template that does not write the BOS itself gets the one the vocabulary asks for.
  if (p.keep == 0 && tokenizer_.add_bos() && tokenizer_.bos() && (p.tokens.empty() || p.tokens[0] != *tokenizer_.bos()))
    p.tokens.insert(p.tokens.begin(), *tokenizer_.bos());
  return p;
}

int64_t Conversation::apply(const Plan& p) {
  const int64_t free_after_cut = session_.n_ctx() - p.keep;
  if (static_cast<int64_t>(p.tokens.size()) > free_after_cut)
    throw ContextFull(fmt::format("context full: this turn needs {} tokens, {} of {} are free", p.tokens.size(),
                                  free_after_cut, session_.n_ctx()),
                      static_cast<int64_t>(p.tokens.size()), free_after_cut);
  session_.truncate(p.keep);
  segments_.resize(p.keep_segments);
  cached_text_.resize(p.from);
  if (!p.tokens.empty()) session_.eval(p.tokens, cancel_);
  cached_text_.append(p.text, p.from);
  segments_.push_back({static_cast<int64_t>(p.tokens.size()), cached_text_.size()});
  rendered_ = p.text;
  return static_cast<int64_t>(p.tokens.size());
}

int64_t Conversation::add_user(std::string text) {
  std::vector<text::ChatMessage> next = messages_;
  next.push_back({"user", std::move(text)});
  const Plan p = plan(next);
  const int64_t n = apply(p);
  messages_ = std::move(next);
  return n;
}

int64_t Conversation::fit_margin(const std::string& text, int64_t keep_turns) const {
  std::vector<text::ChatMessage> next = last_turns(keep_turns);
  next.push_back({"user", text});
  const Plan p = plan(next);
  return session_.n_ctx() - p.keep - static_cast<int64_t>(p.tokens.size());
}

void Conversation::on_generated(int32_t token) {
  cached_text_ += tokenizer_.token_to_piece(token, /*render_special=*/true);
  segments_.push_back({1, cached_text_.size()});
}

void Conversation::add_assistant(std::string reply) { messages_.push_back({"assistant", std::move(reply)}); }

}  // namespace hetmoe::engine
