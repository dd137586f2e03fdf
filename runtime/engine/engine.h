#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/device/device.h"
#include "runtime/engine/session.h"
#include "runtime/model/model.h"
#include "scheduler/machine.h"
#include "scheduler/routing_trace.h"

namespace hetmoe::engine {

// Where a model runs and how its routed experts are scheduled: what --device and the flags around it say.
struct DeviceOptions {
  // "cpu", "emulated" (a GPU stand-in in host memory), "cuda", or "auto" (cuda when a CUDA GPU is present, else cpu).
  std::string kind = "auto";
  double memory_gb = 0;        // emulated: its capacity (default 24 GB); any device: the weights' budget
  double link_gb_s = 0;        // emulated: throttle copies to this host-device bandwidth (0: no throttle)
  double link_latency_us = 0;  // emulated: and this latency per copy
  int64_t move_rows = 32;   // without a profile: experts not resident but with this many rows in a step move (0: never)
  int move_slots = 2;       // the ring the moved (and prefetched) experts go through
  int64_t admissions = 1;   // adaptive policies: experts the residency may admit per step (0: none)
  int64_t prefetch = 1;     // adaptive policies: next-layer experts prefetched over an idle link per step
  bool host_pass = false;   // norms, attention, routers and the KV cache stay on the host device
  int64_t gpu_layers = -1;  // llama.cpp's -ngl N > 0: checked against the model (all layers or none); -1: not given
  std::string policy{};     // the scheduler's policy for routed experts; empty: its default for the device
  std::string profile{};    // a machine profile for the cost model (calibrate's or hetmoe-hw/1)
  std::string warm_trace{};                        // a routing trace whose counts place the routed experts
  std::vector<std::vector<double>> warm_counts{};  // or these counts (bench's synthetic routing)
};

struct EngineOptions {
  std::string model{};     // a GGUF file
  int threads = 0;         // CPU threads; 0: every core
  std::string critical{};  // split models: how many of each token's experts add their residual ("", a count, "all")
  DeviceOptions device{};
};

// Whether a CUDA GPU can be used: a driver, a GPU and this build's CUDA device (loaded only when asked).
bool cuda_available();

// A machine profile (calibrate's or hetmoe-hw/1) and a routing trace from their files, read with the inputs' bounds
// (io::read_file); errors are hetmoe::Error naming the file.
sched::Machine load_machine(const std::string& path);
sched::RoutingTrace load_routing_trace(const std::string& path);
// Whether the options ask for a device: emulated or cuda, or auto on a machine with a CUDA GPU.
bool wants_device(const DeviceOptions& options);
// The device `options.kind` names; null for "cpu", and for "auto" without a CUDA GPU. Fails with one line for an
// unknown kind, negative sizes, or a CUDA device this machine or build cannot give.
std::unique_ptr<device::Device> open_device(const DeviceOptions& options);

// A model opened with its device, policy, profile, warm trace and threads: the one builder the command line, the
// tests and the server use. The engine owns the device; the model is put on it as the policy says (placement,
// admissions, moves and prefetches from the scheduler), and sessions run on the model.
class Engine {
 public:
  // Fails with one line: a missing or bad file, a bad option, a device policy without a device (or --device cpu
  // with one), a policy the model cannot take (split without a split file), a profile without a device.
  static std::unique_ptr<Engine> open(const EngineOptions& options);
  ~Engine();

  model::Model& model() { return *model_; }
  const model::Model& model() const { return *model_; }
  // The device the model's pass and experts use besides the host; null when everything runs on the CPU.
  device::Device* device() const { return device_.get(); }
  // The policy the routed experts follow ("cpu" without a device).
  const std::string& policy() const { return policy_; }
  // What opening decided (the device, what it holds), one line each, for a command to show.
  const std::vector<std::string>& notes() const { return notes_; }

  // A session of n_ctx positions (0: min(4096, the training context)): its KV cache lives where the pass runs.
  std::unique_ptr<Session> session(int64_t n_ctx = 0);

 private:
  Engine() = default;
  // Declared first, so destroyed after the model that uses it.
  std::unique_ptr<device::Device> device_;
  std::unique_ptr<model::Model> model_;
  std::string policy_;
  std::vector<std::string> notes_;
};

}  // namespace hetmoe::engine
