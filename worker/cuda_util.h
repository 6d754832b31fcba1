// What the two files of the CUDA side of worker/copy.h share:
// cuda_copy.cc (the copies, ordered with the callers' streams) and
// cuda_memory.cc (devices, pointers, pinned host memory). Built with CUDA only.
#pragma once

#include <cuda.h>  // types only: driver calls are reached through the runtime
#include <cuda_runtime_api.h>

#include <atomic>
#include <string>
#include <string_view>

#include "base/status.h"
#include "worker/copy.h"

namespace mhckpt::internal {

/// IoError naming `what` and CUDA's error `e`, which it clears
/// (cudaGetLastError): reported here, not left for the next caller's check.
Status CudaError(std::string_view what, cudaError_t e);

#define MHCKPT_CUDA_RETURN(what, call)       \
  do {                                       \
    cudaError_t mhckpt_cuda_e = (call);      \
    if (mhckpt_cuda_e != cudaSuccess) {      \
      return CudaError(what, mhckpt_cuda_e); \
    }                                        \
  } while (false)

// Driver calls, reached through the runtime: mhckpt does not link libcuda, so
// that it loads where no driver is installed.
struct DriverCalls {
  CUresult (*ctx_get_current)(CUcontext*) = nullptr;
  CUresult (*ctx_set_current)(CUcontext) = nullptr;
  CUresult (*pointer_get_attribute)(void*, CUpointer_attribute, CUdeviceptr) = nullptr;
};

const DriverCalls& Driver();

/// Logs `message` once per `flag` (a static of the caller).
void WarnOnce(std::atomic<bool>& flag, const std::string& message);

/// A device mhckpt was asked to use (-1: none yet), for host-memory calls on
/// threads that have no context.
std::atomic<int>& NotedDevice();

// Makes a context current for a host-memory call (pin, allocate, free) on a
// thread that may have none: `device` if given, else the thread's own, else
// the device noted before. False if none is known: nothing is created then.
bool HostMemoryContext(ScopedDevice& scope, int device);

}  // namespace mhckpt::internal
