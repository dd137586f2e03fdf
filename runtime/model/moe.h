#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cpu_kernels/experts.h"
#include "cpu_kernels/kernel_table.h"
#include "cpu_kernels/matmul.h"
#include "cpu_kernels/thread_pool.h"
#include "runtime/model/config.h"
#include "runtime/model/trace.h"
#include "scheduler/cost_model.h"

namespace hetmoe::model {

// The router's rules, as the architecture and its metadata set them.
struct RoutingParams {
  int64_t n_expert = 0;
  int64_t n_used = 0;
  Gating gating = Gating::kSoftmax;
  bool norm = false;    // divide the selected weights by their sum
  float scale = 0.0f;   // multiply them by this unless 0 or 1
  int64_t n_group = 1;  // group-limited routing when > 1
  int64_t n_group_used = 1;

  cpu::ExpertSelection selection() const {
    return {.n_expert = n_expert,
            .n_used = n_used,
            .sigmoid = gating == Gating::kSigmoid,
            .softmax_selected = gating == Gating::kSoftmaxSelected,
            .sqrt_softplus = gating == Gating::kSqrtSoftplus,
            .norm = norm,
            .scale = scale,
            .n_group = n_group,
            .n_group_used = n_group_used};
  }
};

// The selected experts of a batch: ids and mixing weights [n_tokens][n_used], in selection order.
struct Routing {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

// From router logits [n][n_expert] (overwritten with the probabilities) to the selection. `bias` ([n_expert],
// may be null) is added for the selection only; `fixed` ([n][n_used], may be null: DeepSeek-V4's hash-routed layers)
// replaces the selection. Reports ffn_moe_probs/topk/weights(_norm, _scaled) to trace.
void route(const RoutingParams& p, float* logits, const float* bias, int64_t n, Routing& out, Trace* trace,
           int64_t layer, const int32_t* fixed = nullptr);

// The weights of one MoE FFN. Expert e owns rows [e * rows, (e+1) * rows) of each 3-D tensor.
struct MoeWeights {
  int64_t n_expert = 0;
  int64_t n_ff_exp = 0;
  cpu::WeightMatrix gate_inp;            // [n_expert, n_embd]
  const float* probs_bias = nullptr;     // [n_expert] (exp_probs_b), optional
  cpu::WeightMatrix gate_exps, up_exps;  // [n_expert * n_ff_exp, n_embd]
  cpu::WeightMatrix down_exps;           // [n_expert * n_embd, n_ff_exp]
  // gpt-oss: per-expert biases ([n_expert][n_ff_exp] for gate and up, [n_expert][n_embd] for down; null: none) and
  // its clamped SwiGLU.
  const float* gate_exps_bias = nullptr;
  const float* up_exps_bias = nullptr;
  const float* down_exps_bias = nullptr;
  bool clamped_swiglu = false;
  // DeepSeek-V4: the routed and the shared experts' SwiGLU limits (cpu::ExpertFfn::swiglu_limit; 0: none), and of a
  // hash-routed layer the experts of each token id ([n_vocab][n_used] I32 rows of ffn_gate_tid2eid; null: routed).
  float swiglu_limit = 0.0f, shared_swiglu_limit = 0.0f;
  const int32_t* hash_ids = nullptr;
  bool has_shared = false;
  cpu::WeightMatrix gate_shexp, up_shexp;  // [n_ff_shared, n_embd]
  cpu::WeightMatrix down_shexp;            // [n_embd, n_ff_shared]
  // Qwen3.5: [n_embd]; each token's shared-expert output is scaled by sigmoid(shared_gate . x). Null: by 1.
  const float* shared_gate = nullptr;
  // A split model (runtime/model/split.h): the *_exps matrices above hold W^Q and these the residuals W^R, of the
  // same shapes, or of a source split (critical_whole) the source experts; data == nullptr for an unsplit model.
  cpu::WeightMatrix gate_exps_r, up_exps_r, down_exps_r;
  // A source split: a critical item runs on the source expert alone (not W^Q plus a residual), and so does every
  // item of an expert that runs whole on the CPU.
  bool critical_whole = false;
  // Of a split model: how many of each token's routed experts, those with the largest mixing weights, add their
  // residual (the "critical" experts); the others run on W^Q alone. < 0: all of them. Set at load.
  int64_t n_critical = -1;

