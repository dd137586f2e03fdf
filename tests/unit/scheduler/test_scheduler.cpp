// The scheduler's pure logic: cost curves, the crossover of the cost model, the residency cache and each policy's
// plans on crafted routings.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <stdexcept>

#include "scheduler/cost_model.h"
#include "scheduler/machine.h"
#include "scheduler/policies.h"
#include "scheduler/residency.h"
#include "scheduler/routing_trace.h"
#include "scheduler/simulator.h"
#include "scheduler/step.h"

namespace hetmoe::sched {
namespace {

TEST(Curve, InterpolatesAndExtendsItsEnds) {
  const Curve c({1, 4, 8}, {1.0, 1.0, 3.0});
  EXPECT_DOUBLE_EQ(c.at(0), 0.0);
  EXPECT_DOUBLE_EQ(c.at(1), 1.0);
  EXPECT_DOUBLE_EQ(c.at(2), 1.0);
  EXPECT_DOUBLE_EQ(c.at(6), 2.0);
  EXPECT_DOUBLE_EQ(c.at(12), 5.0);  // the last segment's slope: 0.5 per row
  const Curve one({2}, {4.0});
  EXPECT_DOUBLE_EQ(one.at(1), 4.0);  // below the first point: its time
  EXPECT_DOUBLE_EQ(one.at(6), 12.0);
  EXPECT_THROW(Curve({}, {}), std::invalid_argument);
  EXPECT_THROW(Curve({1, 2}, {1.0}), std::invalid_argument);
  EXPECT_THROW(Curve({2, 1}, {1.0, 2.0}), std::invalid_argument);
}

// An expert of 10 MB and 1e9 flops per row.
ExpertShape expert_10mb() {
  ExpertShape e;
  e.bytes = e.device_bytes = 10e6;
  e.n_embd = 1000;
  e.n_ff = 1000000 / 6;  // 6 * n_embd * n_ff = 1e9 flops per row
  return e;
}

// Modelled CPU tiers reading DRAM at 20 GB/s: avx2 at cpu_flops, amx at 8x that.
CpuTier tier(const std::string& isa, double flops) {
  CpuTier t;
  t.isa = isa;
  t.bytes_per_s = 20e9;
  t.flops_per_s = flops;
  return t;
}

CostModel model(double cpu_flops, double link_bytes_per_s, bool gpu = true) {
  const std::vector<CpuTier> tiers = {tier("avx2", cpu_flops), tier("amx", cpu_flops * 8)};
  std::optional<GpuRates> rates;
  if (gpu) rates = GpuRates{.memory_bytes = 24e9, .bytes_per_s = 1e12, .flops_per_s = 100e12, .launch_s = 10e-6};
  return CostModel(tiers, {.bytes_per_s = link_bytes_per_s, .latency_s = 10e-6}, rates);
}

TEST(CostModel, CrossoverIsTheFirstRowCountWhereMovingPays) {
  const ExpertShape e = expert_10mb();
  const CostModel m = model(1e12, 25e9);
  // CPU: max(0.5 ms, r ms); move: 10 us + 0.4 ms; GPU: 10 us + max(10 us, r x 10 us).
  // Moving pays from the r with r ms >= 0.42 ms + 10 us x r: r = 1 (1 ms >= 0.43 ms).
  ASSERT_TRUE(m.crossover("avx2", e).has_value());
  for (int64_t r = 1; r < *m.crossover("avx2", e); ++r)
    EXPECT_GT(m.move_seconds(e.bytes) + m.gpu_seconds(e, r), m.cpu_seconds("avx2", e, r));
  const int64_t t = *m.crossover("avx2", e);
  EXPECT_LE(m.move_seconds(e.bytes) + m.gpu_seconds(e, t), m.cpu_seconds("avx2", e, t));
  // A CPU 10x faster and a 5 GB/s link: r x 100 us >= 2.01 ms + 10 us + r x 10 us from r = 23.
  const CostModel fast = model(10e12, 5e9);
  const double move = fast.move_seconds(e.bytes);
  int64_t want = 1;
  while (move + fast.gpu_seconds(e, want) > fast.cpu_seconds("avx2", e, want)) ++want;
  EXPECT_EQ(want, 23);
  EXPECT_EQ(fast.crossover("avx2", e), want);
  // The faster tier (AMX here, 8x) keeps far more rows on the CPU: r x 12.5 us >= 2.02 ms + r x 10 us from r = 808
  // (or 809 by the rounding of the equality).
  EXPECT_NEAR(static_cast<double>(fast.crossover("amx", e).value_or(0)), 808.5, 0.5);
  // No device, or a link so slow that moving never pays: no crossover.
  EXPECT_FALSE(model(1e12, 25e9, false).crossover("avx2", e).has_value());
  EXPECT_FALSE(model(1e14, 1e3).crossover("avx2", e, 4096).has_value());
  EXPECT_THROW(m.cpu_seconds("avx512", e, 1), std::invalid_argument);
}

TEST(CostModel, MeasuredCurvesScaleByBytesAndResidualsCostTheirBytes) {
  CpuTier t;
  t.isa = "avx2";
  t.curve = Curve({1, 16}, {1e-3, 2e-3});
  t.curve_bytes = 5e6;
  const CostModel m({t}, {.bytes_per_s = 25e9, .latency_s = 0}, std::nullopt);
  ExpertShape e = expert_10mb();
  e.residual_bytes = 2.5e6;
  EXPECT_DOUBLE_EQ(m.cpu_seconds("avx2", e, 1), 2e-3);        // twice the curve's expert
  EXPECT_DOUBLE_EQ(m.residual_seconds("avx2", e, 16), 1e-3);  // half of it
  EXPECT_DOUBLE_EQ(m.gpu_seconds(e, 4), 0.0);                 // no device
  CpuTier empty;
  empty.isa = "x";
  EXPECT_THROW(CostModel({empty}, {}, std::nullopt), std::invalid_argument);
}

LayerRouting routing(int64_t layer, int64_t n_tokens, std::vector<LayerRouting::Expert> experts) {
  return {.layer = layer, .n_tokens = n_tokens, .experts = std::move(experts)};
}

TEST(Residency, WarmStartTakesTheHottestExpertsOfAllLayers) {
  Residency r(2, 4, {.slots = 3});
  r.warm_start({{5, 0, 1, 9}, {7, 0, 0, 2}});
  EXPECT_TRUE(r.resident(0, 3));
  EXPECT_TRUE(r.resident(1, 0));
  EXPECT_TRUE(r.resident(0, 0));
  EXPECT_FALSE(r.resident(1, 3));
  EXPECT_EQ(r.used(), 3);
  EXPECT_EQ(r.hottest_absent(1, 5), (std::vector<int64_t>{3}));  // expert 1 and 2 never chosen there
  EXPECT_EQ(r.hottest_absent(0, 1), (std::vector<int64_t>{2}));
  EXPECT_THROW(r.warm_start({{1, 2, 3, 4}}), std::invalid_argument);
}

TEST(Residency, AdmitsByScoreWithHysteresisAndEvictsTheColdest) {
  Residency r(1, 4, {.slots = 2, .decay = 1.0, .gate_weight = 0.0, .hysteresis = 0.5});
  // Free slots: anything seen is admitted, at most one per step.
  auto c = r.observe(routing(0, 4, {{0, 4, 0, 0}, {1, 2, 0, 0}}));
  ASSERT_EQ(c.size(), 1u);
  EXPECT_TRUE(c[0].admitted);
  EXPECT_EQ(c[0].expert, 0);
  c = r.observe(routing(0, 4, {{2, 1, 0, 0}}));
  EXPECT_TRUE(r.resident(0, 2));  // the second free slot
  // Full: expert 1 (score 2) does not beat the coldest (expert 2, score 1) by half... 2 > 1.5 does.
  c = r.observe(routing(0, 1, {{1, 0, 0, 0}}));
  ASSERT_EQ(c.size(), 2u);
  EXPECT_FALSE(c[0].admitted);
  EXPECT_EQ(c[0].expert, 2);
  EXPECT_TRUE(c[1].admitted);
  EXPECT_EQ(c[1].expert, 1);
  // Expert 3 at score 2 does not beat the coldest resident (expert 1, score 2) by half: no change; at 4 it does.
  EXPECT_TRUE(r.observe(routing(0, 2, {{3, 2, 0, 0}})).empty());
  c = r.observe(routing(0, 2, {{3, 2, 0, 0}}));
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].expert, 1);
  EXPECT_TRUE(r.resident(0, 3));
  Residency fixed(1, 4, {.slots = 1, .adaptive = false});
  fixed.warm_start({{0, 1, 0, 0}});
  EXPECT_TRUE(fixed.observe(routing(0, 64, {{3, 64, 0, 0}})).empty());
  EXPECT_TRUE(fixed.resident(0, 1));
}

