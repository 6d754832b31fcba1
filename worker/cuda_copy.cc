// The CUDA side of worker/copy.h, built when the CUDA toolkit is found.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "worker/copy.h"

namespace mhckpt::internal {
namespace {

constexpr int kStreamsPerDevice = 4;

Status CudaError(const char* what, cudaError_t e) {
  return IoError(fmt::format("CUDA {}: {} ({})", what, cudaGetErrorString(e), static_cast<int>(e)));
}

#define MHCKPT_CUDA_RETURN(what, call)       \
  do {                                       \
    cudaError_t mhckpt_cuda_e = (call);      \
    if (mhckpt_cuda_e != cudaSuccess) {      \
      return CudaError(what, mhckpt_cuda_e); \
    }                                        \
  } while (false)

// The streams and events mhckpt copies with on one device, made once. The
// copies of one call run on them; calls are serialised (Lanes::mu).
struct DeviceLanes {
  std::array<cudaStream_t, kStreamsPerDevice> streams{};
  std::array<cudaEvent_t, kStreamsPerDevice> done{};  // recorded after our copies
  cudaEvent_t ready = nullptr;                        // recorded on a caller stream
};

class Lanes {
 public:
  std::mutex mu;

  // The lanes of `device`, made on first use; the current device must be `device`.
  Result<DeviceLanes*> Get(int device) {
    auto it = lanes_.find(device);
    if (it != lanes_.end()) return &it->second;
    DeviceLanes l;
    for (int i = 0; i < kStreamsPerDevice; ++i) {
      MHCKPT_CUDA_RETURN("stream create",
                         cudaStreamCreateWithFlags(&l.streams[i], cudaStreamNonBlocking));
      MHCKPT_CUDA_RETURN("event create",
                         cudaEventCreateWithFlags(&l.done[i], cudaEventDisableTiming));
    }
    MHCKPT_CUDA_RETURN("event create", cudaEventCreateWithFlags(&l.ready, cudaEventDisableTiming));
    return &lanes_.emplace(device, l).first->second;
  }

 private:
  std::map<int, DeviceLanes> lanes_;  // kept for the process's life
};

Lanes& TheLanes() {
  static auto* lanes = new Lanes();  // never destroyed: CUDA may be torn down first
  return *lanes;
}

// The device of the device-side pointer of `t`.
Result<int> DeviceOf(const CopyTask& t, cudaMemcpyKind kind) {
  if (t.device >= 0) return t.device;
  return DeviceOfPointer(kind == cudaMemcpyDeviceToHost ? t.src : t.dst);
}

// Restores the calling thread's current device on scope exit.
class KeepCurrentDevice {
 public:
  KeepCurrentDevice() { cudaGetDevice(&device_); }
  ~KeepCurrentDevice() { cudaSetDevice(device_); }
  KeepCurrentDevice(const KeepCurrentDevice&) = delete;
  KeepCurrentDevice& operator=(const KeepCurrentDevice&) = delete;

