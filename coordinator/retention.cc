#include "coordinator/retention.h"

#include <chrono>
#include <cstddef>
#include <utility>

#include "base/guard.h"
#include "base/log.h"
#include "base/status.h"
#include "coordinator/io_thread.h"
#include "io/root_store.h"

namespace mhckpt::internal {

std::vector<int64_t> StepsToDelete(const std::vector<int64_t>& committed, int max_to_keep,
                                   int64_t keep_period) {
  std::vector<int64_t> out;
  if (max_to_keep <= 0) return out;
  const size_t keep_from = committed.size() > static_cast<size_t>(max_to_keep)
                               ? committed.size() - static_cast<size_t>(max_to_keep)
                               : 0;
  for (size_t i = 0; i < keep_from; ++i) {
    int64_t step = committed[i];
    if (keep_period > 0 && step % keep_period == 0) continue;
    out.push_back(step);
  }
  return out;
}

Retention::Retention(io::RootStore* store, int max_to_keep, int64_t keep_period)
    : store_(store), max_to_keep_(max_to_keep), keep_period_(keep_period) {}

Retention::~Retention() = default;

double Retention::Run(int64_t step) {
  const auto t0 = std::chrono::steady_clock::now();
  // Guarded: the caller records the run whatever happens, or waiters hang.
  Status gc = Guarded("rank 0: retention", [&] {
    MHCKPT_ASSIGN_OR_RETURN(std::vector<int64_t> committed, store_->CommittedSteps());
    for (int64_t old : StepsToDelete(committed, max_to_keep_, keep_period_)) {
      MHCKPT_ASSIGN_OR_RETURN(std::string retired, store_->RetireStep(old));
      if (!retired.empty()) RemoveInBackground(std::move(retired));
    }
    return OkStatus();
  });
  if (!gc.ok()) Logger()->warn("mhckpt: retention after step {}: {}", step, gc.ToString());
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void Retention::RemoveInBackground(std::string dir) {
  if (!deleter_) deleter_ = std::make_unique<IoThread>();
  deleter_->Submit([store = store_, dir = std::move(dir)] {
    Status s = store->RemoveRetired(dir);
    // Left behind, it is removed when the root is next opened.
    if (!s.ok()) Logger()->warn("mhckpt: removing retired '{}': {}", dir, s.ToString());
  });
}

void Retention::WaitForRemovals() {
  if (deleter_) deleter_->Drain();
}

}  // namespace mhckpt::internal
