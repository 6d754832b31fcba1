// The CUDA side of worker/copy.h, built when the CUDA toolkit is found.
//
// The order of one copy call with its caller streams (both directions):
//   1. Under one process-wide lock, for each device: make it current (the
//      thread's previous context is put back at the end), and take its lanes
//      (a few non-blocking streams of ours, with a `done` event each, made once).
//   2. For each distinct caller stream: record `ready` on it, and make every
//      lane wait on `ready`. The copies therefore start only after the work
//      issued so far on the caller streams: for a save, the kernels that write
//      the source; for a restore, the work that still reads or writes the
//      destination.
//   3. Queue the copies round-robin on the lanes (cudaMemcpyAsync).
//   4. Record `done` on every lane.
//   5. Host to device only: make every caller stream wait on every `done`, so
//      that work issued on it later (on any thread) sees the restored bytes.
//   6. After steps 1-5 on every device (copies on several devices overlap):
//      synchronise every lane stream of every device touched. This runs on an
//      error in steps 1-5 too, so that no transfer still reads or writes a
//      staging buffer once the call has returned and the buffer is reused.
//   7. Return the first error, as one Status; a sticky-free CUDA error is
//      cleared (cudaGetLastError) once it has become that Status, so that the
//      framework's next launch check does not report it as its own.
//
// A lazy save splits step 2 off (MarkCallerStreams): on the caller's thread,
// when Save is called, an event of the save's own is recorded on each caller
// stream; later, on the save's copying thread, CopyDeviceToHostAfter runs
// steps 1-7 with step 2 reduced to making every lane wait on those events.
// Its step 6 first waits on each lane's `done` event (made with
// cudaEventBlockingSync: the low-priority copying thread sleeps rather than
// spins while the copies wait for the caller's queued work), then
// synchronises the lanes as above.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "base/log.h"
#include "worker/copy.h"
#include "worker/cuda_util.h"

