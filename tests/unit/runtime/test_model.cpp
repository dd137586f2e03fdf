// Model-level behaviour that the reference data does not pin down: routing rules in isolation, batch versus
// token-by-token evaluation, thread-count independence, the legacy fused attn_kv_b layout, metadata defaults.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <numeric>
#include <set>

#include "quant/ref.h"
#include "runtime/device/device.h"
#include "runtime/engine/session.h"
#include "runtime/error.h"
#include "runtime/gguf/reader.h"
#include "runtime/gguf/writer.h"
#include "runtime/model/config.h"
#include "runtime/model/make_model.h"
#include "runtime/model/model.h"
#include "runtime/model/moe.h"
#include "runtime/model/trace.h"
#include "tests/support/compare.h"
#include "tests/support/temp_dir.h"

namespace hetmoe {
namespace {

namespace fs = std::filesystem;
using model::Gating;
using model::RoutingParams;

const fs::path& temp_dir() { return test_support::temp_dir("hetmoe_model_"); }

// A tiny DeepSeek-V3-architecture model in F32, generated once for the suite.
const fs::path& tiny_f32() {
  static const fs::path path = [] {
    fs::path p = temp_dir() / "tiny-f32.gguf";
    make_model(MakeModelOptions{.preset = "tiny-deepseek-v3", .out_path = p.string(), .type = "F32", .seed = 7},
               nullptr);
    return p;
  }();
  return path;
}

class Capture : public model::Trace {
 public:
  void values(int64_t, std::string_view, const float*, int64_t, int64_t) override {}
  void ids(int64_t layer, std::string_view name, const int32_t* data, int64_t rows, int64_t cols) override {
    if (name == "ffn_moe_topk") topk[layer].assign(data, data + rows * cols);
  }
  std::map<int64_t, std::vector<int32_t>> topk;
};

// --- routing ---------------------------------------------------------------------------------------------------

TEST(Routing, SoftmaxTopKNormalised) {
  RoutingParams p{.n_expert = 4, .n_used = 2, .gating = Gating::kSoftmax, .norm = true};
  std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.0f};
  model::Routing r;
  model::route(p, logits.data(), nullptr, 1, r, nullptr, 0);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 2}));
  const double e1 = std::exp(3.0), e2 = std::exp(2.0);
  EXPECT_NEAR(r.weights[0], e1 / (e1 + e2), 1e-6);
  EXPECT_NEAR(r.weights[1], e2 / (e1 + e2), 1e-6);
  EXPECT_NEAR(logits[1], e1 / (std::exp(1.0) + e1 + e2 + 1.0), 1e-6) << "probabilities are written back";
}

TEST(Routing, BiasChoosesButDoesNotWeigh) {
  // Sigmoid gating with exp_probs_b: expert 3 has the lowest probability but wins through its bias; its mixing
  // weight is still its unbiased probability. Scale 2.5 applies after normalisation.
  RoutingParams p{.n_expert = 4, .n_used = 2, .gating = Gating::kSigmoid, .norm = true, .scale = 2.5f};
  std::vector<float> logits = {0.5f, 1.0f, 0.8f, -1.0f};
  const std::vector<float> bias = {0.0f, 0.0f, 0.0f, 2.0f};
  model::Routing r;
  model::route(p, logits.data(), bias.data(), 1, r, nullptr, 0);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{3, 1}));
  const double s3 = 1 / (1 + std::exp(1.0)), s1 = 1 / (1 + std::exp(-1.0));
  EXPECT_NEAR(r.weights[0], 2.5 * s3 / (s3 + s1), 1e-6);
  EXPECT_NEAR(r.weights[1], 2.5 * s1 / (s3 + s1), 1e-6);
}

TEST(Routing, ScaleOfOneOrZeroIsIgnoredAndNoNormKeepsProbabilities) {
  for (float scale : {0.0f, 1.0f}) {
    RoutingParams p{.n_expert = 3, .n_used = 1, .gating = Gating::kSoftmax, .norm = false, .scale = scale};
    std::vector<float> logits = {0.0f, 0.0f, std::log(2.0f)};
    model::Routing r;
    model::route(p, logits.data(), nullptr, 1, r, nullptr, 0);
    EXPECT_EQ(r.ids[0], 2);
    EXPECT_NEAR(r.weights[0], 0.5, 1e-6);
  }
}

TEST(Routing, GroupLimitedUsesTopTwoSumPerGroup) {
  // 8 experts in 4 groups of 2, keep 2 groups, pick 2 experts. Group 0 has the single best expert (0.9) but a weak
  // partner; groups 1 and 2 have the best top-2 sums, so expert 0 must not be chosen.
  RoutingParams p{.n_expert = 8, .n_used = 2, .gating = Gating::kSigmoid, .n_group = 4, .n_group_used = 2};
  const std::vector<float> probs = {0.9f, 0.05f, 0.6f, 0.5f, 0.55f, 0.52f, 0.3f, 0.3f};
  std::vector<float> logits(8);
  for (int i = 0; i < 8; ++i) logits[i] = std::log(probs[i] / (1 - probs[i]));  // sigmoid^-1
  model::Routing r;
  model::route(p, logits.data(), nullptr, 1, r, nullptr, 0);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 4}));
}

TEST(Routing, NormalisationClampsATinySum) {
  RoutingParams p{.n_expert = 2, .n_used = 1, .gating = Gating::kSigmoid, .norm = true};
  std::vector<float> logits = {-40.0f, -45.0f};  // sigmoid ~ 4e-18
  model::Routing r;
  model::route(p, logits.data(), nullptr, 1, r, nullptr, 0);
  EXPECT_EQ(r.ids[0], 0);
  EXPECT_NEAR(r.weights[0], (1 / (1 + std::exp(40.0))) / 6.103515625e-5, 1e-20);
}

// --- evaluation order -----------------------------------------------------------------------------------------

