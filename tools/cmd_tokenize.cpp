// `hetmoe tokenize`: the token ids of a file's exact bytes, as llama.cpp's llama-tokenize --ids prints them.
#include <fmt/format.h>

#include <memory>
#include <string>
#include <vector>

#include "runtime/error.h"
#include "runtime/gguf/reader.h"
#include "runtime/io/input_file.h"
#include "runtime/text/tokenizer.h"
#include "tools/commands.h"

namespace hetmoe::cli {

int tokenize(const TokenizeOptions& opt) {
  const std::string text = io::read_file(opt.file, io::kMaxTextBytes, "a text file");

  const gguf::GgufFile file = gguf::GgufFile::open(opt.model);
  const std::unique_ptr<text::Tokenizer> tokenizer = open_tokenizer(file);
  // The BOS (and EOS) the model asks for, as llama-tokenize adds them; special-token texts stay plain text.
  const std::vector<int32_t> ids = tokenizer->encode(text, !opt.no_bos, /*parse_special=*/false);

  std::string line;
  for (int32_t id : ids) line += (line.empty() ? "" : " ") + std::to_string(id);
  fmt::print("{}\n", line);
  return 0;
}

}  // namespace hetmoe::cli
