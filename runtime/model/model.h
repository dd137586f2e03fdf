#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cpu_kernels/kernel_table.h"
#include "cpu_kernels/matmul.h"
#include "cpu_kernels/thread_pool.h"
#include "runtime/gguf/reader.h"
#include "runtime/model/config.h"
#include "runtime/model/device_experts.h"
#include "runtime/model/kv_cache.h"
#include "runtime/model/moe.h"
#include "runtime/model/pass.h"
#include "runtime/model/trace.h"

namespace hetmoe::model {

// The FFN of one layer: a dense SwiGLU, or routed experts with optional shared experts.
struct FfnWeights {
  cpu::WeightMatrix gate, up, down;  // dense: [n_ff, n_embd], [n_ff, n_embd], [n_embd, n_ff]
  MoeWeights moe;                    // used when moe.n_expert > 0
};

// One sequence's part of a forward call: its new tokens at positions pos0, pos0 + 1, ..., appended to its cache, and
// which of their logits come back.
struct SequenceBatch {
  enum class Logits { kNone, kLast, kAll };
  std::span<const int32_t> tokens;
  int64_t pos0 = 0;
  KvCache* cache = nullptr;
  Logits logits = Logits::kLast;
  bool hidden = false;  // its rows' final hidden states come back in Model::hidden() (an MTP drafter's input)
};

// A loaded model: the file stays mapped and the weights are used where they lie. Architecture files
// (deepseek2.cpp, gqa.cpp) bind their tensors and write their attention once, over Device ops; the embedding, the
// residual stream, the FFN step (dense or MoE, run by the CPU engine and the device's expert executor) and the output
// head are shared here. The forward pass runs on one device for a whole call: the host device (the CPU, its ops the
// kernel table on the mapped weights), or a GPU (or the emulated one) when attach_device put the pass there and the
// KV cache lives there too.
class Model {
 public:
  // Maps and validates the file. Errors: missing file, corrupt GGUF, unknown architecture, missing or misshapen
  // tensor; each a one-line hetmoe::Error.
  static std::unique_ptr<Model> load(const std::string& path, int n_threads);
  virtual ~Model();

  const ModelConfig& config() const { return config_; }
  const gguf::GgufFile& file() const { return *file_; }
  cpu::ThreadPool& pool() { return *pool_; }
  // Weight bytes bound to NUMA nodes at load (0 on one node or with HETMOE_NUMA=0).
  size_t numa_bound_bytes() const { return numa_bound_bytes_; }

  // The FFN weights of one layer, for calibration and benchmarks that run an expert on their own.
  const FfnWeights& ffn_weights(int64_t layer) const { return ffn_.at(static_cast<size_t>(layer)); }

  // Whether the file is a split model (hetmoe split): routed experts as W^Q plus residual W^R.
  bool split() const;
  // Of a split model: how many of each token's routed experts (largest mixing weights first) add their residual;
  // 0 runs W^Q alone, < 0 adds it for all. No effect on an unsplit model.
  void set_critical(int64_t n_critical);

  // Puts the model on `device` as far as `budget_bytes` goes and the device runs the weights' types. First, with
  // `whole_pass`, the forward pass itself: every layer's norms, attention and router weights (all or none); the
  // residual stream, attention and the KV cache then live on the device, and only the router's logits and the rows
  // the CPU needs come back. Then the output head, the dense layers' FFNs, the shared experts and the routed experts'
  // W^Q (the experts themselves for an unsplit model), layer by layer; the FFNs run those there and the rest on the
  // CPU. The device must outlive the model.
  void attach_device(device::Device& device, const DeviceExperts::Placement& placement, bool whole_pass = true);
  const DeviceExperts* device_experts() const { return device_experts_.get(); }
  DeviceExperts* device_experts() { return device_experts_.get(); }
  // Weight bytes of routed experts the CPU streamed (whole, or their residuals) since the model was loaded.
  uint64_t cpu_expert_bytes() const {
    return device_experts_ ? device_experts_->cpu_expert_bytes() : cpu_expert_bytes_;
  }
  // Whether attach_device put the forward pass on the device (its caches from make_cache then live there too).
  bool pass_on_device() const { return device_pass_ != nullptr; }
  // The bytes of the pass's weights on the device (norms, attention, routers).
  size_t pass_device_bytes() const { return device_pass_ ? device_pass_->weights.data_bytes() : 0; }