// Each token's routing: per layer, the chosen experts (as a sorted list) and the selection margin (the gap between
// the last chosen and the best unchosen probability), keyed by the token's position.
struct RoutingRecord : model::Trace {
  int64_t pos = 0;                                                      // position of the batch's first token
  std::map<std::pair<int64_t, int64_t>, std::vector<int32_t>> experts;  // (position, layer)
  std::map<std::pair<int64_t, int64_t>, float> margin;
  std::map<int64_t, std::vector<float>> probs;  // layer -> the last batch's probabilities
  void values(int64_t layer, std::string_view name, const float* data, int64_t rows, int64_t cols) override {
    if (name == "ffn_moe_probs") probs[layer].assign(data, data + rows * cols);
  }
  void ids(int64_t layer, std::string_view name, const int32_t* data, int64_t rows, int64_t cols) override {
    if (name != "ffn_moe_topk") return;
    const std::vector<float>& p = probs.at(layer);
    const int64_t n_expert = static_cast<int64_t>(p.size()) / rows;
    for (int64_t t = 0; t < rows; ++t) {
      std::vector<int32_t> chosen(data + t * cols, data + (t + 1) * cols);
      float lowest_chosen = INFINITY, best_other = -INFINITY;
      for (int64_t e = 0; e < n_expert; ++e) {
        const float v = p[t * n_expert + e];
        if (std::find(chosen.begin(), chosen.end(), e) != chosen.end())
          lowest_chosen = std::min(lowest_chosen, v);
        else
          best_other = std::max(best_other, v);
      }
      std::sort(chosen.begin(), chosen.end());
      experts[{pos + t, layer}] = chosen;
      margin[{pos + t, layer}] = lowest_chosen - best_other;
    }
  }
};

std::vector<float> logits_of(model::Model& m, const std::vector<int32_t>& tokens, const std::vector<int>& split,
                             RoutingRecord* routing = nullptr) {
  model::KvCache cache = m.make_cache(64);
  std::vector<float> all, part;
  int64_t pos = 0;
  for (int len : split) {
    std::vector<int32_t> chunk(tokens.begin() + pos, tokens.begin() + pos + len);
    if (routing) routing->pos = pos;
    m.forward(chunk, pos, cache, true, part, routing);
    all.insert(all.end(), part.begin(), part.end());
    pos += len;
  }
  return all;
}

TEST(Evaluation, BatchAndTokenByTokenAgree) {
  // Batches below kTileMinActs tokens run every dot product as decode does, so chunked prefill and one-token decode
  // through the KV cache give identical logits, for any thread count. Larger batches may use the tier's tile
  // kernels (the same integer sums, floats added per super-block): identical for any thread count, and equal to
  // decode within float rounding up to the first token whose expert set differs. Such a token must be a near tie
  // (selection margin below 1e-4 in decode); it and every later token, which attend to it, are not compared.
  const std::vector<int32_t> tokens = {3, 17, 42, 100, 7, 255, 256, 300, 11, 64, 128, 5, 400};
  const int64_t n_tokens = static_cast<int64_t>(tokens.size());
  for (const fs::path& file : {tiny_f32(), fs::path(HETMOE_TEST_DATA_DIR) / "models" / "tiny-qwen3moe-Q4_K_M.gguf",
                               fs::path(HETMOE_TEST_DATA_DIR) / "models" / "tiny-mixtral-Q4_K_M.gguf"}) {
    auto one = model::Model::load(file.string(), 1);
    auto three = model::Model::load(file.string(), 3);
    RoutingRecord decode_routing, batch_routing;
    const std::vector<float> decode = logits_of(*one, tokens, std::vector<int>(13, 1), &decode_routing);
    EXPECT_EQ(logits_of(*three, tokens, std::vector<int>(13, 1)), decode) << file << ": thread count changed decode";
    EXPECT_EQ(logits_of(*one, tokens, {3, 1, 2, 3, 3, 1}), decode) << file << ": chunked prefill differs";
    const std::vector<float> batch = logits_of(*one, tokens, {13}, &batch_routing);
    EXPECT_EQ(logits_of(*three, tokens, {13}), batch) << file << ": thread count changed the batch";
    int64_t compared = n_tokens;
    for (const auto& [key, chosen] : decode_routing.experts) {
      if (key.first >= compared || batch_routing.experts.at(key) == chosen) continue;
      EXPECT_LT(decode_routing.margin.at(key), 1e-4f)
          << file << ": token " << key.first << " layer " << key.second << " chose other experts without a near tie";
      compared = key.first;
    }
    EXPECT_GE(compared, n_tokens / 2) << file << ": too few tokens left to compare";
    // Per token, relative to the largest logit: rounding only, except that a quantized file may meet a discrete
    // event (reference README 7.4: a last-bit change moves one activation across an 8-bit rounding boundary, about
    // 1e-3 in the next layer, growing to a few percent), bounded as README 8 bounds logits (5e-2). At least half the
    // tokens must agree to rounding.
    const bool quantized = file != tiny_f32();
    const size_t n_vocab = decode.size() / tokens.size();
    float scale = 0;
    for (float v : decode) scale = std::max(scale, std::abs(v));
    int64_t at_rounding = 0;
    for (int64_t t = 0; t < compared; ++t) {
      float max_diff = 0;
      for (size_t i = t * n_vocab; i < (t + 1) * n_vocab; ++i)
        max_diff = std::max(max_diff, std::abs(batch[i] - decode[i]));
      at_rounding += max_diff <= 1e-4f * scale;
      EXPECT_LE(max_diff, (quantized ? 5e-2f : 1e-4f) * scale) << file << ": token " << t << " differs beyond bounds";
    }
    EXPECT_GE(at_rounding, n_tokens / 2) << file << ": batch and decode differ beyond rounding on most tokens";
  }
}

TEST(Evaluation, TwoNodePlacementBindsWeightsAndKeepsTheResult) {
  // A synthetic two-node machine: threads split between the nodes, each weight matrix's rows bound to the node that
  // computes them (node 1 does not exist here, so only node 0's part binds), and the logits stay bit-identical.
  const fs::path file = fs::path(HETMOE_TEST_DATA_DIR) / "models" / "tiny-qwen3moe-Q4_K_M.gguf";
  const std::vector<int32_t> tokens = {3, 17, 42, 100, 7};
  auto plain = model::Model::load(file.string(), 2);
  EXPECT_EQ(plain->numa_bound_bytes(), 0u) << "one node: nothing to bind";
  ASSERT_EQ(setenv("HETMOE_TOPOLOGY", "package:2 numa:1 core:1 pu:1", 1), 0);
  auto placed = model::Model::load(file.string(), 2);
  unsetenv("HETMOE_TOPOLOGY");
  ASSERT_NE(placed->pool().placement(), nullptr);
  EXPECT_EQ(placed->pool().placement()->threads_of_node.size(), 2u);
  EXPECT_GT(placed->numa_bound_bytes(), 0u);
  EXPECT_EQ(logits_of(*placed, tokens, {5}), logits_of(*plain, tokens, {5}));
}

