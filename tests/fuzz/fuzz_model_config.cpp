// libFuzzer target for model loading. The input does not hold a file: it picks one of the real layouts (the metadata
// and tensor table of a reference model, as tests/data/manifest*.json record them) and a list of mutations of it:
// a metadata value replaced by a fuzzed one of any GGUF type, retyped, nudged, deleted or copied under another key;
// the architecture changed (with or without its keys); a dimension resized in the metadata and in every tensor that
// has it; a tensor reshaped, retyped, renamed or deleted. The result is written as GgufWriter writes it (all weights
// zero) to /dev/shm and loaded as `hetmoe run` and `chat` load it: Model::load, the tokenizer and its chat template,
// and, when the input asks, one decode step; when the load fails, as `inspect` reads it: read_config alone.
//
// Every step must succeed or throw hetmoe::Error. Beyond that, each checks what it promises:
// - the reader reads back every key and tensor written;
// - an accepted config satisfies read_config's range checks, and its floats are finite;
// - the active bytes per token are finite and at most the file's weight bytes;
// - Model::load reads the config read_config reads;
// - the template renders a plain conversation, and every token id of it lies in the vocabulary;
// - with all-zero weights the decode step's logits are all exactly 0 (no NaN, no stale memory reaches them);
// - when every mutation only re-encodes a value losslessly (an integer in another integer type that holds it, a
//   float in the other float width), the model loads and its config is the unmutated one.
//
// At start-up each unmutated layout must be written byte for byte as GgufWriter writes it, and load (with a decode
// step) exactly when hetmoe runs its architecture.
#include <fcntl.h>
#include <fmt/format.h>
#include <fuzzer/FuzzedDataProvider.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "quant/ggml_type.h"
#include "runtime/error.h"
#include "runtime/gguf/reader.h"
#include "runtime/gguf/value.h"
#include "runtime/gguf/writer.h"
#include "runtime/model/archs.h"
#include "runtime/model/config.h"
#include "runtime/model/kv_cache.h"
#include "runtime/model/model.h"
#include "runtime/model/split.h"
#include "runtime/text/chat_template.h"
#include "runtime/text/tokenizer.h"

namespace {

namespace fs = std::filesystem;
using hetmoe::Error;
using hetmoe::gguf::GgufFile;
using hetmoe::gguf::GgufWriter;
using hetmoe::gguf::Value;
using hetmoe::gguf::ValueType;
using hetmoe::model::ModelConfig;
using hetmoe::quant::GgmlType;

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "fuzz_model_config: %s\n", what.c_str());
  std::abort();
}

void require(bool ok, std::string_view what) {
  if (!ok) finding(std::string(what));
}

// The reference models whose layouts are fuzzed: every architecture hetmoe runs (deepseek2 with and without q LoRA,
// deepseek32, glm4moe, gpt-oss, minimax-m2, qwen3moe, Mixtral as llama, qwen35moe, deepseek4) and an IQ-quantized
// one. The order is part of the corpus format (an input's first choice is an index into it): new ones go last.
constexpr std::string_view kLayoutFiles[] = {
    "tiny-deepseek3-Q4_K_M.gguf", "tiny-deepseek2lite-Q4_K_M.gguf", "tiny-deepseek32-Q4_K_M.gguf",
    "tiny-glm4moe-Q4_K_M.gguf",   "tiny-gptoss-MXFP4_MOE.gguf",     "tiny-minimax-m2-Q4_K_M.gguf",
    "tiny-qwen3moe-Q4_K_M.gguf",  "tiny-mixtral-Q4_K_M.gguf",       "tiny-deepseek3-IQ2_XXS.gguf",
    "tiny-qwen35moe-Q4_K_M.gguf", "tiny-deepseek4-Q4_K_M.gguf"};

// The manifests give array values only as "<array of N>". The tokenizer arrays come from a model of the same
// tokenizer family in tests/data (all reference vocabularies have 512 tokens); other arrays become N zeros.
constexpr std::string_view kGpt2Donor = "tiny-deepseek3-Q4_K_M.gguf";
constexpr std::string_view kSpmDonor = "tiny-mixtral-Q4_K_M.gguf";

// Weight bytes a mutated model may have: above the largest layout (5.5 MB), below what makes a run slow.
constexpr uint64_t kMaxDataBytes = uint64_t{12} << 20;
constexpr int kMaxMutations = 12;

// Metadata keys the loader reads: "<arch>." + these, and the full names below.
constexpr std::string_view kArchKeys[] = {"attention.head_count",
                                          "attention.head_count_kv",
                                          "attention.indexer.head_count",
                                          "attention.indexer.key_length",
                                          "attention.indexer.top_k",
                                          "attention.key_length",
                                          "attention.key_length_mla",
                                          "attention.kv_lora_rank",
                                          "attention.layer_norm_rms_epsilon",
                                          "attention.q_lora_rank",
                                          "attention.sliding_window",
                                          "attention.value_length",
                                          "attention.value_length_mla",
                                          "block_count",
                                          "context_length",
                                          "embedding_length",
                                          "expert_count",
                                          "expert_feed_forward_length",
                                          "expert_gating_func",
                                          "expert_group_count",
                                          "expert_group_used_count",
                                          "expert_shared_count",
                                          "expert_used_count",
                                          "expert_weights_norm",
                                          "expert_weights_scale",
                                          "feed_forward_length",
                                          "leading_dense_block_count",
                                          "nextn_predict_layers",
                                          "rope.dimension_count",
                                          "rope.freq_base",
                                          "rope.scaling.factor",
                                          "rope.scaling.original_context_length",
                                          "rope.scaling.type",
                                          "rope.scaling.yarn_log_multiplier",
                                          "vocab_size"};
