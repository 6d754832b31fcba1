// coordinator/device_broadcast.h with NCCL (found next to the CUDA toolkit).
//
// The communicator is non-blocking (ncclConfig_t::blocking = 0), so that no
// NCCL call can hang a rank whose peer failed:
//   1. Create: rank 0 gathers every rank's GPU, refuses duplicates, and
//      broadcasts ncclGetUniqueId's id (MPI). Each rank starts
//      ncclCommInitRankConfig on its device and polls ncclCommGetAsyncError
//      until the init is done, fails, or the deadline passes; a failed or late
//      rank calls ncclCommAbort. The outcome is agreed (MPI allreduce): if any
//      rank failed, every rank aborts its communicator and restore uses MPI.
//   2. Broadcast: on a non-blocking stream of ours, never the legacy default
//      stream. First an MPI allreduce: can every rank take part (none has
//      aborted its communicator)? The root has read the bytes by then, so
//      the deadline below counts NCCL's time, not the read's. Then the
//      watchdog's clock restarts and the deadline (kNcclShareOfWatchdog of
//      its timeout) starts. Our stream waits on an event recorded on the
//      caller's stream; ncclBroadcast is queued (its enqueue may report
//      ncclInProgress: polled to the end); an event recorded after it is
//      waited on by the caller's stream. A second allreduce: did every
//      rank's enqueue succeed? A rank that failed would never join the
//      broadcast, and the others would wait inside it until the deadline:
//      instead every rank aborts its communicator and fails at once. The
//      rank then polls that event and ncclCommGetAsyncError with the
//      deadline; on an error or at the deadline it aborts the communicator
//      (later broadcasts fail, the next one's first allreduce tells every
//      rank) and returns the error, which restore agrees on with the other
//      ranks through MPI before the watchdog's timeout.
//   3. Destroy: ncclCommFinalize, polled with the deadline, then
//      ncclCommDestroy; ncclCommAbort instead after an error.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "base/fault.h"
#include "base/log.h"
#include "coordinator/device_broadcast.h"
#include "coordinator/watchdog.h"
#include "worker/copy.h"

