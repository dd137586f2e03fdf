#include "server/openai.h"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <random>

#include "runtime/text/think_filter.h"

namespace hetmoe::server {

using nlohmann::json;

json error_body(std::string_view message, std::string_view type, std::string_view param) {
  return {{"error",
           {{"message", message},
            {"type", type},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", nullptr}}}};
}

json parse_body(std::string_view body) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw ApiError(400, "the request body is not valid JSON");
  if (!j.is_object()) throw ApiError(400, "the request body must be a JSON object");
  return j;
}

namespace {

// A field of the body, null treated as absent; a value of the wrong type or range is a 400 naming it.
const json* get(const json& body, const char* name) {
  const auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

// A member's text; "" when it is absent or not a string (json::value would throw on another type).
std::string text_of(const json& j, const char* name) {
  const json* v = get(j, name);
  return v && v->is_string() ? v->get<std::string>() : std::string();
}

std::optional<double> number(const json& body, const char* name, double lo, double hi) {
  const json* v = get(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) throw ApiError(400, fmt::format("'{}' must be a number", name), name);
  const double x = v->get<double>();
  if (!(x >= lo && x <= hi)) throw ApiError(400, fmt::format("'{}' must be between {} and {}", name, lo, hi), name);
  return x;
}

std::optional<int64_t> integer(const json& body, const char* name, int64_t lo, int64_t hi) {
  const json* v = get(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number_integer()) throw ApiError(400, fmt::format("'{}' must be an integer", name), name);
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi))
    throw ApiError(400, fmt::format("'{}' must be between {} and {}", name, lo, hi), name);
  const int64_t x = v->get<int64_t>();
  if (x < lo || x > hi) throw ApiError(400, fmt::format("'{}' must be between {} and {}", name, lo, hi), name);
  return x;
}

std::string valid_text(const json& v, const char* name) {
  std::string s = v.get<std::string>();
  if (text::find_invalid_utf8(s)) throw ApiError(400, fmt::format("'{}' is not valid UTF-8", name), name);
  return s;
}

// What both endpoints share: sampling, limits, stop strings, streaming.
ParsedRequest parse_common(const json& body, const RequestDefaults& defaults) {
  ParsedRequest r;
  engine::SamplingParams& s = r.job.sampling;
  s = defaults.sampling;
  if (auto v = number(body, "temperature", 0, 2)) s.temperature = static_cast<float>(*v);
  if (auto v = number(body, "top_p", 0, 1)) s.top_p = static_cast<float>(*v);
  if (auto v = integer(body, "top_k", 0, 1 << 20)) s.top_k = static_cast<int32_t>(*v);
  if (auto v = number(body, "min_p", 0, 1)) s.min_p = static_cast<float>(*v);
  if (auto v = number(body, "presence_penalty", -2, 2)) s.presence_penalty = static_cast<float>(*v);
  if (auto v = number(body, "frequency_penalty", -2, 2)) s.frequency_penalty = static_cast<float>(*v);
  if (auto v = number(body, "repeat_penalty", 0, 10)) s.repeat_penalty = static_cast<float>(*v);
  if (auto v = integer(body, "seed", INT64_MIN, INT64_MAX)) {
    s.seed = static_cast<uint64_t>(*v);
  } else {
    s.seed = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  }
  r.job.max_tokens = defaults.max_tokens;
  if (auto v = integer(body, "max_tokens", 0, INT32_MAX)) r.job.max_tokens = *v;
  (void)integer(body, "n", 1, 1);  // one choice per request
  if (const json* stop = get(body, "stop")) {
    if (stop->is_string()) {
      r.job.stop.push_back(valid_text(*stop, "stop"));
    } else if (stop->is_array() && stop->size() <= 16) {
      for (const json& x : *stop) {
        if (!x.is_string()) throw ApiError(400, "'stop' must be a string or an array of strings", "stop");
        r.job.stop.push_back(valid_text(x, "stop"));
      }
    } else {
      throw ApiError(400, "'stop' must be a string or an array of at most 16 strings", "stop");
    }
  }
  if (auto v = boolean(body, "ignore_eos")) r.job.ignore_eos = *v;
  if (auto v = boolean(body, "stream")) r.stream = *v;
  if (const json* so = get(body, "stream_options")) {
    if (!so->is_object()) throw ApiError(400, "'stream_options' must be an object", "stream_options");
    (void)boolean(*so, "include_usage");
  }
  return r;
}

}  // namespace

std::optional<bool> boolean(const json& body, const char* name) {
  const json* v = get(body, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) throw ApiError(400, fmt::format("'{}' must be true or false", name), name);
  return v->get<bool>();
}

ParsedRequest parse_completion(const json& body, const text::Tokenizer& tokenizer, const RequestDefaults& defaults) {
  ParsedRequest r = parse_common(body, defaults);
  const json* prompt = get(body, "prompt");
  if (!prompt) throw ApiError(400, "'prompt' is required", "prompt");
  const json* p = prompt;
  if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) p = &(*p)[0];
  if (p->is_string()) {
    r.job.prompt = tokenizer.encode(valid_text(*p, "prompt"), /*add_special=*/true, /*parse_special=*/true);
  } else if (p->is_array() && !p->empty() &&
             std::all_of(p->begin(), p->end(), [](const json& x) { return x.is_number_integer(); })) {
    for (const json& x : *p) {
      const int64_t id = x.get<int64_t>();
      if (id < 0 || id >= tokenizer.n_vocab())
        throw ApiError(400,
                       fmt::format("token id {} in 'prompt' is out of range (the vocabulary has {} tokens)", id,
                                   tokenizer.n_vocab()),
                       "prompt");
      r.job.prompt.push_back(static_cast<int32_t>(id));
    }
  } else {
    throw ApiError(400, "'prompt' must be a string, an array of token ids or an array of one string", "prompt");
  }
  if (r.job.prompt.empty()) throw ApiError(400, "the prompt is empty", "prompt");
  if (auto v = integer(body, "logprobs", 0, 20)) {
    r.logprobs = true;
    r.job.top_logprobs = static_cast<int32_t>(*v);
  }
  if (auto v = boolean(body, "echo"); v && *v) throw ApiError(400, "'echo' is not supported by this server", "echo");
  return r;
}

ParsedRequest parse_chat(const json& body, const text::Tokenizer& tokenizer, const text::ChatTemplate& chat_template,
                         const RequestDefaults& defaults) {
  ParsedRequest r = parse_common(body, defaults);
  r.chat = true;
  if (auto v = integer(body, "max_completion_tokens", 0, INT32_MAX)) r.job.max_tokens = *v;
  const json* messages = get(body, "messages");
  if (!messages || !messages->is_array() || messages->empty())
    throw ApiError(400, "'messages' must be a non-empty array", "messages");
  std::vector<text::ChatMessage> msgs;
  for (const json& m : *messages) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      throw ApiError(400, "each message must be an object with a 'role'", "messages");
    std::string role = m["role"].get<std::string>();
    // A developer message is a system message, but for the templates that have a place of their own for it.
    if (role == "developer" && !chat_template.takes_developer()) role = "system";
    if (role != "system" && role != "developer" && role != "user" && role != "assistant" && role != "tool")
      throw ApiError(400, fmt::format("message role '{}' is not one of system, developer, user, assistant, tool", role),
                     "messages");
    std::string content;
    const json* c = get(m, "content");
    if (c && c->is_string()) {
      content = valid_text(*c, "messages");
    } else if (c && c->is_array()) {
      for (const json& part : *c) {
        if (!part.is_object() || text_of(part, "type") != "text" || !part.contains("text") || !part["text"].is_string())
          throw ApiError(400, "message content parts must be {\"type\": \"text\", \"text\": ...}", "messages");
        content += valid_text(part["text"], "messages");
      }
    } else if (c || role != "assistant") {
      throw ApiError(400, "a message's 'content' must be a string or an array of text parts", "messages");
    }
    text::ChatMessage msg{.role = std::move(role), .content = std::move(content)};
    if (const json* calls = get(m, "tool_calls")) {
      if (msg.role != "assistant" || !calls->is_array())
        throw ApiError(400, "'tool_calls' must be an array, in an assistant message", "messages");
      for (const json& call : *calls) {
        const json* f = call.is_object() ? get(call, "function") : nullptr;
        if (!f || !f->is_object() || !f->contains("name") || !(*f)["name"].is_string())
          throw ApiError(400, "each tool call needs a 'function' with a 'name'", "messages");
        text::ToolCall tc{.id = text_of(call, "id"), .name = (*f)["name"].get<std::string>(), .arguments = "{}"};
        if (const json* a = get(*f, "arguments")) {
          if (!a->is_string()) throw ApiError(400, "a tool call's 'arguments' must be a JSON string", "messages");
          tc.arguments = valid_text(*a, "messages");
        }
        msg.tool_calls.push_back(std::move(tc));
      }
    }
    if (msg.role == "tool") {
      if (const json* id = get(m, "tool_call_id"); id && id->is_string()) msg.tool_call_id = id->get<std::string>();
    }
    // A reply's reasoning, as this server answers it, back where the template reads it.
    if (const json* rc = get(m, "reasoning_content");
        rc && msg.role == "assistant" && chat_template.reads_think_blocks()) {
      if (!rc->is_string()) throw ApiError(400, "'reasoning_content' must be a string", "messages");
      if (!rc->get_ref<const std::string&>().empty())
        msg.content = "<think>" + valid_text(*rc, "messages") + "</think>" + msg.content;
    }
    // gpt-oss: the analysis before a call is what its template writes from a calling message's content, or from its
    // own `thinking` field (both given: the template refuses, so does this server); `reasoning_content`, as this server
    // answers it, stands in for `thinking` where neither is given.
    if (chat_template.kind() == text::TemplateKind::kHarmony && msg.role == "assistant" && !msg.tool_calls.empty()) {
      auto text_field = [&](const char* key) -> std::string {
        const json* v = get(m, key);
        if (!v || v->is_null()) return {};
        if (!v->is_string()) throw ApiError(400, fmt::format("'{}' must be a string", key), "messages");
        return valid_text(*v, "messages");
      };
      const std::string thinking = text_field("thinking"), reasoning = text_field("reasoning_content");
      if (!thinking.empty() && !msg.content.empty())
        throw ApiError(400, "a gpt-oss call message takes its analysis in 'content' or in 'thinking', not both",
                       "messages");
      if (msg.content.empty()) msg.content = thinking.empty() ? reasoning : thinking;
    }
    msgs.push_back(std::move(msg));
  }
  text::RenderOptions options;
  // Tools: each {"type": "function", "function": {"name", ...}}, kept in the client's key order for the template.
  const nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(body.dump());
  std::string forced;  // tool_choice: a function the reply must call, or "" for any ("required")
  bool required = false;
  if (const json* tools = get(body, "tools")) {
    if (!tools->is_array()) throw ApiError(400, "'tools' must be an array", "tools");
    for (size_t i = 0; i < tools->size(); ++i) {
      const json& t = (*tools)[i];
      if (!t.is_object() || text_of(t, "type") != "function" || !t.contains("function") || !t["function"].is_object() ||
          !t["function"].contains("name") || !t["function"]["name"].is_string())
        throw ApiError(400, "each tool must be {\"type\": \"function\", \"function\": {\"name\": ...}}", "tools");
      options.tools.push_back(ordered["tools"][i]);
    }
    if (const json* choice = get(body, "tool_choice")) {
      if (choice->is_string()) {
        const std::string c = choice->get<std::string>();
        if (c == "none") {
          options.tools.clear();
        } else if (c == "required") {
          required = true;
        } else if (c != "auto") {
          throw ApiError(400, "'tool_choice' must be none, auto, required or a function", "tool_choice");
        }
      } else if (choice->is_object() && choice->contains("function") && (*choice)["function"].is_object() &&
                 (*choice)["function"].contains("name") && (*choice)["function"]["name"].is_string()) {
        forced = (*choice)["function"]["name"].get<std::string>();
        required = true;
        bool known = false;
        for (const json& t : *tools) known = known || t["function"]["name"] == forced;
        if (!known)
          throw ApiError(400, fmt::format("tool_choice names '{}', which is not in 'tools'", forced), "tool_choice");
      } else {
        throw ApiError(400, "'tool_choice' must be none, auto, required or a function", "tool_choice");
      }
    }
  }
  if (const json* kw = get(body, "chat_template_kwargs")) {
    if (!kw->is_object()) throw ApiError(400, "'chat_template_kwargs' must be an object", "chat_template_kwargs");
    if (auto v = boolean(*kw, "enable_thinking")) options.enable_thinking = *v;
    if (auto v = boolean(*kw, "thinking")) options.enable_thinking = *v;  // DeepSeek-V3.1's own name for it
  }
  std::string rendered;
  try {
    rendered = chat_template.render(msgs, options);
  } catch (const Error& e) {  // a role or tools the template cannot take
    throw ApiError(400, e.what(), "messages");
  }
  // Reasoning and content apart for the families that reason; the reply starts as reasoning when the prompt opened
  // the think block.
  using text::TemplateKind;
  const TemplateKind k = chat_template.kind();
  r.splits_reasoning = k == TemplateKind::kDeepseek3 || k == TemplateKind::kChatml || k == TemplateKind::kGlm4 ||
                       k == TemplateKind::kMinimax || k == TemplateKind::kHarmony || k == TemplateKind::kKimiK2;
  r.harmony = k == TemplateKind::kHarmony;
  r.think_open = std::string(chat_template.think_open());
  r.think_close = std::string(chat_template.think_close());
  const size_t open = rendered.rfind(r.think_open);
  r.starts_in_reasoning = r.splits_reasoning && open != std::string::npos &&
                          rendered.find(r.think_close, open) == std::string::npos &&
                          rendered.find_first_not_of(" \n", open + r.think_open.size()) == std::string::npos;
  if (!options.tools.empty()) {
    r.tool_format = chat_template.tool_call_format();
    r.tools = options.tools;
    // A call the reply must make is opened by the prompt (the template's own syntax), the model goes on from there;
    // a think block the prompt opened is closed first.
    int calls_before = 0;
    for (const text::ChatMessage& m : msgs) calls_before += static_cast<int>(m.tool_calls.size());
    if (required) r.reply_prefix = text::call_opening(r.tool_format, forced, calls_before);
    if (!r.reply_prefix.empty() && r.starts_in_reasoning) {
      rendered += "\n" + r.think_close + "\n\n";
      r.starts_in_reasoning = false;
    }
    rendered += r.reply_prefix;
  }
  r.job.prompt = tokenizer.encode(rendered, /*add_special=*/false, /*parse_special=*/true);
  if (r.job.prompt.empty()) throw ApiError(400, "the rendered conversation is empty", "messages");
  r.job.render_special = true;
  if (auto v = boolean(body, "logprobs")) r.logprobs = *v;
  if (auto v = integer(body, "top_logprobs", 0, 20)) {
    if (!r.logprobs) throw ApiError(400, "'top_logprobs' needs 'logprobs': true", "top_logprobs");
    r.job.top_logprobs = static_cast<int32_t>(*v);
  } else if (r.logprobs) {
    r.job.top_logprobs = 0;
  }
  return r;
}

