// libFuzzer target for the multi-file GGUF reader: an input is a set of 2-4 shards written to files named as a
// split set names them, opened from the first. Any input must open or throw hetmoe::Error with one line naming a
// shard; an opened set must hold its split.tensors.count tensors, each findable by name, its data readable at
// both ends (a range past a shard's mapping faults here).
//
// Input: byte 0 chooses the shard count (2 + byte % 3), then one little-endian u16 per shard but the last gives
// the length of each shard's bytes (cut at the end of the input), then the shards' bytes one after another.

#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/error.h"
#include "runtime/gguf/reader.h"

namespace {

namespace fs = std::filesystem;
using hetmoe::gguf::GgufFile;

void require(bool ok) {
  if (!ok) std::abort();
}

volatile uint8_t g_sink;

const fs::path& dir() {
  static const fs::path d = [] {
    fs::path p = fs::temp_directory_path() / ("hetmoe-fuzz-shards-" + std::to_string(::getpid()));
    fs::create_directories(p);
    return p;
  }();
  return d;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int count = 2 + data[0] % 3;
  size_t pos = 1;
  std::vector<size_t> lengths;
  for (int i = 0; i + 1 < count; ++i) {
    if (pos + 2 > size) return 0;
    lengths.push_back(static_cast<size_t>(data[pos] | data[pos + 1] << 8));
    pos += 2;
  }
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir(), ec)) fs::remove(e.path(), ec);
  std::vector<std::string> paths;
  for (int i = 0; i < count; ++i) {
    const size_t n = i + 1 < count ? std::min(lengths[static_cast<size_t>(i)], size - pos) : size - pos;
    paths.push_back(hetmoe::gguf::shard_path((dir() / "f").string(), i + 1, count));
    std::ofstream(paths.back(), std::ios::binary)
        .write(reinterpret_cast<const char*>(data + pos), static_cast<std::streamsize>(n));
    pos += n;
  }
  try {
    const GgufFile f = GgufFile::open(paths.front());
    const std::vector<std::string> shards = f.shard_paths();
    require(!shards.empty() && shards.front() == paths.front());
    if (const auto total = f.get_int(hetmoe::gguf::kSplitTensorsKey); total && shards.size() > 1)
      require(static_cast<int64_t>(f.tensors().size()) == *total);
    for (const hetmoe::gguf::TensorInfo& t : f.tensors()) {
      require(f.find_tensor(t.name) == &t);
      require(t.nbytes > 0);
      g_sink = t.data[0];
      g_sink = t.data[t.nbytes - 1];
    }
  } catch (const hetmoe::Error& e) {
    const std::string_view msg = e.what();
    require(msg.find('\n') == std::string_view::npos);
    require(std::any_of(paths.begin(), paths.end(), [&](const std::string& p) { return msg.starts_with(p + ": "); }) ||
            msg.starts_with("cannot open "));
  }
  return 0;
}
