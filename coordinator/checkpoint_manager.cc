#include "coordinator/checkpoint_manager.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "base/fault.h"
#include "base/guard.h"
#include "base/log.h"
#include "coordinator/agree.h"
#include "coordinator/committed_step.h"
#include "coordinator/input_checks.h"
#include "coordinator/manager_impl.h"
#include "coordinator/open_root.h"
#include "io/marker.h"
#include "io/root_store.h"
#include "worker/copy.h"
#include "worker/fault_guard.h"

namespace mhckpt {

using internal::AgreeAll;
using internal::BroadcastStatus;
using internal::CheckStep;
using internal::CheckUserMetadata;
using internal::Comm;
using internal::FillSnapshot;
using internal::MarkDeviceCopies;
using internal::PrepareSnapshot;
using internal::SaveJob;
using internal::SnapshotCopy;
using internal::SnapshotOptions;
using internal::WriteWatch;

namespace {

StepDescription DescribeMarker(const io::Marker& m) {
  StepDescription d;
  d.step = m.step;
  d.format_version = m.format_version;
  d.files = m.files;
  d.world_size = m.world_size;
  d.created_unix_ms = m.created_unix_ms;
  d.total_bytes = m.total_bytes;
  d.user_metadata = m.user_metadata;
  if (m.preemption) {
    d.preemption = PreemptionRecord{m.preemption->notice_unix_ms,
                                    static_cast<double>(m.preemption->grace_ms) / 1000,
                                    static_cast<double>(m.preemption->saved_after_ms) / 1000};
  }
  d.arrays.reserve(m.arrays.size());
  for (const io::MarkerArray& a : m.arrays) {
    StoredArray& out = d.arrays.emplace_back();
    out.name = a.name;
    out.dtype = a.dtype;
    out.shape = a.shape;
    out.replicated = a.replicated;
    out.boxes.reserve(a.boxes.size());
    for (const io::MarkerBox& b : a.boxes) out.boxes.push_back({b.box, b.writer, b.checksum});
  }
  return d;
}

}  // namespace

const StoredArray* StepDescription::Find(std::string_view name) const {
  auto it = std::lower_bound(arrays.begin(), arrays.end(), name,
                             [](const StoredArray& a, std::string_view n) { return a.name < n; });
  return it != arrays.end() && it->name == name ? &*it : nullptr;
}

CheckpointManager::CheckpointManager(std::unique_ptr<internal::ManagerImpl> impl)
    : impl_(std::move(impl)) {}

CheckpointManager::~CheckpointManager() { impl_->Drain(); }

Result<std::unique_ptr<CheckpointManager>> CheckpointManager::Open(MPI_Comm comm, std::string root,
                                                                   Options options) {
  bool async = options.async && Comm::ThreadMultiple();
  Comm dup = Comm::Duplicate(comm);
  fault::SetRank(dup.rank());
  // Why an agreement first: a bad option or root on any rank fails Open on
  // every rank, before rank 0 touches the file system.
  MHCKPT_RETURN_IF_ERROR(internal::AgreeOpenInputs(root, options, dup));
  std::unique_ptr<io::RootStore> store = io::MakeRootStore(root);
  std::unique_ptr<io::RootOwnership> lock;
  Status s;
  if (dup.rank() == 0) {
    s = Guarded("rank 0: open", [&] { return internal::PrepareRoot(*store, options, &lock); });
    if (options.async && !async) {
      Logger()->warn(
          "mhckpt: MPI was not initialised with MPI_THREAD_MULTIPLE; saves commit "
          "synchronously inside Save");
    }
  }
  // Why: only rank 0 touched the directory; every rank must see its outcome.
  MHCKPT_RETURN_IF_ERROR(BroadcastStatus(s, 0, dup));
  MHCKPT_RETURN_IF_ERROR(internal::AgreeRootIsShared(*store, options.own_root, dup));
  // Why a second duplicate: collectives on one communicator must not run on
  // two threads at once, and the I/O thread owns the first.
  Comm caller = Comm::Duplicate(comm);
  std::unique_ptr<internal::ManagerImpl> impl;
  // Starting the I/O and watchdog threads may fail (a limit on threads): an
  // agreed error, not an exception on one rank.
  s = Guarded(fmt::format("rank {}: open", caller.rank()), [&] {
    impl = std::make_unique<internal::ManagerImpl>(std::move(dup), std::move(root), options, async);
  });
  MHCKPT_RETURN_IF_ERROR(AgreeAll(s, caller));
  impl->Adopt(std::move(store), std::move(lock), std::move(caller));
  if (options.preemption.enabled) {
    MHCKPT_RETURN_IF_ERROR(impl->Agree(impl->InstallPreemptionHandlers()));
  }
  if (!options.local_dir.empty()) {
    MHCKPT_RETURN_IF_ERROR(impl->OpenLocalTier());
    // The shared root's part of a save on a thread of its own: its own
    // communicator, so its collectives never meet the I/O thread's.
    if (options.persistent_deadline_seconds > 0 && async) {
      impl->StartDrain(Comm::Duplicate(comm));
    }
  }
  std::unique_ptr<CheckpointManager> mgr(new CheckpointManager(std::move(impl)));
  if (options.staging_reserve_bytes > 0) {
    // Only a head start: without it the first save maps its own staging.
    if (Status r = mgr->Reserve(options.staging_reserve_bytes); !r.ok()) {
      Logger()->warn("mhckpt: rank {}: staging_reserve_bytes: {}", mgr->impl_->rank(),
                     r.ToString());
    }
  }
  return mgr;
}

Status SaveFence::Wait() const { return state_ ? state_->Wait() : OkStatus(); }

bool SaveFence::Done() const { return !state_ || state_->Done(); }

Status CheckpointManager::Reserve(uint64_t bytes) {
  if (impl_->options().staging_budget_bytes != 0 && bytes > impl_->options().staging_budget_bytes) {
    return OkStatus();
  }
  return impl_->pool().Reserve(bytes);
}

Status CheckpointManager::Save(int64_t step, std::span<const ArrayToSave> arrays,
                               const UserMetadata& metadata, const SaveOptions& save_options,
                               SaveFence* fence) {
  auto job = std::make_shared<SaveJob>();
  auto t0 = std::chrono::steady_clock::now();
  job->step = step;
  job->persistent = impl_->NextSaveIsPersistent(save_options.tier);
  job->preemption = impl_->PreemptionRecord(step);
  SnapshotOptions so;
  so.rank = impl_->rank();
  so.threads = impl_->options().snapshot_threads > 0
                   ? impl_->options().snapshot_threads
                   : static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 4u));
  const int rank = impl_->rank();
  const std::string where = fmt::format("rank {}: save of step {}", rank, step);
  // Nothing may throw out of Save: this rank must still hand its job to the
  // I/O thread, or the other ranks would wait for it in the plan round.
  std::vector<SnapshotCopy> copies;
  job->local = Guarded(where, [&] { return PrepareSnapshot(arrays, so, &job->snapshot, &copies); });
  // Lazy: the copies run on a thread of their own. Device boxes are ordered
  // here, on the caller's thread: an event recorded now on each caller
  // stream, which the copies wait for (not for work queued there later).
  const bool lazy_asked = save_options.copy == CopyMode::kLazy && impl_->async();
  // A blocking save of host buffers to the local tier, when the rank's
  // landing file is free and its pages are in place, takes the lazy path and
  // waits for its copy before returning: the boxes land in the file, hashed
  // on the way, and the local commit moves it into the step (one pass over
  // the bytes instead of a copy into staging and a write of the tier's file).
  bool land = false;
  if (!lazy_asked && impl_->async() && job->local.ok() &&
      std::none_of(copies.begin(), copies.end(),
                   [](const SnapshotCopy& c) { return c.memory == Memory::kCuda; })) {
    (void)Guarded(where,
                  [&] { land = internal::AcquireWarmLanding(*impl_, &job->snapshot, &copies); });
  }
  const bool lazy = lazy_asked || land;
  auto mark = std::make_shared<internal::CallerStreamMark>();
  if (lazy) {
    Status marked =
        Guarded(where, [&] { return MarkDeviceCopies(&copies, job->snapshot, so, mark.get()); });
    if (!marked.ok()) {
      // The save fails; the copier leaves the device boxes alone.
      if (job->local.ok()) job->local = marked;
      std::erase_if(copies, [](const SnapshotCopy& c) { return c.memory == Memory::kCuda; });
      mark->Reset();
    }
  }
  if (!lazy) {
    Status copied = Guarded(
        where, [&] { return FillSnapshot(copies, so, job->local, impl_->pool(), &job->snapshot); });
    job->local = copied;
  }
  if (job->local.ok()) job->local = CheckStep(step, rank);
  if (job->local.ok() && rank == 0) {
    job->local = Guarded(where, [&] {
      MHCKPT_RETURN_IF_ERROR(CheckUserMetadata(metadata, rank));
      job->metadata = metadata;
      return OkStatus();
    });
  }
  if (job->local.ok() && !impl_->options().own_root) {
    job->local = FailedPrecondition(fmt::format(
        "rank {}: '{}' was opened without ownership (Options::own_root is false): it cannot save",
        rank, impl_->root()));
  }
  job->timings.local_bytes = job->snapshot.total_bytes;
  fault::SetStep(step);
  if (job->local.ok()) job->local = fault::Hit("after_snapshot");
  Status local = job->local;
  auto state = std::make_shared<internal::FenceState>();
  if (fence != nullptr) *fence = SaveFence(state);
  if (!lazy) {
    job->timings.budget_wait = job->snapshot.budget_wait_seconds;
    job->timings.snapshot =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() -
        job->timings.budget_wait;
    if (save_options.on_copied) (void)Guarded(where, [&] { save_options.on_copied(local); });
    state->Complete(local);
    impl_->SubmitSave(std::move(job), where);
    return local;
  }
  auto watch = std::make_shared<WriteWatch>();
  if (save_options.protect_host) {
    Status s = watch->Protect(internal::WatchRanges(copies, job->snapshot, rank, step));
    if (job->local.ok() && !s.ok()) {
      job->local = Status(s.code(), fmt::format("rank {}: {}", rank, s.message()));
    }
  }
  so.guarded = true;
  // The staging memory is taken here, on the caller's thread, in the order of
  // the saves: a later save (blocking or lazy) can then never take the memory
  // this copy needs while the I/O thread, joining this copier before it runs
  // that later save, waits for it (a deadlock). Like a blocking save, this
  // waits while the pool's budget is held by an earlier save (with a local
  // tier: while an earlier lazy save holds the rank's landing file,
  // coordinator/local_landing.h, in which this copy then lands).
  Status staged = land ? OkStatus() : Guarded(where, [&] {
    return internal::AcquireLazyStaging(*impl_, so, &job->snapshot, &copies);
  });
  if (!staged.ok()) {
    copies.clear();  // no memory to copy into: the copier copies nothing
    if (job->local.ok()) job->local = staged;
    local = job->local;
  }
  // The copier owns what it needs; the job is joined by the I/O thread
  // (SubmitSave) before the plan round.
  internal::LazyCopier::Start(std::make_shared<internal::LazyCopier>(
      job.get(),
      internal::LazyCopier::Parts{std::move(copies), so, state, watch, mark,
                                  save_options.check_after_copy, save_options.on_copied, where}));
  if (land) {
    // Blocking: the caller takes part in the copy (FenceState::Wait), and
    // the stall is counted as a blocking save's, budget wait apart.
    Status copied = state->Wait();
    job->timings.snapshot =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() -
        job->timings.budget_wait;
    if (local.ok()) local = copied;
  }
  impl_->SubmitSave(std::move(job), where);
  return local;
}