TEST(Residency, ExcludedLayersAndPrefetchedExperts) {
  Residency r(2, 4, {.slots = 2});
  r.exclude(0);  // the device cannot run layer 0's experts
  r.warm_start({{9, 9, 0, 0}, {0, 1, 2, 0}});
  EXPECT_FALSE(r.resident(0, 0));
  EXPECT_TRUE(r.resident(1, 2));
  EXPECT_TRUE(r.resident(1, 1));
  EXPECT_TRUE(r.observe(routing(0, 64, {{3, 64, 0, 1}})).empty());
  EXPECT_TRUE(r.hottest_absent(0, 4).empty());
  // Prefetched: one layer's set at a time, not listed as absent.
  r.observe(routing(1, 1, {{3, 1, 0, 0}}));
  EXPECT_EQ(r.hottest_absent(1, 4), (std::vector<int64_t>{3}));
  r.set_prefetched(1, {3});
  EXPECT_TRUE(r.prefetched(1, 3));
  EXPECT_FALSE(r.prefetched(0, 3));
  EXPECT_TRUE(r.hottest_absent(1, 4).empty());
  r.set_prefetched(0, {});
  EXPECT_FALSE(r.prefetched(1, 3));
  EXPECT_THROW(r.set_prefetched(1, {4}), std::out_of_range);
}

TEST(Residency, ScoresDecay) {
  Residency r(1, 2, {.slots = 1, .decay = 0.5, .gate_weight = 2.0});
  r.observe(routing(0, 1, {{1, 1, 0, 0.25}}));
  EXPECT_DOUBLE_EQ(r.score(0, 1), 1.5);
  r.observe(routing(0, 1, {{0, 1, 0, 1.0}}));
  EXPECT_DOUBLE_EQ(r.score(0, 1), 0.75);
  EXPECT_DOUBLE_EQ(r.score(0, 0), 3.0);
}

// Actions of a plan in routing order.
std::vector<Action> actions(const LayerPlan& p) {
  std::vector<Action> a;
  for (const ExpertStep& s : p.experts) a.push_back(s.action);
  return a;
}

