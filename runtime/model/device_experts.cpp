#include "runtime/model/device_experts.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "cpu_kernels/experts.h"
#include "cpu_kernels/scratch.h"
#include "runtime/error.h"
#include "runtime/model/moe.h"

namespace hetmoe::model {
namespace {

size_t bytes_of(const cpu::WeightMatrix& w) { return w.row_bytes * w.n_rows; }
using device::aligned;  // each matrix on a 256-byte boundary

// Host bytes of an FFN's three matrices (an empty one: none).
size_t weight_bytes(const DeviceExperts::Expert& e) { return bytes_of(e.gate) + bytes_of(e.up) + bytes_of(e.down); }

// Device bytes of an expert's three matrices, each aligned.
size_t expert_bytes(const cpu::WeightMatrix& gate, const cpu::WeightMatrix& up, const cpu::WeightMatrix& down) {
  return aligned(bytes_of(gate)) + aligned(bytes_of(up)) + aligned(bytes_of(down));
}

// Queues the copy of w to base + offset on `stream` and moves offset past it; an empty matrix stays empty.
device::DeviceMatrix upload(device::Device& device, int stream, const cpu::WeightMatrix& w, uint8_t* base,
                            size_t& offset) {
  if (!w.data) return {};
  uint8_t* dst = base + offset;
  device.copy_to_device(stream, dst, w.data, bytes_of(w));
  offset += aligned(bytes_of(w));
  return {w.type, w.n_cols, w.n_rows, w.row_bytes, dst};
}

}  // namespace

DeviceExperts::DeviceExperts(device::Device& device, const Placement& placement, std::span<const Expert> experts)
    : device_(device),
      budget_(std::min(placement.budget_bytes, device.capacity())),
      compute_(device.create_stream()),
      copy_(device.create_stream()),
      xs_(device),
      gr_host_(device),
      ur_host_(device),
      hs_(device),
      ys_(device),
      gather_host_(device),
      combine_host_(device),
      cpu_part_host_(device) {
  // The routed experts: their count, their matrices, and the shape of the largest the device runs (the size of an
  // expert slot and of a move slot).
  sched::ExpertShape shape;
  for (const Expert& e : experts) {
    if (e.expert < 0) continue;
    n_layer_ = std::max(n_layer_, e.layer + 1);
    n_expert_ = std::max(n_expert_, e.expert + 1);
  }
  routed_.resize(static_cast<size_t>(n_layer_ * n_expert_));
  std::vector<uint8_t> layer_runs(static_cast<size_t>(n_layer_), 1);
  for (const Expert& e : experts) {
    if (e.expert < 0) continue;
    routed_[static_cast<size_t>(e.layer * n_expert_ + e.expert)] = e;
    if (e.cpu_only || !runs(e.gate, e.up, e.down)) {
      layer_runs[static_cast<size_t>(e.layer)] = 0;
      continue;
    }
    const size_t b = expert_bytes(e.gate, e.up, e.down);
    if (b > slot_bytes_) {
      slot_bytes_ = b;
      shape = sched::ExpertShape::whole(static_cast<double>(weight_bytes(e)), e.gate.n_cols, e.gate.n_rows);
    }
  }
  // The policy, from the scheduler's registry. Without a cost model, crossover and split move from move_rows rows
  // (0: never).
  const sched::PolicyInfo* info = nullptr;
  sched::PolicyOptions po;
  po.isa = placement.isa;
  po.prefetch = placement.prefetch;
  if (!placement.cost)
    po.fixed_crossover = placement.move_rows > 0 ? placement.move_rows : std::numeric_limits<int64_t>::max();
  bool can_move = false;
  try {
    info = &sched::find_policy(placement.policy);
    if (n_expert_ > 0) can_move = sched::make_policy(placement.policy, placement.cost, shape, po)->moves();
  } catch (const std::invalid_argument& e) {
    fail("{}", e.what());
  }
  // The move slots first, where experts can move: the largest routed expert the device runs, times the slots that fit
  // the budget.
  if (can_move && placement.move_slots > 0 && slot_bytes_ > 0) {
    const size_t n = std::min(static_cast<size_t>(placement.move_slots), budget_ / slot_bytes_);
    if (n > 0) {
      move_memory_ = device::DeviceMemory(device_, n * slot_bytes_);
      for (size_t i = 0; i < n; ++i) move_slots_.push_back(move_memory_.as<uint8_t>() + i * slot_bytes_);
      prefetch_slots_.resize(n);
    }
  }
  // Then, in order while they fit: the output head, dense FFNs and shared experts as given.
  std::vector<const Expert*> fixed;
  size_t total = 0;
  size_t room = budget_ - move_slots_.size() * slot_bytes_;
  bool full = false;
  for (const Expert& e : experts) {
    if (e.expert >= 0 || e.cpu_only || !runs(e.gate, e.up, e.down)) continue;
    const size_t b = expert_bytes(e.gate, e.up, e.down);
    if (total + b > room) {  // in order: the first that fit
      full = true;
      break;
    }
    total += b;
    fixed.push_back(&e);
  }
  room -= total;
  // Then the expert slots of the policies that keep routed experts on the device (not static), as many as the rest
  // holds, filled by the residency's warm start: the hottest of the warm-up counts (ties: layer order).
  int64_t n_slots = 0;
  if (n_expert_ > 0 && info->traits.uses_residency && !full && slot_bytes_ > 0) {
    int64_t eligible = 0;
    for (int64_t l = 0; l < n_layer_; ++l)
      for (int64_t e = 0; e < n_expert_ && layer_runs[static_cast<size_t>(l)]; ++e)
        eligible += routed(l, e).gate.data != nullptr;
    n_slots = std::min(static_cast<int64_t>(room / slot_bytes_), eligible);
  }
  if (n_expert_ > 0) {
    stepper_.emplace(placement.policy, placement.cost, shape, po,
                     sched::StepperOptions{.n_layer = n_layer_,
                                           .n_expert = n_expert_,
                                           .move_slots = static_cast<int64_t>(move_slots_.size()),
                                           .residency = {.slots = n_slots,
                                                         .max_admissions = std::max<int64_t>(placement.admissions, 0),
                                                         .adaptive = placement.admissions > 0}});
    sched::Residency& residency = stepper_->residency();
    std::vector<std::vector<double>> counts(static_cast<size_t>(n_layer_),
                                            std::vector<double>(static_cast<size_t>(n_expert_)));
    const auto& warm = placement.warm_counts;
    for (int64_t l = 0; l < n_layer_; ++l) {
      if (!layer_runs[static_cast<size_t>(l)]) residency.exclude(l);
      for (int64_t e = 0; e < n_expert_; ++e) {
        if (!routed(l, e).gate.data) continue;  // a dense layer
        const bool counted = static_cast<size_t>(l) < warm.size() && static_cast<size_t>(e) < warm[l].size();
        // A tiny count for every expert: without counts, the slots fill in layer order.
        counts[l][e] = (counted ? warm[l][e] : 0.0) + 1e-9;
      }
    }
    residency.warm_start(counts);
  }
  if (total > 0) weights_ = device::DeviceMemory(device_, total);
  size_t offset = 0;
  for (const Expert* e : fixed) {
    auto* base = static_cast<uint8_t*>(weights_.get());
    const Slot slot{upload(device_, copy_, e->gate, base, offset), upload(device_, copy_, e->up, base, offset),
                    upload(device_, copy_, e->down, base, offset)};
    slots_[{e->layer, e->expert}] = slot;
    resident_bytes_ += weight_bytes(*e);
  }
  if (n_slots > 0) {
    pool_memory_ = device::DeviceMemory(device_, static_cast<size_t>(n_slots) * slot_bytes_);
    for (int64_t i = 0; i < n_slots; ++i) pool_slots_.push_back(pool_memory_.as<uint8_t>() + i * slot_bytes_);
    int next = 0;
    for (int64_t l = 0; l < n_layer_; ++l)
      for (int64_t e = 0; e < n_expert_; ++e) {
        if (!stepper_->residency().resident(l, e)) continue;
        Slot slot = copy_expert(l, e, pool_slots_[static_cast<size_t>(next)]);
        slot.pool = next++;
        slots_[{l, e}] = slot;
        resident_bytes_ += weight_bytes(routed(l, e));
      }
    for (int i = static_cast<int>(n_slots) - 1; i >= next; --i) free_pool_.push_back(i);
  }
  device_.synchronize(device_.record(copy_));
  for (auto& [key, slot] : slots_) slot.filling = false;
}

DeviceExperts::~DeviceExperts() {
  try {
    device_.synchronize();
  } catch (const std::exception&) {  // a failed copy has nothing left to report to
  }
}

DeviceExperts::Slot DeviceExperts::copy_expert(int64_t layer, int64_t expert, uint8_t* base) {
  const Expert& e = routed(layer, expert);
  size_t offset = 0;
  Slot slot{upload(device_, copy_, e.gate, base, offset), upload(device_, copy_, e.up, base, offset),
            upload(device_, copy_, e.down, base, offset)};
  slot.filling = true;
  slot.filled = last_copy_ = device_.record(copy_);
  copied_ = true;
  return slot;
}

void DeviceExperts::queue_move(int64_t layer, size_t j) {
  const std::vector<int>& ring = plan_->ring;
  const size_t r = ring.size();
  if (j >= r) device_.wait(copy_, move_done_[j - r]);  // the slot's previous expert of the step is done
  moving_[j] = copy_expert(layer, plan_->moves[j], move_slots_[static_cast<size_t>(ring[j % r])]);
  moves_.emplace_back(layer, plan_->moves[j]);
}

void DeviceExperts::after_step(bool executed) {
  // The stepper's books: the residency's evictions free expert slots and its admissions fill them, on the copy stream
  // once the device is done with the step (the experts are used from the layer's next step); then the next layer's
  // prefetch, when the step left the link idle (earlier copies still queued keep it busy).
  const sched::Stepper::After& after = stepper_->finish(executed, copied_ && !device_.reached(last_copy_));
  if (!after.changes.empty() || !after.prefetch.empty()) device_.wait(copy_, device_.record(compute_));
  for (const sched::Residency::Change& ch : after.changes) {
    const size_t bytes = weight_bytes(routed(ch.layer, ch.expert));
    if (!ch.admitted) {
      const auto it = slots_.find({ch.layer, ch.expert});
      free_pool_.push_back(it->second.pool);
      slots_.erase(it);
      resident_bytes_ -= bytes;
    } else {
      const int p = free_pool_.back();
      free_pool_.pop_back();
      Slot slot = copy_expert(ch.layer, ch.expert, pool_slots_[static_cast<size_t>(p)]);
      slot.pool = p;
      slots_[{ch.layer, ch.expert}] = slot;
      resident_bytes_ += bytes;
    }
    changes_.push_back(ch);
  }
  for (const auto& [expert, slot] : after.prefetch)
    prefetch_slots_[static_cast<size_t>(slot)] =
        copy_expert(after.prefetch_layer, expert, move_slots_[static_cast<size_t>(slot)]);
}

bool DeviceExperts::runs(const cpu::WeightMatrix& gate, const cpu::WeightMatrix& up,
                         const cpu::WeightMatrix& down) const {
  auto one = [&](const cpu::WeightMatrix& w) { return !w.data || device_.supports(w.type); };
  return one(gate) && one(up) && one(down);
}

float* DeviceExperts::scratch(device::DeviceMemory& mem, size_t floats) {
  return device::grow(device_, mem, floats * sizeof(float)).as<float>();
}

void DeviceExperts::run(const cpu::KernelTable& k, cpu::ThreadPool& pool, const MoeStep& step, const FfnRows& ffn) {
  const MoeWeights& w = step.w;
  const Routing& r = step.r;
  const RoutedItems& items = step.items;
  const int64_t layer = step.layer, n = ffn.n, n_embd = ffn.n_embd;
  const int64_t nu = static_cast<int64_t>(r.ids.size()) / n, ff = w.n_ff_exp;
  thread_local std::vector<Work> work;
  work.clear();
  thread_local cpu::ExpertBatch batch;
  batch.clear(n, nu + (w.has_shared ? 1 : 0));
  // The scheduler's step: where each routed expert runs (resident or prefetched on the device, moved through the
  // ring of move slots, or on the CPU) and, after it, what to admit, evict and prefetch.
  thread_local sched::LayerRouting routing;
  plan_ = &all_on_cpu;
  if (stepper_) {
    routing.layer = layer;
    routing.n_tokens = n;
    routing.experts.clear();
    // Of a source split the device rows are the items that are not critical (the critical ones run on the CPU's
    // source expert whatever the plan): an expert with none is no device work.
    for (int64_t e = 0; e < w.n_expert; ++e) {
      const int64_t o0 = items.begin(e), o1 = items.end_on_device(e);
      if (o0 == o1) continue;
      sched::LayerRouting::Expert x{.expert = e, .rows = o1 - o0, .critical_rows = 0, .gate = 0};
      for (int64_t o = o0; o < o1; ++o) {
        x.critical_rows += w.split() && items.critical[items.order[o]] ? 1 : 0;
        x.gate += r.weights[items.order[o]];
      }
      routing.experts.push_back(x);
    }
    plan_ = &stepper_->plan(routing);
  }
  const std::vector<int64_t>& moved = plan_->moves;
  const std::vector<int>& ring = plan_->ring;
  // The device's experts (resident, then prefetched ones), then the moved ones; the rest on the CPU. What the CPU
  // reads and the prefetches used count once the step ran as planned.
  int64_t rows = 0, hidden = 0;
  uint64_t cpu_bytes = 0;
  auto add_work = [&](Work d) {
    d.row0 = rows;
    d.h0 = hidden;
    for (int64_t o = d.o0; o < d.o1 && w.split() && !w.critical_whole && d.expert >= 0; ++o)
      d.any_critical |= items.critical[items.order[o]] != 0;
    if (d.any_critical) cpu_bytes += routed_bytes(w, items, d.expert, n_embd, false);
    work.push_back(d);
    rows += d.m();
    hidden += d.m() * d.width;
  };
  // A source split's critical items of an expert the device runs: on the CPU's source expert. False: it has none.
  auto critical_on_cpu = [&](int64_t e) {
    if (!w.critical_whole || items.end_on_device(e) == items.end[e]) return false;
    add_routed_expert(batch, w, items, r, e, nu, n_embd, /*critical_only=*/true);
    cpu_bytes += routed_bytes(w, items, e, n_embd, false);
    return true;
  };
  for (int64_t e = 0; e < w.n_expert; ++e) {
    const int64_t o0 = items.begin(e), o1 = items.end[e];
    if (o0 == o1) continue;
    Slot* slot = nullptr;
    switch (plan_->where(e)) {
      case sched::Stepper::Where::kMoved:
        continue;
      case sched::Stepper::Where::kResident:
        slot = &slots_.at({layer, e});
        break;
      case sched::Stepper::Where::kPrefetched:
        slot = &prefetch_slots_[static_cast<size_t>(plan_->prefetched_slot(e))];
        break;
      case sched::Stepper::Where::kCpu:
        break;
    }
    if (!slot) {
      add_routed_expert(batch, w, items, r, e, nu, n_embd);
      cpu_bytes += routed_bytes(w, items, e, n_embd, true);
      continue;
    }
    if (critical_on_cpu(e) && items.end_on_device(e) == o0) continue;  // nothing left for the device
    if (slot->filling) {  // admitted or prefetched: the step waits for its copy
      device_.wait(compute_, slot->filled);
      slot->filling = false;
    }
    add_work({.expert = e, .o0 = o0, .o1 = items.end_on_device(e), .width = ff, .slot = slot});
  }
  if (w.has_shared && resident(layer, kShared)) {
    add_work({.expert = kShared, .o0 = 0, .o1 = n, .width = w.gate_shexp.n_rows, .slot = &slots_.at({layer, kShared})});
  } else {
    add_shared_experts(batch, w, n, nu, step.shared_weights);
  }
  moving_.assign(moved.size(), Slot{});
  move_done_.assign(moved.size(), device::Event{});
  for (size_t j = 0; j < moved.size(); ++j) {
    const int64_t e = moved[j];
    critical_on_cpu(e);
    add_work(
        {.expert = e, .o0 = items.begin(e), .o1 = items.end_on_device(e), .width = ff, .move = static_cast<int>(j)});
  }
  // The first moves' copies start now, while the device and the CPU work on the rest.
  for (size_t j = 0; j < std::min(moved.size(), ring.size()); ++j) queue_move(layer, j);
  bool done = false;
  if (work.empty()) {
    cpu::run_experts(k, pool, batch, ffn.x, n_embd, ffn.out);
    upload_result(ffn);
    done = true;
  } else {
    done = execute(k, pool, &step, layer, work, batch, ffn);
  }
  if (done) {
    cpu_expert_bytes_ += cpu_bytes;
  } else {
    // No room on the device for this step's rows: all of it on the CPU (the moves just copied are left unused and
    // not counted as moves).
    device_.synchronize();
    run_experts_on_cpu(k, pool, step, ffn);
    upload_result(ffn);
    const size_t copied = std::min(moved.size(), ring.size());
    moves_.resize(moves_.size() - copied);
    for (int64_t e = 0; e < w.n_expert; ++e)
      if (items.begin(e) != items.end[e]) cpu_expert_bytes_ += routed_bytes(w, items, e, n_embd, true);
  }
  if (stepper_) after_step(done);
}

void DeviceExperts::upload_result(const FfnRows& ffn) {
  const float* out = ffn.out;
  const int64_t n = ffn.n, n_embd = ffn.n_embd;
  const StepOnDevice& io = ffn.device;
  if (!io.out) return;
  float* staged = cpu_part_host_.reserve(n * n_embd);
  std::copy_n(out, n * n_embd, staged);
  device_.copy_to_device(compute_, io.out, staged, n * n_embd * sizeof(float));
  device_.synchronize(device_.record(compute_));
}

bool DeviceExperts::reserve(int64_t rows_in, int64_t rows_out, int64_t hidden, bool residual) {
  // Everything a step needs, before anything is queued: a device too full for the step's rows says so here and the
  // step runs on the CPU instead.
  try {
    scratch(x_, rows_in);
    scratch(y_, rows_out);
    xs_.reserve(rows_in);
    ys_.reserve(rows_out);
    if (hidden > 0) {
      scratch(g_, hidden);
      scratch(u_, hidden);
      scratch(h_, hidden);
      hs_.reserve(hidden);
      gr_host_.reserve(hidden);
      ur_host_.reserve(hidden);
    }
    if (residual) {
      scratch(gr_, hidden);
      scratch(ur_, hidden);
    }
    return true;
  } catch (const Error&) {
    return false;
  }
}

bool DeviceExperts::run_matrix(int64_t layer, int64_t id, const float* x, int64_t n, float* y, const float* x_device) {
  const auto it = slots_.find({layer, id});
  if (it == slots_.end()) return false;
  const device::DeviceMatrix& w = it->second.gate;
  if (!reserve(x_device ? 0 : n * w.n_cols, n * w.n_rows, 0, false)) return false;
  float* ys = ys_.reserve(n * w.n_rows);
  float* dy = scratch(y_, n * w.n_rows);
  if (!x_device) {
    float* xs = xs_.reserve(n * w.n_cols);
    std::copy_n(x, n * w.n_cols, xs);
    float* dx = scratch(x_, n * w.n_cols);
    device_.copy_to_device(compute_, dx, xs, n * w.n_cols * sizeof(float));
    x_device = dx;
  }
  device_.matmul(compute_, w, x_device, n, dy);
  device_.copy_to_host(compute_, ys, dy, n * w.n_rows * sizeof(float));
  device_.synchronize(device_.record(compute_));
  std::copy_n(ys, n * w.n_rows, y);
  return true;
}

bool DeviceExperts::run_dense(const cpu::KernelTable& k, cpu::ThreadPool& pool, int64_t layer, int64_t n_ff,
                              const FfnRows& ffn) {
  const int64_t n = ffn.n;
  const auto it = slots_.find({layer, kDense});
  if (it == slots_.end()) return false;
  thread_local std::vector<Work> work;
  work.assign(1, Work{.expert = kDense, .o0 = 0, .o1 = n, .width = n_ff, .slot = &it->second});
  thread_local cpu::ExpertBatch batch;
  batch.clear(n, 1);  // nothing for the CPU: the executor returns zeros and the device's rows are added
  return execute(k, pool, nullptr, layer, work, batch, ffn);
}

bool DeviceExperts::execute(const cpu::KernelTable& k, cpu::ThreadPool& pool, const MoeStep* step, int64_t layer,
                            const std::vector<Work>& work, const cpu::ExpertBatch& batch, const FfnRows& ffn) {
  const MoeWeights* moe = step ? &step->w : nullptr;
  const Routing* routing = step ? &step->r : nullptr;
  const RoutedItems* routed = step ? &step->items : nullptr;
  const float* x = ffn.x;
  float* out = ffn.out;
  const int64_t n = ffn.n, n_embd = ffn.n_embd;
  const StepOnDevice& io = ffn.device;
  int64_t rows = 0, hidden = 0;
  for (const Work& d : work) {
    rows += d.m();
    hidden += d.m() * d.width;
  }
  const int64_t nu = routing ? static_cast<int64_t>(routing->ids.size()) / n : 1;
  const int64_t ff = moe ? moe->n_ff_exp : 0;
  const bool split = moe && moe->split() && !moe->critical_whole;  // residuals to add (a source split has none)
  if (!reserve(rows * n_embd, rows * n_embd, hidden, split)) return false;
  // The combine's width: a token's routed slots and the shared experts' slot (a dense FFN: one slot).
  const int64_t slots = routing ? nu + 1 : 1;
  if (io.out) {
    try {
      scratch(gather_, rows);
      scratch(combine_, 2 * n * slots);
      scratch(cpu_part_, n * n_embd);
      gather_host_.reserve(rows);
      combine_host_.reserve(2 * n * slots);
      cpu_part_host_.reserve(n * n_embd);
    } catch (const Error&) {
      return false;
    }
  }
  // Item j of a work: its routed item index (or, for the shared experts, its token), token and weight.
  auto all_tokens = [](const Work& d) { return d.expert == kShared || d.expert == kDense; };
  auto item = [&](const Work& d, int64_t j) { return all_tokens(d) ? j : routed->order[d.o0 + j]; };
  auto token = [&](const Work& d, int64_t j) { return all_tokens(d) ? j : item(d, j) / nu; };
  auto critical = [&](const Work& d, int64_t j) { return d.any_critical && routed->critical[item(d, j)] != 0; };
  const float* shared_weights = step ? step->shared_weights : nullptr;
  auto weight_of = [&](const Work& d, int64_t j) {
    if (d.expert == kShared) return shared_weights ? shared_weights[j] : 1.0f;
    return d.expert == kDense ? 1.0f : routing->weights[item(d, j)];
  };

  // Phase 1 on the device: the items' input rows up in one copy (or gathered there), then gate and up of each
  // expert's W^Q. The host rows xs also serve the residuals of critical items (with the input on the device, only
  // those experts' rows are gathered on the host).
  std::span<float> xs(xs_.reserve(rows * n_embd), rows * n_embd);
  for (const Work& d : work)
    if (!io.x || d.any_critical)
      for (int64_t j = 0; j < d.m(); ++j) std::copy_n(x + token(d, j) * n_embd, n_embd, &xs[(d.row0 + j) * n_embd]);
  float* dx = scratch(x_, rows * n_embd);
  float* dg = scratch(g_, hidden);
  float* du = scratch(u_, hidden);
  float* dh = scratch(h_, hidden);
  float* dy = scratch(y_, rows * n_embd);
  if (io.x) {
    // The rows are on the device already: gathered there by token (the host copy xs serves the CPU's residuals).
    auto* rows_of_token = reinterpret_cast<int32_t*>(gather_host_.reserve(rows));
    for (const Work& d : work)
      for (int64_t j = 0; j < d.m(); ++j) rows_of_token[d.row0 + j] = static_cast<int32_t>(token(d, j));
    auto* gather = reinterpret_cast<int32_t*>(scratch(gather_, rows));
    device_.copy_to_device(compute_, gather, rows_of_token, rows * sizeof(int32_t));
    device_.gather_rows(compute_, io.x, n_embd, gather, rows, dx);
  } else {
    device_.copy_to_device(compute_, dx, xs.data(), xs.size() * sizeof(float));
  }
  // Gate and up of an expert's rows; the experts already on the device go first (the moved ones follow their copies).
  auto gate_up = [&](const Work& d) {
    const Slot& s = slot_of(d);
    device_.matmul(compute_, s.gate, dx + d.row0 * n_embd, d.m(), dg + d.h0);
    device_.matmul(compute_, s.up, dx + d.row0 * n_embd, d.m(), du + d.h0);
  };
  auto add_residual = [&](const Work& d, float* dgr, float* dur) {
    device_.add(compute_, dgr + d.h0, d.m() * ff, dg + d.h0);
    device_.add(compute_, dur + d.h0, d.m() * ff, du + d.h0);
  };
  for (const Work& d : work)
    if (d.move < 0) gate_up(d);

  // Meanwhile on the CPU: the residual's gate and up for the critical items (zero rows for the others), sent to
  // the device to be added before the SiLU.
  std::span<float> gr(gr_host_.reserve(hidden), hidden);
  std::span<float> ur(ur_host_.reserve(hidden), hidden);
  std::span<float> xc = cpu::scratch<float, struct DeviceXcSite>(rows * std::max(n_embd, ff));
  std::span<float> tmp = cpu::scratch<float, struct DeviceTmpSite>(rows * std::max(ff, n_embd));
  // Gathers the critical items' rows of src ([m][width]) into dst; returns how many.
  auto critical_rows = [&](const Work& d, float* dst, int64_t width, const float* src) {
    int64_t c = 0;
    for (int64_t j = 0; j < d.m(); ++j)
      if (critical(d, j)) std::copy_n(src + j * width, width, dst + c++ * width);
    return c;
  };
  float* dgr = split ? scratch(gr_, hidden) : nullptr;
  float* dur = split ? scratch(ur_, hidden) : nullptr;
  for (const Work& d : work) {
    if (!d.any_critical) continue;
    const int64_t c = critical_rows(d, xc.data(), n_embd, &xs[d.row0 * n_embd]);
    const cpu::WeightMatrix gate_r = moe->gate_exps_r.rows(d.expert * ff, ff),
                            up_r = moe->up_exps_r.rows(d.expert * ff, ff);
    for (auto [matrix, dst] : {std::pair{&gate_r, gr.data()}, std::pair{&up_r, ur.data()}}) {
      cpu::matmul(k, pool, *matrix, xc.data(), c, tmp.data(), ff);
      float* rows_of_d = dst + d.h0;
      std::fill(rows_of_d, rows_of_d + d.m() * ff, 0.0f);
      for (int64_t j = 0, i = 0; j < d.m(); ++j)
        if (critical(d, j)) std::copy_n(tmp.data() + i++ * ff, ff, rows_of_d + j * ff);
    }
    device_.copy_to_device(compute_, dgr + d.h0, gr.data() + d.h0, d.m() * ff * sizeof(float));
    device_.copy_to_device(compute_, dur + d.h0, ur.data() + d.h0, d.m() * ff * sizeof(float));
    if (d.move < 0) add_residual(d, dgr, dur);
  }
  // Phase 2 on the device: SiLU and down of the experts on the device (their hidden rows come first), then each moved
  // expert's whole FFN once its copy is in, freeing its ring slot for the next; then back: the down rows of every
  // item, the hidden rows of critical experts.
  std::span<float> hs(hs_.reserve(hidden), hidden);
  std::span<float> ys(ys_.reserve(rows * n_embd), rows * n_embd);
  const auto first_move = std::find_if(work.begin(), work.end(), [](const Work& d) { return d.move >= 0; });
  const int64_t on_device = first_move == work.end() ? hidden : first_move->h0;
  if (on_device > 0) device_.silu_mul(compute_, dg, du, on_device, dh);
  for (auto d = work.begin(); d != first_move; ++d)
    device_.matmul(compute_, d->slot->down, dh + d->h0, d->m(), dy + d->row0 * n_embd);
  for (auto d = first_move; d != work.end(); ++d) {
    const auto j = static_cast<size_t>(d->move);
    if (j >= plan_->ring.size()) queue_move(layer, j);
    device_.wait(compute_, moving_[j].filled);
    gate_up(*d);
    if (d->any_critical) add_residual(*d, dgr, dur);
    device_.silu_mul(compute_, dg + d->h0, du + d->h0, d->m() * d->width, dh + d->h0);
    device_.matmul(compute_, moving_[j].down, dh + d->h0, d->m(), dy + d->row0 * n_embd);
    move_done_[j] = device_.record(compute_);
  }
  for (const Work& d : work)
    if (d.any_critical) device_.copy_to_host(compute_, hs.data() + d.h0, dh + d.h0, d.m() * ff * sizeof(float));
  if (io.out) {
    // Each token's device rows by mixing weight, in slot order, straight into the device output.
    float* host = combine_host_.reserve(2 * n * slots);
    auto* index = reinterpret_cast<int32_t*>(host);
    float* weights = host + n * slots;
    std::fill(index, index + n * slots, -1);
    std::fill(weights, weights + n * slots, 0.0f);
    for (const Work& d : work)
      for (int64_t j = 0; j < d.m(); ++j) {
        const int64_t slot = d.expert == kShared ? nu : d.expert == kDense ? 0 : item(d, j) % nu;
        index[token(d, j) * slots + slot] = static_cast<int32_t>(d.row0 + j);
        weights[token(d, j) * slots + slot] = weight_of(d, j);
      }
    float* combine = scratch(combine_, 2 * n * slots);
    device_.copy_to_device(compute_, combine, host, 2 * n * slots * sizeof(float));
    device_.combine_rows(compute_, dy, n_embd, reinterpret_cast<const int32_t*>(combine), combine + n * slots, n, slots,
                         io.out);
  } else {
    device_.copy_to_host(compute_, ys.data(), dy, ys.size() * sizeof(float));
  }
  device::PendingWork pending(device_, compute_);

  // The CPU's own experts while the device works, then the device's results by mixing weight (1 for the shared
  // experts), with the residual's down rows of the critical items.
  cpu::run_experts(k, pool, batch, x, n_embd, out);
  pending.wait();
  for (const Work& d : work) {
    if (d.any_critical) {
      const int64_t c = critical_rows(d, xc.data(), ff, hs.data() + d.h0);
      cpu::matmul(k, pool, moe->down_exps_r.rows(d.expert * n_embd, n_embd), xc.data(), c, tmp.data(), n_embd);
    }
    for (int64_t j = 0, i = 0; j < d.m(); ++j) {
      const float* yr = critical(d, j) ? tmp.data() + i++ * n_embd : nullptr;
      float* dst = out + token(d, j) * n_embd;
      const float weight = weight_of(d, j);
      if (io.out) {  // the device has its rows: the CPU's part takes the residual's
        if (yr)
          for (int64_t q = 0; q < n_embd; ++q) dst[q] += weight * yr[q];
        continue;
      }
      const float* y = &ys[(d.row0 + j) * n_embd];
      for (int64_t q = 0; q < n_embd; ++q) dst[q] += weight * (yr ? y[q] + yr[q] : y[q]);
    }
  }
  const bool any_residual = std::any_of(work.begin(), work.end(), [](const Work& d) { return d.any_critical; });
  if (io.out && (!batch.experts.empty() || any_residual)) {
    // The CPU's part (its experts, the residuals' down rows) joins the device's sum.
    float* staged = cpu_part_host_.reserve(n * n_embd);
    std::copy_n(out, n * n_embd, staged);
    float* part = scratch(cpu_part_, n * n_embd);
    device_.copy_to_device(compute_, part, staged, n * n_embd * sizeof(float));
    device_.add(compute_, part, n * n_embd, io.out);
  }
  return true;
}

}  // namespace hetmoe::model
