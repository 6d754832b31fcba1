// The CUDA side of worker/copy.h that is not a copy: which device a pointer
// is on, the device a thread's calls go to (ScopedDevice), and pinned host
// memory (staging buffers registered in place, PinnedBuffer allocated
// pinned). Built when the CUDA toolkit is found; cuda_copy.cc has the copies.
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "base/log.h"
#include "worker/copy.h"
#include "worker/cuda_util.h"

namespace mhckpt::internal {
namespace {

template <typename F>
void DriverEntry(const char* symbol, F* fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q{};
  if (cudaGetDriverEntryPointByVersion(symbol, &p, 12000, cudaEnableDefault, &q) != cudaSuccess) {
    (void)cudaGetLastError();  // ours; a caller's earlier error stays for its own check
  } else if (q == cudaDriverEntryPointSuccess) {
    *fn = reinterpret_cast<F>(p);
  }
}

}  // namespace

Status CudaError(std::string_view what, cudaError_t e) {
  (void)cudaGetLastError();  // reported here: not left for the next caller's check
  return IoError(fmt::format("CUDA {}: {} ({})", what, cudaGetErrorString(e), static_cast<int>(e)));
}

const DriverCalls& Driver() {
  static const DriverCalls calls = [] {
    DriverCalls c;
    if (!CudaAvailable()) return c;
    DriverEntry("cuCtxGetCurrent", &c.ctx_get_current);
    DriverEntry("cuCtxSetCurrent", &c.ctx_set_current);
    DriverEntry("cuPointerGetAttribute", &c.pointer_get_attribute);
    return c;
  }();
  return calls;
}

void WarnOnce(std::atomic<bool>& flag, const std::string& message) {
  if (!flag.exchange(true)) Logger()->warn("mhckpt: {}", message);
}

std::atomic<int>& NotedDevice() {
  static std::atomic<int> device{-1};
  return device;
}

bool HostMemoryContext(ScopedDevice& scope, int device) {
  if (device < 0 && scope.had_context()) return true;
  if (device < 0) device = NotedDevice().load();
  return device >= 0 && scope.Use(device).ok();
}

bool CudaAvailable() {
  static const bool available = [] {
    int count = 0;  // left untouched when the call fails (no driver: error 35)
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
      (void)cudaGetLastError();  // no driver or device: not an error for anyone
      return false;
    }
    return count > 0;
  }();
  return available;
}

ScopedDevice::ScopedDevice() {
  if (!CudaAvailable()) return;
  const DriverCalls& d = Driver();
  if (d.ctx_get_current != nullptr && d.ctx_set_current != nullptr) {
    CUcontext c = nullptr;
    if (d.ctx_get_current(&c) == CUDA_SUCCESS) saved_context_ = c;
  } else if (cudaGetDevice(&saved_device_) != cudaSuccess) {
    (void)cudaGetLastError();
    saved_device_ = -1;
  }
}

ScopedDevice::~ScopedDevice() {
  if (!changed_) return;
  const DriverCalls& d = Driver();
  if (d.ctx_set_current != nullptr) {
    // Back to the caller's context, or to none: cudaSetDevice(0) would make one.
    (void)d.ctx_set_current(static_cast<CUcontext>(saved_context_));
  } else if (saved_device_ >= 0 && cudaSetDevice(saved_device_) != cudaSuccess) {
    (void)cudaGetLastError();
  }
}

Status ScopedDevice::Use(int device) {
  changed_ = true;
  MHCKPT_CUDA_RETURN(fmt::format("set device {}", device), cudaSetDevice(device));
  return OkStatus();
}

void NoteDevice(int device, const void* data) {
  if (device < 0 && data != nullptr) {
    Result<int> d = DeviceOfPointer(data);
    device = d.ok() ? *d : -1;
  }
  if (device >= 0) NotedDevice().store(device);
}

Result<int> DeviceOfPointer(const void* data) {
  if (!CudaAvailable()) return FailedPrecondition("no CUDA device is usable");
  ScopedDevice scope;
  // A thread without a context asks the driver, which needs none; the
  // runtime would make one on the current device (0) first.
  const DriverCalls& d = Driver();
  if (!scope.had_context() && d.pointer_get_attribute != nullptr) {
    int ordinal = -1;
    CUresult r = d.pointer_get_attribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                         reinterpret_cast<CUdeviceptr>(data));
    if (r == CUDA_SUCCESS && ordinal >= 0) MHCKPT_RETURN_IF_ERROR(scope.Use(ordinal));
  }
  cudaPointerAttributes attr{};
  MHCKPT_CUDA_RETURN("pointer attributes", cudaPointerGetAttributes(&attr, data));
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) {
    return InvalidArgument(fmt::format("{} is not device memory", data));
  }
  NotedDevice().store(attr.device);
  return attr.device;
}

bool PinHostMemory(void* data, size_t bytes) {
  static std::atomic<bool> warned{false};
  if (!CudaAvailable() || bytes == 0) return false;
  ScopedDevice scope;
  if (!HostMemoryContext(scope, -1)) {
    WarnOnce(warned, fmt::format("staging buffer of {} bytes left pageable for now: no CUDA device "
                                 "in use yet on this thread (tried again at its next use)",
                                 bytes));
    return false;
  }
  cudaError_t e = cudaHostRegister(data, bytes, cudaHostRegisterPortable);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    WarnOnce(warned, fmt::format("cudaHostRegister of a {}-byte staging buffer failed: {}; it "
                                 "stays pageable until a later use pins it (device copies from "
                                 "it are slower)",
                                 bytes, cudaGetErrorString(e)));
    return false;
  }
  return true;
}

void UnpinHostMemory(void* data) {
  if (!CudaAvailable()) return;
  ScopedDevice scope;
  if (!HostMemoryContext(scope, -1)) return;  // no device known: nothing was pinned
  // Not registered if pinning failed: that error is ours, cleared.
  if (cudaHostUnregister(data) != cudaSuccess) (void)cudaGetLastError();
}

PinnedBuffer::PinnedBuffer(size_t bytes, int device) : size_(bytes) {
  static std::atomic<bool> warned{false};
  if (bytes == 0) return;
  void* p = nullptr;
  if (CudaAvailable()) {
    ScopedDevice scope;
    if (!HostMemoryContext(scope, device)) {
      WarnOnce(warned, "pinned buffer allocated pageable: no CUDA device known on this thread");
    } else if (cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable); e != cudaSuccess) {
      (void)cudaGetLastError();
      p = nullptr;
      WarnOnce(warned, fmt::format("cudaHostAlloc of {} bytes failed: {}; pageable instead", bytes,
                                   cudaGetErrorString(e)));
    } else {
      pinned_ = true;
      device_ = device;
      if (device_ < 0 && scope.had_context() && cudaGetDevice(&device_) != cudaSuccess) {
        (void)cudaGetLastError();
        device_ = NotedDevice().load();
      }
      if (device_ < 0) device_ = NotedDevice().load();
    }
  }
  if (!pinned_) {
    p = std::malloc(bytes);
    if (p == nullptr) throw std::bad_alloc();
  }
  data_ = static_cast<std::byte*>(p);
}

PinnedBuffer::~PinnedBuffer() {
  if (data_ == nullptr) return;
  if (!pinned_) {
    std::free(data_);
    return;
  }
  ScopedDevice scope;
  if (!scope.had_context() && device_ >= 0) (void)scope.Use(device_);
  if (cudaFreeHost(data_) != cudaSuccess) (void)cudaGetLastError();
}

}  // namespace mhckpt::internal
