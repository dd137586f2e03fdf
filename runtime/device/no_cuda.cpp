// A build without CUDA: no CUDA devices.
#include "runtime/device/device.h"
#include "runtime/error.h"

namespace hetmoe::device {

int cuda_device_count() { return 0; }

std::unique_ptr<Device> make_cuda_device(int index) {
  fail("--device cuda: this build of hetmoe has no CUDA support (nvcc was not found when it was built)");
}

}  // namespace hetmoe::device
