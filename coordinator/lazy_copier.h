// A lazy save's copy (CopyMode::kLazy) and the fence that waits for it.
//
// CheckpointManager::Save plans the copies, orders device boxes after the
// caller's streams and takes the staging memory on the caller's thread, then
// hands the rest to a LazyCopier: on a thread of its own, at the lowest
// priority, it copies every box into the save's snapshot, releases the
// SaveOptions::protect_host watch, runs SaveOptions::check_after_copy and
// on_copied, merges its error into the save's, and completes the fence
// (SaveFence). The I/O thread joins that thread before the save's plan round
// (ManagerImpl::SubmitSave).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/status.h"
#include "worker/copy.h"
#include "worker/fault_guard.h"
#include "worker/snapshot.h"

namespace mhckpt::internal {

struct SaveJob;  // coordinator/manager_impl.h

/// What a SaveFence waits for: the end of a lazy save's copy (a blocking
/// save's completes in Save).
struct FenceState {
  void Complete(const Status& s);
  Status Wait();
  bool Done();

  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;
  /// A lazy save's copies that Wait takes part in (at the caller's
  /// priority) before it waits: worker/snapshot.h.
  std::shared_ptr<SharedCopies> shared;
};

/// SaveOptions::protect_host: the host boxes of `copies` that a lazy save of
/// `step` will copy, each with the message to print if the caller writes it.
std::vector<WriteWatch::Range> WatchRanges(const std::vector<SnapshotCopy>& copies,
                                           const Snapshot& snapshot, int rank, int64_t step);

class ManagerImpl;  // coordinator/manager_impl.h

/// A lazy save's staging, taken on the caller's thread in Save (as
/// AcquireStaging, which it falls back to): with a local tier, the rank's
/// landing file (coordinator/local_landing.h), the arrays' boxes placed in
/// it in the order of the plan (by name), so that the local write can move
/// the file into the step instead of writing it, and each host copy set to
/// hash its box on the way in the chunks the plan will give it
/// (Options::checksum_chunk_bytes), so that the write does not hash again.
Status AcquireLazyStaging(ManagerImpl& impl, const SnapshotOptions& options, Snapshot* snapshot,
                          std::vector<SnapshotCopy>* copies);

/// A blocking save's staging when the local tier's landing file is free and
/// warm (LandingFile::TryAcquire), the boxes placed and hashed as by
/// AcquireLazyStaging: the save then copies as a lazy one and waits for the
/// copy. False, with nothing changed, otherwise (the save stages in memory).
bool AcquireWarmLanding(ManagerImpl& impl, Snapshot* snapshot, std::vector<SnapshotCopy>* copies);

class LazyCopier {
 public:
  struct Parts {
    std::vector<SnapshotCopy> copies;  ///< into the job's staging, already taken
    SnapshotOptions options;
    std::shared_ptr<FenceState> fence;
    std::shared_ptr<WriteWatch> watch;       ///< released once the copies end
    std::shared_ptr<CallerStreamMark> mark;  ///< reset once the copies end
    std::function<Status()> check_after_copy;
    std::function<void(const Status&)> on_copied;
    std::string where;  ///< the rank and step, for an exception's message
  };

  /// `job` outlives the copy: the I/O thread joins job->copier before it
  /// runs the save.
  LazyCopier(SaveJob* job, Parts parts) : job_(job), parts_(std::move(parts)) {}

  /// Starts the copy on a thread of its own, kept in job->copier; where no
  /// thread can be had (or the copier_thread fault says so), copies here, at
  /// the caller's priority. Returns whether a thread started.
  static bool Start(const std::shared_ptr<LazyCopier>& copier);

  /// The copy itself; `own_thread`: on the copier's thread (its priority is
  /// lowered), not the caller's.
  void Copy(bool own_thread);

 private:
  SaveJob* job_;
  Parts parts_;
};

}  // namespace mhckpt::internal
