#include "coordinator/preemption.h"

#include <signal.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include <fmt/format.h>

#include "coordinator/checkpoint_manager.h"

namespace mhckpt {
namespace internal {
namespace {

// The earliest notice, Unix ms. A lock-free atomic: stored from a signal
// handler.
std::atomic<int64_t> g_notice{kNoNotice};
static_assert(std::atomic<int64_t>::is_always_lock_free);

// Async-signal-safe: clock_gettime and lock-free atomics only.
void RecordNotice() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  const int64_t now = static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1'000'000;
  int64_t seen = g_notice.load(std::memory_order_relaxed);
  while (now < seen && !g_notice.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
  }
}

extern "C" void OnPreemptionSignal(int /*signal*/) {
  const int saved = errno;
  RecordNotice();
  errno = saved;
}

// The signals this process handles for managers: how many hold each, and the
// handler that was there before the first.
struct Installed {
  int holders = 0;
  struct sigaction previous {};
};
std::mutex g_handlers_mu;
std::map<int, Installed>& Handlers() {
  static auto* handlers = new std::map<int, Installed>();  // never destroyed: used at exit
  return *handlers;
}

}  // namespace

int64_t PreemptionNoticeUnixMs() { return g_notice.load(std::memory_order_relaxed); }

Result<std::unique_ptr<PreemptionHandlers>> PreemptionHandlers::Install(
    const std::vector<int>& signals) {
  std::vector<int> distinct = signals;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  for (int sig : distinct) {
    if (sig <= 0 || sig >= NSIG || sig == SIGKILL || sig == SIGSTOP) {
      return InvalidArgument(
          fmt::format("PreemptionOptions::signals: signal {} cannot be caught", sig));
    }
  }
  std::lock_guard<std::mutex> lock(g_handlers_mu);
  std::map<int, Installed>& handlers = Handlers();
  for (size_t i = 0; i < distinct.size(); ++i) {
    Installed& h = handlers[distinct[i]];
    if (h.holders++ > 0) continue;
    struct sigaction action {};
    action.sa_handler = OnPreemptionSignal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    if (sigaction(distinct[i], &action, &h.previous) != 0) {
      const int err = errno;
      // Undo this call's installs.
      handlers.erase(distinct[i]);
      for (size_t j = 0; j < i; ++j) {
        Installed& undo = handlers[distinct[j]];
        if (--undo.holders == 0) {
          sigaction(distinct[j], &undo.previous, nullptr);
          handlers.erase(distinct[j]);
        }
      }
      return InvalidArgument(fmt::format("PreemptionOptions::signals: signal {}: {}", distinct[i],
                                         std::strerror(err)));
    }
  }
  return std::unique_ptr<PreemptionHandlers>(new PreemptionHandlers(std::move(distinct)));
}

PreemptionHandlers::~PreemptionHandlers() {
  std::lock_guard<std::mutex> lock(g_handlers_mu);
  std::map<int, Installed>& handlers = Handlers();
  for (int sig : signals_) {
    auto it = handlers.find(sig);
    if (it == handlers.end() || --it->second.holders > 0) continue;
    sigaction(sig, &it->second.previous, nullptr);
    handlers.erase(it);
  }
}

StepAgreement::~StepAgreement() {
  for (std::vector<MPI_Request>& r : requests_) Comm::WaitAll(&r);
}

const StepDecision& StepAgreement::Decide(int64_t step, bool ready, int64_t saves) {
  if (decision_ && decision_->step == step) return *decision_;
  // This step's round. Every rank posts it, whatever its step: a rank that
  // skipped the round would leave the others' rounds unmatched.
  const int64_t votable = std::max(step, -INT64_MAX);  // has a negation
  std::array<int64_t, kWords>& round = rounds_[next_];
  round = {PreemptionNoticeUnixMs(), votable, -votable, ready ? 1 : 0};
  comm_.PostAllreduceMin(round.data(), kWords, &requests_[next_]);
  const int previous = 1 - next_;
  next_ = previous;
  StepDecision d;
  d.step = step;
  if (previous_) {
    // In lock-step training every rank posted it a step ago: long complete.
    Comm::WaitAll(&requests_[previous]);
    const std::array<int64_t, kWords>& p = rounds_[previous];
    if (p[1] != -p[2]) {
      d.status = InvalidArgument(fmt::format(
          "ranks called ReachedPreemption with different steps: {} .. {}", p[1], -p[2]));
    } else {
      if (p[0] != kNoNotice && !preemption_step_) {
        preemption_step_ = step;
        notice_unix_ms_ = p[0];
        d.preemption_step = true;
      }
      d.preempted = preemption_step_.has_value();
      d.notice_unix_ms = notice_unix_ms_;
      // A Save since that round makes its readiness stale.
      d.ready = p[3] == 1 && saves == previous_saves_;
    }
  } else {
    // The first step decides from nothing: no notice, and ready only if no
    // save was ever started (every rank agrees: Save is collective).
    d.ready = saves == 0;
  }
  previous_ = true;
  previous_saves_ = saves;
  if (d.status.ok() && (step < 0 || step > kMaxStep)) {
    d.status = InvalidArgument(
        fmt::format("rank {}: step {} is outside 0..{}", comm_.rank(), step, kMaxStep));
  }
  decision_ = std::move(d);
  return *decision_;
}

}  // namespace internal

void NotifyPreemption() { internal::RecordNotice(); }

void ClearPreemptionNotice() {
  internal::g_notice.store(internal::kNoNotice, std::memory_order_relaxed);
}

}  // namespace mhckpt