TEST(Evaluation, ContextLimitAndBadTokensFailBeforeTouchingTheCache) {
  auto m = model::Model::load(tiny_f32().string(), 1);
  model::KvCache cache = m->make_cache(4);
  std::vector<float> logits;
  const std::vector<int32_t> three = {1, 2, 3}, two = {4, 5}, bad = {1, 512};
  m->forward(three, 0, cache, false, logits);
  EXPECT_THROW(m->forward(two, 3, cache, false, logits), Error);
  EXPECT_THROW(m->forward(bad, 3, cache, false, logits), Error);
  EXPECT_THROW(m->make_cache(1 << 30), Error) << "larger than the training context";
  const std::vector<int32_t> one = {4};
  m->forward(one, 3, cache, false, logits);  // the last position still works
}

TEST(Evaluation, CancelStopsAPrefillAndLeavesTheSessionAsItWas) {
  auto m = model::Model::load(tiny_f32().string(), 1);
  const std::vector<int32_t> first = {1, 2, 3}, second = {4, 5, 6, 7};
  engine::Session session(*m, 32);
  session.eval(first);
  std::atomic<bool> cancel{true};
  EXPECT_THROW(session.eval(second, &cancel), Cancelled);
  EXPECT_EQ(session.n_past(), 3) << "a cancelled batch adds nothing";
  cancel = false;
  const std::span<const float> resumed = session.eval(second, &cancel);
  const std::vector<float> got(resumed.begin(), resumed.end());
  EXPECT_EQ(session.n_past(), 7);

  engine::Session fresh(*m, 32);
  fresh.eval(first);
  const std::span<const float> want = fresh.eval(second);
  EXPECT_EQ(got, std::vector<float>(want.begin(), want.end())) << "the cancelled attempt left no trace";
}

// --- recurrent state (Qwen3.5's Gated DeltaNet) ----------------------------------------------------------------

std::vector<float> logits(std::span<const float> l) { return {l.begin(), l.end()}; }

// A session on a model with recurrent layers goes back exactly: after truncating to any earlier point (a checkpoint,
// between checkpoints, before the first) it restores the newest checkpoint before it and evaluates the kept tokens
// after it again as one batch; it then gives, bit for bit, the logits of a fresh session fed the same batches.
// Resuming after a cancelled prefill does too.
// DeepSeek-V4's window ring and compressor rows are such state too.
class RecurrentState : public testing::TestWithParam<std::string> {};

TEST_P(RecurrentState, TruncationAndCancelGiveTheFreshSessionsLogits) {
  auto m = model::Model::load((fs::path(HETMOE_TEST_DATA_DIR) / "models" / GetParam()).string(), 2);
  using Tokens = std::vector<int32_t>;
  const Tokens prompt = {3, 17, 42, 100, 7, 255, 256, 300}, reply = {11, 64, 128, 5}, next = {400, 77, 19};
  // A fresh session fed these batches: the logits of the last.
  auto fresh = [&](const std::vector<Tokens>& batches) {
    engine::Session f(*m, 64);
    std::vector<float> l;
    for (const Tokens& b : batches)
      if (!b.empty()) l = logits(f.eval(b));
    return l;
  };
  for (const int64_t keep : {int64_t{0}, int64_t{3}, int64_t{8}, int64_t{10}, int64_t{12}, int64_t{15}}) {
    SCOPED_TRACE(keep);
    engine::Session s(*m, 64);
    s.eval(prompt);  // checkpoint at 0
    for (int32_t t : reply) s.eval(Tokens{t});
    s.eval(next);  // checkpoint at 12
    const Tokens all = s.tokens();
    s.truncate(keep);
    std::vector<Tokens> batches;
    if (keep < 12) {  // from the checkpoint at 0: the kept tokens in one batch
      EXPECT_EQ(s.replay_pending(), keep);
      batches = {Tokens(all.begin(), all.begin() + keep)};
    } else {  // from the checkpoint at 12 (nothing to replay when nothing was dropped): the same batches as before
      EXPECT_EQ(s.replay_pending(), keep == 15 ? 0 : keep - 12);
      batches = {prompt};
      for (int32_t t : reply) batches.push_back({t});
      batches.push_back(Tokens(all.begin() + 12, all.begin() + keep));
    }
    batches.push_back(next);
    EXPECT_EQ(logits(s.eval(next)), fresh(batches));
    EXPECT_EQ(s.n_past(), keep + 3);
  }
  // A cancelled prefill leaves the recurrent state half-updated: the next eval restores it.
  engine::Session s(*m, 64);
  s.eval(prompt);
  std::atomic<bool> cancel{true};
  EXPECT_THROW(s.eval(reply, &cancel), Cancelled);
  EXPECT_EQ(s.n_past(), 8);
  EXPECT_EQ(logits(s.eval(reply)), fresh({prompt, reply}));
}

INSTANTIATE_TEST_SUITE_P(Models, RecurrentState,
                         testing::Values("tiny-qwen35moe-Q4_K_M.gguf", "tiny-deepseek4-Q4_K_M.gguf"),
                         [](const testing::TestParamInfo<std::string>& info) {
                           return info.param.substr(5, info.param.find('-', 5) - 5);
                         });

// A cache's saved state (a server's prefix cache) continues exactly where it was saved: loaded into the cache after
// other tokens went in, or into a new cache of another size, the next batch gives the logits of the uninterrupted
// run, bit for bit, on an attention model, on Qwen3.5 and on DeepSeek-V4; and on a device cache. A state of other
// layers, or of a position the recurrent state is not at, is refused.
TEST(CacheState, SavedStatesContinueAsTheUninterruptedRun) {
  const fs::path data = fs::path(HETMOE_TEST_DATA_DIR) / "models";
  const std::vector<int32_t> prompt = {3, 17, 42, 100, 7, 255, 256, 300, 11, 64}, detour = {5, 6, 7, 8, 9},
                             next = {400, 77, 19};
  for (const char* name : {"tiny-deepseek3-Q4_K_M.gguf", "tiny-qwen35moe-Q4_K_M.gguf", "tiny-deepseek4-Q4_K_M.gguf"})
    for (const bool on_device : {false, true}) {
      SCOPED_TRACE(std::string(name) + (on_device ? " on the emulated device" : ""));
      auto dev = device::make_emulated_device({.capacity = 100'000'000});
      auto m = model::Model::load((data / name).string(), 2);
      if (on_device) m->attach_device(*dev, {.budget_bytes = 80'000'000});
      std::vector<float> want, got, scratch;
      {
        model::KvCache fresh = m->make_cache(32);
        m->forward(prompt, 0, fresh, false, scratch);
        m->forward(next, 10, fresh, false, want);
      }
      model::KvCache cache = m->make_cache(32);
      EXPECT_EQ(cache.device() != nullptr, on_device);
      m->forward(prompt, 0, cache, false, scratch);
      const model::CacheState state = cache.save(10);
      EXPECT_GT(state.bytes(), 0u);
      m->forward(detour, 10, cache, false, scratch);
      if (cache.has_recurrent()) {
        EXPECT_THROW(cache.save(10), Error) << "the state is at 15";
      }
      cache.load(state);
      m->forward(next, 10, cache, false, got);
      EXPECT_EQ(got, want);
      model::KvCache other = m->make_cache(24);
      other.load(state);
      m->forward(next, 10, other, false, got);
      EXPECT_EQ(got, want);
      model::KvCache small = m->make_cache(8);
      EXPECT_THROW(small.load(state), Error);
    }
  auto a = model::Model::load((data / "tiny-deepseek3-Q4_K_M.gguf").string(), 1);
  auto b = model::Model::load((data / "tiny-qwen3moe-Q4_K_M.gguf").string(), 1);
  model::KvCache ca = a->make_cache(16), cb = b->make_cache(16);
  EXPECT_THROW(cb.load(ca.save(0)), Error);
}

