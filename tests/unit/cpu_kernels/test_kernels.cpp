// Every ISA tier this CPU has against the scalar reference: dot products per weight type on awkward sizes,
// the threaded matmul, the thread pool and the F32 operations.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/time.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cpu_kernels/avx512/kernels_avx512.h"
#include "cpu_kernels/isa.h"
#include "cpu_kernels/kernel_table.h"
#include "cpu_kernels/matmul.h"
#include "cpu_kernels/onednn.h"
#include "cpu_kernels/ops.h"
#include "quant/half.h"
#include "quant/ref.h"

namespace hetmoe::cpu {
namespace {

using quant::GgmlType;

std::vector<float> random_floats(int64_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<Isa> tiers_present() {
  std::vector<Isa> tiers;
  for (Isa isa : {Isa::kRef, Isa::kAvx2, Isa::kAvx512, Isa::kAmx})
    if (isa <= detect_isa()) tiers.push_back(isa);
  return tiers;
}

const GgmlType kWeightTypes[] = {
    GgmlType::F32,      GgmlType::F16,     GgmlType::BF16,     GgmlType::Q4_0,    GgmlType::Q4_1,     GgmlType::Q5_0,
    GgmlType::Q5_1,     GgmlType::Q8_0,    GgmlType::Q2_K,     GgmlType::Q3_K,    GgmlType::Q4_K,     GgmlType::Q5_K,
    GgmlType::Q6_K,     GgmlType::IQ4_NL,  GgmlType::IQ4_XS,   GgmlType::HQ2_G64, GgmlType::HQ2_G128, GgmlType::HQ3_G64,
    GgmlType::HQ3_G128, GgmlType::HQ4_G64, GgmlType::HQ4_G128, GgmlType::MXFP4,   GgmlType::TQ1_0,    GgmlType::TQ2_0,
    GgmlType::IQ1_S,    GgmlType::IQ1_M,   GgmlType::IQ2_XXS,  GgmlType::IQ2_XS,  GgmlType::IQ2_S,    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S};

struct Prepared {
  std::vector<uint8_t> weight, act;
  double abs_sum = 0;  // sum of |w_i * a_i| over the dequantized values: the natural scale of a dot's error
};

Prepared prepare(GgmlType type, int64_t n, uint64_t seed) {
  Prepared p;
  const std::vector<float> w = random_floats(n, seed, 0.05f), a = random_floats(n, seed + 1);
  p.weight.resize(quant::row_bytes(type, n));
  quant::quantize_row(type, w.data(), p.weight.data(), n);
  const GgmlType act_type = quant::type_info(type).vec_dot_type;
  p.act.resize(quant::activation_row_bytes(type, n));
  quant::quantize_activation(act_type, a.data(), p.act.data(), n);
  std::vector<float> wd(n);
  quant::dequantize_row(type, p.weight.data(), wd.data(), n);
  for (int64_t i = 0; i < n; ++i) p.abs_sum += std::abs(static_cast<double>(wd[i]) * a[i]);
  return p;
}

TEST(Kernels, EveryTierMatchesTheReferenceDot) {
  for (Isa isa : tiers_present()) {
    const KernelTable table = make_kernel_table(isa);
    for (GgmlType type : kWeightTypes) {
      const int64_t block = quant::type_info(type).block_size;
      // Awkward lengths: one block, odd counts of blocks (19: kernels that take eight blocks at a time, then pairs,
      // then one, run all three), and a length whose tail is not a multiple of 32.
      for (int64_t blocks : {1, 3, 7, 19}) {
        const int64_t n = block == 1 ? 37 * blocks : block * blocks;
        const Prepared p = prepare(type, n, 1000 * blocks + static_cast<uint64_t>(type));
        const float want = quant::vec_dot(type, n, p.weight.data(), p.act.data());
        const float got = table.dot_for(type)(n, p.weight.data(), p.act.data());
        EXPECT_NEAR(got, want, 1e-6 * p.abs_sum + 1e-30)
            << isa_name(isa) << " " << quant::type_info(type).name << " n=" << n;
      }
    }
  }
}

// Attention's head-group kernels on every tier: scores within rounding of the reference dots, and each score the same
// bit for bit whichever heads and keys share its call (a token's attention may not depend on its batch); the weighted
// sums equal the tier's axpy applied key by key from zero, bit for bit. Lengths with and without a tail of 8 and 16;
// head and key counts that fill the tiles and leave a rest, and more keys than one block of the weighted sums.
TEST(Kernels, HeadGroupAttentionKernels) {
  for (Isa isa : tiers_present()) {
    const KernelTable table = make_kernel_table(isa);
    for (int64_t n : {8, 37, 64, 576}) {
      for (int heads : {1, 3, 6, 8, 12}) {
        for (int64_t keys : {1, 5, 9, 10, 37}) {
          SCOPED_TRACE(testing::Message() << isa_name(isa) << " n=" << n << " heads=" << heads << " keys=" << keys);
          const int64_t q_stride = n + 3, k_stride = n + 5, stride = keys + 2;
          const std::vector<float> q = random_floats(heads * q_stride, 11 + n), k = random_floats(keys * k_stride, 12);
          std::vector<float> scores(heads * stride, -1.0f);
          table.dot_heads(n, heads, q.data(), q_stride, keys, k.data(), k_stride, scores.data(), stride);
          for (int h = 0; h < heads; ++h)
            for (int64_t j = 0; j < keys; ++j) {
              const float* qh = q.data() + h * q_stride;
              const float* kj = k.data() + j * k_stride;
              double want = 0, scale = 0;
              for (int64_t i = 0; i < n; ++i) {
                want += static_cast<double>(qh[i]) * kj[i];
                scale += std::abs(static_cast<double>(qh[i]) * kj[i]);
              }
              const float got = scores[h * stride + j];
              EXPECT_NEAR(got, want, 1e-6 * scale);
              float alone = 0;
              table.dot_heads(n, 1, qh, q_stride, 1, kj, k_stride, &alone, 1);
              ASSERT_EQ(alone, got) << "head " << h << " key " << j;
            }
          const std::vector<float> p = random_floats(heads * stride, 13), v = random_floats(keys * k_stride, 14);
          std::vector<float> sums(heads * q_stride, -1.0f);
          table.sum_heads(n, heads, keys, p.data(), stride, v.data(), k_stride, sums.data(), q_stride);
          for (int h = 0; h < heads; ++h) {
            std::vector<float> want(n, 0.0f);
            for (int64_t j = 0; j < keys; ++j) table.axpy(n, p[h * stride + j], v.data() + j * k_stride, want.data());
            for (int64_t i = 0; i < n; ++i) ASSERT_EQ(sums[h * q_stride + i], want[i]) << "head " << h << " at " << i;
          }
        }
      }
    }
  }
}

// The attention's softmax of every tier against softmax_with_sink (exact expf, sums in double): within 2e-6 of each
// probability, with and without a sink, on lengths around the 8-float steps; scores far below the maximum give 0.
TEST(Kernels, AttentionSoftmaxOfEveryTierMatchesTheReference) {
  for (Isa isa : tiers_present()) {
    const KernelTable table = make_kernel_table(isa);
    for (int64_t n : {1, 7, 8, 9, 33, 540})
      for (const float sink : {-std::numeric_limits<float>::infinity(), 0.3f}) {
        std::vector<float> x = random_floats(n, 20 + n, 4.0f);
        if (n > 2) x[1] = x[0] - 200.0f;  // e^-200: below every float
        std::vector<float> want = x;
        softmax_with_sink(want.data(), n, sink);
        table.attention_softmax(x.data(), n, sink);
        for (int64_t i = 0; i < n; ++i)
          ASSERT_NEAR(x[i], want[i], 2e-6f * want[i] + 1e-12f) << isa_name(isa) << " n " << n << " at " << i;
        std::vector<float> again = random_floats(n, 20 + n, 4.0f);
        if (n > 2) again[1] = again[0] - 200.0f;
        table.attention_softmax(again.data(), n, sink);
        EXPECT_EQ(again, x) << "the same scores give the same probabilities";
      }
  }
}

// The bandwidth probe's reads: every tier's sum of words equals the plain sum (mod 2^64), at every start within a
// 64-byte line and for lengths around its 32-word steps.
TEST(Kernels, StreamSumOfEveryTierIsTheSumOfTheWords) {
  std::vector<uint64_t> words(4096 + 64);
  for (size_t i = 0; i < words.size(); ++i) words[i] = (i + 1) * 0x9E3779B97F4A7C15ULL ^ (i << 40);
  for (Isa isa : tiers_present()) {
    const KernelTable table = make_kernel_table(isa);
    for (size_t start = 0; start < 8; ++start)
      for (size_t n : {size_t{0}, size_t{1}, size_t{31}, size_t{32}, size_t{33}, size_t{127}, size_t{4096}}) {
        uint64_t want = 0;
        for (size_t i = 0; i < n; ++i) want += words[start + i];
        EXPECT_EQ(table.stream_sum(words.data() + start, n), want) << isa_name(isa) << " start " << start << " n " << n;
      }
  }
}

// One weight row against many activation rows (the prefill and multi-token expert path) must give exactly what
// the single dot gives for each of them, on every tier and for counts that are not multiples of the kernels' 4.
TEST(Kernels, MultiRowDotEqualsSingleDotsBitForBit) {
  for (Isa isa : tiers_present()) {
    const KernelTable table = make_kernel_table(isa);
    for (GgmlType type : kWeightTypes) {
      const int64_t block = quant::type_info(type).block_size;
      const int64_t n = block == 1 ? 97 : block * 3;
      const std::vector<float> w = random_floats(n, 31, 0.05f);
      std::vector<uint8_t> wq(quant::row_bytes(type, n));
      quant::quantize_row(type, w.data(), wq.data(), n);
      const GgmlType act_type = quant::type_info(type).vec_dot_type;
      const size_t stride = quant::activation_row_bytes(type, n) + 16;  // rows need not be packed
      for (int64_t n_act : {1, 2, 3, 4, 5, 7, 9, 17}) {
        std::vector<uint8_t> act(stride * n_act);
        for (int64_t j = 0; j < n_act; ++j) {
          const std::vector<float> a = random_floats(n, 100 + j);
          if (act_type == GgmlType::F32)
            std::memcpy(act.data() + j * stride, a.data(), n * sizeof(float));
          else
            quant::quantize_activation(act_type, a.data(), act.data() + j * stride, n);
        }
        std::vector<float> got(n_act, -1.0f);
        table.dot_rows(type, n, wq.data(), act.data(), stride, n_act, got.data());
        for (int64_t j = 0; j < n_act; ++j)
          ASSERT_EQ(got[j], table.dot_for(type)(n, wq.data(), act.data() + j * stride))
              << isa_name(isa) << " " << quant::type_info(type).name << " n_act " << n_act << " j " << j;
      }
    }
  }
}

// Consecutive weight rows against one activation (decode's matrices) must give exactly the single dot of each row,
// on every tier, whatever the number of rows and the stride between them, for rows that end inside the kernels'
// groups of blocks (3 and 4 blocks: attn_k_b has 4), past them (9, 11 and 27 blocks: several groups of eight, a
// pair, an odd block), and at and past the length whose activation side a tier prepares once per call on the stack;
// rows packed (a tier may read several rows' fields at once) and with bytes between them.
// `count` rows of n values of `type`, packed, quantized from random weights (a seed per row).
std::vector<uint8_t> random_weight_rows(GgmlType type, int64_t n, int64_t count) {
  const size_t packed = quant::row_bytes(type, n);
  std::vector<uint8_t> rows(packed * count);
  for (int64_t r = 0; r < count; ++r) {
    const std::vector<float> w = random_floats(n, 300 + r, 0.05f);
    quant::quantize_row(type, w.data(), rows.data() + r * packed, n);
  }
  return rows;
}

// Values converted for a dot product with weights of `type` (its vec_dot_type; F32 as they are).
std::vector<uint8_t> activation_of(GgmlType type, const std::vector<float>& a) {
  const auto n = static_cast<int64_t>(a.size());
  const GgmlType act_type = quant::type_info(type).vec_dot_type;
  std::vector<uint8_t> act(quant::activation_row_bytes(type, n));
  if (act_type == GgmlType::F32)
    std::memcpy(act.data(), a.data(), n * sizeof(float));
  else
    quant::quantize_activation(act_type, a.data(), act.data(), n);
  return act;
}

TEST(Kernels, ManyRowDotEqualsSingleDotsBitForBit) {
  std::vector<KernelTable> tables;
  for (Isa isa : tiers_present()) tables.push_back(make_kernel_table(isa));
  for (GgmlType type : kWeightTypes) {
    const int64_t block = quant::type_info(type).block_size;
    // Short rows by their blocks; long ones by their values: 8192, 16384 and 32768 fill the stack buffers in which a
    // tier puts the activation's side together (Q5_0: 8192 values, Q4_K: 16384, Q8_0: 32768), 16640 overflows the
    // first two and 33024 (blocks of 32 only: the slow searches of other formats stay shorter) the third; 10944
    // (V2-Lite's dense ffn_down rows) ends with six blocks past the last eight.
    // 14, 15 and 44 blocks leave three pairs of blocks past the last eight (and an odd one), and two (V2-Lite's
    // expert down rows of 1408 values).
    std::vector<int64_t> lengths;
    for (int64_t blocks : {3, 4, 9, 11, 14, 15, 27, 44})
      lengths.push_back(block == 1 ? 97 * blocks / 3 : block * blocks);
    for (int64_t values : {4096, 8192, 10944, 16384, 16640, 32768, 33024})
      if (values % block == 0 && (values <= 16640 || block == 32)) lengths.push_back(values);
    for (const int64_t n : lengths) {
      // The rows are quantized once (the IQ types' search is slow, under the sanitizers most of all), then laid out
      // packed and with padding for every tier.
      const int64_t n_quantized = n >= 8192 ? 3 : 37;
      const size_t packed = quant::row_bytes(type, n);
      const std::vector<uint8_t> rows = random_weight_rows(type, n, n_quantized);
      const std::vector<uint8_t> act = activation_of(type, random_floats(n, 77));
      for (const size_t padding : {size_t{0}, size_t{8}}) {
        const size_t row_bytes = packed + padding;  // rows packed, and not
        std::vector<uint8_t> wq(row_bytes * n_quantized);
        for (int64_t r = 0; r < n_quantized; ++r)
          std::memcpy(wq.data() + r * row_bytes, rows.data() + r * packed, packed);
        for (const KernelTable& table : tables)
          for (int64_t n_rows : {1, 2, 16, 37}) {
            if (n_rows > n_quantized) continue;
            std::vector<float> got(n_rows + 1, -1.0f);
            table.dot_many(type, n, wq.data(), row_bytes, n_rows, act.data(), got.data());
            for (int64_t r = 0; r < n_rows; ++r)
              ASSERT_EQ(got[r], table.dot_for(type)(n, wq.data() + r * row_bytes, act.data()))
                  << isa_name(table.isa) << " " << quant::type_info(type).name << " n " << n << " padding " << padding
                  << " rows " << n_rows << " r " << r;
            EXPECT_EQ(got[n_rows], -1.0f) << "nothing written past the rows";
          }
      }
    }
  }
}

// Where the CPU has AVX-512 VBMI and BITALG, the AVX-512 tier decodes the IQ grid formats' blocks in vector registers
// (iq_vbmi.cpp) instead of through the shared 256-bit kernel; the integers and float steps are that kernel's, so every
// dot equals the tier's without them bit for bit, and the reference's within rounding. The blocks are random bytes with
// a finite scale (IQ1_M keeps its in the scale words' top nibbles): every entry of the grids up to 1024 entries occurs,
// most of IQ1's 2048, and every sign pattern and multiplier.
TEST(Kernels, VbmiIqDotsEqualTheTiersOwnBitForBit) {
  if (!has_avx512_vbmi_bitalg()) GTEST_SKIP() << "this CPU lacks AVX-512 VBMI or BITALG";
  const KernelTable vbmi = make_kernel_table(Isa::kAvx512);
  KernelTable plain = make_kernel_table(Isa::kAvx2);  // the AVX-512 tier without the VBMI kernels
  avx512::install(plain);
  std::mt19937_64 rng(5);
  for (GgmlType type : {GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ2_S, GgmlType::IQ3_XXS, GgmlType::IQ3_S,
                        GgmlType::IQ1_S, GgmlType::IQ1_M}) {
    const size_t slot = kernel_slot(type);
    ASSERT_NE(vbmi.vec_dot[slot], plain.vec_dot[slot]) << quant::type_info(type).name << ": not a VBMI kernel";
    for (int64_t blocks : {1, 2, 7, 9}) {
      const int64_t n = 256 * blocks;  // these formats: blocks of 256
      const size_t row_bytes = quant::row_bytes(type, n), block_bytes = row_bytes / blocks;
      for (int row = 0; row < 20; ++row) {
        std::vector<uint8_t> w(row_bytes);
        for (uint8_t& byte : w) byte = static_cast<uint8_t>(rng());
        for (int64_t b = 0; b < blocks; ++b) {
          const uint16_t d = quant::fp32_to_fp16(std::ldexp(1.0f + static_cast<float>(rng() % 100) / 100, -8));
          uint8_t* block = w.data() + b * block_bytes;
          if (type != GgmlType::IQ1_M) {
            std::memcpy(block, &d, 2);  // d leads the other formats' blocks
            continue;
          }
          for (int k = 0; k < 4; ++k)
            block[49 + 2 * k] = static_cast<uint8_t>((block[49 + 2 * k] & 0x0f) | (d >> (4 * k) & 0xf) << 4);
        }
        const std::vector<float> a = random_floats(n, 900 + row);
        const std::vector<uint8_t> act = activation_of(type, a);
        const float got = vbmi.dot_for(type)(n, w.data(), act.data());
        ASSERT_EQ(got, plain.dot_for(type)(n, w.data(), act.data()))
            << quant::type_info(type).name << " blocks " << blocks << " row " << row;
        std::vector<float> wd(n);
        quant::dequantize_row(type, w.data(), wd.data(), n);
        double abs_sum = 0;  // the dot's natural scale, as in EveryTierMatchesTheReferenceDot
        for (int64_t i = 0; i < n; ++i) abs_sum += std::abs(static_cast<double>(wd[i]) * a[i]);
        ASSERT_NEAR(got, quant::vec_dot(type, n, w.data(), act.data()), 1e-6 * abs_sum + 1e-30);
      }
    }
  }
}

// Consecutive weight rows against a few activation rows (dot_few: a verification step, a few sequences decoded
// together): every result equals the single dot of its row and activation, bit for bit, on every tier and format,
// for 1-3 activations (the kernels of their own) and 5 (the row-by-row fallback), with the activations apart by more
// than a row (matmul_heads: one row per head between a token's) and the outputs apart by more than the rows; rows
// long enough for the stack buffers (Q4_K: 16384 values) and one block past them, and pieces of rows past the one
// kept in L2 (Q5_0, Q8_0: 256 kB).
TEST(Kernels, FewRowDotEqualsSingleDotsBitForBit) {
  std::vector<KernelTable> tables;
  for (Isa isa : tiers_present()) tables.push_back(make_kernel_table(isa));
  constexpr int64_t kActs = 5;
  for (GgmlType type : kWeightTypes) {
    const int64_t block = quant::type_info(type).block_size;
    std::vector<int64_t> lengths;
    for (int64_t blocks : {3, 4, 9, 14, 44}) lengths.push_back(block == 1 ? 97 * blocks / 3 : block * blocks);
    for (int64_t values : {2048, 10944, 16384, 16640})
      if (values % block == 0 && (values <= 2048 || block == 32 || block == 256)) lengths.push_back(values);
    for (const int64_t n : lengths) {
      const size_t row_bytes = quant::row_bytes(type, n);
      // Enough rows of 10944 Q8_0 values (11.6 kB) to pass a 256 kB piece.
      const int64_t n_rows = n == 10944 ? 25 : (n >= 8192 ? 3 : 37);
      const std::vector<uint8_t> wq = random_weight_rows(type, n, n_rows);
      const size_t act_bytes = quant::activation_row_bytes(type, n), stride = act_bytes + 64;
      std::vector<uint8_t> acts(stride * kActs);
      for (int64_t j = 0; j < kActs; ++j) {
        const std::vector<uint8_t> a = activation_of(type, random_floats(n, 77 + j));
        std::memcpy(acts.data() + j * stride, a.data(), act_bytes);
      }
      const size_t ldo = n_rows + 3;
      for (const KernelTable& table : tables)
        for (int64_t n_act : {int64_t{1}, int64_t{2}, int64_t{3}, kActs}) {
          std::vector<float> got(ldo * kActs, -1.0f);
          table.dot_few(type, n, wq.data(), row_bytes, n_rows, acts.data(), stride, n_act, got.data(), ldo);
          for (int64_t j = 0; j < kActs; ++j)
            for (size_t r = 0; r < ldo; ++r) {
              const float g = got[j * ldo + r];
              if (j >= n_act || r >= static_cast<size_t>(n_rows)) {
                ASSERT_EQ(g, -1.0f) << "nothing written past the rows and activations";
                continue;
              }
              ASSERT_EQ(g, table.dot_for(type)(n, wq.data() + r * row_bytes, acts.data() + j * stride))
                  << isa_name(table.isa) << " " << quant::type_info(type).name << " n " << n << " acts " << n_act
                  << " act " << j << " r " << r;
            }
        }
    }
  }
}

// Tiles of 8 weight rows against many activation rows (prefill): each output within rounding of the reference dot,
// for activation counts around the tile kernels' inner chunk of 32 and rows 3 super-blocks long.
TEST(Kernels, GemmTilesMatchTheReferenceDot) {
  int tested = 0;
  std::vector<std::pair<KernelTable, std::string>> tables;
  for (Isa isa : tiers_present()) tables.emplace_back(make_kernel_table(isa), isa_name(isa));
  // The AMX kernels with their tile instructions emulated, wherever AVX-512 runs (AMX hardware runs the real ones).
  if (detect_isa() >= Isa::kAvx512) tables.emplace_back(make_emulated_amx_table(), "amx (emulated tiles)");
  for (const auto& [table, label] : tables) {
    for (GgmlType type : kWeightTypes) {
      const GemmTileFn tile = table.tile_for(type);
      if (!tile) continue;
      const int64_t n = quant::type_info(type).block_size * 3;
      const size_t rb = quant::row_bytes(type, n);
      std::vector<uint8_t> w(rb * kTileRows);
      std::vector<std::vector<float>> wf;
      for (int64_t r = 0; r < kTileRows; ++r) {
        wf.push_back(random_floats(n, 50 + r, 0.05f));
        quant::quantize_row(type, wf.back().data(), w.data() + r * rb, n);
      }
      const GgmlType act_type = quant::type_info(type).vec_dot_type;
      const size_t stride = quant::activation_row_bytes(type, n);
      for (int64_t n_act : {1, 5, 8, 31, 32, 33, 70}) {
        std::vector<uint8_t> act(stride * n_act);
        std::vector<std::vector<float>> af;
        for (int64_t j = 0; j < n_act; ++j) {
          af.push_back(random_floats(n, 300 + j));
          quant::quantize_activation(act_type, af.back().data(), act.data() + j * stride, n);
        }
        const size_t ldo = kTileRows + 3;
        std::vector<float> out(n_act * ldo, -9.0f);
        tile(n, w.data(), rb, act.data(), stride, n_act, out.data(), ldo);
        for (int64_t j = 0; j < n_act; ++j)
          for (int64_t r = 0; r < kTileRows; ++r) {
            double abs_sum = 0;
            for (int64_t i = 0; i < n; ++i) abs_sum += std::abs(static_cast<double>(wf[r][i]) * af[j][i]);
            const float want = quant::vec_dot(type, n, w.data() + r * rb, act.data() + j * stride);
            ASSERT_NEAR(out[j * ldo + r], want, 1e-6 * abs_sum)
                << label << " " << quant::type_info(type).name << " n_act " << n_act << " j " << j << " r " << r;
            ASSERT_EQ(out[j * ldo + kTileRows], -9.0f) << "wrote past the tile's rows";
          }
        ++tested;
      }
    }
  }
  if (tested == 0) GTEST_SKIP() << "no tier on this CPU has tile kernels";
}

// Q8_K's (and Q8_0's) edge cases byte for byte on every tier: an all-zero block, a tie for the largest |x| (the first
// one sets the scale's sign), values that land exactly on .5 after scaling (ties to even), and a NaN-free huge range.
TEST(Kernels, Q8KConverterEdgeCasesMatchTheReference) {
  std::vector<float> x(3 * 256, 0.0f);
  for (int j = 0; j < 256; ++j) x[256 + j] = 0.01f * static_cast<float>(j % 17) - 0.05f;
  x[256 + 5] = -3.0f;
  x[256 + 9] = 3.0f;  // same |x|, later: the scale comes from -3
  for (int j = 0; j < 256; ++j) x[512 + j] = (static_cast<float>(j) - 127.0f) / 2.0f;  // k + 0.5 after scaling
  // Many blocks of whole numbers: products that fall exactly between two integers are frequent there, and they
  // catch a multiply and add fused into one FMA (no rounding of the product), as an earlier version had.
  std::mt19937_64 rng(5);
  std::normal_distribution<float> dist(0.0f, 30.0f);
  for (int i = 0; i < 2000 * 256; ++i) x.push_back(std::round(dist(rng)));
  const int64_t n = static_cast<int64_t>(x.size());
  for (Isa isa : tiers_present()) {
    const KernelTable table = make_kernel_table(isa);
    // Q8_0 (the activations of Q8_0 and Q5_0 weights) on the same values, blocks of 32.
    for (const auto& [act, weight] : {std::pair{GgmlType::Q8_K, GgmlType::Q4_K}, {GgmlType::Q8_0, GgmlType::Q8_0}}) {
      std::vector<uint8_t> want(quant::activation_row_bytes(weight, n)), got(want.size());
      quant::quantize_activation(act, x.data(), want.data(), n);
      table.activation_for(act)(x.data(), got.data(), n);
      EXPECT_EQ(got, want) << isa_name(isa) << " " << quant::type_info(act).name;
    }
  }
}

TEST(Kernels, ActivationConverterOfEveryTierMatchesTheReference) {
  for (Isa isa : tiers_present()) {
    const KernelTable table = make_kernel_table(isa);
    for (GgmlType act : {GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8_K}) {
      const int64_t n = 512;
      const std::vector<float> x = random_floats(n, 7);
      const GgmlType weight = act == GgmlType::Q8_K   ? GgmlType::Q4_K
                              : act == GgmlType::Q8_1 ? GgmlType::Q4_1
                              : act == GgmlType::Q8_0 ? GgmlType::Q8_0
                                                      : act;
      std::vector<uint8_t> want(quant::activation_row_bytes(weight, n)), got(want.size());
      quant::quantize_activation(act, x.data(), want.data(), n);
      table.activation_for(act)(x.data(), got.data(), n);
      EXPECT_EQ(got, want) << isa_name(isa) << " " << quant::type_info(act).name;
    }
  }
}

// The split formats' quantizer of every tier writes the reference's bytes: normal rows at several scales, rows with
// constant, zero and two-valued groups (signed zeros among them), values on exact levels (ties of the rounding), a
// wide-ranged row whose least-squares scales round to zero in fp16, magnitudes tied between signs, and subnormals.
TEST(Kernels, WeightQuantizerOfEveryTierMatchesTheReference) {
  const int64_t n = 1408;  // DeepSeek-V2-Lite's expert width: 22 groups of 64, 11 of 128
  std::vector<std::vector<float>> rows = {random_floats(n, 21, 0.02f), random_floats(n, 22, 3.0f)};
  std::vector<float> special(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t g = i / 64;
    special[i] = g % 4 == 0   ? 0.375f                                      // constant
                 : g % 4 == 1 ? (i % 2 ? 0.0f : -0.0f)                      // zeros of both signs
                 : g % 4 == 2 ? (i % 3 ? -1.5f : 2.25f)                     // two values
                              : 0.25f * static_cast<float>(i % 16) - 1.0f;  // exact levels
  }
  rows.push_back(special);
  std::vector<float> wide = random_floats(n, 23, 1e-6f);
  for (int64_t i = 0; i < n; i += 37) wide[i] = 5e4f;
  rows.push_back(wide);
  // Largest magnitudes tied between signs (the first one sets the sign of Q5_0's scale), and values so small that a
  // scale derived from them underflows to zero.
  std::vector<float> ties(n), tiny(n);
  for (int64_t i = 0; i < n; ++i) {
    ties[i] = (i % 3 == 0 ? 0.5f : -0.5f) * (i % 7 == 0 ? 0.25f : 1.0f);
    tiny[i] = (i % 2 ? 1e-44f : -3e-45f) * static_cast<float>(i % 5);
  }
  rows.push_back(ties);
  rows.push_back(tiny);
  for (Isa isa : tiers_present()) {
    const KernelTable table = make_kernel_table(isa);
    for (GgmlType t : {GgmlType::HQ2_G64, GgmlType::HQ2_G128, GgmlType::HQ3_G64, GgmlType::HQ3_G128, GgmlType::HQ4_G64,
                       GgmlType::HQ4_G128, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q5_0}) {
      const int64_t len = quant::type_info(t).block_size == 256 ? 1280 : n;
      for (size_t r = 0; r < rows.size(); ++r) {
        std::vector<uint8_t> want(quant::row_bytes(t, len)), got(want.size());
        quant::quantize_row(t, rows[r].data(), want.data(), len);
        table.quantize_row(t, rows[r].data(), got.data(), len);
        EXPECT_EQ(got, want) << isa_name(isa) << " " << quant::type_info(t).name << " row " << r;
        // And back: the tier's dequantization gives the reference's floats, bit for bit.
        std::vector<float> back_want(static_cast<size_t>(len)), back_got(static_cast<size_t>(len), -1.0f);
        quant::dequantize_row(t, want.data(), back_want.data(), len);
        table.dequantize_row(t, want.data(), back_got.data(), len);
        EXPECT_EQ(0, std::memcmp(back_got.data(), back_want.data(), back_want.size() * sizeof(float)))
            << isa_name(isa) << " " << quant::type_info(t).name << " row " << r;
      }
    }
    std::vector<uint8_t> out(quant::row_bytes(GgmlType::HQ2_G64, 64));
    EXPECT_THROW(table.quantize_row(GgmlType::HQ2_G64, rows[0].data(), out.data(), 96), std::invalid_argument)
        << isa_name(isa);
    std::vector<float> floats(96);
    EXPECT_THROW(table.dequantize_row(GgmlType::HQ2_G64, out.data(), floats.data(), 96), std::invalid_argument)
        << isa_name(isa);
  }
}

TEST(Kernels, ThreadedMatmulEqualsRowByRowDots) {
  const int64_t n_cols = 512, n_rows = 37, n_tokens = 17;
  for (GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q5_0}) {
    const std::vector<float> w = random_floats(n_cols * n_rows, 11, 0.05f), x = random_floats(n_cols * n_tokens, 12);
    const size_t rb = quant::row_bytes(type, n_cols);
    std::vector<uint8_t> wq(rb * n_rows);
    for (int64_t r = 0; r < n_rows; ++r) quant::quantize_row(type, &w[r * n_cols], wq.data() + r * rb, n_cols);
    const WeightMatrix m{type, n_cols, n_rows, rb, wq.data()};
    const KernelTable& k = kernels();
    for (int threads : {1, 2, 3}) {
      ThreadPool pool(threads);
      const int64_t ldy = n_rows + 5;  // a wider output row: only the first n_rows columns may be written
      std::vector<float> y(n_tokens * ldy, -7.0f);
      matmul(k, pool, m, x.data(), n_tokens, y.data(), ldy);
      std::vector<uint8_t> act(quant::activation_row_bytes(type, n_cols));
      for (int64_t t = 0; t < n_tokens; ++t) {
        const void* a = &x[t * n_cols];
        if (type != GgmlType::F32) {
          k.activation_for(quant::type_info(type).vec_dot_type)(&x[t * n_cols], act.data(), n_cols);
          a = act.data();
        }
        for (int64_t r = 0; r < n_rows; ++r) {
          const float want = k.dot_for(type)(n_cols, m.row(r), a);
          // Rows in full blocks of 8 take the tier's tile kernel when it has one, F32 takes oneDNN (17 tokens is a
          // batch): equal to rounding there, bit for bit everywhere else.
          const bool batch_kernel = (k.tile_for(type) && r < n_rows / kTileRows * kTileRows) ||
                                    (type == GgmlType::F32 && k.isa != Isa::kRef && onednn_available());
          if (batch_kernel) {
            double abs_sum = 0;
            for (int64_t i = 0; i < n_cols; ++i) abs_sum += std::abs(w[r * n_cols + i] * x[t * n_cols + i]);
            ASSERT_NEAR(y[t * ldy + r], want, 1e-6 * abs_sum) << quant::type_info(type).name << " r " << r;
          } else {
            ASSERT_EQ(y[t * ldy + r], want)
                << quant::type_info(type).name << " threads " << threads << " t " << t << " r " << r;
          }
        }
        for (int64_t r = n_rows; r < ldy; ++r) ASSERT_EQ(y[t * ldy + r], -7.0f) << "wrote past the row";
      }
    }
  }
}

TEST(Kernels, FusedSwigluEqualsTwoMatmulsAndSilu) {
  // Rows 1, 17, 97 with 17 tokens; gate and up of the same and of different activation types.
  const int64_t n_cols = 256, n_tokens = 17;
  const std::vector<float> x = random_floats(n_cols * n_tokens, 21);
  for (int64_t n_rows : {1, 17, 97})
    for (auto [gt, ut] : {std::pair{GgmlType::Q4_K, GgmlType::Q4_K}, std::pair{GgmlType::Q4_K, GgmlType::Q8_0},
                          std::pair{GgmlType::F32, GgmlType::Q6_K}}) {
      auto make = [&](GgmlType t, uint64_t seed, std::vector<uint8_t>& bytes) {
        const std::vector<float> w = random_floats(n_cols * n_rows, seed, 0.05f);
        const size_t rb = quant::row_bytes(t, n_cols);
        bytes.resize(rb * n_rows);
        for (int64_t r = 0; r < n_rows; ++r) quant::quantize_row(t, &w[r * n_cols], bytes.data() + r * rb, n_cols);
        return WeightMatrix{t, n_cols, n_rows, rb, bytes.data()};
      };
      std::vector<uint8_t> gb, ub;
      const WeightMatrix gate = make(gt, 22, gb), up = make(ut, 23, ub);
      ThreadPool pool(2);
      std::vector<float> g(n_tokens * n_rows), u(n_tokens * n_rows), want(n_tokens * n_rows), got(n_tokens * n_rows);
      matmul(kernels(), pool, gate, x.data(), n_tokens, g.data(), n_rows);
      matmul(kernels(), pool, up, x.data(), n_tokens, u.data(), n_rows);
      swiglu(g.data(), u.data(), want.data(), n_tokens * n_rows);
      swiglu_matmul(kernels(), pool, gate, up, x.data(), n_tokens, got.data());
      EXPECT_EQ(got, want) << n_rows << " rows";
    }
}

// Projections of one input in one loop (MLA's q and kv_a, GQA's q, k and v): each output equals its own matmul bit for
// bit, for one token (dot_many), a few (dot_rows) and a batch past the tile threshold, with row counts that end in a
// partial block; matrices of another activation type or width, or more than one loop takes, go one by one.
TEST(Kernels, MatmulsOfOneInputEqualOneMatmulEach) {
  const int64_t cols = 256;
  struct Spec {
    GgmlType type;
    int64_t rows;
  };
  const std::vector<std::vector<Spec>> sets = {
      {{GgmlType::Q4_K, 200}, {GgmlType::Q4_K, 37}},                       // MLA: q, kv_a
      {{GgmlType::Q8_0, 64}, {GgmlType::Q8_0, 16}, {GgmlType::Q8_0, 33}},  // GQA: q, k, v
      {{GgmlType::Q4_K, 48}, {GgmlType::Q6_K, 20}},                        // one activation type (Q8_K)
      {{GgmlType::Q4_K, 40}, {GgmlType::Q8_0, 24}},                        // two types: one matmul each
      {{GgmlType::F32, 30}, {GgmlType::F32, 17}},                          // oneDNN in a batch
      {{GgmlType::Q8_0, 8}, {GgmlType::Q8_0, 8}, {GgmlType::Q8_0, 8}, {GgmlType::Q8_0, 8}, {GgmlType::Q8_0, 8}}};
  ThreadPool pool(2);
  int set_index = 0;
  for (const std::vector<Spec>& set : sets) {
    std::vector<std::vector<uint8_t>> bytes(set.size());
    std::vector<MatmulOutput> outs;
    std::vector<std::vector<float>> got(set.size());
    for (int64_t n_tokens : {1, 3, 40}) {
      const std::vector<float> x = random_floats(n_tokens * cols, 70 + n_tokens);
      outs.clear();
      for (size_t i = 0; i < set.size(); ++i) {
        const size_t rb = quant::row_bytes(set[i].type, cols);
        const std::vector<float> w = random_floats(set[i].rows * cols, 80 + i, 0.05f);
        bytes[i].resize(rb * set[i].rows);
        for (int64_t r = 0; r < set[i].rows; ++r)
          quant::quantize_row(set[i].type, &w[r * cols], bytes[i].data() + r * rb, cols);
        got[i].assign(n_tokens * set[i].rows + 1, -1.0f);
        outs.push_back({{set[i].type, cols, set[i].rows, rb, bytes[i].data()}, got[i].data(), set[i].rows});
      }
      matmuls(kernels(), pool, outs, x.data(), n_tokens);
      for (size_t i = 0; i < set.size(); ++i) {
        std::vector<float> want(n_tokens * set[i].rows + 1, -1.0f);
        matmul(kernels(), pool, outs[i].w, x.data(), n_tokens, want.data(), set[i].rows);
        EXPECT_EQ(got[i], want) << "set " << set_index << " matrix " << i << " tokens " << n_tokens;
        if (n_tokens == 1) {  // and matmul is the row's own dot
          const KernelTable& k = kernels();
          std::vector<uint8_t> act(quant::activation_row_bytes(set[i].type, cols));
          k.to_activation(set[i].type, x.data(), act.data(), cols);
          for (int64_t r = 0; r < set[i].rows; ++r)
            ASSERT_EQ(got[i][r], k.dot_for(set[i].type)(cols, outs[i].w.row(r), act.data())) << "row " << r;
        }
      }
    }
    ++set_index;
  }
}

TEST(Kernels, PerHeadMatmulInOnePassEqualsOneMatmulPerHead) {
  // MLA's attn_k_b shape in small: 6 heads of 37 rows of 64 (Q5_0, as real files store it), strided input; one token
  // (decode: a head's rows of a piece in one call, pieces that end inside a head) and three.
  const int64_t heads = 6, rows = 37, cols = 64, x_head = 96, y_head = 40;
  const std::vector<float> w = random_floats(heads * rows * cols, 31, 0.05f);
  for (int64_t n_tokens : {1, 3}) {
    const std::vector<float> x = random_floats(n_tokens * heads * x_head, 32);
    for (GgmlType t : {GgmlType::Q5_0, GgmlType::F32, GgmlType::Q8_0, GgmlType::Q4_0}) {
      const size_t rb = quant::row_bytes(t, cols);
      std::vector<uint8_t> wq(rb * heads * rows);
      for (int64_t r = 0; r < heads * rows; ++r) quant::quantize_row(t, &w[r * cols], wq.data() + r * rb, cols);
      const WeightMatrix m{t, cols, heads * rows, rb, wq.data()};
      ThreadPool pool(2);
      std::vector<float> got(n_tokens * heads * y_head, -1.0f), want = got;
      matmul_heads(kernels(), pool, m,
                   {.n_heads = heads,
                    .x_token_stride = heads * x_head,
                    .x_head_stride = x_head,
                    .y_token_stride = heads * y_head,
                    .y_head_stride = y_head},
                   x.data(), n_tokens, got.data());
      for (int64_t h = 0; h < heads; ++h) {
        std::vector<float> xh(n_tokens * cols);
        for (int64_t tk = 0; tk < n_tokens; ++tk)
          std::copy_n(&x[tk * heads * x_head + h * x_head], cols, &xh[tk * cols]);
        matmul(kernels(), pool, m.rows(h * rows, rows), xh.data(), n_tokens, &want[h * y_head], heads * y_head);
      }
      EXPECT_EQ(got, want) << quant::type_info(t).name << " tokens " << n_tokens;
    }
  }
}

TEST(ThreadPool, CoversEveryIndexOnceAndRethrows) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 5, 97, 1000}) {
      std::vector<std::atomic<int>> hits(n);
      pool.parallel_for(n, 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[i]++;
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "threads " << threads << " n " << n;
    }
    EXPECT_THROW(pool.parallel_for(100, 1,
                                   [](int64_t b, int64_t) {
                                     if (b == 0) throw std::runtime_error("boom");
                                   }),
                 std::runtime_error);
    // A worker's exception (the chunks past the caller's) reaches the caller too, once.
    if (threads > 1) {
      EXPECT_THROW(pool.parallel_for(100, 1,
                                     [](int64_t b, int64_t) {
                                       if (b > 0) throw std::out_of_range("worker");
                                     }),
                   std::out_of_range);
      EXPECT_NO_THROW(pool.parallel_for(100, 1, [](int64_t, int64_t) {}));
    }
    // The pool stays usable after an exception.
    std::atomic<int64_t> sum = 0;
    pool.parallel_for(10, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) sum += i;
    });
    EXPECT_EQ(sum.load(), 45);
  }
}

