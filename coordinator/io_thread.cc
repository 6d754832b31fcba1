#include "coordinator/io_thread.h"

#include "base/log.h"

#include "base/guard.h"

namespace mhckpt::internal {

IoThread::IoThread() : thread_([this] { Loop(); }) {}

IoThread::~IoThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void IoThread::Submit(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(job));
  }
  cv_.notify_all();
}

void IoThread::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return jobs_.empty() && !busy_; });
}

void IoThread::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stop_ and nothing left
    std::function<void()> job = std::move(jobs_.front());
    jobs_.pop_front();
    busy_ = true;
    lock.unlock();
    // The last line of defence: every job reports its own errors (Save's
    // and RunOnIoThread's wrap theirs in Guarded), but an exception must
    // never end the thread (std::terminate) nor leave `busy_` set (Drain
    // would wait forever).
    Status escaped = Guarded("I/O thread", job);
    if (!escaped.ok()) Logger()->error("mhckpt: {}", escaped.ToString());
    lock.lock();
    busy_ = false;
    cv_.notify_all();
  }
}

}  // namespace mhckpt::internal