namespace mhckpt::internal {
namespace {

constexpr int kStreamsPerDevice = 4;

std::atomic<bool> wait_for_callers{true};  // false only in the negative-control tests
std::atomic<bool> resolve_callers{true};   // false only in the negative-control tests

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
      MHCKPT_CUDA_RETURN(
          "event create",
          cudaEventCreateWithFlags(&l.done[i], cudaEventDisableTiming | cudaEventBlockingSync));
    }
    MHCKPT_CUDA_RETURN("event create", cudaEventCreateWithFlags(&l.ready, cudaEventDisableTiming));
    return &lanes_.emplace(device, l).first->second;
  }

  // The lanes of `device` if made, else nullptr.
  DeviceLanes* Find(int device) {
    auto it = lanes_.find(device);
    return it == lanes_.end() ? nullptr : &it->second;
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

// The distinct caller streams of `tasks`, in order of first use.
std::vector<cudaStream_t> CallerStreams(const std::vector<const CopyTask*>& tasks) {
  std::vector<cudaStream_t> callers;
  for (const CopyTask* t : tasks) {
    auto s = static_cast<cudaStream_t>(t->stream);
    if (std::find(callers.begin(), callers.end(), s) == callers.end()) callers.push_back(s);
  }
  return callers;
}

// The event `mark` recorded on `caller` on `device`, or nullptr.
cudaEvent_t MarkedEvent(const CallerStreamMark& mark, int device, cudaStream_t caller) {
  for (const CallerStreamMark::Entry& e : mark.entries()) {
    if (e.device == device && static_cast<cudaStream_t>(e.stream) == caller) {
      return static_cast<cudaEvent_t>(e.event);
    }
  }
  return nullptr;
}

// Where an error is reported: the task it is about (an index into the
// caller's span), if the caller asked.
struct Blame {
  const CopyTask* base = nullptr;
  std::optional<size_t>* failed = nullptr;
  void On(const CopyTask* t) const {
    if (failed != nullptr && !failed->has_value()) *failed = static_cast<size_t>(t - base);
  }
};

// Steps 2-5 on one device (current already) for its tasks. With `mark`
// (a lazy save), step 2 waits on the events recorded at Save time.
Status QueueOnDevice(DeviceLanes& l, int device, const std::vector<const CopyTask*>& tasks,
                     cudaMemcpyKind kind, const CallerStreamMark* mark, const Blame& blame) {
  const std::vector<cudaStream_t> callers = CallerStreams(tasks);
  if (mark != nullptr) {
    // 2 (lazy). Our lanes wait for what was issued on each caller stream
    // before Save returned, and nothing later.
    for (cudaStream_t caller : callers) {
      cudaEvent_t e = MarkedEvent(*mark, device, caller);
      if (e == nullptr) continue;  // not marked: the tests' negative control
      for (cudaStream_t s : l.streams) {
        if (cudaError_t err = cudaStreamWaitEvent(s, e, 0); err != cudaSuccess) {
          blame.On(tasks.front());
          return CudaError("stream wait on the event recorded at Save", err);
        }
      }
    }
  } else if (wait_for_callers.load()) {
    // 2. Our lanes wait for everything issued so far on each caller stream.
    for (cudaStream_t caller : callers) {
      MHCKPT_CUDA_RETURN("event record on the caller's stream", cudaEventRecord(l.ready, caller));
      for (cudaStream_t s : l.streams) {
        MHCKPT_CUDA_RETURN("stream wait", cudaStreamWaitEvent(s, l.ready, 0));
      }
    }
  }
  // 3. The copies.
  for (size_t i = 0; i < tasks.size(); ++i) {
    const CopyTask& t = *tasks[i];
    cudaError_t e = cudaMemcpyAsync(t.dst, t.src, t.bytes, kind, l.streams[i % kStreamsPerDevice]);
    if (e != cudaSuccess) {
      blame.On(&t);
      return CudaError("memcpy", e);
    }
  }
  // 4. The end of each lane.
  for (int i = 0; i < kStreamsPerDevice; ++i) {
    MHCKPT_CUDA_RETURN("event record", cudaEventRecord(l.done[i], l.streams[i]));
  }
  // 5. H2D: each caller stream waits for the copies before touching its buffers.
  if (kind == cudaMemcpyHostToDevice) {
    for (cudaStream_t caller : callers) {
      for (cudaEvent_t e : l.done) {
        MHCKPT_CUDA_RETURN("caller's stream wait", cudaStreamWaitEvent(caller, e, 0));
      }
    }
  }
  return OkStatus();
}

// 6. Waits for every lane of every device in `devices` that has lanes.
// `queued`: steps 1-5 succeeded on every device, so each lane's `done` event
// marks the end of this call's copies on it; with `sleep`, it is waited on
// first (a blocking-sync event: the thread sleeps).
Status DrainLanes(const std::map<int, std::vector<const CopyTask*>>& devices, Lanes& lanes,
                  ScopedDevice& scope, bool queued, bool sleep, const Blame& blame) {
  Status s;
  for (const auto& [device, mine] : devices) {
    DeviceLanes* l = lanes.Find(device);
    if (l == nullptr) continue;
    Status used = scope.Use(device);
    if (!used.ok()) {
      if (s.ok()) s = used;
      continue;
    }
    for (int i = 0; i < kStreamsPerDevice; ++i) {
      cudaError_t e = queued && sleep ? cudaEventSynchronize(l->done[i]) : cudaSuccess;
      if (e == cudaSuccess) e = cudaStreamSynchronize(l->streams[i]);
      if (e != cudaSuccess && s.ok()) {
        // The first copy queued on this lane (or on the device).
        blame.On(mine[static_cast<size_t>(i) < mine.size() ? i : 0]);
        s = CudaError("synchronize", e);
      }
    }
  }
  return s;
}

// `mark` (a lazy save's): step 2 waits on its events. `failed`: see
// CopyDeviceToHostAfter.
Status Copy(std::span<const CopyTask> tasks, cudaMemcpyKind kind,
            const CallerStreamMark* mark = nullptr, std::optional<size_t>* failed = nullptr) {
  if (!CudaAvailable())
    return FailedPrecondition("device memory given, but no CUDA device is usable");
  const Blame blame{tasks.data(), failed};
  std::map<int, std::vector<const CopyTask*>> by_device;
  for (const CopyTask& t : tasks) {
    if (t.bytes == 0) continue;
    Result<int> device = DeviceOf(t, kind);
    if (!device.ok()) {
      blame.On(&t);
      return device.status();
    }
    by_device[*device].push_back(&t);
  }
  Lanes& lanes = TheLanes();
  std::lock_guard<std::mutex> lock(lanes.mu);
  ScopedDevice scope;
  // 1-5 on every device first, then 6: copies on several devices overlap.
  Status s;
  for (const auto& [device, mine] : by_device) {
    s = scope.Use(device);
    if (!s.ok()) break;
    NotedDevice().store(device);
    Result<DeviceLanes*> l = lanes.Get(device);
    if (!l.ok()) {
      s = l.status();
      break;
    }
    s = QueueOnDevice(**l, device, mine, kind, mark, blame);
    if (!s.ok()) break;
  }
  Status drained = DrainLanes(by_device, lanes, scope, s.ok(), mark != nullptr, blame);
  return s.ok() ? drained : s;
}

}  // namespace

