// One save on one rank (ManagerImpl::SaveRun): the steps of the save protocol
// (coordinator/save.cc), each phase in its own file and each given its
// communicator explicitly:
//   - save.cc: the protocol, its order (Run), the shared root's part
//     (Persistent), and in drain mode the hand-off and the drain;
//   - save_plan.cc: steps 1-2, the plan round and the replica check;
//   - save_local.cc: the local commit, and reading the boxes back from this
//     rank's local file for the shared root.
// Private to those three files.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "coordinator/local_tier.h"
#include "coordinator/manager_impl.h"
#include "coordinator/rank_report.h"
#include "io/mapped_file.h"
#include "io/marker.h"

namespace mhckpt::internal {

class ManagerImpl::SaveRun : public std::enable_shared_from_this<ManagerImpl::SaveRun> {
 public:
  SaveRun(ManagerImpl& impl, SaveJob& job)
      : impl_(impl), job_(job), t_(job.timings), rank_(impl.comm_.rank()) {}

  // Steps 1-2 and the local commit on the I/O thread, with its communicator;
  // then the shared root's part there too, or handed to the drain thread.
  Status Run();

  // Steps 3-6, the shared root's part (coordinator/shared_commit.h), with
  // `comm`: the I/O thread's, watched by the watchdog; or the drain's, not
  // watched (the deadline is the bound).
  Status Persistent(const Comm& comm, Watchdog* watchdog);

 private:
  // Drain mode, after the local commit (collective on the I/O thread): one
  // vote says whether the drain thread is stuck past its deadline on any
  // rank (then the late part is abandoned, and this save skips the shared
  // root), and whether every rank can read its boxes from its file of the
  // local step. If so, the shared root's part is handed to the drain thread,
  // holding the local step (LocalTier::Hold: no later save recycles or
  // removes it while the drain reads it); the staging buffer is already
  // back. If not (the local commit failed, or a file could not be mapped),
  // this save skips the shared root too: a drain from the staging buffer
  // would keep it for as long as the shared file system makes the drain
  // last, and the next Save would wait for it. Returns the save's status.
  Status HandOff(const Comm& comm, const Status& local_tier);

  // Drain mode, on the drain thread: the shared root's part with the drain's
  // communicator, not watched by the watchdog (the deadline is the bound).
  // The local step is held until the part ends.
  Status Drain();

  // 1. Plan: reuse the previous one if every rank holds what it held then.
  Status Plan(const Comm& comm);

  // 1, without a plan to reuse: every rank's description to rank 0, which
  // plans; its outcome and plan to every rank. Descriptions travel once per
  // distinct layout: a digest from every rank, then the bytes from the first
  // rank of each layout (coordinator/layouts.h).
  Status GatherPlan(const Comm& comm);

  // 1: what this rank tells rank 0. Never throws, and never more than
  // kMaxDescriptionBytes: an error of its own instead.
  std::string MyDescription();

  // 2. Replica check: replicas must agree before anything is written.
  Status CheckReplicas(const Comm& comm);

  // The local tier (coordinator/local_tier.h): write and copy, then rank 0
  // fills the marker from every rank's checksums and every node puts it.
  Status SaveLocal(const Comm& comm);

  // After a local commit: map this rank's file of the step, and give the
  // staging buffer back. If the file cannot be mapped, the snapshot is kept
  // (for a write on the I/O thread; a drain then skips the shared root).
  void ReadFromLocalCopy();

  void LogLocal(const Status& s) const;

  void RemoveStepDir() const { impl_.store_->RemoveStep(job_.step).IgnoreError(); }

  ManagerImpl& impl_;
  SaveJob& job_;
  SaveTimings& t_;
  const int rank_;
  io::Marker plan_;
  LocalTier::Hold hold_;  // drain mode: the local step, while the drain reads it
  // After a local commit: this rank's file, the landing file's kept mapping
  // (the file landed there) or mapped here, and its boxes.
  std::shared_ptr<io::KeptMappings::Mapping> local_kept_;
  io::MappedFile local_copy_;
  StagedBoxFn from_local_;
  std::vector<BoxSum> local_sums_;  // the checksums the local commit took
};

}  // namespace mhckpt::internal
