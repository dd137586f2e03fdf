#include "tools/flags.h"

#include <fmt/format.h>

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <regex>
#include <thread>

#include "runtime/error.h"

namespace hetmoe::cli {
namespace {

// The value as a double, or an explanation of why it is not a finite number.
std::string parse_finite(const std::string& text, double* value) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size()) return fmt::format("'{}' is not a number", text);
  if (!std::isfinite(v) || errno == ERANGE) return fmt::format("{} is not a finite number", text);
  *value = v;
  return "";
}

// 100000, not 1e+05; 0.01 as it is.
std::string number(double v) {
  return v == std::floor(v) && std::fabs(v) < 1e15 ? fmt::format("{}", static_cast<int64_t>(v)) : fmt::format("{}", v);
}

std::string unit_suffix(const std::string& unit) { return unit.empty() ? "" : " " + unit; }

// Representative tensor names of a MoE file: routed experts' weights and biases in every layer a model may have, and
// every other kind of tensor. A -ot pattern is judged by which of these it matches.
struct TensorSample {
  std::string name;
  bool routed_expert;
};
std::vector<TensorSample> tensor_samples() {
  std::vector<TensorSample> s{{"token_embd.weight", false}, {"output_norm.weight", false}, {"output.weight", false}};
  for (int l = 0; l < 128; ++l) {
    const std::string b = fmt::format("blk.{}.", l);
    for (const char* part : {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_up_exps"}) {
      s.push_back({b + part + ".weight", true});
      s.push_back({b + part + ".bias", true});
    }
    for (const char* other : {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_a", "attn_kv_a_mqa",
                              "attn_k_b", "attn_v_b", "ffn_norm", "ffn_gate_inp", "ffn_gate", "ffn_up", "ffn_down",
                              "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp", "exp_probs_b"})
      s.push_back({b + other + ".weight", false});
  }
  return s;
}

}  // namespace

CLI::Validator in_range(double lo, double hi, const std::string& unit) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double v = 0;
        if (std::string why = parse_finite(text, &v); !why.empty()) return why;
        if (v < lo || v > hi)
          return fmt::format("{} is out of range: use {} to {}{}", text, number(lo), number(hi), unit_suffix(unit));
        return "";
      },
      fmt::format("{}..{}", lo, hi));
}

CLI::Validator at_least(double lo, const std::string& unit) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double v = 0;
        if (std::string why = parse_finite(text, &v); !why.empty()) return why;
        if (v < lo) return fmt::format("{} is out of range: use {}{} or more", text, number(lo), unit_suffix(unit));
        return "";
      },
      fmt::format(">= {}", lo));
}

std::vector<std::string> rename_llama_flags(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  for (size_t i = 1; i < args.size(); ++i) {
    std::string& a = args[i];
    if (a == "--") break;
    if (a == "-ngl" || a.rfind("-ngl=", 0) == 0) a = "--n-gpu-layers" + a.substr(4);
    if (a == "-ot" || a.rfind("-ot=", 0) == 0) a = "--override-tensor" + a.substr(3);
  }
  return args;
}

void add_llama_offload(CLI::App* cmd, LlamaOffload* f) {
  cmd->add_option("--n-gpu-layers", f->gpu_layers,
                  "llama.cpp's -ngl: 0 = --device cpu; the model's layer count or more = the forward pass on the "
                  "device (hetmoe offloads all layers or none)")
      ->check(in_range(0, 1e6, "layers"));
  cmd->add_flag("--cpu-moe", f->cpu_moe, "llama.cpp's --cpu-moe: = --policy static (routed experts on the CPU)");
  cmd->add_option("--n-cpu-moe", f->n_cpu_moe, "llama.cpp's --n-cpu-moe: refused, with hetmoe's equivalent")
      ->check(in_range(0, 1e6, "layers"));
  cmd->add_option("--override-tensor", f->override_tensor,
                  "llama.cpp's -ot PATTERN=DEVICE: routed experts to CPU = --policy static; others refused, with "
                  "hetmoe's equivalent");
}

