#include "coordinator/drain_queue.h"

#include <algorithm>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace mhckpt::internal {

void DrainQueue::Started(int64_t step, Clock::time_point now) {
  running_ = step;
  started_ = now;
}

bool DrainQueue::Ended(int64_t step, bool retention_follows, Clock::time_point now) {
  if (auto it = std::find(queued_.begin(), queued_.end(), step); it != queued_.end()) {
    queued_.erase(it);
  }
  running_ = -1;
  if (retention_follows) started_ = now;  // the retention's deadline
  return IsAbandoned(step);
}

std::optional<DrainQueue::Clock::time_point> DrainQueue::Due(bool retention_pending) const {
  if (running_ < 0 && !retention_pending) return std::nullopt;
  return started_ + std::chrono::duration_cast<Clock::duration>(
                        std::chrono::duration<double>(deadline_seconds_));
}

bool DrainQueue::Late(bool retention_pending, Clock::time_point now) const {
  const auto due = Due(retention_pending);
  return due && now >= *due;
}

int64_t DrainQueue::FirstUnabandoned() const {
  for (int64_t step : queued_) {
    if (!abandoned_.count(step)) return step;
  }
  return -1;
}

Status DrainQueue::Abandon(int64_t step, int rank) {
  const bool first = abandoned_.insert(step).second;
  // The parts queued behind it would wait for it: abandoned with it (each
  // skips the shared root when its turn comes; SaveRun::Drain).
  std::vector<int64_t> behind;
  for (int64_t s : queued_) {
    if (s > step && abandoned_.insert(s).second) behind.push_back(s);
  }
  if (!first) return OkStatus();
  return IoError(fmt::format(
      "step {}: the shared root's write did not end within {} s of its start (on rank {}): "
      "abandoned{}; the step stays in the local tier and training goes on",
      step, deadline_seconds_, rank,
      behind.empty() ? std::string()
                     : fmt::format(", with the writes of step(s) {} queued behind it",
                                   fmt::join(behind, ","))));
}

}  // namespace mhckpt::internal
