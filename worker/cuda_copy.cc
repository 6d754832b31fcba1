// The CUDA side of worker/copy.h, built when the CUDA toolkit is found.
#include <cuda_runtime_api.h>

#include <mutex>
#include <vector>

#include <fmt/format.h>

#include "worker/copy.h"

namespace mhckpt::internal {
namespace {

constexpr int kStreams = 4;

Status CudaError(const char* what, cudaError_t e) {
  return IoError(fmt::format("CUDA {}: {} ({})", what, cudaGetErrorString(e), static_cast<int>(e)));
}

// Spreads the copies over a few streams of our own and waits for all of them.
Status Copy(std::span<const CopyTask> tasks, cudaMemcpyKind kind) {
  cudaStream_t streams[kStreams];
  int made = 0;
  Status s;
  for (; made < kStreams; ++made) {
    cudaError_t e = cudaStreamCreateWithFlags(&streams[made], cudaStreamNonBlocking);
    if (e != cudaSuccess) {
      s = CudaError("stream create", e);
      break;
    }
  }
  for (size_t i = 0; s.ok() && i < tasks.size(); ++i) {
    cudaError_t e = cudaMemcpyAsync(tasks[i].dst, tasks[i].src, tasks[i].bytes, kind,
                                    streams[i % static_cast<size_t>(made)]);
    if (e != cudaSuccess) s = CudaError("memcpy", e);
  }
  for (int i = 0; i < made; ++i) {
    cudaError_t e = cudaStreamSynchronize(streams[i]);
    if (e != cudaSuccess && s.ok()) s = CudaError("stream synchronize", e);
    cudaStreamDestroy(streams[i]);
  }
  return s;
}

}  // namespace

bool CudaAvailable() {
  static const bool available = [] {
    int count = 0;  // left untouched when the call fails (no driver: error 35)
    return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  }();
  return available;
}

Status CopyDeviceToHost(std::span<const CopyTask> tasks) {
  if (!CudaAvailable())
    return FailedPrecondition("device memory given, but no CUDA device is usable");
  return Copy(tasks, cudaMemcpyDeviceToHost);
}

Status CopyHostToDevice(std::span<const CopyTask> tasks) {
  if (!CudaAvailable())
    return FailedPrecondition("device memory given, but no CUDA device is usable");
  return Copy(tasks, cudaMemcpyHostToDevice);
}

void PinHostMemory(void* data, size_t bytes) {
  if (CudaAvailable()) cudaHostRegister(data, bytes, cudaHostRegisterDefault);
}

void UnpinHostMemory(void* data) {
  if (CudaAvailable()) cudaHostUnregister(data);
}

}  // namespace mhckpt::internal
