// libFuzzer target for the GGUF reader. Any input must either parse or throw hetmoe::Error; anything else (a
// sanitizer report, another exception, a broken invariant) is a finding. After a successful parse every byte
// range the reader hands out is touched at both ends, so a range that escapes the input is an ASan report here
// rather than in some later kernel.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>

#include "quant/ggml_type.h"
#include "runtime/error.h"
#include "runtime/gguf/reader.h"
#include "runtime/gguf/value.h"

namespace {

using hetmoe::gguf::GgufFile;
using hetmoe::gguf::TensorInfo;
using hetmoe::gguf::Value;
using hetmoe::gguf::ValueType;

// Abort (a finding) when an invariant the reader promises does not hold.
void require(bool ok) {
  if (!ok) std::abort();
}

volatile uint8_t g_sink;

void touch_value(const Value& v) {
  std::string display = v.to_display();
  g_sink = display.empty() ? 0 : static_cast<uint8_t>(display.back());
  if (!v.is_array()) {
    (void)v.as_int();
    (void)v.as_float();
    if (const std::string* s = v.as_string(); s && !s->empty()) g_sink = static_cast<uint8_t>(s->front() ^ s->back());
    return;
  }
  size_t n = v.array_size();
  if (v.elem_type() == ValueType::kString) {
    require(n == v.strings().size());
    for (const std::string& s : v.strings())
      if (!s.empty()) g_sink = static_cast<uint8_t>(s.front() ^ s.back());
  } else if (v.elem_type() == ValueType::kArray) {
    require(n == v.items().size());
    for (const Value& item : v.items()) touch_value(item);
  } else {
    require(n * hetmoe::gguf::value_type_size(v.elem_type()) == v.raw().size());
    if (n > 0) {
      (void)v.array_int(0);
      (void)v.array_float(n - 1);
    }
    require(!v.array_int(n).has_value());
  }
}

void touch_tensor(const GgufFile& f, const TensorInfo& t) {
  std::span<const uint8_t> file = f.bytes();
  const uint8_t* begin = file.data();
  const uint8_t* end = file.data() + file.size();
  const hetmoe::quant::TypeInfo& info = hetmoe::quant::type_info(t.type);
  require(t.n_dims >= 1 && t.n_dims <= hetmoe::gguf::kMaxDims);
  require(t.ne[0] > 0 && t.ne[0] % info.block_size == 0);
  require(t.row_bytes == static_cast<size_t>(t.ne[0] / info.block_size) * info.type_size);
  require(t.n_rows == t.ne[1] * t.ne[2] * t.ne[3]);
  require(t.nbytes == t.row_bytes * static_cast<size_t>(t.n_rows));
  require(t.n_elements() > 0);
  require(t.offset % f.alignment() == 0);
  require(t.data >= begin && t.nbytes > 0 && t.nbytes <= static_cast<size_t>(end - t.data));
  require(f.find_tensor(t.name) == &t);
  g_sink = t.data[0];
  g_sink = t.data[t.nbytes - 1];
  g_sink = t.row(t.n_rows - 1)[t.row_bytes - 1];
  (void)t.shape_string();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    GgufFile f = GgufFile::parse({data, size}, "fuzz.gguf");
    require(f.version() == 2 || f.version() == 3);
    require(f.alignment() != 0 && (f.alignment() & (f.alignment() - 1)) == 0);
    require(f.data_offset() <= f.file_size());
    for (const auto& [key, value] : f.metadata()) {
      require(!key.empty() && f.find(key) == &value);
      touch_value(value);
    }
    for (const TensorInfo& t : f.tensors()) touch_tensor(f, t);
  } catch (const hetmoe::Error& e) {
    // A rejected file is the expected outcome for almost every input; its message must still be one line that
    // names the file and the byte offset of the problem.
    std::string_view msg = e.what();
    require(msg.starts_with("fuzz.gguf: "));
    require(msg.find("(at byte offset ") != std::string_view::npos);
    require(msg.find('\n') == std::string_view::npos);
  }
  return 0;
}
