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
void SetResolveCallerStreamsForTest(bool) {}

// Without CUDA no destination is on a device (Restore refuses them).
std::span<const ArrayToRestore> StreamProxies::Resolve(std::span<const ArrayToRestore> arrays,
                                                       std::vector<ArrayToRestore>*) {
  return arrays;
}
void StreamProxies::Finish() {}
StreamProxies::~StreamProxies() = default;

// No device copy is ever planned without CUDA (device boxes fail the input
// checks); these only keep the lazy save's calls linkable.
Status MarkCallerStreams(std::span<CopyTask> tasks, CallerStreamMark*, std::optional<size_t>*) {
  for (const CopyTask& t : tasks) {
    if (t.bytes > 0) {
      return FailedPrecondition("device memory given, but mhckpt was built without CUDA");
    }
  }
  return OkStatus();
}

Status CopyDeviceToHostAfter(std::span<const CopyTask> tasks, const CallerStreamMark&,
                             std::optional<size_t>*) {
  for (const CopyTask& t : tasks) {
    if (t.bytes > 0) {
      return FailedPrecondition("device memory given, but mhckpt was built without CUDA");
    }
  }
  return OkStatus();
}

CallerStreamMark::~CallerStreamMark() = default;
CallerStreamMark::CallerStreamMark(CallerStreamMark&& other) noexcept
    : entries_(std::move(other.entries_)) {}
CallerStreamMark& CallerStreamMark::operator=(CallerStreamMark&& other) noexcept {
  entries_ = std::move(other.entries_);
  return *this;
}
void CallerStreamMark::Reset() { entries_.clear(); }

ScopedDevice::ScopedDevice() = default;
ScopedDevice::~ScopedDevice() = default;
Status ScopedDevice::Use(int) { return FailedPrecondition("mhckpt was built without CUDA"); }

void NoteDevice(int, const void*) {}

bool PinHostMemory(void*, size_t) { return false; }
void UnpinHostMemory(void*) {}

PinnedBuffer::PinnedBuffer(size_t bytes, int)
    : data_(bytes == 0 ? nullptr : new std::byte[bytes]), size_(bytes) {}

PinnedBuffer::~PinnedBuffer() { delete[] data_; }

}  // namespace mhckpt::internal