namespace mhckpt::internal {
namespace {

using Clock = std::chrono::steady_clock;

std::atomic<bool> agree_enqueue{true};  // false only in the negative-control test

// What rank 0 needs to decide: whether this rank can take part, and its GPU.
struct Candidate {
  int usable = 0;
  char uuid[16] = {};
};

Status NcclError(std::string_view what, ncclResult_t r) {
  return IoError(fmt::format("NCCL {}: {} ({})", what, ncclGetErrorString(r), static_cast<int>(r)));
}

Status CudaError(std::string_view what, cudaError_t e) {
  (void)cudaGetLastError();  // reported here: not left for the caller's next check
  return IoError(fmt::format("CUDA {}: {} ({})", what, cudaGetErrorString(e), static_cast<int>(e)));
}

// Polls `comm` until its pending operation is no longer in progress, an
// error, or `deadline`. `done` (optional) must also report completion.
template <typename Done>
Status Poll(ncclComm_t comm, Clock::time_point deadline, std::string_view what, Done done) {
  for (;;) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) return NcclError(what, r);
    if (state != ncclSuccess && state != ncclInProgress) return NcclError(what, state);
    if (state == ncclSuccess) {
      Result<bool> finished = done();
      if (!finished.ok()) return finished.status();
      if (*finished) return OkStatus();
    }
    if (Clock::now() > deadline) {
      return IoError(fmt::format("NCCL {}: not done within the deadline", what));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

Result<bool> NothingElse() { return true; }

class NcclBroadcaster final : public DeviceBroadcaster {
 public:
  NcclBroadcaster(ncclComm_t comm, int device, cudaStream_t stream, cudaEvent_t ready,
                  cudaEvent_t done, double timeout_seconds, Watchdog* watchdog)
      : comm_(comm),
        device_(device),
        stream_(stream),
        ready_(ready),
        done_(done),
        timeout_(std::chrono::duration_cast<Clock::duration>(
            std::chrono::duration<double>(timeout_seconds))),
        watchdog_(watchdog) {}
  ~NcclBroadcaster() override;
  NcclBroadcaster(const NcclBroadcaster&) = delete;
  NcclBroadcaster& operator=(const NcclBroadcaster&) = delete;

  [[nodiscard]] int device() const override { return device_; }
  Status Broadcast(const Comm& comm, void* data, size_t bytes, int root, void* stream) override;

 private:
  Status Queue(void* data, size_t bytes, int root, cudaStream_t caller, Clock::time_point deadline);
  // After an error: aborts the communicator, so that our stream's kernel
  // ends (a peer may never arrive); every later broadcast fails.
  void Break();

  ncclComm_t comm_;
  int device_;
  cudaStream_t stream_;
  cudaEvent_t ready_, done_;
  Clock::duration timeout_;
  Watchdog* watchdog_;   // may be null
  bool broken_ = false;  // aborted after an error: every later broadcast fails
};

NcclBroadcaster::~NcclBroadcaster() {
  ScopedDevice scope;
  if (comm_ == nullptr) broken_ = false;  // aborted already
  if (scope.Use(device_).ok()) {
    (void)cudaStreamSynchronize(stream_);
    if (comm_ != nullptr && !broken_) {
      ncclResult_t r = ncclCommFinalize(comm_);
      broken_ = r != ncclSuccess && r != ncclInProgress;
      if (!broken_) broken_ = !Poll(comm_, Clock::now() + timeout_, "finalize", NothingElse).ok();
    }
  }
  if (comm_ != nullptr) (void)(broken_ ? ncclCommAbort(comm_) : ncclCommDestroy(comm_));
  (void)cudaStreamDestroy(stream_);
  (void)cudaEventDestroy(ready_);
  (void)cudaEventDestroy(done_);
  (void)cudaGetLastError();
}

// Step 2 up to the wait: the order with the caller's stream, and the enqueue.
Status NcclBroadcaster::Queue(void* data, size_t bytes, int root, cudaStream_t caller,
                              Clock::time_point deadline) {
  cudaError_t e = cudaEventRecord(ready_, caller);
  if (e != cudaSuccess) return CudaError("event record on the caller's stream", e);
  if ((e = cudaStreamWaitEvent(stream_, ready_, 0)) != cudaSuccess) return CudaError("wait", e);
  MHCKPT_RETURN_IF_ERROR(fault::Hit("nccl_enqueue"));  // a test's refused enqueue
  ncclResult_t r = ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream_);
  if (r != ncclSuccess && r != ncclInProgress) return NcclError("broadcast", r);
  // The enqueue of a non-blocking communicator may still run: to its end first.
  MHCKPT_RETURN_IF_ERROR(Poll(comm_, deadline, "broadcast enqueue", NothingElse));
  if ((e = cudaEventRecord(done_, stream_)) != cudaSuccess) return CudaError("event record", e);
  if ((e = cudaStreamWaitEvent(caller, done_, 0)) != cudaSuccess) {
    return CudaError("caller's stream wait", e);
  }
  return OkStatus();
}

void NcclBroadcaster::Break() {
  if (broken_) return;
  broken_ = true;
  (void)ncclCommAbort(comm_);
  comm_ = nullptr;
  (void)cudaStreamSynchronize(stream_);
  (void)cudaGetLastError();
}

Status NcclBroadcaster::Broadcast(const Comm& comm, void* data, size_t bytes, int root,
                                  void* stream) {
  const std::string what = fmt::format("broadcast of {} bytes from rank {}", bytes, root);
  ScopedDevice scope;
  Status s = broken_ ? FailedPrecondition(fmt::format("NCCL {}: aborted after an error", what))
                     : scope.Use(device_);
  // Why an allreduce: a rank that cannot take part never joins the
  // broadcast; the others must not enter it. It also waits for the root's
  // read, which the NCCL deadline below must not count.
  if (comm.AllreduceMax(s.ok() ? 0 : 1) != 0) {
    Break();
    return s.ok() ? FailedPrecondition(fmt::format(
                        "NCCL {}: another rank's communicator was aborted after an error", what))
                  : s;
  }
  if (watchdog_ != nullptr) watchdog_->Restart();
  const Clock::time_point deadline = Clock::now() + timeout_;
  s = Queue(data, bytes, root, static_cast<cudaStream_t>(stream), deadline);
  // Why an allreduce before the wait: a rank whose enqueue failed never
  // joins, and NCCL does not tell its peers; they would wait inside the
  // broadcast until the deadline. Every rank learns it here and aborts.
  if (agree_enqueue.load() && comm.AllreduceMax(s.ok() ? 0 : 1) != 0) {
    Break();
    return s.ok() ? IoError(fmt::format("NCCL {}: another rank could not queue it", what)) : s;
  }
  if (s.ok()) {
    s = Poll(comm_, deadline, what, [this]() -> Result<bool> {
      cudaError_t e = cudaEventQuery(done_);
      if (e == cudaErrorNotReady) return false;
      if (e != cudaSuccess) return CudaError("event query", e);
      return true;
    });
  }
  if (!s.ok()) Break();
  return s;
}

Candidate Probe(int device) {
  Candidate c;
  cudaDeviceProp prop{};
  if (device < 0) return c;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    (void)cudaGetLastError();  // ours: this rank cannot take part
    return c;
  }
  c.usable = 1;
  std::memcpy(c.uuid, &prop.uuid, sizeof(c.uuid));
  return c;
}

// Rank 0: why NCCL cannot serve these ranks, or an empty string.
std::string Refusal(const std::vector<std::string>& gathered) {
  std::set<std::string> gpus;
  for (size_t r = 0; r < gathered.size(); ++r) {
    Candidate c;
    if (gathered[r].size() == sizeof(c)) std::memcpy(&c, gathered[r].data(), sizeof(c));
    if (!c.usable) return fmt::format("rank {} has no usable CUDA device", r);
    if (!gpus.insert(std::string(c.uuid, sizeof(c.uuid))).second) {
      return fmt::format("rank {} shares a GPU with another rank", r);
    }
  }
  return {};
}

// Step 1 on this rank: the communicator, or nullptr (aborted) with `*error`.
ncclComm_t InitOnDevice(const Comm& comm, const ncclUniqueId& id, int device, double timeout,
                        Status* error) {
  ScopedDevice scope;
  *error = scope.Use(device);
  if (!error->ok()) return nullptr;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // polled below, with a deadline, never a hang
  ncclComm_t nc = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&nc, comm.size(), id, comm.rank(), &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    *error = NcclError("init", r);
  } else {
    auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(timeout));
    *error = Poll(nc, deadline, "init", NothingElse);
  }
  if (!error->ok() && nc != nullptr) {
    (void)ncclCommAbort(nc);
    nc = nullptr;
  }
  return nc;
}