TEST(ThreadPool, BalancedLoopCoversEveryIndexOnce) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 5, 97, 1000})
      for (int64_t grain : {1, 3}) {
        std::vector<std::atomic<int>> hits(n);
        pool.parallel_for_balanced(n, grain, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) hits[i]++;
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "threads " << threads << " n " << n;
      }
  }
}

// A thread that is slow (here: the first piece to run waits, on whichever thread took it) does not hold the loop up:
// the other thread does its own chunk and then the rest of the slow one's. Without taking over, the wait would run
// into its deadline.
TEST(ThreadPool, BalancedLoopLetsAFastThreadTakeASlowOnesWork) {
  ThreadPool pool(2);
  const int64_t n = 64;
  std::vector<std::atomic<int>> hits(n);
  std::atomic<int64_t> done{0};
  std::atomic<bool> waited{false}, taken_over{false};
  pool.parallel_for_balanced(n, 1, [&](int64_t b, int64_t e) {
    if (!waited.exchange(true)) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (done.load() < n - (e - b) && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
      taken_over = done.load() == n - (e - b);
    }
    for (int64_t i = b; i < e; ++i) hits[i]++;
    done += e - b;
  });
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << i;
  EXPECT_TRUE(waited.load());
  EXPECT_TRUE(taken_over.load());
}

