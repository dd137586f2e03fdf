// libFuzzer target for the tokenizer. Each input is tokenized as raw bytes and as valid UTF-8 built from the same
// bytes, with special-token parsing off and on; nothing may throw or trip a sanitizer, every id must lie in the
// vocabulary, streaming must give what decode gives, and where the tokenizer promises it decode(encode(text)) must
// be the text. The regexes of every pre-tokenizer family are also run on the text: their words must tile it.
//
// Vocabularies: HETMOE_FUZZ_VOCAB (paths separated by ':'), else the tiny models and vocab files in tests/data.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/error.h"
#include "runtime/gguf/reader.h"
#include "runtime/text/tokenizer.h"
#include "runtime/text/tokenizer_internal.h"

namespace {

namespace fs = std::filesystem;
using hetmoe::text::StreamDecoder;
using hetmoe::text::Tokenizer;
using hetmoe::text::TokenType;

void require(bool ok) {
  if (!ok) std::abort();
}

struct Vocab {
  std::unique_ptr<Tokenizer> tokenizer;
  bool bytes_round_trip = true;  // false when some byte's byte-level token is user-defined (deepseek-llm/coder)
};

std::vector<Vocab>& vocabs() {
  static std::vector<Vocab> list;
  return list;
}

std::vector<std::unique_ptr<hetmoe::text::detail::PreTokenizer>>& pre_tokenizers() {
  static std::vector<std::unique_ptr<hetmoe::text::detail::PreTokenizer>> list;
  return list;
}

void add_vocab(const std::string& path) {
  const hetmoe::gguf::GgufFile file = hetmoe::gguf::GgufFile::open(path);
  Vocab v{.tokenizer = Tokenizer::from_gguf(file)};
  for (int b = 0; b < 256 && v.tokenizer->model() == "gpt2"; ++b) {
    const auto id = v.tokenizer->find(hetmoe::text::detail::gpt2_byte_text(static_cast<uint8_t>(b)));
    if (id && v.tokenizer->token_type(*id) == TokenType::kUserDefined) v.bytes_round_trip = false;
  }
  vocabs().push_back(std::move(v));
}

// Valid UTF-8 from arbitrary bytes: each pair of bytes picks a code point, weighted towards ASCII, whitespace,
// the byte-level alphabet's neighbourhood, CJK and emoji, and never a surrogate.
std::string to_utf8(const uint8_t* data, size_t size) {
  static constexpr uint32_t kBases[] = {0x20, 0x00, 0x80, 0x2000, 0x3000, 0x4E00, 0x1F300, 0x0600, 0xFF00, 0x10000};
  std::string out;
  for (size_t i = 0; i + 1 < size; i += 2) {
    const uint32_t base = kBases[data[i] % std::size(kBases)];
    uint32_t cpt = base + (data[i + 1] & (base < 0x80 ? 0x7F : 0xFF));
    if (cpt >= 0xD800 && cpt <= 0xDFFF) cpt = 0xFFFD;
    hetmoe::text::detail::utf8_append(out, cpt);
  }
  return out;
}

void check(const Vocab& v, const std::string& text, bool valid_utf8, bool add_special) {
  const Tokenizer& t = *v.tokenizer;
  for (bool parse_special : {false, true}) {
    const std::vector<int32_t> ids = t.encode(text, add_special, parse_special);
    for (int32_t id : ids) require(id >= 0 && id < t.n_vocab());
    const std::string decoded = t.decode(ids, parse_special);

    std::string streamed;
    StreamDecoder stream(t, parse_special);
    for (int32_t id : ids) streamed += stream.push(id);
    streamed += stream.flush();
    // SentencePiece's decode drops the space it added at the start; the stream (meant for generated text) keeps it.
    if (t.model() == "gpt2") require(streamed == decoded);

    if (parse_special) continue;
    const bool spm = t.model() == "llama";
    // SentencePiece spells spaces U+2581 (which therefore cannot come back), and broken UTF-8 can swallow its bytes.
    const bool promised =
        spm ? valid_utf8 && text.find("\xE2\x96\x81") == std::string::npos : valid_utf8 || v.bytes_round_trip;
    if (promised) require(decoded == text);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  std::vector<std::string> paths;
  if (const char* env = std::getenv("HETMOE_FUZZ_VOCAB"); env != nullptr && *env != '\0') {
    std::string_view list = env;
    for (size_t pos; !list.empty(); list.remove_prefix(pos == std::string_view::npos ? list.size() : pos + 1)) {
      pos = list.find(':');
      if (pos != 0) paths.emplace_back(list.substr(0, pos));
    }
  } else {
    for (const char* sub : {"models", "vocab"})
      for (const auto& entry : fs::directory_iterator(fs::path(HETMOE_TEST_DATA_DIR) / sub))
        if (entry.path().extension() == ".gguf") paths.push_back(entry.path().string());
  }
  for (const std::string& path : paths) add_vocab(path);
  require(!vocabs().empty());
  for (std::string_view name : hetmoe::text::detail::pre_tokenizer_names())
    pre_tokenizers().push_back(
        std::make_unique<hetmoe::text::detail::PreTokenizer>(*hetmoe::text::detail::find_pre_tokenizer(name)));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint8_t selector = data[0], flags = data[1];
  data += 2;
  size -= 2;
  const std::string raw(reinterpret_cast<const char*>(data), size);
  const std::string utf8 = to_utf8(data, size);
  const bool add_special = flags & 1;

  const Vocab& v = vocabs()[selector % vocabs().size()];
  check(v, raw, !hetmoe::text::find_invalid_utf8(raw).has_value(), add_special);
  check(v, utf8, true, add_special);

  // One pre-tokenizer family per input: its words are non-empty, in order, and cover the text exactly.
  const auto& pre = *pre_tokenizers()[(selector / 8 + flags) % pre_tokenizers().size()];
  for (const std::string* text : {&raw, &utf8}) {
    size_t at = 0;
    for (std::string_view word : pre.split(*text)) {
      require(!word.empty() && word.data() == text->data() + at);
      at += word.size();
    }
    require(at == text->size());
  }
  return 0;
}
