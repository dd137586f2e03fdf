#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/engine/session.h"
#include "runtime/error.h"
#include "runtime/text/chat_template.h"
#include "runtime/text/tokenizer.h"

namespace hetmoe::engine {

// Thrown when a turn does not fit the context; the conversation is left as it was before the call.
class ContextFull : public Error {
 public:
  ContextFull(const std::string& what, int64_t needed, int64_t free) : Error(what), needed(needed), free(free) {}
  int64_t needed;
  int64_t free;
};

// A chat on a Session. Every turn renders the whole conversation with the chat template, then evaluates only
// what the KV cache does not hold yet: the cache's tokens are tracked with the text they stand for, the new
// rendering is compared with that text, the cache is cut back to the last token inside the common prefix and
// only the rest is tokenized and evaluated. Earlier turns are never prefilled again unless the template itself
// rewrites them (DeepSeek-R1 and Qwen3 drop the thinking of past replies).
class Conversation {
 public:
  Conversation(Session& session, const text::Tokenizer& tokenizer, const text::ChatTemplate& chat_template,
               text::RenderOptions options);

  const std::vector<text::ChatMessage>& messages() const { return messages_; }
  // The rendering the last add_user evaluated (ends with the assistant's turn opening).
  const std::string& rendered() const { return rendered_; }
  void set_system(std::string system);                         // replaces the system message (empty: none)
  void clear();                                                // forgets every turn, keeps the system message
  void set_messages(std::vector<text::ChatMessage> messages);  // /load of a conversation saved as text only

  // What the session's tokens are and the text they stand for (a prefilled chunk or a generated token each), so that
  // a saved conversation comes back with exactly these tokens: /load evaluates them instead of tokenizing the text
  // again (a reply's text need not tokenize to the ids the model generated).
  struct CacheRecord {
    std::vector<int32_t> tokens;
    std::vector<int64_t> segment_tokens{};  // tokens per segment, in order
    std::vector<size_t> segment_ends{};     // each segment's end in text
    std::string text;
  };
  CacheRecord cache_record() const;
  // The messages with the session holding exactly the record's tokens, evaluated in the batches they first went in
  // (so the cache holds the same values). Fails with
  // hetmoe::Error, changing nothing, when the record does not describe its tokens and text consistently or does
  // not fit the context.
  void restore(std::vector<text::ChatMessage> messages, const CacheRecord& record);
  // Forgets the last user message and what followed it (its reply); false when there is none. The cache keeps what
  // the shorter conversation shares with it, so the next turn goes on from the turn before.
  bool undo();
  // Drops all but the last n user turns (with their replies); the system message stays.
  void keep_last_turns(int64_t n);
  int64_t n_turns() const;

  // Adds the user message and evaluates the new part of the rendering; returns how many tokens it evaluated.
  // Throws ContextFull (nothing changed) when they do not fit, and Cancelled when `cancel` (set_cancel) is raised
  // during the prefill (the message is not added; cached turns after the common prefix are re-evaluated later).
  int64_t add_user(std::string text);
  // Free positions that would remain after add_user(text); negative when the turn does not fit. With keep_turns >= 0:
  // after keep_last_turns(keep_turns) first (0: the system message alone), without changing anything.
  int64_t fit_margin(const std::string& text, int64_t keep_turns = -1) const;

  // Accounts for a generated token the caller evaluated on the session (keeps the text map in step). Call it
  // only for tokens that were evaluated: generate() leaves the end token and the last one unevaluated.
  void on_generated(int32_t token);
  void set_cancel(const std::atomic<bool>* cancel) { cancel_ = cancel; }
  // Records the finished reply text as the assistant's message.
  void add_assistant(std::string reply);

 private:
  struct Plan {
    int64_t keep = 0;             // cached tokens that stay
    size_t keep_segments = 0;     // and the segments they form
    size_t from = 0;              // where the new text starts
    std::vector<int32_t> tokens;  // to evaluate after them
    std::string text;             // the full rendering
  };
  Plan plan(const std::vector<text::ChatMessage>& messages) const;
  // The messages keep_last_turns(n) keeps (n < 0: all).
  std::vector<text::ChatMessage> last_turns(int64_t n) const;
  int64_t apply(const Plan& p);

  Session& session_;
  const text::Tokenizer& tokenizer_;
  const text::ChatTemplate& template_;
  text::RenderOptions options_;
  const std::atomic<bool>* cancel_ = nullptr;
  std::vector<text::ChatMessage> messages_;
  // What the session's tokens stand for, in pieces that can be cut at their ends: a prefilled chunk is one
  // segment (its tokens' text as it was rendered; a tokenizer's added prefix space or BOS need not match the
  // text token by token), a generated token is one segment with its own text.
  struct Segment {
    int64_t n_tokens;
    size_t text_end;  // offset in cached_text_
  };
  std::string rendered_;
  std::string cached_text_;
  std::vector<Segment> segments_;
};

}  // namespace hetmoe::engine
