#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hetmoe::cli {

struct InspectOptions {
  std::string model;
  bool all_metadata = false;  // print tokenizer arrays' sizes too
};

struct LogitsOptions {
  std::string model;
  std::vector<int32_t> tokens;
  std::string out;
  int threads = 0;
};

struct RunOptions {
  std::string model;
  std::vector<int32_t> tokens;
  int n_predict = 16;
  float temperature = 0.0f;
  uint64_t seed = 0;
  int64_t ctx_size = 0;  // 0: prompt + n_predict, at most the training context
  bool print_ids = false;
  int threads = 0;
};

int inspect(const InspectOptions& opt);
int logits(const LogitsOptions& opt);
int run(const RunOptions& opt);

// Thread count for 0 = "all cores".
int resolve_threads(int requested);
// "3,17,42" or "3 17 42" to ids; fails on anything else.
std::vector<int32_t> parse_token_list(const std::string& text);

}  // namespace hetmoe::cli
