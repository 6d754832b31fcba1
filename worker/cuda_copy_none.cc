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

Result<int> DeviceOfPointer(const void*) {
  return FailedPrecondition("mhckpt was built without CUDA");
}

void SetWaitForCallerStreamsForTest(bool) {}

ScopedDevice::ScopedDevice() = default;
ScopedDevice::~ScopedDevice() = default;
Status ScopedDevice::Use(int) { return FailedPrecondition("mhckpt was built without CUDA"); }

void NoteDevice(int, const void*) {}

void PinHostMemory(void*, size_t) {}
void UnpinHostMemory(void*) {}

PinnedBuffer::PinnedBuffer(size_t bytes, int)
    : data_(bytes == 0 ? nullptr : new std::byte[bytes]), size_(bytes) {}

PinnedBuffer::~PinnedBuffer() { delete[] data_; }

}  // namespace mhckpt::internal
