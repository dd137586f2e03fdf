// hetmoe split (runtime/model/split_writer.h): the file it writes, the errors it reports, and the inputs it refuses.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "quant/lowbit.h"
#include "quant/ref.h"
#include "runtime/device/device.h"
#include "runtime/error.h"
#include "runtime/gguf/reader.h"
#include "runtime/gguf/writer.h"
#include "runtime/model/make_model.h"
#include "runtime/model/model.h"
#include "runtime/model/split.h"
#include "runtime/model/split_writer.h"
#include "tests/support/temp_dir.h"

namespace hetmoe {
namespace {

namespace fs = std::filesystem;
using quant::GgmlType;

const fs::path& temp_dir() { return test_support::temp_dir("hetmoe_split_"); }

const fs::path kTiny = fs::path(HETMOE_TEST_DATA_DIR) / "models" / "tiny-deepseek3-Q4_K_M.gguf";

std::vector<float> rows_of(const gguf::TensorInfo& t) {
  std::vector<float> v(t.n_elements());
  for (int64_t r = 0; r < t.n_rows; ++r) quant::dequantize_row(t.type, t.row(r), v.data() + r * t.ne[0], t.ne[0]);
  return v;
}

TEST(Split, WritesBothPartsAndCopiesEverythingElse) {
  const fs::path out = temp_dir() / "tiny.split.gguf";
  const std::vector<SplitTensorReport> report = split_model({.model = kTiny.string(),
                                                             .out = out.string(),
                                                             .gpu_bits = 3,
                                                             .group = 128,
                                                             .residual_bits = 4,
                                                             .threads = 2,
                                                             .measure_errors = true},
                                                            nullptr);
  const gguf::GgufFile src = gguf::GgufFile::open(kTiny.string());
  const gguf::GgufFile dst = gguf::GgufFile::open(out.string());
  EXPECT_EQ(dst.get_int(model::kSplitVersionKey), static_cast<int64_t>(quant::kLowBitLayoutVersion));
  EXPECT_EQ(dst.get_string(model::kSplitGpuTypeKey), "HQ3_G128");
  EXPECT_EQ(dst.get_int(model::kSplitResidualBitsKey), 4);
  for (const auto& [key, value] : src.metadata()) EXPECT_TRUE(dst.find(key)) << key;

  size_t n_split = 0;
  for (const gguf::TensorInfo& t : src.tensors()) {
    if (!model::is_routed_expert_tensor(t.name)) {
      const gguf::TensorInfo* copy = dst.find_tensor(t.name);
      ASSERT_TRUE(copy) << t.name;
      EXPECT_EQ(copy->type, t.type);
      EXPECT_EQ(std::memcmp(copy->data, t.data, t.nbytes), 0) << t.name;
      continue;
    }
    EXPECT_FALSE(dst.find_tensor(t.name)) << t.name << " should be replaced by its parts";
    const gguf::TensorInfo* q = dst.find_tensor(model::split_gpu_name(t.name));
    const gguf::TensorInfo* r = dst.find_tensor(model::split_residual_name(t.name));
    ASSERT_TRUE(q && r) << t.name;
    EXPECT_EQ(q->type, GgmlType::HQ3_G128);
    EXPECT_EQ(r->type, GgmlType::Q4_K);
    EXPECT_EQ(q->ne, t.ne);
    EXPECT_EQ(r->ne, t.ne);
    // The reported errors are those of the written parts.
    const std::vector<float> w = rows_of(t), wq = rows_of(*q), wr = rows_of(*r);
    double norm = 0, eq = 0, eqr = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      norm += static_cast<double>(w[i]) * w[i];
      eq += std::pow(static_cast<double>(w[i]) - wq[i], 2);
      eqr += std::pow(static_cast<double>(w[i]) - wq[i] - wr[i], 2);
    }
    ASSERT_LT(n_split, report.size());
    const SplitTensorReport& rep = report[n_split++];
    EXPECT_EQ(rep.name, t.name);
    EXPECT_NEAR(rep.gpu_error, std::sqrt(eq / norm), 1e-6);
    EXPECT_NEAR(rep.combined_error, std::sqrt(eqr / norm), 1e-6);
    // The residual makes the pair far closer to W than W^Q alone.
    EXPECT_LT(rep.combined_error, rep.gpu_error / 4) << t.name;
  }
  EXPECT_EQ(n_split, report.size());
  EXPECT_EQ(n_split, 6u);  // gate, up, down of the two MoE blocks
}

// Measuring the errors (split --report) reads the parts back and changes no byte written; without it the report's
// errors stay 0.
TEST(Split, MeasuringTheErrorsChangesNoByte) {
  auto bytes = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  for (const model::CriticalFrom from : {model::CriticalFrom::kResidual, model::CriticalFrom::kSource}) {
    const fs::path measured = temp_dir() / "measured.gguf", plain = temp_dir() / "plain.gguf";
    const auto with = split_model({.model = kTiny.string(),
                                   .out = measured.string(),
                                   .threads = 2,
                                   .critical_from = from,
                                   .measure_errors = true},
                                  nullptr);
    const auto without =
        split_model({.model = kTiny.string(), .out = plain.string(), .threads = 2, .critical_from = from}, nullptr);
    EXPECT_EQ(bytes(measured), bytes(plain));
    ASSERT_EQ(with.size(), without.size());
    for (size_t i = 0; i < with.size(); ++i) {
      EXPECT_GT(with[i].gpu_error, 0) << with[i].name;
      EXPECT_EQ(without[i].gpu_error, 0) << without[i].name;
      EXPECT_EQ(without[i].combined_error, 0) << without[i].name;
    }
  }
}

TEST(Split, ResidualTypeFollowsLlamaCppFallbacks) {
  EXPECT_EQ(residual_type(4, 2048), GgmlType::Q4_K);
  EXPECT_EQ(residual_type(4, 1408), GgmlType::Q5_0);
  EXPECT_EQ(residual_type(6, 1408), GgmlType::Q8_0);
  EXPECT_EQ(residual_type(8, 1408), GgmlType::Q8_0);
  EXPECT_EQ(residual_type(2, 1408), GgmlType::Q4_0);
  EXPECT_THROW(residual_type(7, 2048), Error);
}

// Each refused input: an Error, and no output file (the writer renames only a finished file).
TEST(Split, RefusesBadInputAndLeavesNoOutput) {
  const fs::path out = temp_dir() / "refused.gguf";
  auto refused = [&](const SplitOptions& opt, const std::string& what) {
    EXPECT_THROW(split_model(opt, nullptr), Error) << what;
    EXPECT_FALSE(fs::exists(out)) << what;
  };
  refused({.model = (temp_dir() / "missing.gguf").string(), .out = out.string()}, "missing file");
  refused({.model = kTiny.string(), .out = out.string(), .gpu_bits = 5}, "5-bit W^Q");
  refused({.model = kTiny.string(), .out = out.string(), .group = 32}, "group of 32");
  refused({.model = kTiny.string(), .out = out.string(), .residual_bits = 7}, "7-bit residual");
  // Truncated: the header promises more tensor data than the file holds.
  const fs::path cut = temp_dir() / "cut.gguf";
  fs::copy_file(kTiny, cut, fs::copy_options::overwrite_existing);
  fs::resize_file(cut, fs::file_size(kTiny) / 2);
  refused({.model = cut.string(), .out = out.string()}, "truncated file");
  // A split file split again.
  const fs::path once = temp_dir() / "once.gguf";
  split_model({.model = kTiny.string(), .out = once.string(), .threads = 1}, nullptr);
  refused({.model = once.string(), .out = out.string()}, "already split");
  // The output would overwrite the input.
  EXPECT_THROW(split_model({.model = once.string(), .out = once.string()}, nullptr), Error);
  EXPECT_TRUE(fs::exists(once));
  // Damaged weights: a NaN in an expert tensor of an otherwise valid F32 model.
  const fs::path dense = temp_dir() / "nan.gguf";
  make_model({.preset = "tiny-deepseek-v3", .out_path = dense.string(), .type = "F32", .seed = 3}, nullptr);
  {
    const gguf::GgufFile f = gguf::GgufFile::open(dense.string());
    const gguf::TensorInfo* t = f.find_tensor("blk.1.ffn_up_exps.weight");
    ASSERT_TRUE(t);
    const size_t offset = static_cast<size_t>(t->data - f.bytes().data()) + 4 * 100;
    std::fstream io(dense, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(static_cast<std::streamoff>(offset));
    const float nan = NAN;
    io.write(reinterpret_cast<const char*>(&nan), sizeof nan);
  }
  refused({.model = dense.string(), .out = out.string()}, "NaN weight");
}

// A source split: every routed expert tensor stays as it was (same name, same bytes) with its W^Q next to it, no W^R,
// and the report's W^Q errors are those of the written W^Q.
TEST(Split, SourceSplitKeepsTheExpertsNextToTheirWq) {
  const fs::path out = temp_dir() / "tiny.source.split.gguf";
  const std::vector<SplitTensorReport> report = split_model({.model = kTiny.string(),
                                                             .out = out.string(),
                                                             .threads = 2,
                                                             .critical_from = model::CriticalFrom::kSource,
                                                             .measure_errors = true},
                                                            nullptr);
  const gguf::GgufFile src = gguf::GgufFile::open(kTiny.string());
  const gguf::GgufFile dst = gguf::GgufFile::open(out.string());
  EXPECT_EQ(dst.get_string(model::kSplitCriticalFromKey), "source");
  EXPECT_FALSE(dst.find(model::kSplitResidualBitsKey));
  EXPECT_EQ(dst.get_string(model::kSplitGpuTypeKey), "HQ2_G64");
  size_t n_split = 0;
  for (const gguf::TensorInfo& t : src.tensors()) {
    const gguf::TensorInfo* copy = dst.find_tensor(t.name);
    ASSERT_TRUE(copy) << t.name;
    EXPECT_EQ(copy->type, t.type);
    EXPECT_EQ(std::memcmp(copy->data, t.data, t.nbytes), 0) << t.name;
    if (!model::is_routed_expert_tensor(t.name)) continue;
    EXPECT_FALSE(dst.find_tensor(model::split_residual_name(t.name))) << t.name;
    const gguf::TensorInfo* q = dst.find_tensor(model::split_gpu_name(t.name));
    ASSERT_TRUE(q) << t.name;
    EXPECT_EQ(q->type, GgmlType::HQ2_G64);
    const std::vector<float> w = rows_of(t), wq = rows_of(*q);
    double norm = 0, eq = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      norm += static_cast<double>(w[i]) * w[i];
      eq += std::pow(static_cast<double>(w[i]) - wq[i], 2);
    }
    ASSERT_LT(n_split, report.size());
    const SplitTensorReport& rep = report[n_split++];
    EXPECT_EQ(rep.residual_type, t.type);
    EXPECT_NEAR(rep.gpu_error, std::sqrt(eq / norm), 1e-6);
    EXPECT_GT(rep.gpu_error, 0.1);
    EXPECT_EQ(rep.combined_error, 0.0);
  }
  EXPECT_EQ(n_split, 6u);
}

// Mean KL divergence of b's next-token distributions from a's over the same tokens.
double mean_kl(model::Model& a, model::Model& b, const std::vector<int32_t>& tokens) {
  auto logits = [&](model::Model& m) {
    model::KvCache cache = m.make_cache(static_cast<int64_t>(tokens.size()));
    std::vector<float> out;
    m.forward(tokens, 0, cache, true, out);
    return out;
  };
  const std::vector<float> la = logits(a), lb = logits(b);
  const int64_t n_vocab = a.config().n_vocab;
  double total = 0;
  for (size_t t = 0; t < tokens.size(); ++t) {
    auto log_softmax = [&](const std::vector<float>& l) {
      const float* row = &l[t * n_vocab];
      const double top = *std::max_element(row, row + n_vocab);
      double sum = 0;
      for (int64_t i = 0; i < n_vocab; ++i) sum += std::exp(row[i] - top);
      std::vector<double> out(n_vocab);
      for (int64_t i = 0; i < n_vocab; ++i) out[i] = row[i] - top - std::log(sum);
      return out;
    };
    const std::vector<double> p = log_softmax(la), q = log_softmax(lb);
    for (int64_t i = 0; i < n_vocab; ++i) total += std::exp(p[i]) * (p[i] - q[i]);
  }
  return total / static_cast<double>(tokens.size());
}

// A split model runs: with every expert's residual it is close to the model it came from, W^Q alone is far, and
// each critical expert added in between brings it closer (the README's KL table, on two of its models).
TEST(Split, SplitModelApproachesTheSourceAsResidualsAreAdded) {
  std::vector<int32_t> tokens;
  for (int i = 0; i < 48; ++i) tokens.push_back((i * 37 + 11) % 500);
  // Qwen3.5 and DeepSeek-V4 at the tiny models' dimensions with experts a split group takes (make-model).
  for (const char* preset : {"mini-qwen3.5-moe", "mini-deepseek-v4"})
    make_model({.preset = preset, .out_path = (temp_dir() / (std::string(preset) + ".gguf")).string(), .threads = 2});
  for (const char* name :
       {"tiny-deepseek3-Q4_K_M.gguf", "tiny-qwen3moe-Q4_K_M.gguf", "mini-qwen3.5-moe.gguf", "mini-deepseek-v4.gguf"}) {
    const fs::path src =
        std::string(name).starts_with("mini-") ? temp_dir() / name : fs::path(HETMOE_TEST_DATA_DIR) / "models" / name;
    const fs::path out = temp_dir() / (std::string(name) + ".split");
    split_model({.model = src.string(), .out = out.string(), .threads = 2}, nullptr);
    auto base = model::Model::load(src.string(), 2);
    auto split = model::Model::load(out.string(), 2);
    ASSERT_TRUE(split->split());
    EXPECT_FALSE(base->split());
    std::vector<double> kl;
    for (int64_t r : {0, 1, 2, -1}) {
      split->set_critical(r);
      kl.push_back(mean_kl(*base, *split, tokens));
    }
    EXPECT_LT(kl[3], 0.01) << name;
    EXPECT_GT(kl[0], 5 * kl[3]) << name;
    // Each residual added brings the split closer, until every routed expert adds it (Qwen3.5's and DeepSeek-V4's
    // toys route to 2: critical 2 is all of them).
    const std::vector<int64_t> critical = {0, 1, 2, base->config().n_expert_used};
    for (size_t i = 1; i < kl.size(); ++i) {
      if (critical[i - 1] >= base->config().n_expert_used) {
        EXPECT_EQ(kl[i], kl[i - 1]) << name << " step " << i;
      } else {
        EXPECT_LT(kl[i], kl[i - 1]) << name << " step " << i;
      }
    }
  }
}

// A source split on the CPU alone runs every expert from the source: the source model's logits exactly. With its W^Q
// on the emulated device, the non-critical items run there; each critical expert brings it closer, and with all
// of them critical it is the source model again (to float rounding).
TEST(Split, SourceSplitRunsCriticalExpertsExactly) {
  const fs::path out = temp_dir() / "exact.source.split.gguf";
  split_model(
      {.model = kTiny.string(), .out = out.string(), .threads = 2, .critical_from = model::CriticalFrom::kSource},
      nullptr);
  std::vector<int32_t> tokens;
  for (int i = 0; i < 24; ++i) tokens.push_back((i * 41 + 5) % 500);
  auto base = model::Model::load(kTiny.string(), 2);
  auto split = model::Model::load(out.string(), 2);
  ASSERT_TRUE(split->split());
  auto logits = [&](model::Model& m) {
    model::KvCache cache = m.make_cache(static_cast<int64_t>(tokens.size()));
    std::vector<float> v;
    m.forward(tokens, 0, cache, true, v);
    return v;
  };
  const std::vector<float> want = logits(*base);
  for (int64_t r : {0, 2}) {
    split->set_critical(r);
    EXPECT_EQ(logits(*split), want) << "critical " << r;
  }
  auto dev = device::make_emulated_device({.capacity = 20'000'000});
  auto on_device = model::Model::load(out.string(), 2);
  on_device->attach_device(*dev, {.budget_bytes = 10'000'000, .admissions = 0, .prefetch = 0}, false);
  ASSERT_EQ(on_device->device_experts()->resident_experts(), 36);  // every W^Q
  std::vector<double> kl;
  for (int64_t r : {0, 1, 2, -1}) {
    on_device->set_critical(r);
    kl.push_back(mean_kl(*base, *on_device, tokens));
  }
  EXPECT_GT(kl[0], 0.01);
  EXPECT_LT(kl[1], kl[0]);
  EXPECT_LT(kl[2], kl[1]);
  EXPECT_LT(kl[3], 1e-6);
}

TEST(Split, LoadRefusesAnotherLayoutVersion) {
  const fs::path once = temp_dir() / "version.split.gguf";
  split_model({.model = kTiny.string(), .out = once.string(), .threads = 2}, nullptr);
  const gguf::GgufFile f = gguf::GgufFile::open(once.string());
  gguf::GgufWriter w;
  for (const auto& [key, value] : f.metadata())
    w.set(key, key == model::kSplitVersionKey ? gguf::Value::u32(quant::kLowBitLayoutVersion + 1) : value);
  for (const gguf::TensorInfo& t : f.tensors())
    w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne.begin(), t.ne.begin() + t.n_dims),
                 [&t](std::span<uint8_t> out) { std::copy(t.data, t.data + t.nbytes, out.data()); });
  const fs::path other = temp_dir() / "version2.split.gguf";
  w.write(other.string());
  try {
    model::Model::load(other.string(), 1);
    ADD_FAILURE() << "loaded a split file of another layout version";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layout version"), std::string::npos) << e.what();
  }
}

