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

// Weight bytes the CPU reads for routed expert e in a step: W (or W^Q, plus W^R when any item is critical) when
// it runs there whole; W^R only for a device expert's critical items (whole = false).
uint64_t routed_bytes(const MoeWeights& w, const RoutedItems& items, int64_t e, int64_t n_embd, bool whole) {
  bool critical = false;
  for (int64_t o = items.begin(e); o < items.end[e] && w.split(); ++o) critical |= items.critical[items.order[o]] != 0;
  auto part = [&](const cpu::WeightMatrix& gate, const cpu::WeightMatrix& up, const cpu::WeightMatrix& down) {
    return gate.row_bytes * w.n_ff_exp + up.row_bytes * w.n_ff_exp + down.row_bytes * n_embd;
  };
  uint64_t bytes = whole ? part(w.gate_exps, w.up_exps, w.down_exps) : 0;
  if (critical) bytes += part(w.gate_exps_r, w.up_exps_r, w.down_exps_r);
  return bytes;
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
  // The policy over the routed experts: their count and the shape of the largest the device runs.
  int64_t n_layer = 0, n_expert = 0;
  sched::ExpertShape shape;
  for (const Expert& e : experts) {
    if (e.expert < 0) continue;
    n_layer = std::max(n_layer, e.layer + 1);
    n_expert = std::max(n_expert, e.expert + 1);
    if (!runs(e.gate, e.up, e.down)) continue;
    const size_t b = expert_bytes(e.gate, e.up, e.down);
    if (b > move_slot_bytes_) {
      move_slot_bytes_ = b;
      shape.bytes = shape.device_bytes = static_cast<double>(bytes_of(e.gate) + bytes_of(e.up) + bytes_of(e.down));
      shape.n_embd = e.gate.n_cols;
      shape.n_ff = e.gate.n_rows;
    }
  }
  policy_name_ = placement.policy;
  bool can_move = false;
  if (n_expert > 0) {
    sched::PolicyOptions po;
    po.isa = placement.isa;
    po.n_layer = n_layer;
    // Without a cost model, crossover and split move from move_rows rows (0: never).
    if (!placement.cost)
      po.fixed_crossover = placement.move_rows > 0 ? placement.move_rows : std::numeric_limits<int64_t>::max();
    try {
      policy_ = sched::make_policy(placement.policy, placement.cost, shape, po);
    } catch (const std::invalid_argument& e) {
      fail("{}", e.what());
    }
    can_move = placement.policy == "static" || placement.policy == "kt" || placement.cost || placement.move_rows > 0;
  }
  // The move slots first: the largest routed expert the device runs, times the slots that fit the budget.
  if (can_move && placement.move_slots > 0 && move_slot_bytes_ > 0) {
    const size_t n = std::min({static_cast<size_t>(placement.move_slots), budget_ / move_slot_bytes_, moving_.size()});
    if (n > 0) {
      move_memory_ = device::DeviceMemory(device_, n * move_slot_bytes_);
      for (size_t i = 0; i < n; ++i) move_slots_.push_back(move_memory_.as<uint8_t>() + i * move_slot_bytes_);
    }
  }
  // Then, in order while they fit: the output head, dense FFNs and shared experts as given, then the routed experts
  // the policy keeps on the device (none for static), the hottest of the warm-up counts first (ties: layer order).
  std::vector<const Expert*> order;
  for (const Expert& e : experts)
    if (e.expert < 0) order.push_back(&e);
  if (policy_ && policy_->uses_residency()) {
    auto warm = [&](const Expert* e) {
      const auto& c = placement.warm_counts;
      return static_cast<size_t>(e->layer) < c.size() && static_cast<size_t>(e->expert) < c[e->layer].size()
                 ? c[e->layer][e->expert]
                 : 0.0;
    };
    std::vector<const Expert*> routed;
    for (const Expert& e : experts)
      if (e.expert >= 0) routed.push_back(&e);
    std::stable_sort(routed.begin(), routed.end(), [&](const Expert* a, const Expert* b) { return warm(a) > warm(b); });
    order.insert(order.end(), routed.begin(), routed.end());
  }
  std::vector<const Expert*> chosen;
  size_t total = 0;
  const size_t room = budget_ - move_slots_.size() * move_slot_bytes_;
  for (const Expert* e : order) {
    if (!runs(e->gate, e->up, e->down)) continue;
    const size_t b = expert_bytes(e->gate, e->up, e->down);
    if (total + b > room) break;  // in order: the first experts that fit
    total += b;
    chosen.push_back(e);
  }
  // The policy sees the routed experts' placement as a residency.
  if (n_expert > 0) {
    std::vector<std::vector<double>> held(static_cast<size_t>(n_layer),
                                          std::vector<double>(static_cast<size_t>(n_expert)));
    int64_t count = 0;
    for (const Expert* e : chosen)
      if (e->expert >= 0) {
        held[static_cast<size_t>(e->layer)][static_cast<size_t>(e->expert)] = 1;
        ++count;
      }
    residency_.emplace(n_layer, n_expert, sched::Residency::Options{.slots = count, .adaptive = false});
    residency_->warm_start(held);
  }
  if (chosen.empty()) return;
  weights_ = device::DeviceMemory(device_, total);
  auto* base = static_cast<uint8_t*>(weights_.get());
  size_t offset = 0;
  for (const Expert* e : chosen) {
    const Slot slot{upload(device_, copy_, e->gate, base, offset), upload(device_, copy_, e->up, base, offset),
                    upload(device_, copy_, e->down, base, offset)};
    slots_[{e->layer, e->expert}] = slot;
    resident_bytes_ += bytes_of(e->gate) + bytes_of(e->up) + bytes_of(e->down);
  }
  device_.synchronize(device_.record(copy_));
}

