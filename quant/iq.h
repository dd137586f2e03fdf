#pragma once

// The IQ formats (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) decoded to one common shape, the form
// every consumer works on: the scalar reference (dequantize, dot), the CPU kernels (an integer dot per block) and
// the quantizers (which write the inverse). A 256-block of any of them is
//   value[i] = (d * (ls[i / 16] * unit)) * q[i]
// with q the element's grid byte under its sign (IQ1: 8 * grid value + the group's shift of +-1), ls the odd
// multiplier of its 16-element sub-block and unit the format's constant (IQ2: 1/8, IQ3_XXS: 1/4, IQ3_S: 1,
// IQ1: 1/8). Evaluated in that order the values are ggml's dequantized floats bit for bit, and the dot product with
// a Q8_K activation is d_w * d_a * unit * sum over sub-blocks of ls * (integer sum of q * a).

#include <cstdint>

#include "quant/ggml_type.h"

namespace hetmoe::quant {

struct IqBlock {
  float d = 0;          // the block's fp16 scale
  uint8_t ls[16] = {};  // per 16 elements: 2 s + 1 for the stored scale s
  alignas(32) int8_t q[256] = {};
};

using IqUnpackFn = void (*)(const void* block, IqBlock& out);

bool is_iq_grid_type(GgmlType type);  // the seven formats above
// Decodes one block of an IQ type (unaligned bytes are fine); nullptr for other types.
IqUnpackFn iq_unpack_fn(GgmlType type);
float iq_unit(GgmlType type);  // the format's constant factor

}  // namespace hetmoe::quant