ReasoningSplitter::Parts ReasoningSplitter::push(std::string_view text) {
  Parts out;
  if (!enabled_) {
    out.content = text;
    return out;
  }
  pending_ += text;
  for (;;) {
    const std::string& marker = inside_ ? close_ : open_;
    const size_t at = pending_.find(marker);
    std::string& to = inside_ ? out.reasoning : out.content;
    if (at != std::string::npos) {
      to += pending_.substr(0, at);
      pending_.erase(0, at + marker.size());
      inside_ = !inside_;
      continue;
    }
    // Hold back the longest end that could start the marker.
    const size_t held = text::marker_start_at_end(pending_, marker);
    to += pending_.substr(0, pending_.size() - held);
    pending_.erase(0, pending_.size() - held);
    return out;
  }
}

ReasoningSplitter::Parts ReasoningSplitter::flush() {
  Parts out;
  (inside_ ? out.reasoning : out.content) = std::move(pending_);
  pending_.clear();
  return out;
}

std::string random_id(std::string_view prefix) {
  static std::atomic<uint64_t> counter{0};
  const uint64_t t = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  return fmt::format("{}-{:x}{:04x}", prefix, t & 0xffffffffffffull, counter.fetch_add(1) & 0xffff);
}

ReplyParser::ReplyParser(const ParsedRequest& r)
    : harmony_(r.harmony),
      fresh_ids_(r.tool_format != text::ToolCallFormat::kKimi),
      split_(r.splits_reasoning, r.think_open, r.think_close, r.starts_in_reasoning),
      calls_(r.tool_format, r.tools) {
  // The prefix opens a call: held back until the call completes.
  if (harmony_)
    (void)channels_.push(r.reply_prefix);
  else
    (void)calls_.push(r.reply_prefix);
}

