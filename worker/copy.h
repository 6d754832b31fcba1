// Copies between caller buffers and staging memory: host memory with several
// threads, device memory through CUDA (worker/cuda_copy.cc, when built with
// the CUDA toolkit).
#pragma once

#include <cstddef>
#include <span>

#include "base/status.h"

namespace mhckpt::internal {

struct CopyTask {
  void* dst;
  const void* src;
  size_t bytes;
};

/// Copies host memory with up to `threads` threads, splitting the total bytes
/// evenly (a single large copy is split too). Small totals use one thread.
void ParallelCopy(std::span<const CopyTask> tasks, int threads);

/// True if a CUDA device can be used. False when built without CUDA, or with
/// no driver or device (cudaGetDeviceCount fails with error 35 on a machine
/// that has the toolkit but no driver).
bool CudaAvailable();

/// Copies device memory to (pinned) host memory with cudaMemcpyAsync on
/// streams of its own, and returns after every copy has completed.
Status CopyDeviceToHost(std::span<const CopyTask> tasks);

/// Copies host memory to device memory and waits.
Status CopyHostToDevice(std::span<const CopyTask> tasks);

/// Pins (page-locks) host memory for fast DMA; a no-op without CUDA.
void PinHostMemory(void* data, size_t bytes);
void UnpinHostMemory(void* data);

}  // namespace mhckpt::internal