TEST(Ops, RmsNormSoftmaxSwiglu) {
  const std::vector<float> x = random_floats(97, 3), w = random_floats(97, 4);
  std::vector<float> y(97);
  rms_norm(x.data(), w.data(), y.data(), 97, 1e-6f);
  double ss = 0;
  for (float v : x) ss += double(v) * v;
  const double scale = 1.0 / std::sqrt(ss / 97 + 1e-6);
  for (int i = 0; i < 97; ++i) EXPECT_NEAR(y[i], x[i] * scale * w[i], 1e-5 * std::abs(x[i] * scale * w[i]) + 1e-7);

  std::vector<float> s = x;
  softmax(s.data(), 97);
  EXPECT_NEAR(std::accumulate(s.begin(), s.end(), 0.0), 1.0, 1e-6);
  EXPECT_EQ(std::max_element(s.begin(), s.end()) - s.begin(), std::max_element(x.begin(), x.end()) - x.begin());

  std::vector<float> g = {-3.0f, 0.0f, 2.0f}, u = {2.0f, 5.0f, -1.0f}, o(3);
  swiglu(g.data(), u.data(), o.data(), 3);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(o[i], g[i] / (1 + std::exp(-g[i])) * u[i], 1e-6);
}

// silu_times against g / (1 + e^-g) * u in double: within 4 ulp where e^-g is inside silu_exp's clamp, and the
// tiny values past it within 1e-30 of the exact ones; NaN stays NaN, a large positive g gives g * u.
TEST(Ops, SiluTimesIsWithinUlpsOfTheExactValue) {
  int64_t checked = 0;
  auto exact = [](float g, float u) { return static_cast<double>(g) / (1.0 + std::exp(-static_cast<double>(g))) * u; };
  std::mt19937_64 rng(21);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (float g = -100.0f; g <= 100.0f; g += 0.0137f) {
    const float u = uniform(rng) * 3.0f;
    const double want = exact(g, u);
    const float got = silu_times(g, u);
    if (std::abs(g) < 87.0f) {
      const double ulp = std::ldexp(1.0, std::ilogb(static_cast<float>(want)) - 23);
      ASSERT_LE(std::abs(got - want), 4 * ulp) << "g " << g << " u " << u;
    } else {
      ASSERT_NEAR(got, want, 1e-30 + 1e-6 * std::abs(want)) << "g " << g << " u " << u;
    }
    ++checked;
  }
  EXPECT_GT(checked, 14000);
  EXPECT_TRUE(std::isnan(silu_times(NAN, 1.0f)));
  EXPECT_EQ(silu_times(1e30f, 2.0f), 2e30f);
  EXPECT_EQ(silu_times(0.0f, 5.0f), 0.0f);
}

