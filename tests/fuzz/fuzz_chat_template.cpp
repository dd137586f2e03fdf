// libFuzzer target for chat-template rendering. Each input picks a vocabulary (its BOS/EOS texts go into some
// formats), a template (every built-in one by name, or one detected from a tokenizer.chat_template made of the
// markers detection looks for and arbitrary text, or from a file whose chat_template is missing or not a string),
// the render options (sometimes a tool) and a conversation: up to 8 messages with a role (system, user, assistant, tool
// or arbitrary), content mixing arbitrary bytes (invalid UTF-8 included) with the formats' own markers, and sometimes
// an assistant's call with arguments that are a JSON object or arbitrary text.
//
// Nothing may crash. render() may throw hetmoe::Error only where it says it does: a role other than system, user
// or assistant (or tool, in the formats with tool calls), the tool refusals tool_refusal() lists, or (mistral) a
// conversation that does not alternate after an optional first system message. Beyond
// that:
// - rendering is deterministic;
// - every user message's content is in the output (llama3 and qwen3.5 trim surrounding whitespace first), and so is
// every
//   assistant reply that holds no reasoning markers and no surrounding whitespace;
// - detect() falls back to the generic format exactly when it warns, and every template's name() gives the same
//   format back through by_name();
// - the output tokenizes with special-token parsing, every id in the vocabulary.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/error.h"
#include "runtime/gguf/reader.h"
#include "runtime/gguf/value.h"
#include "runtime/text/chat_template.h"
#include "runtime/text/tokenizer.h"

namespace {

namespace fs = std::filesystem;
using hetmoe::gguf::GgufFile;
using hetmoe::gguf::ValueType;
using hetmoe::text::ChatMessage;
using hetmoe::text::ChatTemplate;
using hetmoe::text::TemplateKind;
using hetmoe::text::Tokenizer;
using hetmoe::text::ToolCallFormat;

void require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz_chat_template: %s\n", what);
  std::abort();
}

// What the formats write and what detection looks for: pieces of messages and of tokenizer.chat_template.
constexpr std::string_view kMarkers[] = {"<think>",
                                         "</think>",
                                         "<think>\n",
                                         "\n</think>\n\n",
                                         "<|im_start|>",
                                         "<|im_end|>",
                                         "<|im_sep|>",
                                         "<|im_middle|>",
                                         "<|im_start|>system\n",
                                         "<|im_start|>system\\n",
                                         "<tool_response>",
                                         "</tool_response>",
                                         "[INST]",
                                         "' [INST] '",
                                         " [/INST]",
                                         "</s>",
                                         "<|start_header_id|>",
                                         "<|end_header_id|>",
                                         "<|eot_id|>",
                                         "<｜User｜>",
                                         "<｜Assistant｜>",
                                         "<｜Assistant｜><think>",
                                         "<｜end▁of▁sentence｜>",
                                         "is_first_sp",
                                         "is_last_user",
                                         "User: ",
                                         "Assistant:",
                                         "[gMASK]<sop>",
                                         "<|assistant|>",
                                         "<|user|>",
                                         "/nothink",
                                         "]~!b[",
                                         "]~b]",
                                         "[e~[\n",
                                         "<|start|>",
                                         "<|channel|>",
                                         "<|message|>",
                                         "<|end|>",
                                         "<|return|>",
                                         "<|channel|>final<|message|>",
                                         "<|end|><|start|>assistant<|channel|>final<|message|>",
                                         "### User:\n",
                                         "\n",
                                         " ",
                                         "\t",
                                         "\xff\xfe",
                                         "\xe2\x96\x81",
                                         "{{ '",
                                         "' }}",
                                         "'",
                                         "\"",
                                         "+",
                                         "{%"};
constexpr std::string_view kRoles[] = {"system", "user", "assistant", "tool", "developer"};
constexpr int kMaxMessages = 8;

std::vector<std::unique_ptr<Tokenizer>>& vocabs() {
  static std::vector<std::unique_ptr<Tokenizer>> list;
  return list;
}

// Text of up to `pieces` parts, each arbitrary bytes or a marker.
std::string fuzzed_text(FuzzedDataProvider& in, int pieces) {
  std::string out;
  const int n = in.ConsumeIntegralInRange<int>(0, pieces);
  for (int i = 0; i < n; ++i) {
    if (in.ConsumeBool())
      out += kMarkers[in.ConsumeIntegralInRange<size_t>(0, std::size(kMarkers) - 1)];
    else
      out += in.ConsumeRandomLengthString(256);
  }
  return out;
}

// A GGUF file in memory whose only key is tokenizer.chat_template: the text, an integer, or (nullopt) nothing.
struct TemplateFile {
  std::vector<uint8_t> bytes;
  std::optional<GgufFile> file;