constexpr std::string_view kFullKeys[] = {
    "general.architecture", "general.name", "tokenizer.chat_template", "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_eos_token", "tokenizer.ggml.add_space_prefix", "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id",
    "tokenizer.ggml.merges", "tokenizer.ggml.model", "tokenizer.ggml.padding_token_id", "tokenizer.ggml.pre",
    "tokenizer.ggml.scores", "tokenizer.ggml.token_type", "tokenizer.ggml.tokens", "tokenizer.ggml.unknown_token_id",
    hetmoe::model::kSplitVersionKey,
    // DeepSeek-V4's own keys, last: the order is part of the corpus format
    "deepseek4.attention.compress_ratios", "deepseek4.attention.compress_rope_freq_base",
    "deepseek4.attention.output_group_count", "deepseek4.attention.output_lora_rank", "deepseek4.hash_layer_count",
    "deepseek4.hyper_connection.count", "deepseek4.hyper_connection.epsilon",
    "deepseek4.hyper_connection.sinkhorn_iterations", "deepseek4.swiglu_clamp_exp", "deepseek4.swiglu_clamp_shexp"};
constexpr std::string_view kArchNames[] = {"deepseek2", "deepseek32", "qwen3moe",  "llama",     "glm4moe",
                                           "gpt-oss",   "minimax-m2", "deepseek4", "qwen35moe", ""};

struct TensorSpec {
  std::string name;
  GgmlType type;
  std::vector<int64_t> ne;
};

struct Layout {
  std::string file;
  std::vector<std::pair<std::string, Value>> kv;
  std::vector<TensorSpec> tensors;
};

// What a loaded config is compared by: every field read_config fills.
std::string config_summary(const ModelConfig& c) {
  return fmt::format(
      "{} {} v{} e{} l{} ctx{} h{}/{} d{}/{} eps{} rope{}/{}/{}/{}/{}/{}/{}/{}/{} kq{} win{} {} ff{}/{} x{}/{}/{} "
      "dense{} g{} sw{} n{} s{} grp{}/{} mla{}/{}/{}/{}/{} ix{}/{}/{}",
      c.arch_name, c.name, c.n_vocab, c.n_embd, c.n_layer, c.n_ctx_train, c.n_head, c.n_head_kv, c.head_dim_k,
      c.head_dim_v, c.rms_eps, c.rope.n_dims, c.rope.neox, c.rope.freq_base, c.rope.freq_scale, c.rope.ext_factor,
      c.rope.attn_factor, c.rope.beta_fast, c.rope.beta_slow, c.rope.n_ctx_orig, c.kq_scale, c.sliding_window,
      c.ffn_norm, c.n_ff, c.n_ff_exp, c.n_expert, c.n_expert_used, c.n_expert_shared, c.n_leading_dense,
      static_cast<int>(c.gating), c.clamped_swiglu, c.expert_weights_norm, c.expert_weights_scale, c.n_group,
      c.n_group_used, c.q_lora_rank, c.kv_lora_rank, c.qk_nope, c.qk_rope, c.v_head, c.indexer_heads, c.indexer_dim,
      c.indexer_top_k);
}

struct State {
  std::vector<Layout> layouts;
  std::vector<std::optional<std::string>> base_configs;  // per layout: its config summary, or none (unsupported)
  std::vector<std::string> base_tokenizers;              // per layout: Header::tokenizer_entries
  std::vector<GgmlType> types;                           // every tensor type the reader knows
};

State& state() {
  static State s;
  return s;
}

// ---- Values ----

bool is_int_type(ValueType t) {
  switch (t) {
    case ValueType::kUint8:
    case ValueType::kInt8:
    case ValueType::kUint16:
    case ValueType::kInt16:
    case ValueType::kUint32:
    case ValueType::kInt32:
    case ValueType::kUint64:
    case ValueType::kInt64:
      return true;
    default:
      return false;
  }
}

bool int_fits(ValueType t, int64_t v) {
  switch (t) {
    case ValueType::kUint8:
      return v >= 0 && v <= UINT8_MAX;
    case ValueType::kInt8:
      return v >= INT8_MIN && v <= INT8_MAX;
    case ValueType::kUint16:
      return v >= 0 && v <= UINT16_MAX;
    case ValueType::kInt16:
      return v >= INT16_MIN && v <= INT16_MAX;
    case ValueType::kUint32:
      return v >= 0 && v <= UINT32_MAX;
    case ValueType::kInt32:
      return v >= INT32_MIN && v <= INT32_MAX;
    case ValueType::kUint64:
      return v >= 0;
    default:
      return true;
  }
}

// An integer of type t holding v cast to it (truncated as a C++ cast would, when it does not fit).
Value int_value(ValueType t, int64_t v) {
  switch (t) {
    case ValueType::kUint8:
      return Value::u8(static_cast<uint8_t>(v));
    case ValueType::kInt8:
      return Value::i8(static_cast<int8_t>(v));
    case ValueType::kUint16:
      return Value::u16(static_cast<uint16_t>(v));
    case ValueType::kInt16:
      return Value::i16(static_cast<int16_t>(v));
    case ValueType::kUint32:
      return Value::u32(static_cast<uint32_t>(v));
    case ValueType::kInt32:
      return Value::i32(static_cast<int32_t>(v));
    case ValueType::kUint64:
      return Value::u64(static_cast<uint64_t>(v));
    default:
      return Value::i64(v);
  }
}

