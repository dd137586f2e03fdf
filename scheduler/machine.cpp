#include "scheduler/machine.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

namespace hetmoe::sched {
namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string& where, const std::string& what) {
  throw std::runtime_error(where + ": " + what);
}

double positive(const json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || !j[key].is_number() || j[key].get<double>() <= 0)
    bad(where, std::string("'") + key + "' must be a positive number");
  return j[key].get<double>();
}

double optional_number(const json& j, const char* key, double fallback) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>() : fallback;
}

Curve curve_of(const json& j, const std::string& where) {
  if (!j.contains("rows") || !j.contains("seconds") || !j["rows"].is_array() || !j["seconds"].is_array())
    bad(where, "a measured tier needs 'rows' and 'seconds' arrays");
  try {
    return Curve(j["rows"].get<std::vector<int64_t>>(), j["seconds"].get<std::vector<double>>());
  } catch (const std::exception& e) {
    bad(where, e.what());
  }
}

CpuTier tier_of(const json& j, const std::string& where, double curve_bytes) {
  CpuTier t;
  if (!j.contains("isa") || !j["isa"].is_string()) bad(where, "every CPU tier needs an 'isa' name");
  t.isa = j["isa"].get<std::string>();
  const std::string at = where + ": tier " + t.isa;
  if (j.contains("rows")) {
    t.curve = curve_of(j, at);
    t.curve_bytes = j.contains("expert_bytes") ? positive(j, "expert_bytes", at) : curve_bytes;
    if (t.curve_bytes <= 0) bad(at, "a measured curve needs 'expert_bytes'");
  } else {
    t.bytes_per_s = positive(j, "bytes_per_s", at);
    t.flops_per_s = positive(j, "flops_per_s", at);
    t.overhead_s = optional_number(j, "overhead_s", 0);
  }
  return t;
}

Machine from_calibration(const json& j, const std::string& where) {
  Machine m;
  m.name = "this machine (hetmoe calibrate)";
  m.cpu_name = j.value("cpu", std::string("this CPU"));
  const double expert_bytes = j.contains("expert") ? optional_number(j["expert"], "bytes", 0) : 0;
  for (const json& b : j.value("bandwidth", json::array()))
    m.dram_bytes_per_s = std::max(m.dram_bytes_per_s, optional_number(b, "bytes_per_s", 0));
  for (const json& c : j.value("expert_ffn", json::array())) {
    // The scalar reference tier is a correctness baseline, never a placement choice.
    if (c.value("isa", std::string()) == "ref") continue;
    m.tiers.push_back(tier_of(c, where, expert_bytes));
  }
  m.assumptions.push_back("measured by hetmoe calibrate on " + j.value("model", std::string("a model")));
  return m;
}

// The optional "link" and "gpu" objects, the same in a hardware profile and in calibrate's profile.
void read_link_and_gpu(const json& j, const std::string& where, Machine& m) {
  if (j.contains("link")) {
    m.link = Link{positive(j["link"], "bytes_per_s", where + ": link"), optional_number(j["link"], "latency_s", 0)};
  }
  if (j.contains("gpu")) {
    const json& g = j["gpu"];
    m.gpu_name = g.value("name", std::string("a GPU"));
    m.gpu = GpuRates{positive(g, "memory_bytes", where + ": gpu"), positive(g, "bytes_per_s", where + ": gpu"),
                     positive(g, "flops_per_s", where + ": gpu"), optional_number(g, "launch_s", 0)};
    if (!m.link) bad(where, "a profile with a 'gpu' needs a 'link'");
  }
}

Machine from_profile(const json& j, const std::string& where) {
  Machine m;
  m.name = j.value("name", std::string("unnamed machine"));
  for (const json& a : j.value("assumptions", json::array()))
    if (a.is_string()) m.assumptions.push_back(a.get<std::string>());
  if (!j.contains("cpu") || !j["cpu"].is_object()) bad(where, "a hardware profile needs a 'cpu' object");
  const json& c = j["cpu"];
  m.cpu_name = c.value("name", std::string("a CPU"));
  m.sockets = c.value("sockets", 1);
  m.cores = c.value("cores", 0);
  m.dram_bytes_per_s = positive(c, "dram_bytes_per_s", where + ": cpu");
  m.dram_bytes = optional_number(c, "dram_bytes", 0);
  for (const json& t : c.value("tiers", json::array())) m.tiers.push_back(tier_of(t, where, 0));
  read_link_and_gpu(j, where, m);
  return m;
}

}  // namespace

CostModel Machine::cost_model() const { return CostModel(tiers, link.value_or(Link{}), gpu); }

Machine parse_machine(const std::string& text, const std::string& where) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    bad(where, std::string("not valid JSON (") + e.what() + ")");
  }
  const std::string format = j.is_object() ? j.value("format", std::string()) : std::string();
  Machine m;
  try {
    if (format == "hetmoe-hw/1") {
      m = from_profile(j, where);
    } else if (format == "hetmoe-profile/1") {
      m = from_calibration(j, where);
      read_link_and_gpu(j, where, m);  // calibrate with a device also records them
    } else {
      bad(where, "unknown format '" + format + "' (expected hetmoe-hw/1 or hetmoe-profile/1)");
    }
  } catch (const json::exception& e) {
    bad(where, std::string("a field has the wrong type (") + e.what() + ")");
  }
  if (m.tiers.empty()) bad(where, "no CPU tier to cost experts with");
  m.cost_model();  // validates the tiers, link and device together
  return m;
}

std::string machine_json(const Machine& m) {
  json tiers = json::array();
  for (const CpuTier& t : m.tiers) {
    if (!t.curve.empty()) {
      tiers.push_back(
          {{"isa", t.isa}, {"expert_bytes", t.curve_bytes}, {"rows", t.curve.rows()}, {"seconds", t.curve.seconds()}});
    } else {
      tiers.push_back({{"isa", t.isa},
                       {"bytes_per_s", t.bytes_per_s},
                       {"flops_per_s", t.flops_per_s},
                       {"overhead_s", t.overhead_s}});
    }
  }
  json j = {{"format", "hetmoe-hw/1"},
            {"name", m.name},
            {"assumptions", m.assumptions},
            {"cpu",
             {{"name", m.cpu_name},
              {"sockets", m.sockets},
              {"cores", m.cores},
              {"dram_bytes_per_s", m.dram_bytes_per_s},
              {"dram_bytes", m.dram_bytes},
              {"tiers", tiers}}}};
  if (m.link) j["link"] = {{"bytes_per_s", m.link->bytes_per_s}, {"latency_s", m.link->latency_s}};
  if (m.gpu)
    j["gpu"] = {{"name", m.gpu_name},
                {"memory_bytes", m.gpu->memory_bytes},
                {"bytes_per_s", m.gpu->bytes_per_s},
                {"flops_per_s", m.gpu->flops_per_s},
                {"launch_s", m.gpu->launch_s}};
  return j.dump(2) + "\n";
}

}  // namespace hetmoe::sched
