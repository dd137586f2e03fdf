#pragma once

// The scale search of the K-quants with mins (Q4_K, Q5_K) as a replaceable step: ggml's make_qkx2_quants for each
// 32-value sub-block of a super-block, its values weighted by av_x + |x|, gives the sub-block's scale, min and
// codes; everything after it (the 6-bit scales, the final codes, the packing) is the reference's. The search is
// where the time goes (nstep + 1 trial scales of 32 values per sub-block), and sub-blocks are independent, so a SIMD
// tier runs one sub-block per vector lane, each lane with the reference's arithmetic in the reference's order: the
// same floats, so quantize_row's bytes.

#include <cstdint>

#include "quant/ggml_type.h"

namespace hetmoe::quant {

struct KSearchParams {
  int nmax = 15;  // codes 0..nmax
  float rmin = -1.0f, rdelta = 0.1f;
  int nstep = 20;
};

// The search's parameters for Q4_K or Q5_K (ggml's quantize_row_q{4,5}_K_ref).
KSearchParams k_search_params(GgmlType type);

// For n_blocks super-blocks at x (256 values each): every sub-block's scale, min (as a positive offset: the value
// of code 0 is -min) and codes: scales[8 * b + j], mins[8 * b + j], levels[256 * b + 32 * j + i].
using KSubblockSearchFn = void (*)(const float* x, int64_t n_blocks, const KSearchParams& p, float* scales, float* mins,
                                   uint8_t* levels);

// The reference search (ggml's expressions, one sub-block after another).
void k_search_reference(const float* x, int64_t n_blocks, const KSearchParams& p, float* scales, float* mins,
                        uint8_t* levels);

// The final codes of one 32-value sub-block against its rounded scale d and min dm: nearest_int((x + dm) / d) clamped
// to [0, nmax], a division a value (a tenth of a Q4_K row's time in scalar code). Replaceable the same way.
using KCodesFn = void (*)(const float* x, float d, float dm, int nmax, uint8_t* levels);
void k_codes_reference(const float* x, float d, float dm, int nmax, uint8_t* levels);

// A Q4_K or Q5_K row of n values (whole super-blocks) through `search` and `codes`: quantize_row's bytes when they
// give the reference's scales, mins and codes.
void quantize_k_rows_with(GgmlType type, const float* src, void* dst, int64_t n, KSubblockSearchFn search,
                          KCodesFn codes = &k_codes_reference);

}  // namespace hetmoe::quant