// 150 token ids, and every position's logits of them evaluated `chunk` tokens at a time (a cache of 160).
std::vector<int32_t> long_sequence() {
  std::vector<int32_t> tokens(150);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 37 + 11) % 509);
  return tokens;
}
std::vector<float> logits_in_chunks(model::Model& m, const std::vector<int32_t>& tokens, int chunk) {
  model::KvCache cache = m.make_cache(160);
  std::vector<float> all, part;
  for (size_t pos = 0; pos < tokens.size(); pos += static_cast<size_t>(chunk)) {
    const size_t len = std::min(static_cast<size_t>(chunk), tokens.size() - pos);
    m.forward(std::span<const int32_t>(tokens).subspan(pos, len), static_cast<int64_t>(pos), cache, true, part);
    all.insert(all.end(), part.begin(), part.end());
  }
  return all;
}

// DeepSeek-V4 over 150 positions: past the sliding window (its ring wraps twice), many CSA blocks and the first HCA
// block (128 positions). Token by token and in chunks of 3 (below the tile kernels' batch) the logits are
// bit-identical: the ring, the compressor rows and the block entries carry over exactly between calls.
TEST(DeepSeek4, LongSequencesAgreeInAnyBatching) {
  auto m = model::Model::load((fs::path(HETMOE_TEST_DATA_DIR) / "models" / "tiny-deepseek4-Q4_K_M.gguf").string(), 2);
  const std::vector<int32_t> tokens = long_sequence();
  auto run = [&](int chunk) { return logits_in_chunks(*m, tokens, chunk); };
  EXPECT_EQ(run(3), run(1));
}

// The same at F32 (make-model's tiny-deepseek-v4, whose activations are not quantized, so a batch differs from
// decode by float rounding only and no rounding event of a quantized activation is amplified): one batch of 150,
// which the attention runs in chunks of queries over the window's ring, gives decode's logits.
TEST(DeepSeek4, OneLongBatchGivesDecodesLogits) {
  const fs::path path = temp_dir() / "tiny-deepseek-v4-f32.gguf";
  make_model({.preset = "tiny-deepseek-v4", .out_path = path.string(), .type = "F32", .threads = 2});
  auto m = model::Model::load(path.string(), 2);
  const std::vector<int32_t> tokens = long_sequence();
  auto run = [&](int chunk) { return logits_in_chunks(*m, tokens, chunk); };
  const std::vector<float> decode = run(1), batch = run(150), chunks = run(70);
  ASSERT_EQ(batch.size(), decode.size());
  EXPECT_LT(test_support::relative_rms(batch, decode), 1e-4);
  EXPECT_LT(test_support::relative_rms(chunks, decode), 1e-4);
}

// The cache's checkpoints: taken at the state's position, dropped past a rollback, the oldest dropped beyond the
// maximum; a forward pass refuses a batch anywhere but at the state's position.
TEST(RecurrentCache, CheckpointsAndRollback) {
  auto m = model::Model::load((fs::path(HETMOE_TEST_DATA_DIR) / "models" / "tiny-qwen35moe-Q4_K_M.gguf").string(), 1);
  model::KvCache cache = m->make_cache(32);
  ASSERT_TRUE(cache.has_recurrent());
  cache.set_max_checkpoints(2);
  std::vector<float> out;
  const std::vector<int32_t> four = {1, 2, 3, 4};
  for (int64_t pos = 0; pos < 12; pos += 4) {
    cache.checkpoint();
    m->forward(four, pos, cache, false, out);
  }
  EXPECT_EQ(cache.recurrent_pos(), 12);
  EXPECT_EQ(cache.checkpoints(), (std::vector<int64_t>{4, 8}));
  EXPECT_THROW(m->forward(four, 8, cache, false, out), Error) << "not at the state's position";
  EXPECT_EQ(cache.rollback(6), 4);
  EXPECT_EQ(cache.checkpoints(), (std::vector<int64_t>{4}));
  EXPECT_EQ(cache.rollback(2), 0) << "before every checkpoint: back to the start";
  EXPECT_TRUE(cache.checkpoints().empty());
  EXPECT_EQ(cache.recurrent_pos(), 0);
}

// --- the legacy fused attn_kv_b layout -------------------------------------------------------------------------

