#include "io/h5_lock.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <random>
#include <thread>

namespace mhckpt::io {
namespace {

std::recursive_mutex g_h5_mutex;
thread_local int t_depth = 0;  // how many times this thread holds g_h5_mutex
std::atomic<unsigned long> g_retries{0};
// HDF5 is not built with ThreadSanitizer, so TSan cannot see two threads in
// it at once. This plain counter, written at every entry under the lock,
// stands in for HDF5's unguarded global state: a path that reaches HDF5
// without the lock races on it, and TSan says so.
unsigned long g_entries = 0;

void Lock() {
  g_h5_mutex.lock();
  ++t_depth;
}

bool TryLock() {
  if (!g_h5_mutex.try_lock()) return false;
  ++t_depth;
  return true;
}

void Unlock() {
  --t_depth;
  g_h5_mutex.unlock();
}

// A random pause before try `attempt` + 1: up to 1 ms, doubling, at most 50.
void Backoff(int attempt) {
  thread_local std::minstd_rand rng(static_cast<unsigned>(
      std::hash<std::thread::id>()(std::this_thread::get_id()) ^
      static_cast<size_t>(std::chrono::steady_clock::now().time_since_epoch().count())));
  const int max_us = std::min(50'000, 1000 << std::min(attempt, 6));
  std::uniform_int_distribution<int> pause(0, max_us);
  std::this_thread::sleep_for(std::chrono::microseconds(pause(rng)));
}

}  // namespace

H5LocalGuard::H5LocalGuard() {
  Lock();
  ++g_entries;
}
H5LocalGuard::~H5LocalGuard() { Unlock(); }

H5CollectiveHold H5CollectiveHold::Acquire(const internal::Comm& comm) {
  H5CollectiveHold hold;
  hold.held_ = true;
  if (t_depth > 0) {  // nested: the outer hold is taken on every rank already
    Lock();
    return hold;
  }
  for (int attempt = 0;; ++attempt) {
    comm.Barrier();                // 1. every rank of comm is here, none waits in a local guard
    const bool got = TryLock();    // 2. never blocks
    if (comm.AllreduceAnd(got)) {  // 3. held on every rank
      ++g_entries;
      return hold;
    }
    if (got) Unlock();
    g_retries.fetch_add(1, std::memory_order_relaxed);
    Backoff(attempt);
  }
}

H5CollectiveHold::H5CollectiveHold(H5CollectiveHold&& o) noexcept : held_(o.held_) {
  o.held_ = false;
}

H5CollectiveHold& H5CollectiveHold::operator=(H5CollectiveHold&& o) noexcept {
  if (this != &o) {
    Release();
    held_ = o.held_;
    o.held_ = false;
  }
  return *this;
}

H5CollectiveHold::~H5CollectiveHold() { Release(); }

void H5CollectiveHold::Release() {
  if (held_) Unlock();
  held_ = false;
}

bool H5LockHeldByThisThread() { return t_depth > 0; }

unsigned long H5CollectiveRetries() { return g_retries.load(std::memory_order_relaxed); }

}  // namespace mhckpt::io