  TemplateFile(std::optional<std::string_view> text, bool integer) {
    const bool has_key = text.has_value() || integer;
    pod<uint32_t>(hetmoe::gguf::kMagic);
    pod<uint32_t>(3);
    pod<uint64_t>(0);
    pod<uint64_t>(has_key ? 1 : 0);
    if (has_key) {
      string("tokenizer.chat_template");
      pod<uint32_t>(static_cast<uint32_t>(integer ? ValueType::kInt32 : ValueType::kString));
      if (integer)
        pod<int32_t>(7);
      else
        string(*text);
    }
    bytes.resize((bytes.size() + 31) / 32 * 32, 0);
    file.emplace(GgufFile::parse(bytes, "memory.gguf"));
  }
  template <typename T>
  void pod(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    bytes.insert(bytes.end(), p, p + sizeof v);
  }
  void string(std::string_view s) {
    pod<uint64_t>(s.size());
    bytes.insert(bytes.end(), s.begin(), s.end());
  }
};

// A role the format takes: system, user, assistant, tool where it has tool calls, developer where it has a place.
bool known_role(const std::string& role, const ChatTemplate& t) {
  return role == "system" || role == "user" || role == "assistant" ||
         (role == "tool" && t.tool_call_format() != ToolCallFormat::kNone) ||
         (role == "developer" && t.takes_developer());
}

// The refusals the tool formats document: tools, calls or tool messages where the format has no tool calls (a
// role check above); arguments that are not a JSON object where the template reads them as one (GLM-4.5, Qwen3.5,
// MiniMax-M2, DeepSeek-V3.2/V4, gpt-oss); a tool result whose last reply before it made no call (MiniMax-M2, gpt-oss)
// or with no reply before it that made calls (DeepSeek-V3.2); a system message after the first (Qwen3.5 with tools).
bool tool_refusal(const std::vector<ChatMessage>& messages, const hetmoe::text::RenderOptions& options,
                  const ChatTemplate& t) {
  const ToolCallFormat f = t.tool_call_format();
  bool tools = !options.tools.empty(), bad_args = false, orphan = false, late_system = false, called = false;
  bool ever_called = false, uncalled = false;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    tools = tools || m.role == "tool" || !m.tool_calls.empty();
    if (f == ToolCallFormat::kNone) continue;
    for (const hetmoe::text::ToolCall& c : m.tool_calls) {
      const auto args = nlohmann::ordered_json::parse(c.arguments.empty() ? "{}" : c.arguments, nullptr, false);
      bad_args = bad_args || !args.is_object();
    }
    if (m.role == "assistant") called = !m.tool_calls.empty();
    ever_called = ever_called || called;
    orphan = orphan || (m.role == "tool" && !called);
    uncalled = uncalled || (m.role == "tool" && !ever_called);
    late_system = late_system || (m.role == "system" && i > 0);
  }
  if (f == ToolCallFormat::kNone) return tools;
  if (f == ToolCallFormat::kHermes || f == ToolCallFormat::kKimi || f == ToolCallFormat::kDeepseekR1 ||
      f == ToolCallFormat::kDeepseekV31)
    return false;
  return bad_args || ((f == ToolCallFormat::kMinimax || f == ToolCallFormat::kHarmony) && orphan) ||
         (f == ToolCallFormat::kDsmlFunctionCalls && uncalled) || (f == ToolCallFormat::kXml && tools && late_system);
}

// The conversations mistral's format takes: an optional system message, then user and assistant alternating from a
// user turn, and not a system message alone.
bool mistral_accepts(const std::vector<ChatMessage>& messages) {
  size_t first = !messages.empty() && messages[0].role == "system" ? 1 : 0;
  if (first == 1 && messages.size() == 1) return false;
  for (size_t i = first; i < messages.size(); ++i)
    if (messages[i].role != ((i - first) % 2 == 0 ? "user" : "assistant")) return false;
  return true;
}

std::string_view strip_whitespace(std::string_view s) {
  constexpr std::string_view kWhitespace = " \t\n\r\v\f";
  const size_t b = s.find_first_not_of(kWhitespace);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(kWhitespace) - b + 1);
}