// Every tier's swiglu gives silu_times's float in every lane, bit for bit (NaN for NaN), whatever the length (its
// 8-lane steps and the tail) and the values: ordinary ones, zeros of both signs, tiny and huge ones, the clamp's
// edges, infinities and NaN; also in place (out = gate).
TEST(Kernels, SwigluEqualsSiluTimesBitForBit) {
  std::vector<float> g = random_floats(1000, 41, 6.0f), u = random_floats(1000, 42, 2.0f);
  const float specials[] = {0.0f,  -0.0f,  1e-30f,   -1e-30f,   87.2f, -87.2f, 88.4f, -88.4f, 89.0f, -89.0f,
                            1e30f, -1e30f, INFINITY, -INFINITY, NAN,   0.5f,   -0.5f, 20.0f,  -20.0f};
  for (size_t i = 0; i < std::size(specials); ++i) g[3 * i + 1] = specials[i];
  for (Isa isa : tiers_present()) {
    const KernelTable table = make_kernel_table(isa);
    for (int64_t n : {0, 1, 7, 8, 9, 15, 16, 17, 37, 1000}) {
      std::vector<float> got(n + 1, -7.0f);
      table.swiglu(n, g.data(), u.data(), got.data());
      for (int64_t i = 0; i < n; ++i) {
        const float want = silu_times(g[i], u[i]);
        if (std::isnan(want)) {
          ASSERT_TRUE(std::isnan(got[i])) << isa_name(isa) << " n " << n << " i " << i;
        } else {
          ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want))
              << isa_name(isa) << " n " << n << " i " << i << " g " << g[i] << " u " << u[i];
        }
      }
      EXPECT_EQ(got[n], -7.0f) << "nothing written past n";
      std::vector<float> in_place(g.begin(), g.begin() + n);
      table.swiglu(n, in_place.data(), u.data(), in_place.data());
      for (int64_t i = 0; i < n; ++i) {
        if (!std::isnan(got[i])) {
          ASSERT_EQ(in_place[i], got[i]) << isa_name(isa) << " in place, i " << i;
        }
      }
    }
  }
}

