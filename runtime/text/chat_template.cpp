#include "runtime/text/chat_template.h"

#include <cstddef>
#include <ctime>
#include <optional>
#include <string>

#include "runtime/error.h"
#include "runtime/text/tool_calls.h"

// Each render_ function follows one official Jinja template, named above it, for messages whose content is a
// plain string (no tool calls, no images). Where a template silently skips a role or raises, hetmoe fails with a
// one-line Error instead of guessing.

namespace hetmoe::text {
namespace {

// DeepSeek-V3/R1 write these literally (not through bos_token/eos_token), so they are constants here too.
constexpr std::string_view kDsUser = "<｜User｜>";
constexpr std::string_view kDsAssistant = "<｜Assistant｜>";
constexpr std::string_view kDsEndOfSentence = "<｜end▁of▁sentence｜>";

constexpr std::string_view kKimiDefaultSystem = "You are a helpful assistant";

bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

bool is_known_role(const std::string& role) { return role == "system" || role == "user" || role == "assistant"; }

// Roles the format can express; tools, tool messages and calls only where it has tool calls.
void check_roles(std::span<const ChatMessage> messages, const RenderOptions& options, std::string_view format,
                 bool tools, bool developer) {
  for (const ChatMessage& m : messages) {
    if ((tools && m.role == "tool") || (developer && m.role == "developer")) continue;
    if (!is_known_role(m.role))
      fail("chat template {}: role '{}' is not supported (system, user or assistant{})", format, m.role,
           tools ? ", tool" : "");
    if (!tools && !m.tool_calls.empty())
      fail("chat template {}: hetmoe renders no tool calls in this format yet", format);
  }
  if (!tools && !options.tools.empty()) fail("chat template {}: hetmoe renders no tools in this format yet", format);
}

bool uses_tools(std::span<const ChatMessage> messages, const RenderOptions& options) {
  if (!options.tools.empty()) return true;
  for (const ChatMessage& m : messages)
    if (m.role == "tool" || !m.tool_calls.empty()) return true;
  return false;
}

// Python's str.lstrip/rstrip/strip with an explicit character set, as the templates call them.
std::string_view lstrip(std::string_view s, std::string_view chars) {
  const size_t b = s.find_first_not_of(chars);
  return b == std::string_view::npos ? std::string_view() : s.substr(b);
}
std::string_view rstrip(std::string_view s, std::string_view chars) {
  const size_t e = s.find_last_not_of(chars);
  return e == std::string_view::npos ? std::string_view() : s.substr(0, e + 1);
}
std::string_view strip(std::string_view s, std::string_view chars) { return rstrip(lstrip(s, chars), chars); }

// Qwen3's last_query_index: the last user message that is not a wrapped tool response (its content as `text` gives
// it); messages.size() - 1 when there is none.
template <typename Text>
size_t last_query_index(std::span<const ChatMessage> messages, Text text) {
  for (size_t i = messages.size(); i-- > 0;) {
    const std::string c = text(messages[i].content);
    if (messages[i].role == "user" && !(c.starts_with("<tool_response>") && c.ends_with("</tool_response>"))) return i;
  }
  return messages.empty() ? 0 : messages.size() - 1;
}

// The DeepSeek templates' system prompt: the system messages, wherever they stand, joined by "\n\n" (every one after
// the first, empty or not), or only the last one (R1).
std::string ds_system(std::span<const ChatMessage> messages, bool joins) {
  std::string system;
  bool first = true;
  for (const ChatMessage& m : messages) {
    if (m.role != "system") continue;
    system = joins && !first ? system + "\n\n" + m.content : m.content;
    first = false;
  }
  return system;
}

// A call's arguments as the templates that read them as a mapping take them; fails (one line, naming the format)
// when they are not a JSON object.
nlohmann::ordered_json call_arguments(const ToolCall& call, std::string_view format) {
  nlohmann::ordered_json args =
      nlohmann::ordered_json::parse(call.arguments.empty() ? "{}" : call.arguments, nullptr, false);
  if (!args.is_object())
    fail("chat template {}: the arguments of a call to {} are not a JSON object", format, call.name);
  return args;
}

// An argument's value as GLM-4.5's and MiniMax-M2's templates write it: a string as it is, anything else as JSON.
std::string argument_text(const nlohmann::ordered_json& value) {
  return value.is_string() ? value.get<std::string>() : python_json(value);
}

// Jinja's `trim` filter strips whitespace (Python's str.strip()); ASCII whitespace is what matters in practice.
constexpr std::string_view kWhitespace = " \t\n\r\v\f";

// `s.split(sep)[-1]`: the text after the last `sep` (all of `s` when absent).
std::string_view after_last(std::string_view s, std::string_view sep) {
  const size_t p = s.rfind(sep);
  return p == std::string_view::npos ? s : s.substr(p + sep.size());
}
// `s.split(sep)[0]`: the text before the first `sep`.
std::string_view before_first(std::string_view s, std::string_view sep) { return s.substr(0, s.find(sep)); }

// A stored reply as the reasoning templates split it when it holds "</think>": the reasoning between the last
// "<think>" before the first "</think>" and it, the content after the last "</think>"; both with leading newlines
// stripped (Qwen3, GLM-4.5), or newlines at both ends (MiniMax-M2: strip_both_ends). No "</think>": all content.
struct Reply {
  std::string_view reasoning, content;
};
Reply split_reply(std::string_view reply, bool strip_both_ends) {
  if (!contains(reply, "</think>")) return {{}, reply};
  auto trim = [&](std::string_view v) { return strip_both_ends ? strip(v, "\n") : lstrip(v, "\n"); };
  return {trim(after_last(rstrip(before_first(reply, "</think>"), "\n"), "<think>")),
          trim(after_last(reply, "</think>"))};
}

// A Qwen2-style ChatML template writes a fixed system prompt when the conversation has none:
//   {{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}
// It is the literal between "<|im_start|>system" + newline and "<|im_end|>" that contains no Jinja (no quote,
// brace or '+'): Qwen3's `'<|im_start|>system\n' + messages[0].content + ...` does not qualify. The newline may be
// a real one or the two characters `\n` of a Jinja string escape, which are decoded.
std::string find_default_system(std::string_view tmpl) {
  constexpr std::string_view kOpen = "<|im_start|>system";
  constexpr std::string_view kClose = "<|im_end|>";
  for (size_t at = tmpl.find(kOpen); at != std::string_view::npos; at = tmpl.find(kOpen, at + 1)) {
    std::string_view rest = tmpl.substr(at + kOpen.size());
    if (rest.starts_with("\\n"))
      rest.remove_prefix(2);
    else if (rest.starts_with("\n"))
      rest.remove_prefix(1);
    else
      continue;
    const size_t end = rest.find(kClose);
    if (end == std::string_view::npos || end == 0) continue;
    const std::string_view literal = rest.substr(0, end);
    if (literal.find_first_of("'\"{}+") != std::string_view::npos) continue;
    std::string text;
    for (size_t i = 0; i < literal.size(); ++i) {
      if (literal[i] == '\\' && i + 1 < literal.size()) {
        const char c = literal[++i];
        text += c == 'n' ? '\n' : c == 't' ? '\t' : c;
      } else {
        text += literal[i];
      }
    }
    return text;
  }
  return "";
}

std::string token_text_or_empty(const Tokenizer& tokenizer, std::optional<int32_t> id) {
  if (!id || *id < 0 || *id >= tokenizer.n_vocab()) return "";
  return tokenizer.token_text(*id);
}

}  // namespace

ChatTemplate ChatTemplate::make(TemplateKind kind, Dialect dialect, const Tokenizer& tokenizer) {
  return ChatTemplate(kind, std::move(dialect), token_text_or_empty(tokenizer, tokenizer.bos()),
                      token_text_or_empty(tokenizer, tokenizer.eos()));
}

// The markers follow llama.cpp's llm_chat_detect_template where it knows the format; the checks run from the
// most specific marker to the least (Kimi's <|im_middle|> templates also hold <|im_end|>, DeepSeek-V2's
// "User: "/"Assistant:" are plain words that other templates might contain).
std::optional<ChatTemplate> ChatTemplate::from_text(std::string_view tmpl, const Tokenizer& tokenizer) {
  Dialect d;
  if (contains(tmpl, "<|start|>") && contains(tmpl, "<|channel|>") && contains(tmpl, "<|message|>"))
    return make(TemplateKind::kHarmony, std::move(d), tokenizer);
  if (contains(tmpl, "]~!b[") && contains(tmpl, "]~b]")) return make(TemplateKind::kMinimax, std::move(d), tokenizer);
  if (contains(tmpl, "[gMASK]<sop>") && contains(tmpl, "<|assistant|>"))
    return make(TemplateKind::kGlm4, std::move(d), tokenizer);
  if (contains(tmpl, "<|im_middle|>")) {
    d.default_system = kKimiDefaultSystem;
    return make(TemplateKind::kKimiK2, std::move(d), tokenizer);
  }
  // Phi-4 also opens turns with <|im_start|> but separates the role with <|im_sep|>: not ChatML.
  if (contains(tmpl, "<|im_start|>") && !contains(tmpl, "<|im_sep|>")) {
    d.default_system = find_default_system(tmpl);
    // Qwen3.5 opens the think block in the generation prompt (`{{- '<think>\n' }}` on its own) and trims contents.
    d.prefills_think = contains(tmpl, "{{- '<think>\\n' }}");
    d.trims = d.prefills_think && contains(tmpl, "|trim");
    return make(TemplateKind::kChatml, std::move(d), tokenizer);
  }
  if (contains(tmpl, "[INST]")) {
    // Mixtral-8x7B-Instruct-v0.1's current template writes ' [INST] ' (llama.cpp's "mistral-v1"); its first
    // template wrote '[INST] ' with the reply glued to ' [/INST]'.
    d.spaced_inst = contains(tmpl, "' [INST] '");
    return make(TemplateKind::kMistral, std::move(d), tokenizer);
  }
  if (contains(tmpl, "<|start_header_id|>") && contains(tmpl, "<|end_header_id|>"))
    return make(TemplateKind::kLlama3, std::move(d), tokenizer);
  // DeepSeek-V4's template switches its replies' reasoning with drop_thinking.
  if (contains(tmpl, kDsAssistant) && contains(tmpl, kDsUser) && contains(tmpl, "drop_thinking")) {
    d.v4_turns = true;
    return make(TemplateKind::kDeepseek3, std::move(d), tokenizer);
  }
  // DeepSeek-V3.2's writes its calls as DSML and their results in <function_results>.
  if (contains(tmpl, kDsAssistant) && contains(tmpl, kDsUser) && contains(tmpl, "DSML") &&
      contains(tmpl, "<function_results>")) {
    d.v32_turns = true;
    return make(TemplateKind::kDeepseek3, std::move(d), tokenizer);
  }
  // DeepSeek-V3.1's opens a reply after a user message with "</think>" (unless it continues a thinking prefix).
  if (contains(tmpl, kDsAssistant) && contains(tmpl, kDsUser) && contains(tmpl, "<｜Assistant｜></think>")) {
    d.v31_turns = true;
    return make(TemplateKind::kDeepseek3, std::move(d), tokenizer);
  }
  if (contains(tmpl, kDsAssistant) && contains(tmpl, kDsUser)) {
    d.joins_systems = contains(tmpl, "is_first_sp");
    d.assistant_after_user = contains(tmpl, "is_last_user");
    d.strips_think = contains(tmpl, "</think>");
    d.prefills_think = contains(tmpl, "<｜Assistant｜><think>");
    return make(TemplateKind::kDeepseek3, std::move(d), tokenizer);
  }
  if (contains(tmpl, "User: ") && contains(tmpl, "Assistant:"))
    return make(TemplateKind::kDeepseek2, std::move(d), tokenizer);
  return std::nullopt;
}

ChatTemplate ChatTemplate::detect(const gguf::GgufFile& file, const Tokenizer& tokenizer, std::string* warning) {
  // A value that is not a string (a broken or hand-edited file) is a template hetmoe does not know, not a reason to
  // refuse the model.
  const gguf::Value* value = file.find("tokenizer.chat_template");
  const std::string* tmpl = value ? value->as_string() : nullptr;
  if (tmpl && !tmpl->empty()) {
    if (std::optional<ChatTemplate> t = from_text(*tmpl, tokenizer)) return std::move(*t);
  }
  if (warning) {
    *warning = value && !(tmpl && tmpl->empty())
                   ? fmt::format(
                         "{}: tokenizer.chat_template is not a format hetmoe knows; using the generic "
                         "'### User:' format (choose one with --chat-template)",
                         file.path())
                   : fmt::format(
                         "{}: no tokenizer.chat_template; using the generic '### User:' format (choose one "
                         "with --chat-template)",
                         file.path());
  }
  return make(TemplateKind::kGeneric, Dialect{}, tokenizer);
}

std::optional<ChatTemplate> ChatTemplate::by_name(std::string_view name, const Tokenizer& tokenizer) {
  Dialect d;
  if (name == "deepseek3") return make(TemplateKind::kDeepseek3, std::move(d), tokenizer);
  if (name == "deepseek-r1") {
    d.joins_systems = false;
    d.strips_think = true;
    d.prefills_think = true;
    return make(TemplateKind::kDeepseek3, std::move(d), tokenizer);
  }
  if (name == "deepseek-v3.1") {
    d.v31_turns = true;
    return make(TemplateKind::kDeepseek3, std::move(d), tokenizer);
  }
  if (name == "deepseek-v3.2") {
    d.v32_turns = true;
    return make(TemplateKind::kDeepseek3, std::move(d), tokenizer);
  }
  if (name == "deepseek-v4") {
    d.v4_turns = true;
    return make(TemplateKind::kDeepseek3, std::move(d), tokenizer);
  }
  if (name == "deepseek2") return make(TemplateKind::kDeepseek2, std::move(d), tokenizer);
  if (name == "chatml" || name == "qwen3") return make(TemplateKind::kChatml, std::move(d), tokenizer);
  if (name == "qwen3.5") {
    d.prefills_think = true;
    d.trims = true;
    return make(TemplateKind::kChatml, std::move(d), tokenizer);
  }
  if (name == "mistral") return make(TemplateKind::kMistral, std::move(d), tokenizer);
  if (name == "llama3") return make(TemplateKind::kLlama3, std::move(d), tokenizer);
  if (name == "kimi-k2") {
    d.default_system = kKimiDefaultSystem;
    return make(TemplateKind::kKimiK2, std::move(d), tokenizer);
  }
  if (name == "glm4") return make(TemplateKind::kGlm4, std::move(d), tokenizer);
  if (name == "minimax-m2") return make(TemplateKind::kMinimax, std::move(d), tokenizer);
  if (name == "gpt-oss") return make(TemplateKind::kHarmony, std::move(d), tokenizer);
  if (name == "generic") return make(TemplateKind::kGeneric, std::move(d), tokenizer);
  return std::nullopt;
}

std::vector<std::string> ChatTemplate::names() {
  return {"deepseek3", "deepseek-r1", "deepseek-v3.1", "deepseek-v3.2", "deepseek-v4", "deepseek2", "chatml", "qwen3.5",
          "mistral",   "llama3",      "kimi-k2",       "glm4",          "minimax-m2",  "gpt-oss",   "generic"};
}

std::string ChatTemplate::name() const {
  switch (kind_) {
    case TemplateKind::kDeepseek3:
      if (dialect_.v32_turns) return "deepseek-v3.2";
      if (dialect_.v31_turns) return "deepseek-v3.1";
      return dialect_.v4_turns ? "deepseek-v4" : dialect_.strips_think ? "deepseek-r1" : "deepseek3";
    case TemplateKind::kDeepseek2:
      return "deepseek2";
    case TemplateKind::kChatml:
      return dialect_.trims ? "qwen3.5" : "chatml";
    case TemplateKind::kMistral:
      return "mistral";
    case TemplateKind::kLlama3:
      return "llama3";
    case TemplateKind::kKimiK2:
      return "kimi-k2";
    case TemplateKind::kGlm4:
      return "glm4";
    case TemplateKind::kMinimax:
      return "minimax-m2";
    case TemplateKind::kHarmony:
      return "gpt-oss";
    case TemplateKind::kGeneric:
      return "generic";
  }
  return "generic";
}

bool ChatTemplate::reads_think_blocks() const {
  switch (kind_) {
    case TemplateKind::kChatml:
    case TemplateKind::kGlm4:
    case TemplateKind::kMinimax:
      return true;
    case TemplateKind::kDeepseek3:
      // V3.1's writes a reply's content as given (after results) or after its first </think>: no reasoning read.
      return dialect_.strips_think || dialect_.v32_turns || dialect_.v4_turns;
    default:
      return false;
  }
}

bool ChatTemplate::takes_developer() const {
  return kind_ == TemplateKind::kDeepseek3 && (dialect_.v32_turns || dialect_.v4_turns);
}

ToolCallFormat ChatTemplate::tool_call_format() const {
  if (kind_ == TemplateKind::kChatml) return dialect_.trims ? ToolCallFormat::kXml : ToolCallFormat::kHermes;
  if (kind_ == TemplateKind::kGlm4) return ToolCallFormat::kGlm;
  if (kind_ == TemplateKind::kMinimax) return ToolCallFormat::kMinimax;
  if (kind_ == TemplateKind::kKimiK2) return ToolCallFormat::kKimi;
  if (kind_ == TemplateKind::kHarmony) return ToolCallFormat::kHarmony;
  if (kind_ == TemplateKind::kDeepseek3 && dialect_.v32_turns) return ToolCallFormat::kDsmlFunctionCalls;
  if (kind_ == TemplateKind::kDeepseek3 && dialect_.v4_turns) return ToolCallFormat::kDsmlToolCalls;
  // V3.1's, like R1's, writes calls and results but no tool list.
  if (kind_ == TemplateKind::kDeepseek3 && dialect_.v31_turns) return ToolCallFormat::kDeepseekV31;
  // V3's, V3-0324's and R1's templates write calls and results (not the tools: they reach the model through the
  // client's system prompt).
  if (kind_ == TemplateKind::kDeepseek3) return ToolCallFormat::kDeepseekR1;
  return ToolCallFormat::kNone;
}

std::string ChatTemplate::render(std::span<const ChatMessage> messages, const RenderOptions& options) const {
  check_roles(messages, options, name(), tool_call_format() != ToolCallFormat::kNone, takes_developer());
  if (tool_call_format() == ToolCallFormat::kHermes && uses_tools(messages, options))
    return render_chatml_tools(messages, options);
  if (tool_call_format() == ToolCallFormat::kXml && uses_tools(messages, options))
    return render_qwen35_tools(messages, options);
  switch (kind_) {
    case TemplateKind::kDeepseek3:
      return render_deepseek3(messages, options);
    case TemplateKind::kDeepseek2:
      return render_deepseek2(messages, options);
    case TemplateKind::kChatml:
      return render_chatml(messages, options);
    case TemplateKind::kMistral:
      return render_mistral(messages);
    case TemplateKind::kLlama3:
      return render_llama3(messages, options);
    case TemplateKind::kKimiK2:
      return render_kimi_k2(messages, options);
    case TemplateKind::kGlm4:
      return render_glm4(messages, options);
    case TemplateKind::kMinimax:
      return render_minimax(messages, options);
    case TemplateKind::kHarmony:
      return render_harmony(messages, options);
    case TemplateKind::kGeneric:
      return render_generic(messages, options);
  }
  return render_generic(messages, options);
}

// deepseek-ai/DeepSeek-V3 (and V2.5): bos + the system messages (wherever they stand) joined by "\n\n", then
// "<｜User｜>u" and "<｜Assistant｜>a<｜end▁of▁sentence｜>"; the generation prompt is "<｜Assistant｜>".
// deepseek-ai/DeepSeek-R1: only the last system message counts, a past reply keeps only what follows its last
// "</think>", and the generation prompt is "<｜Assistant｜><think>\n".
// DeepSeek-V3-0324: "<｜Assistant｜>" follows every user turn instead of opening the reply, and the generation
// prompt is written only when the conversation does not end with a user turn.
// DeepSeek-R1 and V3 with tools (R1's template as llama.cpp's models/templates keeps it for the R1 distills; V3's
// writes them alike): a reply's calls
// "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```
// <｜tool▁call▁end｜>...<｜tool▁calls▁end｜>", results "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>r
// <｜tool▁output▁end｜>...<｜tool▁outputs▁end｜>"; no tool list. V3's own template closes a calls block only after its
// second call (a one-call reply stays open); hetmoe closes every block, as llama.cpp repairs it and V3-0324 writes it.
// DeepSeek-V3-0324 with tools: each calling reply opens its own block after its content (the "<｜Assistant｜>" is the
// user turn's), closes the results before it, and numbers its results afresh.
// DeepSeek-V3.2 and V4: render_dsml.
std::string ChatTemplate::render_deepseek3(std::span<const ChatMessage> messages, const RenderOptions& options) const {
  if (dialect_.v4_turns || dialect_.v32_turns) return render_dsml(messages, options);
  if (dialect_.v31_turns) return render_deepseek_v31(messages, options);
  std::string system = ds_system(messages, dialect_.joins_systems);
  std::string out = bos_ + system;
  bool last_is_user = false;
  // R1's calls and results: the first call of the conversation opens the calls block with <｜Assistant｜>, later ones
  // with a newline; the first result opens the outputs block, later ones a newline; the reply after results follows
  // their end without <｜Assistant｜> (the template's flags are never reset).
  bool called = false, answered = false, in_results = false;
  for (const ChatMessage& m : messages) {
    if (m.role == "user") {
      out += kDsUser;
      out += m.content;
      if (dialect_.assistant_after_user) out += kDsAssistant;
      last_is_user = true;
      in_results = false;
    } else if (m.role == "assistant") {
      last_is_user = false;
      if (!m.tool_calls.empty()) {
        // V3-0324: each calling reply opens its own block after its content, the results before it closed, its own
        // results numbered afresh; R1 and V3 keep one block open for the conversation.
        if (dialect_.assistant_after_user) {
          if (in_results) out += "<｜tool▁outputs▁end｜>";
          out += m.content;
          called = answered = false;
        }
        in_results = false;
        for (const ToolCall& call : m.tool_calls) {
          if (!called && !dialect_.assistant_after_user) out += kDsAssistant;
          out += called ? "\n<｜tool▁call▁begin｜>" : "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>";
          called = true;
          out += "function<｜tool▁sep｜>" + call.name + "\n```json\n" + call.arguments + "\n```<｜tool▁call▁end｜>";
        }
        out += "<｜tool▁calls▁end｜>";
        out += kDsEndOfSentence;
        // A call's content is null in the API (V3-0324 wrote it before the calls).
        if (m.content.empty() || dialect_.assistant_after_user) continue;
      }
      if (in_results) {
        out += "<｜tool▁outputs▁end｜>" + m.content;
        in_results = false;
      } else {
        if (!dialect_.assistant_after_user) out += kDsAssistant;
        out += dialect_.strips_think ? after_last(m.content, "</think>") : std::string_view(m.content);
      }
      out += kDsEndOfSentence;
    } else if (m.role == "tool") {
      out += answered ? "\n<｜tool▁output▁begin｜>" : "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>";
      answered = in_results = true;
      out += m.content + "<｜tool▁output▁end｜>";
    }
  }
  if (in_results) {
    out += "<｜tool▁outputs▁end｜>";
    return out;  // the reply follows the results
  }
  if (options.add_generation_prompt) {
    if (!dialect_.assistant_after_user) {
      out += kDsAssistant;
      if (dialect_.prefills_think) out += "<think>\n";
    } else if (!last_is_user) {
      out += kDsAssistant;
    }
  }
  return out;
}

// deepseek-ai/DeepSeek-V3.1 (its template as llama.cpp's models/templates keeps it): bos + the system messages joined
// by "\n\n", "<｜User｜>u"; a reply after a user message opens "<｜Assistant｜></think>" and keeps what follows its
// first "</think>"; a reply's calls follow its content as "<｜tool▁calls▁begin｜>" and per call
// "<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>", then "<｜tool▁calls▁end｜><｜end▁of▁sentence｜>";
// each result "<｜tool▁output▁begin｜>r<｜tool▁output▁end｜>", the reply after results written whole, straight after
// them. The generation prompt only after a user message: "<｜Assistant｜>" then "<think>" thinking, else "</think>".
std::string ChatTemplate::render_deepseek_v31(std::span<const ChatMessage> messages,
                                              const RenderOptions& options) const {
  std::string out = bos_ + ds_system(messages, /*joins=*/true);
  bool last_is_user = false, after_results = false;
  for (const ChatMessage& m : messages) {
    if (m.role == "user") {
      out += kDsUser;
      out += m.content;
      last_is_user = true;
      after_results = false;
    } else if (m.role == "assistant" && !m.tool_calls.empty()) {
      if (last_is_user) out += "<｜Assistant｜></think>";
      last_is_user = after_results = false;
      out += m.content + "<｜tool▁calls▁begin｜>";
      for (const ToolCall& call : m.tool_calls)
        out += "<｜tool▁call▁begin｜>" + call.name + "<｜tool▁sep｜>" + call.arguments + "<｜tool▁call▁end｜>";
      out += "<｜tool▁calls▁end｜>";
      out += kDsEndOfSentence;
    } else if (m.role == "assistant") {
      if (last_is_user) out += "<｜Assistant｜></think>";
      last_is_user = false;
      if (after_results) {
        out += m.content;
      } else {
        const size_t close = m.content.find("</think>");
        out += close == std::string::npos
                   ? std::string_view(m.content)
                   : std::string_view(m.content).substr(close + std::string_view("</think>").size());
      }
      after_results = false;
      out += kDsEndOfSentence;
    } else if (m.role == "tool") {
      last_is_user = false;
      after_results = true;
      out += "<｜tool▁output▁begin｜>" + m.content + "<｜tool▁output▁end｜>";
    }
  }
  if (options.add_generation_prompt && last_is_user) {
    out += kDsAssistant;
    out += options.enable_thinking ? "<think>" : "</think>";
  }
  return out;
}

namespace {

constexpr std::string_view kDsml = "｜DSML｜";

// The tool lists' headers and footers of DeepSeek-V3.2's and V4's templates (before and after the functions' JSON
// schemas, one per line).
constexpr std::string_view kV32ToolsHeader =
    "## Tools\n\nYou have access to a set of tools you can use to answer the user's question.\nYou can invoke "
    "functions by writing a \"<｜DSML｜function_calls>\" block like the following as part of your reply to the user:\n"
    "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"$FUNCTION_NAME\">\n<｜DSML｜parameter name=\"$PARAMETER_NAME\" "
    "string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n...\n</｜DSML｜invoke>\n<｜DSML｜invoke "
    "name=\"$FUNCTION_NAME2\">\n...\n</｜DSML｜invoke>\n</｜DSML｜function_calls>\n\nString and scalar parameters "
    "should "
    "be specified as is without any escaping or quotes, while lists and objects should use JSON format. The "
    "\"string\" attribute should be set to \"true\" for string type parameters and \"false\" for other types "
    "(numbers, booleans, arrays, objects).\n\nIf the thinking_mode is enabled, then after function results you "
    "should strongly consider outputting a thinking block. Here is an example:\n\n<｜DSML｜function_calls>\n...\n"
    "</｜DSML｜function_calls>\n\n<function_results>\n...\n</function_results>\n\n<think>...thinking about "
    "results</think>\n\nHere are the functions available in JSONSchema format:\n<functions>\n";
constexpr std::string_view kV32ToolsFooter = "</functions>\n";
constexpr std::string_view kV4ToolsHeader =
    "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools by "
    "writing a \"<｜DSML｜tool_calls>\" block like the following:\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke "
    "name=\"$TOOL_NAME\">\n<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE"
    "</｜DSML｜parameter>\n...\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"$TOOL_NAME2\">\n...\n</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>\n\nString parameters should be specified as is and set `string=\"true\"`. For all other "
    "types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\nIf "
    "thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
    "<think>...</think> BEFORE any tool calls or final response.\n\nOtherwise, output directly after </think> with "
    "tool calls or final response.\n\n### Available Tool Schemas\n\n";
constexpr std::string_view kV4ToolsFooter =
    "\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";

}  // namespace

// deepseek-ai/DeepSeek-V3.2 and DeepSeek-V4 (the reference GGUFs' templates): bos + the system messages joined by
// "\n\n" + the tool list; then the turns as the Dialect's v32_turns and v4_turns say. A reply that keeps its
// reasoning writes "<think>" + its reasoning + "</think>" (a stored reply holds its reasoning up to its first
// "</think>"; one cut off inside its think block is all reasoning); one that does not writes "</think>" and what
// follows its last "</think>". Its calls follow its content after "\n\n" as one DSML block.
std::string ChatTemplate::render_dsml(std::span<const ChatMessage> messages, const RenderOptions& options) const {
  const bool v4 = dialect_.v4_turns, thinking = options.enable_thinking;
  std::string system = ds_system(messages, true);
  if (!options.tools.empty()) {
    std::string tools(v4 ? kV4ToolsHeader : kV32ToolsHeader);
    for (const nlohmann::ordered_json& tool : options.tools) {
      const auto type = tool.find("type"), function = tool.find("function");
      if (type != tool.end() && *type == "function" && function != tool.end()) tools += python_json(*function) + "\n";
    }
    tools += v4 ? kV4ToolsFooter : kV32ToolsFooter;
    system = system.empty() ? tools : system + "\n\n" + tools;
  }
  // V3.2 counts user and developer messages, V4 tool results too, for "after the last user message".
  std::ptrdiff_t last_user = -1;
  bool has_results = false;
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role == "user" || role == "developer" || (v4 && role == "tool")) last_user = static_cast<std::ptrdiff_t>(i);
    has_results = has_results || messages[i].role == "tool";
  }
  std::string out = bos_ + system;
  // A reply's think block: kept (its reasoning), dropped ("</think>" and the text after it), or none (V3.2's reply
  // that follows neither a user message nor results).
  enum class Think { kKeep, kDrop, kNone };
  auto reply = [&](const ChatMessage& m, Think think) {
    std::string_view text = m.content;
    if (think == Think::kKeep) {
      if (text.starts_with("<think>")) {
        text.remove_prefix(7);
        out += "<think>";
        out += text;
        if (!contains(text, "</think>")) out += "</think>";
      } else {
        out += contains(text, "</think>") ? "<think>" : "<think></think>";
        out += text;
      }
    } else if (think == Think::kDrop) {
      out += "</think>";
      out += after_last(text, "</think>");
    } else {
      out += text;
    }
    if (!m.tool_calls.empty()) {
      const std::string_view block = v4 ? "tool_calls>" : "function_calls>";
      out += fmt::format("\n\n<{}{}\n", kDsml, block);
      for (const ToolCall& call : m.tool_calls) {
        out += fmt::format("<{}invoke name=\"{}\">\n", kDsml, call.name);
        const nlohmann::ordered_json args = call_arguments(call, name());
        for (const auto& [key, value] : args.items())
          out += fmt::format("<{0}parameter name=\"{1}\" string=\"{2}\">{3}</{0}parameter>\n", kDsml, key,
                             value.is_string() ? "true" : "false", argument_text(value));
        if (v4 && args.empty()) out += "\n";
        out += fmt::format("</{}invoke>\n", kDsml);
      }
      out += fmt::format("</{}{}", kDsml, block);
    }
    out += kDsEndOfSentence;
  };
  if (v4) {
    bool in_user = false;
    for (size_t i = 0; i < messages.size(); ++i) {
      const ChatMessage& m = messages[i];
      if (m.role == "user" || m.role == "developer" || m.role == "tool") {
        out += in_user ? std::string_view("\n\n") : kDsUser;
        in_user = true;
        out += m.role == "tool" ? "<tool_result>" + m.content + "</tool_result>" : m.content;
      } else if (m.role == "assistant") {
        in_user = false;
        out += kDsAssistant;
        // The template's drop_thinking (default true) keeps only the last reply's reasoning, unless tools are in play.
        const bool after_last_user = static_cast<std::ptrdiff_t>(i) > last_user;
        const bool keep = thinking && (!options.tools.empty() || after_last_user || has_results);
        reply(m, keep ? Think::kKeep : Think::kDrop);
      }
    }
    if (options.add_generation_prompt) {
      out += kDsAssistant;
      out += thinking ? "<think>" : "</think>";
    }
    return out;
  }
  // V3.2: a reply opens with <｜Assistant｜> after a user message, with "\n\n" after a block of results, with
  // nothing else.
  enum class Pending { kNone, kAssistant, kResults } pending = Pending::kNone;
  std::ptrdiff_t caller = -1;  // the last reply with calls
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user") {
      out += kDsUser;
      out += m.content;
      pending = Pending::kAssistant;
    } else if (m.role == "assistant") {
      if (pending == Pending::kAssistant) out += kDsAssistant;
      if (pending == Pending::kResults) out += "\n\n";
      const bool keep = thinking && static_cast<std::ptrdiff_t>(i) > last_user;
      reply(m, pending == Pending::kNone ? Think::kNone : keep ? Think::kKeep : Think::kDrop);
      pending = Pending::kNone;
      if (!m.tool_calls.empty()) caller = static_cast<std::ptrdiff_t>(i);
    } else if (m.role == "tool") {
      // The template numbers a result by its distance from the reply with the calls, and closes the block at the
      // last call's result.
      if (caller < 0) fail("chat template {}: a tool message without an assistant tool call before it", name());
      const auto order = static_cast<std::ptrdiff_t>(i) - caller;
      if (order == 1) out += "\n\n<function_results>";
      out += "\n<result>" + m.content + "</result>";
      if (order == static_cast<std::ptrdiff_t>(messages[caller].tool_calls.size())) {
        out += "\n</function_results>";
        pending = Pending::kResults;
      }
    }
  }
  if (options.add_generation_prompt && pending != Pending::kNone) {
    out += pending == Pending::kAssistant ? kDsAssistant : std::string_view("\n\n");
    out += thinking ? "<think>" : "<think></think>";
  }
  return out;
}

