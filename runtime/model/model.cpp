#include "runtime/model/model.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "cpu_kernels/numa/memory.h"
#include "cpu_kernels/numa/topology.h"
#include "cpu_kernels/ops.h"
#include "cpu_kernels/scratch.h"
#include "quant/lowbit.h"
#include "quant/ref.h"
#include "runtime/error.h"
#include "runtime/model/archs.h"
#include "runtime/model/split.h"

namespace hetmoe::model {
namespace {

std::string shape_of(std::initializer_list<int64_t> ne) {
  std::string s = "{";
  for (int64_t v : ne) s += (s.size() > 1 ? ", " : "") + std::to_string(v);
  return s + "}";
}

}  // namespace

namespace {

// Threads pinned one per physical core, spread over the NUMA nodes in proportion to their cores, unless
// HETMOE_PIN=0 or there are more threads than hardware threads. HETMOE_TOPOLOGY (an hwloc synthetic description,
// e.g. "package:2 numa:1 core:1 pu:1") replaces the machine's topology, so multi-node placement runs end to end
// on a one-node machine in tests.
std::unique_ptr<cpu::ThreadPool> make_pool(int n_threads) {
  const char* pin = std::getenv("HETMOE_PIN");
  const char* synthetic = std::getenv("HETMOE_TOPOLOGY");
  const cpu::Topology topology =
      synthetic && *synthetic ? cpu::Topology::synthetic(synthetic) : cpu::Topology::detect();
  int n_pus = 0;
  for (const cpu::NumaNode& node : topology.nodes()) n_pus += static_cast<int>(node.pus.size());
  if ((pin && std::string(pin) == "0") || n_threads > n_pus) return std::make_unique<cpu::ThreadPool>(n_threads);
  return std::make_unique<cpu::ThreadPool>(cpu::place_threads(topology, n_threads));
}

}  // namespace

std::unique_ptr<Model> Model::load(const std::string& path, int n_threads) {
  auto file = std::make_unique<gguf::GgufFile>(gguf::GgufFile::open(path));
  ModelConfig config = read_config(*file);
  const ArchSpec* arch = find_arch(config.arch_name);  // read_config failed for an unknown one
  std::unique_ptr<Model> model = arch->make(std::move(file), std::move(config), n_threads);
  if (!model->binds_to_nodes()) model->map_huge_pages();
  model->place_on_nodes();
  // The pass on the host device: the weights where they lie, nothing copied.
  model->host_pass_ = std::make_unique<Pass>(*model->host_, model->host_->create_stream(), model->weights_);
  return model;
}

bool Model::binds_to_nodes() const {
  const cpu::ThreadPlacement* p = pool_->placement();
  const char* env = std::getenv("HETMOE_NUMA");
  if (!p || (env && std::string(env) == "0")) return false;
  int nodes_with_threads = 0;
  for (const std::vector<int>& threads : p->threads_of_node) nodes_with_threads += threads.empty() ? 0 : 1;
  return nodes_with_threads >= 2;
}

void Model::map_huge_pages() {
  const char* env = std::getenv("HETMOE_HUGE_PAGES");
  if (env && std::string(env) == "0") return;
  // Files below 64 MB gain little and are left as they are.
  const gguf::HugePages h = file_->settle_huge_pages(size_t{64} << 20);
  // Said when it took (the chunks read again map in 2 MB pages): pages still being written back (a file just written)
  // stay cached, and the next load tries again.
  if (h.dropped && h.sampled_after > 0 && h.huge_after * 16 >= h.sampled_after * 15)
    fmt::print(stderr,
               "hetmoe: {} was cached in pages smaller than 2 MB; dropped it from the page cache so that it maps in "
               "2 MB pages (read again from disk, this once; HETMOE_HUGE_PAGES=0 keeps the cache as it is)\n",
               file_->path());
}

void Model::place_on_nodes() {
  if (!binds_to_nodes()) return;
  const cpu::ThreadPlacement* p = pool_->placement();
  // The os index of each placement node, in placement order.
  std::vector<int> node_os(p->threads_of_node.size(), -1);
  for (size_t k = 0; k < node_os.size(); ++k)
    if (!p->threads_of_node[k].empty()) node_os[k] = p->nodes[static_cast<size_t>(p->threads_of_node[k].front())];
  // Every matrix's rows go to the node whose threads compute them: an expert tensor per expert (the executor splits
  // each expert's rows by partition_rows), any other matrix as a whole (matmul splits rows evenly over the threads,
  // which are numbered node by node). The embedding table is looked up by token, not streamed: left alone.
  for (const gguf::TensorInfo& t : file_->tensors()) {
    if (t.n_dims < 2 || &t == token_embd_) continue;
    const bool experts = t.n_dims == 3 && t.name.find("_exps") != std::string::npos;
    const int64_t blocks = experts ? t.ne[2] : 1, rows = experts ? t.ne[1] : t.n_rows;
    for (int64_t b = 0; b < blocks; ++b)
      numa_bound_bytes_ +=
          cpu::bind_rows_by_node(*p, node_os, t.data + static_cast<size_t>(b * rows) * t.row_bytes, rows, t.row_bytes);
  }
}

Model::Model(std::unique_ptr<gguf::GgufFile> file, ModelConfig config, int n_threads)
    : file_(std::move(file)),
      config_(std::move(config)),
      pool_(make_pool(n_threads)),
      kernels_(cpu::kernels()),
      host_(device::make_host_device(*pool_)) {
  const char* profile = std::getenv("HETMOE_PROFILE");
  profile_enabled_ = profile && std::string(profile) != "0";
}

Model::~Model() {
  if (!profile_enabled_) return;
  // A one-token call on the CPU reads each part's weights once (the routed experts: n_used of them): its bytes and the
  // rate it read them at, to set against the DRAM bandwidth. Not with a device, which reads some of them itself.
  const bool cpu_only = !device_pass_ && !device_experts_;
  const ActiveBytes bytes = active_bytes_by_part(*file_, config_);
  for (const Profile& p : profile_) {
    if (p.calls == 0) continue;
    const double total = p.attention + p.dense_ffn + p.moe_ffn + p.output + p.rest;
    const bool rates = cpu_only && &p == &profile_[0];
    auto part = [&](const char* name, double s, double part_bytes) {
      const double a_call = s / static_cast<double>(p.calls);
      fmt::print(stderr, "  {:<10} {:9.1f} ms  {:5.1f}%  {:8.3f} ms a call", name, s * 1e3,
                 100 * s / std::max(total, 1e-12), a_call * 1e3);
      if (rates && part_bytes > 0)
        fmt::print(stderr, "  {:8.1f} MB  {:6.1f} GB/s", part_bytes / 1e6, part_bytes / std::max(a_call, 1e-12) / 1e9);
      fmt::print(stderr, "\n");
    };
    fmt::print(stderr, "hetmoe profile, {}: {} forward calls, {} tokens, {:.1f} ms\n",
               &p == &profile_[0] ? "one-token calls" : "calls of several tokens", p.calls, p.tokens, total * 1e3);
    part("attention", p.attention, bytes.attention);
    part("dense ffn", p.dense_ffn, bytes.dense_ffn);
    part("moe ffn", p.moe_ffn, bytes.moe_ffn);
    part("output", p.output, bytes.output);
    part("rest", p.rest, 0);  // norms and an embedding row: its time is not their reading
  }
}

const gguf::TensorInfo* Model::optional_tensor(const std::string& name, std::initializer_list<int64_t> ne,
                                               bool ids) const {
  const gguf::TensorInfo* t = file_->find_tensor(name);
  if (!t) return nullptr;
  bool ok = true;
  int i = 0;
  for (int64_t v : ne) ok = ok && t->ne[i++] == v;
  for (; i < gguf::kMaxDims; ++i) ok = ok && t->ne[i] == 1;
  if (!ok) fail("{}: tensor '{}' has shape {}, expected {}", file_->path(), name, t->shape_string(), shape_of(ne));
  if ((t->type == quant::GgmlType::I32) != ids)
    fail("{}: tensor '{}' is stored as {}, expected {}", file_->path(), name, quant::type_info(t->type).name,
         ids ? "I32 ids" : "weights (integers are not)");
  return t;
}

const gguf::TensorInfo& Model::tensor(const std::string& name, std::initializer_list<int64_t> ne, bool ids) const {
  const gguf::TensorInfo* t = optional_tensor(name, ne, ids);
  if (!t) fail("{}: missing tensor '{}' (expected shape {})", file_->path(), name, shape_of(ne));
  return *t;
}

cpu::WeightMatrix Model::as_matrix(const gguf::TensorInfo& t) const {
  if (!kernels_.dot_for(t.type))
    fail(
        "{}: tensor '{}' is stored as {}, which hetmoe does not multiply with (an activation format, not a weight "
        "format)",
        file_->path(), t.name, quant::type_info(t.type).name);
  return {t.type, t.ne[0], t.n_rows, t.row_bytes, t.data};
}

cpu::WeightMatrix Model::matrix(const std::string& name, int64_t n_cols, int64_t n_rows) const {
  return as_matrix(tensor(name, {n_cols, n_rows}));
}

const float* Model::optional_vector(const std::string& name, int64_t n) {
  const gguf::TensorInfo* t = optional_tensor(name, {n});
  return t ? as_floats(*t) : nullptr;
}

const float* Model::as_floats(const gguf::TensorInfo& t) {
  if (t.type == quant::GgmlType::F32) return reinterpret_cast<const float*>(t.data);
  std::vector<float>& v = owned_vectors_.emplace_back(t.n_elements());
  for (int64_t r = 0; r < t.n_rows; ++r) quant::dequantize_row(t.type, t.row(r), v.data() + r * t.ne[0], t.ne[0]);
  return v.data();
}

const float* Model::vector(const std::string& name, int64_t n) {
  const float* v = optional_vector(name, n);
  if (!v) fail("{}: missing tensor '{}' (expected shape {{{}}})", file_->path(), name, n);
  return v;
}

void Model::bind_common() {
  const ModelConfig& c = config_;
  const int64_t E = c.n_embd;
  token_embd_ = &tensor("token_embd.weight", {E, c.n_vocab});
  output_norm_ = weights_.add(vector("output_norm.weight", E), E);
  const gguf::TensorInfo* out = optional_tensor("output.weight", {E, c.n_vocab});
  output_ = as_matrix(out ? *out : *token_embd_);  // tied embeddings when the file has no output matrix

  // The MTP blocks' attention and FFN are bound as the layers after the trunk's.
  const int64_t n_bound = c.n_layer + c.n_mtp;
  handles_.resize(n_bound);
  ffn_.resize(n_bound);
  // A split file (hetmoe split): the routed experts come as W^Q and W^R, in a layout this build must know.
  const bool split = file_->find(kSplitVersionKey) != nullptr;
  // A source split keeps each expert tensor under its own name: the critical items' weights.
  const bool critical_whole =
      split && parse_critical_from(file_->get_string(kSplitCriticalFromKey).value_or("residual"),
                                   file_->path() + ": " + kSplitCriticalFromKey) == CriticalFrom::kSource;
  auto critical_name = [&](const std::string& name) { return critical_whole ? name : split_residual_name(name); };
  if (split && file_->require_int(kSplitVersionKey) != quant::kLowBitLayoutVersion)
    fail("{}: split layout version {}, this hetmoe reads version {}", file_->path(),
         file_->require_int(kSplitVersionKey), quant::kLowBitLayoutVersion);
  for (int64_t l = 0; l < n_bound; ++l) {
    weights_.host_only(l >= c.n_layer);  // the MTP blocks run on the host pass only
    LayerHandles& h = handles_[l];
    h.attn_norm = weights_.add(vector(blk(l, "attn_norm"), E), E);
    h.ffn_norm = weights_.add(vector(blk(l, c.ffn_norm), E), E);
    FfnWeights& f = ffn_[l];
    if (!c.is_moe_layer(l)) {
      if (c.n_ff <= 0) fail("{}: feed_forward_length is missing for dense block {}", file_->path(), l);
      f.gate = matrix(blk(l, "ffn_gate"), E, c.n_ff);
      f.up = matrix(blk(l, "ffn_up"), E, c.n_ff);
      f.down = matrix(blk(l, "ffn_down"), c.n_ff, E);
      continue;
    }
    MoeWeights& m = f.moe;
    const int64_t ne = c.n_expert, ff = c.n_ff_exp;
    m.n_expert = ne;
    m.n_ff_exp = ff;
    m.gate_inp = matrix(blk(l, "ffn_gate_inp"), E, ne);
    m.probs_bias = optional_vector("blk." + std::to_string(l) + ".exp_probs_b.bias", ne);
    h.router = weights_.add(m.gate_inp);
    if (m.probs_bias) h.router_bias = weights_.add(m.probs_bias, ne);
    if (const float* b = optional_vector(blk(l, "ffn_gate_inp", "bias"), ne)) h.router_logit_bias = weights_.add(b, ne);
    // Expert biases (gpt-oss): [n_expert][width] each, all three or none.
    if (optional_tensor(blk(l, "ffn_gate_exps", "bias"), {ff, ne})) {
      auto f32 = [&](const gguf::TensorInfo& t) {
        if (t.type != quant::GgmlType::F32) fail("{}: tensor '{}' must be F32", file_->path(), t.name);
        return reinterpret_cast<const float*>(t.data);
      };
      m.gate_exps_bias = f32(tensor(blk(l, "ffn_gate_exps", "bias"), {ff, ne}));
      m.up_exps_bias = f32(tensor(blk(l, "ffn_up_exps", "bias"), {ff, ne}));
      m.down_exps_bias = f32(tensor(blk(l, "ffn_down_exps", "bias"), {E, ne}));
    }
    m.clamped_swiglu = c.clamped_swiglu;
    if (split) {
      m.gate_exps = as_matrix(tensor(split_gpu_name(blk(l, "ffn_gate_exps")), {E, ff, ne}));
      m.up_exps = as_matrix(tensor(split_gpu_name(blk(l, "ffn_up_exps")), {E, ff, ne}));
      m.down_exps = as_matrix(tensor(split_gpu_name(blk(l, "ffn_down_exps")), {ff, E, ne}));
      m.gate_exps_r = as_matrix(tensor(critical_name(blk(l, "ffn_gate_exps")), {E, ff, ne}));
      m.up_exps_r = as_matrix(tensor(critical_name(blk(l, "ffn_up_exps")), {E, ff, ne}));
      m.down_exps_r = as_matrix(tensor(critical_name(blk(l, "ffn_down_exps")), {ff, E, ne}));
      m.critical_whole = critical_whole;
      m.n_critical = kDefaultCritical;
    } else {
      m.gate_exps = as_matrix(tensor(blk(l, "ffn_gate_exps"), {E, ff, ne}));
      m.up_exps = as_matrix(tensor(blk(l, "ffn_up_exps"), {E, ff, ne}));
      m.down_exps = as_matrix(tensor(blk(l, "ffn_down_exps"), {ff, E, ne}));
    }
    if (c.n_expert_shared > 0) {
      const int64_t fs = c.n_ff_shared > 0 ? c.n_ff_shared : ff * c.n_expert_shared;
      m.has_shared = true;
      m.shared_gate = optional_vector(blk(l, "ffn_gate_inp_shexp"), E);
      m.gate_shexp = matrix(blk(l, "ffn_gate_shexp"), E, fs);
      m.up_shexp = matrix(blk(l, "ffn_up_shexp"), E, fs);
      m.down_shexp = matrix(blk(l, "ffn_down_shexp"), fs, E);
    }
  }
  for (int64_t l = c.n_layer; l < n_bound; ++l) {
    MtpHandles& m = mtp_.emplace_back();
    m.eh_proj = weights_.add(matrix(blk(l, "nextn.eh_proj"), 2 * E, E));
    m.enorm = weights_.add(vector(blk(l, "nextn.enorm"), E), E);
    m.hnorm = weights_.add(vector(blk(l, "nextn.hnorm"), E), E);
    m.head_norm = weights_.add(vector(blk(l, "nextn.shared_head_norm"), E), E);
    m.embed = optional_tensor(blk(l, "nextn.embed_tokens"), {E, c.n_vocab});
    if (!m.embed) m.embed = token_embd_;
    const gguf::TensorInfo* head = optional_tensor(blk(l, "nextn.shared_head_head"), {E, c.n_vocab});
    m.head = head ? as_matrix(*head) : output_;
  }
  weights_.host_only(false);
}

void Model::bind_hyper_connections() {
  const ModelConfig& c = config_;
  const int64_t S = c.hc_streams, W = S * c.n_embd, n_mix = (2 + S) * S;
  auto bind = [&](const std::string& prefix, int64_t mixes, int64_t scales) {
    HyperHandles h;
    h.fn = weights_.add(matrix(prefix + "_fn.weight", W, mixes));
    h.scale = weights_.add(vector(prefix + "_scale.weight", scales), scales);
    h.base = weights_.add(vector(prefix + "_base.weight", mixes), mixes);
    return h;
  };
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    hyper_attn_.push_back(bind(b + "hc_attn", n_mix, 3));
    hyper_ffn_.push_back(bind(b + "hc_ffn", n_mix, 3));
  }
  hyper_out_ = bind("output_hc", S, 1);
}