TEST(Ops, RopeRotatesPairsByPositionTimesFrequency) {
  for (bool neox : {false, true}) {
    RopeParams p{.n_dims = 8, .neox = neox, .freq_base = 10000.0f};
    const int64_t pos = 5;
    std::vector<float> cache(8);
    rope_cache(p, pos, cache.data());
    std::vector<float> x = random_floats(10, 9), y = x;  // 2 values past n_dims stay untouched
    rope_apply(p, cache.data(), y.data());
    for (int i = 0; i < 4; ++i) {
      const double theta = pos * std::pow(10000.0, -2.0 * i / 8);
      const int a = neox ? i : 2 * i, b = neox ? i + 4 : 2 * i + 1;
      EXPECT_NEAR(y[a], x[a] * std::cos(theta) - x[b] * std::sin(theta), 1e-5) << neox << " pair " << i;
      EXPECT_NEAR(y[b], x[a] * std::sin(theta) + x[b] * std::cos(theta), 1e-5) << neox << " pair " << i;
    }
    EXPECT_EQ(y[8], x[8]);
    EXPECT_EQ(y[9], x[9]);
  }
}

TEST(Ops, YarnKeepsMagnitudeAndInterpolatesLowFrequencies) {
  // DeepSeek's YaRN: factor 40, original context 4096, 32 dims. High-frequency pairs rotate as without scaling,
  // the lowest-frequency pairs rotate 40 times slower; the attn_factor keeps |cos, sin| at 1.
  RopeParams p{.n_dims = 32,
               .freq_base = 10000.0f,
               .freq_scale = 1.0f / 40,
               .ext_factor = 1.0f,
               .attn_factor = 1.0f / (1.0f + 0.1f * std::log(40.0f)),
               .n_ctx_orig = 4096};
  std::vector<float> cache(32);
  const int64_t pos = 3;
  rope_cache(p, pos, cache.data());
  for (int i = 0; i < 16; ++i) EXPECT_NEAR(std::hypot(cache[2 * i], cache[2 * i + 1]), 1.0, 1e-6);
  EXPECT_NEAR(std::atan2(cache[1], cache[0]), 3.0, 1e-5);  // pair 0: theta = pos, unscaled
  const double lowest = pos * std::pow(10000.0, -30.0 / 32) / 40;
  EXPECT_NEAR(std::atan2(cache[31], cache[30]), lowest, 1e-7);
}

