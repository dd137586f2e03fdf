// The scalar reference formats (quant/ref.h) against llama.cpp's own output (tests/data/blocks, reference README
// section 6), plus properties on data of our own: round-trip error, block independence, dot products, errors.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "quant/blocks.h"
#include "quant/ggml_type.h"
#include "quant/half.h"
#include "quant/iq.h"
#include "quant/ref.h"

namespace hetmoe::quant {
namespace {

using nlohmann::json;

const char* const kBlockTypes[] = {"F16",   "BF16",  "Q4_0",  "Q4_1",    "Q5_0",   "Q5_1",   "Q8_0",    "Q2_K",
                                   "Q3_K",  "Q4_K",  "Q5_K",  "Q6_K",    "IQ4_NL", "IQ4_XS", "MXFP4",   "TQ1_0",
                                   "TQ2_0", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S",  "IQ3_XXS", "IQ3_S"};

// The IQ grid formats' quantizers are hetmoe's own search (quant/ref_iq_quantize.cpp): their bytes are not ggml's,
// their error is held to ggml's instead.
bool quantizer_is_ggmls(GgmlType type) { return !is_iq_grid_type(type); }

// One blocks/<TYPE>.json with its .bin: what llama.cpp wrote and computed for an 8 x 512 matrix.
struct BlockVectors {
  GgmlType type;
  int rows;
  int cols;
  size_t row_size;
  json meta;                              // the scalar fields, for the table checks
  std::vector<float> source;              // [rows][cols]
  std::vector<float> dequantized;         // [rows][cols]
  std::vector<uint8_t> bin;               // [rows][row_size]
  std::vector<float> activation;          // [cols]
  std::vector<uint8_t> activation_bytes;  // cols elements of the vec_dot type
  std::vector<double> dot;                // [rows]
  std::vector<double> dot_abs_sum;        // [rows]
  std::vector<double> dequant_rmse;       // [rows], of dequantized - source
  std::vector<float> q8_1_block_s;        // Q4_1 / Q5_1 only
};

std::string data_path(const std::string& name) { return std::string(HETMOE_TEST_DATA_DIR) + "/blocks/" + name; }

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<uint8_t> from_hex(const std::string& hex) {
  std::vector<uint8_t> bytes(hex.size() / 2);
  for (size_t i = 0; i < bytes.size(); ++i)
    bytes[i] = static_cast<uint8_t>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  return bytes;
}

// The JSON writes float32 values with %.9g, which parses back to the same float through double.
void append_floats(const json& values, std::vector<float>& out) {
  for (const json& v : values) {
    if (v.is_array()) {
      append_floats(v, out);
    } else {
      out.push_back(static_cast<float>(v.get<double>()));
    }
  }
}

const BlockVectors& vectors(const std::string& type_name) {
  static std::map<std::string, BlockVectors> cache;
  auto it = cache.find(type_name);
  if (it != cache.end()) return it->second;
  const std::vector<uint8_t> text = read_file(data_path(type_name + ".json"));
  const json j = json::parse(text.begin(), text.end());
  BlockVectors v;
  v.type = type_from_name(type_name).value();
  v.rows = j.at("rows").get<int>();
  v.cols = j.at("cols").get<int>();
  v.row_size = j.at("row_size").get<size_t>();
  for (const char* key :
       {"type", "ggml_type_name", "ggml_type_id", "block_size", "type_size", "row_size", "bin_size", "vec_dot_type"})
    v.meta[key] = j.at(key);
  append_floats(j.at("source_floats"), v.source);
  append_floats(j.at("dequantized"), v.dequantized);
  append_floats(j.at("activation"), v.activation);
  v.bin = read_file(data_path(j.at("bin_file").get<std::string>()));
  v.activation_bytes = from_hex(j.at("activation_quantized_hex").get<std::string>());
  v.dot = j.at("dot").get<std::vector<double>>();
  v.dot_abs_sum = j.at("dot_abs_sum_f64").get<std::vector<double>>();
  v.dequant_rmse = j.at("dequant_rmse").get<std::vector<double>>();
  if (j.contains("activation_q8_1_block_s")) append_floats(j.at("activation_q8_1_block_s"), v.q8_1_block_s);
  return cache.emplace(type_name, std::move(v)).first->second;
}

// ------------------------------------------------------------------------------------------------ llama.cpp data

class BlockVectorTest : public ::testing::TestWithParam<const char*> {
 protected:
  const BlockVectors& v() { return vectors(GetParam()); }
};

TEST_P(BlockVectorTest, FilesHaveTheExpectedShape) {
  const BlockVectors& d = v();
  ASSERT_EQ(d.source.size(), static_cast<size_t>(d.rows * d.cols));
  ASSERT_EQ(d.dequantized.size(), d.source.size());
  ASSERT_EQ(d.bin.size(), d.rows * d.row_size);
  ASSERT_EQ(d.activation.size(), static_cast<size_t>(d.cols));
  ASSERT_EQ(d.dot.size(), static_cast<size_t>(d.rows));
}

TEST_P(BlockVectorTest, DequantizeMatchesGgmlBitForBit) {
  const BlockVectors& d = v();
  std::vector<float> out(d.cols);
  for (int r = 0; r < d.rows; ++r) {
    dequantize_row(d.type, d.bin.data() + r * d.row_size, out.data(), d.cols);
    for (int i = 0; i < d.cols; ++i) {
      // == rather than a bit comparison: JSON may write -0 as an integer, which loses the sign of zero.
      ASSERT_EQ(out[i], d.dequantized[r * d.cols + i]) << "row " << r << " element " << i;
    }
  }
}

TEST_P(BlockVectorTest, QuantizeWritesGgmlBytes) {
  const BlockVectors& d = v();
  if (!quantizer_is_ggmls(d.type)) return;  // QuantizeErrorIsAtMostGgmls
  std::vector<uint8_t> out(d.row_size);
  const int64_t block = type_info(d.type).block_size;
  const size_t type_size = type_info(d.type).type_size;
  for (int r = 0; r < d.rows; ++r) {
    quantize_row(d.type, d.source.data() + r * d.cols, out.data(), d.cols);
    const uint8_t* expected = d.bin.data() + r * d.row_size;
    const auto diff = std::mismatch(out.begin(), out.end(), expected);
    if (diff.first != out.end()) {
      const size_t at = static_cast<size_t>(diff.first - out.begin());
      FAIL() << "row " << r << ": first difference at byte " << at << " (block " << at / type_size << " of "
             << d.cols / block << ", byte " << at % type_size << "): got " << int{*diff.first} << ", ggml wrote "
             << int{*diff.second};
    }
  }
}

// ggml quantized the IQ1_S, IQ2_XXS and IQ2_XS rows with uniform importance, the others without: both minimise the
// plain squared error that dequant_rmse measures, which hetmoe's quantizers minimise too.
TEST_P(BlockVectorTest, QuantizeErrorIsAtMostGgmls) {
  const BlockVectors& d = v();
  if (quantizer_is_ggmls(d.type)) return;  // QuantizeWritesGgmlBytes holds the bytes themselves
  std::vector<uint8_t> q(d.row_size);
  std::vector<float> y(d.cols);
  for (int r = 0; r < d.rows; ++r) {
    const float* x = d.source.data() + r * d.cols;
    quantize_row(d.type, x, q.data(), d.cols);
    dequantize_row(d.type, q.data(), y.data(), d.cols);
    double err2 = 0;
    for (int i = 0; i < d.cols; ++i) err2 += (static_cast<double>(y[i]) - x[i]) * (static_cast<double>(y[i]) - x[i]);
    const double rmse = std::sqrt(err2 / d.cols);
    EXPECT_LE(rmse, d.dequant_rmse[r]) << "row " << r << " (ggml " << d.dequant_rmse[r] << ")";
  }
}

TEST_P(BlockVectorTest, ActivationBytesMatchGgmlX86) {
  const BlockVectors& d = v();
  const GgmlType act = type_info(d.type).vec_dot_type;
  ASSERT_EQ(activation_row_bytes(d.type, d.cols), d.activation_bytes.size());
  std::vector<uint8_t> out(d.activation_bytes.size());
  quantize_activation(act, d.activation.data(), out.data(), d.cols);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(int{out[i]}, int{d.activation_bytes[i]}) << "byte " << i;
  if (act == GgmlType::Q8_1) {
    ASSERT_EQ(d.q8_1_block_s.size(), static_cast<size_t>(d.cols / kQK8_1));
    for (int b = 0; b < d.cols / kQK8_1; ++b)
      EXPECT_EQ(fp16_to_fp32(load_block<BlockQ8_1>(out.data(), b).s), d.q8_1_block_s[b]) << "block " << b;
  }
}

// Tolerance from the reference README 8.2: ggml's own kernels spread by 8.3e-8 of sum |w_i a_i|.
TEST_P(BlockVectorTest, VecDotMatchesGgml) {
  const BlockVectors& d = v();
  for (int r = 0; r < d.rows; ++r) {
    const float got = vec_dot(d.type, d.cols, d.bin.data() + r * d.row_size, d.activation_bytes.data());
    EXPECT_NEAR(got, d.dot[r], 1e-6 * d.dot_abs_sum[r]) << "row " << r;
  }
}

TEST_P(BlockVectorTest, MetadataAgreesWithTypeInfo) {
  const BlockVectors& d = v();
  const TypeInfo& info = type_info(d.type);
  EXPECT_EQ(d.meta["ggml_type_id"].get<uint32_t>(), static_cast<uint32_t>(d.type));
  EXPECT_EQ(type_from_name(d.meta["ggml_type_name"].get<std::string>()), d.type);
  EXPECT_EQ(d.meta["block_size"].get<int64_t>(), info.block_size);
  EXPECT_EQ(d.meta["type_size"].get<size_t>(), info.type_size);
  EXPECT_EQ(d.meta["row_size"].get<size_t>(), row_bytes(d.type, d.cols));
  EXPECT_EQ(d.meta["bin_size"].get<size_t>(), d.rows * row_bytes(d.type, d.cols));
  EXPECT_EQ(type_from_name(d.meta["vec_dot_type"].get<std::string>()), info.vec_dot_type);
}

INSTANTIATE_TEST_SUITE_P(Ggml, BlockVectorTest, ::testing::ValuesIn(kBlockTypes),
                         [](const ::testing::TestParamInfo<const char*>& p) { return std::string(p.param); });

// ------------------------------------------------------------------------------------------------ type table

// Reference README 6.1, plus the three formats it does not tabulate (F32, and the activation-only Q8_1 and
// Q8_K, whose sizes README 6.2 gives as 16 x 36 and 2 x 292 bytes per 512).
struct TableRow {
  const char* name;
  uint32_t id;
  int64_t block_size;
  size_t type_size;
  size_t row_size_512;
  const char* vec_dot;
};

// clang-format off
constexpr TableRow kTable[] = {
    {"F32",     0,   1,   4, 2048, "F32"},
    {"F16",     1,   1,   2, 1024, "F16"},
    {"BF16",   30,   1,   2, 1024, "BF16"},
    {"Q4_0",    2,  32,  18,  288, "Q8_0"},
    {"Q4_1",    3,  32,  20,  320, "Q8_1"},
    {"Q5_0",    6,  32,  22,  352, "Q8_0"},
    {"Q5_1",    7,  32,  24,  384, "Q8_1"},
    {"Q8_0",    8,  32,  34,  544, "Q8_0"},
    {"Q8_1",    9,  32,  36,  576, "Q8_1"},
    {"Q2_K",   10, 256,  84,  168, "Q8_K"},
    {"Q3_K",   11, 256, 110,  220, "Q8_K"},
    {"Q4_K",   12, 256, 144,  288, "Q8_K"},
    {"Q5_K",   13, 256, 176,  352, "Q8_K"},
    {"Q6_K",   14, 256, 210,  420, "Q8_K"},
    {"Q8_K",   15, 256, 292,  584, "Q8_K"},
    {"IQ4_NL", 20,  32,  18,  288, "Q8_0"},
    {"IQ4_XS", 23, 256, 136,  272, "Q8_K"},
    {"IQ1_S",  19, 256,  50,  100, "Q8_K"},
    {"IQ1_M",  29, 256,  56,  112, "Q8_K"},
    {"IQ2_XXS",16, 256,  66,  132, "Q8_K"},
    {"IQ2_XS", 17, 256,  74,  148, "Q8_K"},
    {"IQ2_S",  22, 256,  82,  164, "Q8_K"},
    {"IQ3_XXS",18, 256,  98,  196, "Q8_K"},
    {"IQ3_S",  21, 256, 110,  220, "Q8_K"},
    {"MXFP4",  39,  32,  17,  272, "Q8_0"},
    {"TQ1_0",  34, 256,  54,  108, "Q8_K"},
    {"TQ2_0",  35, 256,  66,  132, "Q8_K"},
};
// clang-format on

TEST(TypeTable, AgreesWithTheReadme) {
  for (const TableRow& row : kTable) {
    SCOPED_TRACE(row.name);
    const TypeInfo* info = type_info(row.id);
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(info->name, row.name);
    EXPECT_EQ(info->block_size, row.block_size);
    EXPECT_EQ(info->type_size, row.type_size);
    EXPECT_EQ(type_info(info->vec_dot_type).name, row.vec_dot);
    EXPECT_EQ(row_bytes(info->type, 512), row.row_size_512);
    EXPECT_EQ(row_bytes(info->type, 0), 0u);
    if (row.block_size > 1) {
      EXPECT_EQ(row_bytes(info->type, 512 + row.block_size / 2), 0u) << "a partial block has no size";
    }
    EXPECT_EQ(activation_row_bytes(info->type, 512), row_bytes(info->vec_dot_type, 512));
  }
}

TEST(TypeTable, BlockStructsHaveTheTypeSize) {
  EXPECT_EQ(sizeof(BlockQ4_0), type_info(GgmlType::Q4_0).type_size);
  EXPECT_EQ(sizeof(BlockQ4_1), type_info(GgmlType::Q4_1).type_size);
  EXPECT_EQ(sizeof(BlockQ5_0), type_info(GgmlType::Q5_0).type_size);
  EXPECT_EQ(sizeof(BlockQ5_1), type_info(GgmlType::Q5_1).type_size);
  EXPECT_EQ(sizeof(BlockQ8_0), type_info(GgmlType::Q8_0).type_size);
  EXPECT_EQ(sizeof(BlockQ8_1), type_info(GgmlType::Q8_1).type_size);
  EXPECT_EQ(sizeof(BlockQ2_K), type_info(GgmlType::Q2_K).type_size);
  EXPECT_EQ(sizeof(BlockQ3_K), type_info(GgmlType::Q3_K).type_size);
  EXPECT_EQ(sizeof(BlockQ4_K), type_info(GgmlType::Q4_K).type_size);
  EXPECT_EQ(sizeof(BlockQ5_K), type_info(GgmlType::Q5_K).type_size);
  EXPECT_EQ(sizeof(BlockQ6_K), type_info(GgmlType::Q6_K).type_size);
  EXPECT_EQ(sizeof(BlockQ8_K), type_info(GgmlType::Q8_K).type_size);
  EXPECT_EQ(sizeof(BlockIQ4_NL), type_info(GgmlType::IQ4_NL).type_size);
  EXPECT_EQ(sizeof(BlockIQ4_XS), type_info(GgmlType::IQ4_XS).type_size);
  EXPECT_EQ(sizeof(BlockMXFP4), type_info(GgmlType::MXFP4).type_size);
  EXPECT_EQ(sizeof(BlockIQ1_S), type_info(GgmlType::IQ1_S).type_size);
  EXPECT_EQ(sizeof(BlockIQ1_M), type_info(GgmlType::IQ1_M).type_size);
  EXPECT_EQ(sizeof(BlockIQ2_XXS), type_info(GgmlType::IQ2_XXS).type_size);
  EXPECT_EQ(sizeof(BlockIQ2_XS), type_info(GgmlType::IQ2_XS).type_size);
  EXPECT_EQ(sizeof(BlockIQ2_S), type_info(GgmlType::IQ2_S).type_size);
  EXPECT_EQ(sizeof(BlockIQ3_XXS), type_info(GgmlType::IQ3_XXS).type_size);
  EXPECT_EQ(sizeof(BlockIQ3_S), type_info(GgmlType::IQ3_S).type_size);
  EXPECT_EQ(sizeof(BlockTQ1_0), type_info(GgmlType::TQ1_0).type_size);
  EXPECT_EQ(sizeof(BlockTQ2_0), type_info(GgmlType::TQ2_0).type_size);
  EXPECT_EQ(kQK4_0, type_info(GgmlType::Q4_0).block_size);
  EXPECT_EQ(kQK_K, type_info(GgmlType::Q4_K).block_size);
}

// ------------------------------------------------------------------------------------------------ own data

const GgmlType kWeightTypes[] = {
    GgmlType::F32,     GgmlType::F16,    GgmlType::BF16,   GgmlType::Q4_0,    GgmlType::Q4_1,  GgmlType::Q5_0,
    GgmlType::Q5_1,    GgmlType::Q8_0,   GgmlType::Q2_K,   GgmlType::Q3_K,    GgmlType::Q4_K,  GgmlType::Q5_K,
    GgmlType::Q6_K,    GgmlType::IQ4_NL, GgmlType::IQ4_XS, GgmlType::MXFP4,   GgmlType::IQ1_S, GgmlType::IQ1_M,
    GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ2_S,  GgmlType::IQ3_XXS, GgmlType::IQ3_S};

// Awkward lengths: 7 blocks (97 elements for the one-element "blocks" of the float formats).
int64_t awkward_length(GgmlType type) {
  const int64_t block = type_info(type).block_size;
  return block == 1 ? 97 : 7 * block;
}

// N(0,1) plus `offset`, with one all-zero block (the third) to exercise the zero paths.
std::vector<float> test_row(GgmlType type, int64_t n, float offset, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng) + offset;
  const int64_t block = std::max<int64_t>(type_info(type).block_size, 1);
  if (n >= 3 * block) std::fill(x.begin() + 2 * block, x.begin() + 3 * block, 0.0f);
  return x;
}

// RMS error of quantize -> dequantize, relative to the RMS of the data, that each format must stay under on
// N(0,1) data: 1.5 x what llama.cpp's own quantizer gives on an N(0,1) row (row 0 of blocks/<TYPE>.json).
double rms_bound(GgmlType type) {
  if (type == GgmlType::F32) return 0.0;
  const BlockVectors& v = vectors(std::string(type_info(type).name));
  double x2 = 0;
  for (int i = 0; i < v.cols; ++i) x2 += static_cast<double>(v.source[i]) * v.source[i];
  return 1.5 * v.dequant_rmse.at(0) / std::sqrt(x2 / v.cols);
}

// Worst-case error per element for the formats whose code is a plain rounding of x / d: half a step, plus the
// rounding of d (and m) to half precision, plus a clamp of one step for the symmetric formats whose most
// negative code has no positive twin. Returns a negative value for the other formats.
double element_bound(GgmlType type, const float* x, int n) {
  double amax = 0;
  double min = x[0];
  double max = x[0];
  for (int i = 0; i < n; ++i) {
    amax = std::max(amax, std::fabs(static_cast<double>(x[i])));
    min = std::min(min, static_cast<double>(x[i]));
    max = std::max(max, static_cast<double>(x[i]));
  }
  const double half_ulp = 0x1p-11;  // relative rounding error of a half
  auto symmetric = [&](int levels) { return amax / levels * (1 + levels * half_ulp) + 1e-6 * amax; };
  auto with_min = [&](int top) {
    const double d = (max - min) / top;
    return d * (0.5 + top * half_ulp) + std::fabs(min) * half_ulp + 1e-6 * (amax + d);
  };
  switch (type) {
    case GgmlType::F32:
      return 0.0;
    case GgmlType::F16:
      return amax * half_ulp + 0x1p-25;  // absolute below 2^-14: the subnormal halves
    case GgmlType::BF16:
      return amax * 0x1p-8;
    case GgmlType::Q4_0:
      return symmetric(8);
    case GgmlType::Q5_0:
      return symmetric(16);
    case GgmlType::Q8_0:
      return amax / 127 * (0.5 + 127 * half_ulp) + 1e-6 * amax;
    case GgmlType::Q4_1:
      return with_min(15);
    case GgmlType::Q5_1:
      return with_min(31);
    default:
      return -1.0;
  }
}

class RoundTripTest : public ::testing::TestWithParam<GgmlType> {};

TEST_P(RoundTripTest, ErrorStaysWithinTheFormatsBounds) {
  const GgmlType type = GetParam();
  const int64_t n = awkward_length(type);
  const int64_t block = type_info(type).block_size;
  for (float offset : {0.0f, 0.75f}) {
    SCOPED_TRACE("offset " + std::to_string(offset));
    const std::vector<float> x = test_row(type, n, offset, 7);
    std::vector<uint8_t> q(row_bytes(type, n));
    std::vector<float> y(n);
    quantize_row(type, x.data(), q.data(), n);
    dequantize_row(type, q.data(), y.data(), n);
    double err2 = 0;
    double x2 = 0;
    for (int64_t i = 0; i < n; ++i) {
      err2 += (static_cast<double>(y[i]) - x[i]) * (static_cast<double>(y[i]) - x[i]);
      x2 += static_cast<double>(x[i]) * x[i];
    }
    EXPECT_LE(std::sqrt(err2 / x2), rms_bound(type));
    // Per block (or per element for the float formats, whose "block" is one value).
    for (int64_t b = 0; b < n / block; ++b) {
      const float* xb = x.data() + b * block;
      const float* yb = y.data() + b * block;
      const bool all_zero = std::all_of(xb, xb + block, [](float v) { return v == 0.0f; });
      const double bound = element_bound(type, xb, static_cast<int>(block));
      for (int64_t i = 0; i < block; ++i) {
        if (all_zero) {
          ASSERT_EQ(yb[i], 0.0f) << "an all-zero block must come back as zeros, block " << b;
        }
        if (bound >= 0) {
          ASSERT_LE(std::fabs(static_cast<double>(yb[i]) - xb[i]), bound) << "element " << b * block + i;
        }
      }
    }
  }
}

// Blocks are independent: quantizing a row in one call or block by block gives the same bytes.
TEST_P(RoundTripTest, BlocksQuantizeIndependently) {
  const GgmlType type = GetParam();
  const int64_t n = awkward_length(type);
  const int64_t block = type_info(type).block_size;
  const size_t block_bytes = type_info(type).type_size;
  const std::vector<float> x = test_row(type, n, 0.25f, 11);
  std::vector<uint8_t> whole(row_bytes(type, n));
  std::vector<uint8_t> pieces(whole.size());
  quantize_row(type, x.data(), whole.data(), n);
  for (int64_t b = 0; b < n / block; ++b)
    quantize_row(type, x.data() + b * block, pieces.data() + b * block_bytes, block);
  EXPECT_EQ(whole, pieces);
}

// vec_dot is the dot product of what dequantize_row gives for the two sides. Q4_1 and Q5_1 fold the weight min
// in through the activation's stored s = half(d * sum q), so for them the exact value uses s (README 7.2).
TEST_P(RoundTripTest, VecDotIsTheDotOfTheDequantizedRows) {
  const GgmlType type = GetParam();
  const GgmlType act_type = type_info(type).vec_dot_type;
  const int64_t n = awkward_length(type);
  const std::vector<float> w = test_row(type, n, 0.5f, 3);
  const std::vector<float> a = test_row(act_type, n, 0.0f, 5);
  std::vector<uint8_t> wq(row_bytes(type, n));
  std::vector<uint8_t> aq(activation_row_bytes(type, n));
  quantize_row(type, w.data(), wq.data(), n);
  quantize_activation(act_type, a.data(), aq.data(), n);
  std::vector<float> wd(n);
  std::vector<float> ad(n);
  dequantize_row(type, wq.data(), wd.data(), n);
  dequantize_row(act_type, aq.data(), ad.data(), n);
  double exact = 0;
  double abs_sum = 0;
  if (act_type == GgmlType::Q8_1) {
    for (int64_t b = 0; b < n / kQK8_1; ++b) {
      // Weight value = d q + m: the q part pairs with the activation values, the m part with s.
      const float m = fp16_to_fp32(type == GgmlType::Q4_1 ? load_block<BlockQ4_1>(wq.data(), b).m
                                                          : load_block<BlockQ5_1>(wq.data(), b).m);
      for (int64_t i = b * kQK8_1; i < (b + 1) * kQK8_1; ++i) {
        exact += (static_cast<double>(wd[i]) - m) * ad[i];
        abs_sum += std::fabs(static_cast<double>(wd[i]) * ad[i]);
      }
      exact += static_cast<double>(m) * fp16_to_fp32(load_block<BlockQ8_1>(aq.data(), b).s);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      exact += static_cast<double>(wd[i]) * ad[i];
      abs_sum += std::fabs(static_cast<double>(wd[i]) * ad[i]);
    }
  }
  // The same tolerance as against ggml: float accumulation over a handful of blocks stays far inside it.
  EXPECT_NEAR(vec_dot(type, n, wq.data(), aq.data()), exact, 1e-6 * abs_sum);
  EXPECT_GT(abs_sum, 0.0);
}

INSTANTIATE_TEST_SUITE_P(AllWeightTypes, RoundTripTest, ::testing::ValuesIn(kWeightTypes),
                         [](const ::testing::TestParamInfo<GgmlType>& p) {
                           return std::string(type_info(p.param).name);
                         });

// ------------------------------------------------------------------------------------------------ errors

template <typename F>
std::string invalid_argument_message(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(RefErrors, ActivationOnlyFormatsHaveNoWeightOperations) {
  std::vector<float> x(256, 1.0f);
  std::vector<uint8_t> buf(1024);
  const std::string q8k = invalid_argument_message([&] { quantize_row(GgmlType::Q8_K, x.data(), buf.data(), 256); });
  EXPECT_NE(q8k.find("Q8_K"), std::string::npos) << q8k;
  EXPECT_NE(invalid_argument_message([&] { quantize_row(GgmlType::Q8_1, x.data(), buf.data(), 32); }), "");
  EXPECT_NE(invalid_argument_message([&] { vec_dot(GgmlType::Q8_K, 256, buf.data(), buf.data()); }), "");
}

TEST(RefErrors, WeightFormatsAreNotActivationFormats) {
  std::vector<float> x(256, 1.0f);
  std::vector<uint8_t> buf(1024);
  const std::string msg =
      invalid_argument_message([&] { quantize_activation(GgmlType::Q4_K, x.data(), buf.data(), 256); });
  EXPECT_NE(msg.find("Q4_K"), std::string::npos) << msg;
}

TEST(RefErrors, UnknownTypesAndPartialBlocksAreRejected) {
  std::vector<float> x(256, 1.0f);
  std::vector<uint8_t> buf(1024);
  const auto unknown = static_cast<GgmlType>(99);
  const std::string msg = invalid_argument_message([&] { dequantize_row(unknown, buf.data(), x.data(), 32); });
  EXPECT_NE(msg.find("99"), std::string::npos) << msg;
  EXPECT_NE(invalid_argument_message([&] { quantize_row(unknown, x.data(), buf.data(), 32); }), "");
  EXPECT_NE(invalid_argument_message([&] { vec_dot(unknown, 32, buf.data(), buf.data()); }), "");
  EXPECT_NE(invalid_argument_message([&] { activation_row_bytes(unknown, 32); }), "");
  EXPECT_NE(invalid_argument_message([&] { dequantize_row(GgmlType::Q4_0, buf.data(), x.data(), 33); }), "");
  EXPECT_NE(invalid_argument_message([&] { quantize_row(GgmlType::Q4_K, x.data(), buf.data(), 128); }), "");
  EXPECT_NE(invalid_argument_message([&] { quantize_row(GgmlType::F16, x.data(), buf.data(), -1); }), "");
}

}  // namespace
}  // namespace hetmoe::quant