  // Every MoE layer's routing goes to `observer` from now on (null: to nobody). It must outlive its use.
  void set_routing_observer(RoutingObserver* observer) { routing_observer_ = observer; }
  // Every MoE layer's routing is replaced by `override` from now on (null: the model's own). It must outlive its use.
  void set_routing_override(RoutingOverride* override) { routing_override_ = override; }
  // Every indexer selection (DeepSeek-V3.2) is replaced by `override` from now on (null: the model's own).
  void set_selection_override(SelectionOverride* override) { selection_override_ = override; }

  // A KV cache for n_ctx positions (at most the training context): on the device when the forward pass runs there
  // and the cache fits in what is left of the device's memory, else in host memory (the calls on this cache then run
  // on the host pass; cache.device() tells which).
  KvCache make_cache(int64_t n_ctx) const;

  // Runs `tokens` at positions pos0, pos0+1, ... as one batch, appending their keys and values to `cache`.
  // logits receives [n_tokens][n_vocab] when all_logits, else [n_vocab] of the last token.
  // Fails (before touching the cache) on an out-of-range token id or when the batch does not fit the context.
  // `cancel`, when set, is checked between layers: a long prefill stops within one layer by throwing Cancelled
  // (the cache rows it wrote are past the caller's positions and get overwritten later).
  // Non-finite values (broken weights or scales) stop it with an error that names where they first appear: the
  // embedding rows, the rows the output head reads and the logits are checked on every call (n_embd floats a token,
  // in host memory; the head's quantized activations would turn a NaN row into zero logits); when one is not finite
  // the batch runs again with a check after every layer to name the first one.
  void forward(std::span<const int32_t> tokens, int64_t pos0, KvCache& cache, bool all_logits,
               std::vector<float>& logits, Trace* trace = nullptr, const std::atomic<bool>* cancel = nullptr);
  // Several sequences in one pass (continuous batching): each with its own cache (all where the pass runs, no cache
  // twice), their rows together through every layer, so the MoE step routes all of them at once and the scheduler
  // sees the real row count per expert; the attention and what a sequence keeps run per sequence. logits receives
  // each sequence's rows as its `logits` asks, in batch order. Fails, touching no cache, when any part would fail
  // alone. A non-finite value stops it as forward() says (every cache with recurrent state needs a checkpoint at its
  // pos0 for the search).
  void forward(std::span<const SequenceBatch> batch, std::vector<float>& logits, Trace* trace = nullptr,
               const std::atomic<bool>* cancel = nullptr);
  // The last forward call's final hidden states (the output norm's rows, what the head reads), [n][n_embd] for every
  // row of the batch in row order, when a sequence of it asked (SequenceBatch::hidden); else empty.
  std::span<const float> hidden() const { return hidden_; }

  // The multi-token-prediction blocks the file carries after the trunk (DeepSeek-V3/V3.2, GLM-4.5, Qwen3.5):
  // config().n_mtp of them, 0 when it has none.
  int64_t n_mtp() const { return config_.n_mtp; }
  // A cache for forward_mtp in host memory: the MTP blocks' rows for n_ctx positions (the trunk's layers hold none).
  KvCache make_mtp_cache(int64_t n_ctx) const;
  // The first MTP block (DeepSeek-V3's multi-token prediction, as vLLM and SGLang run it) at positions pos0 + i,
  // i < n: row i reads the trunk's final hidden state at that position, hidden [n][n_embd] (as hidden() gives it, or
  // a chained draft's out_hidden), and the token that follows the position, next[i]. Its input is eh_proj .
  // [enorm(embed(next[i])); hnorm(hidden[i])] (the embedding zeroed at position 0 when config().mtp_zero_first;
  // embed: the block's own nextn.embed_tokens or token_embd), then the block runs as a trunk block does, its
  // attention over `cache` (from make_mtp_cache, holding the rows of the positions before pos0 it wrote earlier).
  // The last row's output comes back
  // in out_hidden [n_embd] (a chained draft's hidden state at the next position) and its logits,
  // head(shared_head_norm(out)) with the block's nextn.shared_head_head or the output head, in logits [n_vocab]: the
  // distribution of the token two positions after pos0 + n - 1. Runs on the host, the CPU taking every expert.
  void forward_mtp(std::span<const int32_t> next, const float* hidden, int64_t pos0, KvCache& cache, float* out_hidden,
                   std::vector<float>& logits);

