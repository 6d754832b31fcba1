// worker/staging_pool.h: buffers reused between saves, bounded by the budget.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "worker/staging_pool.h"

namespace mhckpt::internal {
namespace {

TEST(StagingPool, ReusesBuffersBetweenSaves) {
  StagingPool pool(64 << 20);
  std::byte* first;
  {
    auto b = pool.Acquire(5 << 20);
    ASSERT_TRUE(b.ok());
    first = b->data();
    std::memset(first, 1, 5 << 20);
  }
  auto again = pool.Acquire(3 << 20);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->data(), first);                     // the touched buffer comes back
  EXPECT_EQ(pool.allocated_bytes(), size_t{6} << 20);  // rounded to 2 MiB pages
}

TEST(StagingPool, ReserveMapsAheadAndTheFirstAcquireTakesIt) {
  StagingPool pool;  // the default budget: one save
  ASSERT_TRUE(pool.Reserve(7 << 20).ok());
  EXPECT_EQ(pool.allocated_bytes(), size_t{8} << 20);
  ASSERT_TRUE(pool.Reserve(5 << 20).ok());  // held already: nothing new
  EXPECT_EQ(pool.allocated_bytes(), size_t{8} << 20);
  auto b = pool.Acquire(6 << 20);  // waits for the touching if it has not ended
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(pool.allocated_bytes(), size_t{8} << 20);
  std::memset(b->data(), 3, 6 << 20);
  EXPECT_EQ(b->data()[(6 << 20) - 1], std::byte{3});
}

// A buffer that could not be pinned is not marked pinned, is tried again at
// its next use, and is unpinned at the end only if pinning succeeded.
TEST(StagingPool, AFailedPinIsRetriedAtTheNextUse) {
  int tries = 0, freed = 0;
  {
    StagingPool pool(8 << 20);
    pool.SetHooks([&](void*, size_t) { return ++tries >= 2; },  // fails once, as CUDA may
                  [&](void*) { ++freed; });
    {
      auto b = pool.Acquire(1 << 20);
      ASSERT_TRUE(b.ok());
      EXPECT_FALSE(b->pinned());
      EXPECT_EQ(pool.pinned_bytes(), 0u);
    }
    {
      auto b = pool.Acquire(1 << 20);  // the same buffer, pinned now
      ASSERT_TRUE(b.ok());
      EXPECT_TRUE(b->pinned());
      EXPECT_EQ(pool.pinned_bytes(), pool.allocated_bytes());
    }
    auto b = pool.Acquire(1 << 20);
    ASSERT_TRUE(b.ok());
    EXPECT_TRUE(b->pinned());
    EXPECT_EQ(tries, 2) << "a pinned buffer was pinned again";
  }
  EXPECT_EQ(freed, 1);
}

// Negative control: with a hook that never succeeds, nothing is reported
// pinned and nothing is unpinned, however often the buffer is used.
TEST(StagingPool, ABufferThatCannotBePinnedIsNeverReportedPinned) {
  int tries = 0, freed = 0;
  {
    StagingPool pool(8 << 20);
    pool.SetHooks(
        [&](void*, size_t) {
          ++tries;
          return false;
        },
        [&](void*) { ++freed; });
    for (int i = 0; i < 3; ++i) {
      auto b = pool.Acquire(1 << 20);
      ASSERT_TRUE(b.ok());
      EXPECT_FALSE(b->pinned());
    }
    EXPECT_EQ(pool.pinned_bytes(), 0u);
  }
  EXPECT_EQ(tries, 3);
  EXPECT_EQ(freed, 0);
}

TEST(StagingPool, ReserveBeyondTheBudgetIsANoOp) {
  StagingPool pool(4 << 20);
  ASSERT_TRUE(pool.Reserve(16 << 20).ok());
  EXPECT_EQ(pool.allocated_bytes(), 0u);
}

TEST(StagingPool, CarryOverHandsTheBufferToTheNextPool) {
  std::byte* first = nullptr;
  {
    StagingPool a;
    a.SetCarryOver(true);
    auto b = a.Acquire(5 << 20);
    ASSERT_TRUE(b.ok());
    first = b->data();
    std::memset(first, 7, 5 << 20);
  }
  {
    StagingPool plain;  // without carry-over: maps its own
    auto b = plain.Acquire(4 << 20);
    ASSERT_TRUE(b.ok());
    EXPECT_NE(b->data(), first);
  }
  StagingPool c;
  c.SetCarryOver(true);
  auto b = c.Acquire(4 << 20);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->data(), first);  // touched memory, from the pool before
  EXPECT_EQ(c.allocated_bytes(), size_t{6} << 20);
  EXPECT_EQ(b->data()[0], std::byte{7});
}

// No clock: the releaser gives the buffer back only once the second Acquire
// is known to wait, and that Acquire must not return before it does.
TEST(StagingPool, WaitsForBudgetInsteadOfAllocating) {
  StagingPool pool(8 << 20);
  auto held = pool.Acquire(6 << 20);
  ASSERT_TRUE(held.ok());
  std::atomic<bool> released{false};
  std::thread releaser([&] {
    while (pool.waiting() == 0) std::this_thread::yield();
    released = true;
    *held = StagingBuffer();  // the earlier save commits
  });
  double waited = -1;
  auto next = pool.Acquire(6 << 20, &waited);
  const bool returned_after_release = released;
  releaser.join();
  ASSERT_TRUE(next.ok());
  EXPECT_TRUE(returned_after_release);
  EXPECT_GT(waited, 0.0);
  EXPECT_EQ(pool.waiting(), 0);
  EXPECT_EQ(pool.allocated_bytes(), size_t{6} << 20);  // the same buffer, not a second one
}

TEST(StagingPool, DefaultBudgetIsOneSaveAndLargeRequestsAreServedAlone) {
  StagingPool pool;  // one save's worth
  {
    auto a = pool.Acquire(4 << 20);
    ASSERT_TRUE(a.ok());
  }
  auto big = pool.Acquire(10 << 20);  // larger: the old buffer is freed first
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(pool.allocated_bytes(), size_t{10} << 20);
  EXPECT_FALSE(pool.Acquire(0).value().data());
}

}  // namespace
}  // namespace mhckpt::internal
