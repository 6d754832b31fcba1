// mhckpt: asynchronous, multi-host checkpoints of sharded and replicated
// arrays, written with parallel HDF5 and committed atomically.
//
//   auto opened = mhckpt::CheckpointManager::Open(MPI_COMM_WORLD, "/ckpt");
//   if (!opened.ok()) ...               // opened.status(): the same on every rank
//   auto mgr = std::move(opened).value();
//   mgr->Save(step, arrays);            // returns once every box is copied
//   ... keep training, overwrite or free the buffers ...
//   mgr->WaitUntilFinished();           // the same Status on every rank
//   auto latest = mgr->LatestStep();    // check latest.ok() and *latest first
//   mgr->Restore(**latest, requests);
//
// Every method is called by every rank of the communicator, in the same order,
// unless it says "local". Errors are returned, never thrown; a collective
// method returns the same Status on every rank. Result::value() on an error
// prints the Status and aborts (base/status.h): check ok() first.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "base/types.h"
#include "coordinator/options.h"
#include "worker/array.h"

namespace spdlog {
class logger;
}  // namespace spdlog

namespace mhckpt {
namespace internal {
class ManagerImpl;  // coordinator/manager_impl.h
struct FenceState;  // coordinator/lazy_copier.h
}  // namespace internal

/// Completes when a lazy save has copied every box of this rank (an empty
/// fence is complete): from then on the save reads none of the caller's
/// buffers, which the caller may free, overwrite or give away (CopyMode::kLazy
/// says what the caller owns until then). Copyable; every copy refers to the
/// same save; it may outlive the save and the manager.
class SaveFence {
 public:
  SaveFence() = default;
  /// Local. Blocks until the copy has ended; returns its outcome on this
  /// rank (OK, or the error that will fail the save on every rank through
  /// WaitUntilFinished, e.g. a buffer freed during the copy).
  Status Wait() const;
  /// Local. Whether the copy has ended.
  [[nodiscard]] bool Done() const;

 private:
  friend class CheckpointManager;
  explicit SaveFence(std::shared_ptr<internal::FenceState> state) : state_(std::move(state)) {}
  std::shared_ptr<internal::FenceState> state_;
};

/// What Verify found; the same on every rank.
struct VerifyReport {
  size_t arrays = 0;           ///< arrays in the step's commit marker
  size_t boxes = 0;            ///< stored boxes
  uint64_t bytes_checked = 0;  ///< bytes read back, over all ranks
  /// Every problem found, each naming the step, the array and the box.
  std::vector<std::string> problems;
};

/// One stored box of a committed array: where it lies in the array, which
/// rank wrote it, and the checksum of its bytes (XXH3-64, row-major).
struct StoredBox {
  Box box;
  int writer = 0;
  /// XXH3-64 of the box's bytes; 0 in a format-3 step, which keeps its
  /// checksums in the step's index file (`mhckpt inspect --json` reads them).
  uint64_t checksum = 0;
};

/// One array of a committed step.
struct StoredArray {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  /// Every rank that listed the array held all of it when it was saved.
  bool replicated = false;
  /// The stored boxes; together they tile the array exactly once.
  std::vector<StoredBox> boxes;
};

/// A step saved because of a preemption notice (ReachedPreemption's step),
/// as its commit marker records it.
struct PreemptionRecord {
  /// When the earliest rank got the notice (Unix time, ms, that rank's clock).
  int64_t notice_unix_ms = 0;
  /// PreemptionOptions::grace_seconds of rank 0 (0: unknown).
  double grace_seconds = 0;
  /// From the notice to the write of the commit marker (rank 0's clock
  /// against the noticing rank's).
  double saved_after_seconds = 0;
};

/// What a committed step holds (CheckpointManager::Describe), from its commit
/// marker (docs/FORMAT.md).
struct StepDescription {
  int64_t step = 0;
  int format_version = 0;  ///< of the commit marker
  int files = 0;           ///< its subfiles (Options::files), or 0: one data file
  int world_size = 0;      ///< ranks that saved the step
  int64_t created_unix_ms = 0;
  uint64_t total_bytes = 0;         ///< bytes of array data
  std::vector<StoredArray> arrays;  ///< sorted by name
  UserMetadata user_metadata;
  /// Set if the step was saved as the preemption step (ReachedPreemption).
  std::optional<PreemptionRecord> preemption;

