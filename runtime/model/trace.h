#pragma once

#include <cstdint>
#include <string_view>

namespace hetmoe::model {

// Receives intermediate values of a forward pass, named as in llama.cpp's graph ("l_out", "ffn_moe_probs", ...),
// for conformance tests and debugging. Rows are the tokens of the batch.
class Trace {
 public:
  virtual ~Trace() = default;
  virtual void values(int64_t layer, std::string_view name, const float* data, int64_t rows, int64_t cols) = 0;
  virtual void ids(int64_t layer, std::string_view name, const int32_t* data, int64_t rows, int64_t cols) = 0;
};

}  // namespace hetmoe::model
