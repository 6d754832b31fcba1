// Fault injection: a seam through which a test makes one rank fail or die at a
// named point of the protocol, or makes one of its system calls fail. Unused,
// it costs one predictable branch per point.
//
// Configured by the environment (for real jobs under mpirun):
//   MHCKPT_FAULT="rank=1,point=mid_write,action=kill[,after_bytes=4096][,step=3][,times=2]"
// or by Configure() (for tests inside one process). Several faults are
// separated by ';'. `times=N` makes a fault fire N times, then never again
// (for a transient error such as EINTR, which a retry must get past).
//
// Points (where the protocol calls Hit):
//   after_snapshot  Save has copied, before the job is queued (caller thread)
//   copier_thread   a lazy save is about to start its copying thread (any
//                   error action: the thread is refused, the copy runs on the
//                   caller's thread)
//   lazy_copy       a lazy save's copying thread is about to copy
//   plan            the I/O thread starts the plan round
//   mid_write       this rank has written at least after_bytes of its boxes
//   after_flush     the data file is durable and closed on this rank
//   index_write     format 3: this rank has put its index records, before their fsync
//                   (an errno action: the records' write fails)
//   before_marker   every rank reported; rank 0 is about to write the marker
//   mid_marker      commit.json.tmp written and fsynced, not yet renamed
//   retention       a step's marker is unlinked, its files not yet removed
//   local_open      local tier: Open, a node's lowest rank owns its local dir
//   local_create    local tier: the node's step directory is made (its lowest rank)
//   local_write     local tier: this rank's file w<R>.bin is written and hashed
//   local_exchange  local tier: the copies (or parity segments) are exchanged
//   before_local_marker  local tier: the node's step is synced, its marker not put
//   root_busy       the root's lock is held by another job and Acquire is
//                   about to wait for it (io/root_lock.h; use action=wait to
//                   release the holder exactly then)
//   h5_write        a dataset write (use an errno action)
//   h5_read         a dataset read (errno action)
//   nccl_enqueue    a restore's NCCL broadcast is about to be queued
//                   (coordinator/device_broadcast_nccl.cc; any error action)
//   pread           a read by offset of array bytes (io/pread_reader.h;
//                   errno actions, also `short` and `eintr`)
//   data_fsync      the data file's flush to disk (HDF5: H5Fflush, which ends
//                   in MPI_File_sync), in place of the flush (errno action)
//   write, read, fsync (the marker's temp file), fsync_dir, rename, mkdir,
//   fallocate (reserving the data file's space), unlink (a file: the marker in retention, the
//   lease), remove (a directory tree), remove_step (the removal of a retired step's files: by
//   retention, by Open, by gc),
//   lock (the root's lock file), lease (writing the root's lease)
//                   POSIX calls of io/posix_file.cc (errno actions; `write`
//                   also `short`; `write` and `read` also `eintr`)
// Actions:
//   exit            _exit(41): the process vanishes, nothing flushed
//   kill            SIGKILL to itself
//   hang            sleeps forever (a stuck rank; see the watchdog)
//   enospc, eio, eacces   the call fails with that errno (points that return a Status)
//   eintr           the call is interrupted (EINTR): the caller must retry it
//   short           a write (or a pread) moves half of what it was given (at
//                   least a byte)
//   wait            (with file=PATH) creates PATH.reached, then waits until
//                   PATH exists and goes on: a test's gate inside a save
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.h"

namespace mhckpt::fault {

namespace internal {
extern std::atomic<bool> g_enabled;
Status HitSlow(std::string_view point, uint64_t bytes);
int ErrnoSlow(std::string_view point);
size_t ShortSlow(std::string_view point, size_t n);
}  // namespace internal

/// Replaces the configuration (the same syntax as MHCKPT_FAULT); "" clears it.
/// Returns InvalidArgument for a spec it cannot parse.
Status Configure(const std::string& spec);

/// How many times a configured fault has fired in this process since the
/// last Configure (or start): a test's proof that its fault was reached.
int64_t Fired();

/// This process's rank, for matching `rank=`.
void SetRank(int rank);
/// The step the calling thread is working on, for matching `step=` (per thread:
/// Save's caller, a lazy save's copier and the I/O thread each set their own).
void SetStep(int64_t step);

/// At a named point: dies, or returns the injected error, or OK.
inline Status Hit(std::string_view point, uint64_t bytes = 0) {
  return internal::g_enabled.load(std::memory_order_relaxed) ? internal::HitSlow(point, bytes)
                                                             : OkStatus();
}

/// For a system call: the errno to fake, or 0.
inline int Errno(std::string_view point) {
  return internal::g_enabled.load(std::memory_order_relaxed) ? internal::ErrnoSlow(point) : 0;
}

/// For a write of `n` bytes: how many to write (fewer than `n` when a
/// `short` fault matches).
inline size_t ShortWrite(std::string_view point, size_t n) {
  return internal::g_enabled.load(std::memory_order_relaxed) ? internal::ShortSlow(point, n) : n;
}

}  // namespace mhckpt::fault