class Policies : public ::testing::Test {
 protected:
  ExpertShape e = expert_10mb();
  CostModel cost = model(10e12, 5e9);  // crossover: 23 rows on avx2
  PolicyOptions opt = [] {
    PolicyOptions o;
    o.isa = "avx2";
    o.n_layer = 2;
    o.batch_threshold = 32;
    o.kt_prefill_tokens = 400;
    return o;
  }();
  int64_t threshold() const { return *cost.crossover("avx2", e); }
};

TEST_F(Policies, CpuRunsEverythingOnTheCpu) {
  auto p = make_policy("cpu", cost, e, opt);
  const LayerPlan plan = p->plan(routing(0, 512, {{1, 300, 0, 1}, {2, 1, 0, 1}}), nullptr);
  EXPECT_FALSE(plan.dense_on_device);
  EXPECT_EQ(actions(plan), (std::vector<Action>{Action::kCpuInPlace, Action::kCpuInPlace}));
}

TEST_F(Policies, StaticMovesWholeBatchesOf32TokensOrMore) {
  auto p = make_policy("static", cost, e, opt);
  EXPECT_TRUE(p->plan(routing(0, 1, {{1, 1, 0, 1}}), nullptr).dense_on_device);
  EXPECT_EQ(actions(p->plan(routing(0, 31, {{1, 31, 0, 1}, {2, 1, 0, 1}}), nullptr)),
            (std::vector<Action>{Action::kCpuInPlace, Action::kCpuInPlace}));
  EXPECT_EQ(actions(p->plan(routing(0, 32, {{1, 31, 0, 1}, {2, 1, 0, 1}}), nullptr)),
            (std::vector<Action>{Action::kMove, Action::kMove}));
}

TEST_F(Policies, KtKeepsItsResidentExpertsAndMovesLongPrefills) {
  auto p = make_policy("kt", cost, e, opt);
  ASSERT_TRUE(p->traits().uses_residency);
  EXPECT_FALSE(p->traits().adapts_residency);
  Residency r(2, 4, {.slots = 1, .adaptive = false});
  r.warm_start({{0, 0, 9, 0}, {0, 0, 0, 0}});
  EXPECT_EQ(actions(p->plan(routing(0, 8, {{1, 8, 0, 1}, {2, 8, 0, 1}}), &r)),
            (std::vector<Action>{Action::kCpuInPlace, Action::kGpuResident}));
  EXPECT_EQ(actions(p->plan(routing(0, 400, {{1, 200, 0, 1}, {2, 200, 0, 1}}), &r)),
            (std::vector<Action>{Action::kMove, Action::kGpuResident}));
}

TEST_F(Policies, CrossoverMovesAnExpertFromItsThreshold) {
  auto p = make_policy("crossover", cost, e, opt);
  const int64_t t = threshold();
  Residency r(2, 4, {.slots = 1});
  r.warm_start({{0, 0, 0, 5}, {0, 3, 7, 0}});  // expert 2 of layer 1 takes the slot
  const LayerPlan plan = p->plan(routing(1, t, {{0, t - 1, 0, 1}, {1, t, 0, 1}, {2, 1, 1, 1}}), &r);
  EXPECT_EQ(actions(plan), (std::vector<Action>{Action::kCpuInPlace, Action::kMove, Action::kGpuResident}));
  EXPECT_EQ(plan.experts[2].critical_rows, 0);  // not a split policy: no residual rows
  EXPECT_TRUE(plan.prefetch.empty());           // the last layer
  // Layer 1's hottest absent expert is prefetched once the routing shows that a token likely picks it: expert 1 had
  // 3 rows of 4 tokens (share 0.75); one token's step picks it with probability 0.75, expert 3 (0.25) is too unlikely.
  EXPECT_TRUE(p->plan(routing(0, 1, {{0, 1, 0, 1}}), &r).prefetch.empty());  // nothing observed yet
  r.observe(routing(1, 4, {{1, 3, 0, 1}, {2, 4, 0, 1}, {3, 1, 0, 1}}));
  EXPECT_DOUBLE_EQ(r.share(1, 1), 0.75);
  EXPECT_EQ(p->plan(routing(0, 1, {{0, 1, 0, 1}}), &r).prefetch, (std::vector<int64_t>{1}));
  PolicyOptions two = opt;
  two.prefetch = 2;
  EXPECT_EQ(make_policy("crossover", cost, e, two)->plan(routing(0, 1, {{0, 1, 0, 1}}), &r).prefetch,
            (std::vector<int64_t>{1}));
  // A step of 4 tokens picks expert 3 with probability 1 - 0.75^4 = 0.68.
  EXPECT_EQ(make_policy("crossover", cost, e, two)->plan(routing(0, 4, {{0, 4, 0, 1}}), &r).prefetch,
            (std::vector<int64_t>{1, 3}));
}

TEST_F(Policies, CrossoverRunsPrefetchedExpertsOnTheDeviceAndPrefetchesOnlyOverAnIdleLink) {
  auto p = make_policy("crossover", cost, e, opt);
  Residency r(2, 4, {.slots = 1});
  r.warm_start({{0, 0, 0, 5}, {0, 3, 7, 0}});
  r.set_prefetched(1, {1});
  const LayerPlan plan = p->plan(routing(1, 2, {{0, 1, 0, 1}, {1, 1, 0, 1}}), &r);
  EXPECT_EQ(actions(plan), (std::vector<Action>{Action::kCpuInPlace, Action::kGpuResident}));
  r.set_prefetched(0, {});                   // layer 0's step: nothing prefetched for it
  r.observe(routing(1, 1, {{1, 1, 0, 1}}));  // layer 1's tokens pick expert 1
  const LayerPlan idle = p->plan(routing(0, 1, {{0, 1, 0, 1}}), &r);
  EXPECT_EQ(prefetch_after(idle, false), (std::vector<int64_t>{1}));
  EXPECT_TRUE(prefetch_after(idle, true).empty());  // an admission holds the link
  const int64_t t = threshold();
  const LayerPlan busy = p->plan(routing(0, t, {{0, t, 0, 1}}), &r);
  ASSERT_EQ(actions(busy), std::vector<Action>{Action::kMove});
  EXPECT_TRUE(prefetch_after(busy, false).empty());  // a move holds the link
}

