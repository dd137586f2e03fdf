#include "runtime/text/tool_calls.h"

#include <fmt/format.h>

#include "runtime/text/think_filter.h"

namespace hetmoe::text {
namespace {

void append_string(std::string& out, const std::string& s) {
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          out += fmt::format("\\u{:04x}", c);
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

void append_json(std::string& out, const nlohmann::ordered_json& v) {
  switch (v.type()) {
    case nlohmann::ordered_json::value_t::object: {
      out += '{';
      bool first = true;
      for (const auto& [key, item] : v.items()) {
        if (!first) out += ", ";
        first = false;
        append_string(out, key);
        out += ": ";
        append_json(out, item);
      }
      out += '}';
      return;
    }
    case nlohmann::ordered_json::value_t::array: {
      out += '[';
      for (size_t i = 0; i < v.size(); ++i) {
        if (i) out += ", ";
        append_json(out, v[i]);
      }
      out += ']';
      return;
    }
    case nlohmann::ordered_json::value_t::string:
      return append_string(out, v.get_ref<const std::string&>());
    default:
      out += v.dump();  // numbers, booleans, null: as Python prints them (true, false, null; shortest floats)
  }
}

// Whitespace between the tags of a call, which the parsers skip.
constexpr std::string_view kWs = " \n\r\t";
std::string_view skip_ws(std::string_view s) { return s.substr(std::min(s.size(), s.find_first_not_of(kWs))); }
std::string_view strip_ws(std::string_view s) {
  s = skip_ws(s);
  return s.substr(0, s.find_last_not_of(kWs) + 1);
}

// Arguments as a call carries them: compact JSON, invalid UTF-8 replaced.
std::string compact(const nlohmann::ordered_json& args) {
  return args.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

// A call whose arguments the model wrote as JSON text: nullopt unless they are a JSON object and the name is given.
std::optional<ToolCall> json_call(std::string id, std::string_view name, std::string_view arguments) {
  const nlohmann::ordered_json args = nlohmann::ordered_json::parse(arguments, nullptr, /*allow_exceptions=*/false);
  if (name.empty() || !args.is_object()) return std::nullopt;
  return ToolCall{.id = std::move(id), .name = std::string(name), .arguments = compact(args)};
}

// The markers around a format's block of calls.
struct Markers {
  std::string_view open, close;
};
Markers block_markers(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kMinimax:
      return {"<minimax:tool_call>", "</minimax:tool_call>"};
    case ToolCallFormat::kDsmlFunctionCalls:
      return {"<｜DSML｜function_calls>", "</｜DSML｜function_calls>"};
    case ToolCallFormat::kDsmlToolCalls:
      return {"<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>"};
    case ToolCallFormat::kKimi:
      return {"<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"};
    case ToolCallFormat::kDeepseekR1:
    case ToolCallFormat::kDeepseekV31:
      return {"<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"};
    default:
      return {"<tool_call>", "</tool_call>"};
  }
}

}  // namespace

std::string python_json(const nlohmann::ordered_json& value) {
  std::string out;
  append_json(out, value);
  return out;
}

// A call as the XML-like formats write it: the function and each parameter's text, with, where the format marks it
// (DSML's string="true|false"), whether that text is a string.
struct TextCall {
  std::string name;
  std::vector<std::pair<std::string, std::string>> params;
  std::vector<std::optional<bool>> marked_string{};
};

// GLM-4.5: "name\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>\n..." (whitespace between the tags ignored).
// Nullopt when the body is not that.
static std::optional<TextCall> parse_glm(std::string_view body) {
  const size_t first_key = body.find("<arg_key>");
  const std::string_view name = strip_ws(body.substr(0, first_key));
  if (name.empty() || name.find_first_of("<>\n") != std::string_view::npos) return std::nullopt;
  TextCall call{.name = std::string(name), .params = {}};
  std::string_view rest = first_key == std::string_view::npos ? std::string_view() : body.substr(first_key);
  while (!rest.empty()) {
    auto take = [&](std::string_view open, std::string_view close) -> std::optional<std::string_view> {
      const size_t at = rest.find_first_not_of(kWs);
      if (at == std::string_view::npos || rest.substr(at, open.size()) != open) return std::nullopt;
      const size_t end = rest.find(close, at + open.size());
      if (end == std::string_view::npos) return std::nullopt;
      const std::string_view inside = rest.substr(at + open.size(), end - at - open.size());
      rest = rest.substr(end + close.size());
      return inside;
    };
    const auto key = take("<arg_key>", "</arg_key>");
    if (!key) return std::nullopt;
    const auto value = take("<arg_value>", "</arg_value>");
    if (!value) return std::nullopt;
    call.params.emplace_back(std::string(*key), std::string(*value));
    if (rest.find_first_not_of(kWs) == std::string_view::npos) break;
  }
  return call;
}

std::string call_opening(ToolCallFormat format, const std::string& function, int call_index) {
  if (format == ToolCallFormat::kNone) return {};
  // gpt-oss: the reply's first message addressed to the function (the prompt ends "<|start|>assistant").
  if (format == ToolCallFormat::kHarmony)
    return function.empty() ? "<|channel|>commentary to=functions."
                            : " to=functions." + function + "<|channel|>commentary json<|message|>";
  // The block's opening, on its own line where the format writes one, then the named call's opening.
  std::string out(block_markers(format).open);
  if (format != ToolCallFormat::kGlm && format != ToolCallFormat::kKimi && format != ToolCallFormat::kDeepseekR1 &&
      format != ToolCallFormat::kDeepseekV31)
    out += '\n';
  if (function.empty()) return out;
  switch (format) {
    case ToolCallFormat::kHermes:
      return out + "{\"name\": \"" + function + "\", \"arguments\": ";
    case ToolCallFormat::kGlm:
      return out + function + "\n";
    case ToolCallFormat::kXml:
      return out + "<function=" + function + ">\n";
    case ToolCallFormat::kMinimax:
      return out + "<invoke name=\"" + function + "\">\n";
    case ToolCallFormat::kKimi:
      return out + fmt::format("<|tool_call_begin|>functions.{}:{}<|tool_call_argument_begin|>", function, call_index);
    case ToolCallFormat::kDeepseekR1:
      return out + "<｜tool▁call▁begin｜>function<｜tool▁sep｜>" + function + "\n```json\n";
    case ToolCallFormat::kDeepseekV31:
      return out + "<｜tool▁call▁begin｜>" + function + "<｜tool▁sep｜>";
    default:  // DSML
      return out + "<｜DSML｜invoke name=\"" + function + "\">\n";
  }
}

ToolCallParser::ToolCallParser(ToolCallFormat format, const std::vector<nlohmann::ordered_json>& tools)
    : format_(format) {
  for (const nlohmann::ordered_json& tool : tools) {
    const auto f = tool.find("function");
    if (f == tool.end() || !f->is_object() || !f->contains("name") || !(*f)["name"].is_string()) continue;
    const auto params = f->find("parameters");
    if (params == f->end() || !params->is_object() || !params->contains("properties")) continue;
    const nlohmann::ordered_json& props = (*params)["properties"];
    if (!props.is_object()) continue;
    auto& types = param_types_[(*f)["name"].get<std::string>()];
    for (const auto& [name, schema] : props.items())
      if (schema.is_object() && schema.contains("type") && schema["type"].is_string())
        types[name] = schema["type"].get<std::string>();
  }
}

// Qwen3.5: "\n<function=NAME>\n" + "<parameter=K>\nV\n</parameter>\n"... + "</function>\n" (one newline either
// side of a value belongs to the format). Nullopt when the body is not that.
static std::optional<TextCall> parse_xml(std::string_view body) {
  std::string_view rest = skip_ws(body);
  if (!rest.starts_with("<function=")) return std::nullopt;
  const size_t name_end = rest.find('>');
  if (name_end == std::string_view::npos) return std::nullopt;
  std::string name(rest.substr(10, name_end - 10));
  rest = skip_ws(rest.substr(name_end + 1));
  std::vector<std::pair<std::string, std::string>> params;
  while (rest.starts_with("<parameter=")) {
    const size_t key_end = rest.find('>');
    const size_t close = rest.find("</parameter>");
    if (key_end == std::string_view::npos || close == std::string_view::npos || close < key_end) return std::nullopt;
    std::string_view value = rest.substr(key_end + 1, close - key_end - 1);
    if (value.starts_with("\n")) value.remove_prefix(1);
    if (value.ends_with("\n")) value.remove_suffix(1);
    params.emplace_back(std::string(rest.substr(11, key_end - 11)), std::string(value));
    rest = skip_ws(rest.substr(close + 12));
  }
  if (!rest.starts_with("</function>") || !skip_ws(rest.substr(11)).empty()) return std::nullopt;
  return TextCall{.name = std::move(name), .params = std::move(params)};
}

// A parameter's text as JSON: a string parameter stays text, others are read as JSON when they parse. Which are
// strings the call says where its format marks them (DSML's string="true"), else the tool's schema.
static nlohmann::ordered_json typed_value(const std::map<std::string, std::map<std::string, std::string>>& types,
                                          const std::string& function, const std::string& key, const std::string& text,
                                          std::optional<bool> marked_string = {}) {
  const auto f = types.find(function);
  const bool is_string =
      marked_string.value_or(f != types.end() && f->second.count(key) && f->second.at(key) == "string");
  if (is_string) return text;
  nlohmann::ordered_json v = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  return v.is_discarded() ? nlohmann::ordered_json(text) : v;
}

// MiniMax-M2 (ns ""): one or more `<invoke name="N">` + `<parameter name="k">v</parameter>`... + `</invoke>`;
// DeepSeek's DSML (ns "｜DSML｜"): the same tags with the prefix, each parameter marked string="true" (its value as
// it is) or "false" (JSON). Whitespace between the tags ignored.
static std::optional<std::vector<TextCall>> parse_invokes(std::string_view body, std::string_view ns) {
  const std::string invoke_open = fmt::format("<{}invoke name=\"", ns), invoke_close = fmt::format("</{}invoke>", ns);
  const std::string param_open = fmt::format("<{}parameter name=\"", ns);
  const std::string param_close = fmt::format("</{}parameter>", ns);
  std::vector<TextCall> calls;
  std::string_view rest = skip_ws(body);
  while (!rest.empty()) {
    if (!rest.starts_with(invoke_open)) return std::nullopt;
    const size_t name_end = rest.find("\">", invoke_open.size());
    if (name_end == std::string_view::npos) return std::nullopt;
    TextCall call{.name = std::string(rest.substr(invoke_open.size(), name_end - invoke_open.size())), .params = {}};
    rest = skip_ws(rest.substr(name_end + 2));
    while (rest.starts_with(param_open)) {
      const size_t key_end = rest.find('"', param_open.size());
      const size_t tag_end = rest.find('>', key_end);
      const size_t close = rest.find(param_close, tag_end);
      if (close == std::string_view::npos) return std::nullopt;  // so are key_end and tag_end
      const std::string_view attributes = rest.substr(key_end + 1, tag_end - key_end - 1);
      call.params.emplace_back(std::string(rest.substr(param_open.size(), key_end - param_open.size())),
                               std::string(rest.substr(tag_end + 1, close - tag_end - 1)));
      call.marked_string.push_back(attributes.find("string=\"true\"") != std::string_view::npos ? std::optional(true)
                                   : attributes.find("string=\"false\"") != std::string_view::npos
                                       ? std::optional(false)
                                       : std::nullopt);
      rest = skip_ws(rest.substr(close + param_close.size()));
    }
    if (!rest.starts_with(invoke_close)) return std::nullopt;
    rest = skip_ws(rest.substr(invoke_close.size()));
    calls.push_back(std::move(call));
  }
  if (calls.empty()) return std::nullopt;
  return calls;
}

// Calls written one after another as BEGIN head MID tail END, whitespace between them: make(head, tail) makes
// each (nullopt: not a call). Empty when the block is not that.
template <typename Make>
static std::vector<ToolCall> marked_calls(std::string_view body, std::string_view begin, std::string_view mid,
                                          std::string_view end, Make&& make) {
  std::vector<ToolCall> calls;
  std::string_view rest = skip_ws(body);
  while (!rest.empty()) {
    if (!rest.starts_with(begin)) return {};
    const size_t at_mid = rest.find(mid), at_end = rest.find(end);
    if (at_mid == std::string_view::npos || at_end == std::string_view::npos || at_end < at_mid) return {};
    std::optional<ToolCall> call = make(rest.substr(begin.size(), at_mid - begin.size()),
                                        rest.substr(at_mid + mid.size(), at_end - at_mid - mid.size()));
    if (!call) return {};
    calls.push_back(std::move(*call));
    rest = skip_ws(rest.substr(at_end + end.size()));
  }
  return calls;
}

// Kimi-K2: one or more "<|tool_call_begin|>functions.NAME:INDEX<|tool_call_argument_begin|>{...}<|tool_call_end|>";
// the id as the model wrote it (the template writes it back), the arguments a JSON object.
static std::vector<ToolCall> parse_kimi(std::string_view body) {
  return marked_calls(body, "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>",
                      [](std::string_view head, std::string_view arguments) {
                        const std::string_view id = strip_ws(head);
                        std::string_view name = id.substr(0, id.rfind(':'));
                        if (name.starts_with("functions.")) name.remove_prefix(10);
                        return json_call(std::string(id), name, arguments);
                      });
}

// DeepSeek: one or more "<｜tool▁call▁begin｜>HEAD<｜tool▁sep｜>TAIL<｜tool▁call▁end｜>"; R1 writes TYPE as the head
// and "NAME\n```json\nARGS\n```" as the tail (the fence's "json" optional), V3.1 (name_first) NAME and ARGS. Fences
// around the arguments are taken off in both; the arguments a JSON object. The calls have no ids yet.
static std::vector<ToolCall> parse_deepseek_calls(std::string_view body, bool name_first) {
  return marked_calls(body, "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>",
                      [&](std::string_view head, std::string_view call) {
                        std::string_view name;
                        if (name_first) {
                          name = strip_ws(head);
                        } else {
                          name = strip_ws(call.substr(0, call.find('\n')));
                          call = call.substr(std::min(call.size(), call.find('\n')));
                        }
                        call = skip_ws(call);
                        if (call.starts_with("```")) call = call.substr(call.starts_with("```json") ? 7 : 3);
                        call = strip_ws(call);
                        if (call.ends_with("```")) call.remove_suffix(3);
                        return json_call({}, name, call);
                      });
}

std::vector<ToolCall> ToolCallParser::parse_block(std::string_view body) {
  std::vector<ToolCall> calls;
  auto add = [&](const TextCall& call) {
    nlohmann::ordered_json args = nlohmann::ordered_json::object();
    for (size_t i = 0; i < call.params.size(); ++i) {
      const auto& [key, text] = call.params[i];
      args[key] = typed_value(param_types_, call.name, key, text,
                              i < call.marked_string.size() ? call.marked_string[i] : std::nullopt);
    }
    calls.push_back({.id = fmt::format("call_{}", next_id_++), .name = call.name, .arguments = compact(args)});
  };
  switch (format_) {
    case ToolCallFormat::kMinimax:
    case ToolCallFormat::kDsmlFunctionCalls:
    case ToolCallFormat::kDsmlToolCalls:
      if (auto invokes = parse_invokes(body, format_ == ToolCallFormat::kMinimax ? "" : "｜DSML｜"))
        for (const TextCall& call : *invokes) add(call);
      return calls;
    case ToolCallFormat::kXml:
      if (auto call = parse_xml(body)) add(*call);
      return calls;
    case ToolCallFormat::kGlm:
      if (auto call = parse_glm(body)) add(*call);
      return calls;
    case ToolCallFormat::kKimi:
      return parse_kimi(body);
    case ToolCallFormat::kDeepseekR1:
    case ToolCallFormat::kDeepseekV31:
      calls = parse_deepseek_calls(body, format_ == ToolCallFormat::kDeepseekV31);
      for (ToolCall& call : calls) call.id = fmt::format("call_{}", next_id_++);
      return calls;
    default:
      break;
  }
  // Hermes: {"name": ..., "arguments": {...}} between newlines.
  const nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("name") || !j["name"].is_string()) return {};
  ToolCall call{.id = fmt::format("call_{}", next_id_), .name = j["name"].get<std::string>(), .arguments = "{}"};
  if (const auto a = j.find("arguments"); a != j.end())
    call.arguments = a->is_string() ? a->get<std::string>() : a->dump();
  ++next_id_;
  return {call};
}

ToolCallParser::Parts ToolCallParser::push(std::string_view text) {
  Parts out;
  if (format_ == ToolCallFormat::kNone || format_ == ToolCallFormat::kHarmony) {  // HarmonyReply's
    out.content = text;
    return out;
  }
  pending_ += text;
  for (;;) {
    // Calls are separated by a newline: it belongs to neither.
    if (after_call_ && !pending_.empty()) {
      if (pending_.front() == '\n') pending_.erase(0, 1);
      after_call_ = false;
    }
    const auto [open_tag, close_tag] = block_markers(format_);
    const size_t open = pending_.find(open_tag);
    if (open == std::string::npos) {
      // Hold back the longest end that could start the marker.
      const size_t held = marker_start_at_end(pending_, open_tag);
      out.content += pending_.substr(0, pending_.size() - held);
      pending_.erase(0, pending_.size() - held);
      return out;
    }
    out.content += pending_.substr(0, open);
    pending_.erase(0, open);
    const size_t close = pending_.find(close_tag);
    if (close == std::string::npos) return out;  // the call is not complete yet
    const std::string_view body = std::string_view(pending_).substr(open_tag.size(), close - open_tag.size());
    if (std::vector<ToolCall> calls = parse_block(body); !calls.empty()) {
      for (ToolCall& call : calls) out.calls.push_back(std::move(call));
      after_call_ = true;
    } else {
      out.content += pending_.substr(0, close + close_tag.size());
    }
    pending_.erase(0, close + close_tag.size());
  }
}

ToolCallParser::Parts ToolCallParser::flush() {
  Parts out;
  out.content = std::move(pending_);
  pending_.clear();
  return out;
}

namespace {

constexpr std::string_view kHarmonyMessage = "<|message|>", kHarmonyEnd = "<|end|>";
// The longest header hetmoe waits for before it takes the text as plain (a real one is under 100 bytes).
constexpr size_t kHarmonyMaxHeader = 256;

// The word after `key` in a header (up to whitespace or the next marker); empty when absent.
std::string_view header_value(std::string_view header, std::string_view key) {
  const size_t at = header.find(key);
  if (at == std::string_view::npos) return {};
  const std::string_view rest = header.substr(at + key.size());
  return rest.substr(0, rest.find_first_of(" \n\r\t<"));
}

}  // namespace

void HarmonyReply::body(std::string_view text, Parts& out) {
  (kind_ == Kind::kReasoning ? out.reasoning : out.content) += text;
}

void HarmonyReply::end_call(Parts& out) {
  if (std::optional<ToolCall> call = json_call(fmt::format("call_{}", next_id_), function_, pending_)) {
    out.calls.push_back(std::move(*call));
    ++next_id_;
  } else {
    out.content += pending_;  // not a call after all: its text
  }
  pending_.clear();
}

HarmonyReply::Parts HarmonyReply::push(std::string_view text) {
  Parts out;
  if (state_ == State::kPlain) {
    out.content = text;
    return out;
  }
  pending_ += text;
  for (;;) {
    if (state_ == State::kPlain) {
      out.content += pending_;
      pending_.clear();
      return out;
    }
    if (state_ == State::kHeader) {
      // A header is one whose "<|message|>" starts within kHarmonyMaxHeader bytes, however the text arrives.
      const size_t at = pending_.find(kHarmonyMessage);
      if (at == std::string::npos && pending_.size() < kHarmonyMaxHeader + kHarmonyMessage.size()) return out;
      if (at == std::string::npos || at > kHarmonyMaxHeader) {
        state_ = State::kPlain;
        continue;
      }
      const std::string_view header = std::string_view(pending_).substr(0, at);
      const std::string_view channel = header_value(header, "<|channel|>");
      const std::string_view recipient = header_value(header, "to=");
      function_.clear();
      // A message to a function is a call whatever its channel (gpt-oss often calls from the analysis channel).
      if (recipient.starts_with("functions.")) {
        kind_ = Kind::kCall;
        function_ = recipient.substr(10);
      } else {
        kind_ = channel == "analysis" ? Kind::kReasoning : Kind::kContent;
      }
      pending_.erase(0, at + kHarmonyMessage.size());
      state_ = State::kBody;
      continue;
    }
    // A body: up to "<|end|>"; a call's waits for it whole, another's goes out but for a possible start of it.
    if (kind_ == Kind::kCall) {
      const size_t end = pending_.find(kHarmonyEnd);
      if (end == std::string::npos) return out;
      std::string rest = pending_.substr(end + kHarmonyEnd.size());
      pending_.resize(end);
      end_call(out);
      pending_ = std::move(rest);
      state_ = State::kHeader;
      continue;
    }
    const size_t end = pending_.find(kHarmonyEnd);
    if (end == std::string::npos) {
      const size_t held = marker_start_at_end(pending_, kHarmonyEnd);
      body(std::string_view(pending_).substr(0, pending_.size() - held), out);
      pending_.erase(0, pending_.size() - held);
      return out;
    }
    body(std::string_view(pending_).substr(0, end), out);
    pending_.erase(0, end + kHarmonyEnd.size());
    state_ = State::kHeader;
  }
}

HarmonyReply::Parts HarmonyReply::flush() {
  Parts out;
  if (state_ == State::kBody && kind_ == Kind::kCall) {
    end_call(out);
  } else if (state_ == State::kBody) {
    body(pending_, out);
  } else {
    out.content += pending_;  // a header that never finished: text
  }
  pending_.clear();
  state_ = State::kHeader;
  return out;
}

}  // namespace hetmoe::text
