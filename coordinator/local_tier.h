// The local tier (Options::local_dir): steps committed in node-local storage,
// each node holding its own ranks' boxes and copies of other nodes' boxes, so
// that a job that lost a node restores from memory instead of the shared file
// system.
//
// A local step of each node is a step directory of the node's local dir, as
// in a shared root (io/layout.h), with its own commit marker — the same
// marker as the shared root's, chunk checksums included — and, instead of
// data.h5, one file per writer rank: w<R>.bin holds the boxes the plan gives
// rank R, back to back in plan order (WriterFiles). A node holds the files of
// its own ranks and of the ranks it keeps copies for (Nodes::CopyHolders).
//
// The save of a local step (collective, on the I/O thread, after the plan):
//   1. Each node's lowest rank makes the step directory; one agreement. If
//      the node has a spare — the directory of a step that an earlier,
//      agreed commit dropped from the view (step 5) — it is renamed to the
//      new step's, and the files the node writes again are kept, to be
//      overwritten in place (fresh pages of a tmpfs cost a fault and a
//      cleared page each; reused ones cost nothing). No committed step is
//      touched before this save's commit is agreed.
//   2. Each rank maps its own file (reserved in full first: a full tmpfs is
//      an error here, not a SIGBUS later), copies its planned boxes into it
//      and hashes them, and maps the files it receives; one agreement.
//   3. Each rank sends its file to its copy holders, and receives the files
//      it holds straight into their mappings (point to point); then it makes
//      every file it wrote durable (fsync: a no-op on a tmpfs).
//   4. Rank 0 gathers every rank's outcome and checksums (as the shared
//      root's commit does), fills the marker and broadcasts it; each node's
//      lowest rank makes the step's names durable and puts the marker
//      (io::RootStore::PutMarker); one agreement. The step is committed in
//      the local tier once that agreement says every node put its marker.
//      On a failure the nodes remove the step; every earlier step of the
//      view stays as it was.
//   5. Retention: the steps older than the newest Options::local_max_to_keep
//      leave the view, except a step held on any rank (Hold: a drain, a
//      restore or a rebuild still reads its files), which stays until a later
//      save finds it unheld; one vote (max over the ranks) makes the choice
//      the same everywhere. Each node's lowest rank retires the first step it
//      drops (marker removed durably, directory renamed out of the listing)
//      and keeps it as the spare of step 1 (one at most); it removes the
//      others.
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
// is (Recovery finds the step lost otherwise and falls back).
//
// Recovery (Open, collective): each node's lowest rank takes ownership of
// its local dir, removes steps without a marker, and reports its committed
// steps with the writer files and parity blocks it holds whole (the expected
// size); rank 0 finds the steps whose every writer file survives on some
// node of this job, or can be rebuilt from its parity group — at any world
// size — and broadcasts that view, with each such step's marker; lost files
// are rebuilt (Rebuild). Open's collectives are watched by the watchdog as
// the save's are (ManagerImpl::OpenLocalTier). Nodes may hold two saves of one step number (a job
// that could not restore a local step saved it again while a node outside
// that job kept the older save): the newest save (its marker's creation
// time, so the clocks of the jobs' rank-0 hosts must agree) is the step.
// Nodes remove the local steps nobody can restore, and older saves of kept
// ones. The view is the same on every rank, and each later local commit adds
// to it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/comm.h"
#include "base/status.h"
#include "coordinator/checkpoint_manager.h"
#include "coordinator/rank_report.h"
#include "io/mapped_file.h"
#include "io/marker.h"
#include "io/root_store.h"

namespace mhckpt::internal {

/// Which node each rank of a communicator is on, and where the copies of
/// each rank's boxes go: a ring over the nodes.
class Nodes {
 public:
  /// Collective. `node_id` >= 0: this rank's node, as given (tests that
  /// simulate nodes); -1: the shared-memory domain (MPI_Comm_split_type).
  static Nodes Discover(const Comm& comm, int node_id);
  /// From each rank's node key (equal keys: one node). Nodes are numbered
  /// by their lowest rank.
  explicit Nodes(const std::vector<int64_t>& key_of_rank);
  Nodes() = default;

