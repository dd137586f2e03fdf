// Chat templates: every expected string below was derived by hand from the official Jinja template named in the
// test (tokenizer_config.json of the model), not produced by the code under test.

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/error.h"
#include "runtime/gguf/reader.h"
#include "runtime/text/chat_template.h"
#include "runtime/text/tokenizer.h"
#include "runtime/text/tool_calls.h"
#include "tests/support/reference.h"

namespace hetmoe::text {
namespace {

// Only the BOS/EOS texts matter to a chat template; a vocabulary of just those stands in for a real one.
class VocabOnly : public Tokenizer {
 public:
  VocabOnly(std::vector<std::string> tokens, std::optional<int32_t> bos, std::optional<int32_t> eos) {
    model_ = "gpt2";
    tokens_ = std::move(tokens);
    types_.assign(tokens_.size(), TokenType::kControl);
    bos_ = bos;
    eos_ = eos;
  }
  std::vector<int32_t> encode(std::string_view, bool, bool) const override {
    ADD_FAILURE() << "chat templates must not tokenize";
    return {};
  }
  std::string token_to_piece(int32_t id, bool) const override { return token_text(id); }

 protected:
  void encode_text(std::string_view, bool, std::vector<int32_t>&) const override {
    ADD_FAILURE() << "chat templates must not tokenize";
  }
};

const VocabOnly& deepseek_vocab() {
  static const VocabOnly v({"<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"}, 0, 1);
  return v;
}
const VocabOnly& mixtral_vocab() {
  static const VocabOnly v({"<unk>", "<s>", "</s>"}, 1, 2);
  return v;
}
const VocabOnly& llama3_vocab() {
  static const VocabOnly v({"<|begin_of_text|>", "<|end_of_text|>"}, 0, 1);
  return v;
}
const VocabOnly& qwen_vocab() {
  static const VocabOnly v({"<|endoftext|>", "<|im_end|>"}, 0, 1);
  return v;
}

ChatTemplate named(std::string_view name, const Tokenizer& vocab) {
  std::optional<ChatTemplate> t = ChatTemplate::by_name(name, vocab);
  if (!t) throw std::runtime_error("unknown template " + std::string(name));
  return *t;
}

std::string render(const ChatTemplate& t, const std::vector<ChatMessage>& messages, bool generation_prompt = true,
                   bool enable_thinking = true) {
  return t.render(messages,
                  RenderOptions{.add_generation_prompt = generation_prompt, .enable_thinking = enable_thinking});
}

// System, user, assistant reply, user: the conversation most tests render.
const std::vector<ChatMessage> kTwoTurns = {
    {"system", "You are terse."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "2+2?"}};

// A GGUF with nothing but (optionally) tokenizer.chat_template, parsed from memory.
struct TemplateFile {
  std::vector<uint8_t> bytes;
  std::optional<gguf::GgufFile> file;

  // number: the key holds the u32 7 instead of a string (a broken or hand-edited file).
  explicit TemplateFile(std::optional<std::string_view> chat_template, bool number = false) {
    auto u32 = [this](uint32_t v) {
      for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<uint8_t>(v >> (8 * i)));
    };
    auto u64 = [this](uint64_t v) {
      for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<uint8_t>(v >> (8 * i)));
    };
    auto str = [&](std::string_view s) {
      u64(s.size());
      bytes.insert(bytes.end(), s.begin(), s.end());
    };
    u32(gguf::kMagic);
    u32(3);                      // version
    u64(0);                      // tensors
    u64(chat_template ? 1 : 0);  // metadata entries
    if (chat_template) {
      str("tokenizer.chat_template");
      if (number) {
        u32(static_cast<uint32_t>(gguf::ValueType::kUint32));
        u32(7);
      } else {
        u32(static_cast<uint32_t>(gguf::ValueType::kString));
        str(*chat_template);
      }
    }
    bytes.resize((bytes.size() + 31) / 32 * 32, 0);
    file.emplace(gguf::GgufFile::parse(bytes, "memory.gguf"));
  }
};

ChatTemplate detected(std::string_view chat_template, const Tokenizer& vocab, std::string* warning = nullptr) {
  TemplateFile f(chat_template);
  return ChatTemplate::detect(*f.file, vocab, warning);
}