  /// The array called `name`, or nullptr.
  [[nodiscard]] const StoredArray* Find(std::string_view name) const;
};

/// Phases of the last finished save, in seconds (rank-local clocks).
struct SaveTimings {
  double budget_wait = 0;  ///< waiting for staging memory (caller thread)
  double snapshot = 0;     ///< copying into host staging memory (caller thread)
  double plan = 0;         ///< gather, validate, pick writers, create the step directory
  /// With Options::persistent_deadline_seconds the shared root's part runs
  /// after the save is recorded: write, flush, commit and written_bytes are
  /// then those of the latest such part to end.
  double write = 0;   ///< create datasets and write boxes
  double flush = 0;   ///< make the data file durable and close it
  double commit = 0;  ///< agree, write the marker, agree
  /// Retention (rank 0): retiring the steps max_to_keep drops. It runs after
  /// the commit is announced, so it is not part of the commit
  /// (WaitUntilFinished still waits for it); freeing the retired steps' files
  /// runs later, in the background, and is not counted. Filled in when the
  /// retiring ends (0 until then).
  double gc = 0;
  /// With Options::local_dir: committing to the local tier (write, copies to
  /// other nodes, marker), before the shared root's write.
  double local = 0;
  bool persistent = true;      ///< the save went to the shared root too
  bool plan_cached = false;    ///< same arrays and boxes as the previous save: no gather
  uint64_t local_bytes = 0;    ///< bytes this rank staged
  uint64_t written_bytes = 0;  ///< bytes this rank wrote
};

class CheckpointManager {
 public:
  /// Collective. Opens (creating it if needed) the checkpoint directory `root`
  /// on a shared file system, takes ownership of it and removes uncommitted
  /// steps (see Options). Errors, the same on every rank: InvalidArgument if
  /// any rank's `options` hold a value out of range (a negative count, a
  /// timeout that is not a finite number of seconds, a root_lease_seconds that
  /// is not positive, an enum value outside its enum), if ranks disagree on
  /// `transfer` or `verify_replicas` (every rank's save protocol depends on
  /// them), if `root` is empty, holds a NUL byte or is too long, or if rank 0
  /// finds it is not a directory; FailedPrecondition if another job (or
  /// another manager of this process) owns `root`, naming its host, pid, job
  /// id and heartbeat age — nothing in `root` is changed — or if a rank does
  /// not see the directory rank 0 opened (a root on node-local storage),
  /// naming that rank and its host; IoError if rank 0
  /// cannot create `root`, cannot write to it, use its lock or lease file, or
  /// remove an uncommitted step.
  static Result<std::unique_ptr<CheckpointManager>> Open(MPI_Comm comm, std::string root,
                                                         Options options = {});

  /// Collective; waits for pending saves.
  ~CheckpointManager();
  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;

  /// Collective. Starts saving `arrays` as step `step`. Returns once every box
  /// this rank holds is copied into memory mhckpt owns: the caller may then
  /// overwrite or free every buffer. Every rank lists every array (same name,
  /// dtype, shape), with the boxes it holds. Returns this rank's input error,
  /// if any (InvalidArgument naming the array, the rank and the box, a step
  /// outside 0..kMaxStep, or more than kMaxArraysPerSave arrays or
  /// kMaxShardsPerRank shards); the save then fails on every rank, through
  /// WaitUntilFinished, which reports every other error.
  /// `metadata` is taken from rank 0, which checks it (kMaxMetadataEntries and
  /// the limits beside it): a bad one is rank 0's InvalidArgument here and
  /// every rank's from WaitUntilFinished. Other ranks' metadata is ignored.
  /// `options` chooses the tier of this save (with Options::local_dir); every
  /// rank must pass the same, or the save fails with InvalidArgument.
  /// With `options.copy` kLazy, Save returns before copying: `fence`, if
  /// given, completes when every box of this rank is copied, and the caller
  /// keeps every buffer allocated and unchanged until then, even if Save
  /// returned an error (CopyMode::kLazy says precisely what the caller
  /// owns and until when); without a fence, until `options.on_copied` is
  /// called or WaitUntilFinished returns.
  Status Save(int64_t step, std::span<const ArrayToSave> arrays, const UserMetadata& metadata = {},
              const SaveOptions& options = {}, SaveFence* fence = nullptr);

