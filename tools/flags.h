#pragma once

// What the command line accepts as numbers, and llama.cpp's offload flags read as hetmoe's settings.
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "runtime/engine/engine.h"

namespace hetmoe::cli {

// A finite number in [lo, hi]; the message states the range and its unit ("GB", "tokens"), never 1.79e308.
CLI::Validator in_range(double lo, double hi, const std::string& unit = "");
// A finite number >= lo (no upper bound worth stating).
CLI::Validator at_least(double lo, const std::string& unit = "");

// llama.cpp's names turned into the long options CLI11 reads: "-ngl 99" would otherwise be "-n gl" and "-ot X" "-o t".
std::vector<std::string> rename_llama_flags(int argc, char** argv);

// llama.cpp's offload flags on a command that takes a device.
struct LlamaOffload {
  int64_t gpu_layers = -1;                   // -ngl / --n-gpu-layers
  bool cpu_moe = false;                      // --cpu-moe
  int64_t n_cpu_moe = -1;                    // --n-cpu-moe
  std::vector<std::string> override_tensor;  // -ot / --override-tensor PATTERN=DEVICE
};
void add_llama_offload(CLI::App* cmd, LlamaOffload* flags);
// Sets `d` from the flags where their meaning has a hetmoe equivalent and returns what each was mapped to, one line
// per flag; fails (hetmoe::Error) with a pointer to the equivalent where it has none.
std::vector<std::string> apply_llama_offload(const LlamaOffload& flags, engine::DeviceOptions& d);
// What the flags were mapped to, printed by open_engine once the model and device opened (a failure stays one line).
std::vector<std::string>& flag_notes();

// -t N: a whole number from 0 (every hardware thread); more than the machine has is capped to it, with a warning on
// stderr. A transform: it checks the text and rewrites it to the capped count.
CLI::Validator thread_count();

}  // namespace hetmoe::cli
