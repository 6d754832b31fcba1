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

class DeviceBroadcaster {
 public:
  /// Collective. An NCCL communicator over `comm`'s ranks, each on its CUDA
  /// device `device` (made once: ncclGetUniqueId on rank 0, MPI broadcast,
  /// non-blocking ncclCommInitRankConfig polled for at most `timeout_seconds`,
  /// the outcome agreed through MPI; the same deadline bounds each broadcast;
  /// 0: none). nullptr on every rank if NCCL cannot
  /// serve them all; `why` then says why (the same on every rank).
  static std::unique_ptr<DeviceBroadcaster> Create(const Comm& comm, int device, std::string* why,
                                                   double timeout_seconds = 300);

  virtual ~DeviceBroadcaster() = default;
  /// The device this rank's communicator was made on.
  [[nodiscard]] virtual int device() const = 0;
  /// Collective. `bytes` bytes at `data` (device memory on device()) from
  /// `root` to every rank, on a stream of its own ordered after the work
  /// issued so far on `stream` (a cudaStream_t; nullptr: the legacy default
  /// stream), which is made to wait for the broadcast. Returns when this
  /// rank's copy is complete; an error or the deadline aborts the
  /// communicator (this and every later broadcast fail: a rank-local error,
  /// for the caller to agree on) rather than hang.
  virtual Status Broadcast(void* data, size_t bytes, int root, void* stream) = 0;
};

}  // namespace mhckpt::internal