bool Model::split() const { return file_->find(kSplitVersionKey) != nullptr; }

void Model::set_critical(int64_t n_critical) {
  for (FfnWeights& f : ffn_) f.moe.n_critical = n_critical;
}

KvCache Model::make_mtp_cache(int64_t n_ctx) const {
  if (config_.n_mtp == 0) fail("{}: the model has no MTP block to draft with", file_->path());
  check_context_size(n_ctx);
  std::vector<LayerCache> layers(static_cast<size_t>(config_.n_layer));
  for (int64_t l = config_.n_layer; l < config_.n_layer + config_.n_mtp; ++l) layers.push_back(cache_layer(l));
  return KvCache(std::move(layers), n_ctx);
}

void Model::check_context_size(int64_t n_ctx) const {
  if (n_ctx <= 0) fail("context size must be positive, got {}", n_ctx);
  if (n_ctx > config_.n_ctx_train)
    fail("context size {} exceeds the model's training context of {}", n_ctx, config_.n_ctx_train);
}

KvCache Model::make_cache(int64_t n_ctx) const {
  check_context_size(n_ctx);
  std::vector<LayerCache> layers;
  for (int64_t l = 0; l < config_.n_layer; ++l) layers.push_back(cache_layer(l));
  if (device_pass_) {
    // On the device when it fits and leaves room for the pass's working buffers (an eighth of the device, at most
    // 1 GB); else a host cache, and the pass of its calls runs on the host.
    device::Device& d = device_pass_->device;
    const size_t bytes = KvCache::bytes_for(layers, n_ctx);
    const size_t keep = std::min(d.capacity() / 8, size_t{1} << 30);
    if (d.used() + bytes + keep <= d.capacity()) {
      try {
        return KvCache(d, layers, n_ctx);
      } catch (const Error&) {
        // the allocation failed after all: the host cache below
      }
    }
  }
  return KvCache(std::move(layers), n_ctx);
}

}  // namespace hetmoe::model
