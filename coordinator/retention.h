// Retention (Options::max_to_keep, keep_period): which committed steps of
// the shared root a policy deletes, and the one object that deletes them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mhckpt::io {
class RootStore;
}

namespace mhckpt::internal {

class IoThread;

/// The steps of `committed` (ascending) to delete when keeping the newest
/// `max_to_keep` (0: keep all) plus every step that is a multiple of
/// `keep_period` (0: none). The newest step is never deleted.
std::vector<int64_t> StepsToDelete(const std::vector<int64_t>& committed, int max_to_keep,
                                   int64_t keep_period);

/// Rank 0's retention of one shared root: the only owner of the policy, of
/// the runs and of the thread that frees retired steps. A run retires the
/// steps the policy no longer keeps (marker first, then the directory
/// renamed out of the listing: io::RootStore::RetireStep; milliseconds) and
/// hands their removal to its deleter thread, so that freeing their blocks
/// delays neither WaitUntilFinished nor the next save.
///
/// Runs happen on one thread at a time: the I/O thread, or in drain mode
/// (Options::persistent_deadline_seconds) only the drain thread, the only one
/// that commits to the shared root then. The manager counts the runs still
/// to come under its own lock (its waits also count saves and drains).
class Retention {
 public:
  /// `store` outlives this object.
  Retention(io::RootStore* store, int max_to_keep, int64_t keep_period);
  /// Finishes the removals already handed to the deleter thread, then joins.
  ~Retention();
  Retention(const Retention&) = delete;
  Retention& operator=(const Retention&) = delete;

  /// Whether a run follows a save whose I/O-thread part ended (`saved`: OK;
  /// `committed_shared`: the shared root committed the step, even if the
  /// local tier then failed) — never in drain mode, where the drain thread
  /// runs it after the shared root's part.
  [[nodiscard]] bool FollowsSave(bool saved, bool committed_shared, bool drain_mode) const {
    return enabled() && (saved || committed_shared) && !drain_mode;
  }
  /// Drain mode: whether a run follows a shared root's part that ended
  /// (`committed`: OK).
  [[nodiscard]] bool FollowsDrain(bool committed) const { return enabled() && committed; }

  /// One run, after `step` committed; a failure is logged, not returned (the
  /// step is committed either way). Returns its seconds.
  double Run(int64_t step);

  /// Blocks until every removal handed to the deleter so far has ended (for
  /// tests).
  void WaitForRemovals();

  [[nodiscard]] bool enabled() const { return max_to_keep_ > 0; }

 private:
  void RemoveInBackground(std::string dir);

  io::RootStore* const store_;
  const int max_to_keep_;
  const int64_t keep_period_;
  // Made on the first retired step, by the one thread that runs retention.
  std::unique_ptr<IoThread> deleter_;
};

}  // namespace mhckpt::internal
