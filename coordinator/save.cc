// The save protocol of one step, run by every rank on its I/O thread after
// Save has copied the rank's boxes into a Snapshot:
//
//   1. Plan. If every rank holds exactly the arrays and boxes of the
//      previous save, one allreduce confirms it (and that all ranks save the
//      same step) and the previous plan is reused. Otherwise every rank sends
//      rank 0 a digest of its description of what it holds (and its local
//      input error, if any), and the lowest rank of each distinct digest the
//      description itself (coordinator/layouts.h); rank 0 validates all of them together, picks one
//      writer per distinct box (coordinator/plan.h), refuses a step that is already committed,
//      creates the step directory (fsyncing the root), and broadcasts the outcome and the plan;
//      every rank agrees that it could read the plan.
//      Either collective is also the barrier of the design: a rank enters it only after its
//      snapshot is complete, so nobody writes before every snapshot exists.
//   2. Replica check (Options::verify_replicas). Every rank sends rank 0 the
//      checksums of the planned boxes it holds; boxes held by several ranks
//      must be equal everywhere before anything is written.
//   3. Write. All ranks create the step (and agree that they could) and its
//      arrays through the storage engine (io/storage.h; the direct engine's
//      rank 0 lays the file out alone and broadcasts the offsets); rank 0
//      reserves their space on disk and all agree on it and on the arrays,
//      so a full disk fails here and not inside a collective flush; then
//      each rank writes the boxes the plan gives it
//      (fully replicated arrays: rank 0; with
//      Options::replica_parallel_min_bytes, big shared boxes as row slices,
//      one per holder, each from the holder's own staged copy). A write
//      error is remembered, and the rank keeps taking part. The staging
//      buffer goes back to the pool as soon as the rank's writes are done.
//   4. Flush. The engine makes the step durable and closes it (the direct
//      engine: one fsync of the file per rank; the HDF5
//      engine: H5Fflush(GLOBAL), which syncs through MPI-IO, then H5Fclose).
//   5. Agree. One gather: every rank's outcome, and the checksums (XXH3) of
//      the boxes it wrote, which go into the marker.
//   6. Commit. Rank 0 makes the step's names durable before the marker's
//      (io::RootStore::SyncStep: fsync the step directory), puts the marker
//      (io::RootStore::PutMarker: temp file, fsync, rename, fsync the
//      directory), or on failure removes the step (RemoveStep), and
//      broadcasts the outcome; every rank returns it.
//      (The reservation of step 3 is exact: nothing to give back.)
//   7. Retention (coordinator/retention.h). After the outcome is recorded,
//      so off the path to the commit, rank 0's I/O thread retires the steps
//      the policy no longer keeps (marker first, then the directory renamed
//      out of the listing: io::RootStore::RetireStep) before it runs any
//      later job;
//      its deleter thread frees their files in the background. A failure
//      here is logged, not returned: the new step is committed either way.
//
// With Options::local_dir, the save commits in the local tier between steps
// 2 and 3 (coordinator/local_tier.h: write, copy, marker per node); a save
// that stays local ends there, and one that also goes to the shared root
// reads its boxes back from the rank's local file in step 3 (SaveRun::
// ReadFromLocalCopy), the staging buffer already given back.
// In drain mode (Options::persistent_deadline_seconds) steps 3-7 run on the
// drain thread (SaveRun::HandOff, SaveRun::Drain), reading the rank's local
// file under a hold on the local step (LocalTier::Hold), and retention runs
// there too, never on the I/O thread. A save whose local commit failed is not
// drained: it would read the staging buffer, held then for as long as the
// shared file system makes the drain last.
//
// A crash anywhere before step 6 leaves a directory without a marker, which
// is never listed and is removed by the next Open.
//
// Where each part lives: steps 1-2 and the local commit are phases of
// SaveRun (coordinator/save_run.h: steps 1-2 in save_plan.cc, the local
// commit in save_local.cc, the order and the hand-off here), each given the
// I/O thread's communicator explicitly;
// steps 3-6 are a SharedCommit (coordinator/shared_commit.h), made with the
// I/O thread's communicator, or in drain mode with the drain thread's
// (SaveRun::Drain); step 7 is Retention (coordinator/retention.h).
#include <chrono>
#include <memory>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include "base/log.h"

#include "base/fault.h"
#include "base/guard.h"
#include "coordinator/agree.h"
#include "coordinator/save_run.h"
#include "coordinator/shared_commit.h"
#include "io/root_store.h"