TEST_F(Policies, SplitAddsResidualsForCriticalRowsOfResidentExperts) {
  auto p = make_policy("split", cost, e, opt);
  EXPECT_EQ(p->name(), "split");
  Residency r(2, 4, {.slots = 2});
  r.warm_start({{1, 1, 0, 0}, {0, 0, 0, 0}});
  const LayerPlan plan = p->plan(routing(0, 3, {{0, 3, 2, 1}, {1, 1, 0, 1}, {3, threshold(), 0, 1}}), &r);
  EXPECT_EQ(actions(plan), (std::vector<Action>{Action::kGpuResident, Action::kGpuResident, Action::kMove}));
  EXPECT_EQ(plan.experts[0].critical_rows, 2);
}

TEST_F(Policies, TheRegistryDescribesEachPolicyByItsTraits) {
  EXPECT_EQ(policy_list(), "cpu, static, kt, crossover, split");
  EXPECT_FALSE(find_policy("cpu").traits.uses_device);
  EXPECT_TRUE(find_policy("static").traits.moves_experts);
  EXPECT_FALSE(find_policy("static").traits.uses_residency);
  EXPECT_TRUE(find_policy("kt").traits.uses_residency);
  EXPECT_FALSE(find_policy("kt").traits.adapts_residency);
  EXPECT_TRUE(find_policy("crossover").traits.needs_crossover);
  EXPECT_FALSE(find_policy("crossover").traits.needs_split_model);
  EXPECT_TRUE(find_policy("split").traits.needs_split_model);
  for (const PolicyInfo& info : policies()) {
    EXPECT_EQ(make_policy(info.name, cost, e, opt)->name(), info.name);
    EXPECT_FALSE(info.summary.empty()) << info.name;
  }
  EXPECT_EQ(default_policy(true).name, "crossover");
  EXPECT_EQ(default_policy(false).name, "cpu");
  EXPECT_THROW(find_policy("fastest"), std::invalid_argument);
  // Crossover moves only where moving can pay: with a threshold (fixed, or the cost model's), not without.
  PolicyOptions never = opt;
  never.fixed_crossover = std::numeric_limits<int64_t>::max();
  EXPECT_TRUE(make_policy("crossover", cost, e, opt)->moves());
  const CostModel no_link = model(1e12, 1.0);  // a CPU this fast and a link this slow: moving never pays
  EXPECT_FALSE(make_policy("crossover", no_link, e, opt)->moves());
  EXPECT_TRUE(make_policy("static", nullptr, e, opt)->moves());
}

// A stepper over 2 layers of 4 experts with the crossover policy at a fixed threshold of 4 rows.
Stepper crossover_stepper(int64_t move_slots, int64_t slots, int64_t prefetch = 1) {
  PolicyOptions o;
  o.isa = "avx2";
  o.fixed_crossover = 4;
  o.prefetch = prefetch;
  return Stepper("crossover", nullptr, expert_10mb(), o,
                 {.n_layer = 2, .n_expert = 4, .move_slots = move_slots, .residency = {.slots = slots}});
}

TEST(Stepper, MovesTheLargestExpertsFirstThroughTheRingAndCountsOnlyExecutedSteps) {
  Stepper s = crossover_stepper(2, 1);
  s.residency().warm_start({{0, 0, 0, 9}, {0, 0, 0, 0}});  // expert 3 of layer 0 resident
  const Stepper::Step& step = s.plan(routing(0, 9, {{0, 4, 0, 1}, {1, 6, 0, 1}, {2, 1, 0, 1}, {3, 5, 0, 1}}));
  EXPECT_EQ(step.moves, (std::vector<int64_t>{1, 0}));  // 6 rows, then 4; expert 2 (1 row) on the CPU
  EXPECT_EQ(step.ring, (std::vector<int>{0, 1}));
  EXPECT_EQ(step.where(3), Stepper::Where::kResident);
  EXPECT_EQ(step.where(2), Stepper::Where::kCpu);
  EXPECT_EQ(step.where(1), Stepper::Where::kMoved);
  s.finish(/*executed=*/false, false);  // fell back to the CPU: the moves do not count
  EXPECT_EQ(s.traffic().moves, 0u);
  s.plan(routing(0, 9, {{0, 4, 0, 1}, {1, 6, 0, 1}}));
  s.finish(true, false);
  EXPECT_EQ(s.traffic().moves, 2u);
  // Without move slots a planned move runs on the CPU.
  Stepper none = crossover_stepper(0, 0);
  const Stepper::Step& cpu = none.plan(routing(0, 9, {{1, 6, 0, 1}}));
  EXPECT_TRUE(cpu.moves.empty());
  EXPECT_EQ(cpu.where(1), Stepper::Where::kCpu);
}

