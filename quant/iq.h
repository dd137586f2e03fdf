#pragma once

// The IQ formats (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) decoded to one common shape, the form
// every consumer works on: the scalar reference (dequantize, dot), the CPU kernels (an integer dot per block) and
// the quantizers (which write the inverse). A 256-block of any of them is
//   value[i] = (d * (ls[i / 16] * unit)) * q[i],   q[i] = magnitude byte i, negated where its sign is set
// with q the element's grid byte under its sign (IQ1: 8 * grid value + the group's shift of +-1), ls the odd
// multiplier of its 16-element sub-block and unit the format's constant (IQ2: 1/8, IQ3_XXS: 1/4, IQ3_S: 1,
// IQ1: 1/8). Evaluated in that order the values are ggml's dequantized floats bit for bit, and the dot product with
// a Q8_K activation is d_w * d_a * unit * sum over sub-blocks of ls * (integer sum of q * a). The decoders
// themselves are inline (quant/iq_decode.h), 32 values at a time, so each kernel tier compiles them into its loop.

#include <cstdint>

#include "quant/ggml_type.h"

namespace hetmoe::quant {

// IQ1's 8 * grid value + shift for every (grid entry, shift sign) pair as magnitude bytes and a byte mask of the
// negative values (0xff each).
struct Iq1Group {
  uint64_t mag;
  uint64_t neg;
};
const Iq1Group* iq1_groups();  // [2 * entry + (shift negative)], 4096 entries, built once

float iq_half_to_float(uint16_t h);   // quant/half.h's conversion, out of line for the inline decoders
bool is_iq_grid_type(GgmlType type);  // the seven formats above

}  // namespace hetmoe::quant
