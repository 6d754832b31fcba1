// Internal: the state behind CheckpointManager. Its public part
// (manager_impl.cc) is what the façade (checkpoint_manager.cc) calls on the
// caller's thread; the protocols it runs on its I/O thread — save (save.cc,
// shared_commit.cc), restore (restore.cc), verify (verify.cc) — are its
// private members. Its parts with one job each: the drain's queue and
// deadlines (drain_queue.h), retention (retention.h), a lazy save's copier
// and fence (lazy_copier.h).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/comm.h"
#include "coordinator/checkpoint_manager.h"
#include "coordinator/drain_queue.h"
#include "coordinator/io_thread.h"
#include "coordinator/lazy_copier.h"
#include "coordinator/local_tier.h"
#include "coordinator/preemption.h"
#include "coordinator/read_once.h"
#include "coordinator/retention.h"
#include "coordinator/watchdog.h"
#include "io/marker.h"
#include "io/root_store.h"
#include "io/storage.h"
#include "worker/snapshot.h"
#include "worker/staging_pool.h"

namespace mhckpt::internal {

/// One save, as handed from the caller thread to the I/O thread.
struct SaveJob {
  int64_t step = 0;
  Status local;  ///< this rank's input error, carried into the plan round
  Snapshot snapshot;
  UserMetadata metadata;
  SaveTimings timings;
  /// Also to the shared root (always, without a local tier).
  bool persistent = true;
  /// Set by the save (I/O thread): the shared root committed the step here
  /// (so retention follows, even if the local tier failed).
  bool committed_shared = false;
  /// In drain mode (Options::persistent_deadline_seconds): the shared root's
  /// part of the save, run on the drain thread after the local commit.
  std::function<Status()> drain;
  /// Set for a save of the agreed preemption step: its record in the commit
  /// marker (saved_after_ms is filled in when the marker is written).
  std::optional<io::MarkerPreemption> preemption;
  /// A lazy save's copy (CopyMode::kLazy, coordinator/lazy_copier.h), joined
  /// by the I/O thread before the plan round; it fills `snapshot` and merges
  /// its error into `local`.
  std::thread copier;
};

class ManagerImpl {
 public:
  ManagerImpl(Comm comm, std::string root, const Options& options, bool async);

  /// After Open's last agreement: the root store, the root's lock and lease (rank 0 with
  /// Options::own_root, else null) and the caller thread's communicator.
  void Adopt(std::unique_ptr<io::RootStore> store, std::unique_ptr<io::RootOwnership> root_lock,
             Comm caller_comm);

  // The caller's side of CheckpointManager.