bool DeviceExperts::runs(const cpu::WeightMatrix& gate, const cpu::WeightMatrix& up,
                         const cpu::WeightMatrix& down) const {
  auto one = [&](const cpu::WeightMatrix& w) { return !w.data || device_.supports(w.type); };
  return one(gate) && one(up) && one(down);
}

float* DeviceExperts::scratch(device::DeviceMemory& mem, size_t floats) {
  return device::grow(device_, mem, floats * sizeof(float)).as<float>();
}

void DeviceExperts::run(const cpu::KernelTable& k, cpu::ThreadPool& pool, const MoeWeights& w, const Routing& r,
                        const RoutedItems& items, int64_t layer, const float* x, int64_t n, int64_t n_embd, float* out,
                        const StepOnDevice& io) {
  const int64_t nu = static_cast<int64_t>(r.ids.size()) / n, ff = w.n_ff_exp;
  // Resident experts go to the device, the rest (and the shared experts unless resident) to the CPU engine.
  thread_local std::vector<Work> work;
  work.clear();
  thread_local cpu::ExpertBatch batch;
  batch.clear(n, nu + (w.has_shared ? 1 : 0));
  // The policy's plan for this step, when there is somewhere to move experts (resident experts run on the device and
  // the rest on the CPU whatever the plan says otherwise): the experts it moves go into the move slots, the largest
  // first (ties: lower id), as many as there are slots (the others run on the CPU).
  thread_local std::vector<int64_t> moved;
  moved.clear();
  if (!move_slots_.empty() && runs(w.gate_exps, w.up_exps, w.down_exps)) {
    thread_local sched::LayerRouting routing;
    routing.layer = layer;
    routing.n_tokens = n;
    routing.experts.clear();
    for (int64_t e = 0; e < w.n_expert; ++e) {
      const int64_t o0 = items.begin(e), o1 = items.end[e];
      if (o0 == o1) continue;
      sched::LayerRouting::Expert x{.expert = e, .rows = o1 - o0, .critical_rows = 0, .gate = 0};
      for (int64_t o = o0; o < o1; ++o) {
        x.critical_rows += w.split() && items.critical[items.order[o]] ? 1 : 0;
        x.gate += r.weights[items.order[o]];
      }
      routing.experts.push_back(x);
    }
    const sched::LayerPlan plan = policy_->plan(routing, &*residency_);
    for (const sched::ExpertStep& step : plan.experts)
      if (step.action == sched::Action::kMove && !resident(layer, step.expert)) moved.push_back(step.expert);
    std::stable_sort(moved.begin(), moved.end(), [&](int64_t a, int64_t b) {
      return items.end[a] - items.begin(a) > items.end[b] - items.begin(b);
    });
    if (moved.size() > move_slots_.size()) moved.resize(move_slots_.size());
  }
  int64_t rows = 0, hidden = 0;
  for (int64_t e = 0; e < w.n_expert; ++e) {
    const int64_t o0 = items.begin(e), o1 = items.end[e];
    if (o0 == o1) continue;
    const auto slot = std::find(moved.begin(), moved.end(), e);
    if (!resident(layer, e) && slot == moved.end()) {
      add_routed_expert(batch, w, items, r, e, nu, n_embd);
      cpu_expert_bytes_ += routed_bytes(w, items, e, n_embd, true);
      continue;
    }
    Work d{e, o0, o1, rows, hidden, ff, false};
    if (slot != moved.end()) {
      // The expert goes into its slot on the copy stream; the compute stream waits for the copies before phase 1.
      d.move_slot = static_cast<int>(slot - moved.begin());
      uint8_t* dst = move_slots_[static_cast<size_t>(d.move_slot)];
      size_t offset = 0;
      Slot& s = moving_[static_cast<size_t>(d.move_slot)];
      s.gate = upload(device_, copy_, w.gate_exps.rows(e * ff, ff), dst, offset);
      s.up = upload(device_, copy_, w.up_exps.rows(e * ff, ff), dst, offset);
      s.down = upload(device_, copy_, w.down_exps.rows(e * n_embd, n_embd), dst, offset);
      moves_.emplace_back(layer, e);
    }
    for (int64_t o = o0; o < o1 && w.split(); ++o) d.any_critical |= items.critical[items.order[o]] != 0;
    if (d.any_critical) cpu_expert_bytes_ += routed_bytes(w, items, e, n_embd, false);
    work.push_back(d);
    rows += d.m();
    hidden += d.m() * ff;
  }
  if (w.has_shared && resident(layer, kShared)) {
    work.push_back({kShared, 0, n, rows, hidden, w.gate_shexp.n_rows, false});
  } else {
    add_shared_experts(batch, w, n, nu);
  }
  if (work.empty()) {
    cpu::run_experts(k, pool, batch, x, n_embd, out);
    return upload_result(out, n, n_embd, io);
  }
  if (!moved.empty()) device_.wait(compute_, device_.record(copy_));
  if (execute(k, pool, &w, &r, &items, layer, work, batch, x, n, n_embd, out, io)) return;
  // No room on the device for this step's rows: all of it on the CPU (the moves just copied are left unused).
  device_.synchronize();
  run_experts_on_cpu(k, pool, w, r, items, x, n, n_embd, out);
  upload_result(out, n, n_embd, io);
}

