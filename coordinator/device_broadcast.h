// Broadcasts of device buffers with NCCL, for restore's read-once path: one
// rank reads a box that several ranks want into its GPU, and NCCL copies it
// GPU to GPU. Where NCCL cannot serve (not built in, a rank without a device,
// two ranks on one GPU — NCCL refuses duplicate GPUs — or a failed init),
// Create returns nullptr on every rank and restore broadcasts with MPI
// through pinned host memory instead: never an error.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "base/comm.h"
#include "base/status.h"

namespace mhckpt::internal {

class Watchdog;

/// NCCL's deadline as a share of the watchdog's timeout
/// (Options::collective_timeout_seconds): half. The watchdog's clock for the
/// restore runs from before any NCCL call, so a deadline equal to its
/// timeout would always lose, and a hung broadcast would always end in the
/// watchdog's MPI_Abort. Instead each NCCL wait (the init; a broadcast,
/// from the moment every rank has queued it) restarts the watchdog's clock
/// (Watchdog::Restart) and gives up at half of it: the rank aborts its
/// communicator and returns an error, which the ranks agree on through MPI
/// in the other half. The watchdog still ends the job if a peer never
/// reaches that agreement (dead, or stuck outside NCCL).
inline constexpr double kNcclShareOfWatchdog = 0.5;

/// NCCL's deadline for a watchdog of `watchdog_timeout_seconds` (<= 0:
/// none, and NCCL's is none either: 0).
inline double NcclDeadlineSeconds(double watchdog_timeout_seconds) {
  return watchdog_timeout_seconds > 0 ? watchdog_timeout_seconds * kNcclShareOfWatchdog : 0;
}

class DeviceBroadcaster {
 public:
  /// Collective. An NCCL communicator over `comm`'s ranks, each on its CUDA
  /// device `device` (made once: ncclGetUniqueId on rank 0, MPI broadcast,
  /// non-blocking ncclCommInitRankConfig polled for at most `timeout_seconds`,
  /// the outcome agreed through MPI; the same deadline bounds each broadcast;
  /// 0: none). `watchdog` (optional) is restarted as each NCCL wait begins
  /// (kNcclShareOfWatchdog). nullptr on every rank if NCCL cannot serve them
  /// all; `why` then says why (the same on every rank).
  static std::unique_ptr<DeviceBroadcaster> Create(const Comm& comm, int device, std::string* why,
                                                   double timeout_seconds = 300,
                                                   Watchdog* watchdog = nullptr);

  virtual ~DeviceBroadcaster() = default;
  /// The device this rank's communicator was made on.
  [[nodiscard]] virtual int device() const = 0;
  /// Collective over `comm` (the ranks of the communicator, in its order).
  /// `bytes` bytes at `data` (device memory on device()) from `root` to
  /// every rank, on a stream of its own ordered after the work issued so far
  /// on `stream` (a cudaStream_t; nullptr: the legacy default stream), which
  /// is made to wait for the broadcast. Returns when this rank's copy is
  /// complete. Two agreements (MPI allreduces) keep every rank out of NCCL
  /// alone: before the enqueue, whether every rank can take part (a rank
  /// whose communicator is aborted cannot); after it, whether every rank's
  /// enqueue (ncclBroadcast) succeeded. If not, every rank aborts its
  /// communicator and fails, rather than leave the others inside the
  /// broadcast until the deadline. An error or the deadline while waiting
  /// aborts this rank's communicator. In each case this and every later
  /// broadcast fail: a rank-local error, for the caller to agree on.
  virtual Status Broadcast(const Comm& comm, void* data, size_t bytes, int root, void* stream) = 0;
};

/// Tests only: false skips the agreement after the enqueue (the bug the
/// enqueue-failure test must catch: the other ranks then wait in the
/// broadcast until the deadline).
void SetAgreeBroadcastEnqueueForTest(bool agree);

}  // namespace mhckpt::internal