ReplyParser::Parts ReplyParser::take(std::string_view text, bool flushing) {
  Parts out;
  if (harmony_) {
    out = flushing ? channels_.flush() : channels_.push(text);
  } else {
    const ReasoningSplitter::Parts parts = flushing ? split_.flush() : split_.push(text);
    out.reasoning = parts.reasoning;
    text::ToolCallParser::Parts found = calls_.push(parts.content);
    if (flushing) found.content += calls_.flush().content;
    out.content = std::move(found.content);
    out.calls = std::move(found.calls);
  }
  if (fresh_ids_)
    for (text::ToolCall& call : out.calls) call.id = random_id("call");
  return out;
}

ReplyParser::Parts ReplyParser::push(std::string_view text) { return take(text, false); }
ReplyParser::Parts ReplyParser::flush() { return take({}, true); }

json tool_calls_json(const std::vector<text::ToolCall>& calls, size_t first_index, bool with_index) {
  json out = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    json c = {{"id", calls[i].id},
              {"type", "function"},
              {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (with_index) c["index"] = first_index + i;
    out.push_back(std::move(c));
  }
  return out;
}

std::string finish_reason(Finish f) {
  switch (f) {
    case Finish::kStop:
      return "stop";
    case Finish::kLength:
      return "length";
    case Finish::kCancelled:
      return "cancelled";
    case Finish::kError:
      return "error";
  }
  return "stop";
}

json usage_json(const Stream::Update& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

namespace {

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char ch : s) b.push_back(ch);
  return b;
}

// A token's text for the logprobs: its bytes as UTF-8 where they are, else with replacement characters (a piece
// can be part of a character).
std::string token_text(const text::Tokenizer& tokenizer, int32_t id) {
  std::string piece = tokenizer.token_to_piece(id, /*render_special=*/true);
  if (!text::find_invalid_utf8(piece)) return piece;
  std::string out;
  for (unsigned char ch : piece) out += ch < 0x80 ? std::string(1, static_cast<char>(ch)) : std::string("\xEF\xBF\xBD");
  return out;
}

}  // namespace