void DeviceExperts::upload_result(const float* out, int64_t n, int64_t n_embd, const StepOnDevice& io) {
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
  const device::DeviceMatrix& w = slots_.at({layer, id}).gate;
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
                              const float* x, int64_t n, int64_t n_embd, float* out, const StepOnDevice& io) {
  thread_local std::vector<Work> work;
  work.assign(1, Work{kDense, 0, n, 0, 0, n_ff, false});
  thread_local cpu::ExpertBatch batch;
  batch.clear(n, 1);  // nothing for the CPU: the executor returns zeros and the device's rows are added
  return execute(k, pool, nullptr, nullptr, nullptr, layer, work, batch, x, n, n_embd, out, io);
}

bool DeviceExperts::execute(const cpu::KernelTable& k, cpu::ThreadPool& pool, const MoeWeights* moe,
                            const Routing* routing, const RoutedItems* routed, int64_t layer,
                            const std::vector<Work>& work, const cpu::ExpertBatch& batch, const float* x, int64_t n,
                            int64_t n_embd, float* out, const StepOnDevice& io) {
  int64_t rows = 0, hidden = 0;
  for (const Work& d : work) {
    rows += d.m();
    hidden += d.m() * d.width;
  }
  const int64_t nu = routing ? static_cast<int64_t>(routing->ids.size()) / n : 1;
  const int64_t ff = moe ? moe->n_ff_exp : 0;
  const bool split = moe && moe->split();
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
  for (const Work& d : work) {
    const Slot& s = slot_of(layer, d);
    device_.matmul(compute_, s.gate, dx + d.row0 * n_embd, d.m(), dg + d.h0);
    device_.matmul(compute_, s.up, dx + d.row0 * n_embd, d.m(), du + d.h0);
  }

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
    device_.add(compute_, dgr + d.h0, d.m() * ff, dg + d.h0);
    device_.add(compute_, dur + d.h0, d.m() * ff, du + d.h0);
  }
  // Phase 2 on the device: SiLU, down, and back: the down rows of every item, the hidden rows of critical experts.
  std::span<float> hs(hs_.reserve(hidden), hidden);
  std::span<float> ys(ys_.reserve(rows * n_embd), rows * n_embd);
  device_.silu_mul(compute_, dg, du, hidden, dh);
  for (const Work& d : work) device_.matmul(compute_, slot_of(layer, d).down, dh + d.h0, d.m(), dy + d.row0 * n_embd);
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
        weights[token(d, j) * slots + slot] = all_tokens(d) ? 1.0f : routing->weights[item(d, j)];
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
      const float weight = all_tokens(d) ? 1.0f : routing->weights[item(d, j)];
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