 protected:
  Model(std::unique_ptr<gguf::GgufFile> file, ModelConfig config, int n_threads);
  // Fails unless 1 <= n_ctx <= the training context.
  void check_context_size(int64_t n_ctx) const;

  // One pass of forward() without the search for a non-finite layer; false when the output rows or logits are not
  // finite.
  bool forward_once(std::span<const SequenceBatch> batch, std::vector<float>& logits, Trace* trace,
                    const std::atomic<bool>* cancel);

  // Attention of layer `layer` on the pass's device: the normalised input x [n][n_embd] to out [n][n_embd], both in
  // the pass's memory; pass.sequences says whose rows they are, at which positions, and their caches (on the same
  // device). What works per row (projections, norms, RoPE with pass.rope_table) runs over all n rows at once. The
  // weights are the handles the architecture registered in weights_ while binding.
  virtual void attention(Pass& pass, int64_t layer, const float* x, int64_t n, float* out) = 0;
  // What layer `layer` keeps of a sequence in the cache.
  virtual LayerCache cache_layer(int64_t layer) const = 0;
  // Called once per forward call before the first layer (pass.sequences set): an architecture prepares what all its
  // layers share (DeepSeek-V4: its RoPE tables).
  virtual void begin_batch(Pass& pass) { (void)pass; }

  // Tensor binding with shape checks. ne lists the expected ggml dims; the tensor must have exactly these. A table of
  // ids (`ids`: DeepSeek-V4's ffn_gate_tid2eid) must be I32, any other tensor must not.
  const gguf::TensorInfo& tensor(const std::string& name, std::initializer_list<int64_t> ne, bool ids = false) const;
  const gguf::TensorInfo* optional_tensor(const std::string& name, std::initializer_list<int64_t> ne,
                                          bool ids = false) const;
  cpu::WeightMatrix matrix(const std::string& name, int64_t n_cols, int64_t n_rows) const;
  // A 1-D F32 vector of n values; other types are dequantized once into storage the model owns.
  const float* vector(const std::string& name, int64_t n);
  const float* optional_vector(const std::string& name, int64_t n);
  // Any tensor's values as floats, row after row: F32 where it lies, other types dequantized once into storage the
  // model owns.
  const float* as_floats(const gguf::TensorInfo& t);
  // A tensor as a matrix to multiply with; refuses a type the CPU kernels have no dot product for (Q8_1 and Q8_K
  // are activation formats: a file that stores weights in them is broken).
  cpu::WeightMatrix as_matrix(const gguf::TensorInfo& t) const;
  void bind_common();
  // DeepSeek-V4: every layer's hc_attn_* and hc_ffn_* mixes and the output head's output_hc_*, for a residual stream
  // of config().hc_streams copies.
  void bind_hyper_connections();
  // On a machine with threads on two or more NUMA nodes, binds each weight matrix's pages to the nodes whose
  // threads compute its rows (never a copy per node). HETMOE_NUMA=0 leaves pages where the kernel puts them.
  void place_on_nodes();
  // Whether place_on_nodes binds pages: threads on two or more nodes and HETMOE_NUMA not 0.
  bool binds_to_nodes() const;
  // Without node binding: the mapped file's pages as 2 MB pages where the kernel can
  // (gguf::MappedFile::settle_huge_pages; a node binding splits pages in 4 kB units instead). HETMOE_HUGE_PAGES=0
  // leaves the page cache as it is.
  void map_huge_pages();

  static std::string blk(int64_t layer, std::string_view name, std::string_view kind = "weight") {
    return "blk." + std::to_string(layer) + "." + std::string(name) + "." + std::string(kind);
  }

  std::unique_ptr<gguf::GgufFile> file_;
  ModelConfig config_;
  std::unique_ptr<cpu::ThreadPool> pool_;
  const cpu::KernelTable& kernels_;
  PassWeights weights_;  // what the pass reads besides the FFNs: the architecture adds its attention weights

