// Bounds every collective phase of the I/O thread in time. A peer that died
// without taking the job down, or that is stuck (a hung file system, a rank
// spinning elsewhere), would otherwise leave the other ranks waiting in a
// collective forever. Past the timeout the watchdog logs which phase of which
// step did not finish, on which rank, and calls MPI_Abort: a loud failure
// that a job scheduler sees, instead of a silent hang (Comm::Abort: on a
// Comm::Serial(), the process exits with the same code).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

#include "base/comm.h"

namespace mhckpt::internal {

class Watchdog {
 public:
  /// `timeout_seconds` <= 0 disables it (no thread is started). `comm`
  /// must outlive the watchdog; its job is aborted past the timeout.
  Watchdog(const Comm& comm, double timeout_seconds);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  /// Marks the start of a phase; the previous phase, if any, ends.
  void Enter(const char* phase, int64_t step);
  /// No phase is running.
  void Leave();
  /// The running phase (if any) goes on with a fresh timeout from now: for
  /// a wait inside it bounded by a deadline of its own, a share of the
  /// timeout (NCCL's, coordinator/device_broadcast.h), so that its error,
  /// which the ranks can agree on, comes before the abort.
  void Restart();
  /// The timeout given; <= 0 when disabled.
  [[nodiscard]] double timeout_seconds() const { return timeout_.count(); }

  /// Enters a phase for the lifetime of the guard.
  class Guard {
   public:
    Guard(Watchdog& w, const char* phase, int64_t step) : w_(w) { w_.Enter(phase, step); }
    ~Guard() { w_.Leave(); }
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;

   private:
    Watchdog& w_;
  };

 private:
  void Loop();

  [[noreturn]] void Abort() const;

  const Comm* comm_;
  int rank_;
  std::chrono::duration<double> timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  const char* phase_ = nullptr;
  int64_t step_ = 0;
  std::chrono::steady_clock::time_point deadline_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace mhckpt::internal