TEST(Stepper, PrefetchesIntoFreeMoveSlotsOnlyOverAnIdleLinkAndRunsThemAtTheNextStep) {
  // Prefetches take at most half the ring: 1 of 2 move slots even when 3 are asked for.
  Stepper s = crossover_stepper(2, 1, 3);
  s.residency().warm_start({{0, 0, 0, 0}, {0, 0, 9, 0}});
  // Layer 1's tokens pick expert 1 (and the resident 2): it becomes likely.
  s.plan(routing(1, 1, {{1, 1, 0, 1}, {2, 1, 0, 1}}));
  s.finish(true, false);
  s.plan(routing(0, 1, {{0, 1, 0, 1}}));
  const Stepper::After& busy = s.finish(true, /*copies_pending=*/true);
  EXPECT_TRUE(busy.prefetch.empty());  // earlier copies hold the link
  s.plan(routing(0, 1, {{0, 1, 0, 1}}));
  const Stepper::After& idle = s.finish(true, false);
  EXPECT_EQ(idle.prefetch_layer, 1);
  ASSERT_EQ(idle.prefetch.size(), 1u);
  EXPECT_EQ(idle.prefetch[0], (std::pair<int64_t, int>{1, 0}));
  // Layer 1's next step runs it from move slot 0; the ring keeps the other slot.
  const Stepper::Step& next = s.plan(routing(1, 4, {{1, 1, 0, 1}, {3, 4, 0, 1}}));
  EXPECT_EQ(next.where(1), Stepper::Where::kPrefetched);
  EXPECT_EQ(next.prefetched_slot(1), 0);
  EXPECT_EQ(next.ring, std::vector<int>{1});
  EXPECT_EQ(next.moves, std::vector<int64_t>{3});
  s.finish(true, false);
  EXPECT_EQ(s.traffic().prefetches, 1u);
  EXPECT_EQ(s.traffic().prefetch_hits, 1u);
  // A prefetch serves its layer's next step only.
  s.plan(routing(0, 1, {{0, 1, 0, 1}}));
  s.finish(true, true);
  EXPECT_EQ(s.plan(routing(1, 1, {{1, 1, 0, 1}})).where(1), Stepper::Where::kCpu);
}

TEST(Stepper, AnExcludedLayerRunsOnTheCpuAndKeepsNoBooks) {
  Stepper s = crossover_stepper(2, 2);
  s.residency().exclude(1);
  s.residency().warm_start({{5, 0, 0, 0}, {9, 9, 0, 0}});
  EXPECT_FALSE(s.residency().resident(1, 0));
  const Stepper::Step& step = s.plan(routing(1, 8, {{0, 8, 0, 1}}));
  EXPECT_EQ(step.where(0), Stepper::Where::kCpu);
  EXPECT_TRUE(step.moves.empty());
  const Stepper::After& after = s.finish(true, false);
  EXPECT_TRUE(after.changes.empty());
  EXPECT_EQ(s.residency().score(1, 0), 9.0);  // not observed
}

TEST_F(Policies, WithoutADeviceEveryPolicyPlansForTheCpu) {
  PolicyOptions none = opt;
  none.has_device = false;
  for (const PolicyInfo& info : policies()) {
    const LayerPlan plan = make_policy(info.name, cost, e, none)->plan(routing(0, 64, {{0, 64, 0, 1}}), nullptr);
    EXPECT_EQ(actions(plan), std::vector<Action>{Action::kCpuInPlace}) << info.name;
    EXPECT_FALSE(plan.dense_on_device) << info.name;
    EXPECT_FALSE(make_policy(info.name, cost, e, none)->traits().dense_on_device) << info.name;
  }
  EXPECT_THROW(make_policy("fastest", cost, e, opt), std::invalid_argument);
  PolicyOptions bad = opt;
  bad.isa = "neon";
  EXPECT_THROW(make_policy("cpu", cost, e, bad), std::invalid_argument);
  // Without a cost model: crossover needs a fixed threshold, and then uses it.
  EXPECT_THROW(make_policy("crossover", nullptr, e, opt), std::invalid_argument);
  PolicyOptions fixed = opt;
  fixed.fixed_crossover = 5;
  Residency r(2, 4, {.slots = 0});
  EXPECT_EQ(actions(make_policy("crossover", nullptr, e, fixed)->plan(routing(0, 8, {{0, 4, 0, 1}, {1, 5, 0, 1}}), &r)),
            (std::vector<Action>{Action::kCpuInPlace, Action::kMove}));
}

// --- machine profiles ---------------------------------------------------------------------------------------------

const char* kProfile = R"({
  "format": "hetmoe-hw/1", "name": "test box", "assumptions": ["made up"],
  "cpu": {"name": "cpu", "sockets": 2, "cores": 64, "dram_bytes_per_s": 4e11, "dram_bytes": 1e12,
          "tiers": [{"isa": "avx2", "bytes_per_s": 2e11, "flops_per_s": 2e12},
                    {"isa": "amx", "expert_bytes": 1e7, "rows": [1, 64], "seconds": [1e-3, 2e-3]}]},
  "link": {"bytes_per_s": 25e9, "latency_s": 1e-5},
  "gpu": {"name": "gpu", "memory_bytes": 24e9, "bytes_per_s": 1e12, "flops_per_s": 1e14, "launch_s": 5e-6}
})";

