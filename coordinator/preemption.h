// Internal: preemption notices and the per-step agreement behind
// CheckpointManager::ReachedPreemption and ShouldSave.
//
// A notice is one process-wide atomic, the Unix time (ms) of the earliest
// notice, set by NotifyPreemption or by the signal handlers that
// PreemptionHandlers installs: a handler stores the time and returns, never
// calling MPI nor taking a lock.
//
// StepAgreement turns the notices of all ranks into one step, the same on
// every rank, without a blocking collective per step: each new step posts a
// non-blocking MIN allreduce of [notice, step, -step, ready] and decides from
// the round posted at the previous step, which every rank completes in the
// same order and so reads the same.
#pragma once

#include <mpi.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "base/comm.h"
#include "base/status.h"

namespace mhckpt::internal {

/// No notice.
inline constexpr int64_t kNoNotice = INT64_MAX;

/// The process's notice: the Unix time (ms) of the earliest since start (or
/// the last ClearPreemptionNotice), or kNoNotice.
int64_t PreemptionNoticeUnixMs();

/// Handlers for preemption signals, installed for one manager; the process's
/// previous handler of a signal comes back when the last PreemptionHandlers
/// holding that signal is destroyed.
class PreemptionHandlers {
 public:
  /// InvalidArgument naming the signal if one cannot be caught (SIGKILL,
  /// SIGSTOP, a number out of range); then none is installed.
  static Result<std::unique_ptr<PreemptionHandlers>> Install(const std::vector<int>& signals);
  ~PreemptionHandlers();
  PreemptionHandlers(const PreemptionHandlers&) = delete;
  PreemptionHandlers& operator=(const PreemptionHandlers&) = delete;

 private:
  explicit PreemptionHandlers(std::vector<int> signals) : signals_(std::move(signals)) {}
  std::vector<int> signals_;  // distinct
};

/// What every rank decided for one step.
struct StepDecision {
  int64_t step = 0;
  Status status;  ///< an error fails ReachedPreemption and ShouldSave alike
  /// A notice has been agreed: this step is the preemption step or later.
  bool preempted = false;
  /// This step is the first one agreed as preempted (the one to save).
  bool preemption_step = false;
  /// The earliest rank's notice (with `preempted`), Unix ms.
  int64_t notice_unix_ms = 0;
  /// Every rank was ready for a continuous save (ShouldSave) at the round
  /// decided from, and no Save was called since.
  bool ready = false;
};

class StepAgreement {
 public:
  explicit StepAgreement(Comm comm) : comm_(std::move(comm)) {}
  /// Collective: completes the round still in flight.
  ~StepAgreement();
  StepAgreement(const StepAgreement&) = delete;
  StepAgreement& operator=(const StepAgreement&) = delete;

  /// Collective, caller's thread. The decision for `step`: the first call
  /// for a step posts its round and decides from the previous step's; a
  /// call for the same step again returns that decision. `ready`: this rank
  /// could start a continuous save now; `saves`: the Save calls so far (the
  /// same on every rank, Save being collective).
  const StepDecision& Decide(int64_t step, bool ready, int64_t saves);

  /// The agreed preemption step and its notice, once there is one.
  [[nodiscard]] std::optional<int64_t> preemption_step() const { return preemption_step_; }
  [[nodiscard]] int64_t notice_unix_ms() const { return notice_unix_ms_; }

 private:
  static constexpr int kWords = 4;  // notice, step, -step, ready
  Comm comm_;
  std::array<std::array<int64_t, kWords>, 2> rounds_{};  // the two rounds that may be in flight
  std::array<std::vector<MPI_Request>, 2> requests_;
  int next_ = 0;                // the buffer the next round is posted in
  bool previous_ = false;       // a round was posted at the previous step
  int64_t previous_saves_ = 0;  // Save calls when it was posted
  std::optional<StepDecision> decision_;
  std::optional<int64_t> preemption_step_;
  int64_t notice_unix_ms_ = 0;
};

}  // namespace mhckpt::internal
