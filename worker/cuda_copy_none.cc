// worker/copy.h without the CUDA toolkit: no device is ever usable.
#include "worker/copy.h"

namespace mhckpt::internal {

bool CudaAvailable() { return false; }

Status CopyDeviceToHost(std::span<const CopyTask>) {
  return FailedPrecondition("device memory given, but mhckpt was built without CUDA");
}

Status CopyHostToDevice(std::span<const CopyTask>) {
  return FailedPrecondition("device memory given, but mhckpt was built without CUDA");
}

void PinHostMemory(void*, size_t) {}
void UnpinHostMemory(void*) {}

}  // namespace mhckpt::internal
