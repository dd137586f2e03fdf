// Tokenizer behaviour beyond the llama.cpp test strings (those are in tests/conformance/test_vocab.cpp): round trips
// of awkward text, special tokens on and off, BOS/EOS rules, streaming, errors, and the pre-tokenizer conventions
// that copy llama.cpp rather than the Unicode standard.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/error.h"
#include "runtime/gguf/reader.h"
#include "runtime/gguf/writer.h"
#include "runtime/text/tokenizer.h"
#include "runtime/text/tokenizer_internal.h"
#include "tests/support/reference.h"

namespace hetmoe::text {
namespace {

namespace fs = std::filesystem;
using gguf::Value;

std::optional<fs::path> find_ref(const std::string& sub, const std::string& name) {
  for (const fs::path& root : {fs::path(HETMOE_TEST_DATA_DIR), fs::path(HETMOE_SHARED_REF)}) {
    fs::path p = root / sub / name;
    if (fs::exists(p)) return p;
  }
  return std::nullopt;
}

std::unique_ptr<Tokenizer> load(const fs::path& path) {
  const gguf::GgufFile file = gguf::GgufFile::open(path.string());
  return Tokenizer::from_gguf(file);
}

// A tokenizer from tests/data, or from ../shared/ref; nullptr (and the test skips) when neither has it.
std::unique_ptr<Tokenizer> load_ref(const std::string& sub, const std::string& name) {
  const auto path = find_ref(sub, name);
  return path ? load(*path) : nullptr;
}

fs::path write_gguf(const std::string& name, std::vector<std::pair<std::string, Value>> kv) {
  gguf::GgufWriter writer;
  for (auto& [key, value] : kv) writer.set(key, std::move(value));
  const fs::path path = fs::path(testing::TempDir()) / (name + ".gguf");
  writer.write(path.string());
  return path;
}

// A byte-level BPE vocabulary: the 256 byte characters, "he", "ll", "hell", "hello", then <|endoftext|> (control)
// and <tool> (user-defined).
constexpr int32_t kHello = 259, kEndOfText = 260, kTool = 261;

std::vector<std::pair<std::string, Value>> bpe_vocab(const std::string& pre) {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(detail::gpt2_byte_text(static_cast<uint8_t>(b)));
  for (const char* t : {"he", "ll", "hell", "hello", "<|endoftext|>", "<tool>"}) tokens.push_back(t);
  std::vector<int32_t> types(tokens.size(), static_cast<int32_t>(TokenType::kNormal));
  types[kEndOfText] = static_cast<int32_t>(TokenType::kControl);
  types[kTool] = static_cast<int32_t>(TokenType::kUserDefined);
  return {{"general.architecture", Value::string("llama")},
          {"tokenizer.ggml.model", Value::string("gpt2")},
          {"tokenizer.ggml.pre", Value::string(pre)},
          {"tokenizer.ggml.tokens", Value::string_array(tokens)},
          {"tokenizer.ggml.token_type", Value::i32_array(types)},
          {"tokenizer.ggml.merges", Value::string_array({"h e", "l l", "he ll", "hell o"})},
          {"tokenizer.ggml.bos_token_id", Value::u32(kEndOfText)},
          {"tokenizer.ggml.eos_token_id", Value::u32(kEndOfText)}};
}

std::string error_of(const fs::path& path) {
  try {
    load(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Texts a tokenizer must give back byte for byte: scripts, emoji sequences, controls and broken UTF-8 (a bad byte
// is encoded as its byte token).
const std::vector<std::string> kRoundTrip = {
    "",
    " ",
    "Hello world",
    "  leading, trailing and  double  spaces  ",
    "tabs\tand\nnewlines\r\n\n\n",
    "unicode: café naïve 你好 😀 🦙",
    "Ünïcödé ß ﬁ Ωmega K",
    "日本語のテキスト、カタカナ。한국어 텍스트",
    "numbers 0 1 12 123 1234 12345 ٣٤٥ ²",
    "family 👨‍👩‍👧‍👦 flags 🇩🇪 ✅ keycap 1️⃣",
    "~/path ~~é!! a~b x ~= y",
    "\x00\x01\x1f control \x7f",
    "ideographic\u3000space\u00a0nbsp\u2028line",
    "\xff\xfe bad lead bytes",
    "truncated \xe4\xbd",
    "\xe4\xbd\xa0\xe5 cut",
    "overlong \xc0\x80 surrogate \xed\xa0\x80 beyond \xf4\x90\x80\x80",
    "stray \x80\x80 continuation",
    "<｜end▁of▁sentence｜> <|im_end|> </s> as plain text",
};

class RoundTrip : public testing::TestWithParam<std::string> {};

TEST_P(RoundTrip, DecodeOfEncodeIsTheText) {
  const auto [sub, name] =
      std::pair{GetParam().substr(0, GetParam().find('/')), GetParam().substr(GetParam().find('/') + 1)};
  const auto tokenizer = load_ref(sub, name);
  if (!tokenizer) HETMOE_MISSING_REFERENCE(name << " is in neither tests/data nor " << HETMOE_SHARED_REF);
  // Bytes whose byte-level character is a user-defined token (deepseek-llm and -coder add C0, C1 and F5..FF that
  // way): the token renders as its text, as in llama.cpp, so such a byte comes back as that character.
  std::string unrepresentable;
  for (int b = 0; b < 256 && tokenizer->model() == "gpt2"; ++b) {
    const auto id = tokenizer->find(detail::gpt2_byte_text(static_cast<uint8_t>(b)));
    if (id && tokenizer->token_type(*id) == TokenType::kUserDefined) unrepresentable += static_cast<char>(b);
  }
  int checked = 0;
  for (const std::string& text : kRoundTrip) {
    if (tokenizer->model() == "llama") {
      // SentencePiece writes spaces as U+2581, so that character cannot come back as itself; and a broken UTF-8
      // sequence can swallow the bytes of a following U+2581, which its byte tokens then give back as U+2581
      // (llama.cpp cuts the same way).
      if (text.find("\xE2\x96\x81") != std::string::npos || find_invalid_utf8(text)) continue;
    } else if (find_invalid_utf8(text) && text.find_first_of(unrepresentable) != std::string::npos) {
      continue;
    }
    ++checked;
    EXPECT_EQ(tokenizer->decode(tokenizer->encode(text, false, false)), text) << name;
    EXPECT_EQ(tokenizer->decode(tokenizer->encode(text, true, false)), text) << name << " with BOS";
  }
  EXPECT_GE(checked, 12) << name;
}

TEST(Tokenizer, DeepseekByteTokensRenderAsTheirText) {
  const auto t = load_ref("vocab", "ggml-vocab-deepseek-coder.gguf");
  if (!t) HETMOE_MISSING_REFERENCE("ggml-vocab-deepseek-coder.gguf is not in " << HETMOE_SHARED_REF << "/vocab");
  // "ø" in text is that user-defined token (llama.cpp splits user-defined tokens out first) and renders as "ø";
  // the invalid byte F8 reaches the same token through its byte-level character, so it comes back as "ø" too.
  const std::vector<int32_t> letter = t->encode("ø", false, false);
  ASSERT_EQ(letter.size(), 1u);
  EXPECT_EQ(t->token_type(letter[0]), TokenType::kUserDefined);
  EXPECT_EQ(t->encode("\xF8", false, false), letter);
  EXPECT_EQ(t->decode(letter), "ø");
}

INSTANTIATE_TEST_SUITE_P(Vocabularies, RoundTrip,
                         testing::Values("models/tiny-deepseek3-Q4_K_M.gguf", "models/tiny-deepseek2lite-Q4_K_M.gguf",
                                         "models/tiny-qwen3moe-Q4_K_M.gguf", "models/tiny-mixtral-Q4_K_M.gguf",
                                         "vocab/ggml-vocab-llama-spm.gguf", "vocab/ggml-vocab-deepseek-llm.gguf",
                                         "vocab/ggml-vocab-deepseek-coder.gguf", "vocab/ggml-vocab-qwen2.gguf",
                                         "vocab/ggml-vocab-llama-bpe.gguf", "vocab/ggml-vocab-gpt-2.gguf"),
                         [](const testing::TestParamInfo<std::string>& info) {
                           std::string s = info.param.substr(info.param.find('/') + 1);
                           s = s.substr(0, s.find(".gguf"));
                           for (char& c : s)
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           return s;
                         });

TEST(Tokenizer, SpecialTokensAreParsedOnlyWhenAsked) {
  const auto ds = load_ref("models", "tiny-deepseek3-Q4_K_M.gguf");
  ASSERT_TRUE(ds);
  const std::string text = "<｜begin▁of▁sentence｜>Hi there<｜end▁of▁sentence｜>";
  const std::vector<int32_t> parsed = ds->encode(text, false, true);
  ASSERT_GE(parsed.size(), 3u);
  EXPECT_EQ(parsed.front(), 0);
  EXPECT_EQ(parsed.back(), 1);
  EXPECT_EQ(std::vector<int32_t>(parsed.begin() + 1, parsed.end() - 1), ds->encode("Hi there", false, false));
  const std::vector<int32_t> plain = ds->encode(text, false, false);
  for (int32_t id : plain) EXPECT_NE(ds->token_type(id), TokenType::kControl) << id;
  EXPECT_EQ(ds->decode(plain), text);
  // Control tokens render only when asked.
  EXPECT_EQ(ds->decode(parsed), "Hi there");
  EXPECT_EQ(ds->decode(parsed, true), text);

  const auto qwen = load_ref("models", "tiny-qwen3moe-Q4_K_M.gguf");
  ASSERT_TRUE(qwen);
  const std::vector<int32_t> chat = qwen->encode("<|im_start|>user\nhi<|im_end|>", false, true);
  EXPECT_EQ(chat.front(), 510);
  EXPECT_EQ(chat.back(), 511);
  EXPECT_EQ(qwen->token_to_piece(511), "");
  EXPECT_EQ(qwen->token_to_piece(511, true), "<|im_end|>");
}

TEST(Tokenizer, SentencePiecePrefixesASpaceAtTheStartAndAfterSpecials) {
  const auto spm = load_ref("models", "tiny-mixtral-Q4_K_M.gguf");
  ASSERT_TRUE(spm);
  const std::vector<int32_t> hi = spm->encode("hi", false, false);
  std::vector<int32_t> expected = {1};
  expected.insert(expected.end(), hi.begin(), hi.end());
  expected.push_back(2);
  expected.insert(expected.end(), hi.begin(), hi.end());
  EXPECT_EQ(spm->encode("<s>hi</s>hi", false, true), expected);
  EXPECT_EQ(spm->token_text(hi.front()).substr(0, 3), "\xE2\x96\x81");  // U+2581 starts the first piece
  EXPECT_TRUE(spm->encode("", false, false).empty());
  EXPECT_EQ(spm->encode("", true, false), std::vector<int32_t>{1});
}

TEST(Tokenizer, BosAndEosFollowTheMetadata) {
  struct Case {
    const char* file;
    std::optional<int32_t> bos;
    bool add_bos;
  };
  for (const Case& c : {Case{"tiny-deepseek3-Q4_K_M.gguf", 0, true}, Case{"tiny-deepseek2lite-Q4_K_M.gguf", 0, true},
                        Case{"tiny-qwen3moe-Q4_K_M.gguf", 509, false}, Case{"tiny-mixtral-Q4_K_M.gguf", 1, true}}) {
    const auto t = load_ref("models", c.file);
    ASSERT_TRUE(t) << c.file;
    EXPECT_EQ(t->bos(), c.bos) << c.file;
    EXPECT_EQ(t->add_bos(), c.add_bos) << c.file;
    EXPECT_FALSE(t->add_eos()) << c.file;
    std::vector<int32_t> expected = t->encode("Hello world", false, false);
    if (c.add_bos) expected.insert(expected.begin(), *c.bos);
    EXPECT_EQ(t->encode("Hello world", true, false), expected) << c.file;
  }

  // Without tokenizer.ggml.add_bos_token the family decides: llama-bpe adds BOS, gpt-2 does not; the key wins.
  EXPECT_TRUE(load(write_gguf("llama_bpe_default", bpe_vocab("llama-bpe")))->add_bos());
  EXPECT_FALSE(load(write_gguf("gpt2_default", bpe_vocab("gpt-2")))->add_bos());
  auto kv = bpe_vocab("llama-bpe");
  kv.emplace_back("tokenizer.ggml.add_bos_token", Value::boolean(false));
  kv.emplace_back("tokenizer.ggml.add_eos_token", Value::boolean(true));
  const auto t = load(write_gguf("llama_bpe_no_bos", kv));
  EXPECT_FALSE(t->add_bos());
  EXPECT_EQ(t->encode("hello", true, false), (std::vector<int32_t>{kHello, kEndOfText}));
}

TEST(Tokenizer, EndOfGenerationSet) {
  const auto qwen = load_ref("models", "tiny-qwen3moe-Q4_K_M.gguf");
  ASSERT_TRUE(qwen);
  EXPECT_TRUE(qwen->is_end_of_generation(511));  // <|im_end|>, eos
  EXPECT_TRUE(qwen->is_end_of_generation(509));  // <|endoftext|>
  EXPECT_FALSE(qwen->is_end_of_generation(510));
  EXPECT_FALSE(qwen->is_end_of_generation(100));
  EXPECT_EQ(qwen->eot(), 511);

  const auto ds = load_ref("models", "tiny-deepseek3-Q4_K_M.gguf");
  ASSERT_TRUE(ds);
  EXPECT_TRUE(ds->is_end_of_generation(1));
  EXPECT_FALSE(ds->is_end_of_generation(0));
  EXPECT_FALSE(ds->is_end_of_generation(2));
  EXPECT_EQ(ds->eot(), 1);  // found by its text

  const auto spm = load_ref("vocab", "ggml-vocab-llama-spm.gguf");
  ASSERT_TRUE(spm);
  EXPECT_TRUE(spm->is_end_of_generation(2));
  EXPECT_FALSE(spm->is_end_of_generation(1));
}

TEST(Tokenizer, UserDefinedTokensAreAlwaysSplitOut) {
  // llama.cpp pre-tokenizes user-defined tokens before everything else, parse_special or not.
  const auto t = load(write_gguf("user_defined", bpe_vocab("gpt-2")));
  EXPECT_EQ(t->encode("hello<tool>hello", false, false), (std::vector<int32_t>{kHello, kTool, kHello}));
  EXPECT_EQ(t->encode("<|endoftext|>", false, true), std::vector<int32_t>{kEndOfText});
  EXPECT_NE(t->encode("<|endoftext|>", false, false), std::vector<int32_t>{kEndOfText});
  EXPECT_EQ(t->token_to_piece(kTool), "<tool>");
}

TEST(StreamDecoder, HoldsBackACharacterSplitAcrossByteTokens) {
  for (const char* file : {"tiny-mixtral-Q4_K_M.gguf", "tiny-deepseek3-Q4_K_M.gguf"}) {
    const auto t = load_ref("models", file);
    ASSERT_TRUE(t) << file;
    for (const std::string ch : {"你", "😀", "é"}) {
      const std::vector<int32_t> ids = t->encode(ch, false, false);
      std::vector<int32_t> bytes;  // the tiny vocabularies spell these byte by byte (after SentencePiece's ▁)
      for (int32_t id : ids)
        if (t->token_to_piece(id).size() == 1 && static_cast<uint8_t>(t->token_to_piece(id)[0]) >= 0x80)
          bytes.push_back(id);
      ASSERT_EQ(bytes.size(), ch.size()) << file << " " << ch;
      StreamDecoder stream(*t);
      for (size_t i = 0; i + 1 < bytes.size(); ++i) EXPECT_EQ(stream.push(bytes[i]), "") << file;
      EXPECT_EQ(stream.push(bytes.back()), ch) << file;
      EXPECT_EQ(stream.flush(), "");
    }
    // A lead byte followed by something that cannot continue it is let through as it is.
    StreamDecoder stream(*t);
    const int32_t lead = t->encode("你", false, false).end()[-3];
    const int32_t x = t->encode("x", false, false).back();
    EXPECT_EQ(stream.push(lead), "");
    EXPECT_EQ(stream.push(x), "\xE4x");
    EXPECT_EQ(stream.push(lead), "");
    EXPECT_EQ(stream.flush(), "\xE4");
  }
}

TEST(Tokenizer, UnknownPreTokenizerIsNamed) {
  const std::string message = error_of(write_gguf("unknown_pre", bpe_vocab("no-such-pre")));
  EXPECT_NE(message.find("'no-such-pre'"), std::string::npos) << message;
  EXPECT_NE(message.find("tokenizer.ggml.pre"), std::string::npos) << message;
  EXPECT_NE(message.find("deepseek-v3"), std::string::npos) << message;  // the known ones are listed
  EXPECT_EQ(message.find('\n'), std::string::npos);
}

TEST(Tokenizer, MissingOrUnsupportedTokenizerIsAnError) {
  std::string message = error_of(write_gguf("no_tokenizer", {{"general.architecture", Value::string("llama")}}));
  EXPECT_NE(message.find("no tokenizer"), std::string::npos) << message;
  EXPECT_NE(message.find("tokenizer.ggml.model"), std::string::npos) << message;

  message = error_of(write_gguf("bert", {{"tokenizer.ggml.model", Value::string("bert")}}));
  EXPECT_NE(message.find("'bert'"), std::string::npos) << message;

  auto kv = bpe_vocab("gpt-2");
  std::erase_if(kv, [](const auto& e) { return e.first == "tokenizer.ggml.tokens"; });
  message = error_of(write_gguf("no_tokens", kv));
  EXPECT_NE(message.find("tokenizer.ggml.tokens"), std::string::npos) << message;

  kv = bpe_vocab("qwen2");
  std::erase_if(kv, [](const auto& e) { return e.first == "tokenizer.ggml.merges"; });
  message = error_of(write_gguf("no_merges", kv));
  EXPECT_NE(message.find("tokenizer.ggml.merges"), std::string::npos) << message;

  // Kimi-K2 files may lack merges (llama.cpp accepts them): every byte is then its own token.
  kv = bpe_vocab("kimi-k2");
  std::erase_if(kv, [](const auto& e) { return e.first == "tokenizer.ggml.merges"; });
  EXPECT_EQ(load(write_gguf("kimi_no_merges", kv))->encode("hello", false, false).size(), 5u);
}

TEST(Tokenizer, IgnoreMergesTakesWholeWords) {
  // llama-bpe takes a word that is a token as it is, before merging; with merges that cannot build "hello" only
  // that rule finds it.
  for (const char* pre : {"llama-bpe", "gpt-2"}) {
    auto kv = bpe_vocab(pre);
    for (auto& [key, value] : kv)
      if (key == "tokenizer.ggml.merges") value = Value::string_array({"h e", "l l"});
    const auto ids = load(write_gguf(std::string("ignore_merges_") + pre, kv))->encode("hello", false, false);
    EXPECT_EQ(ids.size(), std::string(pre) == "llama-bpe" ? 1u : 3u) << pre;
  }
}

TEST(FindInvalidUtf8, FirstBadOffset) {
  EXPECT_EQ(find_invalid_utf8(""), std::nullopt);
  EXPECT_EQ(find_invalid_utf8("plain ascii"), std::nullopt);
  EXPECT_EQ(find_invalid_utf8("café 你好 😀 \xf4\x8f\xbf\xbf"), std::nullopt);  // U+10FFFF is the last valid one
  EXPECT_EQ(find_invalid_utf8("ab\xff"), 2u);
  EXPECT_EQ(find_invalid_utf8("a\x80"), 1u);                  // stray continuation
  EXPECT_EQ(find_invalid_utf8("x\xc0\x80"), 1u);              // overlong NUL
  EXPECT_EQ(find_invalid_utf8("\xe0\x80\x80"), 0u);           // overlong 3-byte
  EXPECT_EQ(find_invalid_utf8("ok\xed\xa0\x80"), 2u);         // surrogate
  EXPECT_EQ(find_invalid_utf8("\xf4\x90\x80\x80"), 0u);       // beyond U+10FFFF
  EXPECT_EQ(find_invalid_utf8("end \xe4\xbd"), 4u);           // truncated
  EXPECT_EQ(find_invalid_utf8("\xe4\xbd\xa0\xe4\xbdx"), 3u);  // broken by a non-continuation
}

// Words of `text` under a pre-tokenizer family.
std::vector<std::string> split(const char* pre, std::string_view text) {
  const detail::PreTokenizer p(*detail::find_pre_tokenizer(pre));
  std::vector<std::string> out;
  for (std::string_view w : p.split(text)) out.emplace_back(w);
  return out;
}

using Words = std::vector<std::string>;

TEST(PreTokenizer, FollowsLlamaCppConventions) {
  EXPECT_EQ(split("gpt-2", "Hello  world's 123\n\n  x"), (Words{"Hello", " ", " world", "'s", " 123", "\n\n ", " x"}));
  EXPECT_EQ(split("llama-bpe", "I'M 12345 ok!!\n\nnext"),
            (Words{"I", "'M", " ", "123", "45", " ok", "!!\n\n", "next"}));
  EXPECT_EQ(split("qwen2", "x 123"), (Words{"x", " ", "1", "2", "3"}));
  // Non-ASCII White_Space is whitespace, as in llama.cpp's tables, but not the ' ' a word may start with.
  EXPECT_EQ(split("gpt-2", "a\u3000\u3000b"), (Words{"a", "\u3000", "\u3000", "b"}));
  // deepseek-v3: llama.cpp's collapsed \p{S} leaves out '~', so '~' can lead a word and does not join punctuation.
  EXPECT_EQ(split("deepseek-v3", "a~~é!!"), (Words{"a", "~", "~é", "!!"}));
  EXPECT_EQ(split("deepseek-v3", "~abc ~~ \uFDD0~"), (Words{"~abc", " ", "~~", " ", "\uFDD0~"}));
  EXPECT_EQ(split("deepseek-v3", "x ~= 1234 你好 カナ"),
            (Words{"x", " ", "~", "=", " ", "123", "4", " ", "你好", " ", "カナ"}));
  // deepseek-llm: U+3000 is whitespace, not part of its punctuation range U+3000..U+3002.
  EXPECT_EQ(split("deepseek-llm", "a\u3000。"), (Words{"a", "\u3000", "。"}));
  // Kimi-K2: Han runs, non-Han letter runs with a contraction, three-digit groups.
  EXPECT_EQ(split("kimi-k2", "Hello世界 it's 12345"), (Words{"Hello", "世界", " it's", " ", "123", "45"}));
  // Bytes that are not UTF-8 are matched as U+FFFD (a symbol) but kept as they are.
  EXPECT_EQ(split("gpt-2", "ab\xff\xfe cd"), (Words{"ab", "\xff\xfe", " cd"}));
}

TEST(PreTokenizer, KnowsTheFamiliesTheIssueNames) {
  for (const char* pre : {"deepseek-v3", "deepseek-llm", "deepseek-coder", "qwen2", "llama3", "llama-bpe", "gpt-2",
                          "kimi-k2", "default", ""})
    EXPECT_NE(detail::find_pre_tokenizer(pre), nullptr) << pre;
  EXPECT_EQ(detail::find_pre_tokenizer("no-such-pre"), nullptr);
  // Every family's regexes compile.
  for (std::string_view name : detail::pre_tokenizer_names())
    EXPECT_NO_THROW(detail::PreTokenizer(*detail::find_pre_tokenizer(name))) << name;
}

TEST(PreTokenizer, LongRunsDoNotExhaustTheMatcher) {
  // Group repetitions (tekken, gpt-4o) backtrack per character; a long word must still split, not give up.
  const std::string word(200000, 'a');
  for (const char* pre : {"tekken", "gpt-4o", "kimi-k2", "deepseek-v3", "llama-bpe"}) {
    const auto words = split(pre, " " + word + " !");
    ASSERT_EQ(words.size(), 2u) << pre;
    EXPECT_EQ(words[0], " " + word) << pre;
  }
}

}  // namespace
}  // namespace hetmoe::text