TEST(Attention, CausalGroupedHeadsMatchDirectFormula) {
  const AttentionShape shape{.n_head = 4, .n_head_kv = 2, .head_dim_k = 8, .head_dim_v = 6, .scale = 0.3f};
  const int64_t pos0 = 3, n = 4, total = pos0 + n;
  const std::vector<float> q = random_floats(n * 4 * 8, 1), k = random_floats(total * 2 * 8, 2),
                           v = random_floats(total * 2 * 6, 3);
  std::vector<float> out(n * 4 * 6);
  ThreadPool pool(2);
  causal_attention(shape, {q.data(), 32, 8, k.data(), 16, v.data(), 12}, n, pos0, out.data(), pool);
  for (int64_t t = 0; t < n; ++t)
    for (int h = 0; h < 4; ++h) {
      const int g = h / 2;
      std::vector<double> s;
      for (int64_t j = 0; j <= pos0 + t; ++j) {
        double d = 0;
        for (int i = 0; i < 8; ++i) d += double(q[t * 32 + h * 8 + i]) * k[j * 16 + g * 8 + i];
        s.push_back(d * 0.3);
      }
      const double mx = *std::max_element(s.begin(), s.end());
      double z = 0;
      for (double& e : s) z += (e = std::exp(e - mx));
      for (int d = 0; d < 6; ++d) {
        double o = 0;
        for (size_t j = 0; j < s.size(); ++j) o += s[j] / z * v[j * 12 + g * 6 + d];
        EXPECT_NEAR(out[t * 24 + h * 6 + d], o, 1e-5) << "t " << t << " h " << h << " d " << d;
      }
    }
}

