// The root store: the second seam of io/, beside the data engine
// (io/storage.h). A checkpoint root holds steps; the engine owns a step's
// array bytes, and the root store owns everything else about the root:
//   - the commit marker of each step: put atomically, read back;
//   - the listing: which steps exist, which are committed, which are
//     garbage (no marker), which are retired;
//   - the root's lock and lease: one job per root;
//   - retirement and removal of a step, its marker first.
// The coordinator and the CLI reach a root only through this interface
// (MakeRootStore); nothing above io/ touches a root's files itself.
//
// Rules every implementation keeps (tests/root_store_test.cc runs the same
// cases against each):
//   1. A step is committed if and only if its marker exists and is valid: it
//      parses (ParseMarker) and names the step. A step without a marker is
//      garbage: never committed, listed as uncommitted, removable.
//   2. PutMarker is atomic and durable: a reader sees no marker or the
//      whole one, and once PutMarker returns OK the marker survives a crash.
//      It is the last write of a save (after the engine's Flush and SyncStep).
//   3. Removal goes marker first: RetireStep and RemoveStep make the step
//      uncommitted (durably) before any of its data goes, so no crash leaves
//      a committed step with missing data.
//   4. A retired step is out of every listing of steps (not committed, not
//      garbage): only RetiredSteps names it, until RemoveRetired frees it.
//   5. One owner at a time: Acquire succeeds for one holder of a root; every
//      other Acquire of it fails with FailedPrecondition naming the holder
//      (or waits up to RootLockOptions::wait_seconds for it to leave) until
//      the holder's RootOwnership is destroyed or its process dies.
//
// Calls are not collective: each is made by one process, and which rank
// calls it is the coordinator's protocol (today rank 0, for the shared root).
// A store may be used from several threads (the I/O thread and the deleter).
//
// Implementations:
//   PosixRootStore (io/posix_root_store.h): a directory on a file system every
//     rank sees; the marker is ROOT/step_N/commit.json, the lock an flock on
//     ROOT/mhckpt.lock with a lease beside it (io/root_lock.h). Its system
//     calls go through the fault seam of io/posix_file.cc.
//   MemoryRootStore (io/memory_root_store.h): in process memory, for unit
//     tests of the rules above and of code above the seam; not durable.
// The local tier (coordinator/local_tier.h) uses a PosixRootStore of each
// node's own local dir, called by the node's lowest rank: the node's markers
// (the same Marker as the shared root's), listing, lock and retirement keep
// these rules. Its array bytes are per-writer files beside the marker
// (io/mapped_file.h), not the data engine's file. Which steps are whole
// across the job is not a store's question: the coordinator gathers every
// node's listing.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "io/marker.h"
#include "io/root_lock.h"

namespace mhckpt::io {

/// A step of a root, as ListSteps finds it.
struct StepEntry {
  int64_t step = 0;
  bool committed = false;  ///< the marker exists and is valid
  Status marker;           ///< why not, when a marker exists but is invalid
};

/// The ownership of a root that RootStore::Acquire grants: held until
/// destroyed (the job that made it may save into the root meanwhile).
class RootOwnership {
 public:
  virtual ~RootOwnership() = default;
  /// The lease of the previous owner that Acquire took over (its process
  /// gone, or its heartbeat stale), or nullopt if there was none.
  [[nodiscard]] virtual const std::optional<Lease>& taken_over() const = 0;
};

class RootStore {
 public:
  virtual ~RootStore() = default;

  /// The root's name, as given to MakeRootStore: in messages, and where the
  /// data engine writes each step's arrays (io/layout.h).
  [[nodiscard]] virtual const std::string& root() const = 0;

  // ---- The root itself ----

  /// True if the root exists (and is a root, not a file).
  virtual bool Exists() = 0;
  /// Creates the root if it does not exist. InvalidArgument if the name is
  /// taken by something that is not a root (a file); IoError.
  virtual Status Create() = 0;
  /// IoError unless this process may create and remove steps in the root.
  virtual Status CheckWritable() = 0;

