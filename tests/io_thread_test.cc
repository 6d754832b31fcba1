// coordinator/io_thread.h: an exception that escapes a job ends neither the
// thread nor the queue.
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>

#include "coordinator/io_thread.h"

namespace mhckpt::internal {
namespace {

TEST(IoThread, AThrowingJobDoesNotStopTheThread) {
  IoThread thread;
  std::atomic<int> ran{0};
  thread.Submit([] { throw std::runtime_error("escaped"); });
  thread.Submit([&] { ++ran; });
  thread.Drain();  // returns: the thread is not left busy
  EXPECT_EQ(ran.load(), 1);
  thread.Submit([] { throw 42; });  // not even a std::exception
  thread.Submit([&] { ++ran; });
  thread.Drain();
  EXPECT_EQ(ran.load(), 2);
}

}  // namespace
}  // namespace mhckpt::internal