  /// Local. Maps `bytes` of staging memory now and touches it on a thread of
  /// its own (Options::staging_reserve_bytes, which Open passes here): a
  /// later Save of up to that many bytes on this rank finds it ready. A
  /// no-op if staging that large is held already, or if it would exceed
  /// Options::staging_budget_bytes. IoError if the memory is refused.
  Status Reserve(uint64_t bytes);

  /// Collective. Waits for every save started so far to commit or fail, and
  /// for the retention after it (max_to_keep, keep_period: the old steps are
  /// retired, not yet freed on disk), so that listings
  /// made after it agree on every rank; returns the first failure since the
  /// last call, the same on every rank.
  /// With Options::persistent_deadline_seconds (drain mode) it waits for
  /// every save's local part, then for the shared root's part of every save
  /// started before the call, queued ones included, in order: each part for
  /// at most persistent_deadline_seconds from its own start (a part queued
  /// behind another starts when that one ends). It returns once all have
  /// ended, or once the drain's current work on some rank is past its
  /// deadline: the first part not yet ended and those queued behind it are
  /// abandoned (IoError below) and never get a marker. The retention after a
  /// part (rank 0) runs on the drain too, within the same bound from its own
  /// start; a late retention is no error, but the parts queued behind it are
  /// abandoned, and until it ends a step it retires may still be listed by
  /// some ranks and not by others. A part that started less than persistent_deadline_seconds
  /// ago, with nothing late ahead of it, is never abandoned. Errors:
  /// InvalidArgument (inconsistent input, naming array, rank and box),
  /// AlreadyExists (step committed before), DataLoss (with verify_replicas:
  /// replicas that differ, naming the array, the box and both ranks), IoError
  /// (a write, flush or commit failed, naming the rank; in drain mode, a
  /// shared root's part abandoned, naming the step and a rank where it was
  /// late), Internal (a bug or an
  /// unexpected exception on the I/O thread, naming the rank).
  Status WaitUntilFinished();

  /// Local. The committed steps, ascending: those of `root` (a step is
  /// committed there if and only if its commit marker exists and is valid)
  /// and, with Options::local_dir, those the local tier can restore (as
  /// Steps says). IoError if `root` cannot be listed.
  [[nodiscard]] Result<std::vector<int64_t>> CommittedSteps() const;
  /// One committed step and the tiers that hold it.
  struct StepTiers {
    int64_t step = 0;
    bool persistent = false;  ///< committed in the shared root
    /// Committed in the local tier, with a copy of every rank's boxes on a
    /// node of this job (the same answer on every rank: agreed at Open and
    /// after each save).
    bool local = false;
  };
  /// Local. CommittedSteps, with the tiers of each.
  [[nodiscard]] Result<std::vector<StepTiers>> Steps() const;
  /// Local. The newest committed step (in either tier), or nullopt if none.
  /// Committed, not verified: its bytes are checked only when it is restored
  /// (or verified), and a damaged copy of it may fail that; RestoreLatest
  /// restores the newest step that restores intact. Errors as
  /// CommittedSteps.
  [[nodiscard]] Result<std::optional<int64_t>> LatestStep() const;

  /// Local. What committed step `step` holds, from its commit marker: every
  /// array's name, dtype, global shape and boxes (with writer and checksum),
  /// the world size at save, and the user metadata. NotFound if the step is
  /// not committed; DataLoss if its marker is damaged; IoError if it cannot be
  /// read. Use it to size
  /// destinations before Restore, or to read metadata saved with the step.
  [[nodiscard]] Result<StepDescription> Describe(int64_t step) const;

