// The node's store of the local tier (coordinator/local_tier.h): one node's
// local dir, run by the node's lowest rank, and the names of the files in a
// local step.
//
// A local step directory holds the marker, one file per writer rank
// (w<R>.bin: the boxes the plan gives rank R, back to back in plan order;
// WriterFiles says where each box lies), the parity blocks of the ranks of
// the node (p<R>.bin, with parity), and parity.json (the parity groups of
// the save, for a rebuild after the nodes changed).
//
// The life of a step directory on a node:
//   - made by save step 1 (MakeStepDir): the spare, recycled — renamed to
//     the new step's and its files kept where the node writes them again,
//     to be overwritten in place (fresh pages of a tmpfs cost a fault and a
//     cleared page each; reused ones cost nothing) — or a fresh directory;
//   - committed by save step 4 (Commit: names durable, then the marker);
//   - removed when its save fails or no one can restore it (Remove);
//   - dropped by retention (Drop) once no rank holds it (StepHolds): the
//     first dropped step is retired (marker removed durably, directory
//     renamed out of the listing) and kept as the next save's spare; the
//     others are deleted.
// Open removes whatever a crash left: steps without a marker, retired
// directories, damaged steps.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "coordinator/checkpoint_manager.h"
#include "io/marker.h"
#include "io/root_store.h"

namespace mhckpt::internal {

/// Where each writer's boxes lie in its file of a local step.
struct WriterFiles {
  explicit WriterFiles(const io::Marker& m);
  std::vector<uint64_t> bytes;                // per writer rank
  std::vector<std::vector<uint64_t>> offset;  // per array, per box: in its writer's file
  /// bytes[w], or 0 for a writer past the end.
  [[nodiscard]] uint64_t BytesOf(int w) const {
    return static_cast<size_t>(w) < bytes.size() ? bytes[static_cast<size_t>(w)] : 0;
  }
};

/// "w<rank>.bin": the file of a writer in a local step directory.
std::string WriterFileName(int writer);
/// "p<rank>.bin": a rank's parity block in a local step directory.
std::string ParityFileName(int rank);

/// The paths of a local step's files under a node's local dir (the same
/// names on every node).
struct LocalPaths {
  std::string dir;
  [[nodiscard]] std::string FilePath(int64_t step, int writer) const;
  [[nodiscard]] std::string ParityPath(int64_t step, int rank) const;
  /// "parity.json": the parity groups of the step's save.
  [[nodiscard]] std::string GroupsPath(int64_t step) const;
};

/// This rank's holds on local steps (LocalTier::Hold): a held step is never
/// recycled or dropped, on any node, because retention votes over every
/// rank's holds. Any thread.
class StepHolds {
 public:
  /// A hold on one step; move-only; releasing it is local and never blocks.
  class Hold {
   public:
    Hold() = default;
    Hold(Hold&& o) noexcept : holds_(std::exchange(o.holds_, nullptr)), step_(o.step_) {}
    Hold& operator=(Hold&& o) noexcept;
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;
    ~Hold() { Release(); }
    /// Lets go of the step now (a no-op if empty).
    void Release();
    [[nodiscard]] bool held() const { return holds_ != nullptr; }

   private:
    friend class StepHolds;
    Hold(StepHolds* holds, int64_t step) : holds_(holds), step_(step) {}
    StepHolds* holds_ = nullptr;
    int64_t step_ = -1;
  };

  [[nodiscard]] Hold Take(int64_t step);
  [[nodiscard]] bool IsHeld(int64_t step) const;

 private:
  mutable std::mutex mu_;
  std::map<int64_t, int> count_;
};

/// A committed step that a node's dir holds, as Open finds it.
struct StoredStep {
  int64_t step = 0;
  std::string text;  ///< the marker's text
  io::Marker marker;
};

/// One node's local dir. Only the node's lowest rank calls what touches it
/// (Open, MakeStepDir, Commit, Remove, Drop), on the I/O thread.
class LocalStore {
 public:
  explicit LocalStore(const std::string& dir);
  ~LocalStore();

  [[nodiscard]] const LocalPaths& paths() const { return paths_; }

  /// Creates the dir, takes ownership of it (its lock and lease), removes
  /// what a crash left, and returns the committed steps, ascending.
  Result<std::vector<StoredStep>> Open(const Options& options);
  /// Save step 1: the spare becomes the directory of `step`, keeping the
  /// files named in `rewritten` (the node writes them again) and removing
  /// the rest; without a spare, a fresh directory. A crash in between
  /// leaves a step directory without a marker, which Open removes.
  Status MakeStepDir(int64_t step, const std::set<std::string>& rewritten);
  /// Save step 4: parity.json (if `groups`), the step's names durable, then
  /// its marker.
  Status Commit(const io::Marker& marker, const std::string& text,
                const std::vector<std::vector<int>>& groups);
  /// Removes step `step` (a failed save, or a step no one can restore).
  Status Remove(int64_t step);
  /// Retention: step `step` leaves the node; the first one dropped while
  /// there is no spare is retired and kept as the spare. Errors are logged.
  void Drop(int64_t step);

 private:
  const LocalPaths paths_;
  std::unique_ptr<io::RootStore> store_;
  std::unique_ptr<io::RootOwnership> ownership_;
  // The retired directory of a dropped step, for MakeStepDir ("" if none).
  std::string spare_;
};

}  // namespace mhckpt::internal