ValueType consume_type(FuzzedDataProvider& in) {
  return static_cast<ValueType>(in.ConsumeIntegralInRange<uint32_t>(0, static_cast<uint32_t>(ValueType::kFloat64)));
}

int64_t consume_int(FuzzedDataProvider& in) {
  // Half the time a value near the sizes the layouts use, so that deeper checks are reached.
  static constexpr int64_t kNear[] = {0, 1, 2, 3, 4, 8, 16, 32, 64, 96, 128, 256, 512, 1024, -1, int64_t{1} << 31};
  if (in.ConsumeBool()) return kNear[in.ConsumeIntegralInRange<size_t>(0, std::size(kNear) - 1)];
  return in.ConsumeIntegral<int64_t>();
}

double consume_float(FuzzedDataProvider& in) {
  static constexpr double kSpecial[] = {0.0,
                                        -0.0,
                                        1.0,
                                        -1.0,
                                        0.5,
                                        1e-6,
                                        1e6,
                                        1e30,
                                        -1e30,
                                        5e-324,
                                        1e308,
                                        std::numeric_limits<double>::infinity(),
                                        -std::numeric_limits<double>::infinity(),
                                        std::numeric_limits<double>::quiet_NaN()};
  if (in.ConsumeBool()) return kSpecial[in.ConsumeIntegralInRange<size_t>(0, std::size(kSpecial) - 1)];
  return std::bit_cast<double>(in.ConsumeIntegral<uint64_t>());
}

Value fuzzed_array(FuzzedDataProvider& in, int depth);

Value fuzzed_value(FuzzedDataProvider& in) {
  const ValueType t = consume_type(in);
  if (is_int_type(t)) return int_value(t, consume_int(in));
  switch (t) {
    case ValueType::kFloat32:
      return Value::f32(static_cast<float>(consume_float(in)));
    case ValueType::kFloat64:
      return Value::f64(consume_float(in));
    case ValueType::kBool:
      return Value::boolean(in.ConsumeBool());
    case ValueType::kString:
      return Value::string(in.ConsumeRandomLengthString(256));
    default:
      return fuzzed_array(in, 0);
  }
}

// An array of up to 16 elements of one type; an array of arrays holds arrays of any one type each, one level down.
Value fuzzed_array(FuzzedDataProvider& in, int depth) {
  ValueType elem = consume_type(in);
  if (elem == ValueType::kArray && depth > 0) elem = ValueType::kInt32;
  const size_t n = in.ConsumeIntegralInRange<size_t>(0, 16);
  if (elem == ValueType::kString) {
    std::vector<std::string> items;
    for (size_t i = 0; i < n; ++i) items.push_back(in.ConsumeRandomLengthString(32));
    return Value::string_array(std::move(items));
  }
  if (elem == ValueType::kArray) {
    std::vector<Value> items;
    for (size_t i = 0; i < n; ++i) items.push_back(fuzzed_array(in, depth + 1));
    return Value::nested_array(ValueType::kArray, std::move(items));
  }
  std::vector<uint8_t> raw = in.ConsumeBytes<uint8_t>(n * hetmoe::gguf::value_type_size(elem));
  raw.resize(n * hetmoe::gguf::value_type_size(elem));
  // A bool is 0 or 1 in GGUF (the reader refuses other bytes; the writer writes what it is given).
  if (elem == ValueType::kBool)
    for (uint8_t& b : raw) b &= 1;
  return Value::numeric_array(elem, std::move(raw));
}

// v re-encoded as type t; *lossless stays true only when the value reads back the same through get_int/get_float.
Value retyped(const Value& v, ValueType t, bool* lossless) {
  if (const std::optional<int64_t> i = v.as_int(); i && is_int_type(v.type())) {
    if (is_int_type(t)) {
      *lossless = *lossless && int_fits(t, *i);
      return int_value(t, *i);
    }
    *lossless = false;
    if (t == ValueType::kFloat32) return Value::f32(static_cast<float>(*i));
    if (t == ValueType::kFloat64) return Value::f64(static_cast<double>(*i));
    if (t == ValueType::kBool) return Value::boolean(*i != 0);
    if (t == ValueType::kString) return Value::string(std::to_string(*i));
    return Value::i32_array({static_cast<int32_t>(*i)});
  }
  if (v.type() == ValueType::kFloat32 || v.type() == ValueType::kFloat64) {
    const double x = *v.as_float();
    if (t == ValueType::kFloat64) return Value::f64(x);  // exact from f32, and f64 to f64
    if (t == ValueType::kFloat32) {
      *lossless = *lossless && static_cast<double>(static_cast<float>(x)) == x;
      return Value::f32(static_cast<float>(x));
    }
    *lossless = false;
    if (is_int_type(t))
      return int_value(t, std::isfinite(x) && std::abs(x) < 9e18 ? static_cast<int64_t>(x) : int64_t{-1});
    if (t == ValueType::kBool) return Value::boolean(x != 0);
    if (t == ValueType::kString) return Value::string(fmt::format("{}", x));
    return Value::f32_array({static_cast<float>(x)});
  }
  *lossless = false;
  if (const std::string* s = v.as_string()) {
    if (t == ValueType::kArray) return Value::string_array({*s});
    return is_int_type(t) ? int_value(t, static_cast<int64_t>(s->size())) : Value::string(*s + "x");
  }
  if (v.is_array()) return v.array_size() > 0 && v.array_int(0) ? int_value(ValueType::kInt32, *v.array_int(0)) : v;
  return is_int_type(t) ? int_value(t, v.as_int().value_or(0)) : Value::string(v.to_display());
}

// ---- The mutated model ----