 private:
  int device_ = 0;
};

// The copies of one device, in order with their caller streams.
Status CopyOnDevice(int device, const std::vector<const CopyTask*>& tasks, cudaMemcpyKind kind,
                    Lanes& lanes) {
  MHCKPT_CUDA_RETURN("set device", cudaSetDevice(device));
  MHCKPT_ASSIGN_OR_RETURN(DeviceLanes * l, lanes.Get(device));
  // D2H: our streams wait for everything issued so far on each caller stream.
  std::vector<void*> callers;
  for (const CopyTask* t : tasks) {
    if (std::find(callers.begin(), callers.end(), t->stream) == callers.end())
      callers.push_back(t->stream);
  }
  if (kind == cudaMemcpyDeviceToHost) {
    for (void* caller : callers) {
      MHCKPT_CUDA_RETURN("event record",
                         cudaEventRecord(l->ready, static_cast<cudaStream_t>(caller)));
      for (cudaStream_t s : l->streams) {
        MHCKPT_CUDA_RETURN("stream wait", cudaStreamWaitEvent(s, l->ready, 0));
      }
    }
  }
  for (size_t i = 0; i < tasks.size(); ++i) {
    const CopyTask& t = *tasks[i];
    MHCKPT_CUDA_RETURN(
        "memcpy", cudaMemcpyAsync(t.dst, t.src, t.bytes, kind, l->streams[i % kStreamsPerDevice]));
  }
  for (int i = 0; i < kStreamsPerDevice; ++i) {
    MHCKPT_CUDA_RETURN("event record", cudaEventRecord(l->done[i], l->streams[i]));
  }
  // H2D: each caller stream waits for the copies before touching its buffers.
  if (kind == cudaMemcpyHostToDevice) {
    for (void* caller : callers) {
      for (cudaEvent_t e : l->done) {
        MHCKPT_CUDA_RETURN("stream wait",
                           cudaStreamWaitEvent(static_cast<cudaStream_t>(caller), e, 0));
      }
    }
  }
  return OkStatus();
}

Status Copy(std::span<const CopyTask> tasks, cudaMemcpyKind kind) {
  if (!CudaAvailable())
    return FailedPrecondition("device memory given, but no CUDA device is usable");
  std::map<int, std::vector<const CopyTask*>> by_device;
  for (const CopyTask& t : tasks) {
    if (t.bytes == 0) continue;
    MHCKPT_ASSIGN_OR_RETURN(int device, DeviceOf(t, kind));
    by_device[device].push_back(&t);
  }
  Lanes& lanes = TheLanes();
  std::lock_guard<std::mutex> lock(lanes.mu);
  KeepCurrentDevice keep;
  // Issue on every device first, then wait: copies on several devices overlap.
  Status s;
  for (const auto& [device, mine] : by_device) {
    s = CopyOnDevice(device, mine, kind, lanes);
    if (!s.ok()) break;
  }
  for (const auto& [device, mine] : by_device) {
    cudaSetDevice(device);
    Result<DeviceLanes*> l = lanes.Get(device);
    if (!l.ok()) continue;
    for (cudaEvent_t e : (*l)->done) {
      cudaError_t err = cudaEventSynchronize(e);
      if (err != cudaSuccess && s.ok()) s = CudaError("synchronize", err);
    }
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
  return Copy(tasks, cudaMemcpyDeviceToHost);
}

Status CopyHostToDevice(std::span<const CopyTask> tasks) {
  return Copy(tasks, cudaMemcpyHostToDevice);
}

Result<int> DeviceOfPointer(const void* data) {
  if (!CudaAvailable()) return FailedPrecondition("no CUDA device is usable");
  cudaPointerAttributes attr{};
  MHCKPT_CUDA_RETURN("pointer attributes", cudaPointerGetAttributes(&attr, data));
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) {
    return InvalidArgument(fmt::format("{} is not device memory", data));
  }
  return attr.device;
}

void PinHostMemory(void* data, size_t bytes) {
  if (CudaAvailable()) cudaHostRegister(data, bytes, cudaHostRegisterDefault);
}

void UnpinHostMemory(void* data) {
  if (CudaAvailable()) cudaHostUnregister(data);
}

PinnedBuffer::PinnedBuffer(size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  void* p = nullptr;
  if (CudaAvailable() && cudaMallocHost(&p, bytes) == cudaSuccess) {
    pinned_ = true;
  } else {
    p = std::malloc(bytes);
    if (p == nullptr) throw std::bad_alloc();
  }
  data_ = static_cast<std::byte*>(p);
}

PinnedBuffer::~PinnedBuffer() {
  if (data_ == nullptr) return;
  if (pinned_) {
    cudaFreeHost(data_);
  } else {
    std::free(data_);
  }
}

}  // namespace mhckpt::internal
