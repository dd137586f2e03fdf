#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "runtime/gguf/reader.h"
#include "runtime/model/config.h"

namespace hetmoe::model {

class Model;

// An architecture as the loader knows it: the GGUF name it answers to, what it reads of the metadata beyond the
// common keys, and the model it builds (binding its tensors, failing on a missing or misshapen one). Each file in
// archs/ defines one; archs.cpp lists them. Adding an architecture is that file and its line there.
struct ArchSpec {
  std::string_view name;  // general.architecture
  void (*configure)(const ConfigKeys& keys, ModelConfig& config);
  std::unique_ptr<Model> (*make)(std::unique_ptr<gguf::GgufFile> file, ModelConfig config, int n_threads);
};

// The architecture of that name, or null.
const ArchSpec* find_arch(std::string_view name);
// The names this build runs, for error messages ("deepseek2, qwen3moe, llama").
std::string arch_names();

}  // namespace hetmoe::model
