#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/gguf/reader.h"
#include "runtime/text/tokenizer.h"

namespace hetmoe::text {

// A function call a reply made: its id (the tool message answering it names it), the function and its arguments as
// JSON text.
struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;
};

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", or "tool" (a function's result) where the template has tools
  std::string content;
  std::vector<ToolCall> tool_calls{};  // an assistant message's calls
  std::string tool_call_id{};          // a tool message: the call it answers
};

struct RenderOptions {
  bool add_generation_prompt = true;  // end with the assistant's turn opening
  bool enable_thinking = true;  // Qwen3, GLM-4.5, DeepSeek-V3.2/V4: false asks for no thinking, as their templates do
  std::string date{};           // gpt-oss's "Current date" (YYYY-MM-DD); empty: today
  // The functions the model may call, each an OpenAI tool object ({"type": "function", "function": {...}}) with its
  // keys in the order the client wrote them (templates print them with Python's json.dumps).
  std::vector<nlohmann::ordered_json> tools{};
};

// How a template's model writes function calls in its reply.
enum class ToolCallFormat {
  kNone,     // the template has no tool calls (in hetmoe yet)
  kHermes,   // Qwen3: <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>
  kGlm,      // GLM-4.5: <tool_call>name\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>\n...</tool_call>
  kXml,      // Qwen3.5: <tool_call>\n<function=name>\n<parameter=k>\nv\n</parameter>\n</function>\n</tool_call>
  kMinimax,  // MiniMax-M2: <minimax:tool_call>\n<invoke name="n">\n<parameter name="k">v</parameter>\n</invoke>\n...
  // DeepSeek-V3.2: <｜DSML｜function_calls>\n<｜DSML｜invoke name="n">\n<｜DSML｜parameter name="k" string="true">v
  // </｜DSML｜parameter>\n</｜DSML｜invoke>\n...</｜DSML｜function_calls> (string="false": the value is JSON)
  kDsmlFunctionCalls,
  kDsmlToolCalls,  // DeepSeek-V4: the same in a <｜DSML｜tool_calls> block
  // Kimi-K2: <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>{...}
  // <|tool_call_end|>...<|tool_calls_section_end|>
  kKimi,
  // gpt-oss: a commentary message to a function, <|start|>assistant<|channel|>commentary to=functions.NAME
  // <|constrain|>json<|message|>{...} ending the reply (<|call|>); header parts in either order
  kHarmony,
  // DeepSeek-R1: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```
  // <｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
  kDeepseekR1,
  // DeepSeek-V3.1: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>...
  // <｜tool▁calls▁end｜>
  kDeepseekV31,
};

// The chat formats hetmoe knows, rendered in C++ (no Jinja): each produces exactly the string the model's own
// Jinja template produces for plain text conversations.
enum class TemplateKind {
  kDeepseek3,
  kDeepseek2,
  kChatml,
  kMistral,
  kLlama3,
  kKimiK2,
  kGlm4,     // GLM-4.5 / 4.6 / 4.7
  kMinimax,  // MiniMax-M2
  kHarmony,  // gpt-oss
  kGeneric
};

class ChatTemplate {
 public:
  // From tokenizer.chat_template (matched by its distinctive markers). An unrecognised or missing template gives
  // the generic fallback and sets *warning to one line saying so.
  static ChatTemplate detect(const gguf::GgufFile& file, const Tokenizer& tokenizer, std::string* warning);
  // --chat-template NAME; nullopt for an unknown name.
  static std::optional<ChatTemplate> by_name(std::string_view name, const Tokenizer& tokenizer);
  // deepseek3, deepseek-r1, deepseek-v3.2, deepseek-v4, deepseek2, chatml (alias qwen3), qwen3.5, mistral, llama3,
  // kimi-k2, glm4, minimax-m2, gpt-oss, generic
  static std::vector<std::string> names();

  TemplateKind kind() const { return kind_; }
  // The syntax of the function calls the model writes; kNone where the template takes no tools (render() then
  // refuses tools, tool messages and replies with calls).
  ToolCallFormat tool_call_format() const;
  // Whether a stored reply's "<think>...</think>" is read as its reasoning (the reasoning templates that render past
  // reasoning or drop it); a request's reasoning_content goes there.
  bool reads_think_blocks() const;
  // Whether the template has its own place for a "developer" message: DeepSeek-V4's writes it as a user turn,
  // V3.2's counts it as the last user message without writing it. Elsewhere a developer message is a system one.
  bool takes_developer() const;
  std::string name() const;

  // The conversation as the model expects it, special tokens as text (tokenize with parse_special = true).
  // Includes the BOS text when the template writes one itself. Fails (hetmoe::Error, one line) on a role the
  // format cannot express, e.g. a system message after the first turn where the format has no place for it
  // (MiniMax-M2's and gpt-oss's official templates drop such messages instead; so do these renderers).
  std::string render(std::span<const ChatMessage> messages, const RenderOptions& options) const;