  /// Collective. Deletes committed step `step` from every tier that holds
  /// it, once every save in flight has ended (WaitUntilFinished; its error is
  /// returned and nothing is deleted). The shared root's step is no longer
  /// committed when this returns (its marker goes first); its files are
  /// freed in the background, as retention's. Each node of this job removes
  /// its local copy. With a local tier, the deletion is recorded in the
  /// shared root first, so that a node outside the job that still holds the
  /// step removes it when it rejoins instead of bringing it back (a save of
  /// the same step number made later is not affected; the record keeps the
  /// 4,096 highest steps deleted). NotFound if no tier holds it;
  /// FailedPrecondition, with nothing deleted, if a reader on some rank
  /// holds its local copy; IoError from either tier. The same Status on
  /// every rank.
  Status Delete(int64_t step);

  /// Collective. Waits for pending saves, then fills every destination of
  /// `arrays` from committed step `step`. Ranks may ask for different arrays
  /// and boxes (any sharding), on any world size. Errors: NotFound (step not
  /// committed, unknown array), InvalidArgument (box outside the array, dtype
  /// other than the stored one, strict mode mismatch), DataLoss (damaged
  /// file, or bytes whose checksum differs, naming the array, the stored box,
  /// the chunk and the ranks; every byte returned is checked unless
  /// `options.verify_checksums` is false), IoError (the file cannot be
  /// opened or read, naming the rank), each on every rank. On an error the
  /// destinations' contents are unspecified.
  Status Restore(int64_t step, std::span<const ArrayToRestore> arrays,
                 const RestoreOptions& options = {});

  /// Collective. Waits for pending saves, then restores the newest committed
  /// step that restores intact, and returns it: the candidates are tried
  /// newest first — for a step in both tiers the local tier first, each
  /// damaged piece of a local step served from another node's copy or
  /// rebuilt from parity — and a step that cannot be served whole (DataLoss
  /// or NotFound of its marker or of a piece) is skipped with one log line
  /// on rank 0 naming the step, the tier and why; the same choice on every
  /// rank. `options` apply to every attempt, but every byte is checked
  /// (verify_checksums is taken as true), and `options.source` limits the
  /// candidates to one tier. `arrays` describe the job's state, as for
  /// Restore, and must match every candidate step (the names, dtypes and
  /// shapes each holds; a checkpointer's steps of one run do): a step they
  /// do not match is the caller's error, returned, not skipped (falling back
  /// past it would roll training back further than any damage asks).
  /// Errors, on every rank: NotFound if no committed step restores (naming
  /// each step skipped and why); NotFound or InvalidArgument as Restore for
  /// requests that do not match the candidate tried (an array it lacks, a
  /// dtype or box it does not hold); IoError if the shared root cannot be
  /// listed or read; Internal. On an error the destinations' contents are
  /// unspecified.
  Result<int64_t> RestoreLatest(std::span<const ArrayToRestore> arrays,
                                const RestoreOptions& options = {});

  /// Collective. Waits for pending saves, then checks committed step `step`
  /// against its commit marker: the marker parses and names the step, its
  /// boxes tile every array exactly once, every array is stored with the
  /// marker's dtype and shape, and every box reads back with the checksum
  /// the marker records (the boxes dealt to the ranks by bytes, each read in
  /// slabs of at most 64 MiB). It goes on past a problem, to find them all.
  /// Errors: NotFound (step not committed); DataLoss naming the step, the
  /// array and the box of the first problem (a damaged marker, a flipped
  /// byte, a truncated file, a missing dataset, an unreadable box), and how
  /// many more there are; IoError (the marker cannot be read). `report`, if
  /// given, gets every problem.
  Status Verify(int64_t step, const VerifyOptions& options, VerifyReport* report = nullptr);
  /// Collective. Verify without options; `bytes_checked`, if given, gets the
  /// bytes read back over all ranks.
  Status Verify(int64_t step, uint64_t* bytes_checked = nullptr);