namespace mhckpt::internal {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

Status ManagerImpl::SaveRun::Run() {
  const Comm& comm = impl_.comm_;
  // Each phase is bounded in time (Options::collective_timeout_seconds).
  Watchdog::Guard phase(impl_.watchdog_, "plan", job_.step);
  fault::SetStep(job_.step);
  if (job_.local.ok()) job_.local = fault::Hit("plan");
  auto t0 = Clock::now();
  MHCKPT_RETURN_IF_ERROR(Plan(comm));
  if (impl_.options_.verify_replicas) MHCKPT_RETURN_IF_ERROR(CheckReplicas(comm));
  t_.plan = Since(t0);
  t_.persistent = job_.persistent;
  Status local_tier;
  if (impl_.local_) {
    impl_.watchdog_.Enter("local", job_.step);
    t0 = Clock::now();
    local_tier = SaveLocal(comm);
    t_.local = Since(t0);
    if (rank_ == 0) LogLocal(local_tier);
    // Committed locally: the shared root's write reads this rank's boxes
    // from its local file, and the staging buffer goes back now, so the
    // next Save need not wait for the shared root (SaveTimings::budget_wait).
    if (local_tier.ok() && job_.persistent) ReadFromLocalCopy();
  }
  if (!job_.persistent) return local_tier;
  if (impl_.DrainMode()) return HandOff(comm, local_tier);
  Status s = Persistent(comm, &impl_.watchdog_);
  job_.committed_shared = s.ok();
  // A save to both tiers reports the local tier's failure too (the step
  // may then be committed in the shared root only: Steps says; retention
  // follows that commit all the same).
  return s.ok() ? local_tier : s;
}

Status ManagerImpl::SaveRun::Persistent(const Comm& comm, Watchdog* watchdog) {
  SharedRoot where{*impl_.engine_, impl_.root_, *impl_.store_,
                   impl_.options_, watchdog,    [this] { return impl_.IsAbandoned(job_.step); }};
  return SharedCommit(comm, std::move(where), job_, plan_, from_local_ ? &from_local_ : nullptr,
                      std::move(local_sums_))
      .Run();
}

Status ManagerImpl::SaveRun::HandOff(const Comm& comm, const Status& local_tier) {
  auto [stuck, late] = impl_.DrainState();
  const bool readable = static_cast<bool>(from_local_);
  std::vector<int64_t> v{stuck ? 1 : 0, late, late >= 0 ? rank_ : -1, readable ? 0 : 1,
                         readable ? -1 : rank_};
  comm.AllreduceMax(&v);
  if (v[0] != 0) {
    if (v[1] >= 0) {
      Status abandoned = impl_.Abandon(v[1], static_cast<int>(v[2]));
      if (!abandoned.ok()) impl_.RecordError(abandoned);
    }
    t_.persistent = false;
    if (rank_ == 0) {
      Logger()->warn("mhckpt: step {}: not written to the shared root: its writes are stuck there",
                     job_.step);
    }
    return local_tier;
  }
  if (v[3] != 0) {
    t_.persistent = false;
    if (!local_tier.ok()) return local_tier;  // agreed: every rank has it
    return IoError(
        fmt::format("rank {}: step {}: its file of the local step cannot be read back; the step is "
                    "committed in the local tier only",
                    v[4], job_.step));
  }
  hold_ = impl_.local_->HoldStep(job_.step);
  job_.drain = [self = shared_from_this()] { return self->Drain(); };
  return local_tier;
}

Status ManagerImpl::SaveRun::Drain() {
  const Comm& comm = impl_.drain_comm();
  fault::SetStep(job_.step);
  impl_.MarkDrainStarted(job_.step);
  // Rank 0 creates the step in the shared root here, not in the plan round
  // (PrepareStep): refusing a committed one, on every rank alike; or skips
  // a part that was abandoned while it was queued (rank 0 decides, so that
  // every rank skips it or none).
  Status s = rank_ == 0
                 ? Guarded("rank 0: create the step",
                           [&] {
                             if (impl_.IsAbandoned(job_.step)) {
                               return IoError(fmt::format(
                                   "step {}: abandoned before its write started", job_.step));
                             }
                             return impl_.store_->CreateStep(job_.step);
                           })
                 : OkStatus();
  s = BroadcastStatus(s, 0, comm);
  if (s.ok()) s = Persistent(comm, nullptr);
  local_copy_.Close().IgnoreError();
  local_kept_.reset();
  hold_.Release();
  return s;
}

void ManagerImpl::SaveRun::LogLocal(const Status& s) const {
  if (!s.ok()) {
    Logger()->error("mhckpt: step {} failed in the local tier: {}", job_.step, s.ToString());
  } else {
    Logger()->info("mhckpt: step {} committed in the local tier in {:.3f} s{}", job_.step, t_.local,
                   job_.persistent ? "" : " (local only)");
  }
}

Status ManagerImpl::RunSave(SaveJob& job) { return std::make_shared<SaveRun>(*this, job)->Run(); }

}  // namespace mhckpt::internal