  const gguf::TensorInfo* token_embd_ = nullptr;  // [n_vocab, n_embd]
  cpu::WeightMatrix output_;                      // [n_vocab, n_embd] (token_embd when tied)
  std::vector<FfnWeights> ffn_;                   // per layer
  // The pass's handles: per layer, its two norms, and of an MoE layer its router and the router's bias (when it has
  // exp_probs_b); the output norm.
  struct LayerHandles {
    PassWeights::Handle attn_norm = 0, ffn_norm = 0, router = 0, router_bias = 0;
    PassWeights::Handle router_logit_bias = 0;  // gpt-oss: added to the router's logits (ffn_gate_inp.bias)
  };
  std::vector<LayerHandles> handles_;
  PassWeights::Handle output_norm_ = 0;
  // An MTP block's own weights (its attention and FFN are bound as layer n_layer + b's).
  struct MtpHandles {
    PassWeights::Handle eh_proj = 0;  // [E, 2E]
    PassWeights::Handle enorm = 0, hnorm = 0, head_norm = 0;
    const gguf::TensorInfo* embed = nullptr;  // nextn.embed_tokens, else token_embd
    cpu::WeightMatrix head;                   // nextn.shared_head_head, else the output head
  };
  std::vector<MtpHandles> mtp_;
  // A hyper-connection's weights: fn [n_mix, hc_streams * n_embd], scale [3] (the head: [1]), base [n_mix].
  struct HyperHandles {
    PassWeights::Handle fn = 0, scale = 0, base = 0;
  };
  std::vector<HyperHandles> hyper_attn_, hyper_ffn_;  // per layer; empty without hyper-connections
  HyperHandles hyper_out_;
  std::span<const int32_t> tokens_;  // the batch's tokens, all sequences' in row order, during forward (hash routing)
  Trace* trace_ = nullptr;           // set during forward
  RoutingObserver* routing_observer_ = nullptr;
  RoutingOverride* routing_override_ = nullptr;
  SelectionOverride* selection_override_ = nullptr;
  size_t numa_bound_bytes_ = 0;

 private:
  // Layer `layer`'s FFN for the rows x [n][n_embd] in the pass's memory into out there: a dense SwiGLU, or the router
  // (on the pass's device), then the experts by the executor's plan, the CPU taking what is not on the device.
  void ffn(Pass& pass, int64_t layer, const float* x, int64_t n, float* out);
  // The router's rules as the config sets them.
  RoutingParams routing_params() const;
  // A hyper-connection on the pass's device: the mixes and coefficients of its weights.
  cpu::HyperConnection hyper(const Pass& pass, const HyperHandles& h, bool output_head) const;
  // The sub-block input xin [n][n_embd] from the state x [n][hc_streams * n_embd], its coefficients to coef.
  void hyper_pre(Pass& pass, const HyperHandles& h, bool output_head, const float* x, int64_t n, float* flat,
                 float* mix, float* coef, float* xin);
  std::deque<std::vector<float>> owned_vectors_;
  // The current call's tokens and sequences (kept between calls so a warm decode allocates nothing).
  std::vector<int32_t> batch_tokens_;
  std::vector<PassSequence> batch_sequences_;
  std::vector<float> hidden_;      // hidden()
  uint64_t cpu_expert_bytes_ = 0;  // without a device (DeviceExperts counts its own)
  // The host device and its pass (always there); the device pass when attach_device put the pass on a device.
  std::unique_ptr<device::Device> host_;
  std::unique_ptr<Pass> host_pass_, device_pass_;
  std::unique_ptr<DeviceExperts> device_experts_;

  // HETMOE_PROFILE=1: wall time per part of the forward pass, printed to stderr when the model is destroyed; calls of
  // one token (decode steps) and of several (prompts, batches) apart, since their costs differ in kind.
  struct Profile {
    double attention = 0, dense_ffn = 0, moe_ffn = 0, output = 0, rest = 0;
    int64_t calls = 0, tokens = 0;
  };
  bool profile_enabled_ = false;
  Profile profile_[2];  // [0]: one-token calls, [1]: several tokens
};

}  // namespace hetmoe::model
