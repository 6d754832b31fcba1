// The local tier (Options::local_dir): steps committed in node-local storage,
// each node holding its own ranks' boxes and the redundancy of other nodes'
// boxes, so that a job that lost a node restores from memory instead of the
// shared file system.
//
// LocalTier orchestrates; each decision has its own module:
//   coordinator/local_nodes.h       placement: which node each rank is on,
//                                   whose partner / parity group it is;
//   coordinator/local_redundancy.h  the redundancy interface, with
//     coordinator/local_copies.h    partner copies and
//     coordinator/local_parity.h    XOR parity (encode, rebuild);
//   coordinator/local_store.h       the node's store: step directories
//                                   made, recycled, committed, retired,
//                                   removed; the file names; holds;
//   coordinator/local_recovery.h    what survives on this job's nodes
//                                   (the election at Open);
//   coordinator/local_sources.h     which copy a restore reads a piece from,
//                                   and what to try after one failed;
//   coordinator/local_restore.cc    the restore (RestoreLocal), with
//     local_restore_serve.cc        its serving and exchange of pieces.
//
// A local step of each node is a step directory of the node's local dir, as
// in a shared root (io/layout.h), with its own commit marker — the same
// marker as the shared root's, chunk checksums included — and, instead of
// data.h5, one file per writer rank (coordinator/local_store.h). A node holds
// the files of its own ranks and of the ranks it keeps copies for.
//
// The save of a local step (collective, on the I/O thread, after the plan):
//   1. Each node's lowest rank makes the step directory (the spare
//      recycled, or a fresh one: LocalStore::MakeStepDir); one agreement.
//      No committed step is touched before this save's commit is agreed.
//   2. Each rank writes its own file (reserved in full first: a full tmpfs
//      is an error here, not a SIGBUS later) from its planned boxes and
//      hashes them, and maps what it receives (LocalRedundancy::BeginSave);
//      one agreement. A lazy save's boxes were copied into the rank's
//      landing file (coordinator/local_landing.h), hashed on the way: when
//      they lie there as in the file, the landing file is moved into the
//      step directory instead, and nothing is copied or hashed here.
//   3. Each rank sends its copies or parity segments and receives those it
//      keeps (point to point); then it makes every file it wrote durable
//      (fsync: a no-op on a tmpfs).
//   4. Rank 0 gathers every rank's outcome and checksums (as the shared
//      root's commit does), fills the marker and broadcasts it; each node's
//      lowest rank makes the step's names durable and puts the marker
//      (LocalStore::Commit); one agreement. The step is committed in the
//      local tier once that agreement says every node put its marker. On a
//      failure the nodes remove the step; every earlier step of the view
//      stays as it was.
//   5. Retention: the steps older than the newest Options::local_max_to_keep
//      leave the view, except a step held on any rank (Hold: a drain, a
//      restore or a rebuild still reads its files), which stays until a later
//      save finds it unheld; one vote (max over the ranks) makes the choice
//      the same everywhere. Each node's lowest rank drops them
//      (LocalStore::Drop: the first becomes the spare of step 1).
//
// Holds: a reader of a local step's files outside the collective that
// serves it (the drain thread reading a rank's own file) holds the step
// (Hold); step 5 never drops, and so step 1 never recycles, a step held on
// any rank. Restores and rebuilds run on the I/O thread between agreements,
// where no save runs, and may hold too.
//
// Unprotected ranks: with parity, a rank alone at its position in a run of
// nodes has no parity group, and a job on one node has no other node for
// copies; Open says so once (rank 0). Such a rank's boxes live only on its
// own node: a step stays restorable from the local tier only while that node
// is (recovery finds the step lost otherwise and falls back).
//
// Open (collective): each node's lowest rank takes ownership of its local
// dir and cleans it (LocalStore::Open), the ranks agree on what survives
// (coordinator/local_recovery.h), lost files are rebuilt from parity
// (RebuildFile), and nodes remove the local steps nobody can restore and
// older saves of kept ones. Open's collectives are watched by the watchdog
// as the save's are (ManagerImpl::OpenLocalTier). The view is the same on
// every rank, and each later local commit adds to it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "base/comm.h"
#include "base/status.h"
#include "coordinator/checkpoint_manager.h"
#include "coordinator/local_landing.h"
#include "coordinator/local_nodes.h"
#include "coordinator/local_recovery.h"
#include "coordinator/local_redundancy.h"
#include "coordinator/local_store.h"
#include "coordinator/rank_report.h"
#include "io/marker.h"
#include "worker/snapshot.h"

namespace mhckpt::internal {

/// A local step this job can restore: its marker, and for each rank that
/// saved it the ranks of this job whose node holds that rank's file.
struct LocalStep {
  io::Marker marker;
  std::vector<std::vector<int>> holders;
  std::vector<std::vector<int>> parity_groups;  ///< at save (empty: copies)
};

/// The staged bytes of planned box `box` of array `array`, or an empty span
/// if this rank does not hold them.
using StagedBoxFn = std::function<std::span<const std::byte>(size_t array, size_t box)>;
/// The staged box that planned box `box` of array `array` is, whole, or
/// null: its checksums may have been taken by the copy (StagedBox::
/// hashed_chunk_bytes).
using KnownBoxFn = std::function<const StagedBox*(size_t array, size_t box)>;

class LocalTier {
 public:
  explicit LocalTier(const Options& options);
  ~LocalTier();
  LocalTier(const LocalTier&) = delete;
  LocalTier& operator=(const LocalTier&) = delete;