  // ---- One job per root (rule 5) ----

  /// Takes ownership of the root (which exists). FailedPrecondition, naming
  /// the root and the holder, if another holder has it (after waiting up to
  /// `options.wait_seconds`); IoError. Changes no step.
  virtual Result<std::unique_ptr<RootOwnership>> Acquire(const RootLockOptions& options) = 0;
  /// The text of the current owner's lease (io/root_lock.h: LeaseToJson):
  /// how other processes check that they see the root the owner holds.
  /// NotFound if there is no owner.
  virtual Result<std::string> LeaseText() = 0;

  /// The record of deleted local saves (coordinator/local_recovery.h), as
  /// last put: NotFound if none was; DataLoss if it is larger than 1 MiB.
  virtual Result<std::string> GetLocalDeletions() = 0;
  /// Replaces that record, atomically and durably. IoError.
  virtual Status PutLocalDeletions(const std::string& text) = 0;

  // ---- Steps ----

  /// Every step of the root but the retired ones, ascending, each with its
  /// marker checked (rule 1).
  virtual Result<std::vector<StepEntry>> ListSteps() = 0;
  /// The committed steps, ascending.
  Result<std::vector<int64_t>> CommittedSteps();
  /// The steps that have no marker at all (garbage: a save that did not
  /// finish), ascending; cheaper than ListSteps, nothing is parsed. A step
  /// whose marker exists but is invalid is not among them: that is damage,
  /// kept for `mhckpt verify` to report.
  virtual Result<std::vector<int64_t>> StepsWithoutMarker() = 0;

  /// Starts step `step` afresh: AlreadyExists if it has a marker; else
  /// removes what an earlier attempt left and creates the empty step
  /// durably, ready for the engine's writes.
  virtual Status CreateStep(int64_t step) = 0;
  /// Makes the names of what the engine created in the step durable, before
  /// its marker (rule 2).
  virtual Status SyncStep(int64_t step) = 0;
  /// Puts the marker of step `marker.step` (rule 2): `text` is
  /// MarkerToJson(marker). IoError; a failed put leaves no marker.
  virtual Status PutMarker(const Marker& marker, const std::string& text) = 0;
  /// The text of step `step`'s marker: NotFound if it has none; DataLoss if
  /// it is larger than kMaxMarkerBytes; IoError.
  virtual Result<std::string> GetMarker(int64_t step) = 0;
  /// GetMarker, parsed (ParseMarker, naming MarkerLocation).
  Result<Marker> ReadMarker(int64_t step);
  /// Where step `step`'s marker is, for messages (a path, for POSIX).
  [[nodiscard]] virtual std::string MarkerLocation(int64_t step) const = 0;
  /// Bytes the step takes in the root (marker and data).
  virtual uint64_t StepBytes(int64_t step) = 0;

  /// Removes step `step` at once (rule 3: its marker first, durably, then
  /// its data). A missing step is not an error.
  virtual Status RemoveStep(int64_t step) = 0;
  /// The first, quick half of deleting a committed step (rule 3): removes
  /// the marker durably, then moves the step out of the listing (rule 4).
  /// Returns the retired step's name for RemoveRetired, or "" if there was
  /// no step. Nothing of the data is freed yet: RemoveRetired can take long
  /// (an unlink of a multi-GiB file on a file system mounted with
  /// `discard`, ~0.3 s per GiB) and can run in the background.
  virtual Result<std::string> RetireStep(int64_t step) = 0;
  /// The retired steps not yet removed (by a job that ended or crashed
  /// first), as RetireStep names them.
  virtual Result<std::vector<std::string>> RetiredSteps() = 0;
  /// Frees a retired step, durably. A missing one is not an error.
  virtual Status RemoveRetired(const std::string& retired) = 0;
  /// RetireStep, then RemoveRetired.
  Status DeleteStep(int64_t step);
};

/// The store for `root`: today always a PosixRootStore (a directory path).
std::unique_ptr<RootStore> MakeRootStore(const std::string& root);

}  // namespace mhckpt::io