// Rewrites a split-MLA F32 file into the old layout: attn_kv_b {kv_lora, H*(nope+v)} whose rows are, per head,
// the nope rows of K (attn_k_b transposed back) followed by the v_head rows of V; no *_mla keys.
fs::path make_legacy(const fs::path& src_path) {
  const gguf::GgufFile src = gguf::GgufFile::open(src_path.string());
  const model::ModelConfig c = model::read_config(src);
  const int64_t H = c.n_head, nope = c.qk_nope, kvl = c.kv_lora_rank, vh = c.v_head, rope = c.qk_rope;
  gguf::GgufWriter w;
  for (auto [key, value] : src.metadata()) {
    if (key.ends_with("key_length_mla") || key.ends_with("value_length_mla")) continue;
    if (key.ends_with(".attention.key_length")) value = gguf::Value::u32(static_cast<uint32_t>(nope + rope));
    if (key.ends_with(".attention.value_length")) value = gguf::Value::u32(static_cast<uint32_t>(vh));
    w.set(key, value);
  }
  for (const gguf::TensorInfo& t : src.tensors()) {
    if (t.name.find("attn_v_b") != std::string::npos) continue;
    std::vector<int64_t> ne(t.ne.begin(), t.ne.begin() + t.n_dims);
    if (t.name.find("attn_k_b") == std::string::npos) {
      w.add_tensor_bytes(t.name, t.type, ne, std::vector<uint8_t>(t.data, t.data + t.nbytes));
      continue;
    }
    const std::string layer = t.name.substr(0, t.name.find(".attn_k_b"));
    const float* kb = reinterpret_cast<const float*>(t.data);  // [H][kvl][nope]
    const float* vb =
        reinterpret_cast<const float*>(src.find_tensor(layer + ".attn_v_b.weight")->data);  // [H][vh][kvl]
    std::vector<float> kvb(H * (nope + vh) * kvl);
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t d = 0; d < nope; ++d)
        for (int64_t j = 0; j < kvl; ++j) kvb[(h * (nope + vh) + d) * kvl + j] = kb[(h * kvl + j) * nope + d];
      for (int64_t v = 0; v < vh; ++v)
        for (int64_t j = 0; j < kvl; ++j) kvb[(h * (nope + vh) + nope + v) * kvl + j] = vb[(h * vh + v) * kvl + j];
    }
    std::vector<uint8_t> bytes(kvb.size() * sizeof(float));
    std::memcpy(bytes.data(), kvb.data(), bytes.size());
    w.add_tensor_bytes(layer + ".attn_kv_b.weight", quant::GgmlType::F32, {kvl, H * (nope + vh)}, std::move(bytes));
  }
  fs::path out = temp_dir() / "tiny-legacy.gguf";
  w.write(out.string());
  return out;
}