// Records each MoE layer's routing: expert ids and raw weights per token.
struct RoutingTrace : model::Trace {
  std::map<int64_t, std::vector<int32_t>> experts;
  std::map<int64_t, std::vector<float>> weights;
  void values(int64_t layer, std::string_view name, const float* data, int64_t rows, int64_t cols) override {
    if (name == "ffn_moe_weights") weights[layer].assign(data, data + rows * cols);
  }
  void ids(int64_t layer, std::string_view name, const int32_t* data, int64_t rows, int64_t cols) override {
    if (name == "ffn_moe_topk") experts[layer].assign(data, data + rows * cols);
  }
};

// A split model with part of its experts on the emulated device: the same logits as on the CPU alone (to float
// rounding and one 8-bit rounding event it can cause), and exactly the transfers the plan implies. Of a source split
// (source = true) the critical items run on the CPU's source experts instead of adding residuals: with every item
// critical, the source model's logits.
void expect_planned_transfers(bool source) {
  const fs::path out = temp_dir() / (source ? "device.source.split.gguf" : "device.split.gguf");
  split_model({.model = kTiny.string(),
               .out = out.string(),
               .threads = 2,
               .critical_from = source ? model::CriticalFrom::kSource : model::CriticalFrom::kResidual},
              nullptr);
  std::vector<int32_t> tokens;
  for (int i = 0; i < 12; ++i) tokens.push_back((i * 53 + 7) % 500);
  // Half the experts resident (the CPU runs the rest), then all of them (the CPU runs only residuals).
  // With moves on, experts of 2+ rows that are not resident are copied in for the step (two slots).
  struct Case {
    int64_t critical;
    size_t budget;
    int64_t move_rows;
  };
  for (const Case& cs : std::vector<Case>{{0, 1'000'000, 0},
                                          {2, 1'000'000, 0},
                                          {-1, 1'000'000, 0},
                                          {0, 10'000'000, 0},
                                          {2, 10'000'000, 0},
                                          {2, 1'000'000, 2},
                                          {-1, 1'000'000, 2}})
    for (const bool whole_pass : {false, true}) {
      const int64_t critical = cs.critical;
      const size_t budget = cs.budget;
      auto dev = device::make_emulated_device({.capacity = 20'000'000});  // outlives the model that uses it
      auto cpu_only = model::Model::load(out.string(), 2);
      cpu_only->set_critical(critical);
      auto on_device = model::Model::load(out.string(), 2);
      on_device->set_critical(critical);
      // 1 MB: the output head, the dense FFN, the shared experts and about half the routed ones (62 KB each).
      // The pass's own weights (norms, attention, routers: about 1.07 MB) come out of the budget first.
      on_device->attach_device(
          *dev,
          {.budget_bytes = budget + (whole_pass ? 1'100'000 : 0),
           .move_rows = cs.move_rows,
           .move_slots = 2,
           .admissions = 0,  // the placement at load stays (the residency's own test: DevicePass.Residency...)
           .prefetch = 0},
          whole_pass);
      ASSERT_EQ(on_device->pass_on_device(), whole_pass);
      model::DeviceExperts& held = *on_device->device_experts();
      if (cs.move_rows > 0) {
        ASSERT_EQ(held.move_slots(), 2);
      }
      ASSERT_GT(held.resident_experts(), 0);
      if (budget < 2'000'000)
        ASSERT_LT(held.resident_experts(), 32);
      else
        ASSERT_EQ(held.resident_experts(), 36);  // output head, the dense block's FFN, 2 x shared, 2 x 16 routed
      EXPECT_TRUE(held.resident(-1, model::DeviceExperts::kOutput));  // the output head
      EXPECT_TRUE(held.resident(0, model::DeviceExperts::kDense));    // the leading dense block's FFN
      EXPECT_TRUE(held.resident(1, model::DeviceExperts::kShared));   // the first MoE block's shared experts
      EXPECT_EQ(dev->transfers().to_device_bytes, held.resident_bytes() + on_device->pass_device_bytes());
      held.take_moves();

      // Prefill of 12 tokens, then one decode step.
      model::KvCache c1 = cpu_only->make_cache(16), c2 = on_device->make_cache(16);
      ASSERT_EQ(c2.device() != nullptr, whole_pass);
      std::vector<float> want, got;
      RoutingTrace trace;
      cpu_only->forward(tokens, 0, c1, true, want);
      const device::TransferStats before = dev->transfers();
      on_device->forward(tokens, 0, c2, true, got, &trace);
      const device::TransferStats after = dev->transfers();
      const std::vector<std::pair<int64_t, int64_t>> moves = held.take_moves();
      if (cs.move_rows > 0) {  // (a source split with every item critical leaves the device nothing to run)
        EXPECT_EQ(moves.empty(), source && critical < 0);
      }
      auto moved = [&](int64_t layer, int64_t e) {
        return std::find(moves.begin(), moves.end(), std::pair{layer, e}) != moves.end();
      };
      // Every token's logits to float rounding, but one: an activation value whose 8-bit rounding flips by one step
      // between the device's rows and the CPU's (inputs equal to float rounding) moves its token's logits by up to
      // about 1.5e-2 of their scale (1.2e-2 seen, where the CPU's Q4_K dots sum their float lanes in another order). (A
      // source split on the CPU alone is the source model: the same only when every item is critical.)
      float scale = 0;
      for (float v : want) scale = std::max(scale, std::abs(v));
      const size_t vocab = want.size() / tokens.size();
      int events = 0;
      for (size_t t = 0; t < tokens.size() && (!source || critical < 0); ++t) {
        float diff = 0;
        for (size_t j = t * vocab; j < (t + 1) * vocab; ++j) diff = std::max(diff, std::abs(want[j] - got[j]));
        if (diff > 2e-3f * scale) ++events;
        EXPECT_LE(diff, 1.5e-2f * scale) << "critical " << critical << " token " << t;
      }
      EXPECT_LE(events, 1) << "critical " << critical;

      // The plan. Host pass: per MoE layer, the input rows of the items of resident experts (the shared experts
      // included) go up and their down rows come back; experts with a critical item also send up the residual's gate
      // and up rows and bring back the hidden rows. Device pass: the embeddings and the RoPE table go up once; per MoE
      // layer the router's logits and the normed rows come down, the rows to gather, the combine's rows and weights
      // and (when the CPU computed anything) the CPU's part go up, the residual rows as before; with a trace, the
      // residual stream comes down after each layer; the output head's rows come down.
      const model::ModelConfig& c = on_device->config();
      const int64_t nu = c.n_expert_used, n = static_cast<int64_t>(tokens.size()), E = c.n_embd;
      uint64_t up = 0, down = 0;
      if (whole_pass) {
        up += 4 * n * (E + c.rope.n_dims);
        down += 4 * n * E * c.n_layer;  // the trace's l_out
      }
      // The rows the output head reads come down on a device pass (checked for NaN on the host; the CPU head reads
      // them there); a resident head's logits come down too.
      if (whole_pass) down += 4 * n * E;
      if (held.resident(-1, model::DeviceExperts::kOutput)) {  // the output head: every token's row up, logits down
        up += whole_pass ? 0 : 4 * n * E;
        down += 4 * n * c.n_vocab;
      }
      for (int64_t l = 0; l < c.n_layer; ++l)
        if (!c.is_moe_layer(l)) {
          if (held.resident(l, model::DeviceExperts::kDense)) {  // a dense block's FFN: every token
            up += whole_pass ? 4 * n + 2 * 4 * n : 4 * n * E;
            down += whole_pass ? 0 : 4 * n * E;
          } else if (whole_pass) {
            up += 4 * n * E;
            down += 4 * n * E;
          }
        }
      for (const auto& [layer, ids] : trace.experts) {
        const std::vector<float>& w = trace.weights.at(layer);
        int64_t rows = 0;  // rows of the layer's device work
        bool cpu_work = false, residuals = false;
        if (held.resident(layer, model::DeviceExperts::kShared)) {  // the shared experts: every token
          rows += n;
        } else {
          cpu_work = true;
        }
        for (int64_t e = 0; e < c.n_expert; ++e) {
          int64_t m = 0, m_critical = 0;
          for (int64_t t = 0; t < n; ++t)
            for (int64_t a = 0; a < nu; ++a) {
              if (ids[t * nu + a] != e) continue;
              ++m;
              int64_t above = 0;
              for (int64_t b = 0; b < nu; ++b)
                above += w[t * nu + b] > w[t * nu + a] || (w[t * nu + b] == w[t * nu + a] && b < a);
              m_critical += above < (critical < 0 ? nu : critical);
            }
          bool any_critical = m_critical > 0;
          if (!held.resident(layer, e) && !moved(layer, e)) {
            cpu_work |= m > 0;
            continue;
          }
          if (source) {  // the critical items run on the CPU's source expert: none of their rows move
            cpu_work |= any_critical;
            m -= m_critical;
            any_critical = false;
          }
          rows += m;
          residuals |= any_critical;
          up += any_critical ? 2 * 4 * m * c.n_ff_exp : 0;
          if (moved(layer, e)) {  // the expert's W^Q itself, copied in for the step
            const cpu::WeightMatrix& g = on_device->ffn_weights(layer).moe.gate_exps;
            const cpu::WeightMatrix& dn = on_device->ffn_weights(layer).moe.down_exps;
            up += 2 * g.row_bytes * c.n_ff_exp + dn.row_bytes * E;
          }
          down += any_critical ? 4 * m * c.n_ff_exp : 0;
        }
        if (!whole_pass) {
          up += 4 * rows * E;
          down += 4 * rows * E;
          continue;
        }
        down += 4 * n * (c.n_expert + E);
        if (rows == 0) {
          up += 4 * n * E;  // all on the CPU: its result goes up
          continue;
        }
        up += 4 * rows + 2 * 4 * n * (nu + 1) + (cpu_work || residuals ? 4 * n * E : 0);
      }
      EXPECT_GT(up, 0u);
      EXPECT_EQ(after.to_device_bytes - before.to_device_bytes, up) << "critical " << critical;
      EXPECT_EQ(after.to_host_bytes - before.to_host_bytes, down) << "critical " << critical;
    }
}

TEST(Split, EmulatedDeviceRunsResidentExpertsWithThePlannedTransfers) { expect_planned_transfers(false); }
TEST(Split, EmulatedDeviceRunsSourceSplitWithThePlannedTransfers) { expect_planned_transfers(true); }

}  // namespace
}  // namespace hetmoe
