// Retention: which committed steps a policy deletes (StepsToDelete: the
// shared root's Options::max_to_keep and keep_period, and the local tier's
// local_max_to_keep, LocalTier::Keep), and the one object that deletes the
// shared root's.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "coordinator/options.h"

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

/// The same by a metric (Options::keep_best): `metrics[i]` is the metric of
/// `committed[i]` (nullopt: none). When more than `max_to_keep` steps are
/// committed (0: keep all), the best `max_to_keep` with a metric are kept
/// (between equal metrics the later step), those without one as
/// `best.keep_without_metric` says, and multiples of `keep_period`. The
/// newest step may go. Orbax's BestN with EveryNSteps, step for step.
std::vector<int64_t> BestStepsToDelete(const std::vector<int64_t>& committed,
                                       const std::vector<std::optional<double>>& metrics,
                                       int max_to_keep, int64_t keep_period, const KeepBest& best);

/// The steps of `committed` (ascending) that a time interval keeps (Orbax's
/// EveryNSeconds): the oldest, then each step created at least `interval_ms`
/// after the last step kept this way. `created_ms[i]` is when `committed[i]`
/// was created (unix ms). Empty if `interval_ms` <= 0.
std::vector<int64_t> StepsKeptByTime(const std::vector<int64_t>& committed,
                                     const std::vector<int64_t>& created_ms, int64_t interval_ms);

/// The metric `key` of a step's user metadata: its value read whole as a
/// number; nullopt when absent, not a number, or NaN.
std::optional<double> MetricOf(const UserMetadata& metadata, const std::string& key);

/// Rank 0's retention of one shared root: the only owner of the policy, of
/// the runs and of the thread that frees retired steps. A run retires the
/// steps the policy no longer keeps (marker first, then the directory
/// renamed out of the listing: io::RootStore::RetireStep; milliseconds) and
/// hands their removal to its deleter thread, so that freeing their blocks
/// delays neither WaitUntilFinished nor the next save.
///
/// Runs follow commits on one thread: the I/O thread, or in drain mode
/// (Options::persistent_deadline_seconds) only the drain thread, the only one
/// that commits to the shared root then; a Delete's Retire comes from the I/O
/// thread, and a lock keeps it apart from a run. The manager counts the runs
/// still to come under its own lock (its waits also count saves and drains).
class Retention {
 public:
  /// `store` outlives this object. `keep_time_interval_ms` > 0 also keeps
  /// the steps StepsKeptByTime keeps (Options::keep_time_interval_seconds).
  Retention(io::RootStore* store, int max_to_keep, int64_t keep_period, KeepBest best = {},
            int64_t keep_time_interval_ms = 0);
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

  /// Retires `step` now (CheckpointManager::Delete) and hands its files to
  /// the deleter: OK, NotFound if it is not committed, or the store's error.
  /// Runs and retires happen one at a time (a lock).
  Status Retire(int64_t step);

  /// Blocks until every removal handed to the deleter so far has ended (for
  /// tests).
  void WaitForRemovals();

  [[nodiscard]] bool enabled() const { return max_to_keep_ > 0; }

 private:
  // The steps the policy deletes now, of the committed `steps`.
  Result<std::vector<int64_t>> ToDelete(const std::vector<int64_t>& steps);
  void RemoveInBackground(std::string dir);

  io::RootStore* const store_;
  const int max_to_keep_;
  const int64_t keep_period_;
  const KeepBest best_;
  const int64_t keep_time_interval_ms_;
  // Runs and Retire, one at a time: in drain mode a Delete from the I/O
  // thread may meet a run on the drain thread.
  std::mutex mu_;
  // keep_best and keep_time_interval: each step's metric and creation time,
  // read from its marker once (a step's marker never changes).
  struct MarkerFacts {
    std::optional<double> metric;
    int64_t created_ms = 0;
  };
  std::map<int64_t, MarkerFacts> facts_;
  // Made on the first retired step, under mu_.
  std::unique_ptr<IoThread> deleter_;
};

}  // namespace mhckpt::internal