// Signals handled while oneDNN multiplies (a chat's Ctrl-C during a long prompt's attention; a profiler's timer)
// leave the heap and the products intact: Debian's oneDNN points rsp at a heap buffer inside its f32 GEMM kernels,
// and a signal frame written there corrupted the heap. A timer fires every few microseconds through 40 products of
// attention's shape (probabilities times value rows, the value rows strided) while the heap is in use around them.
std::atomic<int> g_timer_signals{0};
TEST(OneDnn, MatmulsInterruptedBySignalsLeaveTheHeapIntact) {
  if (!onednn_available()) GTEST_SKIP() << "built without oneDNN";
  struct sigaction on_timer {
  }, before{};
  on_timer.sa_handler = [](int) { g_timer_signals.fetch_add(1, std::memory_order_relaxed); };
  sigemptyset(&on_timer.sa_mask);
  on_timer.sa_flags = SA_RESTART;
  ASSERT_EQ(sigaction(SIGALRM, &on_timer, &before), 0);
  itimerval every{{0, 37}, {0, 37}}, off{};
  ASSERT_EQ(setitimer(ITIMER_REAL, &every, nullptr), 0);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  constexpr int64_t kMaxKeys = 1200 + 64 * 8, rows = 256, dv = 256, stride = 3 * dv;
  // Drawn once: each run reads the first n_keys of them (as its own layout), and the test's time goes to the
  // interrupted matmuls rather than to drawing numbers (which took a minute in the unoptimized sanitizer build).
  std::vector<float> p(rows * kMaxKeys), v(kMaxKeys * stride), o(rows * dv);
  for (float& f : p) f = u(rng) * 1e-3f;
  for (float& f : v) f = u(rng);
  bool same = true;
  for (int it = 0; it < 40 && same; ++it) {
    const int64_t n_keys = 1200 + 64 * (it % 9);
    onednn_matmul_f32_kn(v.data(), dv, n_keys, stride, p.data(), n_keys, rows, o.data(), dv);
    std::vector<char> churn(size_t{1} << 16, static_cast<char>(it));  // allocations next to oneDNN's own
    for (int c = 0; c < 8; ++c) {
      const int64_t r = (it * 31 + c * 17) % rows, col = (it * 7 + c * 29) % dv;
      double want = 0, scale = 0;
      for (int64_t j = 0; j < n_keys; ++j) {
        want += static_cast<double>(p[r * n_keys + j]) * v[j * stride + col];
        scale += std::abs(static_cast<double>(p[r * n_keys + j]) * v[j * stride + col]);
      }
      same &= std::abs(o[r * dv + col] - want) <= 1e-4 * scale + 1e-7;
    }
  }
  setitimer(ITIMER_REAL, &off, nullptr);
  sigaction(SIGALRM, &before, nullptr);
  EXPECT_TRUE(same);
  EXPECT_GT(g_timer_signals.load(), 0);  // the timer did fire
}