// Our stream and events on `device`, for a broadcaster.
Status MakeStream(int device, cudaStream_t* stream, cudaEvent_t* ready, cudaEvent_t* done) {
  ScopedDevice scope;
  MHCKPT_RETURN_IF_ERROR(scope.Use(device));
  cudaError_t e = cudaStreamCreateWithFlags(stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(ready, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(done, cudaEventDisableTiming);
  return e == cudaSuccess ? OkStatus() : CudaError("stream create", e);
}

}  // namespace

void SetAgreeBroadcastEnqueueForTest(bool agree) { agree_enqueue.store(agree); }

std::unique_ptr<DeviceBroadcaster> DeviceBroadcaster::Create(const Comm& comm, int device,
                                                             std::string* why,
                                                             double timeout_seconds,
                                                             Watchdog* watchdog) {
  if (!(timeout_seconds > 0)) timeout_seconds = 1e9;  // no deadline: the watchdog's choice
  Candidate mine = Probe(device);
  std::vector<std::string> all =
      comm.GatherBytes(std::string(reinterpret_cast<const char*>(&mine), sizeof(mine)), 0);
  // Rank 0 decides; its answer (empty: go ahead) and the unique id go to all.
  std::string decision;
  ncclUniqueId id{};
  if (comm.rank() == 0) {
    decision = Refusal(all);
    if (decision.empty() && ncclGetUniqueId(&id) != ncclSuccess)
      decision = "ncclGetUniqueId failed";
    if (decision.empty())
      decision = "+" + std::string(reinterpret_cast<const char*>(&id), sizeof(id));
  }
  comm.BroadcastBytes(&decision, 0);
  if (decision.empty() || decision[0] != '+') {
    *why = decision;
    return nullptr;
  }
  std::memcpy(&id, decision.data() + 1, sizeof(id));
  if (watchdog != nullptr) watchdog->Restart();  // the init's deadline is a share of it
  Status local;
  ncclComm_t nc = InitOnDevice(comm, id, device, timeout_seconds, &local);
  cudaStream_t stream = nullptr;
  cudaEvent_t ready = nullptr, done = nullptr;
  if (local.ok()) local = MakeStream(device, &stream, &ready, &done);
  // Why an allreduce: every rank must know that every rank's init worked.
  if (comm.AllreduceMax(local.ok() ? 0 : 1) != 0) {
    if (nc != nullptr) (void)ncclCommAbort(nc);
    if (stream != nullptr) (void)cudaStreamDestroy(stream);
    if (ready != nullptr) (void)cudaEventDestroy(ready);
    if (done != nullptr) (void)cudaEventDestroy(done);
    (void)cudaGetLastError();
    if (!local.ok()) {
      Logger()->warn("mhckpt: rank {}: NCCL init on device {}: {}", comm.rank(), device,
                     local.message());
    }
    *why = "NCCL init failed or timed out on a rank (its log says why)";
    return nullptr;
  }
  return std::make_unique<NcclBroadcaster>(nc, device, stream, ready, done, timeout_seconds,
                                           watchdog);
}

}  // namespace mhckpt::internal