Status CopyDeviceToHost(std::span<const CopyTask> tasks) {
  return Copy(tasks, cudaMemcpyDeviceToHost);
}

Status CopyHostToDevice(std::span<const CopyTask> tasks) {
  return Copy(tasks, cudaMemcpyHostToDevice);
}

void SetWaitForCallerStreamsForTest(bool wait) { wait_for_callers.store(wait); }

Status MarkCallerStreams(std::span<CopyTask> tasks, CallerStreamMark* mark,
                         std::optional<size_t>* failed) {
  if (!CudaAvailable())
    return FailedPrecondition("device memory given, but no CUDA device is usable");
  const Blame blame{tasks.data(), failed};
  // Each task's device, resolved now, on the caller's thread (the copier
  // reads it from the task).
  std::map<int, std::vector<const CopyTask*>> by_device;
  for (CopyTask& t : tasks) {
    if (t.bytes == 0) continue;
    if (t.device < 0) {
      Result<int> device = DeviceOfPointer(t.src);
      if (!device.ok()) {
        blame.On(&t);
        return device.status();
      }
      t.device = *device;
    }
    by_device[t.device].push_back(&t);
  }
  if (!wait_for_callers.load()) return OkStatus();  // the tests' negative control
  // On the caller's thread, with its context put back at the end: an event
  // per (device, caller stream), recorded now.
  ScopedDevice scope;
  for (const auto& [device, mine] : by_device) {
    if (Status used = scope.Use(device); !used.ok()) {
      blame.On(mine.front());
      return used;
    }
    NotedDevice().store(device);
    std::vector<cudaStream_t> done;
    for (const CopyTask* t : mine) {
      auto caller = static_cast<cudaStream_t>(t->stream);
      if (std::find(done.begin(), done.end(), caller) != done.end()) continue;
      done.push_back(caller);
      cudaEvent_t e = nullptr;
      cudaError_t err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
      if (err != cudaSuccess) {
        blame.On(t);
        return CudaError("event create", err);
      }
      mark->entries_.push_back({device, t->stream, e});
      if (err = cudaEventRecord(e, caller); err != cudaSuccess) {
        blame.On(t);
        return CudaError("event record on the caller's stream", err);
      }
    }
  }
  return OkStatus();
}

Status CopyDeviceToHostAfter(std::span<const CopyTask> tasks, const CallerStreamMark& mark,
                             std::optional<size_t>* failed) {
  return Copy(tasks, cudaMemcpyDeviceToHost, &mark, failed);
}

void SetResolveCallerStreamsForTest(bool resolve) { resolve_callers.store(resolve); }