  /// Collective: finds the nodes, takes ownership of each node's local dir,
  /// and recovers the view (the header's "Open"). Errors, on every
  /// rank: IoError or FailedPrecondition naming the rank and the directory.
  /// `deleted` (read on rank 0): the steps Delete deleted, which stay
  /// deleted on nodes that were away (coordinator/local_recovery.h).
  Status Open(const Comm& comm, const Options& options, const Deletions& deleted = {});

  /// Collective, save steps 1-3 for `plan`: writes this rank's file from
  /// `staged` and exchanges copies; `sums` gets the checksums of the boxes
  /// this rank wrote (those `known` gives, hashed by the copy in the plan's
  /// chunks, are not hashed again). Where the staged boxes are this rank's
  /// landing file with the file's layout (landing()), the file is moved into
  /// the step instead of written. Returns this rank's error (not agreed:
  /// step 4 reports it), after taking part in every exchange it can.
  Status Write(const Comm& comm, const io::Marker& plan, const StagedBoxFn& staged,
               std::vector<BoxSum>* sums, const KnownBoxFn& known = {});
  /// Collective, save steps 4 (after rank 0 filled and broadcast `marker`)
  /// and 5: the agreed outcome.
  Status Commit(const Comm& comm, const io::Marker& marker, const std::string& text);
  /// Collective: removes step `step` on every node (a failed save).
  void Abandon(const Comm& comm, int64_t step);
  /// Collective: FailedPrecondition, on every rank, if a rank holds step
  /// `step` (a drain of it, a partner's restore), so that it cannot be
  /// deleted now.
  Status CheckDeletable(const Comm& comm, int64_t step) const;
  /// Collective: removes committed step `step` on every node of the job
  /// (CheckpointManager::Delete; its node markers first). FailedPrecondition
  /// if a rank holds it; the agreed outcome.
  Status Delete(const Comm& comm, int64_t step);

  /// Keeps local step `step`'s files as they are while it lives: no save
  /// recycles or removes a held step on any node (save step 5 votes over
  /// every rank's holds). Move-only; releasing it is local and never blocks.
  /// Take it on the I/O thread (or before handing the reader to another
  /// thread), so that the next save's vote sees it.
  using Hold = StepHolds::Hold;
  /// Holds `step` on this rank (any thread; `step` need not be in the view).
  [[nodiscard]] Hold HoldStep(int64_t step) { return holds_.Take(step); }
  /// Whether `step` is held on this rank (any thread).
  [[nodiscard]] bool IsHeld(int64_t step) const { return holds_.IsHeld(step); }

  /// The ranks whose boxes live on their own node only (no copy, no parity
  /// group), ascending; empty when every rank is protected.
  [[nodiscard]] std::vector<int> Unprotected() const;

  /// The steps the local tier can restore, ascending (any thread).
  [[nodiscard]] std::vector<int64_t> Steps() const;
  /// The local step `step`, or null (any thread).
  [[nodiscard]] std::shared_ptr<const LocalStep> Find(int64_t step) const;

  /// This rank's landing file (coordinator/local_landing.h), the staging
  /// memory of its lazy saves; null before Open.
  [[nodiscard]] LandingFile* landing() const { return landing_.get(); }

  [[nodiscard]] const Nodes& nodes() const { return nodes_; }
  [[nodiscard]] const std::string& dir() const { return store_.paths().dir; }
  /// The paths of a local step's files on this node.
  [[nodiscard]] const LocalPaths& paths() const { return store_.paths(); }
  /// The path of writer `writer`'s file of step `step` on this node.
  [[nodiscard]] std::string FilePath(int64_t step, int writer) const;
  /// The path of rank `rank`'s parity block of step `step` on this node.
  [[nodiscard]] std::string ParityPath(int64_t step, int rank) const;
  /// The landing file's kept mapping of writer `writer`'s file of step
  /// `step` (`bytes` long), if its copy landed there (its pages mapped
  /// already); nullptr otherwise.
  [[nodiscard]] std::shared_ptr<io::KeptMappings::Mapping> KeptMapping(int64_t step, int writer,
                                                                       uint64_t bytes);

 private:
  void Keep(const Comm& comm);  // save step 5
  void Add(int64_t step, std::shared_ptr<const LocalStep> s);

  const int keep_;                               // Options::local_max_to_keep
  Nodes nodes_;                                  // from Open
  LocalStore store_;                             // this node's dir (its lowest rank)
  std::unique_ptr<LocalRedundancy> redundancy_;  // from Open
  StepHolds holds_;                              // this rank's
  std::unique_ptr<LandingFile> landing_;         // from Open

  mutable std::mutex mu_;
  std::map<int64_t, std::shared_ptr<const LocalStep>> view_;  // agreed
};

/// Collective: fills the destinations of `arrays` from local step `s`
/// (coordinator/local_restore.cc). Every rank's requests go to every rank;
/// each piece of a stored box that a rank asks for is served by the rank
/// itself if its node holds the writer's file, otherwise by a holder of it,
/// which checks the chunks it reads against the marker and sends the piece.
/// A piece its server cannot serve whole (a chunk whose checksum differs, the
/// file missing, short or unreadable there) is served again, by the same
/// choice on every rank, from a holder on a node not tried yet, else from the
/// writer's file rebuilt from parity; DataLoss naming the array, the box and
/// every source tried only when none is left. Errors as
/// CheckpointManager::Restore, on every rank.
Status RestoreLocal(const Comm& comm, const LocalTier& tier, const LocalStep& s,
                    std::span<const ArrayToRestore> arrays, const RestoreOptions& options);

}  // namespace mhckpt::internal