struct Mutant {
  Layout layout;
  bool lossless = true;

  std::string arch() const {
    for (const auto& [k, v] : layout.kv)
      if (k == "general.architecture" && v.as_string()) return *v.as_string();
    return "";
  }
  Value* find(std::string_view key) {
    for (auto& [k, v] : layout.kv)
      if (k == key) return &v;
    return nullptr;
  }
  void set(const std::string& key, Value value) {
    if (Value* v = find(key))
      *v = std::move(value);
    else
      layout.kv.emplace_back(key, std::move(value));
  }
  // As GgufWriter stores the metadata: one entry per key with the last value given for it, at the first key's place,
  // and no split keys (the writer sets those itself). general.alignment goes too: Header writes the default
  // alignment (fuzz_gguf covers others).
  void normalize() {
    std::vector<std::pair<std::string, Value>> kv;
    for (auto& entry : layout.kv) {
      const std::string& key = entry.first;
      if (key == hetmoe::gguf::kSplitCountKey || key == hetmoe::gguf::kSplitNoKey ||
          key == hetmoe::gguf::kSplitTensorsKey || key == "general.alignment")
        continue;
      auto same = std::find_if(kv.begin(), kv.end(), [&](const auto& e) { return e.first == key; });
      if (same != kv.end())
        same->second = std::move(entry.second);
      else
        kv.push_back(std::move(entry));
    }
    layout.kv = std::move(kv);
  }
  uint64_t data_bytes() const {
    uint64_t total = 0;
    for (const TensorSpec& t : layout.tensors) {
      uint64_t bytes = hetmoe::quant::row_bytes(t.type, t.ne[0]);
      for (size_t d = 1; d < t.ne.size(); ++d) bytes *= static_cast<uint64_t>(t.ne[d]);
      total += bytes;
    }
    return total;
  }
};

bool valid_shape(const TensorSpec& t) {
  if (t.ne.empty() || t.ne.size() > static_cast<size_t>(hetmoe::gguf::kMaxDims)) return false;
  uint64_t elements = 1;
  for (int64_t n : t.ne) {
    if (n <= 0 || static_cast<uint64_t>(n) > kMaxDataBytes * 8) return false;
    elements *= static_cast<uint64_t>(n);
    if (elements > kMaxDataBytes * 8) return false;
  }
  return hetmoe::quant::row_bytes(t.type, t.ne[0]) != 0;
}

// A key: one the layout has, or one the loader reads (with the layout's architecture prefix).
std::string pick_key(FuzzedDataProvider& in, const Mutant& m) {
  const size_t known = std::size(kArchKeys) + std::size(kFullKeys);
  const size_t i = in.ConsumeIntegral<uint16_t>() % (m.layout.kv.size() + known);
  if (i < m.layout.kv.size()) return m.layout.kv[i].first;
  const size_t k = i - m.layout.kv.size();
  if (k < std::size(kArchKeys)) return m.arch() + "." + std::string(kArchKeys[k]);
  return std::string(kFullKeys[k - std::size(kArchKeys)]);
}

std::string pick_arch(FuzzedDataProvider& in) {
  const size_t i = in.ConsumeIntegralInRange<size_t>(0, std::size(kArchNames));
  return i < std::size(kArchNames) ? std::string(kArchNames[i]) : in.ConsumeRandomLengthString(32);
}

// Replaces every dimension equal to `from` by `to` (a row length only where the type's blocks still divide it).
void resize_dimension(Mutant& m, int64_t from, int64_t to) {
  for (TensorSpec& t : m.layout.tensors) {
    for (size_t d = 0; d < t.ne.size(); ++d) {
      if (t.ne[d] != from) continue;
      const int64_t old = t.ne[d];
      t.ne[d] = to;
      if (!valid_shape(t)) t.ne[d] = old;
    }
  }
}

// A key or tensor name. GgufWriter writes an empty one, but the reader (rightly) refuses it: never empty here.
std::string fuzzed_name(FuzzedDataProvider& in) {
  std::string name = in.ConsumeRandomLengthString(64);
  return name.empty() ? "x" : name;
}

// Rewrites "blk.N." in a tensor name to another block number, or swaps weight/bias, or fuzzes the name.
std::string renamed(FuzzedDataProvider& in, const std::string& name) {
  switch (in.ConsumeIntegralInRange<int>(0, 2)) {
    case 0: {
      if (!name.starts_with("blk.")) break;
      const size_t dot = name.find('.', 4);
      if (dot == std::string::npos) break;
      return "blk." + std::to_string(in.ConsumeIntegralInRange<int>(0, 8)) + name.substr(dot);
    }
    case 1:
      if (name.ends_with(".weight")) return name.substr(0, name.size() - 6) + "bias";
      if (name.ends_with(".bias")) return name.substr(0, name.size() - 4) + "weight";
      break;
    default:
      break;
  }
  return fuzzed_name(in);
}

enum class Mutation : uint8_t {
  kSetValue,      // a key gets a fuzzed value of any type
  kRetype,        // a key's value in another GGUF type
  kNudge,         // an integer key moved to a neighbouring value
  kDelete,        // a key removed
  kCopyKey,       // a key's value also under another key
  kSetArch,       // general.architecture changed, its keys left as they are
  kRenameArch,    // general.architecture changed along with the prefix of its keys
  kResizeDim,     // an integer key and every tensor dimension equal to it changed together
  kTensorDim,     // one dimension of one tensor changed
  kTensorRank,    // a dimension added to or removed from one tensor
  kTensorType,    // one tensor in another type
  kTensorRename,  // one tensor renamed
  kTensorDelete,  // one tensor removed
  kMaxValue = kTensorDelete,
};