TEST(Machine, ReadsAHardwareProfileAndWritesItBack) {
  const Machine m = parse_machine(kProfile, "test");
  EXPECT_EQ(m.name, "test box");
  EXPECT_EQ(m.sockets, 2);
  ASSERT_EQ(m.tiers.size(), 2u);
  EXPECT_EQ(m.best_tier().isa, "amx");
  EXPECT_DOUBLE_EQ(m.best_tier().curve.at(32), 1e-3 + 31.0 / 63.0 * 1e-3);
  ASSERT_TRUE(m.gpu && m.link);
  EXPECT_DOUBLE_EQ(m.gpu->flops_per_s, 1e14);
  EXPECT_TRUE(m.cost_model().crossover("avx2", expert_10mb()).has_value());
  const Machine back = parse_machine(machine_json(m), "round trip");
  EXPECT_EQ(machine_json(back), machine_json(m));
}

TEST(Machine, ReadsWhatCalibrateWrites) {
  const Machine m = parse_machine(R"({"format": "hetmoe-profile/1", "model": "m.gguf", "threads": 2,
    "bandwidth": [{"threads": 1, "bytes_per_s": 2e10}, {"threads": 2, "bytes_per_s": 3e10}],
    "expert": {"bytes": 5e6, "layer": 1, "n_embd": 2048, "n_ff": 1408},
    "expert_ffn": [{"isa": "ref", "rows": [1], "seconds": [1.0]},
                   {"isa": "avx2", "rows": [1, 2], "seconds": [2e-4, 3e-4]}]})",
                                  "calibrated");
  EXPECT_DOUBLE_EQ(m.dram_bytes_per_s, 3e10);
  ASSERT_EQ(m.tiers.size(), 1u);  // the scalar reference tier is not a placement choice
  EXPECT_EQ(m.tiers[0].curve_bytes, 5e6);
  EXPECT_FALSE(m.gpu.has_value());
}

