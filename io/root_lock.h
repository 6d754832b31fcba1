// One job per checkpoint root: the lock and the lease that a job holds on
// ROOT while it may save into it (docs/RELIABILITY.md, "One job per root").
//
// Taking the root (RootLock::Acquire, rank 0 of CheckpointManager::Open):
//   1. Lock. An exclusive flock on ROOT/mhckpt.lock, without waiting. If
//      another open file holds it, the root is in use: fail, naming the
//      holder from its lease. The kernel drops the lock of a dead process,
//      so a crashed job never blocks the next one through the lock.
//   2. Lease. Read ROOT/mhckpt.lease. The lock was granted. If the lease
//      names a process of this kernel (same boot id: this machine, its
//      containers included), the kernel's lock reached it, so it is gone:
//      take over. If it names another machine and its heartbeat is fresh
//      (younger than the lease time), the lock may not reach that machine
//      (NFS mounted with local_lock or nolock, Lustre with localflock): fail
//      as in use. A stale lease is taken over. Where the file system has no
//      flock at all (Lustre mounted without -o flock), the lease decides
//      alone, and a holder of this kernel is gone when its pid is.
//   3. Own. Write our lease (host, pid, job id, start, heartbeat); a thread
//      renews the heartbeat every quarter of the lease time.
// Releasing (the destructor): stop the thread, remove the lease, drop the
// lock — in that order, so that nobody sees the lock free with our lease.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "base/status.h"

namespace mhckpt::io {

/// Who owns a root, as its lease file records it (docs/FORMAT.md).
struct Lease {
  std::string host;
  int64_t pid = 0;
  std::string job;      ///< SLURM_JOB_ID, PMIX_NAMESPACE or Open MPI's job id; "" if none
  std::string boot_id;  ///< the kernel's boot id (/proc/sys/kernel/random/boot_id); "" if unknown
  int64_t started_unix_ms = 0;
  int64_t heartbeat_unix_ms = 0;
};

/// The lease text (JSON); ParseLease reads it back.
std::string LeaseToJson(const Lease& lease);
/// InvalidArgument if `text` is not a lease.
Result<Lease> ParseLease(const std::string& text);
/// "host 'n1', pid 123, job '42', heartbeat 1.5 s ago", as of `now_unix_ms`.
std::string DescribeHolder(const Lease& lease, int64_t now_unix_ms);

/// The lease this process would write now.
Lease CurrentProcessLease();

struct RootLockOptions {
  /// A heartbeat older than this is stale, and its lease is taken over.
  double lease_seconds = 60;
  /// How long Acquire keeps trying while the root is in use (0: once).
  double wait_seconds = 0;
};

class RootLock {
 public:
  /// Takes ownership of `root` (an existing directory). FailedPrecondition,
  /// naming the root and the holder, if another job holds it; IoError if the
  /// lock or lease file cannot be used. Changes nothing else in `root`.
  static Result<std::unique_ptr<RootLock>> Acquire(const std::string& root,
                                                   const RootLockOptions& options);
  /// Releases the root (see the top of this file).
  ~RootLock();
  RootLock(const RootLock&) = delete;
  RootLock& operator=(const RootLock&) = delete;

  /// The lease of the previous owner that Acquire took over (its process
  /// gone, or its heartbeat stale), or nullopt if there was none.
  [[nodiscard]] const std::optional<Lease>& taken_over() const { return taken_over_; }

 private:
  RootLock(std::string root, int fd, Lease lease, std::optional<Lease> taken_over,
           double lease_seconds);
  void Renew();

  const std::string root_;
  const int fd_;  // holds the flock
  Lease lease_;   // its heartbeat under mu_
  const std::optional<Lease> taken_over_;
  const double lease_seconds_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread heartbeat_;  // last: started when the rest is in place
};

}  // namespace mhckpt::io