// deepseek-ai/DeepSeek-V3.1 (as llama.cpp's models/templates keeps it).
constexpr std::string_view kDeepseekV31Template = R"TPL({% if not add_generation_prompt is defined -%}
  {%- set add_generation_prompt = false -%}
{%- endif -%}
{%- if not thinking is defined -%}
  {%- if enable_thinking is defined -%}
    {%- set thinking = enable_thinking -%}
    {%- else -%}
    {%- set thinking = false -%}
  {%- endif -%}
{%- endif -%}
{%- set ns = namespace(is_first=false, is_tool=false, system_prompt='', is_first_sp=true, is_last_user=false) -%}
{%- for message in messages -%}
  {%- if message['role'] == 'system' -%}
    {%- if ns.is_first_sp -%}
      {%- set ns.system_prompt = ns.system_prompt + message['content'] -%}
      {%- set ns.is_first_sp = false -%}
      {%- else -%}
      {%- set ns.system_prompt = ns.system_prompt + '

' + message['content'] -%}
    {%- endif -%}
  {%- endif -%}
{%- endfor -%}{{ bos_token }}{{ ns.system_prompt }}
{%- for message in messages -%}
  {%- if message['role'] == 'user' -%}
    {%- set ns.is_tool = false -%}
    {%- set ns.is_first = false -%}
    {%- set ns.is_last_user = true -%}{{'<｜User｜>' + message['content']}}
  {%- endif -%}
  {%- if message['role'] == 'assistant' and message['tool_calls'] is defined and message['tool_calls'] is not none -%}
    {%- if ns.is_last_user -%}{{'<｜Assistant｜></think>'}}
    {%- endif -%}
    {%- set ns.is_last_user = false -%}
    {%- set ns.is_first = false -%}
    {%- set ns.is_tool = false -%}
    {%- for tool in message['tool_calls'] -%}
      {%- if not ns.is_first -%}
        {%- if message['content'] is none -%}{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>'+ tool['function']['name'] + '<｜tool▁sep｜>' + tool['function']['arguments'] + '<｜tool▁call▁end｜>'}}
          {%- else -%}{{message['content'] + '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['function']['name'] + '<｜tool▁sep｜>' + tool['function']['arguments'] + '<｜tool▁call▁end｜>'}}
        {%- endif -%}
        {%- set ns.is_first = true -%}
        {%- else -%}{{'<｜tool▁call▁begin｜>'+ tool['function']['name'] + '<｜tool▁sep｜>' + tool['function']['arguments'] + '<｜tool▁call▁end｜>'}}
      {%- endif -%}
    {%- endfor -%}{{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}
  {%- endif -%}
  {%- if message['role'] == 'assistant' and (message['tool_calls'] is not defined or message['tool_calls'] is none) -%}
    {%- if ns.is_last_user -%}{{'<｜Assistant｜>'}}
      {%- if message['prefix'] is defined and message['prefix'] and thinking -%}{{'<think>'}}
        {%- else -%}{{'</think>'}}
      {%- endif -%}
    {%- endif -%}
    {%- set ns.is_last_user = false -%}
    {%- if ns.is_tool -%}{{message['content'] + '<｜end▁of▁sentence｜>'}}
      {%- set ns.is_tool = false -%}
      {%- else -%}
      {%- set content = message['content'] -%}
      {%- if '</think>' in content -%}
        {%- set content = content.split('</think>', 1)[1] -%}
      {%- endif -%}{{content + '<｜end▁of▁sentence｜>'}}
    {%- endif -%}
  {%- endif -%}
  {%- if message['role'] == 'tool' -%}
    {%- set ns.is_last_user = false -%}
    {%- set ns.is_tool = true -%}{{'<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt and ns.is_last_user and not ns.is_tool -%}{{'<｜Assistant｜>'}}
  {%- if not thinking -%}{{'</think>'}}
    {%- else -%}{{'<think>'}}
  {%- endif -%}
{%- endif %})TPL";

// Condensed official templates: the parts that hold the markers detection reads, written as the originals
// write them.
constexpr std::string_view kDeepseekV3Template =
    "{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='', "
    "is_first_sp=true) %}{{bos_token}}{{ns.system_prompt}}{%- for message in messages %}"
    "{{'<｜User｜>' + message['content']}}{{'<｜Assistant｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}"
    "{%- endfor -%}{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜>'}}{% endif %}";
constexpr std::string_view kDeepseekR1Template =
    "{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='') %}"
    "{%- for message in messages %}{%- if message['role'] == 'system' %}{% set ns.system_prompt = "
    "message['content'] %}{%- endif %}{%- endfor %}{{bos_token}}{{ns.system_prompt}}"
    "{{'<｜User｜>' + message['content']}}{% set content = message['content'] %}{% if '</think>' in content %}"
    "{% set content = content.split('</think>')[-1] %}{% endif %}"
    "{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}"
    "{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜><think>\\n'}}{% endif %}";
constexpr std::string_view kDeepseekV3_0324Template =
    "{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='', "
    "is_first_sp=true, is_last_user=false) %}{{ bos_token }}{{ ns.system_prompt }}"
    "{{'<｜User｜>' + message['content'] + '<｜Assistant｜>'}}{{content + '<｜end▁of▁sentence｜>'}}"
    "{% if add_generation_prompt and not ns.is_last_user and not ns.is_tool %}{{'<｜Assistant｜>'}}{% endif %}";
constexpr std::string_view kDeepseekV2Template =
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ 'User: ' + message['content'] + '\\n\\n' }}{% elif message['role'] == 'assistant' %}"
    "{{ 'Assistant: ' + message['content'] + eos_token }}{% elif message['role'] == 'system' %}"
    "{{ message['content'] + '\\n\\n' }}{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "{{ 'Assistant:' }}{% endif %}";
constexpr std::string_view kQwen3Template =
    "{%- if messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + "
    "'<|im_end|>\\n' }}{%- endif %}{{- '<|im_start|>' + message.role + '\\n' + message.content + "
    "'<|im_end|>' + '\\n' }}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}{%- endif %}";
// Qwen2's template as ggml-vocab-qwen2.gguf stores it (real newlines inside the Jinja strings).
constexpr std::string_view kQwen2Template =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
constexpr std::string_view kMixtralTemplate =
    "{{- bos_token }}{%- for message in loop_messages %}{%- if message['role'] == 'user' %}"
    "{%- if loop.first and system_message is defined %}"
    "{{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}{%- else %}"
    "{{- ' [INST] ' + message['content'] + ' [/INST]' }}{%- endif %}{%- elif message['role'] == 'assistant' %}"
    "{{- ' ' + message['content'] + eos_token}}{%- endif %}{%- endfor %}";
constexpr std::string_view kMixtralFirstTemplate =
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ message['content'] + eos_token}}{% endif %}{% endfor %}";
constexpr std::string_view kLlama3Template =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}";
constexpr std::string_view kKimiK2Template =
    "{%- if loop.first and messages[0]['role'] != 'system' -%}"
    "{{ '<|im_system|>system<|im_middle|>You are a helpful assistant<|im_end|>' }}{%- endif -%}"
    "{{ '<|im_user|>user<|im_middle|>' }}{{ '<|im_assistant|>assistant<|im_middle|>' }}";

// ---------------------------------------------------------------------------------------------------------------
// DeepSeek-V3 / R1

TEST(ChatTemplateDeepseek3, V3TwoTurns) {
  const ChatTemplate t = named("deepseek3", deepseek_vocab());
  EXPECT_EQ(render(t, kTwoTurns),
            "<｜begin▁of▁sentence｜>You are terse.<｜User｜>Hi<｜Assistant｜>Hello!<｜end▁of▁sentence｜>"
            "<｜User｜>2+2?<｜Assistant｜>");
  EXPECT_EQ(render(t, kTwoTurns, /*generation_prompt=*/false),
            "<｜begin▁of▁sentence｜>You are terse.<｜User｜>Hi<｜Assistant｜>Hello!<｜end▁of▁sentence｜>"
            "<｜User｜>2+2?");
}

TEST(ChatTemplateDeepseek3, V3JoinsSystemMessagesWhereverTheyStand) {
  const ChatTemplate t = named("deepseek3", deepseek_vocab());
  EXPECT_EQ(render(t, {{"system", "A"}, {"user", "u"}, {"system", "B"}}),
            "<｜begin▁of▁sentence｜>A\n\nB<｜User｜>u<｜Assistant｜>");
  // No system message: the BOS is followed directly by the first turn.
  EXPECT_EQ(render(t, {{"user", "u"}}), "<｜begin▁of▁sentence｜><｜User｜>u<｜Assistant｜>");
}

TEST(ChatTemplateDeepseek3, V3KeepsThinkingInPastReplies) {
  const ChatTemplate t = named("deepseek3", deepseek_vocab());
  EXPECT_EQ(render(t, {{"user", "u"}, {"assistant", "<think>x</think>y"}}, false),
            "<｜begin▁of▁sentence｜><｜User｜>u<｜Assistant｜><think>x</think>y<｜end▁of▁sentence｜>");
}

TEST(ChatTemplateDeepseek3, R1StripsPastReasoningAndOpensThinking) {
  const ChatTemplate t = named("deepseek-r1", deepseek_vocab());
  const std::vector<ChatMessage> messages = {{"system", "You are terse."},
                                             {"user", "Hi"},
                                             {"assistant", "<think>\nGreet back.\n</think>\n\nHello!"},
                                             {"user", "2+2?"}};
  // split('</think>')[-1] keeps the "\n\n" that followed the block.
  EXPECT_EQ(render(t, messages),
            "<｜begin▁of▁sentence｜>You are terse.<｜User｜>Hi<｜Assistant｜>\n\nHello!<｜end▁of▁sentence｜>"
            "<｜User｜>2+2?<｜Assistant｜><think>\n");
  EXPECT_EQ(render(t, messages, false),
            "<｜begin▁of▁sentence｜>You are terse.<｜User｜>Hi<｜Assistant｜>\n\nHello!<｜end▁of▁sentence｜>"
            "<｜User｜>2+2?");
  // Only what follows the last </think> stays; a reply without one is kept whole.
  EXPECT_EQ(render(t, {{"user", "u"}, {"assistant", "a</think>b</think>c"}, {"user", "v"}, {"assistant", "w"}}, false),
            "<｜begin▁of▁sentence｜><｜User｜>u<｜Assistant｜>c<｜end▁of▁sentence｜><｜User｜>v<｜Assistant｜>w"
            "<｜end▁of▁sentence｜>");
}

TEST(ChatTemplateDeepseek3, R1UsesTheLastSystemMessage) {
  const ChatTemplate t = named("deepseek-r1", deepseek_vocab());
  EXPECT_EQ(render(t, {{"system", "A"}, {"user", "u"}, {"system", "B"}}),
            "<｜begin▁of▁sentence｜>B<｜User｜>u<｜Assistant｜><think>\n");
}

TEST(ChatTemplateDeepseek3, V3_0324OpensTheReplyAfterEveryUserTurn) {
  const ChatTemplate t = detected(kDeepseekV3_0324Template, deepseek_vocab());
  EXPECT_EQ(t.name(), "deepseek3");
  // The same as V3 for a conversation that ends with a user turn and asks for the reply...
  EXPECT_EQ(render(t, kTwoTurns), render(named("deepseek3", deepseek_vocab()), kTwoTurns));
  // ...but the reply opening is part of the user turn, with or without a generation prompt.
  EXPECT_EQ(render(t, kTwoTurns, false),
            "<｜begin▁of▁sentence｜>You are terse.<｜User｜>Hi<｜Assistant｜>Hello!<｜end▁of▁sentence｜>"
            "<｜User｜>2+2?<｜Assistant｜>");
  EXPECT_EQ(render(t, {{"user", "a"}, {"user", "b"}}),
            "<｜begin▁of▁sentence｜><｜User｜>a<｜Assistant｜><｜User｜>b<｜Assistant｜>");
  // After a reply, the generation prompt opens the next one.
  EXPECT_EQ(render(t, {{"user", "a"}, {"assistant", "b"}}),
            "<｜begin▁of▁sentence｜><｜User｜>a<｜Assistant｜>b<｜end▁of▁sentence｜><｜Assistant｜>");
}

// ---------------------------------------------------------------------------------------------------------------
// DeepSeek-V2

TEST(ChatTemplateDeepseek2, V2LiteChatTwoTurns) {
  const ChatTemplate t = named("deepseek2", deepseek_vocab());
  EXPECT_EQ(render(t, kTwoTurns),
            "<｜begin▁of▁sentence｜>You are terse.\n\nUser: Hi\n\nAssistant: Hello!<｜end▁of▁sentence｜>"
            "User: 2+2?\n\nAssistant:");
  EXPECT_EQ(render(t, kTwoTurns, false),
            "<｜begin▁of▁sentence｜>You are terse.\n\nUser: Hi\n\nAssistant: Hello!<｜end▁of▁sentence｜>"
            "User: 2+2?\n\n");
  // A later system message is written where it stands.
  EXPECT_EQ(render(t, {{"user", "a"}, {"system", "s"}}), "<｜begin▁of▁sentence｜>User: a\n\ns\n\nAssistant:");
}

// ---------------------------------------------------------------------------------------------------------------
// ChatML / Qwen3

TEST(ChatTemplateChatml, Qwen3TwoTurns) {
  const ChatTemplate t = named("qwen3", qwen_vocab());
  EXPECT_EQ(t.kind(), TemplateKind::kChatml);
  EXPECT_EQ(render(t, kTwoTurns),
            "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(render(t, kTwoTurns, false),
            "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n");
}

TEST(ChatTemplateChatml, Qwen3EnableThinkingFalseWritesAnEmptyThinkBlock) {
  const ChatTemplate t = named("chatml", qwen_vocab());
  EXPECT_EQ(render(t, {{"user", "Hi"}}, true, /*enable_thinking=*/false),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  // Without a generation prompt there is nothing to add it to.
  EXPECT_EQ(render(t, {{"user", "Hi"}}, false, false), "<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatTemplateChatml, Qwen3StripsThinkingFromPastReplies) {
  const ChatTemplate t = named("qwen3", qwen_vocab());
  EXPECT_EQ(render(t, {{"user", "Hi"}, {"assistant", "<think>\nGreet back.\n</think>\n\nHello!"}, {"user", "Bye"}}),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
            "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplateChatml, Qwen3KeepsReasoningOfAReplyAfterTheLastQuery) {
  const ChatTemplate t = named("qwen3", qwen_vocab());
  // The last message, after the last user query: its think block is rewritten in the template's own layout.
  EXPECT_EQ(render(t, {{"user", "Hi"}, {"assistant", "<think>\n\nStep 1.\n\n</think>\nHello!"}}, false),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\nStep 1.\n</think>\n\nHello!"
            "<|im_end|>\n");
  // Even with no reasoning at all, the last reply gets an empty block.
  EXPECT_EQ(render(t, {{"user", "Hi"}, {"assistant", "Hello!"}}, false),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello!<|im_end|>\n");
}

TEST(ChatTemplateChatml, LaterSystemMessagesStayInPlace) {
  const ChatTemplate t = named("chatml", qwen_vocab());
  EXPECT_EQ(render(t, {{"user", "a"}, {"system", "s"}}, false),
            "<|im_start|>user\na<|im_end|>\n<|im_start|>system\ns<|im_end|>\n");
}

TEST(ChatTemplateChatml, Qwen2DefaultSystemPromptComesFromTheTemplate) {
  const ChatTemplate t = detected(kQwen2Template, qwen_vocab());
  EXPECT_EQ(t.kind(), TemplateKind::kChatml);
  EXPECT_EQ(render(t, {{"user", "Hi"}}),
            "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(render(t, {{"system", "S"}, {"user", "Hi"}}, false),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
  // Qwen3's template writes the caller's system message only: no default.
  EXPECT_EQ(render(detected(kQwen3Template, qwen_vocab()), {{"user", "Hi"}}, false),
            "<|im_start|>user\nHi<|im_end|>\n");
}

// ---------------------------------------------------------------------------------------------------------------
// Mistral / Mixtral

TEST(ChatTemplateMistral, MixtralTwoTurns) {
  const ChatTemplate t = named("mistral", mixtral_vocab());
  const std::string expected = "<s> [INST] You are terse.\n\nHi [/INST] Hello!</s> [INST] 2+2? [/INST]";
  EXPECT_EQ(render(t, kTwoTurns), expected);
  // [/INST] already opens the reply: the generation prompt adds nothing.
  EXPECT_EQ(render(t, kTwoTurns, false), expected);
  EXPECT_EQ(render(t, {{"user", "Hi"}}), "<s> [INST] Hi [/INST]");
}

TEST(ChatTemplateMistral, FirstMixtralTemplateHasNoSpaces) {
  const ChatTemplate t = detected(kMixtralFirstTemplate, mixtral_vocab());
  EXPECT_EQ(t.kind(), TemplateKind::kMistral);
  EXPECT_EQ(render(t, kTwoTurns), "<s>[INST] You are terse.\n\nHi [/INST]Hello!</s>[INST] 2+2? [/INST]");
}

TEST(ChatTemplateMistral, RejectsWhatTheFormatCannotExpress) {
  const ChatTemplate t = named("mistral", mixtral_vocab());
  EXPECT_THROW(render(t, {{"user", "a"}, {"system", "s"}}), Error);
  EXPECT_THROW(render(t, {{"user", "a"}, {"user", "b"}}), Error);
  EXPECT_THROW(render(t, {{"assistant", "a"}}), Error);
  EXPECT_THROW(render(t, {{"system", "s"}, {"assistant", "a"}}), Error);
  EXPECT_THROW(render(t, {{"system", "s"}}), Error);
  EXPECT_NO_THROW(render(t, {{"system", "s"}, {"user", "u"}, {"assistant", "a"}}));
}

// ---------------------------------------------------------------------------------------------------------------
// Llama-3

TEST(ChatTemplateLlama3, TwoTurnsWithTrimmedContent) {
  const ChatTemplate t = named("llama3", llama3_vocab());
  const std::vector<ChatMessage> messages = {
      {"system", "You are terse."}, {"user", "  Hi\n"}, {"assistant", "Hello!"}, {"user", "2+2?"}};
  EXPECT_EQ(render(t, messages),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(render(t, {{"user", "Hi"}}, false),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>");
}

// ---------------------------------------------------------------------------------------------------------------
// Kimi-K2

TEST(ChatTemplateKimiK2, TwoTurns) {
  const ChatTemplate t = named("kimi-k2", deepseek_vocab());
  EXPECT_EQ(render(t, kTwoTurns),
            "<|im_system|>system<|im_middle|>You are terse.<|im_end|><|im_user|>user<|im_middle|>Hi<|im_end|>"
            "<|im_assistant|>assistant<|im_middle|>Hello!<|im_end|><|im_user|>user<|im_middle|>2+2?<|im_end|>"
            "<|im_assistant|>assistant<|im_middle|>");
}

TEST(ChatTemplateKimiK2, DefaultSystemPromptWhenTheFirstMessageIsNoSystem) {
  const ChatTemplate t = detected(kKimiK2Template, deepseek_vocab());
  EXPECT_EQ(t.kind(), TemplateKind::kKimiK2);
  EXPECT_EQ(render(t, {{"user", "Hi"}}),
            "<|im_system|>system<|im_middle|>You are a helpful assistant<|im_end|>"
            "<|im_user|>user<|im_middle|>Hi<|im_end|><|im_assistant|>assistant<|im_middle|>");
  EXPECT_EQ(render(t, {{"user", "Hi"}, {"system", "S"}}, false),
            "<|im_system|>system<|im_middle|>You are a helpful assistant<|im_end|>"
            "<|im_user|>user<|im_middle|>Hi<|im_end|><|im_system|>system<|im_middle|>S<|im_end|>");
}

// ---------------------------------------------------------------------------------------------------------------
// GLM-4.5 / 4.6, MiniMax-M2, gpt-oss: expected strings from their official templates (zai-org/GLM-4.6,
// MiniMaxAI/MiniMax-M2, openai/gpt-oss-120b, as llama.cpp's models/templates ship them), rendered with jinja2
// (trim_blocks, lstrip_blocks) for these conversations.

const std::vector<ChatMessage> kReasoningReplies = {{"user", "u"},
                                                    {"assistant", "<think>\nt\n</think>\n\na"},
                                                    {"user", "v"},
                                                    {"assistant", "<think>\nr\n</think>\n\nb"}};

TEST(ChatTemplateGlm4, TwoTurns) {
  const ChatTemplate t = named("glm4", deepseek_vocab());
  EXPECT_EQ(render(t, kTwoTurns),
            "[gMASK]<sop><|system|>\nYou are terse.<|user|>\nHi<|assistant|>\n<think></think>\nHello!<|user|>\n2+2?"
            "<|assistant|>");
}

TEST(ChatTemplateGlm4, KeepsReasoningOnlyAfterTheLastUserMessage) {
  EXPECT_EQ(render(named("glm4", deepseek_vocab()), kReasoningReplies, false),
            "[gMASK]<sop><|user|>\nu<|assistant|>\n<think></think>\na<|user|>\nv<|assistant|>\n<think>r</think>\nb");
}

TEST(ChatTemplateGlm4, NoThinkingAsksWithNothink) {
  const ChatTemplate t = named("glm4", deepseek_vocab());
  EXPECT_EQ(
      t.render(std::vector<ChatMessage>{{"user", "Hi"}}, {.add_generation_prompt = true, .enable_thinking = false}),
      "[gMASK]<sop><|user|>\nHi/nothink<|assistant|>\n<think></think>");
}

TEST(ChatTemplateMinimax, TwoTurns) {
  EXPECT_EQ(render(named("minimax-m2", deepseek_vocab()), kTwoTurns),
            "]~!b[]~b]system\nYou are terse.[e~[\n]~b]user\nHi[e~[\n]~b]ai\nHello![e~[\n]~b]user\n2+2?[e~[\n"
            "]~b]ai\n<think>\n");
}

TEST(ChatTemplateMinimax, DefaultSystemAndReasoningAfterTheLastUserMessage) {
  EXPECT_EQ(render(named("minimax-m2", deepseek_vocab()), kReasoningReplies, false),
            "]~!b[]~b]system\nYou are a helpful assistant.[e~[\n]~b]user\nu[e~[\n]~b]ai\na[e~[\n]~b]user\nv[e~[\n"
            "]~b]ai\n<think>\nr\n</think>\n\nb[e~[\n");
}

constexpr std::string_view kHarmonySystem =
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: "
    "2024-06\nCurrent date: 2026-12-01\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. "
    "Channel must be included for every message.<|end|>";

TEST(ChatTemplateHarmony, TwoTurnsWithTheSystemMessageAsDeveloperInstructions) {
  const ChatTemplate t = named("gpt-oss", deepseek_vocab());
  EXPECT_EQ(t.render(kTwoTurns, {.date = "2026-12-01"}),
            std::string(kHarmonySystem) +
                "<|start|>developer<|message|># Instructions\n\nYou are terse.\n\n<|end|><|start|>user<|message|>Hi"
                "<|end|><|start|>assistant<|channel|>final<|message|>Hello!<|end|><|start|>user<|message|>2+2?<|end|>"
                "<|start|>assistant");
}

TEST(ChatTemplateHarmony, StoredRepliesKeepOnlyTheirFinalChannel) {
  const ChatTemplate t = named("gpt-oss", deepseek_vocab());
  const std::string reply = std::string(t.think_open()) + "thinking" + std::string(t.think_close()) + "answer";
  EXPECT_EQ(t.render(std::vector<ChatMessage>{{"user", "q"}, {"assistant", reply}},
                     {.add_generation_prompt = false, .date = "2026-12-01"}),
            std::string(kHarmonySystem) +
                "<|start|>user<|message|>q<|end|><|start|>assistant<|channel|>final<|message|>answer<|return|>");
  // Today's date when none is given.
  EXPECT_NE(t.render(std::vector<ChatMessage>{{"user", "q"}}, {}).find("Current date: 20"), std::string::npos);
}

// Qwen3.5's own template (the tiny model's copy of Qwen3.5-4B.jinja): contents trimmed, past replies before the last
// query without their reasoning, every reply after it in a think block (an empty one too), and the generation prompt
// opens the think block unless thinking is off.
TEST(ChatTemplateChatml, Qwen35FromItsFileTrimsAndOpensTheThinkBlock) {
  const gguf::GgufFile file =
      gguf::GgufFile::open(std::string(HETMOE_TEST_DATA_DIR) + "/models/tiny-qwen35moe-Q4_K_M.gguf");
  std::string warning;
  const ChatTemplate t = ChatTemplate::detect(file, qwen_vocab(), &warning);
  EXPECT_TRUE(warning.empty()) << warning;
  EXPECT_EQ(t.name(), "qwen3.5");
  const std::vector<ChatMessage> one = {{"user", "q"}};
  EXPECT_EQ(ChatTemplate::by_name("qwen3.5", qwen_vocab())->render(one, {}), t.render(one, {}));
  const std::vector<ChatMessage> chat = {
      {"system", " S \n"}, {"user", " Hi "}, {"assistant", "<think>\nr\n</think>\n\nHello "}, {"user", "Again"}};
  EXPECT_EQ(t.render(chat, {}),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n"
            "<|im_start|>user\nAgain<|im_end|>\n<|im_start|>assistant\n<think>\n");
  EXPECT_EQ(t.render(chat, {.enable_thinking = false}).substr(t.render(chat, {}).size() - 8),
            "<think>\n\n</think>\n\n");
  EXPECT_EQ(t.render(std::vector<ChatMessage>{{"user", "q"}, {"assistant", "A"}}, {.add_generation_prompt = false}),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nA<|im_end|>\n");
}

// DeepSeek-V4's own template (the tiny model's copy of deepseek-ai-DeepSeek-V4.jinja), as its Jinja renders with
// llama.cpp's enable_thinking: consecutive user messages under one <｜User｜>, past replies after "</think>" without
// their reasoning, a reply after the last user message with its think block, the generation prompt opening one (or
// closing it when thinking is off).
TEST(ChatTemplateDeepseek3, V4FromItsFileOpensOrClosesTheThinkBlock) {
  const gguf::GgufFile file =
      gguf::GgufFile::open(std::string(HETMOE_TEST_DATA_DIR) + "/models/tiny-deepseek4-Q4_K_M.gguf");
  std::string warning;
  const ChatTemplate t = ChatTemplate::detect(file, deepseek_vocab(), &warning);
  EXPECT_TRUE(warning.empty()) << warning;
  EXPECT_EQ(t.name(), "deepseek-v4");
  const std::vector<ChatMessage> chat = {
      {"system", "S1"}, {"user", "Hi"}, {"user", "More"}, {"system", "S2"}, {"assistant", "<think>\nr</think>Hello"},
      {"user", "Again"}};
  EXPECT_EQ(t.render(chat, {}),
            "<｜begin▁of▁sentence｜>S1\n\nS2<｜User｜>Hi\n\nMore<｜Assistant｜></think>Hello<｜end▁of▁sentence｜>"
            "<｜User｜>Again<｜Assistant｜><think>");
  EXPECT_EQ(t.render(chat, {.enable_thinking = false}).substr(t.render(chat, {}).size() - 7), "</think>");
  const std::vector<ChatMessage> answered = {{"user", "q"}, {"assistant", "<think>\nr</think>A"}};
  EXPECT_EQ(t.render(answered, {.add_generation_prompt = false}),
            "<｜begin▁of▁sentence｜><｜User｜>q<｜Assistant｜><think>\nr</think>A<｜end▁of▁sentence｜>");
  EXPECT_EQ(t.render(answered, {.add_generation_prompt = false, .enable_thinking = false}),
            "<｜begin▁of▁sentence｜><｜User｜>q<｜Assistant｜></think>A<｜end▁of▁sentence｜>");
  EXPECT_EQ(t.render(std::vector<ChatMessage>{{"user", "q"}, {"assistant", "plain"}}, {.add_generation_prompt = false}),
            "<｜begin▁of▁sentence｜><｜User｜>q<｜Assistant｜><think></think>plain<｜end▁of▁sentence｜>");
  // A reply cut off inside its think block is all reasoning.
  EXPECT_EQ(t.render(std::vector<ChatMessage>{{"user", "q"}, {"assistant", "<think>unfinished"}},
                     {.add_generation_prompt = false}),
            "<｜begin▁of▁sentence｜><｜User｜>q<｜Assistant｜><think>unfinished</think><｜end▁of▁sentence｜>");
  EXPECT_EQ(ChatTemplate::by_name("deepseek-v4", deepseek_vocab())->render(chat, {}), t.render(chat, {}));
  // A developer message is a user turn here (and counts as one for the reasoning kept).
  EXPECT_TRUE(t.takes_developer());
  const std::vector<ChatMessage> developer = {
      {"system", "S"}, {"user", "Hi"}, {"developer", "D"}, {"assistant", "<think>r</think>Hello"}, {"developer", "D2"}};
  EXPECT_EQ(t.render(developer, {}),
            "<｜begin▁of▁sentence｜>S<｜User｜>Hi\n\nD<｜Assistant｜></think>Hello<｜end▁of▁sentence｜><｜User｜>D2"
            "<｜Assistant｜><think>");
}

// DeepSeek-V3.2's own template (the tiny model's copy), as its Jinja renders with llama.cpp's enable_thinking: every
// user message opens its own <｜User｜>, a past reply opens with "</think>" (or, thinking, after the last user
// message, with its think block), and the generation prompt closes an empty think block unless thinking.
TEST(ChatTemplateDeepseek3, V32FromItsFileClosesTheThinkBlockUnlessThinking) {
  const gguf::GgufFile file =
      gguf::GgufFile::open(std::string(HETMOE_TEST_DATA_DIR) + "/models/tiny-deepseek32-Q4_K_M.gguf");
  std::string warning;
  const ChatTemplate t = ChatTemplate::detect(file, deepseek_vocab(), &warning);
  EXPECT_TRUE(warning.empty()) << warning;
  EXPECT_EQ(t.name(), "deepseek-v3.2");
  EXPECT_EQ(t.tool_call_format(), ToolCallFormat::kDsmlFunctionCalls);
  const std::vector<ChatMessage> chat = {
      {"system", "S1"}, {"user", "Hi"}, {"user", "More"}, {"system", "S2"}, {"assistant", "<think>r</think>Hello"},
      {"user", "Again"}};
  EXPECT_EQ(t.render(chat, {.enable_thinking = false}),
            "<｜begin▁of▁sentence｜>S1\n\nS2<｜User｜>Hi<｜User｜>More<｜Assistant｜></think>Hello<｜end▁of▁sentence｜>"
            "<｜User｜>Again<｜Assistant｜><think></think>");
  EXPECT_TRUE(t.render(chat, {}).ends_with("<｜User｜>Again<｜Assistant｜><think>")) << t.render(chat, {});
  const std::vector<ChatMessage> answered(chat.begin(), chat.end() - 1);
  EXPECT_EQ(t.render(answered, {.add_generation_prompt = false}),
            "<｜begin▁of▁sentence｜>S1\n\nS2<｜User｜>Hi<｜User｜>More<｜Assistant｜><think>r</think>Hello"
            "<｜end▁of▁sentence｜>");
  EXPECT_EQ(ChatTemplate::by_name("deepseek-v3.2", deepseek_vocab())->render(chat, {}), t.render(chat, {}));
  // Systems joined as the template joins them: "\n\n" before every one after the first, empty or not.
  EXPECT_EQ(
      t.render(std::vector<ChatMessage>{{"system", ""}, {"system", "B"}, {"user", "q"}}, {.enable_thinking = false}),
      "<｜begin▁of▁sentence｜>\n\nB<｜User｜>q<｜Assistant｜><think></think>");
  // A developer message is not written, but counts as the last user message: the reply before it loses its
  // reasoning, and no generation prompt follows it.
  EXPECT_TRUE(t.takes_developer());
  const std::vector<ChatMessage> developer = {
      {"system", "S"}, {"user", "Hi"}, {"developer", "D"}, {"assistant", "<think>r</think>Hello"}, {"developer", "D2"}};
  EXPECT_EQ(t.render(developer, {}),
            "<｜begin▁of▁sentence｜>S<｜User｜>Hi<｜Assistant｜></think>Hello<｜end▁of▁sentence｜>");
  // Elsewhere a developer message is the server's to turn into a system message; the templates refuse it.
  const ChatTemplate chatml = *ChatTemplate::by_name("chatml", deepseek_vocab());
  EXPECT_FALSE(chatml.takes_developer());
  EXPECT_THROW(chatml.render(developer, {}), Error);
}

TEST(ChatTemplateDetect, TheNewReferenceModelsTemplatesMapToTheirFormats) {
  struct Case {
    const char* model;
    TemplateKind kind;
  };
  for (const Case c :
       {Case{"tiny-glm4moe-F16.gguf", TemplateKind::kGlm4}, Case{"tiny-minimax-m2-F16.gguf", TemplateKind::kMinimax},
        Case{"tiny-gptoss-F16.gguf", TemplateKind::kHarmony}}) {
    const std::string path = std::string(HETMOE_SHARED_REF) + "/models/" + c.model;
    if (!std::ifstream(path)) HETMOE_MISSING_REFERENCE(path);
    const gguf::GgufFile file = gguf::GgufFile::open(path);
    std::string warning;
    EXPECT_EQ(ChatTemplate::detect(file, deepseek_vocab(), &warning).kind(), c.kind) << c.model;
    EXPECT_TRUE(warning.empty()) << warning;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Generic

TEST(ChatTemplateGeneric, PlainHeadersAndEosAfterReplies) {
  const ChatTemplate t = named("generic", deepseek_vocab());
  EXPECT_EQ(render(t, kTwoTurns),
            "### System:\nYou are terse.\n\n### User:\nHi\n\n### Assistant:\nHello!<｜end▁of▁sentence｜>\n\n"
            "### User:\n2+2?\n\n### Assistant:\n");
  const VocabOnly no_specials({"a"}, std::nullopt, std::nullopt);
  EXPECT_EQ(render(named("generic", no_specials), {{"user", "u"}, {"assistant", "a"}}, false),
            "### User:\nu\n\n### Assistant:\na\n\n");
}

// ---------------------------------------------------------------------------------------------------------------
// Every format

TEST(ChatTemplate, UnknownRolesFailInEveryFormat) {
  for (const std::string& name : ChatTemplate::names()) {
    const ChatTemplate t = named(name, deepseek_vocab());
    // A tool's result only where the format has tool calls.
    if (t.tool_call_format() == ToolCallFormat::kNone) {
      EXPECT_THROW(render(t, {{"user", "u"}, {"tool", "42"}}), Error) << name;
    } else {
      const std::vector<ChatMessage> called = {
          {.role = "user", .content = "u"},
          {.role = "assistant", .content = "", .tool_calls = {{.id = "1", .name = "f", .arguments = "{}"}}},
          {.role = "tool", .content = "42"}};
      EXPECT_NO_THROW(render(t, called)) << name;
    }
    try {
      render(t, {{"ipython", "x"}});
      ADD_FAILURE() << name << " accepted role ipython";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("ipython"), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  }
}

TEST(ChatTemplate, NamesRoundTripThroughByName) {
  const std::vector<std::string> names = ChatTemplate::names();
  EXPECT_EQ(names, (std::vector<std::string>{"deepseek3", "deepseek-r1", "deepseek-v3.1", "deepseek-v3.2",
                                             "deepseek-v4", "deepseek2", "chatml", "qwen3.5", "mistral", "llama3",
                                             "kimi-k2", "glm4", "minimax-m2", "gpt-oss", "generic"}));
  for (const std::string& name : names) EXPECT_EQ(named(name, deepseek_vocab()).name(), name);
  EXPECT_EQ(named("deepseek-r1", deepseek_vocab()).kind(), TemplateKind::kDeepseek3);
  EXPECT_EQ(named("qwen3", qwen_vocab()).name(), "chatml");
  EXPECT_FALSE(ChatTemplate::by_name("", deepseek_vocab()));
  EXPECT_FALSE(ChatTemplate::by_name("DeepSeek3", deepseek_vocab()));
  EXPECT_FALSE(ChatTemplate::by_name("llama2", deepseek_vocab()));
}

TEST(ChatTemplate, EmptyConversation) {
  EXPECT_EQ(render(named("deepseek3", deepseek_vocab()), {}), "<｜begin▁of▁sentence｜><｜Assistant｜>");
  EXPECT_EQ(render(named("chatml", qwen_vocab()), {}), "<|im_start|>assistant\n");
  EXPECT_EQ(render(named("llama3", llama3_vocab()), {}), "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(render(named("mistral", mixtral_vocab()), {}), "<s>");
}

// ---------------------------------------------------------------------------------------------------------------
// Detection

TEST(ChatTemplateDetect, OfficialTemplatesMapToTheirFormats) {
  struct Case {
    std::string_view tmpl;
    TemplateKind kind;
    std::string_view name;
  };
  const Case cases[] = {
      {kDeepseekV3Template, TemplateKind::kDeepseek3, "deepseek3"},
      {kDeepseekR1Template, TemplateKind::kDeepseek3, "deepseek-r1"},
      {kDeepseekV31Template, TemplateKind::kDeepseek3, "deepseek-v3.1"},
      {kDeepseekV3_0324Template, TemplateKind::kDeepseek3, "deepseek3"},
      {kDeepseekV2Template, TemplateKind::kDeepseek2, "deepseek2"},
      {kQwen3Template, TemplateKind::kChatml, "chatml"},
      {kQwen2Template, TemplateKind::kChatml, "chatml"},
      {kMixtralTemplate, TemplateKind::kMistral, "mistral"},
      {kMixtralFirstTemplate, TemplateKind::kMistral, "mistral"},
      {kLlama3Template, TemplateKind::kLlama3, "llama3"},
      {kKimiK2Template, TemplateKind::kKimiK2, "kimi-k2"},
  };
  for (const Case& c : cases) {
    std::string warning = "unchanged";
    const ChatTemplate t = detected(c.tmpl, deepseek_vocab(), &warning);
    EXPECT_EQ(t.kind(), c.kind) << c.tmpl;
    EXPECT_EQ(t.name(), c.name) << c.tmpl;
    EXPECT_EQ(warning, "unchanged") << c.tmpl;
  }
}

TEST(ChatTemplateDetect, DetectedTemplatesRenderLikeTheNamedOnes) {
  EXPECT_EQ(render(detected(kDeepseekV3Template, deepseek_vocab()), kTwoTurns),
            render(named("deepseek3", deepseek_vocab()), kTwoTurns));
  const std::vector<ChatMessage> reasoning = {{"user", "u"}, {"assistant", "<think>t</think>a"}, {"user", "v"}};
  EXPECT_EQ(
      render(detected(kDeepseekR1Template, deepseek_vocab()), reasoning),
      "<｜begin▁of▁sentence｜><｜User｜>u<｜Assistant｜>a<｜end▁of▁sentence｜><｜User｜>v<｜Assistant｜><think>\n");
  EXPECT_EQ(render(detected(kMixtralTemplate, mixtral_vocab()), kTwoTurns),
            render(named("mistral", mixtral_vocab()), kTwoTurns));
  EXPECT_EQ(render(detected(kLlama3Template, llama3_vocab()), kTwoTurns),
            render(named("llama3", llama3_vocab()), kTwoTurns));
  EXPECT_EQ(render(detected(kDeepseekV2Template, deepseek_vocab()), kTwoTurns),
            render(named("deepseek2", deepseek_vocab()), kTwoTurns));
}

TEST(ChatTemplateDetect, MissingOrUnknownTemplateFallsBackWithAWarning) {
  std::string warning;
  TemplateFile none(std::nullopt);
  EXPECT_EQ(ChatTemplate::detect(*none.file, deepseek_vocab(), &warning).kind(), TemplateKind::kGeneric);
  EXPECT_NE(warning.find("no tokenizer.chat_template"), std::string::npos) << warning;
  EXPECT_EQ(warning.find('\n'), std::string::npos) << warning;

  warning.clear();
  EXPECT_EQ(detected("", deepseek_vocab(), &warning).kind(), TemplateKind::kGeneric);
  EXPECT_FALSE(warning.empty());

  warning.clear();
  EXPECT_EQ(detected("{{ messages | tojson }}", deepseek_vocab(), &warning).kind(), TemplateKind::kGeneric);
  EXPECT_NE(warning.find("not a format hetmoe knows"), std::string::npos) << warning;

  // A value that is not a string is a template hetmoe does not know, not a reason to refuse the model.
  warning.clear();
  TemplateFile number("", true);
  EXPECT_EQ(ChatTemplate::detect(*number.file, deepseek_vocab(), &warning).kind(), TemplateKind::kGeneric);
  EXPECT_NE(warning.find("not a format hetmoe knows"), std::string::npos) << warning;

  // A null warning pointer is allowed.
  EXPECT_EQ(detected("{{ x }}", deepseek_vocab()).kind(), TemplateKind::kGeneric);
}

TEST(ChatTemplateDetect, TinyReferenceModelsHaveNoTemplate) {
  const gguf::GgufFile file =
      gguf::GgufFile::open(std::string(HETMOE_TEST_DATA_DIR) + "/models/tiny-deepseek3-Q4_K_M.gguf");
  std::string warning;
  const ChatTemplate t = ChatTemplate::detect(file, deepseek_vocab(), &warning);
  EXPECT_EQ(t.kind(), TemplateKind::kGeneric);
  EXPECT_NE(warning.find("tiny-deepseek3-Q4_K_M.gguf"), std::string::npos) << warning;
}

TEST(ChatTemplate, MissingBosAndEosRenderAsNothing) {
  const VocabOnly no_specials({"a"}, std::nullopt, std::nullopt);
  EXPECT_EQ(render(named("deepseek2", no_specials), {{"user", "u"}, {"assistant", "a"}}),
            "User: u\n\nAssistant: aAssistant:");
  const VocabOnly out_of_range({"a"}, 7, -1);
  EXPECT_EQ(render(named("mistral", out_of_range), {{"user", "u"}, {"assistant", "a"}}), " [INST] u [/INST] a");
}

}  // namespace
}  // namespace hetmoe::text

namespace hetmoe::text {
namespace {

// Render options with one tool, get_weather without parameters.
RenderOptions weather_tool() {
  RenderOptions options;
  options.tools.push_back(
      nlohmann::ordered_json::parse(R"({"type":"function","function":{"name":"get_weather","parameters":{}}})"));
  return options;
}

// A reply pushed through `p` in pieces of `piece` bytes, then flushed: all its content and calls.
ToolCallParser::Parts parse_in_pieces(ToolCallParser& p, std::string_view reply, size_t piece) {
  ToolCallParser::Parts all;
  for (size_t i = 0; i < reply.size(); i += piece) {
    ToolCallParser::Parts part = p.push(reply.substr(i, piece));
    all.content += part.content;
    all.calls.insert(all.calls.end(), part.calls.begin(), part.calls.end());
  }
  all.content += p.flush().content;
  return all;
}

// The reply parsed in pieces of 1, 5 and 1000 bytes gives `content` and two calls, get_weather with {"city": "Paris"}
// and now; the calls of the whole reply are returned.
std::vector<ToolCall> expect_weather_and_now(ToolCallFormat format, const std::string& reply,
                                             const std::string& content) {
  std::vector<ToolCall> calls;
  for (size_t piece : {1, 5, 1000}) {
    ToolCallParser p(format);
    const ToolCallParser::Parts parts = parse_in_pieces(p, reply, piece);
    EXPECT_EQ(parts.content, content) << piece;
    calls = parts.calls;
    if (calls.size() != 2) {
      ADD_FAILURE() << calls.size() << " calls in pieces of " << piece;
      continue;
    }
    EXPECT_EQ(calls[0].name, "get_weather");
    EXPECT_EQ(calls[0].arguments, R"({"city":"Paris"})");
    EXPECT_EQ(calls[1].name, "now");
    EXPECT_EQ(calls[1].arguments, "{}");
  }
  return calls;
}

// Qwen3's template with tools, as its Jinja writes it: the tool list in the system turn (json.dumps spacing, keys in
// the client's order, non-ASCII as is), a reply's reasoning and calls, two tool results in one user turn, and the
// conversation going on after them (the last query is the user message, so the reply after it keeps its reasoning).
TEST(ChatTemplateTools, Qwen3RendersToolsCallsAndResultsAsItsTemplate) {
  const ChatTemplate t = *ChatTemplate::by_name("qwen3", qwen_vocab());
  EXPECT_EQ(t.tool_call_format(), ToolCallFormat::kHermes);
  RenderOptions options;
  options.tools.push_back(nlohmann::ordered_json::parse(
      R"({"type":"function","function":{"name":"get_weather","description":"Météo \"now\"","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}})"));
  const std::vector<ChatMessage> chat = {
      {.role = "system", .content = "Be brief."},
      {.role = "user", .content = "Weather in Paris and Rome?"},
      {.role = "assistant",
       .content = "<think>\nTwo cities.\n</think>\n\nChecking.",
       .tool_calls = {{.id = "a", .name = "get_weather", .arguments = R"({"city": "Paris"})"},
                      {.id = "b", .name = "get_weather", .arguments = R"({"city": "Rome"})"}}},
      {.role = "tool", .content = "18C", .tool_call_id = "a"},
      {.role = "tool", .content = "24C", .tool_call_id = "b"}};
  const std::string expected =
      "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist with the user "
      "query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
      R"({"type": "function", "function": {"name": "get_weather", "description": "Météo \"now\"", "parameters": )"
      R"({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})"
      "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
      "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
      "<args-json-object>}\n</tool_call><|im_end|>\n"
      "<|im_start|>user\nWeather in Paris and Rome?<|im_end|>\n"
      "<|im_start|>assistant\n<think>\nTwo cities.\n</think>\n\nChecking.\n<tool_call>\n{\"name\": \"get_weather\", "
      "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
      "{\"city\": \"Rome\"}}\n</tool_call><|im_end|>\n"
      "<|im_start|>user\n<tool_response>\n18C\n</tool_response>\n<tool_response>\n24C\n</tool_response><|im_end|>\n"
      "<|im_start|>assistant\n";
  EXPECT_EQ(t.render(chat, options), expected);
  // Without tools, a conversation with no tool messages renders as before.
  const std::vector<ChatMessage> plain = {{.role = "user", .content = "hi"}};
  EXPECT_EQ(t.render(plain, {}), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
}

// GLM-4.5's template with tools (trim_blocks whitespace): the list after "[gMASK]<sop>", a reply's calls with their
// arguments as key/value tags (strings bare, numbers as JSON), tool results after "<|observation|>".
TEST(ChatTemplateTools, Glm45RendersToolsCallsAndResultsAsItsTemplate) {
  const ChatTemplate t = *ChatTemplate::by_name("glm4", deepseek_vocab());
  EXPECT_EQ(t.tool_call_format(), ToolCallFormat::kGlm);
  RenderOptions options = weather_tool();
  const std::vector<ChatMessage> chat = {
      {.role = "user", .content = "Weather in Paris?"},
      {.role = "assistant",
       .content = "",
       .tool_calls = {{.id = "a", .name = "get_weather", .arguments = R"({"city": "Paris", "days": 2})"}}},
      {.role = "tool", .content = "18C", .tool_call_id = "a"}};
  EXPECT_EQ(t.render(chat, options),
            "[gMASK]<sop><|system|>\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
            "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {}}}\n</tools>\n\n"
            "For each function call, output the function name and arguments within the following XML format:\n"
            "<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n<arg_value>{arg-value-1}</arg_value>\n"
            "<arg_key>{arg-key-2}</arg_key>\n<arg_value>{arg-value-2}</arg_value>\n...\n</tool_call>"
            "<|user|>\nWeather in Paris?<|assistant|>\n<think></think>\n<tool_call>get_weather\n"
            "<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n"
            "</tool_call><|observation|>\n<tool_response>\n18C\n</tool_response><|assistant|>");
}

TEST(ToolCalls, GlmCallsComeOutOfTheStream) {
  const std::string reply =
      "Sure.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days"
      "</arg_key>\n<arg_value>2</arg_value>\n</tool_call>\n<tool_call>oops <b></tool_call>";
  for (size_t piece : {1, 5, 1000}) {
    ToolCallParser p(ToolCallFormat::kGlm);
    const auto [content, calls] = parse_in_pieces(p, reply, piece);
    ASSERT_EQ(calls.size(), 1u) << piece;
    EXPECT_EQ(calls[0].name, "get_weather");
    EXPECT_EQ(calls[0].arguments, R"({"city":"Paris","days":2})");
    EXPECT_EQ(content, "Sure.\n<tool_call>oops <b></tool_call>");
  }
}

// Qwen3.5's template with tools: the list and instructions before the (trimmed) system message, a reply's reasoning
// (after the last query) and calls with one <parameter=...> per argument (strings bare, numbers as they print,
// objects as JSON), results in a user turn; the generation prompt opens the think block.
TEST(ChatTemplateTools, Qwen35RendersToolsCallsAndResultsAsItsTemplate) {
  const ChatTemplate t = *ChatTemplate::by_name("qwen3.5", qwen_vocab());
  EXPECT_EQ(t.tool_call_format(), ToolCallFormat::kXml);
  RenderOptions options = weather_tool();
  const std::vector<ChatMessage> chat = {
      {.role = "system", .content = " Be brief. "},
      {.role = "user", .content = "Weather in Paris?"},
      {.role = "assistant",
       .content = "<think>\nCall it.\n</think>\n\nChecking.",
       .tool_calls = {{.id = "a",
                       .name = "get_weather",
                       .arguments = R"({"city": "Paris", "days": 2, "opts": {"u": "C"}})"}}},
      {.role = "tool", .content = "18C", .tool_call_id = "a"}};
  const std::string expected =
      "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n"
      "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {}}}\n</tools>\n\n"
      "If you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n"
      "<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
      "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
      "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified "
      "format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n- "
      "Required parameters MUST be specified\n- You may provide optional reasoning for your function call in natural "
      "language BEFORE the function call, but NOT after\n- If there is no function call available, answer the "
      "question like normal with your current knowledge and do not tell the user about function calls\n"
      "</IMPORTANT>\n\nBe brief.<|im_end|>\n"
      "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
      "<|im_start|>assistant\n<think>\nCall it.\n</think>\n\nChecking.\n\n<tool_call>\n<function=get_weather>\n"
      "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n<parameter=opts>\n{\"u\": \"C\"}\n"
      "</parameter>\n</function>\n</tool_call><|im_end|>\n"
      "<|im_start|>user\n<tool_response>\n18C\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n";
  EXPECT_EQ(t.render(chat, options), expected);
}

// Qwen3.5's calls come back with their parameters typed: a "string" parameter stays text, others are read as JSON.
TEST(ToolCalls, Qwen35CallsComeOutWithTypedParameters) {
  const std::vector<nlohmann::ordered_json> tools = {nlohmann::ordered_json::parse(
      R"({"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"code":{"type":"string"},"n":{"type":"integer"}}}}})")};
  const std::string reply =
      "Ok.\n\n<tool_call>\n<function=f>\n<parameter=code>\n42\n</parameter>\n<parameter=n>\n7\n</parameter>\n"
      "<parameter=text>\ntwo\nlines\n</parameter>\n</function>\n</tool_call>";
  for (size_t piece : {1, 9, 1000}) {
    ToolCallParser p(ToolCallFormat::kXml, tools);
    const auto [content, calls] = parse_in_pieces(p, reply, piece);
    ASSERT_EQ(calls.size(), 1u) << piece;
    EXPECT_EQ(calls[0].name, "f");
    EXPECT_EQ(calls[0].arguments, R"({"code":"42","n":7,"text":"two\nlines"})");
    EXPECT_EQ(content, "Ok.\n\n");
  }
}

// MiniMax-M2's template with tools: each tool's function object in <tool> tags after the system text, calls as
// <invoke> blocks in one <minimax:tool_call>, results after "]~b]tool" in <response> tags.
TEST(ChatTemplateTools, MinimaxM2RendersToolsCallsAndResultsAsItsTemplate) {
  const ChatTemplate t = *ChatTemplate::by_name("minimax-m2", deepseek_vocab());
  EXPECT_EQ(t.tool_call_format(), ToolCallFormat::kMinimax);
  RenderOptions options = weather_tool();
  const std::vector<ChatMessage> chat = {
      {.role = "user", .content = "Weather?"},
      {.role = "assistant",
       .content = "Checking.",
       .tool_calls = {{.id = "a", .name = "get_weather", .arguments = R"({"city": "Paris", "days": 2})"}}},
      {.role = "tool", .content = "18C", .tool_call_id = "a"}};
  EXPECT_EQ(
      t.render(chat, options),
      "]~!b[]~b]system\nYou are a helpful assistant.\n\n# Tools\nYou may call one or more tools to assist with the "
      "user query.\nHere are the tools available in JSONSchema format:\n\n<tools>\n"
      "<tool>{\"name\": \"get_weather\", \"parameters\": {}}</tool>\n</tools>\n\nWhen making tool calls, use XML "
      "format to invoke tools and pass parameters:\n\n<minimax:tool_call>\n<invoke name=\"tool-name-1\">\n"
      "<parameter name=\"param-key-1\">param-value-1</parameter>\n<parameter name=\"param-key-2\">param-value-2"
      "</parameter>\n...\n</invoke>\n</minimax:tool_call>[e~[\n]~b]user\nWeather?[e~[\n]~b]ai\nChecking.\n"
      "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Paris</parameter>\n"
      "<parameter name=\"days\">2</parameter>\n</invoke>\n</minimax:tool_call>[e~[\n]~b]tool\n<response>18C"
      "</response>[e~[\n]~b]ai\n<think>\n");
  // A tool result with no call before it is refused, as the template raises.
  const std::vector<ChatMessage> orphan = {{.role = "user", .content = "x"}, {.role = "tool", .content = "y"}};
  EXPECT_THROW(t.render(orphan, options), Error);
}

TEST(ToolCalls, MinimaxCallsComeOutTogether) {
  const std::string reply =
      "Ok.\n<minimax:tool_call>\n<invoke name=\"a\">\n<parameter name=\"x\">1</parameter>\n</invoke>\n"
      "<invoke name=\"b\">\n<parameter name=\"s\">hi there</parameter>\n</invoke>\n</minimax:tool_call>";
  for (size_t piece : {1, 4, 1000}) {
    ToolCallParser p(ToolCallFormat::kMinimax);
    const auto [content, calls] = parse_in_pieces(p, reply, piece);
    ASSERT_EQ(calls.size(), 2u) << piece;
    EXPECT_EQ(calls[0].name, "a");
    EXPECT_EQ(calls[0].arguments, R"({"x":1})");
    EXPECT_EQ(calls[1].arguments, R"({"s":"hi there"})");
    EXPECT_EQ(content, "Ok.\n");
  }
}

// DeepSeek-V3.2's and V4's templates with tools, as their Jinja writes them (the tiny models' copies): the tool list
// after the system prompt, a reply's calls as one DSML block (string="true" for a string argument, JSON otherwise;
// V4 writes an empty invoke with a blank line), the results in <function_results> after the call (V3.2) or in a user
// turn as <tool_result>s (V4), and the conversation going on after them.
const std::vector<nlohmann::ordered_json>& dsml_tools() {
  static const std::vector<nlohmann::ordered_json> tools = {
      nlohmann::ordered_json::parse(R"({"type":"function","function":{"name":"get_weather","description":"Weather",
          "parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}}}}})"),
      nlohmann::ordered_json::parse(R"({"type":"function","function":{"name":"now","parameters":{}}})")};
  return tools;
}
std::vector<ChatMessage> dsml_chat(bool goes_on) {
  std::vector<ChatMessage> chat = {
      {.role = "system", .content = "S"},
      {.role = "user", .content = "Weather?"},
      {.role = "assistant",
       .content = "Checking.",
       .tool_calls = {{.id = "a", .name = "get_weather", .arguments = R"({"city": "Paris", "days": 2})"},
                      {.id = "b", .name = "now", .arguments = "{}"}}},
      {.role = "tool", .content = "18C", .tool_call_id = "a"},
      {.role = "tool", .content = "noon", .tool_call_id = "b"}};
  if (goes_on) {
    chat.push_back({.role = "assistant", .content = "It is 18C."});
    chat.push_back({.role = "user", .content = "Thanks"});
  }
  return chat;
}

TEST(ChatTemplateTools, DeepseekV32RendersToolsCallsAndResultsAsItsTemplate) {
  const ChatTemplate t = *ChatTemplate::by_name("deepseek-v3.2", deepseek_vocab());
  RenderOptions options{.enable_thinking = false, .tools = dsml_tools()};
  const std::string head =
      "<｜begin▁of▁sentence｜>S\n\n"
      "## Tools\n\nYou have access to a set of tools you can use to answer the user's question.\n"
      "You can invoke functions by writing a \"<｜DSML｜function_calls>\" block like the following as part of you"
      "r reply to the user:\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"$FUNCTION_NAME\">\n"
      "<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n"
      "...\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"$FUNCTION_NAME2\">\n"
      "...\n</｜DSML｜invoke>\n</｜DSML｜function_calls>\n\nString and scalar parameters should be specified as is "
      "without any escaping or quotes, while lists and objects should use JSON format. The \"string\" attribute"
      " should be set to \"true\" for string type parameters and \"false\" for other types (numbers, booleans, "
      "arrays, objects).\n\nIf the thinking_mode is enabled, then after function results you should strongly co"
      "nsider outputting a thinking block. Here is an example:\n\n<｜DSML｜function_calls>\n"
      "...\n</｜DSML｜function_calls>\n\n<function_results>\n...\n</function_results>\n"
      "\n<think>...thinking about results</think>\n\nHere are the functions available in JSONSchema format:\n"
      "<functions>\n{\"name\": \"get_weather\", \"description\": \"Weather\", \"parameters\": {\"type\": \"obje"
      "ct\", \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": {\"type\": \"integer\"}}}}\n"
      "{\"name\": \"now\", \"parameters\": {}}\n</functions>\n<｜User｜>Weather?<｜Assistant｜>";
  const std::string calls =
      "Checking.\n\n<｜DSML｜function_calls>\n"
      "<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜paramet"
      "er>\n<｜DSML｜parameter name=\"days\" string=\"false\">2</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n<｜DSML｜invoke name=\"now\">\n</｜DSML｜invoke>\n"
      "</｜DSML｜function_calls><｜end▁of▁sentence｜>\n\n<function_results>\n"
      "<result>18C</result>\n<result>noon</result>\n</function_results>\n\n";
  EXPECT_EQ(t.render(dsml_chat(false), options), head + "</think>" + calls + "<think></think>");
  options.enable_thinking = true;
  EXPECT_EQ(t.render(dsml_chat(false), options), head + "<think></think>" + calls + "<think>");
  EXPECT_EQ(
      t.render(dsml_chat(true), options),
      head + "</think>" + calls + "</think>It is 18C.<｜end▁of▁sentence｜><｜User｜>Thanks<｜Assistant｜><think>");
  // A tool result with no call before it is refused (the template would index the wrong message).
  const std::vector<ChatMessage> orphan = {{.role = "user", .content = "x"}, {.role = "tool", .content = "y"}};
  EXPECT_THROW(t.render(orphan, options), Error);
}

TEST(ChatTemplateTools, DeepseekV4RendersToolsCallsAndResultsAsItsTemplate) {
  const ChatTemplate t = *ChatTemplate::by_name("deepseek-v4", deepseek_vocab());
  EXPECT_EQ(t.tool_call_format(), ToolCallFormat::kDsmlToolCalls);
  RenderOptions options{.enable_thinking = false, .tools = dsml_tools()};
  const std::string calls =
      "Checking.\n\n<｜DSML｜tool_calls>\n"
      "<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜paramet"
      "er>\n<｜DSML｜parameter name=\"days\" string=\"false\">2</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n<｜DSML｜invoke name=\"now\">\n\n</｜DSML｜invoke>\n"
      "</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>18C</tool_result>\n"
      "\n<tool_result>noon</tool_result><｜Assistant｜>";
  EXPECT_EQ(
      t.render(dsml_chat(false), options),
      "<｜begin▁of▁sentence｜>S\n\n"
      "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools b"
      "y writing a \"<｜DSML｜tool_calls>\" block like the following:\n\n"
      "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"$TOOL_NAME\">\n<｜DSML｜parameter name=\"$PARAMETER_NAME\" string"
      "=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n...\n</｜DSML｜invoke>\n"
      "<｜DSML｜invoke name=\"$TOOL_NAME2\">\n...\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>\n"
      "\nString parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, b"
      "ooleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n"
      "\nIf thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <th"
      "ink>...</think> BEFORE any tool calls or final response.\n\nOtherwise, output directly after </think> wi"
      "th tool calls or final response.\n\n### Available Tool Schemas\n"
      "\n{\"name\": \"get_weather\", \"description\": \"Weather\", \"parameters\": {\"type\": \"object\", \"pro"
      "perties\": {\"city\": {\"type\": \"string\"}, \"days\": {\"type\": \"integer\"}}}}\n"
      "{\"name\": \"now\", \"parameters\": {}}\n\nYou MUST strictly follow the above defined tool name and para"
      "meter schemas to invoke tool calls.\n<｜User｜>Weather?<｜Assistant｜></think>" +
          calls + "</think>");
  // Thinking, without tools in the request: the results in the conversation keep every reply's think block.
  EXPECT_EQ(t.render(dsml_chat(true), {}),
            "<｜begin▁of▁sentence｜>S<｜User｜>Weather?<｜Assistant｜><think></think>" + calls +
                "<think></think>It is 18C.<｜end▁of▁sentence｜><｜User｜>Thanks<｜Assistant｜><think>");
}

TEST(ToolCalls, DsmlCallsComeOutTypedByTheirStringMark) {
  const std::string reply =
      "Ok.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
      "<｜DSML｜parameter name=\"city\" string=\"true\">42</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"days\" string=\"false\">[1, 2]</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
      "<｜DSML｜invoke name=\"now\">\n</｜DSML｜invoke>\n</｜DSML｜function_calls>";
  for (size_t piece : {1, 5, 1000}) {
    ToolCallParser p(ToolCallFormat::kDsmlFunctionCalls, dsml_tools());
    const auto [content, calls] = parse_in_pieces(p, reply, piece);
    ASSERT_EQ(calls.size(), 2u) << piece;
    EXPECT_EQ(calls[0].name, "get_weather");
    EXPECT_EQ(calls[0].arguments, R"({"city":"42","days":[1,2]})");
    EXPECT_EQ(calls[1].name, "now");
    EXPECT_EQ(calls[1].arguments, "{}");
    EXPECT_EQ(content, "Ok.\n\n");
  }
  // V4's block name; a block V3.2 would write is text to V4's parser.
  std::string v4 = reply;
  for (size_t at; (at = v4.find("function_calls>")) != std::string::npos;) v4.replace(at, 15, "tool_calls>");
  ToolCallParser p4(ToolCallFormat::kDsmlToolCalls);
  EXPECT_EQ(parse_in_pieces(p4, v4, 3).calls.size(), 2u);
  ToolCallParser wrong(ToolCallFormat::kDsmlToolCalls);
  EXPECT_EQ(parse_in_pieces(wrong, reply, 1000).content, reply);
  // A parameter not closed leaves the block as text.
  ToolCallParser broken(ToolCallFormat::kDsmlFunctionCalls);
  const std::string unclosed =
      "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"x\" string=\"true\">1\n"
      "</｜DSML｜invoke>\n</｜DSML｜function_calls>";
  EXPECT_EQ(parse_in_pieces(broken, unclosed, 1000).content, unclosed);
}

// Kimi-K2 with tools, as Moonshot's later templates write them (the tool parts of K2-Thinking's, in llama.cpp's
// models/templates): the tools as JSON in a tool_declare turn before everything, a reply's calls with the model's own
// ids, a result as "## Return of ID" in a tool turn.
TEST(ChatTemplateTools, KimiK2RendersToolsCallsAndResultsAsItsTemplate) {
  const ChatTemplate t = *ChatTemplate::by_name("kimi-k2", deepseek_vocab());
  EXPECT_EQ(t.tool_call_format(), ToolCallFormat::kKimi);
  RenderOptions options = weather_tool();
  const std::vector<ChatMessage> chat = {
      {.role = "user", .content = "Weather?"},
      {.role = "assistant",
       .content = "Checking.",
       .tool_calls = {{.id = "functions.get_weather:0", .name = "get_weather", .arguments = R"({"city": "Paris"})"}}},
      {.role = "tool", .content = "18C", .tool_call_id = "functions.get_weather:0"}};
  EXPECT_EQ(t.render(chat, options),
            "<|im_system|>tool_declare<|im_middle|>[{\"type\": \"function\", \"function\": {\"name\": "
            "\"get_weather\", \"parameters\": {}}}]<|im_end|><|im_system|>system<|im_middle|>You are a helpful "
            "assistant<|im_end|><|im_user|>user<|im_middle|>Weather?<|im_end|><|im_assistant|>assistant<|im_middle|>"
            "Checking.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
            "<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>"
            "<|im_system|>tool<|im_middle|>## Return of functions.get_weather:0\n18C<|im_end|>"
            "<|im_assistant|>assistant<|im_middle|>");
}

TEST(ToolCalls, KimiCallsKeepTheModelsIds) {
  const std::vector<ToolCall> calls = expect_weather_and_now(
      ToolCallFormat::kKimi,
      "Sure.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
      "{\"city\": \"Paris\"}<|tool_call_end|> <|tool_call_begin|>functions.now:1<|tool_call_argument_begin|>{}"
      "<|tool_call_end|><|tool_calls_section_end|>",
      "Sure.");
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].id, "functions.get_weather:0");
  EXPECT_EQ(calls[1].id, "functions.now:1");
  // Arguments that are not a JSON object leave the block as text.
  ToolCallParser p(ToolCallFormat::kKimi);
  const std::string bad =
      "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>[1]<|tool_call_end|>"
      "<|tool_calls_section_end|>";
  EXPECT_EQ(parse_in_pieces(p, bad, 1000).content, bad);
}

// A forced call opens the reply in each format's syntax; what the model writes after it completes a call the parser
// reads.
TEST(ToolCalls, AForcedCallsOpeningParsesOnceCompleted) {
  struct Case {
    ToolCallFormat format;
    std::string rest;
  };
  for (const Case& c : {Case{ToolCallFormat::kHermes, "{\"x\": 1}}\n</tool_call>"},
                        Case{ToolCallFormat::kGlm, "<arg_key>x</arg_key>\n<arg_value>1</arg_value>\n</tool_call>"},
                        Case{ToolCallFormat::kXml, "<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>"},
                        Case{ToolCallFormat::kMinimax,
                             "<parameter name=\"x\">1</parameter>\n</invoke>\n"
                             "</minimax:tool_call>"},
                        Case{ToolCallFormat::kDsmlFunctionCalls,
                             "<｜DSML｜parameter name=\"x\" string=\"false\">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
                             "</｜DSML｜function_calls>"},
                        Case{ToolCallFormat::kDsmlToolCalls,
                             "<｜DSML｜parameter name=\"x\" string=\"false\">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
                             "</｜DSML｜tool_calls>"},
                        Case{ToolCallFormat::kKimi, "{\"x\": 1}<|tool_call_end|><|tool_calls_section_end|>"},
                        Case{ToolCallFormat::kDeepseekR1, "{\"x\": 1}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"},
                        Case{ToolCallFormat::kDeepseekV31, "{\"x\": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"}}) {
    ToolCallParser p(c.format);
    const auto [content, calls] = parse_in_pieces(p, call_opening(c.format, "f") + c.rest, 3);
    ASSERT_EQ(calls.size(), 1u) << static_cast<int>(c.format);
    EXPECT_EQ(calls[0].name, "f");
    EXPECT_EQ(calls[0].arguments, R"({"x":1})");
    EXPECT_EQ(content, "");
  }
  EXPECT_EQ(call_opening(ToolCallFormat::kNone, "f"), "");
  // Kimi-K2 numbers its call ids across the conversation.
  EXPECT_EQ(call_opening(ToolCallFormat::kKimi, "f", 3),
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:3<|tool_call_argument_begin|>");
}

// gpt-oss's template with tools (the tiny model's copy, rendered by its Jinja with trim_blocks and lstrip_blocks):
// the system message sends calls to the commentary channel; the developer message lists the tools as TypeScript
// types (with the whitespace the template's macro leaves in nested objects and oneOf unions); a reply's call goes to
// functions.NAME on the commentary channel, its content before it as analysis unless a later reply has no calls; a
// result answers from functions.NAME, JSON-quoted.
TEST(ChatTemplateTools, GptOssRendersToolsCallsAndResultsAsItsTemplate) {
  const ChatTemplate t = *ChatTemplate::by_name("gpt-oss", deepseek_vocab());
  EXPECT_EQ(t.tool_call_format(), ToolCallFormat::kHarmony);
  RenderOptions options{.date = "2026-12-01"};
  options.tools = {nlohmann::ordered_json::parse(R"({"type":"function","function":{"name":"get_weather",
      "description":"Weather in a city","parameters":{"type":"object","properties":{
      "city":{"type":"string","description":"The city"}, "days":{"type":"integer","default":1},
      "unit":{"type":"string","enum":["c","f"],"default":"c"}, "tags":{"type":"array","items":{"type":"string"}},
      "where":{"type":"object","properties":{"lat":{"type":"number"},"lon":{"type":"number"}},"required":["lat"]},
      "one":{"oneOf":[{"type":"string","description":"s"},{"type":"number","default":3}]},
      "both":{"type":["string","null"]}, "n":{"type":"string","nullable":true}},"required":["city"]}}})"),
                   nlohmann::ordered_json::parse(R"({"type":"function","function":{"name":"now",
      "description":"The time","parameters":{"type":"object","properties":{}}}})")};
  const std::vector<ChatMessage> called = {
      {.role = "system", .content = "S"},
      {.role = "user", .content = "Weather?"},
      {.role = "assistant",
       .content = "Let me check.",
       .tool_calls = {{.id = "a", .name = "get_weather", .arguments = R"({"city": "Paris", "days": 2})"}}},
      {.role = "tool", .content = "18C", .tool_call_id = "a"}};
  const std::string head =
      "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: "
      "2024-06\nCurrent date: 2026-12-01\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. "
      "Channel must be included for every message.\nCalls to these tools must go to the commentary channel: "
      "'functions'.<|end|><|start|>developer<|message|># Instructions\n\nS\n\n# Tools\n\n## functions\n\nnamespace "
      "functions {\n\n// Weather in a city\ntype get_weather = (_: {\n// The city\ncity: string,\ndays?: number, // "
      "default: 1,\nunit?: \"c\" | \"f\", // default: c,\ntags?: string[],\nwhere?: {\nlat: \n                "
      "number, lon?: \n                number},\none?: string// s | \nnumber                    // default: 3,\n"
      "both?: string | null,\nn?: string | null,\n}) => any;\n\n// The time\ntype now = () => any;\n\n} // "
      "namespace functions<|end|><|start|>user<|message|>Weather?<|end|>";
  const std::string call =
      "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\", "
      "\"days\": 2}<|call|><|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>\"18C\"<|end|>";
  EXPECT_EQ(t.render(called, options), head + "<|start|>assistant<|channel|>analysis<|message|>Let me check.<|end|>" +
                                           call + "<|start|>assistant");
  std::vector<ChatMessage> answered = called;
  answered.push_back({.role = "assistant", .content = "It is 18C."});
  answered.push_back({.role = "user", .content = "Thanks"});
  EXPECT_EQ(t.render(answered, options),
            head + call +
                "<|start|>assistant<|channel|>final<|message|>It is 18C.<|end|><|start|>user<|message|>Thanks<|end|>"
                "<|start|>assistant");
  // A result with no call before it is refused, as the template raises.
  const std::vector<ChatMessage> orphan = {{.role = "user", .content = "x"}, {.role = "tool", .content = "y"}};
  EXPECT_THROW(t.render(orphan, options), Error);
}

// gpt-oss's reply is a sequence of channel messages: analysis is reasoning, final is content, a commentary message to
// functions.NAME is a call (the reply ends at its <|call|>, which does not reach the text), whichever order the
// header's parts come in; text with no header is content.
TEST(ToolCalls, HarmonyChannelsComeApartInAnySplit) {
  const std::string reply =
      "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
      "to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}";
  for (size_t piece : {1, 7, 1000}) {
    HarmonyReply h;
    HarmonyReply::Parts all;
    for (size_t i = 0; i < reply.size(); i += piece) {
      HarmonyReply::Parts p = h.push(std::string_view(reply).substr(i, piece));
      all.reasoning += p.reasoning;
      all.content += p.content;
      all.calls.insert(all.calls.end(), p.calls.begin(), p.calls.end());
    }
    HarmonyReply::Parts end = h.flush();
    all.calls.insert(all.calls.end(), end.calls.begin(), end.calls.end());
    all.content += end.content;
    EXPECT_EQ(all.reasoning, "Need weather.") << piece;
    EXPECT_EQ(all.content, "") << piece;
    ASSERT_EQ(all.calls.size(), 1u) << piece;
    EXPECT_EQ(all.calls[0].name, "get_weather");
    EXPECT_EQ(all.calls[0].arguments, R"({"city":"Paris"})");
  }
  // The template's own order of the header, as a forced call's opening writes it.
  HarmonyReply forced;
  (void)forced.push(call_opening(ToolCallFormat::kHarmony, "now"));
  (void)forced.push("{}");
  EXPECT_EQ(forced.flush().calls.size(), 1u);
  // A final answer; then text without any header.
  HarmonyReply answer;
  HarmonyReply::Parts a =
      answer.push("<|channel|>analysis<|message|>r<|end|><|start|>assistant<|channel|>final<|message|>Hi");
  EXPECT_EQ(a.reasoning, "r");
  EXPECT_EQ(a.content + answer.flush().content, "Hi");
  // A call sent from the analysis channel is a call too.
  HarmonyReply analysis;
  (void)analysis.push("<|channel|>analysis to=functions.get_weather code<|message|>{\"city\":\"Berlin\"}");
  const HarmonyReply::Parts analysed = analysis.flush();
  ASSERT_EQ(analysed.calls.size(), 1u);
  EXPECT_EQ(analysed.calls[0].name, "get_weather");
  EXPECT_EQ(analysed.reasoning, "");
  HarmonyReply plain;
  const std::string text(300, 'x');
  EXPECT_EQ(plain.push(text).content + plain.flush().content, text);
}

// DeepSeek-R1's template with calls and results (its text in llama.cpp's models/templates, as the R1 distills carry
// it), DeepSeek-V3's and V3-0324's (their text from the files' tokenizer_config), rendered by Jinja: the first call of
// the conversation opens the block after <｜Assistant｜>, the next one a newline; results in one outputs block; the
// reply after them follows its end; no tool list (the templates have none).
TEST(ChatTemplateTools, DeepseekR1AndV3RenderCallsAndResultsAsTheirTemplates) {
  struct Case {
    ChatTemplate t;
    std::string_view generation_prompt;
  };
  const Case cases[] = {{*ChatTemplate::by_name("deepseek-r1", deepseek_vocab()), "<｜Assistant｜><think>\n"},
                        {detected(kDeepseekV3Template, deepseek_vocab()), "<｜Assistant｜>"},
                        {detected(kDeepseekV3_0324Template, deepseek_vocab()), "<｜Assistant｜>"}};
  for (const Case& c : cases) {
    EXPECT_EQ(c.t.tool_call_format(), ToolCallFormat::kDeepseekR1);
    std::vector<ChatMessage> chat = {
        {.role = "system", .content = "S"},
        {.role = "user", .content = "Weather?"},
        {.role = "assistant",
         .content = "",
         .tool_calls = {{.id = "a", .name = "get_weather", .arguments = R"({"city": "Paris"})"},
                        {.id = "b", .name = "now", .arguments = "{}"}}},
        {.role = "tool", .content = "18C", .tool_call_id = "a"},
        {.role = "tool", .content = "noon", .tool_call_id = "b"}};
    const std::string called =
        "<｜begin▁of▁sentence｜>S<｜User｜>Weather?<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function"
        "<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>"
        "function<｜tool▁sep｜>now\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>"
        "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>18C<｜tool▁output▁end｜>\n<｜tool▁output▁begin｜>noon"
        "<｜tool▁output▁end｜><｜tool▁outputs▁end｜>";
    EXPECT_EQ(c.t.render(chat, weather_tool()), called) << c.t.name();
    chat.push_back({.role = "assistant", .content = "It is 18C."});
    chat.push_back({.role = "user", .content = "Thanks"});
    EXPECT_EQ(c.t.render(chat, weather_tool()),
              called + "It is 18C.<｜end▁of▁sentence｜><｜User｜>Thanks" + std::string(c.generation_prompt))
        << c.t.name();
  }
}

// DeepSeek-V3-0324's template (rendered by Jinja) opens each calling reply's own block after its content, closes the
// results before the next call and opens no reply after the user turn's "<｜Assistant｜>".
TEST(ChatTemplateTools, DeepseekV3_0324OpensABlockPerCallingReply) {
  const ChatTemplate v3_0324 = detected(kDeepseekV3_0324Template, deepseek_vocab());
  const std::vector<ChatMessage> twice = {
      {.role = "user", .content = "Weather?"},
      {.role = "assistant",
       .content = "Checking.",
       .tool_calls = {{.id = "a", .name = "get_weather", .arguments = R"({"city": "Paris"})"}}},
      {.role = "tool", .content = "18C", .tool_call_id = "a"},
      {.role = "assistant", .content = "", .tool_calls = {{.id = "c", .name = "now", .arguments = "{}"}}},
      {.role = "tool", .content = "noon", .tool_call_id = "c"}};
  EXPECT_EQ(
      v3_0324.render(twice, weather_tool()),
      "<｜begin▁of▁sentence｜><｜User｜>Weather?<｜Assistant｜>Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>"
      "function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
      "<｜end▁of▁sentence｜><｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>18C<｜tool▁output▁end｜><"
      "｜tool▁outputs▁end｜>"
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>now\n```json\n{}\n```<｜tool▁call▁end｜>"
      "<｜tool▁calls▁end｜><｜end▁of▁sentence｜><｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>noon"
      "<｜tool▁output▁end｜><｜tool▁outputs▁end｜>");
}

TEST(ToolCalls, DeepseekR1CallsComeOutOfTheirFences) {
  expect_weather_and_now(
      ToolCallFormat::kDeepseekR1,
      "Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": "
      "\"Paris\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>now\n```\n{}\n```<"
      "｜tool▁call▁end｜>"
      "<｜tool▁calls▁end｜>",
      "Sure.");
}

// DeepSeek-V3.1's template (rendered by Jinja, thinking on and off): a reply after a user message opens
// "<｜Assistant｜></think>" and loses what precedes its first </think>; calls follow as NAME<｜tool▁sep｜>ARGS; each
// result in its own output markers, the reply after them written whole; the generation prompt after user messages
// only. No tool list (the template has none).
TEST(ChatTemplateTools, DeepseekV31RendersCallsAndResultsAsItsTemplate) {
  const ChatTemplate t = detected(kDeepseekV31Template, deepseek_vocab());
  EXPECT_EQ(t.tool_call_format(), ToolCallFormat::kDeepseekV31);
  EXPECT_FALSE(t.reads_think_blocks());  // a reply's reasoning is not written back
  std::vector<ChatMessage> chat = {{.role = "system", .content = "S1"},
                                   {.role = "system", .content = "S2"},
                                   {.role = "user", .content = "Hi"},
                                   {.role = "assistant", .content = "<think>hm</think>Hello"},
                                   {.role = "user", .content = "Weather?"}};
  const std::string plain =
      "<｜begin▁of▁sentence｜>S1\n\nS2<｜User｜>Hi<｜Assistant｜></think>Hello<｜end▁of▁sentence｜><｜User｜>Weather?";
  EXPECT_EQ(t.render(chat, {}), plain + "<｜Assistant｜><think>");
  EXPECT_EQ(t.render(chat, {.enable_thinking = false}), plain + "<｜Assistant｜></think>");
  chat.push_back({.role = "assistant",
                  .content = "",
                  .tool_calls = {{.id = "a", .name = "get_weather", .arguments = R"({"city": "Paris"})"},
                                 {.id = "b", .name = "now", .arguments = "{}"}}});
  chat.push_back({.role = "tool", .content = "18C", .tool_call_id = "a"});
  chat.push_back({.role = "tool", .content = "noon", .tool_call_id = "b"});
  const std::string called =
      plain +
      "<｜Assistant｜></think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}"
      "<｜tool▁call▁end｜><｜tool▁call▁begin｜>now<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜><"
      "｜end▁of▁sentence｜>"
      "<｜tool▁output▁begin｜>18C<｜tool▁output▁end｜><｜tool▁output▁begin｜>noon<｜tool▁output▁end｜>";
  EXPECT_EQ(t.render(chat, weather_tool()), called);
  chat.push_back({.role = "assistant", .content = "It is 18C.</think>x"});
  chat.push_back({.role = "user", .content = "Thanks"});
  RenderOptions no_think = weather_tool();
  no_think.enable_thinking = false;
  EXPECT_EQ(t.render(chat, no_think),
            called + "It is 18C.</think>x<｜end▁of▁sentence｜><｜User｜>Thanks<｜Assistant｜></think>");
}

TEST(ToolCalls, DeepseekV31CallsNameThenArguments) {
  expect_weather_and_now(ToolCallFormat::kDeepseekV31,
                         "Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": "
                         "\"Paris\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>now<｜tool▁sep｜>{}<｜tool▁call▁end｜>"
                         "<｜tool▁calls▁end｜>",
                         "Sure.");
}

TEST(ChatTemplateTools, FormatsWithoutToolCallsRefuseThem) {
  const ChatTemplate t = *ChatTemplate::by_name("deepseek2", deepseek_vocab());
  EXPECT_EQ(t.tool_call_format(), ToolCallFormat::kNone);  // DeepSeek-V2's template has no calls
  RenderOptions options;
  options.tools.push_back(nlohmann::ordered_json::parse(R"({"type":"function","function":{"name":"f"}})"));
  const std::vector<ChatMessage> chat = {{.role = "user", .content = "hi"}};
  EXPECT_THROW(t.render(chat, options), Error);
  const std::vector<ChatMessage> with_tool = {{.role = "user", .content = "hi"}, {.role = "tool", .content = "x"}};
  EXPECT_THROW(t.render(with_tool, {}), Error);
}

TEST(ToolCalls, PythonJsonSpacingAndEscapes) {
  EXPECT_EQ(python_json(nlohmann::ordered_json::parse(R"({"b":[1,2.5,true,null],"a":"x\ny\u0001é"})")),
            "{\"b\": [1, 2.5, true, null], \"a\": \"x\\ny\\u0001é\"}");
}

// The same reply in any split of its text gives the same content and calls; a block that is not a call stays text.
TEST(ToolCalls, HermesCallsComeOutOfTheStreamInAnySplit) {
  const std::string reply =
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>\n<tool_call>\nnot json\n</tool_call>";
  for (size_t piece : {1, 2, 3, 7, 1000}) {
    SCOPED_TRACE(piece);
    ToolCallParser p(ToolCallFormat::kHermes);
    const auto [content, calls] = parse_in_pieces(p, reply, piece);
    ASSERT_EQ(calls.size(), 2u);
    EXPECT_EQ(calls[0].name, "get_weather");
    EXPECT_EQ(nlohmann::json::parse(calls[0].arguments), nlohmann::json::parse(R"({"city":"Paris"})"));
    EXPECT_EQ(calls[1].name, "get_time");
    EXPECT_EQ(calls[1].arguments, "{}");
    EXPECT_EQ(content, "Let me check.\n<tool_call>\nnot json\n</tool_call>");
  }
  // An unfinished call at the end is content.
  ToolCallParser p(ToolCallFormat::kHermes);
  EXPECT_EQ(p.push("a <tool_call>\n{\"name\"").content, "a ");
  EXPECT_EQ(p.flush().content, "<tool_call>\n{\"name\"");
}

}  // namespace
}  // namespace hetmoe::text
