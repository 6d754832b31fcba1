// A job thread. Jobs run one at a time, in the order they were submitted.
// Each rank has one that touches HDF5 and the I/O communicator (its I/O
// thread); rank 0 has a second one that removes retired steps. A job reports its own
// outcome; an exception that escapes one anyway is logged and the thread
// goes on (base/guard.h).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace mhckpt::internal {

class IoThread {
 public:
  IoThread();
  ~IoThread();  ///< finishes every submitted job, then joins
  IoThread(const IoThread&) = delete;
  IoThread& operator=(const IoThread&) = delete;

  void Submit(std::function<void()> job);
  /// Blocks until every job submitted before the call has finished.
  void Drain();

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool busy_ = false;
  bool stop_ = false;
  std::thread thread_;  // last: started after the fields above exist
};

}  // namespace mhckpt::internal
