// Drain mode (Options::persistent_deadline_seconds): the shared root's parts
// of saves handed off to the drain thread, and their deadlines.
//
// The drain thread runs one thing at a time: a shared root's part, or the
// retention after one (rank 0). Each has persistent_deadline_seconds from its
// own start, never from the hand-off: a part still queued waits for the one
// before it. When the current work runs past its deadline, the first part
// handed off and neither ended nor abandoned is late; abandoning it abandons
// every part queued behind it too (each would wait for it), and the drain
// thread then skips them (no marker in the shared root).
//
// A plain state machine, without a lock or a clock of its own: the manager
// calls it under its lock and passes the time, so it can be tested alone.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <set>
#include <vector>

#include "base/status.h"

namespace mhckpt::internal {

class DrainQueue {
 public:
  using Clock = std::chrono::steady_clock;

  explicit DrainQueue(double deadline_seconds) : deadline_seconds_(deadline_seconds) {}

  /// The I/O thread hands off `step`'s shared-root part (queued, in order).
  void HandOff(int64_t step) { queued_.push_back(step); }
  /// The drain thread starts `step`'s part at `now`: its deadline counts
  /// from here.
  void Started(int64_t step, Clock::time_point now);
  /// `step`'s part ended (whatever its outcome); with `retention_follows`,
  /// the retention after it starts at `now` and has a deadline of its own.
  /// Returns whether the part had been abandoned.
  bool Ended(int64_t step, bool retention_follows, Clock::time_point now);

  /// The deadline of the drain thread's current work, or nullopt if it runs
  /// none. `retention_pending`: a retention after a part has not ended yet.
  [[nodiscard]] std::optional<Clock::time_point> Due(bool retention_pending) const;
  /// Whether the current work has run past its deadline at `now`.
  [[nodiscard]] bool Late(bool retention_pending, Clock::time_point now) const;
  /// Whether a part (not a retention) runs now.
  [[nodiscard]] bool PartRunning() const { return running_ >= 0; }
  /// The first part handed off, neither ended nor abandoned, or -1.
  [[nodiscard]] int64_t FirstUnabandoned() const;

  /// Marks `step` abandoned, with every part queued after it and not ended,
  /// on the word of `rank`, a rank where it was late. The IoError to report,
  /// the first time `step` is abandoned; OK after.
  Status Abandon(int64_t step, int rank);
  [[nodiscard]] bool IsAbandoned(int64_t step) const { return abandoned_.count(step) > 0; }

  [[nodiscard]] double deadline_seconds() const { return deadline_seconds_; }

 private:
  const double deadline_seconds_;
  std::deque<int64_t> queued_;  // handed off, not ended: the first runs or is next
  int64_t running_ = -1;        // the part that runs, or -1
  Clock::time_point started_;   // since when the current work (part or retention) runs
  std::set<int64_t> abandoned_;
};

}  // namespace mhckpt::internal
