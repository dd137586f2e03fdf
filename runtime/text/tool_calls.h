#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/text/chat_template.h"

namespace hetmoe::text {

// JSON as Python's json.dumps(x, ensure_ascii=False) prints it (the chat templates' `tojson`): ", " and ": " between
// items, keys in their order, non-ASCII characters as they are.
std::string python_json(const nlohmann::ordered_json& value);

// What opens a reply that must call a function, in the format's syntax: a call block, and when `function` is not
// empty, the call of that function up to its arguments. Empty for kNone. `call_index`: the calls the conversation made
// before (Kimi-K2 numbers its call ids across the conversation).
std::string call_opening(ToolCallFormat format, const std::string& function, int call_index = 0);

// Takes a reply's function calls out of its text as it streams in: text before and between calls goes on as content;
// a call is held back from its opening marker until it is complete, then given as a ToolCall (its arguments as
// compact JSON text, its id "call_" and a number). A block that does not parse stays content, as written. gpt-oss's
// calls are messages of its reply: HarmonyReply takes them (this parser passes its text on).
class ToolCallParser {
 public:
  // `tools` (the request's): the XML-like formats' parameters are text; one whose schema type is "string" (or that
  // DSML marks string="true") stays a string, others are read as JSON when they parse.
  explicit ToolCallParser(ToolCallFormat format, const std::vector<nlohmann::ordered_json>& tools = {});
  struct Parts {
    std::string content;
    std::vector<ToolCall> calls;
  };
  Parts push(std::string_view text);
  // The end of the reply: what is still held back (an unfinished call) is content.
  Parts flush();

 private:
  // The calls of one block between the format's markers (MiniMax-M2 writes several in one); empty when the block is
  // not well formed.
  std::vector<ToolCall> parse_block(std::string_view body);

  ToolCallFormat format_;
  std::map<std::string, std::map<std::string, std::string>> param_types_;  // function -> parameter -> schema type
  std::string pending_;
  bool after_call_ = false;  // a newline that follows a call is dropped
  int next_id_ = 0;
};

// A reply taken apart: its reasoning, its content and the calls it made.
struct ReplyParts {
  std::string reasoning, content;
  std::vector<ToolCall> calls;
};

// A gpt-oss reply as it streams in after the generation prompt "<|start|>assistant": messages, each a header (its
// channel, a recipient "to=...", a content type, in any order) then "<|message|>" and a body, the next one after
// "<|end|><|start|>assistant"; the last ends the reply (<|return|>, <|call|>: end-of-generation tokens, not in the
// text). A body to functions.NAME is a call on any channel (its arguments the body, a JSON object); another analysis
// body is reasoning, a final or commentary body content. Text with no header within 256 bytes (a model that ignores
// the format) is content as it is.
class HarmonyReply {
 public:
  using Parts = ReplyParts;
  Parts push(std::string_view text);
  Parts flush();

 private:
  enum class State { kHeader, kBody, kPlain };
  enum class Kind { kReasoning, kContent, kCall };
  void body(std::string_view text, Parts& out);  // a reasoning or content body's text
  void end_call(Parts& out);                     // the call whose body is pending_, complete

  State state_ = State::kHeader;
  Kind kind_ = Kind::kContent;
  std::string pending_;   // the header so far, or the body held back (a call's, or a possible start of "<|end|>")
  std::string function_;  // the call's function
  int next_id_ = 0;
};

}  // namespace hetmoe::text