std::vector<std::string> apply_llama_offload(const LlamaOffload& f, engine::DeviceOptions& d) {
  std::vector<std::string> notes;
  auto set_policy_static = [&](const std::string& flag) {
    if (!d.policy.empty() && d.policy != "static")
      fail("{} keeps the routed experts on the CPU, as --policy static does; it contradicts --policy {}", flag,
           d.policy);
    d.policy = "static";
    notes.push_back(fmt::format(
        "{} -> --policy static (routed experts on the CPU, the rest on the device; a batch of 32+ tokens moves them)",
        flag));
  };
  if (f.gpu_layers == 0) {
    if (d.kind == "emulated" || d.kind == "cuda")
      fail("-ngl 0 keeps every layer on the CPU; it contradicts --device {}", d.kind);
    d.kind = "cpu";
    notes.push_back("-ngl 0 -> --device cpu");
  } else if (f.gpu_layers > 0) {
    if (d.kind == "cpu") fail("-ngl {} puts layers on a device; it contradicts --device cpu", f.gpu_layers);
    d.gpu_layers = f.gpu_layers;
    notes.push_back(
        fmt::format("-ngl {} -> the forward pass on the device (--device {}); routed experts placed by the policy",
                    f.gpu_layers, d.kind));
  }
  if (f.cpu_moe) set_policy_static("--cpu-moe");
  if (f.n_cpu_moe >= 0)
    fail(
        "--n-cpu-moe {}: hetmoe places experts one by one, not by layer: use --cpu-moe (all routed experts on the "
        "CPU), or --device-memory GB to bound what the device holds (the crossover policy keeps the hottest there)",
        f.n_cpu_moe);
  for (const std::string& spec : f.override_tensor) {
    const size_t eq = spec.rfind('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size())
      fail("-ot {}: use PATTERN=DEVICE, as llama.cpp does (e.g. exps=CPU)", spec);
    const std::string pattern = spec.substr(0, eq);
    std::string device = spec.substr(eq + 1);
    for (char& c : device) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    std::regex re;
    try {
      re = std::regex(pattern);
    } catch (const std::regex_error&) {
      fail("-ot {}: '{}' is not a regular expression", spec, pattern);
    }
    bool all_experts = true, any_expert = false, any_other = false;
    for (const TensorSample& t : tensor_samples()) {
      const bool hit = std::regex_search(t.name, re);
      if (t.routed_expert) {
        all_experts = all_experts && hit;
        any_expert = any_expert || hit;
      } else {
        any_other = any_other || hit;
      }
    }
    if (device == "CPU" && all_experts && !any_other) {
      set_policy_static("-ot " + spec);
      continue;
    }
    if (device == "CPU" && any_expert && !any_other)
      fail(
          "-ot {}: hetmoe does not pin some layers' experts: use --cpu-moe for all of them, or --device-memory GB to "
          "bound what the device holds (the crossover policy keeps the hottest experts there)",
          spec);
    fail(
        "-ot {}: hetmoe places tensors by kind, not by name: the forward pass goes to the device (-ngl, --host-pass "
        "to keep it on the CPU), routed experts by --policy (static = all on the CPU) within --device-memory",
        spec);
  }
  return notes;
}

std::vector<std::string>& flag_notes() {
  static std::vector<std::string> notes;
  return notes;
}

CLI::Validator thread_count() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        int64_t n = -1;
        const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
        if (ec != std::errc() || end != text.data() + text.size() || n < 0 || n > 1000000)
          return fmt::format("'{}' is not a thread count: use 0 (all) to 1000000", text);
        const int hardware = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
        if (n > hardware) {
          fmt::print(stderr, "hetmoe: warning: -t {} is more than the {} hardware threads here; using {}\n", n,
                     hardware, hardware);
          n = hardware;
        }
        text = std::to_string(n);
        return "";
      },
      "0..");
}

}  // namespace hetmoe::cli