json chat_logprobs(const std::vector<TokenLogprob>& lps, const text::Tokenizer& tokenizer) {
  json content = json::array();
  for (const TokenLogprob& lp : lps) {
    json top = json::array();
    for (const auto& [id, l] : lp.top)
      top.push_back({{"token", token_text(tokenizer, id)},
                     {"logprob", l},
                     {"bytes", bytes_of(tokenizer.token_to_piece(id, true))}});
    content.push_back({{"token", token_text(tokenizer, lp.token)},
                       {"logprob", lp.logprob},
                       {"bytes", bytes_of(tokenizer.token_to_piece(lp.token, true))},
                       {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}};
}

json completion_logprobs(const std::vector<TokenLogprob>& lps, const text::Tokenizer& tokenizer, size_t text_offset) {
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(), offsets = json::array();
  for (const TokenLogprob& lp : lps) {
    const std::string t = token_text(tokenizer, lp.token);
    tokens.push_back(t);
    token_logprobs.push_back(lp.logprob);
    json alternatives = json::object();
    for (const auto& [id, l] : lp.top) alternatives[token_text(tokenizer, id)] = l;
    top.push_back(std::move(alternatives));
    offsets.push_back(text_offset);
    text_offset += tokenizer.token_to_piece(lp.token).size();
  }
  return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top}, {"text_offset", offsets}};
}

}  // namespace hetmoe::server