  bool split() const { return gate_exps_r.data != nullptr; }
  // Expert 0's gate, up and down (W^Q of a split model) as the scheduler sizes an expert: moved and run whole.
  sched::ExpertShape expert_shape() const {
    const int64_t n_embd = gate_exps.n_cols;
    return sched::ExpertShape::whole(
        static_cast<double>((gate_exps.row_bytes + up_exps.row_bytes) * n_ff_exp + down_exps.row_bytes * n_embd),
        n_embd, n_ff_exp);
  }
};

// A batch's routed items (token t, slot k) as index t * n_used + k, grouped by expert: expert e's items are
// order[begin(e) .. end[e]), in token order; critical[i] marks the items that add their residual (split models).
// Of a source split each expert's items that are not critical come first: order[begin(e) .. device_end[e]), then
// the critical ones (each part in token order); the device runs only the first part.
struct RoutedItems {
  std::span<const int64_t> end;         // [n_expert]
  std::span<const int64_t> order;       // [n * n_used]
  std::span<const uint8_t> critical;    // [n * n_used], empty for an unsplit model
  std::span<const int64_t> device_end;  // [n_expert] of a source split, else empty (then end)
  int64_t begin(int64_t e) const { return e == 0 ? 0 : end[e - 1]; }
  // The end of expert e's items that a device runs on W^Q.
  int64_t end_on_device(int64_t e) const { return device_end.empty() ? end[e] : device_end[e]; }
};
RoutedItems group_items(const MoeWeights& w, const Routing& r, int64_t n, int64_t n_used);
// Weight bytes the CPU reads for routed expert e in a step: W (or W^Q, plus W^R when any item is critical; of a source
// split the source expert) when it runs there whole; W^R (the source expert) only for a device expert's critical
// items (whole = false).
uint64_t routed_bytes(const MoeWeights& w, const RoutedItems& items, int64_t e, int64_t n_embd, bool whole);

// Where a step's rows live when the forward pass runs on the device: `x` is the device copy of the step's host input,
// and the result goes to `out` (device memory, overwritten); the host output then only holds the CPU's part. Null
// members: input and result on the host.
struct StepOnDevice {
  const float* x = nullptr;
  float* out = nullptr;
};

// The rows of one FFN step: its input x [n][n_embd] and its output out [n][n_embd] in host memory, and the pass's own
// rows when the pass runs on a device.
struct FfnRows {
  const float* x = nullptr;  // null for a dense step whose input is only on the device
  float* out = nullptr;
  int64_t n = 0, n_embd = 0;
  StepOnDevice device{};
};

// One MoE layer's step as the model hands it over: the layer, its weights, the routing and its items by expert.
struct MoeStep {
  int64_t layer = 0;
  const MoeWeights& w;
  const Routing& r;
  const RoutedItems& items;
  const float* shared_weights = nullptr;  // [n]: each token's shared-expert weight (w.shared_gate); null: 1
};
// The shared experts' weight of each of n tokens (rows of n_embd floats, host memory): sigmoid(w.shared_gate . x)
// into weights[n]; false (weights untouched) when the layer has no shared gate.
bool shared_expert_weights(const cpu::KernelTable& k, const MoeWeights& w, const float* x, int64_t n, int64_t n_embd,
                           std::vector<float>& weights);
// Adds routed expert e's items to `batch`: unsplit, one entry; split, the items on W^Q alone and the critical ones
// with the residual, as two entries; a source split, all of them on the source expert. With critical_only, only the
// critical items (a device expert's, the CPU's part of them). Adds nothing when there are none.
void add_routed_expert(cpu::ExpertBatch& batch, const MoeWeights& w, const RoutedItems& items, const Routing& r,
                       int64_t e, int64_t n_used, int64_t n_embd, bool critical_only = false);
// Adds the layer's shared experts (one item per token, rank n_used, weight weights[t] or 1) to `batch`, if it has
// them.
void add_shared_experts(cpu::ExpertBatch& batch, const MoeWeights& w, int64_t n, int64_t n_used, const float* weights);
// The whole expert work of a layer on the CPU engine, ffn.x to ffn.out: routed experts as `items` groups them, then the
// shared ones.
void run_experts_on_cpu(const cpu::KernelTable& k, cpu::ThreadPool& pool, const MoeStep& step, const FfnRows& ffn);

// out[n][n_embd] = down(silu(gate x) * up x).
void swiglu_ffn(const cpu::KernelTable& k, cpu::ThreadPool& pool, const cpu::WeightMatrix& gate,
                const cpu::WeightMatrix& up, const cpu::WeightMatrix& down, const float* x, int64_t n, float* out);

}  // namespace hetmoe::model