std::span<const ArrayToRestore> StreamProxies::Resolve(std::span<const ArrayToRestore> arrays,
                                                       std::vector<ArrayToRestore>* storage) {
  static std::atomic<bool> warned{false};
  auto per_thread = [](const Destination& d) {
    return d.memory == Memory::kCuda && static_cast<cudaStream_t>(d.stream) == cudaStreamPerThread;
  };
  bool any = false;
  for (const ArrayToRestore& a : arrays) {
    for (const Destination& d : a.shards) any = any || per_thread(d);
  }
  if (!any || !resolve_callers.load() || !CudaAvailable()) return arrays;
  storage->assign(arrays.begin(), arrays.end());
  // On the caller's thread, with its context put back at the end: here
  // cudaStreamPerThread is the caller's stream on each device.
  ScopedDevice scope;
  for (ArrayToRestore& a : *storage) {
    for (Destination& d : a.shards) {
      if (!per_thread(d)) continue;
      Result<int> device = d.device >= 0 ? Result<int>(d.device) : DeviceOfPointer(d.data);
      if (!device.ok()) continue;  // the restore's copy reports it, on every rank alike
      d.device = *device;
      auto it = std::find_if(proxies_.begin(), proxies_.end(),
                             [&](const Proxy& p) { return p.device == d.device; });
      if (it != proxies_.end()) {
        d.stream = it->stream;
        continue;
      }
      cudaStream_t stream = nullptr;
      cudaEvent_t event = nullptr;
      cudaError_t e = scope.Use(d.device).ok() ? cudaSuccess : cudaErrorInvalidDevice;
      if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
      if (e == cudaSuccess) e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
      if (e == cudaSuccess) e = cudaEventRecord(event, cudaStreamPerThread);
      if (e == cudaSuccess) e = cudaStreamWaitEvent(stream, event, 0);
      if (e == cudaSuccess) {
        proxies_.push_back({d.device, stream, event});
        d.stream = stream;
        continue;
      }
      // No proxy: the caller's earlier work is waited for here, and the
      // copies are ordered with the legacy default stream, the same on
      // every thread (the restore returns after them).
      (void)cudaGetLastError();
      if (event != nullptr) (void)cudaEventDestroy(event);
      if (stream != nullptr) (void)cudaStreamDestroy(stream);
      const cudaError_t synced = cudaStreamSynchronize(cudaStreamPerThread);
      (void)cudaGetLastError();
      WarnOnce(warned,
               fmt::format("restore on device {}: no stream to order the copies with the "
                           "caller's cudaStreamPerThread ({}); synchronised it instead ({})",
                           d.device, cudaGetErrorString(e), cudaGetErrorString(synced)));
      d.stream = nullptr;
    }
  }
  return *storage;
}

void StreamProxies::Finish() {
  if (proxies_.empty()) return;
  ScopedDevice scope;
  for (const Proxy& p : proxies_) {
    auto stream = static_cast<cudaStream_t>(p.stream);
    auto event = static_cast<cudaEvent_t>(p.event);
    // The caller's stream, on this (the caller's) thread, after the proxy.
    if (!scope.Use(p.device).ok() || cudaEventRecord(event, stream) != cudaSuccess ||
        cudaStreamWaitEvent(cudaStreamPerThread, event, 0) != cudaSuccess) {
      // The copies have completed (the restore returned after them): only
      // the order of work still queued on the proxy is lost.
      (void)cudaGetLastError();
    }
    // Released once the work queued on them has ended.
    (void)cudaEventDestroy(event);
    (void)cudaStreamDestroy(stream);
    (void)cudaGetLastError();
  }
  proxies_.clear();
}

StreamProxies::~StreamProxies() { Finish(); }

CallerStreamMark::~CallerStreamMark() { Reset(); }

CallerStreamMark::CallerStreamMark(CallerStreamMark&& other) noexcept
    : entries_(std::move(other.entries_)) {
  other.entries_.clear();
}

CallerStreamMark& CallerStreamMark::operator=(CallerStreamMark&& other) noexcept {
  if (this != &other) {
    Reset();
    entries_ = std::move(other.entries_);
    other.entries_.clear();
  }
  return *this;
}

void CallerStreamMark::Reset() {
  if (entries_.empty()) return;
  ScopedDevice scope;
  for (const Entry& e : entries_) {
    // An event still waited on is released once the wait has ended.
    if (scope.Use(e.device).ok() &&
        cudaEventDestroy(static_cast<cudaEvent_t>(e.event)) == cudaSuccess) {
      continue;
    }
    (void)cudaGetLastError();
  }
  entries_.clear();
}

}  // namespace mhckpt::internal