  /// Runs `job` (the save protocol, save.cc) on the I/O thread, or inline
  /// when synchronous, records its outcome, then (rank 0) retention; `where`
  /// names the rank and step in an exception's message.
  void SubmitSave(std::shared_ptr<SaveJob> job, std::string where);
  /// Waits until every submitted save is recorded and its retention done;
  /// in drain mode also every shared root's part handed off before the
  /// call, each bounded by Options::persistent_deadline_seconds from its own
  /// start (CheckpointManager::WaitUntilFinished). The first error since the
  /// last call, agreed.
  Status WaitUntilFinished();
  /// Waits until the retention of the last recorded save has run (rank 0);
  /// in drain mode, without waiting for a retention that has run longer
  /// than the deadline.
  void WaitForRetention();
  /// Collective, on the I/O thread after pending saves (restore.cc).
  Status Restore(int64_t step, std::span<const ArrayToRestore> arrays,
                 const RestoreOptions& options);
  /// Collective, on the I/O thread after pending saves (restore_latest.cc):
  /// CheckpointManager::RestoreLatest.
  Result<int64_t> RestoreLatest(std::span<const ArrayToRestore> arrays,
                                const RestoreOptions& options);
  /// Collective, on the I/O thread after pending saves (verify.cc).
  Status Verify(int64_t step, const VerifyOptions& options, VerifyReport* report);
  /// Collective: WaitUntilFinished, then on the I/O thread the step leaves
  /// both tiers (CheckpointManager::Delete).
  Status Delete(int64_t step);
  /// Collective, after Adopt, with Options::local_dir: opens the local tier
  /// and recovers what it holds (coordinator/local_tier.h).
  Status OpenLocalTier();
  /// The local tier, or null without Options::local_dir.
  [[nodiscard]] const LocalTier* local_tier() const { return local_.get(); }
  /// Caller thread: whether the next save goes to the shared root too
  /// (Options::persistent_every, SaveOptions::tier), counting it.
  bool NextSaveIsPersistent(SaveTier tier);
  /// Drain mode (Options::persistent_deadline_seconds, a local tier, async):
  /// the shared root's part of each save runs on a thread of its own, with
  /// `comm` (Open).
  void StartDrain(Comm comm);
  [[nodiscard]] bool DrainMode() const { return drain_ != nullptr; }
  /// The drain's communicator.
  [[nodiscard]] const Comm& drain_comm() const { return drain_comm_; }
  /// The drain thread starts the shared root's part of `step`.
  void MarkDrainStarted(int64_t step);
  /// Whether the drain thread's current work (a shared root's part, or the
  /// retention after one) has run past the deadline here; and if so, the
  /// first handed-off step not yet ended nor abandoned (the one to abandon),
  /// or -1.
  [[nodiscard]] std::pair<bool, int64_t> DrainState() const;
  /// Marks `step`'s shared-root part abandoned, with every part handed off
  /// after it and not yet ended (agreed by the callers, who name `rank`, a
  /// rank where it was late). The IoError to report, the first time only
  /// (OK after).
  Status Abandon(int64_t step, int rank);
  [[nodiscard]] bool IsAbandoned(int64_t step) const;
  /// Makes `s` the first error since the last WaitUntilFinished, unless
  /// there is one.
  void RecordError(const Status& s);
  /// Collective on the caller's communicator: AgreeAll.
  Status Agree(const Status& local) const;
  /// At Open, with PreemptionOptions::enabled: installs the signal handlers
  /// (removed with the manager).
  Status InstallPreemptionHandlers();
  /// Collective, caller's thread: the decision for `step` shared by
  /// ReachedPreemption and ShouldSave (coordinator/preemption.h), on a
  /// communicator of its own made by the first call.
  const StepDecision& DecideStep(int64_t step);
  /// Caller thread: the record for a save of `step` if it is the agreed
  /// preemption step.
  [[nodiscard]] std::optional<io::MarkerPreemption> PreemptionRecord(int64_t step) const;
  /// Runs every job already handed to the I/O thread.
  void Drain();

  [[nodiscard]] int rank() const { return comm_.rank(); }
  [[nodiscard]] const std::string& root() const { return root_; }
  [[nodiscard]] io::RootStore& store() const { return *store_; }
  [[nodiscard]] const Options& options() const { return options_; }
  [[nodiscard]] bool async() const { return async_; }
  [[nodiscard]] StagingPool& pool() { return pool_; }
  [[nodiscard]] SaveTimings last_timings() const;

 private:
  class SaveRun;  // save.cc: one save, the steps of the save protocol

  /// Collective, on the I/O thread: plan, write, make durable, commit.
  Status RunSave(SaveJob& job);
  /// Collective, on the I/O thread.
  Status RunRestore(int64_t step, std::span<const ArrayToRestore> arrays,
                    const RestoreOptions& options);
  /// Collective, on the I/O thread.
  Status RunVerify(int64_t step, const VerifyOptions& options, VerifyReport* report);
  /// Collective, on the I/O thread.
  Status RunDelete(int64_t step);
  // Rank 0: the shared root's record of deleted steps (empty if none).
  Result<Deletions> ReadLocalDeletions();