// A reply the formats write as it is: no reasoning to split off, no recorded final-channel header, nothing to trim.
bool verbatim_reply(const std::string& content, const ChatTemplate& t) {
  return content.find("</think>") == std::string::npos && content.find(t.think_close()) == std::string::npos &&
         !content.starts_with("<|channel|>final<|message|>") && strip_whitespace(content) == content;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  for (const char* sub : {"models", "vocab"})
    for (const auto& entry : fs::directory_iterator(fs::path(HETMOE_TEST_DATA_DIR) / sub))
      if (entry.path().extension() == ".gguf")
        vocabs().push_back(Tokenizer::from_gguf(GgufFile::open(entry.path().string())));
  require(!vocabs().empty(), "no vocabulary in tests/data");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const Tokenizer& vocab = *vocabs()[in.ConsumeIntegralInRange<size_t>(0, vocabs().size() - 1)];

  // The template: by name, or detected from a file.
  const std::vector<std::string> names = ChatTemplate::names();
  const size_t pick = in.ConsumeIntegralInRange<size_t>(0, names.size() + 2);
  std::optional<ChatTemplate> chat;
  if (pick < names.size()) {
    chat = ChatTemplate::by_name(names[pick], vocab);
    require(chat.has_value(), "a name names() lists is unknown to by_name()");
  } else {
    const std::string text = fuzzed_text(in, 12);
    const bool missing = pick == names.size() + 1, integer = pick == names.size() + 2;
    const TemplateFile file(missing || integer ? std::nullopt : std::optional<std::string_view>(text), integer);
    std::string warning;
    chat = ChatTemplate::detect(*file.file, vocab, &warning);
    require((chat->kind() == TemplateKind::kGeneric) == !warning.empty(), "detect() warns unless it recognises");
  }
  const std::optional<ChatTemplate> by_name = ChatTemplate::by_name(chat->name(), vocab);
  require(by_name && by_name->kind() == chat->kind(), "name() does not name the format for by_name()");
  require(!chat->think_open().empty() && !chat->think_close().empty(), "an empty think marker");

  hetmoe::text::RenderOptions options;
  options.add_generation_prompt = in.ConsumeBool();
  options.enable_thinking = in.ConsumeBool();
  // Never empty: an empty date means today's, and rendering would depend on the clock.
  options.date = in.ConsumeBool() ? "2026-12-01" : "d" + in.ConsumeRandomLengthString(16);

  // Sometimes a tool, with a name and parameters of arbitrary text.
  if (in.ConsumeBool()) {
    nlohmann::ordered_json tool = {{"type", "function"},
                                   {"function", {{"name", in.ConsumeRandomLengthString(12)}, {"parameters", {}}}}};
    tool["function"]["description"] = in.ConsumeRandomLengthString(24);
    options.tools.push_back(std::move(tool));
  }
  std::vector<ChatMessage> messages(in.ConsumeIntegralInRange<size_t>(0, kMaxMessages));
  bool roles_known = true;
  for (ChatMessage& m : messages) {
    const size_t role = in.ConsumeIntegralInRange<size_t>(0, std::size(kRoles));
    m.role = role < std::size(kRoles) ? std::string(kRoles[role]) : in.ConsumeRandomLengthString(16);
    m.content = fuzzed_text(in, 4);
    roles_known = roles_known && known_role(m.role, *chat);
    // An assistant's calls: arguments a JSON object or arbitrary text.
    if (m.role == "assistant" && in.ConsumeBool()) {
      const std::string name = in.ConsumeRandomLengthString(12);
      std::string args = in.ConsumeBool() ? nlohmann::json{{in.ConsumeRandomLengthString(8), in.ConsumeIntegral<int>()},
                                                           {"s", in.ConsumeRandomLengthString(16)}}
                                                .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                                          : in.ConsumeRandomLengthString(24);
      m.tool_calls.push_back({.id = "c", .name = name, .arguments = std::move(args)});
    }
  }

  std::string out;
  try {
    out = chat->render(messages, options);
  } catch (const hetmoe::Error& e) {
    if (std::getenv("HETMOE_FUZZ_VERBOSE")) {
      std::fprintf(stderr, "%s: %s\n", chat->name().c_str(), e.what());
      for (const ChatMessage& m : messages)
        std::fprintf(stderr, "  %s calls=%zu\n", m.role.c_str(), m.tool_calls.size());
    }
    const bool documented = !roles_known || (chat->kind() == TemplateKind::kMistral && !mistral_accepts(messages)) ||
                            tool_refusal(messages, options, *chat);
    require(documented, "render() failed on a conversation the format takes");
    return 0;
  }
  require(roles_known, "render() took an unknown role");
  require(!tool_refusal(messages, options, *chat), "render() took tools, calls or results it documents refusing");
  require(chat->kind() != TemplateKind::kMistral || mistral_accepts(messages),
          "mistral took a conversation that does not alternate");
  require(chat->render(messages, options) == out, "rendering is not deterministic");

  for (const ChatMessage& m : messages) {
    if (m.role == "user") {
      const bool trims = chat->kind() == TemplateKind::kLlama3 || chat->name() == "qwen3.5";
      const std::string_view text = trims ? strip_whitespace(m.content) : std::string_view(m.content);
      require(out.find(text) != std::string::npos, "a user message is missing from the output");
    } else if (m.role == "assistant" && verbatim_reply(m.content, *chat) &&
               !(chat->kind() == TemplateKind::kHarmony && !m.tool_calls.empty())) {  // gpt-oss may drop its analysis
      require(out.find(m.content) != std::string::npos, "an assistant reply is missing from the output");
    }
  }

  for (int32_t id : vocab.encode(out, false, true)) require(id >= 0 && id < vocab.n_vocab(), "token id out of range");
  return 0;
}