// deepseek-ai/DeepSeek-V2-Lite-Chat (and V2-Chat, deepseek-llm-chat): bos, then in order "system\n\n",
// "User: u\n\n", "Assistant: a" + eos; the generation prompt is "Assistant:" (no space: the model writes it).
std::string ChatTemplate::render_deepseek2(std::span<const ChatMessage> messages, const RenderOptions& options) const {
  std::string out = bos_;
  for (const ChatMessage& m : messages) {
    if (m.role == "user")
      out += "User: " + m.content + "\n\n";
    else if (m.role == "assistant")
      out += "Assistant: " + m.content + eos_;
    else
      out += m.content + "\n\n";
  }
  if (options.add_generation_prompt) out += "Assistant:";
  return out;
}

// Qwen/Qwen3-30B-A3B (ChatML): "<|im_start|>role\ncontent<|im_end|>\n" per message, a first system message
// first. Replies before the last user query lose their think block; replies after it (a prefilled answer) keep
// their reasoning in a normalised "<think>\n...\n</think>\n\n" block. enable_thinking = false appends an empty
// think block to the generation prompt. Qwen2-style templates also write their default system prompt.
// Qwen/Qwen3.5: every content trimmed of surrounding whitespace, every reply after the last query in a think block
// (an empty one too), and with thinking on the generation prompt opens "<think>\n".
std::string ChatTemplate::render_chatml(std::span<const ChatMessage> messages, const RenderOptions& options) const {
  auto text = [&](const std::string& c) { return dialect_.trims ? std::string(strip(c, kWhitespace)) : c; };
  std::string out;
  if (!messages.empty()) {
    if (messages[0].role == "system")
      out += "<|im_start|>system\n" + text(messages[0].content) + "<|im_end|>\n";
    else if (!dialect_.default_system.empty())
      out += "<|im_start|>system\n" + dialect_.default_system + "<|im_end|>\n";
  }
  const size_t last_query = last_query_index(messages, text);
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user" || (m.role == "system" && i > 0)) {
      out += "<|im_start|>" + m.role + "\n" + text(m.content) + "<|im_end|>\n";
    } else if (m.role == "assistant") {
      const std::string whole = text(m.content);
      const auto [reasoning, content] = split_reply(whole, false);
      out += "<|im_start|>assistant\n";
      if (i > last_query && (dialect_.trims || i + 1 == messages.size() || !reasoning.empty())) {
        out += "<think>\n";
        out += dialect_.trims ? strip(reasoning, kWhitespace) : strip(reasoning, "\n");
        out += "\n</think>\n\n";
        out += lstrip(content, "\n");
      } else {
        out += content;
      }
      out += "<|im_end|>\n";
    }
  }
  if (options.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    if (!options.enable_thinking)
      out += "<think>\n\n</think>\n\n";
    else if (dialect_.prefills_think)
      out += "<think>\n";
  }
  return out;
}

