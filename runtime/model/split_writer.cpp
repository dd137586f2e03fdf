#include "runtime/model/split_writer.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <mutex>
#include <span>

#include "cpu_kernels/kernel_table.h"
#include "cpu_kernels/ops.h"
#include "cpu_kernels/thread_pool.h"
#include "quant/lowbit.h"
#include "quant/ref.h"
#include "runtime/error.h"
#include "runtime/gguf/reader.h"
#include "runtime/gguf/writer.h"
#include "runtime/model/config.h"

namespace hetmoe {
namespace {

namespace fs = std::filesystem;
using model::is_routed_expert_tensor;
using model::kSplitGpuTypeKey;
using model::kSplitResidualBitsKey;
using model::kSplitSourceKey;
using model::kSplitVersionKey;
using model::split_gpu_name;
using model::split_residual_name;
using quant::GgmlType;

// Squared norms summed over a tensor's rows, from every thread.
struct ErrorSums {
  std::mutex mutex;
  double weight = 0, gpu = 0, combined = 0;
  void add(double w, double g, double c) {
    std::lock_guard lock(mutex);
    weight += w;
    gpu += g;
    combined += c;
  }
};

// Squared norms of one thread's rows: of W, of W - deq(W^Q) and of W - deq(W^Q) - deq(W^R). Each row is summed in
// eight float lanes (which the compiler vectorizes) and added to the doubles.
struct RowErrors {
  double weight = 0, gpu = 0, combined = 0;
  void add_row(const float* w, const float* q, const float* r, int64_t n) {
    constexpr int kLanes = 8;
    float sw[kLanes] = {}, sg[kLanes] = {}, sc[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
      for (int l = 0; l < kLanes; ++l) {
        const float e = w[i + l] - q[i + l], f = e - r[i + l];
        sw[l] += w[i + l] * w[i + l];
        sg[l] += e * e;
        sc[l] += f * f;
      }
    for (; i < n; ++i) {
      const float e = w[i] - q[i], f = e - r[i];
      sw[0] += w[i] * w[i];
      sg[0] += e * e;
      sc[0] += f * f;
    }
    for (int l = 0; l < kLanes; ++l) {
      weight += sw[l];
      gpu += sg[l];
      combined += sc[l];
    }
  }
};

// A source row as floats; fails on values that are not finite (a damaged tensor).
void source_row(const cpu::KernelTable& kernels, const gguf::TensorInfo& t, int64_t r, float* out) {
  kernels.dequantize_row(t.type, t.row(r), out, t.ne[0]);
  if (!cpu::all_finite(out, t.ne[0]))
    fail("{}: row {} holds a value that is not finite; the file is damaged", t.name, r);
}

// back = w - q, with the widest vector unit (w + (-1) q rounds as w - q does, fused or not).
void difference(const cpu::KernelTable& kernels, const float* w, const float* q, float* back, int64_t n) {
  std::copy_n(w, n, back);
  kernels.axpy(n, -1.0f, q, back);
}

}  // namespace

GgmlType residual_type(int residual_bits, int64_t n) {
  GgmlType t;
  switch (residual_bits) {
    case 2:
      t = GgmlType::Q2_K;
      break;
    case 3:
      t = GgmlType::Q3_K;
      break;
    case 4:
      t = GgmlType::Q4_K;
      break;
    case 5:
      t = GgmlType::Q5_K;
      break;
    case 6:
      t = GgmlType::Q6_K;
      break;
    case 8:
      return GgmlType::Q8_0;
    default:
      fail("--residual-bits {}: use 2, 3, 4, 5, 6 or 8", residual_bits);
  }
  if (n % quant::type_info(t).block_size == 0) return t;
  // llama.cpp's fallbacks for rows that 256-value blocks do not divide.
  switch (t) {
    case GgmlType::Q2_K:
    case GgmlType::Q3_K:
      return GgmlType::Q4_0;
    case GgmlType::Q4_K:
      return GgmlType::Q5_0;
    case GgmlType::Q5_K:
      return GgmlType::Q5_1;
    default:
      return GgmlType::Q8_0;
  }
}

std::vector<SplitTensorReport> split_model(const SplitOptions& opt, const SplitProgress& progress) {
  const auto gpu_type = quant::lowbit_type({.bits = opt.gpu_bits, .group = opt.group});
  if (!gpu_type)
    fail("--gpu-bits {} with --group {}: use 2, 3 or 4 bits in groups of 64 or 128", opt.gpu_bits, opt.group);
  residual_type(opt.residual_bits, 256);  // checks the bit count
  std::error_code ec;
  if (fs::exists(opt.out, ec) && fs::equivalent(opt.model, opt.out, ec))
    fail("{}: the output would overwrite the input", opt.out);

  const gguf::GgufFile in = gguf::GgufFile::open(opt.model);
  const model::ModelConfig config = model::read_config(in);  // fails for architectures hetmoe does not know
  if (in.find(kSplitVersionKey)) fail("{}: already a split file", opt.model);
  if (config.n_expert <= 0) fail("{}: the model has no routed experts to split", opt.model);

  gguf::GgufWriter writer;
  for (const auto& [key, value] : in.metadata()) writer.set(key, value);
  writer.set(kSplitVersionKey, gguf::Value::u32(quant::kLowBitLayoutVersion));
  writer.set(kSplitGpuTypeKey, gguf::Value::string(std::string(quant::type_info(*gpu_type).name)));
  const bool from_source = opt.critical_from == model::CriticalFrom::kSource;
  if (from_source)
    writer.set(model::kSplitCriticalFromKey, gguf::Value::string(model::critical_from_name(opt.critical_from)));
  else
    writer.set(kSplitResidualBitsKey, gguf::Value::u32(static_cast<uint32_t>(opt.residual_bits)));
  writer.set(kSplitSourceKey, gguf::Value::string(fs::path(opt.model).filename().string()));

  cpu::ThreadPool pool(cpu::resolve_threads(opt.threads));
  double total = 0, done = 0;
  int n_split = 0;
  for (const gguf::TensorInfo& t : in.tensors()) {
    const bool split = is_routed_expert_tensor(t.name);
    if (split) {
      if (t.n_dims != 3 || t.ne[2] != config.n_expert)
        fail("{}: tensor {} has shape {}, expected {} experts", opt.model, t.name, t.shape_string(), config.n_expert);
      if (t.ne[0] % opt.group != 0)
        fail("{}: rows of {} values in {} are not whole groups of {}", opt.model, t.ne[0], t.name, opt.group);
      ++n_split;
    }
    total += static_cast<double>(t.nbytes);
  }
  if (n_split == 0) fail("{}: no routed expert tensors (blk.N.ffn_*_exps.weight) found", opt.model);

  auto advance = [&](double bytes, const std::string& tensor) {
    done += bytes;
    if (progress) progress(done, total, tensor);
  };
  std::vector<uint8_t> gpu_part;  // the W^Q of the residual just written, until its own tensor
  std::vector<SplitTensorReport> report;
  report.reserve(n_split);
  for (const gguf::TensorInfo& t : in.tensors()) {
    const std::vector<int64_t> ne(t.ne.begin(), t.ne.begin() + t.n_dims);
    if (!is_routed_expert_tensor(t.name)) {
      writer.add_tensor(t.name, t.type, ne, [&t, &advance](std::span<uint8_t> out) {
        std::copy(t.data, t.data + t.nbytes, out.data());
        advance(static_cast<double>(t.nbytes), t.name);
      });
      continue;
    }
    const GgmlType res_type = from_source ? t.type : residual_type(opt.residual_bits, t.ne[0]);
    const size_t q_row = quant::row_bytes(*gpu_type, t.ne[0]), r_row = quant::row_bytes(res_type, t.ne[0]);
    report.push_back({t.name, t.type, *gpu_type, res_type});
    const size_t index = report.size() - 1;
    const GgmlType q_type = *gpu_type;
    // One pass over the source rows (threads take blocks of rows) gives both parts: the residual W - deq(W^Q) (or the
    // source rows as they are) is written first, and W^Q is kept until its own tensor follows (one tensor's W^Q,
    // under a quarter of its source at 4 bits or less: memory stays bounded by the largest tensor).
    writer.add_tensor(from_source ? t.name : split_residual_name(t.name), res_type, ne,
                      [&, q_type, q_row, r_row, res_type, index](std::span<uint8_t> out) {
                        gpu_part.resize(q_row * static_cast<size_t>(t.n_rows));
                        ErrorSums sums;
                        const cpu::KernelTable& kernels = cpu::kernels();
                        pool.parallel_for_balanced(t.n_rows, 64, [&](int64_t r0, int64_t r1) {
                          const int64_t n = t.ne[0];
                          std::vector<float> w(n), q(n), back(n);
                          RowErrors errors;
                          for (int64_t r = r0; r < r1; ++r) {
                            source_row(kernels, t, r, w.data());
                            uint8_t* wq = gpu_part.data() + r * q_row;
                            kernels.quantize_row(q_type, w.data(), wq, n);
                            uint8_t* dst = out.data() + r * r_row;
                            if (from_source) {
                              std::copy_n(t.row(r), r_row, dst);  // exact: W - deq(W^Q) is back as it is
                              if (!opt.measure_errors) continue;
                            }
                            kernels.dequantize_row(q_type, wq, q.data(), n);
                            difference(kernels, w.data(), q.data(), back.data(), n);
                            if (!from_source) {
                              kernels.quantize_row(res_type, back.data(), dst, n);
                              if (!opt.measure_errors) continue;
                              kernels.dequantize_row(res_type, dst, back.data(), n);
                            }
                            errors.add_row(w.data(), q.data(), back.data(), n);
                          }
                          sums.add(errors.weight, errors.gpu, errors.combined);
                        });
                        SplitTensorReport& rep = report[index];
                        rep.gpu_error = sums.weight > 0 ? std::sqrt(sums.gpu / sums.weight) : 0;
                        rep.combined_error = sums.weight > 0 ? std::sqrt(sums.combined / sums.weight) : 0;
                        advance(static_cast<double>(t.nbytes), t.name);
                      });
    writer.add_tensor(split_gpu_name(t.name), q_type, ne,
                      [&](std::span<uint8_t> out) { std::copy(gpu_part.begin(), gpu_part.end(), out.begin()); });
  }
  writer.write(opt.out, opt.max_shard_bytes);
  return report;
}

}  // namespace hetmoe