  [[nodiscard]] int count() const { return static_cast<int>(ranks_.size()); }
  /// The number of ranks.
  [[nodiscard]] int ranks() const { return static_cast<int>(node_of_.size()); }
  [[nodiscard]] int node_of(int rank) const { return node_of_[static_cast<size_t>(rank)]; }
  [[nodiscard]] const std::vector<int>& ranks_of(int node) const {
    return ranks_[static_cast<size_t>(node)];
  }
  /// True for the lowest rank of its node, which runs the node's local dir.
  [[nodiscard]] bool leads(int rank) const { return ranks_of(node_of(rank)).front() == rank; }
  /// The ranks that keep a copy of `rank`'s boxes: on each of the next
  /// `copies` nodes of the ring (fewer if there are fewer other nodes), the
  /// rank at the same position within its node (modulo the node's size).
  [[nodiscard]] std::vector<int> CopyHolders(int rank, int copies) const;
  /// The ranks whose boxes `rank` keeps a copy of (the inverse).
  [[nodiscard]] std::vector<int> CopiesHeldBy(int rank, int copies) const;
  /// The parity groups for Options::local_parity_group = `g`: the nodes in
  /// runs of g (a last run of one node joins the run before), and in each
  /// run the ranks at the same position on its nodes, in node order, where
  /// there are two or more.
  [[nodiscard]] std::vector<std::vector<int>> ParityGroups(int g) const;

 private:
  std::vector<int> node_of_;
  std::vector<std::vector<int>> ranks_;
};

/// Where each writer's boxes lie in its file of a local step.
struct WriterFiles {
  explicit WriterFiles(const io::Marker& m);
  std::vector<uint64_t> bytes;                // per writer rank
  std::vector<std::vector<uint64_t>> offset;  // per array, per box: in its writer's file
};

/// "w<rank>.bin": the file of a writer in a local step directory.
std::string WriterFileName(int writer);
/// "p<rank>.bin": a rank's parity block in a local step directory.
std::string ParityFileName(int rank);

/// XOR parity of one group (Options::local_parity_group): each member's
/// file, zero-padded to the group's largest, is cut into g-1 segments of
/// `segment` bytes; segment k of member i goes into the parity block of
/// member (i+1+k) mod g, which is the XOR of the g-1 segments it gets, one
/// from each other member. A lost member's segment k is its block-holder's
/// block XOR the other segments in that block.
struct ParityGroup {
  std::vector<int> members;  ///< ranks at save, in node order
  uint64_t segment = 0;
  ParityGroup(std::vector<int> ranks, const WriterFiles& files);
  [[nodiscard]] int size() const { return static_cast<int>(members.size()); }
  /// Which segment of member i the block of member j holds (i != j).
  [[nodiscard]] int SegmentIn(int i, int j) const {
    return ((j - i - 1) % size() + size()) % size();
  }
  /// The member whose block holds segment k of member i.
  [[nodiscard]] int BlockOf(int i, int k) const { return (i + 1 + k) % size(); }
  /// Index of `rank` in members, or -1.
  [[nodiscard]] int IndexOf(int rank) const;
};

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

class LocalTier {
 public:
  explicit LocalTier(const Options& options);
  ~LocalTier();
  LocalTier(const LocalTier&) = delete;
  LocalTier& operator=(const LocalTier&) = delete;

  /// Collective: finds the nodes, takes ownership of each node's local dir,
  /// and recovers the view (the header's "Recovery"). Errors, on every
  /// rank: IoError or FailedPrecondition naming the rank and the directory.
  Status Open(const Comm& comm, const Options& options);

  /// Collective, save steps 1-3 for `plan`: writes this rank's file from
  /// `staged` and exchanges copies; `sums` gets the checksums of the boxes
  /// this rank wrote. Returns this rank's error (not agreed: step 4 reports
  /// it), after taking part in every exchange it can.
  Status Write(const Comm& comm, const io::Marker& plan, const StagedBoxFn& staged,
               std::vector<BoxSum>* sums);
  /// Collective, save steps 4 (after rank 0 filled and broadcast `marker`)
  /// and 5: the agreed outcome.
  Status Commit(const Comm& comm, const io::Marker& marker, const std::string& text);
  /// Collective: removes step `step` on every node (a failed save).
  void Abandon(const Comm& comm, int64_t step);