// Qwen/Qwen3 with tools or tool messages: the system turn opens with the first system message (if any) and "\n\n",
// then "# Tools" with each tool as Python's json.dumps prints it inside <tools></tools> and the call instructions; a
// reply's calls follow its content, each "<tool_call>\n{"name": "N", "arguments": A}\n</tool_call>" with a newline
// between (and after content); consecutive tool messages share one user turn, each in
// "\n<tool_response>\n...\n</tool_response>". Otherwise as render_chatml.
std::string ChatTemplate::render_chatml_tools(std::span<const ChatMessage> messages,
                                              const RenderOptions& options) const {
  std::string out;
  const bool first_system = !messages.empty() && messages[0].role == "system";
  if (!options.tools.empty()) {
    out += "<|im_start|>system\n";
    if (first_system) out += messages[0].content + "\n\n";
    out +=
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
        "function signatures within <tools></tools> XML tags:\n<tools>";
    for (const nlohmann::ordered_json& tool : options.tools) out += "\n" + python_json(tool);
    out +=
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
        "<args-json-object>}\n</tool_call><|im_end|>\n";
  } else if (first_system) {
    out += "<|im_start|>system\n" + messages[0].content + "<|im_end|>\n";
  }
  const size_t last_query = last_query_index(messages, [](const std::string& c) { return c; });
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user" || (m.role == "system" && i > 0)) {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    } else if (m.role == "assistant") {
      const auto [reasoning, content] = split_reply(m.content, false);
      out += "<|im_start|>assistant\n";
      if (i > last_query && (i + 1 == messages.size() || !reasoning.empty())) {
        out += "<think>\n";
        out += strip(reasoning, "\n");
        out += "\n</think>\n\n";
        out += lstrip(content, "\n");
      } else {
        out += content;
      }
      for (size_t k = 0; k < m.tool_calls.size(); ++k) {
        if (k > 0 || !content.empty()) out += "\n";
        out += "<tool_call>\n{\"name\": \"" + m.tool_calls[k].name + "\", \"arguments\": " + m.tool_calls[k].arguments +
               "}\n</tool_call>";
      }
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {
      if (i == 0 || messages[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n" + m.content + "\n</tool_response>";
      if (i + 1 == messages.size() || messages[i + 1].role != "tool") out += "<|im_end|>\n";
    }
  }
  if (options.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    if (!options.enable_thinking) out += "<think>\n\n</think>\n\n";
  }
  return out;
}

// Qwen/Qwen3.5 with tools or tool messages: the system turn holds "# Tools", the tool list (json.dumps, one per line
// inside <tools></tools>) and the call instructions, then "\n\n" and the first system message when it is not blank;
// contents are trimmed; a reply's calls follow its content ("\n\n" before the first when there is content, "\n"
// between), each "<tool_call>\n<function=NAME>\n" + "<parameter=K>\nV\n</parameter>\n" per argument (objects and
// arrays as JSON, anything else as Python's str) + "</function>\n</tool_call>"; tool results go into a user turn
// opened after a message of another role, each "\n<tool_response>\nR\n</tool_response>". Otherwise as
// render_chatml.
std::string ChatTemplate::render_qwen35_tools(std::span<const ChatMessage> messages,
                                              const RenderOptions& options) const {
  auto trim = [](const std::string& c) { return std::string(strip(c, kWhitespace)); };
  std::string out;
  const bool first_system = !messages.empty() && messages[0].role == "system";
  if (!options.tools.empty()) {
    out += "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>";
    for (const nlohmann::ordered_json& tool : options.tools) out += "\n" + python_json(tool);
    out +=
        "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
        "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
        "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple "
        "lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the "
        "specified format: an inner <function=...></function> block must be nested within <tool_call></tool_call> "
        "XML tags\n- Required parameters MUST be specified\n- You may provide optional reasoning for your function "
        "call in natural language BEFORE the function call, but NOT after\n- If there is no function call "
        "available, answer the question like normal with your current knowledge and do not tell the user about "
        "function calls\n</IMPORTANT>";
    if (first_system && !trim(messages[0].content).empty()) out += "\n\n" + trim(messages[0].content);
    out += "<|im_end|>\n";
  } else if (first_system) {
    out += "<|im_start|>system\n" + trim(messages[0].content) + "<|im_end|>\n";
  }
  const size_t last_query = last_query_index(messages, trim);
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const std::string content = trim(m.content);
    if (m.role == "system") {
      if (i > 0) fail("chat template qwen3.5: a system message must come first");
    } else if (m.role == "user") {
      out += "<|im_start|>user\n" + content + "<|im_end|>\n";
    } else if (m.role == "assistant") {
      const auto [reasoning, reply] = split_reply(content, false);
      std::string text(reply);
      out += "<|im_start|>assistant\n";
      if (i > last_query) out += "<think>\n" + std::string(strip(reasoning, kWhitespace)) + "\n</think>\n\n";
      out += text;
      for (size_t k = 0; k < m.tool_calls.size(); ++k) {
        const ToolCall& call = m.tool_calls[k];
        if (k == 0) {
          out += strip(text, kWhitespace).empty() ? "" : "\n\n";
        } else {
          out += "\n";
        }
        out += "<tool_call>\n<function=" + call.name + ">\n";
        const nlohmann::ordered_json args = call_arguments(call, "qwen3.5");
        for (const auto& [key, value] : args.items()) {
          std::string v;
          if (value.is_object() || value.is_array()) {
            v = python_json(value);
          } else if (value.is_string()) {
            v = value.get<std::string>();
          } else if (value.is_boolean()) {
            v = value.get<bool>() ? "True" : "False";
          } else if (value.is_null()) {
            v = "None";
          } else {
            v = value.dump();
          }
          out += "<parameter=" + key + ">\n" + v + "\n</parameter>\n";
        }
        out += "</function>\n</tool_call>";
      }
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {
      if (i > 0 && messages[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n" + content + "\n</tool_response>";
      if (i + 1 == messages.size() || messages[i + 1].role != "tool") out += "<|im_end|>\n";
    }
  }
  if (options.add_generation_prompt)
    out +=
        options.enable_thinking ? "<|im_start|>assistant\n<think>\n" : "<|im_start|>assistant\n<think>\n\n</think>\n\n";
  return out;
}

// mistralai/Mixtral-8x7B-Instruct-v0.1: bos, then " [INST] u [/INST]" and " a" + eos, strictly alternating from
// a user turn; an optional first system message is prepended to the first user message with "\n\n". The
// original template ("[INST] u [/INST]a</s>") had no system message: hetmoe prepends it in the same way. There
// is no generation prompt: " [/INST]" already opens the reply.
std::string ChatTemplate::render_mistral(std::span<const ChatMessage> messages) const {
  size_t first = 0;
  std::string system;
  if (!messages.empty() && messages[0].role == "system") {
    system = messages[0].content;
    first = 1;
  }
  const std::string_view lead = dialect_.spaced_inst ? " " : "";
  std::string out = bos_;
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const bool user_turn = (i - first) % 2 == 0;
    if (m.role == "system")
      fail("chat template mistral: a system message may only come first (message {} is one)", i + 1);
    if ((m.role == "user") != user_turn)
      fail(
          "chat template mistral: after the optional system message, roles must alternate user/assistant "
          "(message {} is {})",
          i + 1, m.role);
    if (m.role == "user") {
      out += lead;
      out += "[INST] ";
      if (i == first && first == 1) out += system + "\n\n";
      out += m.content + " [/INST]";
    } else {
      out += lead;
      out += m.content + eos_;
    }
  }
  // A lone system message has no user turn to go into.
  if (first == 1 && messages.size() == 1) fail("chat template mistral: a system message needs a user message after it");
  return out;
}

// meta-llama/Meta-Llama-3-8B-Instruct: bos before the first message, then
// "<|start_header_id|>role<|end_header_id|>\n\n" + trimmed content + "<|eot_id|>" for each message in place.
std::string ChatTemplate::render_llama3(std::span<const ChatMessage> messages, const RenderOptions& options) const {
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (i == 0) out += bos_;
    out += "<|start_header_id|>" + messages[i].role + "<|end_header_id|>\n\n";
    out += strip(messages[i].content, kWhitespace);
    out += "<|eot_id|>";
  }
  if (options.add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

// moonshotai/Kimi-K2-Instruct: "<|im_system|>system<|im_middle|>...<|im_end|>" (or <|im_user|>user,
// <|im_assistant|>assistant) per message in place, no newlines and no bos; when the first message is not a
// system message the template writes "You are a helpful assistant" as one. Tools, calls and results as Moonshot's
// later templates write them (K2-Instruct-0905, K2-Thinking; the first K2 template declared tools the same way but
// dropped a reply's calls): the tools as JSON in a "tool_declare" system turn first; a reply's calls after its content
// in <|tool_calls_section_begin|>, each "<|tool_call_begin|>ID<|tool_call_argument_begin|>ARGS<|tool_call_end|>" with
// the model's own ids (functions.NAME:INDEX); a result as a "tool" system turn "## Return of ID\nresult".
std::string ChatTemplate::render_kimi_k2(std::span<const ChatMessage> messages, const RenderOptions& options) const {
  std::string out;
  if (!options.tools.empty()) {
    nlohmann::ordered_json tools = nlohmann::ordered_json::array();
    for (const nlohmann::ordered_json& tool : options.tools) tools.push_back(tool);
    out += "<|im_system|>tool_declare<|im_middle|>" + python_json(tools) + "<|im_end|>";
  }
  if (!messages.empty() && messages[0].role != "system")
    out += "<|im_system|>system<|im_middle|>" + dialect_.default_system + "<|im_end|>";
  for (const ChatMessage& m : messages) {
    if (m.role == "system") {
      out += "<|im_system|>system<|im_middle|>" + m.content;
    } else if (m.role == "user") {
      out += "<|im_user|>user<|im_middle|>" + m.content;
    } else if (m.role == "tool") {
      out += "<|im_system|>tool<|im_middle|>## Return of " + m.tool_call_id + "\n" + m.content;
    } else {
      out += "<|im_assistant|>assistant<|im_middle|>" + m.content;
      if (!m.tool_calls.empty()) {
        out += "<|tool_calls_section_begin|>";
        for (const ToolCall& call : m.tool_calls)
          out +=
              "<|tool_call_begin|>" + call.id + "<|tool_call_argument_begin|>" + call.arguments + "<|tool_call_end|>";
        out += "<|tool_calls_section_end|>";
      }
    }
    out += "<|im_end|>";
  }
  if (options.add_generation_prompt) out += "<|im_assistant|>assistant<|im_middle|>";
  return out;
}

namespace {

// The index of the last user message, or -1.
std::ptrdiff_t last_user(std::span<const ChatMessage> messages) {
  for (size_t i = messages.size(); i-- > 0;)
    if (messages[i].role == "user") return static_cast<std::ptrdiff_t>(i);
  return -1;
}

}  // namespace

// zai-org/GLM-4.6 (and 4.5, 4.7): "[gMASK]<sop>", then "<|system|>\ns", "<|user|>\nu" and "<|assistant|>" + a think
// block + "\n" + the trimmed reply; the think block keeps a reply's reasoning only after the last user message
// ("\n<think>r</think>"), else is empty ("\n<think></think>"). enable_thinking = false appends "/nothink" to user
// messages and an empty think block to the generation prompt "<|assistant|>".
// With tools (the template's `tojson(ensure_ascii=False)`, its trim_blocks whitespace): the list after
// "[gMASK]<sop>" as "<|system|>\n# Tools..." with one tool per line; a reply's calls after its text, each
// "\n<tool_call>name\n" + "<arg_key>k</arg_key>\n<arg_value>v</arg_value>\n" per argument (strings as they are,
// other values as JSON) + "</tool_call>"; a run of tool results opens with "<|observation|>", each
// "\n<tool_response>\nr\n</tool_response>".
std::string ChatTemplate::glm4_tools(const RenderOptions& options) const {
  if (options.tools.empty()) return "";
  std::string out =
      "<|system|>\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided "
      "with function signatures within <tools></tools> XML tags:\n<tools>\n";
  for (const nlohmann::ordered_json& tool : options.tools) out += python_json(tool) + "\n";
  out +=
      "</tools>\n\nFor each function call, output the function name and arguments within the following XML "
      "format:\n<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n<arg_value>{arg-value-1}</arg_value>\n"
      "<arg_key>{arg-key-2}</arg_key>\n<arg_value>{arg-value-2}</arg_value>\n...\n</tool_call>";
  return out;
}

std::string ChatTemplate::render_glm4(std::span<const ChatMessage> messages, const RenderOptions& options) const {
  std::string out = "[gMASK]<sop>" + glm4_tools(options);
  const std::ptrdiff_t last = last_user(messages);
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user") {
      out += "<|user|>\n" + m.content;
      if (!options.enable_thinking && !m.content.ends_with("/nothink")) out += "/nothink";
    } else if (m.role == "assistant") {
      const auto [reasoning, content] = split_reply(m.content, false);
      out += "<|assistant|>";
      const std::string_view r = strip(reasoning, kWhitespace);
      if (static_cast<std::ptrdiff_t>(i) > last && !reasoning.empty()) {
        out += "\n<think>";
        out += r;
        out += "</think>";
      } else {
        out += "\n<think></think>";
      }
      const std::string_view c = strip(content, kWhitespace);
      if (!c.empty()) {
        out += "\n";
        out += c;
      }
      for (const ToolCall& call : m.tool_calls) {
        out += "\n<tool_call>" + call.name + "\n";
        const nlohmann::ordered_json args = call_arguments(call, "glm4");
        for (const auto& [key, value] : args.items())
          out += "<arg_key>" + key + "</arg_key>\n<arg_value>" + argument_text(value) + "</arg_value>\n";
        out += "</tool_call>";
      }
    } else if (m.role == "tool") {
      if (i == 0 || messages[i - 1].role != "tool") out += "<|observation|>";
      out += "\n<tool_response>\n" + m.content + "\n</tool_response>";
    } else {
      out += "<|system|>\n" + m.content;
    }
  }
  if (options.add_generation_prompt) {
    out += "<|assistant|>";
    if (!options.enable_thinking) out += "\n<think></think>";
  }
  return out;
}

// MiniMaxAI/MiniMax-M2: "]~!b[]~b]system\n" + the first message if it is a system message (else "You are a helpful
// assistant.") + "[e~[\n", then "]~b]user\nu[e~[\n" and "]~b]ai\n" + the reply + "[e~[\n"; a reply after the last
// user message keeps its reasoning as "<think>\nr\n</think>\n\n". Later system messages are not rendered. The
// generation prompt "]~b]ai\n<think>\n" opens the reasoning.
std::string ChatTemplate::render_minimax(std::span<const ChatMessage> messages, const RenderOptions& options) const {
  std::span<const ChatMessage> conversation = messages;
  std::string system = "You are a helpful assistant.";
  if (!messages.empty() && messages[0].role == "system") {
    if (!messages[0].content.empty()) system = messages[0].content;
    conversation = messages.subspan(1);
  }
  std::string out = "]~!b[]~b]system\n" + system;
  if (!options.tools.empty()) {
    // The template's tool list: each tool's function object, then an example call (its whitespace as the Jinja's
    // trim_blocks and "-" markers leave it).
    out +=
        "\n\n# Tools\nYou may call one or more tools to assist with the user query.\nHere are the tools available in "
        "JSONSchema format:\n\n<tools>\n";
    for (const nlohmann::ordered_json& tool : options.tools)
      out += "<tool>" + python_json(tool.contains("function") ? tool["function"] : tool) + "</tool>\n";
    out +=
        "</tools>\n\nWhen making tool calls, use XML format to invoke tools and pass parameters:\n\n"
        "<minimax:tool_call>\n<invoke name=\"tool-name-1\">\n<parameter "
        "name=\"param-key-1\">param-value-1</parameter>\n"
        "<parameter name=\"param-key-2\">param-value-2</parameter>\n...\n</invoke>\n</minimax:tool_call>";
  }
  out += "[e~[\n";
  const std::ptrdiff_t last = last_user(conversation);
  for (size_t i = 0; i < conversation.size(); ++i) {
    const ChatMessage& m = conversation[i];
    if (m.role == "user") {
      out += "]~b]user\n" + m.content + "[e~[\n";
    } else if (m.role == "assistant") {
      const auto [reasoning, content] = split_reply(m.content, true);
      out += "]~b]ai\n";
      if (!reasoning.empty() && static_cast<std::ptrdiff_t>(i) > last) {
        out += "<think>\n";
        out += reasoning;
        out += "\n</think>\n\n";
      }
      out += content;
      if (!m.tool_calls.empty()) {
        out += "\n<minimax:tool_call>\n";
        for (const ToolCall& call : m.tool_calls) {
          out += "<invoke name=\"" + call.name + "\">\n";
          const nlohmann::ordered_json args = call_arguments(call, "minimax-m2");
          for (const auto& [key, value] : args.items())
            out += "<parameter name=\"" + key + "\">" + argument_text(value) + "</parameter>\n";
          out += "</invoke>\n";
        }
        out += "</minimax:tool_call>";
      }
      out += "[e~[\n";
    } else if (m.role == "tool") {
      // A result needs the call it answers before it, as the template checks.
      bool called = false;
      for (size_t j = i; j-- > 0;)
        if (conversation[j].role == "assistant") {
          called = !conversation[j].tool_calls.empty();
          break;
        }
      if (!called) fail("chat template minimax-m2: a tool message without an assistant tool call before it");
      if (i == 0 || conversation[i - 1].role != "tool") out += "]~b]tool";
      out += "\n<response>" + m.content + "</response>";
      if (i + 1 == conversation.size() || conversation[i + 1].role != "tool") out += "[e~[\n";
    }
  }
  if (options.add_generation_prompt) out += "]~b]ai\n<think>\n";
  return out;
}

namespace {

// Jinja's truth of a value: none, false, 0, "" and empty arrays and objects are false.
bool truthy(const nlohmann::ordered_json* v) {
  if (!v || v->is_null()) return false;
  if (v->is_boolean()) return v->get<bool>();
  if (v->is_number()) return v->get<double>() != 0;
  if (v->is_string() || v->is_array() || v->is_object()) return !v->empty();
  return true;
}

const nlohmann::ordered_json* member(const nlohmann::ordered_json& j, const char* name) {
  if (!j.is_object()) return nullptr;
  const auto it = j.find(name);
  return it == j.end() ? nullptr : &*it;
}

// Python's str() of a JSON value, as Jinja's "+" and join write it (strings bare, True/False/None).
std::string python_str(const nlohmann::ordered_json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  if (v.is_null()) return "None";
  return python_json(v);
}

// Python's len() of a string: its code points (continuation bytes not counted).
size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (const char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

// `name in (schema.required or [])`: an item of the list (a substring, where a template passes a string).
bool is_required(const nlohmann::ordered_json& schema, const std::string& name) {
  const nlohmann::ordered_json* required = member(schema, "required");
  if (!truthy(required)) return false;
  if (required->is_string()) return contains(required->get_ref<const std::string&>(), name);
  if (!required->is_array()) return false;
  for (const nlohmann::ordered_json& r : *required)
    if (r.is_string() && r.get_ref<const std::string&>() == name) return true;
  return false;
}

bool has_type(const nlohmann::ordered_json& spec, std::string_view type) {
  const nlohmann::ordered_json* t = member(spec, "type");
  return t && t->is_string() && t->get_ref<const std::string&>() == type;
}

// gpt-oss's render_typescript_type: a JSON schema as the TypeScript-like type its template writes, with the
// whitespace its Jinja (trim_blocks, lstrip_blocks) leaves: a nested object's property types after a newline and 16
// spaces, a oneOf's variants joined by " | " and a newline. (The macro's "any" for unions of objects never applies:
// the flag it sets inside its loop does not outlive the loop in Jinja.)
std::string harmony_type(const nlohmann::ordered_json& spec) {
  const nlohmann::ordered_json* type = member(spec, "type");
  if (has_type(spec, "array")) {
    std::string out = "any[]";
    if (const nlohmann::ordered_json* items = member(spec, "items"); truthy(items)) {
      if (has_type(*items, "string")) {
        out = "string[]";
      } else if (has_type(*items, "number") || has_type(*items, "integer")) {
        out = "number[]";
      } else if (has_type(*items, "boolean")) {
        out = "boolean[]";
      } else {
        const std::string inner = harmony_type(*items);
        out = inner == "object | object" || utf8_length(inner) > 50 ? "any[]" : inner + "[]";
      }
    }
    return truthy(member(spec, "nullable")) ? out + " | null" : out;
  }
  if (type && type->is_array() && !type->empty()) {
    std::string out;
    for (size_t i = 0; i < type->size(); ++i) out += (i ? " | " : "") + python_str((*type)[i]);
    return out;
  }
  if (const nlohmann::ordered_json* variants = member(spec, "oneOf"); truthy(variants)) {
    std::string out;
    for (size_t i = 0; variants->is_array() && i < variants->size(); ++i) {
      const nlohmann::ordered_json& v = (*variants)[i];
      out += harmony_type(v);
      if (const nlohmann::ordered_json* d = member(v, "description"); truthy(d)) out += "// " + python_str(*d);
      if (const nlohmann::ordered_json* d = member(v, "default"))
        out += "                    // default: " + python_json(*d);
      if (i + 1 < variants->size()) out += " | \n";
    }
    return out;
  }
  if (has_type(spec, "string")) {
    if (const nlohmann::ordered_json* values = member(spec, "enum"); truthy(values) && values->is_array()) {
      std::string out = "\"";
      for (size_t i = 0; i < values->size(); ++i) out += (i ? "\" | \"" : "") + python_str((*values)[i]);
      return out + "\"";
    }
    return truthy(member(spec, "nullable")) ? "string | null" : "string";
  }
  if (has_type(spec, "number") || has_type(spec, "integer")) return "number";
  if (has_type(spec, "boolean")) return "boolean";
  if (has_type(spec, "object")) {
    const nlohmann::ordered_json* props = member(spec, "properties");
    if (!truthy(props) || !props->is_object()) return "object";
    std::string out = "{\n";
    bool first = true;
    for (const auto& [name, prop] : props->items()) {
      if (!first) out += ", ";
      first = false;
      out += name + (is_required(spec, name) ? "" : "?") + ": \n                " + harmony_type(prop);
    }
    return out + "}";
  }
  return "any";
}

// gpt-oss's render_tool_namespace("functions", tools): each tool as a commented TypeScript type.
std::string harmony_tools(const std::vector<nlohmann::ordered_json>& tools) {
  std::string out = "## functions\n\nnamespace functions {\n\n";
  for (const nlohmann::ordered_json& tool : tools) {
    const nlohmann::ordered_json* f = member(tool, "function");
    if (!f) continue;
    const nlohmann::ordered_json* description = member(*f, "description");
    const nlohmann::ordered_json* name = member(*f, "name");
    out += "// " + (description ? python_str(*description) : std::string()) + "\ntype " +
           (name ? python_str(*name) : std::string()) + " = ";
    const nlohmann::ordered_json* params = member(*f, "parameters");
    const nlohmann::ordered_json* props = params ? member(*params, "properties") : nullptr;
    if (!truthy(props) || !props->is_object()) {
      out += "() => any;\n\n";
      continue;
    }
    out += "(_: {\n";
    for (const auto& [pname, spec] : props->items()) {
      if (const nlohmann::ordered_json* d = member(spec, "description"); truthy(d))
        out += "// " + python_str(*d) + "\n";
      out += pname + (is_required(*params, pname) ? "" : "?") + ": " + harmony_type(spec);
      if (const nlohmann::ordered_json* d = member(spec, "default")) {
        if (truthy(member(spec, "enum")))
          out += ", // default: " + python_str(*d);
        else if (truthy(member(spec, "oneOf")))
          out += "// default: " + python_str(*d);
        else
          out += ", // default: " + python_json(*d);
      }
      out += ",\n";
    }
    out += "}) => any;\n\n";
  }
  return out + "} // namespace functions";
}

}  // namespace

// openai/gpt-oss-120b (harmony): a system message naming the model, knowledge cutoff, date, reasoning effort
// (medium) and channels; a first system message becomes the developer message "# Instructions\n\ns\n\n"; then
// "<|start|>user<|message|>u<|end|>" and, for a reply, its final channel
// "<|start|>assistant<|channel|>final<|message|>a<|end|>" (<|return|> for a last reply without a generation prompt).
// A stored reply's analysis (everything up to think_close) is dropped, as the template drops past reasoning.
// With tools: the system message sends calls to the commentary channel, the developer message lists the tools as
// TypeScript types; a reply with calls writes its first call "<|start|>assistant to=functions.NAME<|channel|>commentary
// json<|message|>ARGS<|call|>" (its content before it in the analysis channel unless a later reply has no calls), a
// result "<|start|>functions.NAME to=assistant<|channel|>commentary<|message|>"RESULT"<|end|>" (JSON-quoted).
std::string ChatTemplate::render_harmony(std::span<const ChatMessage> messages, const RenderOptions& options) const {
  std::string date = options.date;
  if (date.empty()) {
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[16];
    std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm);
    date = buf;
  }
  const bool tools = !options.tools.empty();
  std::string out =
      "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: "
      "2024-06\nCurrent date: " +
      date +
      "\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be included for every "
      "message.";
  if (tools) out += "\nCalls to these tools must go to the commentary channel: 'functions'.";
  out += "<|end|>";
  std::span<const ChatMessage> rest = messages;
  std::string developer;
  if (!messages.empty() && messages[0].role == "system") {
    developer = messages[0].content;
    rest = messages.subspan(1);
  }
  if (!developer.empty() || tools) {
    out += "<|start|>developer<|message|>";
    if (!developer.empty()) out += "# Instructions\n\n" + developer + "\n\n";
    if (tools) out += "# Tools\n\n" + harmony_tools(options.tools);
    out += "<|end|>";
  }
  // A stored reply: its analysis dropped, and a final-channel header it was recorded with.
  auto reply_text = [&](const ChatMessage& m) {
    std::string_view content =
        contains(m.content, think_close()) ? after_last(m.content, think_close()) : std::string_view(m.content);
    constexpr std::string_view kFinal = "<|channel|>final<|message|>";
    if (content.starts_with(kFinal)) content.remove_prefix(kFinal.size());
    return content;
  };
  std::optional<std::string> last_call;  // the function of the last call, which the next tool messages answer
  for (size_t i = 0; i < rest.size(); ++i) {
    const ChatMessage& m = rest[i];
    if (m.role == "user") {
      out += "<|start|>user<|message|>" + m.content + "<|end|>";
    } else if (m.role == "assistant" && !m.tool_calls.empty()) {
      bool later_final = false;
      for (size_t j = i + 1; j < rest.size(); ++j)
        later_final = later_final || (rest[j].role == "assistant" && rest[j].tool_calls.empty());
      const std::string_view content = reply_text(m);
      if (!content.empty() && !later_final)
        out += "<|start|>assistant<|channel|>analysis<|message|>" + std::string(content) + "<|end|>";
      const ToolCall& call = m.tool_calls[0];  // the template writes one call per reply
      out += "<|start|>assistant to=functions." + call.name + "<|channel|>commentary json<|message|>" +
             python_json(call_arguments(call, "gpt-oss")) + "<|call|>";
      last_call = call.name;
    } else if (m.role == "assistant") {
      out += "<|start|>assistant<|channel|>final<|message|>";
      out += reply_text(m);
      out += i + 1 == rest.size() && !options.add_generation_prompt ? "<|return|>" : "<|end|>";
      last_call.reset();
    } else if (m.role == "tool") {
      if (!last_call) fail("chat template gpt-oss: a tool message without an assistant tool call before it");
      out += "<|start|>functions." + *last_call + " to=assistant<|channel|>commentary<|message|>" +
             python_json(m.content) + "<|end|>";
    }
  }
  if (options.add_generation_prompt) out += "<|start|>assistant";
  return out;
}

// No template: plain-text headers any vocabulary tokenizes ("### System:\n", "### User:\n", "### Assistant:\n",
// each turn followed by a blank line). A reply ends with the EOS text so that the model sees, in context, how a
// reply stops. No BOS: the vocabulary's add_bos decides, as for a plain prompt.
std::string ChatTemplate::render_generic(std::span<const ChatMessage> messages, const RenderOptions& options) const {
  std::string out;
  for (const ChatMessage& m : messages) {
    if (m.role == "system")
      out += "### System:\n" + m.content + "\n\n";
    else if (m.role == "user")
      out += "### User:\n" + m.content + "\n\n";
    else
      out += "### Assistant:\n" + m.content + eos_ + "\n\n";
  }
  if (options.add_generation_prompt) out += "### Assistant:\n";
  return out;
}

}  // namespace hetmoe::text
