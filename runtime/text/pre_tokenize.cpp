// Pre-tokenizers of byte-level BPE vocabularies: llama.cpp's regex lists per tokenizer.ggml.pre, run with PCRE2.
//
// llama.cpp runs these lists through std::regex after "collapsing" every non-ASCII code point to one byte that
// stands for its Unicode category, and through hand-written matchers for the GPT-2, Llama-3 and Kimi-K2 patterns.
// PCRE2 with \p{..} gives the same splits once two of llama.cpp's conventions are reproduced:
//   * whitespace is Unicode White_Space; non-ASCII whitespace is matched as \x0B (llama.cpp's own stand-in), so
//     \s stays ASCII (no PCRE2_UCP) and ranges such as [\x{3000}-\x{3002}] do not see U+3000, as in llama.cpp;
//   * the collapsed \p{S} leaves out '~' (llama.cpp's ASCII list for S is $+<=>^`|). A pattern that uses \p{S} is
//     matched against a copy of the text where '~' is U+FDD0, a noncharacter that no \p class holds, and its
//     literal '~' also accepts U+FDD0 (a real U+FDD0 becomes U+FDD1, which behaves the same).
// Input that is not valid UTF-8 is matched as llama.cpp reads it (U+FFFD per bad byte), but the words keep the
// original bytes, so byte-level BPE still round-trips them.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/error.h"
#include "runtime/text/tokenizer_internal.h"

namespace hetmoe::text::detail {
namespace {

// ---- llama.cpp's regex lists (llama-vocab.cpp, llm_tokenizer_bpe), written for PCRE2 ----

constexpr std::string_view kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";

constexpr std::string_view kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|)"
    R"( ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

constexpr std::string_view kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|)"
    R"( ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Qwen3.5: Qwen2's, with combining marks (\p{M}) kept in the letter runs and out of the punctuation runs.
constexpr std::string_view kQwen35 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|)"
    R"( ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// DeepSeek LLM's letter class, escaped: several of its code points have canonically equivalent lookalikes
// (U+1F7D and U+03CE, U+2126 and U+03A9, U+212A and K) that a literal copy silently swaps.
constexpr std::string_view kDeepseekLetters =
    R"(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF})"
    R"(\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1})"
    R"(\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5})"
    R"(\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A})"
    R"(\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B})"
    R"(\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC})"
    R"(\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107})"
    R"(\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134})"
    R"(\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4})"
    R"(\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787})"
    R"(\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A})"
    R"(\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2})"
    R"(\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+)";
constexpr std::string_view kDeepseekPunct =
    R"(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)";
constexpr std::string_view kDeepseekCjk = R"([\x{4E00}-\x{9FA5}\x{0800}-\x{4E00}\x{AC00}-\x{D7FF}]+)";

constexpr std::string_view kDeepseekV3Main =
    R"re([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|)re"
    R"re( ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";

constexpr std::string_view kPoro = R"( ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{0964}\x{06D4}\x{060C})]+)";

constexpr std::string_view kTekken = R"([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|)"
                                     R"([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|)"
                                     R"(\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

constexpr std::string_view kGpt4o = R"([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+)"
                                    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|)"
                                    R"([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*)"
                                    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|)"
                                    R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Kimi-K2 is matched in llama.cpp by a hand-written matcher (unicode_regex_split_custom_kimi_k2), not by its
// tiktoken regex: Han is a fixed list of CJK blocks, a word is any run of non-Han letters (the Lu/Ll split of the
// original and \p{M} play no part). kimi_k2() is that matcher as a regex. The letter run is possessive because
// nothing after it can start with a letter, which keeps long words off the JIT stack.
constexpr std::string_view kKimiHan =
    R"(\x{4E00}-\x{9FFF}\x{3400}-\x{4DBF}\x{20000}-\x{2A6DF}\x{2A700}-\x{2B73F}\x{2B740}-\x{2B81F})"
    R"(\x{2B820}-\x{2CEAF}\x{2CEB0}-\x{2EBEF}\x{F900}-\x{FAFF}\x{2F800}-\x{2FA1F})";

const std::string& kimi_k2() {
  static const std::string pattern = "[" + std::string(kKimiHan) + "]+|" + R"([^\r\n\p{L}\p{N}]?(?:(?![)" +
                                     std::string(kKimiHan) +
                                     R"(])\p{L})++(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|)" +
                                     R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  return pattern;
}

constexpr std::string_view kBailingMoe =
    R"('(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|)"
    R"(\s*[\r\n]|\s+(?!\S)|\s+)";

constexpr std::string_view kSeedCoder =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}|)"
    R"( ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+)";