// oneDNN's OpenMP runtime leaves the threads' CPU masks alone: a pinned thread that calls it first keeps its pin, and
// a thread that calls it later keeps its mask (LLVM's libomp, which a clang build links, bound every later caller to
// the first caller's mask: the main thread ended up on a pool worker's core).
TEST(OneDnn, CallsLeaveTheThreadsCpuMasksAlone) {
  if (!onednn_available()) GTEST_SKIP() << "built without oneDNN";
  cpu_set_t before;
  ASSERT_EQ(sched_getaffinity(0, sizeof before, &before), 0);
  if (CPU_COUNT(&before) < 2) GTEST_SKIP() << "one CPU to run on";
  int last = 0;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &before)) last = c;
  const std::vector<float> w(64 * 64, 0.5f), x(4 * 64, 1.0f);
  std::vector<float> y(4 * 64, 0.0f);
  bool pin_kept = false;
  std::thread first([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(last, &one);
    if (sched_setaffinity(0, sizeof one, &one) != 0) return;
    onednn_matmul_f32(w.data(), 64, 64, 64, x.data(), 4, y.data(), 64);
    cpu_set_t after;
    pin_kept = sched_getaffinity(0, sizeof after, &after) == 0 && CPU_EQUAL(&after, &one);
  });
  first.join();
  EXPECT_TRUE(pin_kept);
  onednn_matmul_f32(w.data(), 64, 64, 64, x.data(), 4, y.data(), 64);
  cpu_set_t after;
  ASSERT_EQ(sched_getaffinity(0, sizeof after, &after), 0);
  EXPECT_TRUE(CPU_EQUAL(&after, &before)) << CPU_COUNT(&after) << " CPUs left of " << CPU_COUNT(&before);
  EXPECT_EQ(y[0], 32.0f);
}

}  // namespace
}  // namespace hetmoe::cpu