Status CheckpointManager::WaitUntilFinished() { return impl_->WaitUntilFinished(); }

Result<std::vector<CheckpointManager::StepTiers>> CheckpointManager::Steps() const {
  // A listing on rank 0 after WaitUntilFinished already reflects retention.
  impl_->WaitForRetention();
  MHCKPT_ASSIGN_OR_RETURN(std::vector<int64_t> persistent, impl_->store().CommittedSteps());
  std::map<int64_t, StepTiers> steps;
  for (int64_t s : persistent) steps[s] = {s, true, false};
  if (const internal::LocalTier* local = impl_->local_tier()) {
    for (int64_t s : local->Steps()) {
      steps[s].step = s;
      steps[s].local = true;
    }
  }
  std::vector<StepTiers> out;
  out.reserve(steps.size());
  for (const auto& [s, tiers] : steps) out.push_back(tiers);
  return out;
}

Result<std::vector<int64_t>> CheckpointManager::CommittedSteps() const {
  MHCKPT_ASSIGN_OR_RETURN(std::vector<StepTiers> steps, Steps());
  std::vector<int64_t> out;
  out.reserve(steps.size());
  for (const StepTiers& s : steps) out.push_back(s.step);
  return out;
}

Result<std::optional<int64_t>> CheckpointManager::LatestStep() const {
  MHCKPT_ASSIGN_OR_RETURN(std::vector<int64_t> steps, CommittedSteps());
  if (steps.empty()) return std::optional<int64_t>();
  return std::optional<int64_t>(steps.back());
}