constexpr std::string_view kJais2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|)"
    R"( ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|)"
    R"(\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1})";

const std::vector<PreTokenizerInfo>& families() {
  static const std::vector<PreTokenizerInfo> list = {
      {.names = {"default"}, .regexes = {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", R"([0-9][0-9][0-9])"}},
      {.names = {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"},
       .regexes = {kLlama3},
       .ignore_merges = true,
       .add_bos = true},
      {.names = {"dbrx", "smaug-bpe"}, .regexes = {kLlama3}},
      {.names = {"chatglm-bpe", "glm4"}, .regexes = {kLlama3}, .no_default_bos = true},
      {.names = {"deepseek-llm"},
       .regexes = {R"([\r\n])", kDeepseekLetters, kDeepseekPunct, R"(\s+$)", kDeepseekCjk, R"(\p{N}+)"}},
      {.names = {"deepseek-coder"}, .regexes = {R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kDeepseekCjk, R"(\p{N})"}},
      {.names = {"deepseek-v3", "hunyuan-dense", "joyai-llm"},
       .regexes = {R"(\p{N}{1,3})", R"([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)", kDeepseekV3Main}},
      {.names = {"kimi-k2"}, .regexes = {kimi_k2()}},
      {.names = {"qwen2", "deepseek-r1-qwen", "megrez", "stablelm2", "hunyuan", "grok-2"}, .regexes = {kQwen2}},
      {.names = {"qwen35"}, .regexes = {kQwen35}},
      {.names = {"gpt-2", "phi-2", "mpt", "olmo", "jais", "trillion", "granite-docling", "jina-es", "jina-de",
                 "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum", "exaone4"},
       .regexes = {kGpt2}},
      {.names = {"falcon"}, .regexes = {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2, R"([0-9][0-9][0-9])"}},
      {.names = {"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"},
       .regexes = {R"(\p{N})", kGpt2}},
      {.names = {"poro-chat", "bloom", "gpt3-finnish"}, .regexes = {kPoro}},
      {.names = {"viking"}, .regexes = {kPoro, R"(\p{N})"}},
      {.names = {"tekken"}, .regexes = {kTekken}, .ignore_merges = true, .add_bos = true},
      {.names = {"chameleon"},
       .regexes = {R"(<sentinel:[0-9]+>)", R"((IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z)", R"(([\t\n]|    |  ))", R"(\p{N})",
                   R"([\p{P}!-/:-@\[-`{-~])", kGpt2},
       .add_bos = true},
      {.names = {"gpt-4o", "llama4", "minimax-m2"}, .regexes = {kGpt4o}},
      {.names = {"superbpe"}, .regexes = {R"(\p{N}+)", R"((?=(\d{3})+(?!\d)))"}},
      {.names = {"bailingmoe", "bailingmoe2", "llada-moe"}, .regexes = {kBailingMoe}},
      {.names = {"seed-coder"}, .regexes = {kSeedCoder}},
      {.names = {"jais-2"}, .regexes = {kJais2}},
  };
  return list;
}

// ---- Pattern rewriting (see the top of the file) ----

constexpr std::string_view kTildeStandIn = "\xEF\xB7\x90";       // U+FDD0
constexpr std::string_view kTildeStandInMoved = "\xEF\xB7\x91";  // U+FDD1

// Literal character of the escape or plain char at p[i] (advancing i past it), or -1 when it is not a literal.
int64_t read_class_literal(std::string_view p, size_t* i) {
  if (p[*i] != '\\') {
    const size_t len = std::max<size_t>(1, utf8_sequence_length(p, *i));
    const int64_t cpt = len == 1 ? static_cast<uint8_t>(p[*i]) : utf8_decode(p, *i, len);
    *i += len;
    return cpt;
  }
  if (*i + 1 >= p.size()) return ++*i, -1;
  const char e = p[*i + 1];
  if (e == 'x' && *i + 2 < p.size() && p[*i + 2] == '{') {
    const size_t close = p.find('}', *i + 3);
    const int64_t cpt = std::stoll(std::string(p.substr(*i + 3, close - *i - 3)), nullptr, 16);
    *i = close + 1;
    return cpt;
  }
  if (e == 'p' || e == 'P') {  // a property: not a literal
    *i = p.find('}', *i) + 1;
    return -1;
  }
  *i += 2;
  switch (e) {
    case 'r':
      return '\r';
    case 'n':
      return '\n';
    case 't':
      return '\t';
    case 's':
    case 'S':
    case 'd':
    case 'D':
    case 'w':
    case 'W':
      return -1;
    default:
      return static_cast<uint8_t>(e);
  }
}

// In a pattern that uses \p{S}, every literal '~' (alone, in a class, or inside a class range) also accepts the
// stand-in. (No family here uses \p{Lu}, \p{Ll}, ...: collapsed, those would all mean \p{L}.)
std::string add_tilde_stand_in(std::string_view p) {
  std::string out;
  const std::string stand_in = R"(\x{FDD0})";
  for (size_t i = 0; i < p.size();) {
    if (p[i] == '\\') {
      const size_t len =
          (p[i + 1] == 'p' || p[i + 1] == 'P' || (p[i + 1] == 'x' && p[i + 2] == '{')) ? p.find('}', i) + 1 - i : 2;
      const bool tilde = p.substr(i, len) == R"(\~)";
      out += tilde ? "[~" + stand_in + "]" : std::string(p.substr(i, len));
      i += len;
      continue;
    }
    if (p[i] == '~') {
      out += "[~" + stand_in + "]";
      ++i;
      continue;
    }
    if (p[i] != '[') {
      out += p[i++];
      continue;
    }
    // A class: copy it, noting whether '~' is in it as a literal or inside a range.
    const size_t start = i++;
    if (i < p.size() && p[i] == '^') ++i;
    if (i < p.size() && p[i] == ']') ++i;  // a leading ']' is literal
    bool has_tilde = false;
    int64_t previous = -1;
    while (i < p.size() && p[i] != ']') {
      if (p[i] == '-' && previous >= 0 && i + 1 < p.size() && p[i + 1] != ']') {
        ++i;
        const int64_t last = read_class_literal(p, &i);
        if (last >= 0 && previous <= '~' && '~' <= last) has_tilde = true;
        previous = -1;
        continue;
      }
      previous = read_class_literal(p, &i);
      if (previous == '~') has_tilde = true;
    }
    out += p.substr(start, i - start);
    if (has_tilde) out += stand_in;
    if (i < p.size()) out += p[i++];
  }
  return out;
}

struct Pattern {
  std::string text;
  bool tilde_quirk = false;
};

Pattern to_pcre2(std::string_view llama_pattern) {
  Pattern out{.text = std::string(llama_pattern)};
  if (out.text.find(R"(\p{S})") != std::string::npos) {
    out.tilde_quirk = true;
    out.text = add_tilde_stand_in(out.text);
  }
  return out;
}

// ---- Matching ----

// Text as the regexes see it: one unit per code point, or per byte that is not valid UTF-8.
struct Subject {
  std::string bytes;
  std::vector<size_t> offset;  // unit i starts at bytes[offset[i]]; offset[n_units] == bytes.size()
};

// Per-thread match state: JIT matching uses a stack of its own, and group repetitions over long runs (tekken's
// and gpt-4o's letter groups) need more than PCRE2's 32 KiB default.
constexpr size_t kJitStackMax = 16u << 20;

struct MatchState {
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32u << 10, kJitStackMax, nullptr);
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);

  MatchState() { pcre2_jit_stack_assign(context, nullptr, stack); }
  ~MatchState() {
    pcre2_match_data_free(data);
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
  }
};

MatchState& match_state() {
  thread_local MatchState state;
  return state;
}

}  // namespace