TEST(Machine, RefusesBadProfilesWithTheFileAndField) {
  auto error = [](const std::string& text) {
    try {
      parse_machine(text, "p.json");
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(error("{").find("p.json: not valid JSON"), std::string::npos);
  EXPECT_NE(error(R"({"format": "x"})").find("unknown format"), std::string::npos);
  EXPECT_NE(error(R"({"format": "hetmoe-hw/1", "cpu": {"tiers": []}})").find("dram_bytes_per_s"), std::string::npos);
  EXPECT_NE(error(R"({"format": "hetmoe-hw/1", "cpu": {"dram_bytes_per_s": 1, "tiers": []}})").find("no CPU tier"),
            std::string::npos);
  std::string no_link = kProfile;
  no_link.erase(no_link.find(R"("link")"), std::string(R"("link": {"bytes_per_s": 25e9, "latency_s": 1e-5},)").size());
  EXPECT_NE(error(no_link).find("needs a 'link'"), std::string::npos);
}

// --- routing traces -----------------------------------------------------------------------------------------------

TEST(RoutingTrace, SavesLoadsAndCounts) {
  RoutingTrace t;
  t.model = "m";
  t.n_layer = 3;
  t.n_expert = 4;
  t.n_used = 2;
  t.steps.push_back({.layer = 1, .n_tokens = 2, .ids = {0, 3, 3, 1}, .weights = {0.7f, 0.3f, 0.5f, 0.5f}});
  t.steps.push_back({.layer = 2, .n_tokens = 1, .ids = {2, 3}, .weights = {0.1f, 0.9f}});
  const std::string path = "trace.jsonl";
  const RoutingTrace back = RoutingTrace::parse(t.text(), path);
  EXPECT_EQ(back.n_expert, 4);
  ASSERT_EQ(back.steps.size(), 2u);
  EXPECT_EQ(back.steps[0].ids, t.steps[0].ids);
  EXPECT_EQ(back.steps[1].weights, t.steps[1].weights);
  const auto c = back.counts();
  EXPECT_EQ(c[1], (std::vector<double>{1, 1, 0, 2}));
  EXPECT_EQ(c[0], (std::vector<double>{0, 0, 0, 0}));

  // Layer 1: expert 3 has two rows, critical (largest weight, ties to the earlier slot) in one of them.
  const LayerRouting r = layer_routing(t.steps[0], 2, 1);
  ASSERT_EQ(r.experts.size(), 3u);
  EXPECT_EQ(r.experts[0].expert, 0);
  EXPECT_EQ(r.experts[0].critical_rows, 1);
  EXPECT_EQ(r.experts[2].expert, 3);
  EXPECT_EQ(r.experts[2].rows, 2);
  EXPECT_EQ(r.experts[2].critical_rows, 1);
  EXPECT_FLOAT_EQ(static_cast<float>(r.experts[2].gate), 0.8f);

  try {
    RoutingTrace::parse(t.header_line() + "\n{\"layer\": 1, \"n\": 1, \"ids\": [0, 9], \"weights\": [1, 0]}\n", path);
    ADD_FAILURE() << "loaded an id out of range";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(":2: expert id 9 out of range"), std::string::npos) << e.what();
  }
  EXPECT_THROW(RoutingTrace::parse("{\"format\": \"other\"}\n", path), std::runtime_error);
  EXPECT_THROW(RoutingTrace::parse("", path), std::runtime_error);
}

TEST(RoutingTrace, ZipfSkewsTheChoiceAndKeepsTokensValid) {
  const RoutingTrace uniform = RoutingTrace::zipf(3, 1, 64, 6, 0.0, 20, 16, 1);
  const RoutingTrace skewed = RoutingTrace::zipf(3, 1, 64, 6, 1.2, 20, 16, 1);
  ASSERT_EQ(skewed.steps.size(), 40u);  // 20 steps x 2 MoE layers
  for (const RoutingStep& s : skewed.steps)
    for (int64_t t = 0; t < s.n_tokens; ++t) {
      std::set<int32_t> distinct(s.ids.begin() + t * 6, s.ids.begin() + (t + 1) * 6);
      EXPECT_EQ(distinct.size(), 6u);
      float sum = 0;
      for (int k = 0; k < 6; ++k) sum += s.weights[static_cast<size_t>(t * 6 + k)];
      EXPECT_NEAR(sum, 1.0f, 1e-5f);
    }
  // 1920 choices per layer: uniform puts 30 on each expert; with s = 1.2 the hottest takes several times that.
  auto hottest = [](const RoutingTrace& t) {
    const auto c = t.counts();
    return *std::max_element(c[1].begin(), c[1].end());
  };
  EXPECT_LT(hottest(uniform), 60);
  EXPECT_GT(hottest(skewed), 150);
  EXPECT_TRUE(uniform.counts()[0] == std::vector<double>(64, 0.0));  // the dense layer
}

// --- the simulator --------------------------------------------------------------------------------------------------

// A small MoE: 4 layers (1 dense), 16 experts of 10 MB, 4 used.
SimModel small_model() {
  SimModel m;
  m.name = "small";
  m.n_layer = 4;
  m.n_leading_dense = 1;
  m.n_expert = 16;
  m.n_used = 4;
  m.n_embd = 1000;
  m.n_ff_exp = 1000000 / 6;
  m.n_head = 8;
  m.attn_dim = 128;
  m.kv_width = 128;
  m.attention_bytes = m.attention_params = 20e6;
  m.shared_bytes = m.shared_params = 10e6;
  m.dense_bytes = m.dense_params = 40e6;
  m.output_bytes = m.output_params = 50e6;
  m.expert_bytes = 10e6;
  m.split_device_bytes = 3e6;
  m.split_residual_bytes = 6e6;
  m.file_bytes = 4 * 20e6 + 3 * 10e6 + 40e6 + 50e6 + 3 * 16 * 10e6;
  return m;
}

Machine small_machine(double gpu_memory) {
  Machine m = parse_machine(kProfile, "test");
  m.gpu->memory_bytes = gpu_memory;
  return m;
}

SimOptions sim_options(std::vector<std::string> policies) {
  SimOptions o;
  o.policies = std::move(policies);
  o.prompt = 64;
  o.gen = 8;
  o.isa = "avx2";
  o.vram_reserve_bytes = 0;
  return o;
}

TEST(Simulator, PoliciesOrderAsTheirPlansPredict) {
  const SimModel m = small_model();
  const std::vector<SimResult> r =
      simulate(small_machine(0.3e9), m, sim_options({"cpu", "static", "kt", "crossover", "split"}));
  ASSERT_EQ(r.size(), 5u);
  const SimResult &cpu = r[0], &stat = r[1], &kt = r[2], &cross = r[3], &split = r[4];
  EXPECT_EQ(cpu.vram_bytes, 0);
  EXPECT_EQ(cpu.h2d_bytes_per_token, 0);
  // cpu reads every chosen expert and the dense weights per decoded token.
  EXPECT_GT(cpu.dram_bytes_per_token, 3 * 4 * 10e6);
  // Attention on the device helps; experts resident on it help more.
  EXPECT_GT(stat.decode_tok_s, cpu.decode_tok_s);
  EXPECT_GT(kt.decode_tok_s, stat.decode_tok_s);
  EXPECT_GT(kt.resident_experts, 0);
  EXPECT_LE(kt.vram_bytes, 0.3e9);
  // A 64-token prefill moves experts under static (batch >= 32) and where the crossover says under crossover.
  EXPECT_GT(stat.prefill_tok_s, cpu.prefill_tok_s);
  EXPECT_GE(cross.prefill_tok_s, kt.prefill_tok_s * 0.99);
  // split: W^Q is 3 MB of the expert's 10, so three times as many fit (the pass's weights take 200 MB of 300, the
  // KV cache a little more: 9 whole experts fit in what is left, two of them the ring of move slots).
  EXPECT_EQ(cross.resident_experts, 7);
  EXPECT_EQ(split.resident_experts, 31);
  EXPECT_DOUBLE_EQ(split.dram_bytes, cpu.dram_bytes - 48 * 1e6);  // W^Q + W^R: 9 MB where W took 10
  for (const SimResult& x : r) {
    EXPECT_GT(x.prefill_tok_s, 0) << x.policy;
    EXPECT_GT(x.decode_tok_s, 0) << x.policy;
  }
}

// Critical rows from the source expert: DRAM holds the file and nothing else, a critical row reads the whole source
// expert (10 MB, where W^R took 6), and an expert the device lacks runs from the source (10 MB, where W^Q + W^R took
// 9).
TEST(Simulator, CriticalRowsFromTheSourceReadTheSourceExpertAndKeepDramAtTheFile) {
  SimModel residual = small_model(), source = small_model();
  source.critical_from_source = true;
  SimOptions o = sim_options({"cpu", "split"});
  o.n_critical = 1;
  const std::vector<SimResult> r = simulate(small_machine(0.3e9), residual, o);
  const std::vector<SimResult> s = simulate(small_machine(0.3e9), source, o);
  EXPECT_DOUBLE_EQ(s[1].dram_bytes, s[0].dram_bytes);               // the source file
  EXPECT_DOUBLE_EQ(r[1].dram_bytes, r[0].dram_bytes - 48 * 1e6);    // W^Q + W^R per expert
  EXPECT_EQ(s[1].resident_experts, r[1].resident_experts);          // the same W^Q on the device
  EXPECT_GT(s[1].dram_bytes_per_token, r[1].dram_bytes_per_token);  // 10 MB per critical row's expert, not 6
  EXPECT_LT(s[1].decode_tok_s, r[1].decode_tok_s);
}

// Critical rows are costed as the runtime runs them. With every W^Q on the device: a source split whose every routed
// expert is critical leaves the device no routed rows, so each decoded token reads its 4 experts per MoE layer whole
// from the source on the CPU (3 layers x 4 x 10 MB); with none critical the CPU reads no expert at all.
TEST(Simulator, ASourceSplitsCriticalRowsRunOnTheSourceExpertOnTheCpu) {
  SimModel source = small_model();
  source.critical_from_source = true;
  SimOptions o = sim_options({"split"});
  o.n_critical = 4;
  const SimResult all = simulate(small_machine(2e9), source, o)[0];
  o.n_critical = 0;
  const SimResult none = simulate(small_machine(2e9), source, o)[0];
  EXPECT_EQ(all.resident_experts, 48);  // every W^Q (3 MoE layers x 16)
  EXPECT_EQ(none.resident_experts, 48);
  EXPECT_DOUBLE_EQ(all.dram_bytes_per_token, 3 * 4 * 10e6);
  EXPECT_DOUBLE_EQ(none.dram_bytes_per_token, 0);
  EXPECT_LT(all.decode_tok_s, none.decode_tok_s);
}

// Fewer experts per token read fewer experts: the CPU policy's decode bytes fall by the experts not routed.
TEST(Simulator, FewerExpertsPerTokenReadFewerExperts) {
  SimModel four = small_model(), two = small_model();
  two.n_used = 2;
  const SimOptions o = sim_options({"cpu"});
  const SimResult a = simulate(small_machine(0.3e9), four, o)[0], b = simulate(small_machine(0.3e9), two, o)[0];
  EXPECT_DOUBLE_EQ(a.dram_bytes_per_token - b.dram_bytes_per_token, 3 * 2 * 10e6);  // 3 MoE layers, 2 experts
  EXPECT_GT(b.decode_tok_s, a.decode_tok_s);
}

TEST(Simulator, WithoutADeviceEveryPolicyIsTheCpusAndTracesMustFitTheModel) {
  Machine none = small_machine(1e9);
  none.gpu.reset();
  const std::vector<SimResult> r = simulate(none, small_model(), sim_options({"cpu", "crossover"}));
  EXPECT_DOUBLE_EQ(r[0].decode_tok_s, r[1].decode_tok_s);
  EXPECT_EQ(r[1].crossover_rows, -1);

  RoutingTrace other = RoutingTrace::zipf(4, 1, 8, 4, 1.0, 2, 4, 1);
  SimOptions o = sim_options({"cpu"});
  o.trace = &other;
  EXPECT_THROW(simulate(none, small_model(), o), std::invalid_argument);
  // A trace of the right shape replays: the same trace gives the same prediction twice.
  RoutingTrace same = RoutingTrace::zipf(4, 1, 16, 4, 1.0, 3, 4, 7);
  o.trace = &same;
  o.policies = {"crossover"};
  EXPECT_DOUBLE_EQ(simulate(small_machine(1e9), small_model(), o)[0].decode_tok_s,
                   simulate(small_machine(1e9), small_model(), o)[0].decode_tok_s);
  o.policies = {"fastest"};
  EXPECT_THROW(simulate(small_machine(1e9), small_model(), o), std::invalid_argument);
}

// Every token picks experts 0-3 of each MoE layer: 12 hot experts, 9 slots. The ones left out are prefetched for
// their layer's step (a sure hit) instead of running on the CPU: link bytes for CPU bytes; not without two move
// slots.
TEST(Simulator, PrefetchesTheNextLayersSureExpertsOverAnIdleLink) {
  RoutingTrace hot;
  hot.n_layer = 4;
  hot.n_expert = 16;
  hot.n_used = 4;
  for (int64_t l = 1; l < 4; ++l)
    hot.steps.push_back({.layer = l, .n_tokens = 1, .ids = {0, 1, 2, 3}, .weights = {0.4f, 0.3f, 0.2f, 0.1f}});
  SimOptions o = sim_options({"crossover"});
  o.trace = &hot;
  o.policy.fixed_crossover = 1000;  // this machine's link would move an absent expert for one row
  auto run = [&](int64_t prefetch, int64_t move_slots) {
    o.policy.prefetch = prefetch;
    o.move_slots = move_slots;
    return simulate(small_machine(0.3e9), small_model(), o)[0];
  };
  const SimResult none = run(0, 2), one = run(1, 2), one_slot = run(0, 1), no_slots = run(1, 1);
  // Nine experts fit; the ring of move slots comes out of their room, as in the runtime.
  EXPECT_EQ(none.resident_experts, 7);
  EXPECT_EQ(one_slot.resident_experts, 8);
  EXPECT_GT(one.h2d_bytes_per_token, none.h2d_bytes_per_token);
  EXPECT_LT(one.dram_bytes_per_token, none.dram_bytes_per_token);
  EXPECT_GT(one.decode_tok_s, none.decode_tok_s);
  // Prefetches take at most half the ring: one slot prefetches nothing.
  EXPECT_DOUBLE_EQ(no_slots.decode_tok_s, one_slot.decode_tok_s);
  EXPECT_DOUBLE_EQ(no_slots.h2d_bytes_per_token, one_slot.h2d_bytes_per_token);
}

}  // namespace
}  // namespace hetmoe::sched