  // Reasoning models wrap their thinking in these: <think> and </think> (DeepSeek-R1, Qwen3, GLM-4.5, MiniMax-M2,
  // Kimi-K2-Thinking; also for formats whose models do not reason, which never write them), gpt-oss's analysis
  // channel and the switch to its final channel. Never empty: callers search for them.
  std::string_view think_open() const {
    return kind_ == TemplateKind::kHarmony ? "<|channel|>analysis<|message|>" : "<think>";
  }
  std::string_view think_close() const {
    return kind_ == TemplateKind::kHarmony ? "<|end|><|start|>assistant<|channel|>final<|message|>" : "</think>";
  }

 private:
  // What separates the official templates that share one kind; detect() reads it from the template text.
  struct Dialect {
    bool joins_systems = true;          // deepseek3: systems joined by "\n\n" (V3); false: the last one (R1)
    bool assistant_after_user = false;  // deepseek3 (V3-0324): every user turn ends with <｜Assistant｜>
    bool strips_think = false;          // deepseek3 (R1): past replies lose everything up to </think>
    bool prefills_think = false;        // deepseek3 (R1), chatml (Qwen3.5): the generation prompt opens "<think>\n"
    bool trims = false;                 // chatml (Qwen3.5): contents trimmed, every reply after the query thinks
    // deepseek3 (V4): consecutive user messages share one <｜User｜> ("\n\n" between them); every reply opens with
    // "</think>" (past ones lose their reasoning) or, thinking, after the last query with its think block; the
    // generation prompt opens "<think>" thinking, else "</think>".
    bool v4_turns = false;
    // deepseek3 (V3.2): every user message opens its own <｜User｜>; a reply opens with "</think>" (past ones lose
    // their reasoning) or, thinking, after the last user message with its think block; tool results follow the call
    // in one <function_results> block; the generation prompt opens "<think>" thinking, else writes "<think></think>".
    bool v32_turns = false;
    // deepseek3 (V3.1): a reply opens "<｜Assistant｜></think>" after a user message (past ones lose their reasoning),
    // calls as <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS, each result in its own output markers and the reply
    // straight after them; the generation prompt, after a user message only, opens "<think>" thinking, else
    // "</think>".
    bool v31_turns = false;
    bool spaced_inst = true;     // mistral: " [INST] u [/INST] a</s>" (v1) or "[INST] u [/INST]a</s>"
    std::string default_system;  // chatml (Qwen2), kimi-k2: written when the first message is no system
  };

  ChatTemplate(TemplateKind kind, Dialect dialect, std::string bos, std::string eos)
      : kind_(kind), dialect_(std::move(dialect)), bos_(std::move(bos)), eos_(std::move(eos)) {}
  static ChatTemplate make(TemplateKind kind, Dialect dialect, const Tokenizer& tokenizer);
  static std::optional<ChatTemplate> from_text(std::string_view tmpl, const Tokenizer& tokenizer);

  std::string render_deepseek3(std::span<const ChatMessage> messages, const RenderOptions& options) const;
  std::string render_deepseek_v31(std::span<const ChatMessage> messages, const RenderOptions& options) const;
  // DeepSeek-V3.2 and V4: the tool list after the system prompt, calls as DSML blocks, results in
  // <function_results> (V3.2) or in user turns as <tool_result> (V4).
  std::string render_dsml(std::span<const ChatMessage> messages, const RenderOptions& options) const;
  std::string render_deepseek2(std::span<const ChatMessage> messages, const RenderOptions& options) const;
  std::string render_chatml(std::span<const ChatMessage> messages, const RenderOptions& options) const;
  // Qwen3's template with tools: the tool list in the system turn, calls as <tool_call> blocks, results as
  // <tool_response> blocks in user turns.
  std::string render_chatml_tools(std::span<const ChatMessage> messages, const RenderOptions& options) const;
  // Qwen3.5's with tools: the tool list and its instructions before the system message, calls as <function=...>
  // blocks with one <parameter=...> per argument.
  std::string render_qwen35_tools(std::span<const ChatMessage> messages, const RenderOptions& options) const;
  std::string render_mistral(std::span<const ChatMessage> messages) const;
  std::string render_llama3(std::span<const ChatMessage> messages, const RenderOptions& options) const;
  std::string render_kimi_k2(std::span<const ChatMessage> messages, const RenderOptions& options) const;
  std::string render_glm4(std::span<const ChatMessage> messages, const RenderOptions& options) const;
  // GLM-4.5's tool list after "[gMASK]<sop>" and a reply's calls (arguments as <arg_key>/<arg_value> pairs).
  std::string glm4_tools(const RenderOptions& options) const;
  std::string render_minimax(std::span<const ChatMessage> messages, const RenderOptions& options) const;
  std::string render_harmony(std::span<const ChatMessage> messages, const RenderOptions& options) const;
  std::string render_generic(std::span<const ChatMessage> messages, const RenderOptions& options) const;

  TemplateKind kind_;
  Dialect dialect_;
  std::string bos_, eos_;  // the vocabulary's BOS/EOS texts, which some formats write
};

}  // namespace hetmoe::text