struct PreTokenizer::Regex {
  pcre2_code* code = nullptr;
  bool tilde_quirk = false;

  explicit Regex(std::string_view llama_pattern) {
    const Pattern p = to_pcre2(llama_pattern);
    tilde_quirk = p.tilde_quirk;
    int error = 0;
    PCRE2_SIZE error_offset = 0;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.text.data()), p.text.size(),
                         PCRE2_UTF | PCRE2_NO_AUTO_CAPTURE | PCRE2_DOLLAR_ENDONLY, &error, &error_offset, nullptr);
    if (code == nullptr) {
      std::array<PCRE2_UCHAR, 256> message{};
      pcre2_get_error_message(error, message.data(), message.size());
      fail("pre-tokenizer regex does not compile at offset {}: {}", error_offset,
           reinterpret_cast<const char*>(message.data()));
    }
    // Without JIT (an unsupported CPU) the interpreter gives the same matches, only slower.
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  }
  ~Regex() { pcre2_code_free(code); }

  // Cuts units [u0, u1) of `s` into matches and the runs between them, appending non-empty ranges to `out`.
  void split(const Subject& s, size_t u0, size_t u1, std::vector<std::pair<size_t, size_t>>& out) const {
    MatchState& state = match_state();
    const size_t base = s.offset[u0];
    const auto subject = reinterpret_cast<PCRE2_SPTR>(s.bytes.data() + base);
    const size_t length = s.offset[u1] - base;
    auto unit_at = [&](size_t byte) {
      return static_cast<size_t>(std::lower_bound(s.offset.begin() + static_cast<ptrdiff_t>(u0),
                                                  s.offset.begin() + static_cast<ptrdiff_t>(u1) + 1, base + byte) -
                                 s.offset.begin());
    };
    auto emit = [&](size_t b0, size_t b1) {
      if (b1 > b0) out.emplace_back(unit_at(b0), unit_at(b1));
    };

    size_t previous_end = 0, start = 0;
    uint32_t options = PCRE2_NO_UTF_CHECK;
    while (start <= length) {
      int rc = pcre2_match(code, subject, length, start, options, state.data, state.context);
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
        rc = pcre2_match(code, subject, length, start, options | PCRE2_NO_JIT, state.data, state.context);
      if (rc == PCRE2_ERROR_NOMATCH && (options & PCRE2_NOTEMPTY_ATSTART)) {
        // After an empty match, retry one character on, as std::regex_iterator does.
        if (start >= length) break;
        start += utf8_lead_length(static_cast<uint8_t>(subject[start]));
        options = PCRE2_NO_UTF_CHECK;
        continue;
      }
      // No match, or a resource limit on absurd input: what is left stays one piece.
      if (rc < 0) break;
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.data);
      const size_t m0 = ovector[0], m1 = ovector[1];
      emit(previous_end, m0);
      emit(m0, m1);
      previous_end = m1;
      start = m1;
      options = PCRE2_NO_UTF_CHECK | (m0 == m1 ? PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED : 0);
    }
    emit(previous_end, length);
  }
};