// Integers where weights belong (a norm stored as I32) are refused with a one-line error naming the tensor, not
// read as numbers; so is an id table (DeepSeek-V4's ffn_gate_tid2eid) stored as floats.
TEST(LoadErrors, IntegerTensorsOnlyWhereIdsBelong) {
  const fs::path data = fs::path(HETMOE_TEST_DATA_DIR) / "models";
  struct Case {
    const char* model;
    const char* tensor;
    quant::GgmlType type;
  };
  for (const Case c : {Case{"tiny-deepseek3-Q4_K_M.gguf", "blk.0.attn_norm.weight", quant::GgmlType::I32},
                       Case{"tiny-deepseek4-Q4_K_M.gguf", "blk.0.ffn_gate_tid2eid.weight", quant::GgmlType::F32}}) {
    const gguf::GgufFile src = gguf::GgufFile::open((data / c.model).string());
    gguf::GgufWriter w;
    for (const auto& [key, value] : src.metadata()) w.set(key, value);
    for (const gguf::TensorInfo& t : src.tensors()) {
      const bool swap = t.name == c.tensor;
      w.add_tensor_bytes(t.name, swap ? c.type : t.type, std::vector<int64_t>(t.ne.begin(), t.ne.begin() + t.n_dims),
                         std::vector<uint8_t>(t.data, t.data + t.nbytes));
    }
    const fs::path out = temp_dir() / (std::string("retyped-") + c.model);
    w.write(out.string());
    try {
      model::Model::load(out.string(), 1);
      ADD_FAILURE() << c.tensor << " as " << quant::type_info(c.type).name << " was accepted";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(c.tensor), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  }
}

TEST(Deepseek2, LegacyFusedKvbMatchesTheSplitLayout) {
  const std::vector<int32_t> tokens = {3, 17, 42, 100, 7, 255, 256, 300, 11};
  auto split = model::Model::load(tiny_f32().string(), 2);
  auto legacy = model::Model::load(make_legacy(tiny_f32()).string(), 2);
  ASSERT_EQ(legacy->config().qk_nope, split->config().qk_nope);
  const std::vector<float> a = logits_of(*split, tokens, {6, 1, 1, 1});
  const std::vector<float> b = logits_of(*legacy, tokens, {6, 1, 1, 1});
  ASSERT_EQ(a.size(), b.size());
  EXPECT_LT(test_support::relative_rms(a, b), 1e-5) << "absorbed and decompressed attention are the same function";
}

// --- the forward pass on a device ------------------------------------------------------------------------------

// The whole pass on the emulated device (norms, MLA or GQA attention with the KV cache there, the routers' logits
// down, every FFN resident): a prefill in chunks, then decode steps, give the CPU's logits to float rounding. The
// decompressed (legacy) MLA layout and an F32 model (weights the device runs exactly) are among the cases.
TEST(DevicePass, EmulatedDeviceGivesTheCpuLogitsForEveryArchitecture) {
  const std::vector<int32_t> tokens = {3, 17, 42, 100, 7, 255, 256, 300, 11, 64, 128};
  const fs::path data = fs::path(HETMOE_TEST_DATA_DIR) / "models";
  for (const fs::path& file :
       {tiny_f32(), make_legacy(tiny_f32()), data / "tiny-deepseek2lite-Q4_K_M.gguf",
        data / "tiny-deepseek3-Q4_K_M.gguf", data / "tiny-qwen3moe-Q4_K_M.gguf", data / "tiny-mixtral-Q4_K_M.gguf",
        data / "tiny-qwen35moe-Q4_K_M.gguf", data / "tiny-deepseek4-Q4_K_M.gguf"}) {
    auto dev = device::make_emulated_device({.capacity = 100'000'000});
    auto cpu = model::Model::load(file.string(), 2);
    auto on_device = model::Model::load(file.string(), 2);
    on_device->attach_device(*dev, {.budget_bytes = 80'000'000});
    ASSERT_TRUE(on_device->pass_on_device()) << file;
    ASSERT_GT(on_device->pass_device_bytes(), 0u);
    EXPECT_TRUE(on_device->device_experts()->resident(-1, model::DeviceExperts::kOutput));
    const std::vector<int> chunks = {6, 3, 1, 1};
    const std::vector<float> want = logits_of(*cpu, tokens, chunks);
    const std::vector<float> got = logits_of(*on_device, tokens, chunks);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_LT(test_support::relative_rms(got, want), 1e-4) << file;
    // The device's cache: a model without the pass refuses it, with a clear error.
    model::KvCache cache = on_device->make_cache(8);
    EXPECT_EQ(cache.device(), dev.get());
    std::vector<float> out;
    EXPECT_THROW(cpu->forward(std::vector<int32_t>{1}, 0, cache, false, out), Error);
  }
}

// The scheduler's policies executed: static keeps routed experts off the device, kt places the hottest of a routing
// trace's counts first, crossover moves experts from its threshold; every one gives the CPU's logits.
TEST(DevicePass, PoliciesPlaceAndMoveExpertsAsTheirPlansSay) {
  const fs::path file = fs::path(HETMOE_TEST_DATA_DIR) / "models" / "tiny-deepseek3-Q4_K_M.gguf";
  const std::vector<int32_t> tokens = {3, 17, 42, 100, 7, 255, 256, 300, 11, 64, 128};
  auto cpu = model::Model::load(file.string(), 2);
  const std::vector<float> want = logits_of(*cpu, tokens, {8, 1, 1, 1});
  // Warm counts: layer 2's expert 9 is the hottest, then layer 1's expert 4.
  std::vector<std::vector<double>> warm(3, std::vector<double>(16, 0.0));
  warm[2][9] = 10;
  warm[1][4] = 5;
  struct Case {
    std::string policy;
    size_t budget;
    int64_t move_rows;
  };
  for (const Case& c : {Case{"static", 10'000'000, 0}, Case{"kt", 2'600'000, 0}, Case{"crossover", 2'600'000, 1}}) {
    auto dev = device::make_emulated_device({.capacity = 20'000'000});
    auto m = model::Model::load(file.string(), 2);
    m->attach_device(*dev, {.budget_bytes = c.budget,
                            .move_rows = c.move_rows,
                            .move_slots = 2,
                            .policy = c.policy,
                            .cost = nullptr,
                            .isa = "",
                            .warm_counts = warm});
    model::DeviceExperts& held = *m->device_experts();
    EXPECT_EQ(held.policy(), c.policy);
    EXPECT_TRUE(held.resident(1, model::DeviceExperts::kShared)) << c.policy;
    int64_t routed = 0;
    for (int64_t l = 1; l < 3; ++l)
      for (int64_t e = 0; e < 16; ++e) routed += held.resident(l, e);
    if (c.policy == "static") {
      EXPECT_EQ(routed, 0);  // llama.cpp --cpu-moe
    } else {
      EXPECT_GT(routed, 0) << c.policy;
      EXPECT_LT(routed, 32) << c.policy;
      EXPECT_TRUE(held.resident(2, 9)) << c.policy;  // the hottest first, then the next
      EXPECT_TRUE(held.resident(1, 4)) << c.policy;
    }
    held.take_moves();
    const std::vector<float> got = logits_of(*m, tokens, {8, 1, 1, 1});
    // static moves nothing below 32 tokens; crossover from 1 row moves every expert that is not resident through
    // its two move slots in turn, so the CPU reads no routed expert.
    EXPECT_EQ(held.take_moves().empty(), c.policy != "crossover") << c.policy;
    if (c.policy == "crossover") {
      EXPECT_EQ(held.cpu_expert_bytes(), 0u);
    } else {
      EXPECT_GT(held.cpu_expert_bytes(), 0u) << c.policy;
    }
    ASSERT_EQ(got.size(), want.size());
    EXPECT_LT(test_support::relative_rms(got, want), 1e-4) << c.policy;
  }
  auto dev = device::make_emulated_device({});
  auto m = model::Model::load(file.string(), 2);
  EXPECT_THROW(m->attach_device(*dev, {.budget_bytes = 1'000'000, .policy = "fastest"}), Error);
}

// A routing override replaces the router's choice before the experts run, on the CPU and in the device pass, and an
// observer sees the replaced routing.
TEST(DevicePass, RoutingOverrideReplacesTheChoiceEverywhere) {
  struct Fixed : model::RoutingOverride {
    void reroute(int64_t, int64_t n, int64_t nu, int32_t* ids, float* weights) override {
      for (int64_t i = 0; i < n * nu; ++i) {
        ids[i] = static_cast<int32_t>(i % nu);
        weights[i] = 1.0f / static_cast<float>(nu);
      }
    }
  };
  struct Seen : model::RoutingObserver {
    std::vector<int32_t> ids;
    void routed(int64_t, int64_t n, int64_t nu, const int32_t* i, const float*) override {
      ids.insert(ids.end(), i, i + n * nu);
    }
  };
  const fs::path file = fs::path(HETMOE_TEST_DATA_DIR) / "models" / "tiny-deepseek3-Q4_K_M.gguf";
  const std::vector<int32_t> tokens = {3, 17, 42, 100};
  std::vector<std::vector<float>> logits;
  for (const bool on_device : {false, true}) {
    auto dev = device::make_emulated_device({});
    auto m = model::Model::load(file.string(), 2);
    if (on_device) m->attach_device(*dev, {.budget_bytes = 10'000'000});
    Fixed fixed;
    Seen seen;
    m->set_routing_override(&fixed);
    m->set_routing_observer(&seen);
    logits.push_back(logits_of(*m, tokens, {3, 1}));
    ASSERT_EQ(seen.ids.size(), 2u * 4u * 4u);  // 2 MoE layers x 4 tokens x 4 experts
    for (size_t i = 0; i < seen.ids.size(); ++i) EXPECT_EQ(seen.ids[i], static_cast<int32_t>(i % 4));
  }
  // The same replaced routing gives the same logits on the CPU and on the device.
  EXPECT_LT(test_support::relative_rms(logits[1], logits[0]), 1e-4);
}

// The residency cache at run time: experts placed from warm counts give way to the ones the routing now prefers
// (admitted by score with hysteresis, the coldest evicted, copied in the background), a step that leaves the link idle
// prefetches the next layer's hottest absent experts, which that layer's step then runs on the device; the logits stay
// the CPU's.
TEST(DevicePass, ResidencyAdmitsEvictsAndPrefetchesAsTheRoutingGoes) {
  struct Hot : model::RoutingOverride {  // every token: layer 1 to experts 8..11, layer 2 to experts 12..15
    void reroute(int64_t layer, int64_t n, int64_t nu, int32_t* ids, float*) override {
      for (int64_t i = 0; i < n * nu; ++i) ids[i] = static_cast<int32_t>((layer == 1 ? 8 : 12) + i % nu);
    }
  };
  const fs::path file = fs::path(HETMOE_TEST_DATA_DIR) / "models" / "tiny-deepseek3-Q4_K_M.gguf";
  std::vector<int32_t> tokens;
  for (int i = 0; i < 16; ++i) tokens.push_back((i * 37 + 5) % 500);
  const std::vector<int> decode(16, 1);
  Hot hot;
  auto cpu = model::Model::load(file.string(), 2);
  cpu->set_routing_override(&hot);
  const std::vector<float> want = logits_of(*cpu, tokens, decode);
  // The warm-up preferred experts 0..7 of both layers.
  std::vector<std::vector<double>> warm(3, std::vector<double>(16, 0.0));
  for (int64_t l = 1; l < 3; ++l)
    for (int64_t e = 0; e < 8; ++e) warm[l][e] = 1;
  auto dev = device::make_emulated_device({.capacity = 20'000'000});
  auto m = model::Model::load(file.string(), 2);
  m->set_routing_override(&hot);
  m->attach_device(*dev, {.budget_bytes = 2'500'000,
                          .move_rows = 1000,  // decode steps move nothing: the link is idle for prefetches
                          .move_slots = 2,
                          .policy = "crossover",
                          .warm_counts = warm});
  model::DeviceExperts& held = *m->device_experts();
  const int64_t slots = held.expert_slots();
  ASSERT_GE(slots, 3);
  ASSERT_LE(slots, 7);                                                        // fewer than the 8 hot experts
  for (int64_t e = 0; e < slots; ++e) EXPECT_TRUE(held.resident(1, e)) << e;  // warm start: ties in layer order
  const uint64_t up_before = dev->transfers().to_device_bytes;
  const std::vector<float> got = logits_of(*m, tokens, decode);

  const model::DeviceExperts::Traffic& t = held.traffic();
  EXPECT_GE(t.admissions, static_cast<uint64_t>(slots));  // every slot now holds a hot expert
  EXPECT_EQ(t.evictions, t.admissions);
  EXPECT_EQ(t.moves, 0u);
  int64_t hot_resident = 0;
  for (int64_t l = 1; l < 3; ++l)
    for (int64_t e = 0; e < 16; ++e) {
      if (!held.resident(l, e)) continue;
      EXPECT_GE(e, l == 1 ? 8 : 12) << "layer " << l;  // only hot experts stay
      ++hot_resident;
    }
  EXPECT_EQ(hot_resident, slots);
  const std::vector<sched::Residency::Change> changes = held.take_changes();
  ASSERT_EQ(changes.size(), t.admissions + t.evictions);
  EXPECT_FALSE(changes[0].admitted);  // an eviction makes the room for each admission
  EXPECT_TRUE(changes[1].admitted);
  // Hot experts that found no slot are prefetched before their layer's step, and used there.
  EXPECT_GT(t.prefetches, 0u);
  EXPECT_GT(t.prefetch_hits, 0u);
  EXPECT_LE(t.prefetch_hits, t.prefetches);
  // What went up: per step the rows and the combine (as in the plan test), plus one expert per admission or
  // prefetch: at least those experts' bytes.
  const cpu::WeightMatrix& g = m->ffn_weights(1).moe.gate_exps;
  const cpu::WeightMatrix& d = m->ffn_weights(1).moe.down_exps;
  const uint64_t expert = 2 * g.row_bytes * g.n_rows / 16 + d.row_bytes * d.n_rows / 16;
  EXPECT_GE(dev->transfers().to_device_bytes - up_before, (t.admissions + t.prefetches) * expert);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_LT(test_support::relative_rms(got, want), 1e-4);
}

// llama.cpp's rule under the static policy: a batch of 32 tokens or more moves every expert it routes to, through a
// ring of two move slots (each reused once the device is done with its expert), so the CPU reads no routed expert.
TEST(DevicePass, StaticMovesEveryExpertOfALargeBatchThroughTheRing) {
  const fs::path file = fs::path(HETMOE_TEST_DATA_DIR) / "models" / "tiny-deepseek3-Q4_K_M.gguf";
  std::vector<int32_t> tokens;
  for (int i = 0; i < 40; ++i) tokens.push_back((i * 53 + 7) % 500);
  auto cpu = model::Model::load(file.string(), 2);
  const std::vector<float> want = logits_of(*cpu, tokens, {40});
  auto dev = device::make_emulated_device({.capacity = 20'000'000});
  auto m = model::Model::load(file.string(), 2);
  m->attach_device(*dev, {.budget_bytes = 10'000'000, .move_slots = 2, .policy = "static"});
  model::DeviceExperts& held = *m->device_experts();
  ASSERT_EQ(held.move_slots(), 2);
  EXPECT_EQ(held.expert_slots(), 0);
  RoutingRecord routing;
  const std::vector<float> got = logits_of(*m, tokens, {40}, &routing);
  std::set<std::pair<int64_t, int64_t>> routed;  // (layer, expert) the batch chose
  for (const auto& [key, chosen] : routing.experts)
    for (int32_t e : chosen) routed.insert({key.second, e});
  const std::vector<std::pair<int64_t, int64_t>> moves = held.take_moves();
  const std::set<std::pair<int64_t, int64_t>> moved(moves.begin(), moves.end());
  EXPECT_EQ(moved, routed);
  EXPECT_EQ(moves.size(), routed.size());  // each once
  EXPECT_GT(moves.size(), 2u);             // more than the slots
  EXPECT_EQ(held.cpu_expert_bytes(), 0u);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_LT(test_support::relative_rms(got, want), 1e-4);
}

// A device too small for the pass's weights keeps the pass on the host, and a cache that does not fit next to them
// stays in host memory: both still give the CPU's logits.
TEST(DevicePass, FallsBackToTheHostWhenTheDeviceIsTooSmall) {
  const fs::path file = fs::path(HETMOE_TEST_DATA_DIR) / "models" / "tiny-qwen3moe-Q4_K_M.gguf";
  const std::vector<int32_t> tokens = {3, 17, 42, 100, 7};
  auto cpu = model::Model::load(file.string(), 2);
  const std::vector<float> want = logits_of(*cpu, tokens, {3, 1, 1});
  auto tiny = device::make_emulated_device({.capacity = 50'000});
  auto m = model::Model::load(file.string(), 2);
  m->attach_device(*tiny, {.budget_bytes = 50'000});
  EXPECT_FALSE(m->pass_on_device());
  EXPECT_EQ(logits_of(*m, tokens, {3, 1, 1}).size(), want.size());

  // Room for the pass's weights but not for a long cache: that cache is a host one.
  auto small = device::make_emulated_device({.capacity = 3'000'000});
  auto m2 = model::Model::load(file.string(), 2);
  m2->attach_device(*small, {.budget_bytes = 2'000'000});
  ASSERT_TRUE(m2->pass_on_device());
  EXPECT_EQ(m2->make_cache(40'000).device(), nullptr);
  const std::vector<float> got = logits_of(*m2, tokens, {3, 1, 1});
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-3 * (1 + std::abs(want[i])));
}

// --- metadata ------------------------------------------------------------------------------------------------

model::ModelConfig config_of_preset(const std::string& preset, int layers = -1) {
  const ModelPlan plan = plan_model(MakeModelOptions{.preset = preset, .out_path = "", .layers = layers});
  gguf::GgufWriter w;
  for (const auto& [key, value] : plan.metadata) w.set(key, value);
  const fs::path p = temp_dir() / (preset + "-meta.gguf");
  w.write(p.string());
  return model::read_config(gguf::GgufFile::open(p.string()));
}

TEST(Config, DeepseekYarnSoftmaxScale) {
  const model::ModelConfig v3 = config_of_preset("deepseek-v3");
  const double m3 = 1 + 0.1 * std::log(40.0);
  EXPECT_NEAR(v3.kq_scale, m3 * m3 / std::sqrt(192.0), 1e-6);
  EXPECT_EQ(v3.gating, Gating::kSigmoid);
  EXPECT_EQ(v3.n_group, 8);
  EXPECT_EQ(v3.n_leading_dense, 3);
  EXPECT_TRUE(v3.expert_weights_norm);
  const model::ModelConfig lite = config_of_preset("deepseek-v2-lite", 2);
  const double ml = 1 + 0.0707 * std::log(40.0);
  EXPECT_NEAR(lite.kq_scale, ml * ml / std::sqrt(192.0), 1e-5);
  EXPECT_EQ(lite.q_lora_rank, 0);
  EXPECT_EQ(lite.gating, Gating::kSoftmax);
  EXPECT_FALSE(lite.expert_weights_norm);
  const model::ModelConfig kimi = config_of_preset("kimi-k2");
  EXPECT_EQ(kimi.n_expert, 384);
  EXPECT_EQ(kimi.n_group, 1);
  EXPECT_NEAR(kimi.expert_weights_scale, 2.827f, 1e-6);
}

// A decode step reads the trunk: the MTP block's tensors (drafts only) are not in its bytes.
TEST(Config, ActiveBytesLeaveOutTheMtpBlock) {
  const fs::path p = temp_dir() / "active-bytes-mtp.gguf";
  make_model({.preset = "tiny-deepseek-v3", .out_path = p.string(), .type = "F32", .threads = 2, .mtp = true});
  const gguf::GgufFile file = gguf::GgufFile::open(p.string());
  const model::ModelConfig c = model::read_config(file);
  const std::string mtp_prefix = "blk." + std::to_string(c.n_layer) + ".";
  double mtp_bytes = 0;
  for (const gguf::TensorInfo& t : file.tensors())
    if (t.name.starts_with(mtp_prefix))
      mtp_bytes += static_cast<double>(t.nbytes) *
                   (t.name.find("_exps.") != std::string::npos ? static_cast<double>(c.n_expert_used) / c.n_expert : 1);
  ASSERT_GT(mtp_bytes, 0);
  model::ModelConfig all_trunk = c;
  all_trunk.n_layer += 1;
  EXPECT_NEAR(model::active_bytes_per_token(file, all_trunk) - model::active_bytes_per_token(file, c), mtp_bytes,
              1e-6 * mtp_bytes);
}

// The profile's parts: a block's attention tensors, a dense layer's FFN, a MoE layer's router and experts (routed ones
// by n_used of n_expert), the output head with its norm, and the rest (the embedding's row, the blocks' input norms).
TEST(Config, ActiveBytesByPartSplitTheTokensBytes) {
  const fs::path p = temp_dir() / "active-bytes-parts.gguf";
  make_model({.preset = "tiny-deepseek-v3", .out_path = p.string(), .type = "Q8_0", .threads = 2});
  const gguf::GgufFile file = gguf::GgufFile::open(p.string());
  const model::ModelConfig c = model::read_config(file);
  ASSERT_GT(c.n_leading_dense, 0);
  ASSERT_GT(c.n_layer, c.n_leading_dense);
  model::ActiveBytes want;
  for (const gguf::TensorInfo& t : file.tensors()) {
    const auto bytes = static_cast<double>(t.nbytes);
    int layer = -1;
    for (int l = 0; l < c.n_layer; ++l)
      if (t.name.starts_with("blk." + std::to_string(l) + ".")) layer = l;
    if (t.name == "token_embd.weight") {
      want.rest += static_cast<double>(t.row_bytes);
    } else if (t.name == "output.weight" || t.name == "output_norm.weight") {
      want.output += bytes;
    } else if (layer < 0) {
      continue;  // the MTP block, if any
    } else if (t.name.ends_with(".attn_norm.weight") || t.name.ends_with(".ffn_norm.weight")) {
      want.rest += bytes;
    } else if (t.name.find(".attn_") != std::string::npos) {
      want.attention += bytes;
    } else if (layer < c.n_leading_dense) {
      want.dense_ffn += bytes;
    } else {
      want.moe_ffn += t.name.find("_exps.") != std::string::npos
                          ? bytes * static_cast<double>(c.n_expert_used) / static_cast<double>(c.n_expert)
                          : bytes;
    }
  }
  const model::ActiveBytes got = model::active_bytes_by_part(file, c);
  for (const double part : {want.attention, want.dense_ffn, want.moe_ffn, want.output, want.rest}) EXPECT_GT(part, 0);
  EXPECT_NEAR(got.attention, want.attention, 1e-9 * want.total());
  EXPECT_NEAR(got.dense_ffn, want.dense_ffn, 1e-9 * want.total());
  EXPECT_NEAR(got.moe_ffn, want.moe_ffn, 1e-9 * want.total());
  EXPECT_NEAR(got.output, want.output, 1e-9 * want.total());
  EXPECT_NEAR(got.rest, want.rest, 1e-9 * want.total());
  EXPECT_NEAR(model::active_bytes_per_token(file, c), want.total(), 1e-9 * want.total());
}

TEST(Config, OldFilesWithoutGatingKeyDefaultToSoftmax) {
  const ModelPlan plan = plan_model(MakeModelOptions{.preset = "tiny-deepseek-v3", .out_path = ""});
  gguf::GgufWriter w;
  for (const auto& [key, value] : plan.metadata)
    if (!key.ends_with("expert_gating_func") && !key.ends_with("q_lora_rank")) w.set(key, value);
  const fs::path p = temp_dir() / "old-meta.gguf";
  w.write(p.string());
  const model::ModelConfig c = model::read_config(gguf::GgufFile::open(p.string()));
  EXPECT_EQ(c.gating, Gating::kSoftmax);
  EXPECT_EQ(c.q_lora_rank, 0) << "q_lora_rank is optional; the tensors decide";
}

}  // namespace
}  // namespace hetmoe