Result<StepDescription> CheckpointManager::Describe(int64_t step) const {
  if (const internal::LocalTier* local = impl_->local_tier()) {
    if (std::shared_ptr<const internal::LocalStep> s = local->Find(step)) {
      return DescribeMarker(s->marker);
    }
  }
  Result<io::Marker> m = impl_->store().ReadMarker(step);
  if (!m.ok()) {
    if (m.status().code() != StatusCode::kNotFound) return m.status();
    return NotFound(fmt::format("step {} is not committed in '{}'", step, impl_->root()));
  }
  MHCKPT_RETURN_IF_ERROR(internal::CheckMarkerStep(*m, impl_->store(), step));
  return DescribeMarker(*m);
}

Status CheckpointManager::Delete(int64_t step) { return impl_->Delete(step); }

Status CheckpointManager::Restore(int64_t step, std::span<const ArrayToRestore> arrays,
                                  const RestoreOptions& options) {
  return impl_->Restore(step, arrays, options);
}

Status CheckpointManager::Verify(int64_t step, const VerifyOptions& options, VerifyReport* report) {
  VerifyReport unused;
  return impl_->Verify(step, options, report != nullptr ? report : &unused);
}

Status CheckpointManager::Verify(int64_t step, uint64_t* bytes_checked) {
  VerifyReport r;
  Status s = Verify(step, VerifyOptions{}, &r);
  if (bytes_checked != nullptr) *bytes_checked = r.bytes_checked;
  return s;
}

Status CheckpointManager::Agree(const Status& local) { return impl_->Agree(local); }

Result<bool> CheckpointManager::ReachedPreemption(int64_t step) {
  const internal::StepDecision& d = impl_->DecideStep(step);
  if (!d.status.ok()) return d.status;
  return d.preempted;
}

Result<bool> CheckpointManager::ShouldSave(int64_t step) {
  const internal::StepDecision& d = impl_->DecideStep(step);
  if (!d.status.ok()) return d.status;
  const Options& o = impl_->options();
  return d.preemption_step || (o.save_interval_steps > 0 && step % o.save_interval_steps == 0) ||
         (o.save_continuously && d.ready);
}

SaveTimings CheckpointManager::LastSaveTimings() const { return impl_->last_timings(); }

size_t CheckpointManager::StagingBytes() const { return impl_->pool().allocated_bytes(); }

size_t CheckpointManager::PinnedStagingBytes() const { return impl_->pool().pinned_bytes(); }

bool CheckpointManager::async() const { return impl_->async(); }
const std::string& CheckpointManager::root() const { return impl_->root(); }

}  // namespace mhckpt