const PreTokenizerInfo* find_pre_tokenizer(std::string_view pre) {
  if (pre.empty()) pre = "default";
  for (const PreTokenizerInfo& family : families())
    if (std::find(family.names.begin(), family.names.end(), pre) != family.names.end()) return &family;
  return nullptr;
}

std::vector<std::string_view> pre_tokenizer_names() {
  std::vector<std::string_view> names;
  for (const PreTokenizerInfo& family : families()) names.insert(names.end(), family.names.begin(), family.names.end());
  return names;
}

PreTokenizer::PreTokenizer(const PreTokenizerInfo& info) {
  for (std::string_view pattern : info.regexes) regexes_.push_back(std::make_unique<Regex>(pattern));
}

PreTokenizer::~PreTokenizer() = default;

std::vector<std::string_view> PreTokenizer::split(std::string_view text) const {
  // Units of the original text, and the text as each kind of regex sees it.
  std::vector<size_t> original{0};
  Subject plain, tilde;
  bool need_tilde = false;
  for (const auto& r : regexes_) need_tilde = need_tilde || r->tilde_quirk;
  need_tilde = need_tilde && text.find_first_of("~\xEF") != std::string_view::npos;
  for (size_t pos = 0; pos < text.size();) {
    const size_t len = utf8_sequence_length(text, pos);
    const uint32_t cpt = len == 0 ? kReplacementChar : utf8_decode(text, pos, len);
    std::string_view seen = text.substr(pos, std::max<size_t>(len, 1));
    std::string replacement;
    if (len == 0 || (cpt >= 0x80 && is_unicode_whitespace(cpt))) {
      if (len == 0) utf8_append(replacement, kReplacementChar);
      if (len != 0) replacement = "\x0B";
      seen = replacement;
    }
    plain.offset.push_back(plain.bytes.size());
    plain.bytes += seen;
    if (need_tilde) {
      tilde.offset.push_back(tilde.bytes.size());
      tilde.bytes += cpt == '~' ? kTildeStandIn : cpt == 0xFDD0 && len != 0 ? kTildeStandInMoved : seen;
    }
    pos += std::max<size_t>(len, 1);
    original.push_back(pos);
  }
  plain.offset.push_back(plain.bytes.size());
  tilde.offset.push_back(tilde.bytes.size());

  const size_t n_units = original.size() - 1;
  std::vector<std::pair<size_t, size_t>> pieces, next;
  if (n_units > 0) pieces.emplace_back(0, n_units);
  for (const auto& regex : regexes_) {
    const Subject& subject = regex->tilde_quirk && need_tilde ? tilde : plain;
    next.clear();
    for (const auto& [u0, u1] : pieces) regex->split(subject, u0, u1, next);
    pieces.swap(next);
  }

  std::vector<std::string_view> words;
  words.reserve(pieces.size());
  for (const auto& [u0, u1] : pieces) words.push_back(text.substr(original[u0], original[u1] - original[u0]));
  return words;
}

}  // namespace hetmoe::text::detail
