#include "coordinator/watchdog.h"

#include "base/log.h"

namespace mhckpt::internal {

Watchdog::Watchdog(const Comm& comm, double timeout_seconds)
    : comm_(&comm), rank_(comm.rank()), timeout_(timeout_seconds) {
  if (timeout_seconds > 0) thread_ = std::thread([this] { Loop(); });
}

void Watchdog::Abort() const { comm_->Abort(70); }

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::Enter(const char* phase, int64_t step) {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    phase_ = phase;
    step_ = step;
    deadline_ = std::chrono::steady_clock::now() +
                std::chrono::duration_cast<std::chrono::steady_clock::duration>(timeout_);
  }
  cv_.notify_all();
}

void Watchdog::Restart() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (phase_ == nullptr) return;
    deadline_ = std::chrono::steady_clock::now() +
                std::chrono::duration_cast<std::chrono::steady_clock::duration>(timeout_);
  }
  cv_.notify_all();
}

void Watchdog::Leave() {
  if (!thread_.joinable()) return;
  std::lock_guard<std::mutex> lock(mu_);
  phase_ = nullptr;
}

void Watchdog::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (phase_ == nullptr) {
      cv_.wait(lock);
      continue;
    }
    auto deadline = deadline_;
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && phase_ != nullptr &&
        deadline_ == deadline && !stop_) {
      Logger()->critical(
          "mhckpt: rank {}: phase '{}' of step {} did not finish within {:.0f} s; a peer is dead "
          "or stuck; aborting the job (Options::collective_timeout_seconds)",
          rank_, phase_, step_, timeout_.count());
      Abort();
    }
  }
}

}  // namespace mhckpt::internal