void mutate(FuzzedDataProvider& in, Mutant& m) {
  std::vector<TensorSpec>& tensors = m.layout.tensors;
  auto pick_tensor = [&]() -> TensorSpec* {
    if (tensors.empty()) return nullptr;
    return &tensors[in.ConsumeIntegral<uint16_t>() % tensors.size()];
  };
  const Mutation op = in.ConsumeEnum<Mutation>();
  if (op != Mutation::kRetype) m.lossless = false;
  switch (op) {
    case Mutation::kSetValue: {
      const std::string key = pick_key(in, m);
      m.set(key, fuzzed_value(in));
      break;
    }
    case Mutation::kRetype: {
      const std::string key = pick_key(in, m);
      const ValueType t = consume_type(in);
      if (Value* v = m.find(key)) *v = retyped(*v, t, &m.lossless);
      break;
    }
    case Mutation::kNudge: {
      Value* v = m.find(pick_key(in, m));
      if (!v || !is_int_type(v->type()) || !v->as_int()) break;
      const int64_t x = *v->as_int(), d = in.ConsumeIntegralInRange<int64_t>(-64, 64);
      // Each neighbour computed without overflow; x itself where there is none.
      int64_t y = x;
      switch (in.ConsumeIntegralInRange<int>(0, 5)) {
        case 0:
          if (__builtin_add_overflow(x, d, &y)) y = x;
          break;
        case 1:
          if (__builtin_mul_overflow(x, 2, &y)) y = x;
          break;
        case 2:
          y = x / 2;
          break;
        case 3:
          if (__builtin_sub_overflow(0, x, &y)) y = x;
          break;
        case 4:
          y = 0;
          break;
        default:
          y = x == INT64_MAX ? x : x + 1;
          break;
      }
      *v = int_value(int_fits(v->type(), y) ? v->type() : ValueType::kInt64, y);
      break;
    }
    case Mutation::kDelete: {
      const std::string key = pick_key(in, m);
      std::erase_if(m.layout.kv, [&](const auto& kv) { return kv.first == key; });
      break;
    }
    case Mutation::kCopyKey: {
      const std::string from = pick_key(in, m);
      const std::string to = in.ConsumeBool() ? pick_key(in, m) : fuzzed_name(in);
      if (const Value* v = m.find(from)) {
        const Value copy = *v;
        m.set(to, copy);
      }
      break;
    }
    case Mutation::kSetArch:
      m.set("general.architecture", Value::string(pick_arch(in)));
      break;
    case Mutation::kRenameArch: {
      const std::string old_prefix = m.arch() + ".", arch = pick_arch(in);
      for (auto& [k, v] : m.layout.kv)
        if (k.starts_with(old_prefix)) k = arch + "." + k.substr(old_prefix.size());
      m.set("general.architecture", Value::string(arch));
      break;
    }
    case Mutation::kResizeDim: {
      Value* v = m.find(pick_key(in, m));
      if (!v || !is_int_type(v->type()) || !v->as_int() || *v->as_int() <= 0) break;
      const int64_t from = *v->as_int();
      const int64_t to = in.ConsumeIntegralInRange<int64_t>(1, 1024);
      *v = int_value(int_fits(v->type(), to) ? v->type() : ValueType::kInt64, to);
      resize_dimension(m, from, to);
      break;
    }
    case Mutation::kTensorDim: {
      TensorSpec* t = pick_tensor();
      if (!t) break;
      const size_t d = in.ConsumeIntegral<uint8_t>() % t->ne.size();
      const int64_t old = t->ne[d];
      const int64_t options[] = {old * 2, old / 2, old + 1, old - 1, in.ConsumeIntegralInRange<int64_t>(1, 4096)};
      t->ne[d] = options[in.ConsumeIntegralInRange<size_t>(0, std::size(options) - 1)];
      if (!valid_shape(*t)) t->ne[d] = old;
      break;
    }
    case Mutation::kTensorRank: {
      TensorSpec* t = pick_tensor();
      if (!t) break;
      if (in.ConsumeBool() && t->ne.size() < static_cast<size_t>(hetmoe::gguf::kMaxDims)) {
        t->ne.push_back(in.ConsumeIntegralInRange<int64_t>(1, 4));
        if (!valid_shape(*t)) t->ne.pop_back();
      } else if (t->ne.size() > 1) {
        t->ne.pop_back();
      }
      break;
    }
    case Mutation::kTensorType: {
      TensorSpec* t = pick_tensor();
      if (!t) break;
      const GgmlType old = t->type;
      t->type = state().types[in.ConsumeIntegral<uint8_t>() % state().types.size()];
      if (!valid_shape(*t)) t->type = old;
      break;
    }
    case Mutation::kTensorRename: {
      TensorSpec* t = pick_tensor();
      if (!t) break;
      std::string name = renamed(in, t->name);
      if (std::none_of(tensors.begin(), tensors.end(), [&](const TensorSpec& o) { return o.name == name; }))
        t->name = std::move(name);
      break;
    }
    case Mutation::kTensorDelete:
      if (!tensors.empty()) tensors.erase(tensors.begin() + in.ConsumeIntegral<uint16_t>() % tensors.size());
      break;
  }
}

// ---- Writing ----

void write_with_gguf_writer(const Layout& layout, const std::string& path) {
  GgufWriter w;
  for (const auto& [key, value] : layout.kv) w.set(key, value);
  // Zero weights (the writer hands over its buffer uncleared).
  for (const TensorSpec& t : layout.tensors)
    w.add_tensor(t.name, t.type, t.ne, [](std::span<uint8_t> out) { std::fill(out.begin(), out.end(), uint8_t{0}); });
  w.write(path);
}