  /// Runs `fn` where HDF5 may be touched (the I/O thread, or inline when
  /// synchronous) and returns its status.
  Status RunOnIoThread(const std::function<Status()>& fn);

  // The outcome of a save (I/O thread); `retention_follows`: rank 0 deletes
  // old steps next (RunRetention), and listings wait for it.
  void RecordSave(const Status& s, const SaveTimings& t, bool retention_follows);
  // Step 7 of the save protocol, rank 0, after RecordSave (or, in drain
  // mode, EndDrain): retention_'s run, then RecordRetention. Runs on one
  // thread only: the I/O thread, or in drain mode the drain thread (the only
  // one that commits to the shared root then).
  void RunRetention(int64_t step);
  void RecordRetention(double seconds);

  Comm comm_;         // the I/O thread's
  Comm caller_comm_;  // collectives on the caller's thread (Agree)
  const std::string root_;
  const Options options_;
  const bool async_;

  StagingPool pool_;
  Watchdog watchdog_;                   // bounds each collective phase of the I/O thread
  std::unique_ptr<io::Engine> engine_;  // where the arrays of every step are stored
  // The root's markers, listing and ownership (set by Open); destroyed after
  // the threads below that use it.
  std::unique_ptr<io::RootStore> store_;

  mutable std::mutex mu_;
  Status first_error_;                // since the last WaitUntilFinished
  std::condition_variable saves_cv_;  // saves, retentions or drains changed
  int saves_in_flight_ = 0;           // submitted by Save, not yet recorded
  int retentions_pending_ = 0;        // rank 0: recorded saves whose retention has not run
  SaveTimings last_timings_;

  // The last successful plan and a hash of the description it came from
  // (I/O thread only): a save with the same description reuses the plan.
  std::optional<io::Marker> last_plan_;
  uint64_t last_description_hash_ = 0;

  // GPU-to-GPU broadcasts for restore (I/O thread only), made on the first
  // restore that can use them.
  DeviceBroadcasts device_broadcasts_;

  // With Options::local_dir: the node-local tier. Its view is read by the
  // caller's thread (Steps) and changed by the I/O thread (under its mutex).
  std::unique_ptr<LocalTier> local_;
  int64_t saves_ = 0;                                     // caller thread: Save calls so far
  std::chrono::steady_clock::time_point last_save_call_;  // caller thread: the last Save call
  // Whether a save (or a drain's part of one) has not ended on this rank.
  [[nodiscard]] bool SaveInFlight() const;

  // Preemption: this manager's signal handlers (with
  // PreemptionOptions::enabled) and the per-step agreement (made by the first
  // ReachedPreemption or ShouldSave; its rounds are completed when it goes).
  std::unique_ptr<PreemptionHandlers> preemption_handlers_;
  std::unique_ptr<StepAgreement> step_agreement_;

  // Drain mode: the shared root's parts, their communicator, and (under mu_)
  // their queue, deadlines and abandon state (coordinator/drain_queue.h).
  void BeginDrain(int64_t step);
  // The part of `step` ended; `retention_follows` as for RecordSave.
  void EndDrain(int64_t step, const Status& s, const SaveTimings& t, bool retention_follows);
  Comm drain_comm_;
  DrainQueue drains_;

  // Rank 0 with Options::own_root: the root's lock and lease, released after
  // the I/O thread (declared after it) has finished every job.
  std::unique_ptr<io::RootOwnership> root_lock_;

  // Rank 0 (null elsewhere): retention, and its thread that removes the
  // directories it retired (coordinator/retention.h). Destroyed after the I/O
  // and drain threads (the only ones that run it) and before the root's lock,
  // so that the removals end while this job still owns the root.
  std::unique_ptr<Retention> retention_;

  // Drain mode: runs the shared root's parts; joined after the I/O thread
  // (which submits to it) and before everything they use.
  std::unique_ptr<IoThread> drain_;
  std::unique_ptr<IoThread> thread_;  // last: joined before the rest is destroyed
};

}  // namespace mhckpt::internal