  /// Keeps local step `step`'s files as they are while it lives: no save
  /// recycles or removes a held step on any node (save step 5 votes over
  /// every rank's holds). Move-only; releasing it is local and never blocks.
  /// Take it on the I/O thread (or before handing the reader to another
  /// thread), so that the next save's vote sees it.
  class Hold {
   public:
    Hold() = default;
    Hold(Hold&& o) noexcept : tier_(std::exchange(o.tier_, nullptr)), step_(o.step_) {}
    Hold& operator=(Hold&& o) noexcept;
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;
    ~Hold() { Release(); }
    /// Lets go of the step now (a no-op if empty).
    void Release();
    [[nodiscard]] bool held() const { return tier_ != nullptr; }

   private:
    friend class LocalTier;
    Hold(LocalTier* tier, int64_t step) : tier_(tier), step_(step) {}
    LocalTier* tier_ = nullptr;
    int64_t step_ = -1;
  };
  /// Holds `step` on this rank (any thread; `step` need not be in the view).
  [[nodiscard]] Hold HoldStep(int64_t step);
  /// Whether `step` is held on this rank (any thread).
  [[nodiscard]] bool IsHeld(int64_t step) const;

  /// The ranks whose boxes live on their own node only (no copy, no parity
  /// group), ascending; empty when every rank is protected.
  [[nodiscard]] std::vector<int> Unprotected() const;

  /// The steps the local tier can restore, ascending (any thread).
  [[nodiscard]] std::vector<int64_t> Steps() const;
  /// The local step `step`, or null (any thread).
  [[nodiscard]] std::shared_ptr<const LocalStep> Find(int64_t step) const;

  [[nodiscard]] const Nodes& nodes() const { return nodes_; }
  [[nodiscard]] const std::string& dir() const { return dir_; }
  /// The path of writer `writer`'s file of step `step` on this node.
  [[nodiscard]] std::string FilePath(int64_t step, int writer) const;
  /// The path of rank `rank`'s parity block of step `step` on this node.
  [[nodiscard]] std::string ParityPath(int64_t step, int rank) const;

 private:
  // Write, with parity: this rank's block, from the segments of the others.
  Status ExchangeParity(const Comm& comm, int64_t step, const WriterFiles& files,
                        const io::MappedFile& own, std::vector<MPI_Request>* requests,
                        std::vector<std::string>* received, io::MappedFile* block);
  // Open: a node's report of one committed step (what it holds whole).
  nlohmann::json Holdings(int64_t step, const io::Marker& m, int64_t hash) const;
  // Open, rank 0: the restorable steps from every node's report.
  nlohmann::json Recover(const std::vector<std::string>& reports) const;
  // "parity.json" of a step: the parity groups of its save.
  [[nodiscard]] std::string GroupsPath(int64_t step) const;
  // Open: rebuilds the files of lost ranks from parity, on `rebuilder`.
  Status Rebuild(const Comm& comm, const LocalStep& s, int lost, int rebuilder,
                 const std::vector<std::vector<int>>& parity_holders);
  void Keep(const Comm& comm);  // save step 5
  // Save step 1, the node's lowest rank: the spare directory (spare_) made
  // `new_step`'s, its files kept to be overwritten; or a fresh directory.
  Status MakeStepDir(int rank, int64_t new_step);
  void Add(int64_t step, std::shared_ptr<const LocalStep> s);

  const std::string dir_;
  const int copies_;  // 0 with parity
  const int parity_;  // Options::local_parity_group
  const int keep_;
  Nodes nodes_;
  std::unique_ptr<io::RootStore> store_;          // this node's dir (its lowest rank)
  std::unique_ptr<io::RootOwnership> ownership_;  // its lock and lease (its lowest rank)

  // The node's lowest rank, I/O thread: the retired directory of a step that
  // save step 5 dropped, for step 1 to recycle ("" if none).
  std::string spare_;

  mutable std::mutex mu_;
  std::map<int64_t, std::shared_ptr<const LocalStep>> view_;  // agreed
  std::map<int64_t, int> holds_;                              // this rank's (Hold)
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
