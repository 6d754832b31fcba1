// Copies between caller buffers and staging memory: host memory with several
// threads, device memory through CUDA (worker/cuda_copy.cc, when built with
// the CUDA toolkit).
#pragma once

#include <cstddef>
#include <span>
#include <utility>

#include "base/status.h"

namespace mhckpt::internal {

struct CopyTask {
  void* dst;
  const void* src;
  size_t bytes;
  /// Device copies: the device of the device-side pointer (-1: ask CUDA) and
  /// the caller's cudaStream_t the copy is ordered with (nullptr: legacy
  /// default stream). Unused by host copies.
  int device = -1;
  void* stream = nullptr;
};

/// Copies host memory with up to `threads` threads, splitting the total bytes
/// evenly (a single large copy is split too). Small totals use one thread.
void ParallelCopy(std::span<const CopyTask> tasks, int threads);

/// True if a CUDA device can be used. False when built without CUDA, or with
/// no driver or device (cudaGetDeviceCount fails with error 35 on a machine
/// that has the toolkit but no driver).
bool CudaAvailable();

/// Copies device memory to (pinned) host memory with cudaMemcpyAsync on
/// streams of its own (a few per device, made once and reused; copies on
/// several devices overlap). Each copy starts only after the work issued so
/// far on its task's caller stream (an event recorded there, waited on by
/// ours). Returns after every copy has completed, with the calling thread's
/// current device unchanged.
Status CopyDeviceToHost(std::span<const CopyTask> tasks);

/// Copies host memory to device memory the same way; each task's caller
/// stream is made to wait for its copy. Returns after every copy completed.
Status CopyHostToDevice(std::span<const CopyTask> tasks);

/// Host memory that CUDA can copy from and to at full speed (cudaMallocHost;
/// plain memory without CUDA). For restore's landing of device destinations.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  [[nodiscard]] std::byte* data() const { return data_; }
  [[nodiscard]] size_t size() const { return size_; }

 private:
  std::byte* data_ = nullptr;
  size_t size_ = 0;
  bool pinned_ = false;
};

/// The CUDA device that holds `data` (device or managed memory);
/// InvalidArgument for host memory, FailedPrecondition without CUDA.
Result<int> DeviceOfPointer(const void* data);

/// Pins (page-locks) host memory for fast DMA; a no-op without CUDA.
void PinHostMemory(void* data, size_t bytes);
void UnpinHostMemory(void* data);

}  // namespace mhckpt::internal