  /// Collective, on the caller's thread; called once per training step, by
  /// every rank with the same `step` (in the same order as every other
  /// collective call of the caller's thread). True on every rank, at the
  /// same step, once any rank has had a preemption notice (a signal of
  /// PreemptionOptions::signals, or NotifyPreemption), and at every later
  /// step; the caller then saves this step (ShouldSave says so too), waits
  /// for it (WaitUntilFinished) and exits. A Save of the first such step,
  /// called after this call (or ShouldSave) for it, records the notice in
  /// its commit marker (StepDescription::preemption), and rank 0 logs "step
  /// N saved for preemption: X s of a G s grace period".
  /// It does not block: each new step posts one small non-blocking
  /// allreduce and decides from the one posted at the previous step, which
  /// in lock-step training has completed long since (a few microseconds).
  /// So a notice is acted on one or two steps after the step at which it
  /// arrived (steps s+1 or s+2 for a notice during step s); the first step
  /// after Open never reports one. A second call for the same step (e.g.
  /// ShouldSave then ReachedPreemption) returns the first's decision.
  /// Errors, on every rank, one step late: InvalidArgument if the ranks
  /// called with different steps ("ranks called ReachedPreemption with
  /// different steps: 7 .. 9"); InvalidArgument on the rank if `step` is
  /// outside 0..kMaxStep.
  Result<bool> ReachedPreemption(int64_t step);

  /// Collective, as ReachedPreemption (which it shares a round with): whether
  /// to save `step` under the save policy of Options: a multiple of
  /// `save_interval_steps`, or, with `save_continuously`, when the previous
  /// save had finished on every rank and `min_save_interval_seconds` had
  /// passed (as of the previous call, with no Save since; at the first call
  /// after Open, if no Save was made yet), and always at the first
  /// preemption step. The same answer on every rank.
  Result<bool> ShouldSave(int64_t step);

  /// Collective, on the caller's thread. OK on every rank if `local` is OK on
  /// every rank; otherwise the error of the lowest failing rank, on every
  /// rank. For layers above this API (the Python package) that find errors of
  /// their own before a collective call, so that no rank enters it alone.
  Status Agree(const Status& local);

  /// Local. Timings of the last save that finished on this rank.
  [[nodiscard]] SaveTimings LastSaveTimings() const;
  /// Local. Host staging memory held now (kept between saves), in bytes.
  [[nodiscard]] size_t StagingBytes() const;
  /// Local. Of StagingBytes, the bytes pinned (page-locked) for device
  /// copies; 0 without CUDA. A buffer that could not be pinned when it was
  /// lent (no device in use yet, or CUDA refused) is tried again at its
  /// next use, so this may grow after a later save.
  [[nodiscard]] size_t PinnedStagingBytes() const;
  /// Local. True if saves run on the background I/O thread.
  [[nodiscard]] bool async() const;
  [[nodiscard]] const std::string& root() const;

 private:
  explicit CheckpointManager(std::unique_ptr<internal::ManagerImpl> impl);
  std::unique_ptr<internal::ManagerImpl> impl_;
};

/// Local, thread-safe. Sends every log line of mhckpt (every manager of the
/// process, from now on) to `logger`; nullptr restores the library's own
/// logger, named "mhckpt", which writes to stderr. mhckpt never logs through
/// spdlog's default logger, nor registers a logger with spdlog. mhckpt logs
/// rank-local events only (a step committed, a root taken over, a fallback
/// taken); errors are returned as Status, not only logged. The logger's
/// level filters as usual. Needs the spdlog mhckpt was built with
/// (find_package(mhckpt) finds it).
void SetLogger(std::shared_ptr<spdlog::logger> logger);

/// Local, async-signal-safe, thread-safe: records a preemption notice in this
/// process, as the handlers of PreemptionOptions do (the earliest notice's
/// time is kept). For a caller's own signal handler, or a thread polling a
/// cloud metadata server. Every manager of the process sees it at its next
/// ReachedPreemption round.
void NotifyPreemption();
/// Local: forgets this process's notice (a test, or a job that chose to go
/// on). A manager that has already agreed on a preemption step keeps it.
void ClearPreemptionNotice();

}  // namespace mhckpt
