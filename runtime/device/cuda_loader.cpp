// The CUDA device, loaded at run time: the hetmoe binary links neither cuBLAS nor the CUDA runtime (about 225 MB
// resident once loaded). libhetmoe_cuda.so holds them with the kernels and the adapter; it is opened the first time a
// command asks for a CUDA device (--device cuda, or auto on a machine with an NVIDIA driver).
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/device/device.h"
#include "runtime/error.h"

namespace hetmoe::device {
namespace {

namespace fs = std::filesystem;

constexpr const char* kLibrary = "libhetmoe_cuda.so";

struct Library {
  int (*device_count)() = nullptr;
  Device* (*open)(int) = nullptr;
  std::string error;  // why it is not there
};

// Where the library may be, in order.
std::vector<fs::path> candidates() {
  std::vector<fs::path> paths;
  if (const char* env = std::getenv("HETMOE_CUDA_LIBRARY"); env && *env) paths.emplace_back(env);
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    paths.push_back(exe.parent_path() / kLibrary);
    paths.push_back(exe.parent_path().parent_path() / "lib" / "hetmoe" / kLibrary);
  }
#ifdef HETMOE_CUDA_BUILD_LIBRARY
  paths.emplace_back(HETMOE_CUDA_BUILD_LIBRARY);  // the build tree's copy, for the tests
#endif
  return paths;
}

Library load() {
  Library lib;
#ifndef HETMOE_HAVE_CUDA
  if (!std::getenv("HETMOE_CUDA_LIBRARY")) {
    lib.error = "this build of hetmoe has no CUDA device (nvcc was not found when it was built)";
    return lib;
  }
#endif
  for (const fs::path& path : candidates()) {
    std::error_code ec;
    if (!fs::exists(path, ec)) continue;
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char* why = dlerror();
      lib.error = "cannot load " + path.string() + ": " + (why ? why : "unknown error");
      return lib;
    }
    // Kept loaded until the process ends: the devices it makes run its code.
    auto abi = reinterpret_cast<int (*)()>(dlsym(handle, "hetmoe_cuda_abi"));
    lib.device_count = reinterpret_cast<int (*)()>(dlsym(handle, "hetmoe_cuda_device_count"));
    lib.open = reinterpret_cast<Device* (*)(int)>(dlsym(handle, "hetmoe_cuda_open"));
    if (!abi || !lib.device_count || !lib.open || abi() != kDeviceAbi) {
      lib = {};
      lib.error = path.string() + " is another version's CUDA device library: rebuild hetmoe";
    }
    return lib;
  }
  lib.error = std::string("the CUDA device library ") + kLibrary + " is not next to the hetmoe binary";
  return lib;
}

const Library& library() {
  static const Library lib = load();
  return lib;
}

// Without an NVIDIA driver there is no GPU to find: the library (and cuBLAS) is not even loaded.
bool driver_present() { return access("/dev/nvidiactl", F_OK) == 0 || access("/proc/driver/nvidia", F_OK) == 0; }

}  // namespace

int cuda_device_count() {
  if (!driver_present() && !std::getenv("HETMOE_CUDA_LIBRARY")) return 0;
  const Library& lib = library();
  return lib.device_count ? lib.device_count() : 0;
}

std::unique_ptr<Device> make_cuda_device(int index) {
  const Library& lib = library();
  if (!lib.open) fail("--device cuda: {}", lib.error);
  return std::unique_ptr<Device>(lib.open(index));
}

}  // namespace hetmoe::device
