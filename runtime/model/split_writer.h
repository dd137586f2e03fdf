#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "quant/ggml_type.h"
#include "runtime/model/split.h"

namespace hetmoe {

// The residual's type for rows of n values: the K-quant (or Q8_0) of that many bits, with llama.cpp's fallback when
// its blocks do not divide the row (Q4_K -> Q5_0 for DeepSeek-V2-Lite's 1408-wide down projections).
quant::GgmlType residual_type(int residual_bits, int64_t n);

struct SplitOptions {
  std::string model;      // source GGUF
  std::string out;        // split GGUF (written under a temporary name, renamed at the end)
  int gpu_bits = 2;       // W^Q: 2, 3 or 4 bits
  int group = 64;         // W^Q group: 64 or 128
  int residual_bits = 4;  // W^R: 2, 3, 4, 5, 6 or 8 bits
  int threads = 0;        // < 1: all cores
  // residual: each expert tensor becomes W^R and W^Q; source: it stays as it is, with W^Q next to it (no W^R).
  model::CriticalFrom critical_from = model::CriticalFrom::kResidual;
  uint64_t max_shard_bytes = 0;  // > 0: write shards of at most this much data (<out>-NNNNN-of-MMMMM.gguf)
  bool measure_errors = false;   // fill the report's errors (each part dequantized again and compared)
};

// Per split tensor, relative Frobenius errors against the source weights (0 unless measure_errors was set).
struct SplitTensorReport {
  std::string name;
  quant::GgmlType source_type, gpu_type, residual_type;  // residual_type: the source's for a source split
  double gpu_error = 0;                                  // ||W - deq(W^Q)|| / ||W||
  double combined_error = 0;  // ||W - deq(W^Q) - deq(W^R)|| / ||W||; 0 for a source split (critical items exact)
};

// Writes the split file: every routed expert tensor becomes W^Q (quant/lowbit.h) and W^R (the residual in a CPU
// dot-product format), or for a source split stays as it is next to its W^Q; every other tensor and key is copied,
// and the split's formats are recorded in metadata. Streams tensor by tensor: one pass over each expert tensor's
// rows gives both parts, the residual (or the source) is written first and W^Q after it; while a tensor is written the
// next one is computed (memory: two tensors' output plus one W^Q). Refuses (hetmoe::Error) an unreadable or damaged
// input, an architecture hetmoe does not know, a model without routed experts, a file that is already split, rows the
// group does not divide, weights that are not finite, and an output path equal to the input. `progress` (when set)
// hears of every source tensor done: the source bytes done of the total, and the tensor's name.
using SplitProgress = std::function<void(double done, double total, const std::string& tensor)>;
std::vector<SplitTensorReport> split_model(const SplitOptions& opt, const SplitProgress& progress = {});

}  // namespace hetmoe
