#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/error.h"
#include "runtime/text/chat_template.h"
#include "runtime/text/tokenizer.h"
#include "runtime/text/tool_calls.h"
#include "server/batcher.h"

namespace hetmoe::server {

// A request the server refuses: the HTTP status and an OpenAI-style error object's fields.
class ApiError : public Error {
 public:
  ApiError(int status, std::string message, std::string param = {}, std::string type = "invalid_request_error")
      : Error(message), status(status), param(std::move(param)), type(std::move(type)) {}
  int status;
  std::string param;
  std::string type;
};

// {"error": {"message", "type", "param", "code"}}
nlohmann::json error_body(std::string_view message, std::string_view type, std::string_view param);

// What every request starts from: the server's sampling defaults and reply limit.
struct RequestDefaults {
  engine::SamplingParams sampling{};
  int64_t max_tokens = -1;
};

// A parsed /v1/completions or /v1/chat/completions request: the job for the batcher and how to answer.
struct ParsedRequest {
  Job job;
  bool stream = false;
  bool chat = false;
  bool logprobs = false;      // chat: logprobs; completions: logprobs given
  bool include_usage = true;  // streaming: a last chunk with the usage (always sent; stream_options may ask too)
  // chat: the rendered prompt ends inside an open think block (the reply starts as reasoning), and the markers.
  bool starts_in_reasoning = false;
  bool splits_reasoning = false;
  std::string think_open, think_close;
  // chat with tools: the model's call syntax, and what the prompt already wrote of the reply (tool_choice "required"
  // or a named function opens the call; the parser reads it before the generated text).
  text::ToolCallFormat tool_format = text::ToolCallFormat::kNone;
  std::vector<nlohmann::ordered_json> tools;  // the request's, for the parser (parameter types)
  std::string reply_prefix;
  bool harmony = false;  // gpt-oss: the reply is a sequence of channel messages
};

// A unique id for a response or a call: the prefix, "-" and hex digits (time and a counter).
std::string random_id(std::string_view prefix);

// A boolean field of a request, null or absent as nullopt; ApiError 400 naming it when it is another type.
std::optional<bool> boolean(const nlohmann::json& body, const char* name);

// The body as JSON; ApiError 400 when it is not a JSON object.
nlohmann::json parse_body(std::string_view body);

// /v1/completions: prompt (a string, an array of token ids, or an array of one string), sampling fields, stop,
// logprobs (an integer), stream. ApiError 400 names the field that is wrong.
ParsedRequest parse_completion(const nlohmann::json& body, const text::Tokenizer& tokenizer,
                               const RequestDefaults& defaults);
// /v1/chat/completions: messages rendered with the chat template; logprobs (bool) and top_logprobs.
ParsedRequest parse_chat(const nlohmann::json& body, const text::Tokenizer& tokenizer,
                         const text::ChatTemplate& chat_template, const RequestDefaults& defaults);

// Splits a chat reply into reasoning and content as the text streams in: text between the think markers is
// reasoning; a possible start of a marker is held back until it is decided.
class ReasoningSplitter {
 public:
  ReasoningSplitter(bool enabled, std::string open, std::string close, bool start_inside)
      : enabled_(enabled), open_(std::move(open)), close_(std::move(close)), inside_(start_inside) {}
  struct Parts {
    std::string reasoning, content;
  };
  Parts push(std::string_view text);
  Parts flush();

 private:
  bool enabled_;
  std::string open_, close_;
  bool inside_;
  std::string pending_;
};

// A chat reply as it streams in, apart: its reasoning, content and calls as the request's template writes them (the
// reasoning splitter, then the tool-call parser; gpt-oss's channels through HarmonyReply). What the prompt already
// wrote of the reply (a forced call's opening) is read first. Calls get fresh unique ids ("call_..."), except
// Kimi-K2's, whose ids the model writes and reads back.
class ReplyParser {
 public:
  explicit ReplyParser(const ParsedRequest& r);
  using Parts = text::ReplyParts;
  Parts push(std::string_view text);
  Parts flush();

 private:
  Parts take(std::string_view text, bool flushing);
  bool harmony_;
  bool fresh_ids_;
  ReasoningSplitter split_;
  text::ToolCallParser calls_;
  text::HarmonyReply channels_;
};

std::string finish_reason(Finish f);
// A reply's calls as OpenAI's message.tool_calls (in a streamed delta each has its index).
nlohmann::json tool_calls_json(const std::vector<text::ToolCall>& calls, size_t first_index, bool with_index);
nlohmann::json usage_json(const Stream::Update& final);
// Logprobs of tokens in the chat format ({"content": [{token, logprob, bytes, top_logprobs}]}) and the completions
// format ({tokens, token_logprobs, top_logprobs, text_offset}).
nlohmann::json chat_logprobs(const std::vector<TokenLogprob>& lps, const text::Tokenizer& tokenizer);
nlohmann::json completion_logprobs(const std::vector<TokenLogprob>& lps, const text::Tokenizer& tokenizer,
                                   size_t text_offset);

}  // namespace hetmoe::server
