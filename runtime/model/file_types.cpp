#include "runtime/model/file_types.h"

#include <array>
#include <cctype>
#include <cstdio>
#include <string>

#include "quant/iq.h"
#include "runtime/error.h"

namespace hetmoe {
namespace {

using quant::GgmlType;

constexpr std::array kFileTypes = {
    FileType{"F32", LlamaFtype::kAllF32, GgmlType::F32},
    FileType{"F16", LlamaFtype::kMostlyF16, GgmlType::F16},
    FileType{"BF16", LlamaFtype::kMostlyBF16, GgmlType::BF16},
    FileType{"Q8_0", LlamaFtype::kMostlyQ8_0, GgmlType::Q8_0},
    FileType{"Q4_0", LlamaFtype::kMostlyQ4_0, GgmlType::Q4_0},
    FileType{"Q4_1", LlamaFtype::kMostlyQ4_1, GgmlType::Q4_1},
    FileType{"Q5_0", LlamaFtype::kMostlyQ5_0, GgmlType::Q5_0},
    FileType{"Q5_1", LlamaFtype::kMostlyQ5_1, GgmlType::Q5_1},
    FileType{"Q2_K", LlamaFtype::kMostlyQ2_K, GgmlType::Q2_K},
    FileType{"Q3_K_M", LlamaFtype::kMostlyQ3_K_M, GgmlType::Q3_K},
    FileType{"Q4_K_M", LlamaFtype::kMostlyQ4_K_M, GgmlType::Q4_K},
    FileType{"Q5_K_M", LlamaFtype::kMostlyQ5_K_M, GgmlType::Q5_K},
    FileType{"Q6_K", LlamaFtype::kMostlyQ6_K, GgmlType::Q6_K},
    FileType{"IQ1_S", LlamaFtype::kMostlyIQ1_S, GgmlType::IQ1_S},
    FileType{"IQ1_M", LlamaFtype::kMostlyIQ1_M, GgmlType::IQ1_M},
    FileType{"IQ2_XXS", LlamaFtype::kMostlyIQ2_XXS, GgmlType::IQ2_XXS},
    FileType{"IQ2_XS", LlamaFtype::kMostlyIQ2_XS, GgmlType::IQ2_XS},
    FileType{"IQ2_S", LlamaFtype::kMostlyIQ2_S, GgmlType::IQ2_XS},  // llama.cpp's IQ2_S mix is mostly IQ2_XS
    FileType{"IQ2_M", LlamaFtype::kMostlyIQ2_M, GgmlType::IQ2_S},
    FileType{"IQ3_XXS", LlamaFtype::kMostlyIQ3_XXS, GgmlType::IQ3_XXS},
    FileType{"IQ3_S", LlamaFtype::kMostlyIQ3_S, GgmlType::IQ3_S},
    // general.file_type of unsloth's files of this kind says IQ2_XXS; the ftype lookup finds the plain mix first.
    FileType{"UD-IQ2_XXS", LlamaFtype::kMostlyIQ2_XXS, GgmlType::IQ2_XXS, true},
    FileType{"IQ4_NL", LlamaFtype::kMostlyIQ4_NL, GgmlType::IQ4_NL},
    FileType{"IQ4_XS", LlamaFtype::kMostlyIQ4_XS, GgmlType::IQ4_XS},
    FileType{"TQ1_0", LlamaFtype::kMostlyTQ1_0, GgmlType::TQ1_0},
    FileType{"TQ2_0", LlamaFtype::kMostlyTQ2_0, GgmlType::TQ2_0},
    FileType{"MXFP4_MOE", LlamaFtype::kMostlyMXFP4Moe, GgmlType::MXFP4},
};

bool iequal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::toupper(static_cast<unsigned char>(a[i])) != std::toupper(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }
bool ends_with(std::string_view s, std::string_view tail) {
  return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}

bool is_quantized(GgmlType t) {
  return t != GgmlType::F32 && t != GgmlType::F16 && t != GgmlType::BF16 && t != GgmlType::I32;
}

// llama.cpp's tensor_allows_quantization, reduced to the names a deepseek2 model has.
bool allows_quantization(const TensorTypeQuery& q) {
  if (q.ne.size() < 2) return false;
  if (!ends_with(q.name, "weight")) return false;
  if (contains(q.name, "_norm.weight")) return false;
  if (contains(q.name, "ffn_gate_inp.weight")) return false;
  if (contains(q.name, "ssm_conv1d.weight")) return false;  // llama.cpp keeps the short convolution in F32
  return true;
}

// What llama.cpp's DeepSeek-V4 converter keeps in F32 in a float file (F16, BF16): the hyper-connection mixes, the
// compressors' positional biases and the indexer's head weights (llama-quantize quantizes them all the same).
bool converter_keeps_f32(std::string_view name) {
  return contains(name, "hc_") || contains(name, "_ape.weight") || contains(name, "indexer.proj.weight");
}

// The categories of llama.cpp's tensor_get_category that deepseek2 tensors fall into. The split-MLA tensors
// (attn_q_a, attn_q_b, attn_kv_a_mqa, attn_k_b, attn_v_b) match none of the attention patterns ("attn_k_b.weight"
// does not contain "attn_k.weight"), so they keep the default type; deepseek2 files have no attn_v/attn_qkv/attn_kv_b
// in the split layout, which leaves llama.cpp's attn_v rules unused here.
enum class Category { kOutput, kTokenEmbd, kAttnQ, kAttnK, kAttnV, kAttnOutput, kFfnDown, kOther };

Category category_of(std::string_view name) {
  if (name == "output.weight") return Category::kOutput;
  if (name == "token_embd.weight") return Category::kTokenEmbd;
  if (contains(name, "attn_v.weight") || contains(name, "attn_qkv.weight") || contains(name, "attn_kv_b.weight"))
    return Category::kAttnV;
  if (contains(name, "attn_k.weight")) return Category::kAttnK;
  if (contains(name, "attn_q.weight")) return Category::kAttnQ;  // V2-Lite's unsplit query (no q_lora)
  if (contains(name, "attn_output.weight")) return Category::kAttnOutput;
  // ffn_up / ffn_gate are tested before ffn_down in llama.cpp; neither has a rule for these mixes.
  if (contains(name, "ffn_up") || contains(name, "ffn_gate")) return Category::kOther;
  if (contains(name, "ffn_down")) return Category::kFfnDown;
  return Category::kOther;
}

// llama.cpp's use_more_bits: the first and last eighth of the layers, and every third layer in between.
bool use_more_bits(int i_layer, int n_layer) {
  return i_layer < n_layer / 8 || i_layer >= 7 * n_layer / 8 || (i_layer - n_layer / 8) % 3 == 2;
}

// The mixes llama.cpp treats as "2 bits or less": their own rules for the output, embeddings, ffn_down and attn_output.
bool is_low_bit_iq(LlamaFtype f) {
  return f == LlamaFtype::kMostlyIQ2_XXS || f == LlamaFtype::kMostlyIQ2_XS || f == LlamaFtype::kMostlyIQ1_S ||
         f == LlamaFtype::kMostlyIQ2_S || f == LlamaFtype::kMostlyIQ2_M || f == LlamaFtype::kMostlyIQ1_M;
}
bool is_iq2_s_or_m(LlamaFtype f) { return f == LlamaFtype::kMostlyIQ2_S || f == LlamaFtype::kMostlyIQ2_M; }

// hetmoe's unsloth-like dynamic mix: the routed experts carry the bits (gate and up in the file type's own format,
// down in the next larger IQ2 one), everything read for every token (attention, shared experts, dense blocks,
// embeddings) stays in K-quants, the output head in Q6_K.
GgmlType dynamic_rule(const FileType& ft, const TensorTypeQuery& q) {
  const bool routed = q.ne.size() > 2 && q.ne[2] > 1 && contains(q.name, "_exps");
  if (routed) return contains(q.name, "ffn_down") ? GgmlType::IQ2_S : ft.default_type;
  if (category_of(q.name) == Category::kOutput) return GgmlType::Q6_K;
  return contains(q.name, "ffn_down") ? GgmlType::Q5_K : GgmlType::Q4_K;
}

GgmlType mix_rule(const FileType& ft, const TensorTypeQuery& q, GgmlType t) {
  const LlamaFtype f = ft.ftype;
  if (ft.dynamic) return dynamic_rule(ft, q);
  // gpt-oss's mix: the experts (3-D tensors) in MXFP4, every other weight, the output head included, in Q8_0.
  if (f == LlamaFtype::kMostlyMXFP4Moe) return q.ne.size() > 2 && q.ne[2] > 1 ? GgmlType::MXFP4 : GgmlType::Q8_0;
  const Category category = category_of(q.name);
  switch (category) {
    case Category::kOutput: {
      // Not tied to token_embd (deepseek2 has output.weight): output gets Q6_K unless the file is Q8_0 (or one of
      // the low-bit IQ mixes: Q5_K), or Q8_0 when its rows do not fit the default type's blocks.
      if (q.ne[0] % quant::type_info(t).block_size != 0) return GgmlType::Q8_0;
      if (is_low_bit_iq(f) || f == LlamaFtype::kMostlyIQ3_XXS) return GgmlType::Q5_K;
      if (t != GgmlType::Q8_0) return GgmlType::Q6_K;
      return t;
    }
    case Category::kTokenEmbd:
      if (f == LlamaFtype::kMostlyTQ1_0 || f == LlamaFtype::kMostlyTQ2_0) return GgmlType::Q4_K;
      if (is_iq2_s_or_m(f) || f == LlamaFtype::kMostlyIQ3_XXS) return GgmlType::IQ3_S;
      if (is_low_bit_iq(f)) return GgmlType::Q2_K;
      return t;
    default:
      break;
  }
  if (is_low_bit_iq(f)) {
    if (category == Category::kAttnV) {
      if (q.n_gqa >= 4 || q.n_expert >= 4) return GgmlType::Q4_K;
      return is_iq2_s_or_m(f) ? GgmlType::IQ3_S : GgmlType::Q2_K;
    }
    if (category == Category::kAttnK && q.n_expert == 8) return GgmlType::Q4_K;
    if (category == Category::kFfnDown) {
      if (q.ffn_down_index < q.n_layer / 8) return is_iq2_s_or_m(f) ? GgmlType::IQ3_S : GgmlType::Q2_K;
      return t;
    }
    if (category == Category::kAttnOutput) {
      if (q.n_expert == 8) return GgmlType::Q5_K;
      if (f == LlamaFtype::kMostlyIQ1_S || f == LlamaFtype::kMostlyIQ1_M) return GgmlType::IQ2_XXS;
      if (is_iq2_s_or_m(f)) return GgmlType::IQ3_S;
    }
    return t;
  }
  switch (category) {
    case Category::kAttnV: {
      GgmlType v = t;
      if (f == LlamaFtype::kMostlyQ2_K) v = q.n_gqa >= 4 ? GgmlType::Q4_K : GgmlType::Q3_K;
      if (f == LlamaFtype::kMostlyIQ3_XXS) v = q.n_gqa >= 4 ? GgmlType::Q4_K : GgmlType::IQ3_S;
      if (f == LlamaFtype::kMostlyIQ3_S && q.n_gqa >= 4) v = GgmlType::Q4_K;
      if (f == LlamaFtype::kMostlyQ3_K_M) v = q.attn_v_index < 2 ? GgmlType::Q5_K : GgmlType::Q4_K;
      if ((f == LlamaFtype::kMostlyIQ4_NL || f == LlamaFtype::kMostlyIQ4_XS) && q.n_gqa >= 4) v = GgmlType::Q5_K;
      if ((f == LlamaFtype::kMostlyQ4_K_M || f == LlamaFtype::kMostlyQ5_K_M) &&
          use_more_bits(q.attn_v_index, q.n_layer))
        v = GgmlType::Q6_K;
      return q.n_expert == 8 ? GgmlType::Q8_0 : v;
    }
    case Category::kAttnK:
      if (q.n_expert == 8) return GgmlType::Q8_0;
      return f == LlamaFtype::kMostlyIQ3_XXS ? GgmlType::IQ2_S : t;
    case Category::kAttnQ:
      return f == LlamaFtype::kMostlyIQ3_XXS ? GgmlType::IQ2_S : t;
    case Category::kAttnOutput:
      if (q.n_expert == 8) {
        if (f == LlamaFtype::kMostlyQ2_K || f == LlamaFtype::kMostlyQ3_K_M || f == LlamaFtype::kMostlyIQ4_NL ||
            f == LlamaFtype::kMostlyQ4_K_M || f == LlamaFtype::kMostlyIQ4_XS || f == LlamaFtype::kMostlyIQ3_XXS ||
            f == LlamaFtype::kMostlyIQ3_S)
          return GgmlType::Q5_K;
        return t;
      }
      if (f == LlamaFtype::kMostlyQ2_K) return GgmlType::Q3_K;
      if (f == LlamaFtype::kMostlyQ3_K_M) return GgmlType::Q4_K;
      if (f == LlamaFtype::kMostlyIQ3_XXS) return GgmlType::IQ3_S;
      return t;
    case Category::kFfnDown: {
      const int i_layer = layer_of(q.name);  // with more than one expert llama.cpp takes it from the name
      const int n_layer = q.n_layer;
      if (f == LlamaFtype::kMostlyQ2_K) return GgmlType::Q3_K;
      // Without an importance matrix, which make-model never has.
      if (f == LlamaFtype::kMostlyIQ3_XXS) return i_layer < n_layer / 8 ? GgmlType::Q4_K : GgmlType::Q3_K;
      if (f == LlamaFtype::kMostlyQ3_K_M) return i_layer < n_layer / 16 ? GgmlType::Q5_K : GgmlType::Q4_K;
      if (f == LlamaFtype::kMostlyQ4_K_M) return use_more_bits(i_layer, n_layer) ? GgmlType::Q6_K : t;
      if ((f == LlamaFtype::kMostlyIQ4_NL || f == LlamaFtype::kMostlyIQ4_XS) && i_layer < n_layer / 8)
        return GgmlType::Q5_K;
      if (f == LlamaFtype::kMostlyQ5_K_M && use_more_bits(i_layer, n_layer)) return GgmlType::Q6_K;
      return t;
    }
    default:
      return t;
  }
}

// llama.cpp's tensor_type_fallback: a row that the chosen type's blocks do not divide gets a 32-block type.
GgmlType fallback(GgmlType t, int64_t ncols) {
  if (ncols % quant::type_info(t).block_size == 0) return t;
  GgmlType r = t;
  switch (quant::is_iq_grid_type(t) ? GgmlType::IQ4_XS : t) {  // every IQ type falls back as IQ4_XS does
    case GgmlType::IQ4_XS:
      r = GgmlType::IQ4_NL;
      break;
    case GgmlType::Q2_K:
    case GgmlType::Q3_K:
    case GgmlType::TQ1_0:
    case GgmlType::TQ2_0:
      r = GgmlType::Q4_0;
      break;
    case GgmlType::Q4_K:
      r = GgmlType::Q5_0;
      break;
    case GgmlType::Q5_K:
      r = GgmlType::Q5_1;
      break;
    case GgmlType::Q6_K:
      r = GgmlType::Q8_0;
      break;
    default:  // llama.cpp stops here too ("no tensor type fallback is defined")
      fail("no fallback type for {} rows of {} elements", quant::type_info(t).name, ncols);
  }
  if (ncols % quant::type_info(r).block_size != 0) return GgmlType::F16;
  return r;
}

}  // namespace

int layer_of(std::string_view name) {
  int layer = -1;
  std::string s(name);
  if (std::sscanf(s.c_str(), "blk.%d.", &layer) != 1) return -1;
  return layer;
}

std::span<const FileType> file_types() { return kFileTypes; }

const FileType* find_file_type(std::string_view name) {
  for (const FileType& ft : kFileTypes)
    if (iequal(ft.name, name)) return &ft;
  return nullptr;
}

GgmlType TensorTypeWalk::next(std::string_view name, std::span<const int64_t> ne) {
  const GgmlType t = tensor_type_for(ft_, {.name = name,
                                           .ne = ne,
                                           .n_layer = n_layer_,
                                           .n_expert = n_expert_,
                                           .ffn_down_index = ffn_down_index_,
                                           .attn_v_index = attn_v_index_,
                                           .n_gqa = n_gqa_});
  if (contains(name, "ffn_down")) ++ffn_down_index_;
  if (ends_with(name, "attn_v.weight")) ++attn_v_index_;
  return t;
}

GgmlType tensor_type_for(const FileType& ft, const TensorTypeQuery& q) {
  if (!allows_quantization(q)) return GgmlType::F32;
  GgmlType t = ft.default_type;
  if (!is_quantized(t)) return converter_keeps_f32(q.name) ? GgmlType::F32 : t;
  t = mix_rule(ft, q, t);
  return fallback(t, q.ne[0]);
}

}  // namespace hetmoe