// The file GgufWriter writes for a layout, up to its tensor data, built in memory: GgufWriter also writes every weight
// byte (5 MB and most of a run's time for the larger layouts), while the data of these files is all zeros and can be
// left to the file system. Start-up checks that the two agree byte for byte on every unmutated layout.
class Header {
 public:
  explicit Header(const Layout& layout) {
    pod<uint32_t>(hetmoe::gguf::kMagic);
    pod<uint32_t>(3);
    pod<uint64_t>(layout.tensors.size());
    pod<uint64_t>(layout.kv.size());
    for (const auto& [key, value] : layout.kv) entry(key, value);
    for (const TensorSpec& t : layout.tensors) {
      string(t.name);
      pod<uint32_t>(static_cast<uint32_t>(t.ne.size()));
      for (int64_t n : t.ne) pod<int64_t>(n);
      pod<uint32_t>(static_cast<uint32_t>(t.type));
      pod<uint64_t>(data_bytes_);
      uint64_t bytes = hetmoe::quant::row_bytes(t.type, t.ne[0]);
      for (size_t d = 1; d < t.ne.size(); ++d) bytes *= static_cast<uint64_t>(t.ne[d]);
      data_bytes_ = aligned(data_bytes_ + bytes);
    }
    bytes_.resize(aligned(bytes_.size()), '\0');
  }
  const std::string& bytes() const { return bytes_; }
  uint64_t file_size() const { return bytes_.size() + data_bytes_; }

  // The tokenizer.* entries alone, encoded: all that the tokenizer and the chat template read.
  static std::string tokenizer_entries(const Layout& layout) {
    Header h;
    for (const auto& [key, value] : layout.kv)
      if (key.starts_with("tokenizer.")) h.entry(key, value);
    return h.bytes_;
  }

 private:
  Header() = default;
  void entry(const std::string& key, const Value& value) {
    string(key);
    pod<uint32_t>(static_cast<uint32_t>(value.type()));
    write(value);
  }
  static uint64_t aligned(uint64_t n) {
    const uint64_t a = hetmoe::gguf::kDefaultAlignment;
    return (n + a - 1) / a * a;
  }
  template <typename T>
  void pod(T v) {
    bytes_.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  void string(const std::string& s) {
    pod<uint64_t>(s.size());
    bytes_ += s;
  }
  void write(const Value& v) {
    switch (v.type()) {
      case ValueType::kUint8:
      case ValueType::kInt8:
        return pod<uint8_t>(static_cast<uint8_t>(*v.as_int()));
      case ValueType::kUint16:
      case ValueType::kInt16:
        return pod<uint16_t>(static_cast<uint16_t>(*v.as_int()));
      case ValueType::kUint32:
      case ValueType::kInt32:
        return pod<uint32_t>(static_cast<uint32_t>(*v.as_int()));
      case ValueType::kUint64:
        return pod<uint64_t>(v.u64_value());
      case ValueType::kInt64:
        return pod<int64_t>(*v.as_int());
      case ValueType::kFloat32:
        return pod<float>(static_cast<float>(*v.as_float()));
      case ValueType::kFloat64:
        return pod<double>(*v.as_float());
      case ValueType::kBool:
        return pod<uint8_t>(*v.as_bool() ? 1 : 0);
      case ValueType::kString:
        return string(*v.as_string());
      case ValueType::kArray:
        pod<uint32_t>(static_cast<uint32_t>(v.elem_type()));
        pod<uint64_t>(v.array_size());
        if (v.elem_type() == ValueType::kString) {
          for (const std::string& s : v.strings()) string(s);
        } else if (v.elem_type() == ValueType::kArray) {
          for (const Value& item : v.items()) write(item);
        } else {
          bytes_.append(reinterpret_cast<const char*>(v.raw().data()), v.raw().size());
        }
        return;
    }
  }

  std::string bytes_;
  uint64_t data_bytes_ = 0;
};

// The file each run's model is written to, rewritten in place: the header over the previous one, zeros over what is
// left of a longer previous header, and the size set. Everything after the header stays zero, and the pages of the
// data stay in the page cache from run to run.
class ScratchFile {
 public:
  explicit ScratchFile(std::string path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    require(fd_ >= 0, "cannot create the scratch file");
  }
  ~ScratchFile() {
    ::close(fd_);
    if (!keep_) ::unlink(path_.c_str());
  }
  void keep() { keep_ = true; }
  const std::string& path() const { return path_; }

  void write(const Header& header) {
    const std::string& bytes = header.bytes();
    const size_t stale_end = std::min<uint64_t>(header_size_, header.file_size());
    const std::string zeros(stale_end > bytes.size() ? stale_end - bytes.size() : 0, '\0');
    require(::ftruncate(fd_, static_cast<off_t>(header.file_size())) == 0 &&
                ::pwrite(fd_, bytes.data(), bytes.size(), 0) == static_cast<ssize_t>(bytes.size()) &&
                ::pwrite(fd_, zeros.data(), zeros.size(), static_cast<off_t>(bytes.size())) ==
                    static_cast<ssize_t>(zeros.size()),
            "cannot write the scratch file");
    header_size_ = bytes.size();
  }

 private:
  std::string path_;
  int fd_ = -1;
  size_t header_size_ = 0;
  bool keep_ = false;
};

// ---- Loading ----

void check_config(const GgufFile& file, const ModelConfig& c) {
  using hetmoe::model::ConfigKeys;
  require(c.n_embd > 0 && c.n_embd <= ConfigKeys::kMaxDim, "embedding_length out of range");
  require(c.n_layer > 0 && c.n_layer <= 4096, "block_count out of range");
  require(c.n_head > 0 && c.n_head_kv > 0 && c.n_head % c.n_head_kv == 0, "head counts inconsistent");
  require(c.n_vocab > 0 && c.n_ctx_train > 0, "vocabulary or context not positive");
  require(c.rms_eps > 0 && c.rms_eps < 1, "rms epsilon out of range");
  require(c.n_expert == 0 || (c.n_expert_used > 0 && c.n_expert_used <= c.n_expert && c.n_ff_exp > 0),
          "expert counts inconsistent");
  require(c.rope.n_dims > 0 && c.rope.n_dims % 2 == 0 && c.rope.n_dims <= c.head_dim_k, "rope dims do not fit");
  const float floats[] = {c.rms_eps,         c.rope.freq_base,   c.rope.freq_scale,
                          c.rope.ext_factor, c.rope.attn_factor, c.rope.beta_fast,
                          c.rope.beta_slow,  c.kq_scale,         c.expert_weights_scale};
  for (float f : floats)
    require(std::isfinite(f), fmt::format("read_config accepted a non-finite value: {}", config_summary(c)));

  double total = 0;
  for (const hetmoe::gguf::TensorInfo& t : file.tensors()) total += static_cast<double>(t.nbytes);
  const double active = hetmoe::model::active_bytes_per_token(file, c);
  require(std::isfinite(active) && active >= 0 && active <= total * (1 + 1e-9), "active bytes out of range");
}

void check_tokenizer(const GgufFile& file) {
  std::unique_ptr<hetmoe::text::Tokenizer> tokenizer;
  try {
    tokenizer = hetmoe::text::Tokenizer::from_gguf(file);
  } catch (const Error&) {
    return;
  }
  std::string warning;
  const hetmoe::text::ChatTemplate chat = hetmoe::text::ChatTemplate::detect(file, *tokenizer, &warning);
  const hetmoe::text::ChatMessage messages[] = {
      {"system", "Be brief."}, {"user", "Hi <think> there"}, {"assistant", "<think>x</think>Hello"}, {"user", "2+2?"}};
  // Every format takes a system message first and alternating turns: rendering this may not fail.
  const std::string prompt = chat.render(messages, {.date = "2026-12-01"});
  for (bool parse_special : {false, true})
    for (int32_t id : tokenizer->encode(prompt, true, parse_special))
      require(id >= 0 && id < tokenizer->n_vocab(), "token id out of the vocabulary");
}

// One decode step of a loaded model. Its weights are all zero, so every logit must be exactly 0: a NaN or stale
// memory that reaches them shows.
void check_decode(hetmoe::model::Model& model) {
  const ModelConfig& c = model.config();
  hetmoe::model::KvCache cache = model.make_cache(std::min<int64_t>(c.n_ctx_train, 4));
  std::vector<float> logits;
  const int32_t token = static_cast<int32_t>(c.n_vocab - 1);
  model.forward({&token, 1}, 0, cache, false, logits);
  require(logits.size() == static_cast<size_t>(c.n_vocab), "logits of the wrong size");
  for (float x : logits) require(x == 0.0f, fmt::format("zero weights gave the logit {} ({})", x, config_summary(c)));
}

// The file as read back: what was written, and what read_config makes of it (nullopt: an Error).
std::optional<ModelConfig> check_file(const GgufFile& file, const Layout& layout) {
  require(file.metadata().size() == layout.kv.size() && file.tensors().size() == layout.tensors.size(),
          "the reader does not read back what was written");
  try {
    ModelConfig c = hetmoe::model::read_config(file);
    check_config(file, c);
    return c;
  } catch (const Error&) {
    return std::nullopt;
  }
}

struct Loaded {
  std::optional<std::string> config;  // the summary of what read_config accepted
  bool model = false;                 // whether Model::load accepted it
};

ScratchFile& scratch() {
  static ScratchFile file([] {
    const fs::path shm = "/dev/shm";
    return ((fs::is_directory(shm) ? shm : fs::temp_directory_path()) /
            fmt::format("hetmoe-fuzz-model-config-{}.gguf", getpid()))
        .string();
  }());
  return file;
}

// Writes the layout and loads it as `run` does, then reads it as `inspect` does when that failed. The tokenizer is
// built only when asked (a fifth of a run; its result is known when no tokenizer key changed), and so is the decode
// step (half of a run that loads).
Loaded load_all(const Layout& layout, bool tokenizer, bool decode) {
  const std::string& path = scratch().path();
  const Header header(layout);
  scratch().write(header);
  // HETMOE_FUZZ_SAVE_MODEL=FILE keeps a copy of the model as a GGUF file (zero weights), for turning a reproducer
  // into a file `hetmoe inspect` or `run` can open.
  if (const char* save = std::getenv("HETMOE_FUZZ_SAVE_MODEL"); save && *save) {
    ScratchFile copy(save);
    copy.write(header);
    copy.keep();
  }
  Loaded loaded;
  std::unique_ptr<hetmoe::model::Model> model;
  try {
    model = hetmoe::model::Model::load(path, 1);
  } catch (const Error&) {
  }
  if (model) {
    const std::optional<ModelConfig> c = check_file(model->file(), layout);
    require(c && config_summary(*c) == config_summary(model->config()),
            "Model::load read another config than read_config");
    loaded = {.config = config_summary(*c), .model = true};
    if (tokenizer) check_tokenizer(model->file());
    if (decode) check_decode(*model);
    return loaded;
  }
  std::optional<GgufFile> file;
  try {
    file.emplace(GgufFile::open(path));
  } catch (const Error& e) {
    finding(fmt::format("the reader rejects a file GgufWriter would write: {}", e.what()));
  }
  if (const std::optional<ModelConfig> c = check_file(*file, layout)) loaded.config = config_summary(*c);
  if (tokenizer) check_tokenizer(*file);
  return loaded;
}

// ---- Layouts ----

Value json_value(const nlohmann::ordered_json& j, const std::string& key, const GgufFile& donor) {
  if (j.is_boolean()) return Value::boolean(j.get<bool>());
  if (j.is_number_float()) return Value::f32(j.get<float>());
  if (j.is_number_unsigned()) {
    const uint64_t v = j.get<uint64_t>();
    return v <= UINT32_MAX ? Value::u32(static_cast<uint32_t>(v)) : Value::u64(v);
  }
  if (j.is_number_integer()) return Value::i32(j.get<int32_t>());
  const std::string s = j.get<std::string>();
  constexpr std::string_view kArray = "<array of ";
  if (!s.starts_with(kArray)) return Value::string(s);
  if (const Value* v = donor.find(key)) return *v;
  const size_t n = std::stoul(s.substr(kArray.size()));
  return Value::numeric_array(ValueType::kInt32, std::vector<uint8_t>(n * 4, 0));
}

Layout layout_from(const nlohmann::ordered_json& entry, const GgufFile& gpt2, const GgufFile& spm) {
  Layout layout{.file = entry.at("file").get<std::string>()};
  const nlohmann::ordered_json& meta = entry.at("metadata");
  const GgufFile& donor = meta.value("tokenizer.ggml.model", "") == "llama" ? spm : gpt2;
  for (const auto& [key, value] : meta.items()) {
    if (key.starts_with("split.")) continue;
    layout.kv.emplace_back(key, json_value(value, key, donor));
  }
  for (const nlohmann::ordered_json& t : entry.at("tensors")) {
    const auto type = hetmoe::quant::type_from_name(t.at("type").get<std::string>());
    require(type.has_value(), "unknown tensor type in the manifest");
    layout.tensors.push_back({t.at("name").get<std::string>(), *type, t.at("ne").get<std::vector<int64_t>>()});
  }
  return layout;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  // One thread, unpinned, and no hwloc probe of the machine for every load.
  setenv("HETMOE_PIN", "0", 0);
  setenv("HETMOE_NUMA", "0", 0);
  setenv("HETMOE_TOPOLOGY", "package:1 numa:1 core:1 pu:1", 0);
  State& s = state();
  for (uint32_t id = 0; id < 2048; ++id)
    if (hetmoe::quant::type_info(id)) s.types.push_back(static_cast<GgmlType>(id));

  const fs::path data = HETMOE_TEST_DATA_DIR;
  const GgufFile gpt2 = GgufFile::open((data / "models" / kGpt2Donor).string());
  const GgufFile spm = GgufFile::open((data / "models" / kSpmDonor).string());
  std::vector<nlohmann::ordered_json> entries;
  for (const char* manifest : {"manifest.json", "manifest-next.json"}) {
    std::ifstream f(data / manifest);
    for (nlohmann::ordered_json& entry : nlohmann::ordered_json::parse(f)) entries.push_back(std::move(entry));
  }
  for (std::string_view name : kLayoutFiles) {
    const auto entry = std::find_if(entries.begin(), entries.end(), [&](const nlohmann::ordered_json& e) {
      return e.at("file").get<std::string>() == name;
    });
    require(entry != entries.end(), fmt::format("{} is not in the manifests", name));
    s.layouts.push_back(layout_from(*entry, gpt2, spm));
  }
  // The harness must reproduce the real models: each layout, as GgufWriter writes it, is what Header writes, and
  // loads when hetmoe runs its architecture.
  for (const Layout& layout : s.layouts) {
    const Mutant m{.layout = layout};
    const std::string written = scratch().path() + ".writer";
    write_with_gguf_writer(layout, written);
    std::ifstream f(written, std::ios::binary);
    const std::string file((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::remove(written.c_str());
    const Header header(layout);
    require(file.size() == header.file_size() && file.starts_with(header.bytes()) &&
                file.find_first_not_of('\0', header.bytes().size()) == std::string::npos,
            fmt::format("{}: Header and GgufWriter disagree", layout.file));
    Loaded loaded = load_all(layout, true, true);
    const bool supported = hetmoe::model::find_arch(m.arch()) != nullptr;
    require(loaded.config.has_value() == supported && loaded.model == supported,
            fmt::format("{}: the unmutated layout does not load as expected", layout.file));
    s.base_configs.push_back(std::move(loaded.config));
    s.base_tokenizers.push_back(Header::tokenizer_entries(layout));
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const State& s = state();
  const size_t index = in.ConsumeIntegralInRange<size_t>(0, s.layouts.size() - 1);
  const bool decode = in.ConsumeBool();
  Mutant m{.layout = s.layouts[index]};
  for (int i = 0; i < kMaxMutations && in.remaining_bytes() > 0; ++i) mutate(in, m);
  m.normalize();
  if (m.data_bytes() > kMaxDataBytes) return 0;
  const Loaded loaded = load_all(m.layout, Header::tokenizer_entries(m.layout) != s.base_tokenizers[index], decode);
  if (m.lossless && s.base_configs[index])
    require(loaded.model && loaded.config == s.base_configs[index],
            "an integer or float re-encoded without loss changed what loads");
  return 0;
}
